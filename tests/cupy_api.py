"""The CuPy API that tests/fake_cupy.py accepts: names and parameters that real CuPy 13.x AND 14.x both have.

A stand-in is only as good as its refusals. The fake runs NumPy underneath, and NumPy has more than CuPy: a
function CuPy 13.x lacks (np.cumulative_sum, np.matrix_transpose: 14.x only), a keyword CuPy does not take
(`where=` on a ufunc, `initial=` on np.sum, `shape=` on ndarray.reshape, `kind=` on ndarray.sort before 14.x),
a method CuPy's arrays lack (.resize, .setflags, .byteswap before 14.x), __index__ (a device array as a slice
bound or in range()). Without a list the fake would run all of them, and the cuda backend would first fail on
a GPU. So the fake checks every call against this module before it runs NumPy:

    cupy.<name>(...)                 FUNCTIONS[name]: the parameters CuPy's function takes
    np.<name>(device array, ...)     FUNCTIONS[name] too: CuPy's ndarray.__array_function__ (NEP 18) looks up
                                     cupy.<func.__name__> (cupy.linalg.<...> for np.linalg) and calls it with
                                     the same arguments; where CuPy has no such function NumPy raises TypeError.
                                     (By __name__: NumPy's aliases reach their original, np.concat is
                                     np.concatenate, so it works on CuPy 13.x too.)
    np.<ufunc>(device array, ...)    UFUNCS, with UFUNC_CALL (CuPy's ufunc.__call__ takes out=, dtype=, casting=
                                     and nothing else; not NumPy's where=) or UFUNC_METHODS (.reduce, .at, ...)
    x @ y                            "matmul": a generalized ufunc in CuPy (cupy/_core/_gufuncs.py), MATMUL_CALL
    dev.<method>(...)                NDARRAY_METHODS[method]
    dev.<attribute>                  NDARRAY_ATTRIBUTES
    cupy.cuda.<name>                 CUDA (the classes the fake defines carry CuPy's signatures themselves)

A signature is written as the parameter list of a Python `def` (without `self`), as CuPy writes it; the fake
binds each call to it, so an unknown keyword, or one positional argument too many, is refused by name.

Where the two versions differ, the list keeps what both have (14.x added `copy=` to cupy.asarray and
ndarray.reshape, `kind=` to ndarray.sort/argsort and `priority=` to cuda.Stream: none of these are allowed).
It is a curated subset: the names tinyspec uses on device arrays, those it might reach for next, and what the
fake implements. A name missing here that CuPy has (in both versions) may be added, with CuPy's signature.

How it was made (and how to check it again; CI has no CuPy, so this is not a test):

    pip download --no-deps cupy-cuda12x==13.6.0 cupy-cuda12x==14.2.0 fastrlock cuda-pathfinder   (wheels)
    pip download --no-deps --no-binary :all: cupy==13.6.0; cupy-14.2.0.tar.gz from PyPI           (sdists)

Each wheel, unzipped with fastrlock (and cuda-pathfinder for 14.x) on PYTHONPATH, imports without a GPU.
Module functions: `dir(cupy)`, `inspect.signature(cupy.<name>)` (annotations dropped), ufuncs:
`isinstance(cupy.<name>, cupy.ufunc)`. ndarray methods are Cython (no introspectable signature): their
parameters were read from the sdists' cupy/_core/core.pyx (`cpdef`/`def` in `cdef class _ndarray_base`,
Cython types dropped), ufunc keywords from cupy/_core/_kernel.pyx (`ufunc.__call__` pops out, _where, dtype,
casting and raises TypeError('Wrong arguments') on anything else; `reduce`, `accumulate`, `at`, `outer`,
`reduceat` are plain defs there), matmul's from cupy/_core/_gufuncs.py. The conversions (__int__, __float__,
__bool__ = __nonzero__, __len__, __iter__; no __index__) are in core.pyx too: see fake_cupy.ndarray.
"""

from __future__ import annotations

