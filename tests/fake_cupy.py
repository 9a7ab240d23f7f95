"""A CPU stand-in for CuPy that is as strict as CuPy about host and device, for testing the cuda backend's
Python side on a machine without a GPU.

The cuda backend runs the oracle's own model code on device arrays (NumPy dispatches its functions to the
array's module, NEP 18), so whether it works depends on that code never pulling a device array to the host
by accident and never mixing a host array into device math. CuPy refuses both with a TypeError; this module
refuses them the same way, so a leak fails here, in CI, and not first on somebody's GPU:

    np.asarray(dev), np.ascontiguousarray(dev), np.array(dev)   TypeError (CuPy: "Implicit conversion to a
                                                                 NumPy array is not allowed")
    dev + host, np.add(dev, host), np.concatenate([dev, host])  TypeError (CuPy: "Unsupported type")
    float(dev0d), int(...), bool(...), dev.item(), dev.tolist() allowed (CuPy syncs and copies)
    dev[...] = host                                              allowed (CuPy uploads the value)
    cupy.asarray(host), cupy.asnumpy(dev), dev.get()             the explicit copies

`ndarray` wraps a NumPy array; every NumPy function and ufunc on it runs NumPy on the wrapped arrays and wraps
the result. `kernels` stands in for tinyspec.fast.cuda_ops (quant_linear, get_rows, bind, gdn_scan: the NumPy
oracles on the wrapped arrays, taking device arrays only, as the real kernels do) and `rows` for
tinyspec.fast.cuda_rows. What this cannot check: the CUDA kernels themselves (tests/test_cuda_ops.py on a GPU,
tools/check_cuda_kernels.py without one).
"""

from __future__ import annotations

import types

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

from tinyspec import gdn, ops
from tinyspec.quants import GGMLType


def _leak(kind) -> TypeError:
    return TypeError(f"fake cupy: {kind} (CuPy refuses this: a host/device leak in the cuda backend)")


class ndarray(NDArrayOperatorsMixin):
    """A device array: a NumPy array that NumPy will not take back implicitly."""

    __slots__ = ("_a",)

    def __init__(self, a: np.ndarray):
        assert isinstance(a, np.ndarray), type(a)
        self._a = a

    # --- what CuPy refuses
    def __array__(self, dtype=None, copy=None):
        raise _leak("implicit conversion of a device array to NumPy")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        raw = _unwrap((inputs, kwargs), strict=True)
        return _wrap(getattr(ufunc, method)(*raw[0], **raw[1]))

    def __array_function__(self, func, types_, args, kwargs):
        raw = _unwrap((args, kwargs), strict=True)
        return _wrap(func(*raw[0], **raw[1]))

    # --- what CuPy allows
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    strides = property(lambda self: self._a.strides)
    itemsize = property(lambda self: self._a.itemsize)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: ndarray(self._a.T))

    def __getattr__(self, name):  # methods: reshape, copy, astype, sum, max, view, fill, ...
        if name.startswith("__"):  # __array_interface__, __array_struct__: NumPy's back doors to the data
            raise AttributeError(name)
        attr = getattr(self._a, name)
        if not callable(attr):
            return _wrap(attr)

        def method(*args, **kwargs):
            raw = _unwrap((args, kwargs), strict=True)
            return _wrap(attr(*raw[0], **raw[1]))
        return method

    def __getitem__(self, key):
        return _wrap(self._a[_unwrap(key, strict=False)])

    def __setitem__(self, key, value):
        self._a[_unwrap(key, strict=False)] = _unwrap(value, strict=False)

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        return (_wrap(row) for row in self._a)

    def __float__(self):
        return float(self._a)

    def __int__(self):
        return int(self._a)

    def __index__(self):
        return self._a.__index__()

    def __bool__(self):
        return bool(self._a)

    def item(self):
        return self._a.item()

    def tolist(self):
        return self._a.tolist()

    def get(self):
        return self._a.copy()

    def __repr__(self):
        return f"fake_cupy.ndarray({self._a!r})"


def _wrap(x):
    if isinstance(x, np.ndarray):
        return ndarray(x)
    if isinstance(x, tuple):
        return tuple(_wrap(v) for v in x)
    if isinstance(x, list):
        return [_wrap(v) for v in x]
    return x


def _unwrap(x, strict: bool):
    """Device arrays -> their NumPy arrays. strict: a host array among device ones is a leak (CuPy's math
    takes device arrays, Python numbers and NumPy scalars only)."""
    if isinstance(x, ndarray):
        return x._a
    if isinstance(x, np.ndarray):
        if strict:
            raise _leak(f"a host array {x.shape} mixed into device math")
        return x
    if isinstance(x, tuple):
        return tuple(_unwrap(v, strict) for v in x)
    if isinstance(x, list):
        return [_unwrap(v, strict) for v in x]
    if isinstance(x, dict):
        return {k: _unwrap(v, strict) for k, v in x.items()}
    return x