# cupy.<name>: the parameters of CuPy's function, the same in 13.6.0 and 14.2.0 unless a comment says otherwise
FUNCTIONS = {
    # making arrays (cupy/_creation/*.py)
    "array": "obj, dtype=None, copy=True, order='K', subok=False, ndmin=0, *, blocking=False",
    "asarray": "a, dtype=None, order=None, *, blocking=False",  # 14.2.0 adds copy=None
    "ascontiguousarray": "a, dtype=None",
    "asnumpy": "a, stream=None, order='C', out=None, *, blocking=True",
    "empty": "shape, dtype=float, order='C'",
    "zeros": "shape, dtype=float, order='C'",
    "ones": "shape, dtype=float, order='C'",
    "full": "shape, fill_value, dtype=None, order='C'",
    "arange": "start, stop=None, step=1, dtype=None",
    "empty_like": "prototype, dtype=None, order='K', subok=None, shape=None",
    "zeros_like": "a, dtype=None, order='K', subok=None, shape=None",
    "ones_like": "a, dtype=None, order='K', subok=None, shape=None",
    "full_like": "a, fill_value, dtype=None, order='K', subok=None, shape=None",
    "copy": "a, order='K'",
    "tril": "m, k=0",
    "triu": "m, k=0",
    # shapes and joins (cupy/_manipulation/*.py)
    "reshape": "a, newshape, order='C'",  # 14.2.0 adds *, copy=None
    "ravel": "a, order='C'",
    "transpose": "a, axes=None",
    "swapaxes": "a, axis1, axis2",
    "moveaxis": "a, source, destination",
    "squeeze": "a, axis=None",
    "expand_dims": "a, axis",
    "broadcast_to": "array, shape",
    "shape": "a",
    "ndim": "a",
    "result_type": "*arrays_and_dtypes",
    "concatenate": "tup, axis=0, out=None, *, dtype=None, casting='same_kind'",
    "stack": "tup, axis=0, out=None, *, dtype=None, casting='same_kind'",
    "split": "ary, indices_or_sections, axis=0",
    "tile": "A, reps",
    "repeat": "a, repeats, axis=None",
    "append": "arr, values, axis=None",
    "copyto": "dst, src, casting='same_kind', where=None",
    # indexing (cupy/_indexing/*.py)
    "take": "a, indices, axis=None, out=None",
    "take_along_axis": "a, indices, axis",
    "put": "a, ind, v, mode='wrap'",
    "place": "arr, mask, vals",
    "putmask": "a, mask, values",
    "where": "condition, x=None, y=None",
    "nonzero": "a",
    "flatnonzero": "a",
    "argwhere": "a",
    "compress": "condition, a, axis=None, out=None",
    "extract": "condition, a",
    # reductions, scans, sorting (cupy/_math, _statistics, _sorting, _logic)
    "sum": "a, axis=None, dtype=None, out=None, keepdims=False",
    "prod": "a, axis=None, dtype=None, out=None, keepdims=False",
    "mean": "a, axis=None, dtype=None, out=None, keepdims=False",
    "max": "a, axis=None, out=None, keepdims=False",
    "min": "a, axis=None, out=None, keepdims=False",
    "amax": "a, axis=None, out=None, keepdims=False",
    "amin": "a, axis=None, out=None, keepdims=False",
    "all": "a, axis=None, out=None, keepdims=False",
    "any": "a, axis=None, out=None, keepdims=False",
    "argmax": "a, axis=None, dtype=None, out=None, keepdims=False",
    "argmin": "a, axis=None, dtype=None, out=None, keepdims=False",
    "cumsum": "a, axis=None, dtype=None, out=None",
    "cumprod": "a, axis=None, dtype=None, out=None",
    "diff": "a, n=1, axis=-1, prepend=None, append=None",
    "clip": "a, a_min, a_max, out=None",
    "round": "a, decimals=0, out=None",
    "around": "a, decimals=0, out=None",
    "sort": "a, axis=-1, kind=None",
    "argsort": "a, axis=-1, kind=None",
    "partition": "a, kth, axis=-1",
    "searchsorted": "a, v, side='left', sorter=None",
    "unique": "ar, return_index=False, return_inverse=False, return_counts=False, axis=None, *, equal_nan=True",
    "bincount": "x, weights=None, minlength=None",
    # products
    "dot": "a, b, out=None",
    "outer": "a, b, out=None",
    "linalg.norm": "x, ord=None, axis=None, keepdims=False",
}