# --- the module functions the backend and the model use (cupy.*)

def asarray(x, dtype=None):
    if isinstance(x, ndarray):
        return x if dtype is None or x.dtype == dtype else ndarray(x._a.astype(dtype))
    return ndarray(np.array(x, dtype=dtype))  # an upload copies


def ascontiguousarray(x, dtype=None):
    if not isinstance(x, ndarray):
        raise _leak("cupy.ascontiguousarray of a host array")
    return ndarray(np.ascontiguousarray(x._a, dtype=dtype))


def asnumpy(x):
    return x._a.copy() if isinstance(x, ndarray) else np.asarray(x)


def _alloc(fn):
    return lambda *args, **kwargs: ndarray(fn(*args, **kwargs))


empty, zeros, ones, full, arange = (_alloc(f) for f in (np.empty, np.zeros, np.ones, np.full, np.arange))
float32, float64, int32, int64, uint8, uint32 = np.float32, np.float64, np.int32, np.int64, np.uint8, np.uint32


def empty_like(x, dtype=None, shape=None):
    return ndarray(np.empty_like(x._a, dtype=dtype, shape=shape))


def zeros_like(x, dtype=None, shape=None):
    return ndarray(np.zeros_like(x._a, dtype=dtype, shape=shape))


class _Device:
    def __init__(self, i=0):
        self.id = i
        self.compute_capability = "90"

    def synchronize(self):
        pass


cuda = types.SimpleNamespace(Device=_Device, runtime=types.SimpleNamespace(getDevice=lambda: 0),
                             Stream=None)


def module() -> types.ModuleType:
    """This file as the `cupy` module (what `import cupy` finds while the fixture is active)."""
    m = types.ModuleType("cupy")
    for name in ("ndarray", "asarray", "ascontiguousarray", "asnumpy", "empty", "zeros", "ones", "full", "arange",
                 "empty_like", "zeros_like", "float32", "float64", "int32", "int64", "uint8", "uint32", "cuda"):
        setattr(m, name, globals()[name])
    return m


# --- tinyspec.fast.cuda_ops: the oracles on device arrays, device arrays only

def _device(x, what: str) -> np.ndarray:
    if not isinstance(x, ndarray):
        raise _leak(f"{what} handed to a CUDA kernel as a host {type(x).__name__}")
    return x._a


kernels = types.ModuleType("tinyspec.fast.cuda_ops")
kernels.SUPPORTED = (GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q5_K,
                     GGMLType.Q6_K)


def _quant_linear(x, raw, ggml_type, shape):
    return ndarray(ops.quant_linear(_device(x, "x"), _device(raw, "a weight"), ggml_type, shape))


def _bind(raw, ggml_type, shape):
    return lambda x: _quant_linear(x, raw, ggml_type, shape)


def _get_rows(raw, ggml_type, shape, ids):
    return ndarray(ops.get_rows(_device(raw, "a weight"), ggml_type, shape, _device(ids, "ids")))


def _gdn_scan(q, k, v, log_decay, beta, state, states_out=None, out_state=None):
    args = [_device(a, n) for a, n in zip((q, k, v, log_decay, beta, state), ("q", "k", "v", "g", "beta", "state"))]
    ring = _device(states_out, "the ring") if states_out is not None else None
    out = _device(out_state, "out_state") if out_state is not None else None
    o, final = gdn.gdn_scan(*args, states_out=ring, out=out)
    return ndarray(o), (out_state if out_state is not None else ndarray(final))


kernels.quant_linear, kernels.bind, kernels.get_rows, kernels.gdn_scan = _quant_linear, _bind, _get_rows, _gdn_scan

# --- tinyspec.fast.cuda_rows: the oracle's row functions, one call each
rows = types.ModuleType("tinyspec.fast.cuda_rows")
rows.rms_norm = lambda x, w, eps: ndarray(ops.rms_norm(_device(x, "x"), _device(w, "w"), eps))
rows.l2_norm = lambda x, eps: ndarray(ops.l2_norm(_device(x, "x"), eps))
rows.sigmoid = lambda x: ndarray(ops.sigmoid(_device(x, "x")))
rows.silu = lambda x: ndarray(ops.silu(_device(x, "x")))
rows.softplus = lambda x: ndarray(ops.softplus(_device(x, "x")))