# np.<name> on device arrays that CuPy runs as a ufunc (isinstance(cupy.<name>, cupy.ufunc) in both versions).
# The operators are ufuncs too: + - * / // % ** divmod() -x abs() ~ & | ^ << >> < <= > >= == != (and @: matmul)
UFUNCS = frozenset("""
    add subtract multiply divide true_divide floor_divide remainder fmod divmod power negative positive absolute
    maximum minimum fmax fmin exp exp2 log log2 log1p expm1 sqrt square cbrt reciprocal
    rint floor ceil trunc sign sin cos tan tanh arctan arctan2 hypot logaddexp copysign ldexp isfinite isnan isinf
    bitwise_and bitwise_or bitwise_xor invert left_shift right_shift
    logical_and logical_or logical_not logical_xor less less_equal greater greater_equal equal not_equal
""".split())
UFUNC_CALL = frozenset({"out", "dtype", "casting"})  # cupy/_core/_kernel.pyx ufunc.__call__ (NumPy's where=: no)
UFUNC_METHODS = {  # cupy/_core/_kernel.pyx, class ufunc
    "reduce": "array, axis=0, dtype=None, out=None, keepdims=False",
    "accumulate": "array, axis=0, dtype=None, out=None",
    "reduceat": "array, indices, axis=0, dtype=None, out=None",
    "at": "a, indices, b=None",
    "outer": "A, B, *, out=None, dtype=None, casting='same_kind'",  # outer(A, B, **kwargs) -> __call__
}
MATMUL_CALL = frozenset({"out", "dtype", "casting", "axes", "axis", "keepdims", "order", "signature"})

# dev.<method>(...): cupy/_core/core.pyx, cdef class _ndarray_base (`self` left out)
NDARRAY_METHODS = {
    "astype": "dtype, order='K', casting=None, subok=None, copy=True",
    "copy": "order='C'",
    "view": "dtype=None, type=None",  # cupy.ndarray.view (core.pyx, class ndarray)
    "reshape": "*shape, order='C'",  # 14.2.0 adds copy=None
    "transpose": "*axes",
    "swapaxes": "axis1, axis2",
    "ravel": "order='C'",
    "flatten": "order='C'",
    "squeeze": "axis=None",
    "fill": "value",
    "take": "indices, axis=None, out=None",
    "put": "indices, values, mode='wrap'",
    "repeat": "repeats, axis=None",
    "sort": "axis=-1",  # 14.2.0 adds kind=None
    "argsort": "axis=-1",  # 14.2.0 adds kind=None
    "partition": "kth, axis=-1",
    "argpartition": "kth, axis=-1",
    "searchsorted": "v, side='left', sorter=None",
    "nonzero": "",
    "max": "axis=None, out=None, keepdims=False",
    "min": "axis=None, out=None, keepdims=False",
    "argmax": "axis=None, out=None, dtype=None, keepdims=False",
    "argmin": "axis=None, out=None, dtype=None, keepdims=False",
    "clip": "min=None, max=None, out=None",
    "round": "decimals=0, out=None",
    "sum": "axis=None, dtype=None, out=None, keepdims=False",
    "prod": "axis=None, dtype=None, out=None, keepdims=None",
    "mean": "axis=None, dtype=None, out=None, keepdims=False",
    "var": "axis=None, dtype=None, out=None, ddof=0, keepdims=False",
    "std": "axis=None, dtype=None, out=None, ddof=0, keepdims=False",
    "cumsum": "axis=None, dtype=None, out=None",
    "cumprod": "axis=None, dtype=None, out=None",
    "all": "axis=None, out=None, keepdims=False",
    "any": "axis=None, out=None, keepdims=False",
    "dot": "b, out=None",
    "item": "",
    "tolist": "",
    "tobytes": "order='C'",
    "get": "stream=None, order='C', out=None, blocking=True",
    "set": "arr, stream=None",
}
# dev.<attribute>: core.pxd (readonly size, dtype) and core.pyx's properties
NDARRAY_ATTRIBUTES = frozenset({"shape", "dtype", "ndim", "size", "nbytes", "strides", "itemsize", "flags", "T",
                                "real", "imag", "data"})  # data: its MemoryPointer (.ptr, .device_id)

# cupy.cuda.<name> the fake defines (cupy/cuda/__init__.py in both versions), and their members
CUDA = {
    "Device": {"id", "compute_capability", "synchronize"},
    "runtime": {"getDevice", "getDeviceCount", "runtimeGetVersion", "driverGetVersion", "getDeviceProperties"},
    "Stream": {"null", "begin_capture", "end_capture", "is_capturing", "synchronize"},  # Stream(null=False,
    "Graph": {"launch"},                                   # non_blocking=False, ptds=False); 14.x adds priority=
    "graph": {"Graph"},
    "get_current_stream": set(),
    "MemoryPool": {"malloc"},
    "using_allocator": set(),
}

# cupy.<name> that is not a function: the classes and the dtypes (NumPy's own scalar types, re-exported)
NAMES = frozenset({"ndarray", "cuda", "ufunc", "float16", "float32", "float64", "int8", "int16", "int32", "int64",
                   "uint8", "uint16", "uint32", "uint64", "bool_", "RawKernel", "RawModule",
                   "ElementwiseKernel"})
