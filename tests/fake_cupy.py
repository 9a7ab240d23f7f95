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
    dev[idx] = host array                                        allowed under an index array (CuPy converts
                                                                 the value: an upload); under a basic index
                                                                 ValueError, as CuPy's fill ("non-scalar
                                                                 numpy.ndarray cannot be used for fill")
    dev.set(host)                                                allowed (the explicit upload)
    cupy.asarray(host), cupy.asnumpy(dev), dev.get()             the explicit copies
    x[:dev0d], range(dev0d), operator.index(dev0d)              TypeError (CuPy's ndarray has no __index__;
                                                                 int(dev0d) first: a sync, and visibly one)

And it accepts only the API real CuPy has, in 13.x and 14.x both (tests/cupy_api.py, read from CuPy's
sources): a cupy.<name>, a NumPy function or ufunc on a device array (CuPy's __array_function__ and
__array_ufunc__ hand it to cupy.<name>), a method or attribute of a device array, each with the keywords
CuPy's own takes. Anything else raises NotInCuPy, naming what is missing, even where NumPy underneath could
run it: the fake must not hide an API the cuda backend would first miss on a GPU.

`ndarray` wraps a NumPy array; every NumPy function and ufunc on it runs NumPy on the wrapped arrays and wraps
the result. The cuda modules run their own Python here (`install`: fresh copies of cuda_ops, cuda_rows and
cuda_moe on this fake; cuda_attention, cuda_accept, cuda_graphs and cuda_pass import it as they are): their checks,
scratch buffers, padding, allocations and launches. Only the kernels are stood in. `RawKernel` (and
`RawModule.get_function`, template instances included) reads a kernel's C signature from its source, checks every
launch against it (check_launch) and runs a stand-in, the oracle, for a kernel it knows by name (RAW_KERNELS,
TEMPLATE_KERNELS); `ElementwiseKernel` does the same for the elementwise kernels it knows (ELEMENTWISE).
The CUDA kernels themselves: install(monkeypatch, kernels="cpu") launches each kernel's own CUDA source, compiled
for the CPU by tests/cuda_on_cpu.py, in place of its stand-in (tests/test_kernels_on_cpu.py); compilation for the
GPU is tools/check_cuda_kernels.py's, and the kernels' speed and the GPU's own rounding need a GPU.

Counting (issue 27: one host sync per verify step). `with fake_cupy.counting() as ledger:` records what
crossed between host and device while it is open, each with the CuPy call and the tinyspec line that made it:

    sync     the host blocks until the device is done and bytes come back: asnumpy, .get(), float/int/bool/
             item/tolist of a device array (not len() or iteration: the shape is on the host), a device boolean
             mask (CuPy counts its True entries), Device/Stream.synchronize, and the real get_rows's range
             check of device ids (`bool(... .any())`)
    upload   host bytes go to the device: cupy.asarray(host), dev[...] = host array, a host index array
    launch   a CuPy call that computes (a ufunc, a NumPy function, a method that makes an array, a kernel, a
             memset of cupy.zeros), or one graph launch; views (reshape, slicing, .T) launch nothing
    alloc    a device array made (from the pool, on a GPU)

CUDA graphs, emulated with CuPy's API (cupy/cuda/stream.pyx): `s = cuda.Stream(non_blocking=True)`, `with s:`,
`s.begin_capture()`, `g = s.end_capture()`, `g.launch(stream)`, `s.is_capturing()`. While the current stream
captures, device work is recorded, not run: a call that only makes a new array runs at once (its shape is
needed) and is recorded to run again, in place, into the same array; a call that writes into an array that
exists (setitem, copyto, out=, fill, a kernel's in-place output) is only recorded. g.launch() reruns the record
in order, on the same arrays: exactly a graph's semantics, so a Python int read during capture (a length, an
offset) is baked in, and an array the code rebinds after capture is not the one the graph writes. A sync, an
upload or a download inside a capture raises, as on a GPU (CuPy raises for synchronous transfers; an upload
would bake in the staging buffer's address). Allocations are allowed, as in CuPy's default relaxed capture
mode, and counted on the graph (g.n_allocs): the graph keeps them alive, as a graph-private pool must (PyTorch's
CUDA graphs keep one per graph; with CuPy's shared pool a freed intermediate could be handed to other work).

Memory a replay writes (issue 45). A graph holds no Python reference to the arrays its work touches: CuPy's pool
takes an allocation back when its last array is gone, whatever a graph baked in. The fake counts the device arrays
that view each allocation; what a capture allocates is the graph's (its private pool); a launch whose graph touches
an allocation it did not make and nobody holds any more raises ("freed after its capture").

What a replay bakes in (issue 35, item 4). Replaying the record cannot tell that the code would now pass a launch
a different host scalar (a position the host advanced, a length closed over): the record holds the old one,
as a GPU's graph does, and the tokens may even come out right on a test's inputs. So every call made while
capturing also lands in the graph's trace (g.trace: the call's name and the host numbers among its arguments,
_scalars), and check_replay(graph, rerun), handed to GraphedCall as its `check`, runs the function again before
each replay, as a capture of its own that is thrown away (nothing written, nothing counted), and raises
BakedScalarChanged where a call's scalars, or the calls themselves, differ from the trace. The function itself
is needed for that, and only its owner has it: hence a check argument (cuda_placement(check_graphs=...)), not
a hook in the fake's Graph.launch.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
import types
import warnings
from dataclasses import dataclass, field

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

import cupy_api

from tinyspec import attention, gdn, moe, ops
from tinyspec.quants import GGMLType


def _leak(kind) -> TypeError:
    return TypeError(f"fake cupy: {kind} (CuPy refuses this: a host/device leak in the cuda backend)")


# --- what CuPy has (tests/cupy_api.py): anything else is refused by name

class NotInCuPy(AttributeError, TypeError):
    """An API real CuPy (13.x and 14.x) lacks. CuPy itself raises AttributeError for a missing name and TypeError
    for an unknown keyword or a NumPy function it has no twin for; this is both, so either `except` catches it."""


def _not_in_cupy(what: str) -> NotInCuPy:
    return NotInCuPy(f"fake cupy: {what}: not on tests/cupy_api.py, the API CuPy 13.x and 14.x both have (if both "
                     "do have it, add it there with CuPy's parameters)")


@functools.cache
def _signature(params: str) -> inspect.Signature:
    """A parameter list as tests/cupy_api.py writes it ("a, axis=None, *, dtype=None") as a Signature."""
    return inspect.signature(eval(f"lambda {params}: None", {"float": float}))


def _check(what: str, params: str, args, kwargs) -> None:
    """Refuse a call that CuPy's `what`, taking `params`, would refuse: an unknown keyword, an extra argument."""
    try:
        _signature(params).bind(*args, **kwargs)
    except TypeError as e:
        raise _not_in_cupy(f"{what}({params}) refuses this call ({e})") from None


def _check_ufunc(name: str, method: str, inputs, kwargs) -> None:
    """np.<ufunc>(device array ...): CuPy's __array_ufunc__ calls cupy.<name> (or its .reduce, .at, ...)."""
    if name == "matmul" and method == "__call__":  # a generalized ufunc in CuPy, with keywords of its own
        allowed = cupy_api.MATMUL_CALL
    elif name not in cupy_api.UFUNCS:
        raise _not_in_cupy(f"np.{name}{'' if method == '__call__' else '.' + method} as a CuPy ufunc")
    elif method in cupy_api.UFUNC_METHODS:
        return _check(f"cupy.{name}.{method}", cupy_api.UFUNC_METHODS[method], inputs, kwargs)
    elif method == "__call__":
        allowed = cupy_api.UFUNC_CALL
    else:
        raise _not_in_cupy(f"np.{name}.{method}")
    unknown = sorted(set(kwargs) - allowed)
    if unknown:
        raise _not_in_cupy(f"np.{name}(..., {', '.join(k + '=' for k in unknown)}) (cupy.{name} takes "
                           f"{', '.join(sorted(allowed))})")


def _cupy_name(func) -> str:
    """The cupy function CuPy's __array_function__ hands a NumPy function to: np.argmax -> "argmax",
    np.linalg.norm -> "linalg.norm" (cupy.linalg.norm)."""
    module = func.__module__.removeprefix("numpy").lstrip(".")
    return f"{module}.{func.__name__}" if module else func.__name__


def _check_function(func, args, kwargs) -> None:
    name = _cupy_name(func)
    if name not in cupy_api.FUNCTIONS:
        raise _not_in_cupy(f"np.{name} on a device array (CuPy's __array_function__ finds no cupy.{name}; "
                           "NumPy then raises TypeError)")
    _check(f"cupy.{name}", cupy_api.FUNCTIONS[name], args, kwargs)


def _cupy(name: str):
    """Decorator: the fake's cupy.<name>, refusing the calls CuPy's own would (cupy_api.FUNCTIONS[name])."""
    params = cupy_api.FUNCTIONS[name]

    def decorate(fn):
        @functools.wraps(fn)
        def checked(*args, **kwargs):
            _check(f"cupy.{name}", params, args, kwargs)
            return fn(*args, **kwargs)
        return checked
    return decorate


# --- what crosses between host and device, and what runs (the counting half of this module)

@dataclass(frozen=True)
class Transfer:
    kind: str  # "sync" (device -> host, the host waits) | "upload" (host -> device)
    nbytes: int
    what: str  # the CuPy call
    where: str  # the tinyspec line that made it: "tinyspec/model.py:172 forward"


@dataclass
class Ledger:
    """Everything recorded while a `counting()` block is open."""
    transfers: list[Transfer] = field(default_factory=list)
    launches: int = 0
    allocs: int = 0

    @property
    def syncs(self) -> list[Transfer]:
        return [t for t in self.transfers if t.kind == "sync"]

    @property
    def uploads(self) -> list[Transfer]:
        return [t for t in self.transfers if t.kind == "upload"]

    def snapshot(self) -> tuple[int, int, int, int, int]:
        """(syncs, bytes synced, uploads, launches, allocs) so far: subtract two for what happened between."""
        syncs = self.syncs
        return len(syncs), sum(t.nbytes for t in syncs), len(self.uploads), self.launches, self.allocs

    def causes(self, kind: str = "sync") -> dict[str, int]:
        """How many transfers of `kind` each (call, line) made."""
        out: dict[str, int] = {}
        for t in self.transfers:
            if t.kind == kind:
                key = f"{t.what} at {t.where}"
                out[key] = out.get(key, 0) + 1
        return out


_ledgers: list[Ledger] = []  # the open counting() blocks
_capturing: list["_Capture"] = []  # the capture in progress (at most one)
_HERE = os.path.abspath(__file__)
_NUMPY = os.path.dirname(np.__file__)


@contextlib.contextmanager
def counting():
    """A Ledger of every sync, upload, launch and allocation until the block ends."""
    ledger = Ledger()
    _ledgers.append(ledger)
    try:
        yield ledger
    finally:
        _ledgers.remove(ledger)


def _caller() -> str:
    f = sys._getframe(2)
    while f is not None:
        name = os.path.abspath(f.f_code.co_filename)
        if name != _HERE and not name.startswith(_NUMPY):
            short = name.split(os.sep + "tinyspec" + os.sep, 1)[-1]
            short = "tinyspec/" + short if "tinyspec" + os.sep in name else os.path.basename(name)
            return f"{short}:{f.f_lineno} {f.f_code.co_name}"
        f = f.f_back
    return "?"


def _transfer(kind: str, nbytes: int, what: str) -> None:
    if _capturing:
        raise RuntimeError(f"fake cupy: {what} ({'a device-to-host sync' if kind == 'sync' else 'a host-to-device copy'})"
                           " inside a CUDA graph capture (CuPy and CUDA refuse it)")
    if _ledgers:
        t = Transfer(kind, int(nbytes), what, _caller())
        for ledger in _ledgers:
            ledger.transfers.append(t)


CONCAT_THRESHOLD = 1 << 20  # bytes per array under which CuPy joins more than 8 arrays in one kernel


def _pointer_table(arrays) -> None:
    """CuPy's concatenate of more than 8 arrays of one dtype and under CONCAT_THRESHOLD bytes each on average runs
    one kernel that reads a table of their pointers, which it uploads first (core.array(ptrs), in
    cupy/_core/_routines_manipulation.pyx, _concatenate_single_kernel): an upload, refused inside a capture."""
    arrays = list(arrays)
    if len(arrays) > 8 and len({a.dtype for a in arrays}) == 1 and \
            sum(a.nbytes for a in arrays) < CONCAT_THRESHOLD * len(arrays):
        _transfer("upload", 8 * len(arrays), f"cupy.concatenate of {len(arrays)} arrays (its pointer table)")


def _launched(n: int = 1) -> None:
    if _capturing:  # captured work is recorded, not launched
        return
    for ledger in _ledgers:
        ledger.launches += n


def _allocated(n: int = 1, arrays=()) -> None:
    """n device allocations made (arrays: them, where the caller has them): counted; during a capture they come from
    the graph's own pool, so the graph keeps them."""
    for ledger in _ledgers:
        ledger.allocs += n
    if _capturing:
        _capturing[-1].n_allocs += n
        for a in arrays:
            _capturing[-1].owned.add(id(_root(a)))


def _run(fn, makes: bool, inputs=(), what: str = "", scalars: tuple = ()):
    """Run one piece of device work, or record it while a graph captures.

    what names the call and scalars are the host numbers among its arguments (_scalars): while a graph captures,
    each call's (what, scalars) joins the capture's trace, the values the graph bakes in (check_replay).

    makes=True: fn() returns an array (or a tuple of them) and writes nowhere else. It runs now (its shape is
    needed); an output that shares no memory with `inputs` is new work (a launch, an allocation) and, during
    capture, is recorded to be computed again into the same array; an output that views an input (reshape,
    a slice) is no work at all. makes=False: fn() writes into arrays that exist (one launch); during capture
    it is only recorded, not run (a GPU does not run captured work)."""
    if _capturing:
        _capturing[-1].trace.append((what, scalars))
        for x in _arrays(inputs):
            _capturing[-1].touched[id(_root(x))] = _root(x)
    if not makes:
        _launched()
        if _capturing:
            _capturing[-1].work.append(fn)
            return None
        return fn()
    if _capturing:  # computed now on what captured work has not written yet: any numbers, no warnings (a GPU
        with np.errstate(all="ignore"):  # computes nothing during a capture)
            out = fn()
    else:
        out = fn()
    outs = tuple(np.asarray(a) if isinstance(a, np.generic) else a for a in (out if isinstance(out, tuple) else (out,)))
    flat = [x for x in _arrays(inputs)]
    fresh = [isinstance(a, np.ndarray) and not any(np.may_share_memory(a, x) for x in flat) for a in outs]
    if any(fresh):
        _launched()
        _allocated(sum(fresh), [a for a, f in zip(outs, fresh) if f])  # during a capture: the graph's own
        if _capturing:
            def again(fn=fn, outs=outs, fresh=fresh):
                new = fn()
                for dst, src, f in zip(outs, new if isinstance(new, tuple) else (new,), fresh):
                    if f:
                        np.copyto(dst, src)
            _capturing[-1].work.append(again)
    return outs if isinstance(out, tuple) else outs[0]


def _arrays(x, kind=np.ndarray):
    """Every `kind` instance inside x, through tuples, lists and dict values, in order."""
    if isinstance(x, kind):
        yield x
    elif isinstance(x, (tuple, list)):
        for v in x:
            yield from _arrays(v, kind)
    elif isinstance(x, dict):
        for v in x.values():
            yield from _arrays(v, kind)


def _scalars(x) -> tuple:
    """The host numbers among a call's arguments, in order: Python and NumPy scalars, slice bounds, inside tuples,
    lists and dicts (by key); arrays are not scalars (their addresses are the graph's inputs), nor dtypes or names.
    What a kernel launch bakes in as a value: a length, an offset, a position, an eps, an axis."""
    out: list = []

    def walk(v):
        if isinstance(v, (bool, int, float, complex)):
            out.append(v)
        elif isinstance(v, np.generic):
            out.append(v.item())
        elif isinstance(v, slice):
            walk((v.start, v.stop, v.step))
        elif isinstance(v, (tuple, list)):
            for e in v:
                walk(e)
        elif isinstance(v, dict):
            for k in sorted(v):
                walk(v[k])
    walk(x)
    return tuple(out)


def _writes(func, kwargs) -> bool:
    """A NumPy call that writes into an array it is given rather than making one."""
    return kwargs.get("out") is not None or func in (np.copyto, np.put, np.place, np.putmask)


_SYNCING = (np.nonzero, np.flatnonzero, np.argwhere, np.unique, np.compress, np.extract)  # output size from data
_MUTATING_METHODS = ("fill", "put", "sort", "partition")


def _root(a: np.ndarray) -> np.ndarray:
    """The array whose memory `a` views (itself if it owns it): one device allocation."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


_holders: dict[int, int] = {}  # id(allocation) -> device arrays (ndarray objects) that view it, alive now
_freed: set[int] = set()  # allocations whose last device array is gone: CuPy's pool may hand their memory out again


def _released(root_id: int) -> None:
    _holders[root_id] -= 1
    if not _holders[root_id]:
        del _holders[root_id]
        _freed.add(root_id)


class ndarray(NDArrayOperatorsMixin):
    """A device array: a NumPy array that NumPy will not take back implicitly. Each one counts as a holder of the
    allocation it views (_holders): when the last is gone the memory is free, as CuPy's pool would have it."""

    __slots__ = ("_a", "_root")

    def __init__(self, a: np.ndarray):
        assert isinstance(a, np.ndarray), type(a)
        self._a = a
        self._root = id(_root(a))
        _holders[self._root] = _holders.get(self._root, 0) + 1
        _freed.discard(self._root)

    def __del__(self):
        if _released is not None:  # (at interpreter exit the module's globals may be gone)
            _released(self._root)

    # --- what CuPy refuses
    def __array__(self, dtype=None, copy=None):
        raise _leak("implicit conversion of a device array to NumPy")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        _check_ufunc(ufunc.__name__, method, inputs, kwargs)
        raw = _unwrap((inputs, kwargs), strict=True)
        call = lambda: getattr(ufunc, method)(*raw[0], **raw[1])
        what, scalars = f"np.{ufunc.__name__}" + ("" if method == "__call__" else f".{method}"), _scalars(raw)
        if method == "at" or kwargs.get("out") is not None:  # in place: x += y, np.add(x, y, out=...)
            _run(call, makes=False, inputs=raw, what=what, scalars=scalars)
            out = kwargs.get("out")
            return None if method == "at" else out[0] if isinstance(out, tuple) and len(out) == 1 else out
        return _wrap(_run(call, makes=True, inputs=raw, what=what, scalars=scalars))

    def __array_function__(self, func, types_, args, kwargs):
        _check_function(func, args, kwargs)
        raw = _unwrap((args, kwargs), strict=True)
        call = lambda: func(*raw[0], **raw[1])
        if func in _SYNCING:
            _transfer("sync", 8, f"np.{func.__name__} of a device array (its size comes from the data)")
        if func is np.concatenate:
            _pointer_table(raw[0][0] if raw[0] else raw[1].get("arrays", ()))
        what, scalars = f"np.{func.__name__}", _scalars(raw)
        if _writes(func, kwargs):
            _run(call, makes=False, inputs=raw, what=what, scalars=scalars)
            return kwargs.get("out")
        return _wrap(_run(call, makes=True, inputs=raw, what=what, scalars=scalars))

    def __imatmul__(self, other):  # CuPy's ndarray has no __imatmul__: `x @= y` makes a new array, as x = x @ y
        return NotImplemented

    # --- what CuPy allows
    data = property(lambda self: types.SimpleNamespace(ptr=self._a.ctypes.data, device_id=0))  # a MemoryPointer
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
        if name in cupy_api.NDARRAY_ATTRIBUTES:
            return _wrap(getattr(self._a, name))
        if name not in cupy_api.NDARRAY_METHODS:
            raise _not_in_cupy(f"cupy.ndarray.{name}")
        attr, params = getattr(self._a, name), cupy_api.NDARRAY_METHODS[name]

        def method(*args, **kwargs):
            _check(f"cupy.ndarray.{name}", params, args, kwargs)
            raw = _unwrap((args, kwargs), strict=True)
            if name == "nonzero":
                _transfer("sync", 8, ".nonzero() of a device array")
            what, scalars = f"ndarray.{name}", _scalars(raw)
            if name in _MUTATING_METHODS:
                return _run(lambda: attr(*raw[0], **raw[1]), makes=False, inputs=(self._a, raw), what=what,
                            scalars=scalars)
            return _wrap(_run(lambda: attr(*raw[0], **raw[1]), makes=True, inputs=(self._a, raw), what=what,
                              scalars=scalars))
        return method

    def __getitem__(self, key):
        raw = _index(key)
        return _wrap(_run(lambda: self._a[raw], makes=True, inputs=(self._a,), what="ndarray[]", scalars=_scalars(raw)))

    def __setitem__(self, key, value):
        parts = key if isinstance(key, tuple) else (key,)
        advanced = any(isinstance(p, (np.ndarray, ndarray, list)) for p in parts)
        if isinstance(value, np.ndarray) and value.ndim and not advanced:  # CuPy's _scatter_op: y.fill(value)
            raise ValueError("fake cupy: non-scalar numpy.ndarray cannot be used for fill (CuPy refuses dev[...] = "
                             "host array under a basic index: use dev.set(host) or cupy.asarray(host))")
        raw_key = _index(key)
        if isinstance(value, np.ndarray):  # under an index array CuPy converts the value (core.array): an upload
            _transfer("upload", value.nbytes, "dev[...] = host array")
        raw_value = _unwrap(value, strict=False)
        _run(lambda: self._a.__setitem__(raw_key, raw_value), makes=False, inputs=(self._a, raw_key, raw_value),
             what="ndarray[]=", scalars=_scalars((raw_key, raw_value)))

    # --- conversions, as core.pyx has them: len() and iteration read the host's shape (no sync; TypeError on a
    # 0-d array); int(), float(), bool() bring the value back (a sync). No __index__: a device array is no index.
    def __len__(self):
        return len(self._a)

    def __iter__(self):  # CuPy: (self[i] for i in range(len(self)))
        return (_wrap(row) for row in self._a)

    def _fetch(self, what: str):
        _transfer("sync", self._a.nbytes, what)
        return self._a

    def __float__(self):
        return float(self._fetch("float()"))

    def __int__(self):
        return int(self._fetch("int()"))

    def __bool__(self):  # CuPy's __nonzero__: only a one-element array is read back
        if self.size == 0:
            warnings.warn("The truth value of an empty array is ambiguous. Returning False, but in future this will "
                          "result in an error. Use `array.size > 0` to check that an array is not empty.",
                          DeprecationWarning, stacklevel=2)
            return False
        if self.size > 1:
            raise ValueError("The truth value of an array with more than one element is ambiguous. "
                             "Use a.any() or a.all()")
        return bool(self._fetch("bool()"))

    def item(self):
        if self.size != 1:  # CuPy checks before it copies
            raise ValueError("can only convert an array of size 1 to a Python scalar")
        return self._fetch(".item()").item()

    def tolist(self):
        return self._fetch(".tolist()").tolist()

    def get(self):
        return self._fetch(".get()").copy()

    def set(self, arr, stream=None):
        """CuPy's ndarray.set: a host array of the same dtype and shape copied in (an upload)."""
        if not isinstance(arr, np.ndarray):
            raise TypeError("Only numpy.ndarray can be set to cupy.ndarray")
        if arr.dtype != self.dtype:
            raise TypeError(f"{arr.dtype} array cannot be set to {self.dtype} array")
        if arr.shape != self.shape:
            raise ValueError("Shape mismatch")
        if not self._a.flags.c_contiguous:
            raise RuntimeError("Cannot set to non-contiguous array")
        _transfer("upload", arr.nbytes, "dev.set(host array)")
        a = np.array(arr)
        _run(lambda: np.copyto(self._a, a), makes=False, inputs=(self._a,), what="ndarray.set")

    def __repr__(self):
        return f"fake_cupy.ndarray({self._a!r})"


def _index(key):
    """An index into a device array, as NumPy takes it: a host index array is uploaded (CuPy copies it), a
    device boolean mask costs a sync (CuPy counts its True entries to size the result)."""
    parts = key if isinstance(key, tuple) else (key,)
    for part in parts:
        if isinstance(part, np.ndarray):
            _transfer("upload", part.nbytes, "a host index array")
        elif isinstance(part, ndarray) and part.dtype == np.bool_:
            _transfer("sync", 8, "a device boolean mask")
    return _unwrap(key, strict=False)


def _wrap(x):
    if isinstance(x, np.ndarray):
        return ndarray(x)
    if isinstance(x, np.generic):  # a reduction's scalar stays on the device (CuPy returns a 0-d array)
        return ndarray(np.asarray(x))
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

@_cupy("asarray")
def asarray(x, dtype=None):
    if isinstance(x, ndarray):
        if dtype is None or x.dtype == dtype:
            return x
        return ndarray(_run(lambda: x._a.astype(dtype), makes=True, what="ndarray.astype"))
    a = np.array(x, dtype=dtype)  # an upload copies
    if isinstance(x, np.ndarray) or a.ndim:
        _transfer("upload", a.nbytes, "cupy.asarray(host)")
    _allocated()
    return ndarray(a)


@_cupy("ascontiguousarray")
def ascontiguousarray(x, dtype=None):
    if not isinstance(x, ndarray):
        raise _leak("cupy.ascontiguousarray of a host array")
    return ndarray(_run(lambda: np.ascontiguousarray(x._a, dtype=dtype), makes=True, inputs=(x._a,)))


@_cupy("asnumpy")
def asnumpy(x):
    if isinstance(x, ndarray):
        _transfer("sync", x.nbytes, "cupy.asnumpy")
        return x._a.copy()
    return np.asarray(x)


def _alloc(fn, launches: bool):
    def make(*args, **kwargs):
        if not launches:  # cupy.empty: memory from the pool, nothing written
            a = fn(*args, **kwargs)
            _allocated(1, [a])
            return ndarray(a)
        return ndarray(_run(lambda: fn(*args, **kwargs), makes=True, what=f"cupy.{fn.__name__}",
                            scalars=_scalars((args, kwargs))))
    return make


empty = _cupy("empty")(_alloc(np.empty, False))
zeros, ones, full, arange = (_cupy(f.__name__)(_alloc(f, True)) for f in (np.zeros, np.ones, np.full, np.arange))
float16, float32, float64 = np.float16, np.float32, np.float64
int8, int16, int32, int64, uint8, uint16, uint32, uint64 = (np.int8, np.int16, np.int32, np.int64, np.uint8,
                                                            np.uint16, np.uint32, np.uint64)
bool_ = np.bool_


@_cupy("empty_like")
def empty_like(x, dtype=None, shape=None):
    a = np.empty_like(x._a, dtype=dtype, shape=shape)
    _allocated(1, [a])
    return ndarray(a)


@_cupy("zeros_like")
def zeros_like(x, dtype=None, shape=None):
    return ndarray(_run(lambda: np.zeros_like(x._a, dtype=dtype, shape=shape), makes=True, what="cupy.zeros_like",
                        scalars=_scalars(shape)))


class _Device:
    def __init__(self, device=None):
        self.id = device or 0
        self.compute_capability = "90"

    def synchronize(self):
        _transfer("sync", 0, "Device.synchronize")


class _Capture:
    def __init__(self):
        self.work, self.n_allocs = [], 0
        self.touched: dict[int, np.ndarray] = {}  # allocations the recorded work reads or writes (by id)
        self.owned: set[int] = set()  # allocations made during the capture: the graph's own pool keeps them
        self.trace: list[tuple[str, tuple]] = []  # (call, its host scalars) for every call made while capturing


class Graph:
    """cupy.cuda.Graph: the work a capture recorded; launch() reruns it in order on the same arrays. trace: each
    captured call with the host scalars it baked in (what check_replay compares)."""

    def __init__(self, work: list, n_allocs: int, trace: list | None = None, borrowed: dict | None = None):
        self.work, self.n_allocs, self.trace = work, n_allocs, trace or []
        self.borrowed = borrowed or {}  # allocations made before the capture that its work reads or writes

    def launch(self, stream=None):
        if _capturing:
            raise RuntimeError("fake cupy: a graph launched inside a capture (not emulated)")
        freed = [a for i, a in self.borrowed.items() if i in _freed]
        if freed:  # CUDA would replay into memory the pool may have handed to another array since
            raise RuntimeError(f"fake cupy: a graph replays into {len(freed)} allocation(s) freed after its capture "
                               f"(shapes {[a.shape for a in freed][:4]}): keep them alive while the graph lives")
        _launched()  # one cudaGraphLaunch, whatever the graph holds
        for fn in self.work:
            fn()


class Stream:
    """cupy.cuda.Stream: `with stream:` makes it current; begin_capture / end_capture / is_capturing as CuPy's."""

    null: "Stream"

    def __init__(self, null=False, non_blocking=False, ptds=False):  # 14.x adds priority=
        self.is_null, self._capture = null, None

    def __enter__(self):
        _streams.append(self)
        return self

    def __exit__(self, *exc):
        _streams.pop()

    def begin_capture(self, mode=None):
        if self.is_null:
            raise RuntimeError("cannot capture on the default (legacy) stream")
        if get_current_stream() is not self:
            raise RuntimeError("fake cupy: capture on a stream that is not current (the work would go elsewhere)")
        if _capturing:
            raise RuntimeError("fake cupy: a capture is already in progress")
        self._capture = _Capture()
        _capturing.append(self._capture)

    def end_capture(self) -> Graph:
        if self._capture is None:
            raise RuntimeError("fake cupy: end_capture without begin_capture")
        _capturing.remove(self._capture)
        capture, self._capture = self._capture, None
        return Graph(capture.work, capture.n_allocs, capture.trace,
                     {i: a for i, a in capture.touched.items() if i not in capture.owned})

    def is_capturing(self) -> bool:
        return self._capture is not None

    def synchronize(self):
        _transfer("sync", 0, "Stream.synchronize")


Stream.null = Stream(null=True)


class BakedScalarChanged(RuntimeError):
    """A graph is about to replay, but its function would now pass a launch another host scalar than the one the
    capture baked in (or take another path): on a GPU the replay would silently compute with the old value."""


def check_replay(graph: Graph, rerun) -> None:
    """GraphedCall's check (fast/cuda_graphs.py), called before each replay with rerun() = the graph's function on
    the graph's inputs. It runs rerun() as a capture of its own, thrown away: the calls are made (their host
    scalars known) but write nothing and count in no ledger, and the trace must equal the one the graph
    recorded, call for call. A length closed over, a position the host advanced, an offset read from a
    Python variable: each differs here and raises BakedScalarChanged, where a GPU would replay the old value."""
    saved = _ledgers[:]
    _ledgers.clear()
    check = _Capture()
    _capturing.append(check)
    try:
        rerun()
    finally:
        _capturing.remove(check)
        _ledgers.extend(saved)
    for i, (baked, now) in enumerate(zip(graph.trace, check.trace)):
        if baked != now:
            raise BakedScalarChanged(f"fake cupy: call {i} of a captured graph, {baked[0]}, was captured with the "
                                     f"host scalars {baked[1]} and its function now passes {now[0]} {now[1]}: a "
                                     "replay would use the captured values (read it from device memory, or key "
                                     "the graph on it)")
    if len(graph.trace) != len(check.trace):
        raise BakedScalarChanged(f"fake cupy: a captured graph made {len(graph.trace)} calls, its function now makes "
                                 f"{len(check.trace)}: it took another path, which a replay cannot")
_streams: list[Stream] = []


class MemoryPool:
    """cupy.cuda.MemoryPool: the fake allocates from NumPy, so a pool only hands out its malloc."""

    def malloc(self, nbytes):
        raise NotImplementedError("fake cupy: arrays are NumPy's; using_allocator only marks the block")


@contextlib.contextmanager
def using_allocator(allocator=None):
    """cupy.cuda.using_allocator: where arrays made in the block come from (the fake: NumPy, as always)."""
    yield


def get_current_stream() -> Stream:
    return _streams[-1] if _streams else Stream.null


class _Namespace(types.SimpleNamespace):
    """cupy.cuda, cupy.cuda.runtime, ...: the members given; any other is refused by name."""

    def __getattr__(self, name):  # only for a member that is not there
        if name.startswith("__"):
            raise AttributeError(name)
        raise _not_in_cupy(f"{self._path}.{name}")


def _device_properties(device: int) -> dict:
    """cupy.cuda.runtime.getDeviceProperties: the fields tools/gpu_check.py reads, for a card that is the CPU."""
    return {"name": b"fake cupy (the CPU)", "multiProcessorCount": 0, "totalGlobalMem": 0}


cuda = _Namespace(_path="cupy.cuda", Device=_Device,
                  runtime=_Namespace(_path="cupy.cuda.runtime", getDevice=lambda: 0, getDeviceCount=lambda: 1,
                                     runtimeGetVersion=lambda: 0, driverGetVersion=lambda: 0,
                                     getDeviceProperties=_device_properties),
                  Stream=Stream, Graph=Graph, graph=_Namespace(_path="cupy.cuda.graph", Graph=Graph),
                  get_current_stream=get_current_stream, MemoryPool=MemoryPool, using_allocator=using_allocator)


def _by_dispatch(name: str):
    """cupy.<name> for a NumPy function that dispatches on its arguments (NEP 18): np.<name> on device arrays is
    the same call (their __array_function__ checks it and runs it); with no device array among them CuPy would
    refuse the host data, and so does this."""
    func = getattr(np, name)

    @_cupy(name)
    def call(*args, **kwargs):
        if not any(True for _ in _arrays((args, kwargs), ndarray)):
            raise _leak(f"cupy.{name} of host data only")
        return func(*args, **kwargs)
    call.__name__ = name
    return call


argmax, cumprod, take, concatenate = (_by_dispatch(n) for n in ("argmax", "cumprod", "take", "concatenate"))

_EXPORTS = ("ndarray", "asarray", "ascontiguousarray", "asnumpy", "empty", "zeros", "ones", "full", "arange",
            "empty_like", "zeros_like", "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
            "uint16", "uint32", "uint64", "bool_", "cuda", "argmax", "cumprod", "take", "concatenate",
            "RawKernel", "RawModule", "ElementwiseKernel")


def _module_getattr(name):
    """cupy.<name> the fake does not define: CuPy's, not emulated yet (add it here), or not CuPy's at all."""
    if name in cupy_api.FUNCTIONS or name in cupy_api.NAMES:
        raise AttributeError(f"fake cupy: cupy.{name} is CuPy's, but the fake does not emulate it (add it to "
                             "tests/fake_cupy.py)")
    raise _not_in_cupy(f"cupy.{name}")


def module() -> types.ModuleType:
    """This file as the `cupy` module (what `import cupy` finds while the fixture is active)."""
    m = types.ModuleType("cupy")
    m.__version__ = "fake"
    for name in _EXPORTS:
        setattr(m, name, globals()[name])
    m.__getattr__ = _module_getattr  # PEP 562: asked for a name the module lacks
    return m


def _device(x, what: str) -> np.ndarray:
    if not isinstance(x, ndarray):
        raise _leak(f"{what} handed to a CUDA kernel as a host {type(x).__name__}")
    return x._a


# --- cupy.RawKernel: a kernel the fake knows by name runs its stand-in, the oracle; its CUDA source is never run.
# So a module that launches its own RawKernel (fast/cuda_attention.py) runs its real Python side here: its checks,
# its uploads and allocations (counted as any), its grid and its argument list, which the stand-in reads.

# A kernel parameter's C type -> the dtype CuPy's launch must be handed: an array of it for a pointer, a NumPy
# scalar of it otherwise (CuPy passes a Python int or float by its own rules, so tinyspec hands every scalar typed)
C_TYPES = {"float": np.float32, "double": np.float64, "int": np.int32, "unsigned int": np.uint32,
           "long long": np.int64, "int64_t": np.int64, "unsigned char": np.uint8, "uint8_t": np.uint8, "u8": np.uint8,
           "uint2": np.uint32,  # (a pair of uint32: handed as a uint32 array)
           "unsigned short": np.uint16, "uint16_t": np.uint16, "uint32_t": np.uint32, "__half": np.float16,
           "half": np.float16}
MAX_THREADS, MAX_SHARED = 1024, 48 * 1024  # a block's threads, and its shared memory without opting in
MAX_GRID = (2**31 - 1, 65535, 65535)


@functools.lru_cache(maxsize=None)
def kernel_signature(code: str, name: str) -> tuple[list[tuple[str, bool]], int | None]:
    """The parameters of `extern "C" __global__ void name(...)` in code, as (C base type, is a pointer), and its
    __launch_bounds__ (None if it declares none; a #define'd name is looked up in the source)."""
    import re

    code = re.sub(r"//[^\n]*|/\*.*?\*/", " ", code, flags=re.S)  # comments, which may sit among the parameters
    base = name.split("<")[0].strip()  # a template instance ("quant_linear_k<2, 16, 2>"): its template's parameters
    m = re.search(r'(?:extern\s+"C"\s+)?__global__\s+void\s+(?:__launch_bounds__\(([^)]*)\)\s+)?'
                  + re.escape(base) + r"\s*\(([^)]*)\)", code)
    if m is None:
        raise ValueError(f"fake cupy: no __global__ kernel {base!r} in its source")
    bound = m[1] and m[1].split(",")[0]  # __launch_bounds__(threads[, min blocks])
    if bound is not None and not bound.strip().isdigit():
        define = re.search(r"#define\s+" + re.escape(bound.strip()) + r"\s+(\d+)", code)
        bound = define[1] if define else None
    params = []
    for decl in m[2].split(","):
        words = [w for w in decl.replace("*", " * ").split() if w not in ("const", "__restrict__", "volatile")]
        pointer = "*" in words
        base = " ".join(w for w in words[:-1] if w != "*")  # the last word is the parameter's name
        if base not in C_TYPES:
            raise ValueError(f"fake cupy: kernel {name!r}: parameter type {base!r} not known (add it to C_TYPES)")
        params.append((base, pointer))
    return tuple(params), None if bound is None else int(bound)


def check_launch(name: str, signature, grid, block, args, shared_mem: int) -> None:
    """Refuse a launch a GPU would refuse or misread: the argument count, each argument's kind and dtype against
    the C parameter (a device array for a pointer, a typed scalar otherwise), the grid and block limits and the
    kernel's __launch_bounds__, the shared memory a block may take without opting in."""
    params, bound = signature
    if len(args) != len(params):
        raise TypeError(f"fake cupy: kernel {name} takes {len(params)} arguments, the launch gives {len(args)}")
    for i, ((base, pointer), a) in enumerate(zip(params, args)):
        want = np.dtype(C_TYPES[base])
        if pointer:
            if isinstance(a, np.ndarray):
                raise _leak(f"a host array as argument {i} ({base}*) of the kernel {name}")
            if not isinstance(a, ndarray):
                raise TypeError(f"fake cupy: kernel {name} argument {i} ({base}*) needs a device array, got "
                                f"{type(a).__name__}")
            if a.dtype != want:
                raise TypeError(f"fake cupy: kernel {name} argument {i} ({base}*) is {a.dtype}: the kernel would "
                                f"read its bytes as {want}")
        elif not isinstance(a, np.generic) or a.dtype != want:
            raise TypeError(f"fake cupy: kernel {name} argument {i} ({base}) needs a numpy {want} scalar, got "
                            f"{type(a).__name__}")
    grid, block = tuple(grid) + (1,) * (3 - len(grid)), tuple(block) + (1,) * (3 - len(block))
    threads = int(np.prod(block))
    if any(int(g) < 1 or int(g) > most for g, most in zip(grid, MAX_GRID)) or min(block) < 1 \
            or threads > MAX_THREADS or block[2] > 64:
        raise ValueError(f"fake cupy: kernel {name}: grid {grid} / block {block} outside CUDA's limits")
    if bound is not None and threads > bound:
        raise ValueError(f"fake cupy: kernel {name}: {threads} threads a block, its __launch_bounds__ is {bound}")
    if not 0 <= shared_mem <= MAX_SHARED:
        raise ValueError(f"fake cupy: kernel {name}: {shared_mem} bytes of shared memory (at most {MAX_SHARED} "
                         "without opting in)")


class RawKernel:
    """cupy.RawKernel(code, name, options=()): nothing is compiled, but the source's signature of `name` is read
    (kernel_signature). kernel(grid, block, args, shared_mem=0) is checked against it (check_launch), then runs its
    stand-in on the arguments' arrays, as one launch, recorded and not run while a graph captures (a replay then
    reads the device arrays as they are at the replay, as the kernel would): RAW_KERNELS[name](grid, block, *args),
    or for a template instance ("quant_linear_k<2, 16, 2>") TEMPLATE_KERNELS[its template]((2, 16, 2), grid, ...)."""

    def __init__(self, code, name, options=(), backend="nvrtc", translate_cucomplex=False, *,
                 enable_cooperative_groups=False, jitify=False, _module_names=None):
        base = name.split("<")[0].strip()
        if base in TEMPLATE_KERNELS and "<" in name:
            targs = tuple(int(t) for t in name[name.index("<") + 1 : name.rindex(">")].split(","))
            self.stand_in = functools.partial(TEMPLATE_KERNELS[base], targs)
        elif name in RAW_KERNELS:
            self.stand_in = RAW_KERNELS[name]
        else:
            raise NotImplementedError(f"fake cupy: no stand-in for the kernel {name!r} (add one to RAW_KERNELS)")
        self.name, self.base, self.code, self.options = name, base, code, options
        self.signature = kernel_signature(code, name)
        self.on_cpu = None  # with kernels="cpu" (install): the CUDA source itself, compiled for the CPU
        if KERNELS == "cpu":
            import cuda_on_cpu

            self.on_cpu = cuda_on_cpu.compile(code, list(_module_names or [name]))

    def __call__(self, grid, block, args, *, shared_mem=0):
        check_launch(self.name, self.signature, grid, block, args, shared_mem)
        raw = [_device(a, f"argument {i} of {self.name}") if isinstance(a, (ndarray, np.ndarray)) else a
               for i, a in enumerate(args)]
        stand_in = self.stand_in
        if self.on_cpu is not None:  # the compiled kernel on the same arrays (tests/cuda_on_cpu.py)
            stand_in = functools.partial(_launch_on_cpu, self.on_cpu, self.name, shared_mem)
        launch = lambda: stand_in(tuple(grid), tuple(block), *raw)  # noqa: E731
        _run(launch, makes=False, inputs=raw, what=self.name,
             scalars=_scalars((tuple(grid), tuple(block), raw, shared_mem)))  # what the launch bakes in
        if _capturing and self.base not in IN_PLACE:  # also now, on whatever its inputs hold: a capture's later
            with np.errstate(all="ignore"), contextlib.suppress(Exception):  # host-side steps (the fake computes
                launch()  # the arrays they make at once) then index with these outputs, not never-written memory.
                # Such a kernel overwrites its outputs from its inputs alone: the replay computes the same again.


def _launch_on_cpu(module, name, shared_mem, grid, block, *args):
    module.launch(name, grid, block, args, shared_mem)


IN_PLACE = {"gdn_scan_k"}  # kernels that update an input in place: run at a replay only, never twice


def _attend_rows(grid, block, q, k_pool, v_pool, seq, row0, n_past, tab0, tables, o, H_kv, G, d, bs, scale):
    """cuda_attention's attend_rows kernel: row r of sequence b = seq[r] attends over its n = n_past[b] +
    (r - row0[b]) + 1 positions, found through tables[tab0[b]:], by the oracle (attention.attend_paged of that
    row alone: the oracle computes each row by its own calls, so these are the oracle's ragged call's bits)."""
    R = q.shape[0]
    assert grid == (R * H_kv,) and q.shape == o.shape == (R, H_kv, G, d) and k_pool.shape[1:] == (bs, H_kv, d), \
        (grid, q.shape, o.shape, k_pool.shape, (H_kv, G, d, bs))
    assert all(a.dtype == np.int32 for a in (seq, row0, n_past, tab0, tables))
    attention.attend_rows(q, k_pool, v_pool, seq, row0, n_past, tab0, tables, np.float32(scale), out=o)


def _norm_rows(grid, block, x, w, y, n, eps, mean, has_w):
    """cuda_rows' norm_rows kernel, one block a row: the oracle's rms_norm (mean) or l2_norm of each row into y."""
    rows = x.reshape(-1, int(n))
    assert grid == (rows.shape[0],) and block == (128,) and y.shape == x.shape, (grid, block, x.shape, y.shape)
    out = ops.rms_norm(rows, w[: int(n)] if has_w else np.ones(int(n), np.float32), np.float32(eps)) if mean \
        else ops.l2_norm(rows, np.float32(eps))
    np.copyto(y, out.reshape(y.shape))


def _route_k(grid, block, logits, T, E, k, probs, chosen, weights):
    """cuda_moe's route_k kernel: the oracle's routing (moe.route) of each of the T rows into chosen and weights."""
    assert logits.shape == (T, E) and chosen.shape == weights.shape == (T, k), (logits.shape, chosen.shape)
    c, w = moe.route(logits, int(k))
    np.copyto(chosen, c.astype(np.int32))
    np.copyto(weights, w.astype(np.float32))


def _group_k(grid, block, chosen, P, E, offsets, order):
    """cuda_moe's group_k kernel: the oracle's grouping by expert (moe.group_by_expert), offsets over all E."""
    assert chosen.size == P and offsets.shape == (E + 1,) and order.shape == (P,), (chosen.shape, P, E)
    o, distinct, starts = moe.group_by_expert(chosen)
    counts = np.zeros(int(E), np.int64)
    counts[distinct] = np.diff(starts)
    np.copyto(order, o.astype(np.int64))
    np.copyto(offsets, np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))


def _quant_linear_k(targs, grid, block, x, ldx, T, raw, row_bytes, n_out, n_in, vec, S, y):
    """cuda_ops' float kernel on one tile of T rows of x (padded to ldx): the oracle's quant_linear of those rows."""
    qtype, nt, _ = targs
    assert T <= nt and x.shape[0] >= T and y.shape == (T, n_out), (targs, x.shape, y.shape)
    np.copyto(y, ops.quant_linear(x[:T, : int(n_in)], raw, GGMLType(qtype), (int(n_out), int(n_in))))


def _quant_linear_grouped_k(targs, grid, block, x, ldx, offsets, E, raw, expert_bytes, row_bytes, n_out, n_in, vec,
                            S, y):
    """cuda_ops' grouped kernel: expert e's rows offsets[e] .. offsets[e+1]-1 times its bytes, by the oracle."""
    qtype = GGMLType(targs[0])
    experts = raw.reshape(int(E), -1)
    for e in range(int(E)):
        a, b = int(offsets[e]), int(offsets[e + 1])
        if b > a:
            y[a:b] = ops.quant_linear(x[a:b, : int(n_in)], experts[e], qtype, (int(n_out), int(n_in)))


def _mma_prep_x(grid, block, x, ldx, T, n_steps, xb, xsum):
    """cuda_ops' tensor-core prologue (x in fragment order): here x's float32 bits, as they are, into xb."""
    n_in = 16 * int(n_steps)
    xb.view(np.float32)[: int(T) * n_in] = x[: int(T), :n_in].reshape(-1)


def _mma_linear_k(targs, grid, block, xb, xsum, T, raw, row_bytes, n_out, n_in, S, y):
    """cuda_ops' tensor-core kernel: the oracle's quant_linear of the x _mma_prep_x left in xb."""
    x = xb.view(np.float32)[: int(T) * int(n_in)].reshape(int(T), int(n_in))
    np.copyto(y, ops.quant_linear(x, raw, GGMLType(targs[0]), (int(n_out), int(n_in))))


def _get_rows_k(targs, grid, block, raw, row_bytes, n_rows, n_in, vec, ids, out):
    """cuda_ops' get_rows kernel: the oracle's rows (negative ids from the end)."""
    np.copyto(out, ops.get_rows(raw, GGMLType(targs[0]), (int(n_rows), int(n_in)), ids))


def _gdn_scan_k(targs, grid, block, q, k, v, log_decay, beta, state_in, state_out, o, ring, has_ring, T, HV, V):
    """cuda_ops' delta-rule scan: the oracle's gdn_scan from state_in into state_out (it may be state_in: in
    place), o and, with has_ring, the ring."""
    o[...] = gdn.gdn_scan(q, k, v, log_decay, beta, state_in, states_out=ring if has_ring else None,
                          out=state_out)[0]


RAW_KERNELS = {"attend_rows": _attend_rows, "norm_rows": _norm_rows, "route_k": _route_k, "group_k": _group_k,
               "mma_prep_x": _mma_prep_x}
TEMPLATE_KERNELS = {"quant_linear_k": _quant_linear_k, "quant_linear_grouped_k": _quant_linear_grouped_k,
                    "mma_linear_k": _mma_linear_k, "get_rows_k": _get_rows_k, "gdn_scan_k": _gdn_scan_k}


class RawModule:
    """cupy.RawModule(code=..., options=(), name_expressions=...): get_function(name) is a RawKernel of that source
    (checked the same); a template instance must be among the name_expressions, as CuPy requires."""

    def __init__(self, code=None, path=None, options=(), backend="nvrtc", translate_cucomplex=False, *,
                 enable_cooperative_groups=False, name_expressions=None, jitify=False):
        self.code, self.options, self.names = code, options, tuple(name_expressions or ())

    def get_function(self, name):
        if "<" in name and name not in self.names:
            raise KeyError(f"fake cupy: {name!r} is not among the module's name_expressions")
        import cuda_on_cpu  # (only its source parsing: what a compiled module exports, as CuPy's RawModule does)

        exported = list(self.names) + [n for n in cuda_on_cpu.extern_c_kernels(self.code) if n not in self.names]
        return RawKernel(self.code, name, self.options, _module_names=exported)


ELEMENTWISE = {"tinyspec_sigmoid": ops.sigmoid, "tinyspec_silu": ops.silu, "tinyspec_softplus": ops.softplus}


class ElementwiseKernel:
    """cupy.ElementwiseKernel(in_params, out_params, operation, name): a kernel the fake knows by name (ELEMENTWISE)
    runs the oracle's function on a float32 device array, one launch, into a new array."""

    def __init__(self, in_params, out_params, operation, name="kernel", reduce_dims=True, preamble="",
                 no_return=False, return_tuple=False, loop_prep="", after_loop="", options=()):
        if name not in ELEMENTWISE:
            raise NotImplementedError(f"fake cupy: no stand-in for the elementwise kernel {name!r} (add it)")
        if (in_params, out_params) != ("float32 x", "float32 y"):
            raise NotImplementedError(f"fake cupy: elementwise {name}: only float32 x -> float32 y is emulated")
        self.name, self.fn = name, ELEMENTWISE[name]
        if KERNELS == "cpu":  # the operation itself, compiled for the CPU (tests/cuda_on_cpu.py)
            import cuda_on_cpu

            module = cuda_on_cpu.compile(cuda_on_cpu.elementwise_source(name, operation), [name])
            self.fn = functools.partial(_elementwise_on_cpu, module, name)

    def __call__(self, x):
        a = _device(x, f"the input of {self.name}")
        if a.dtype != np.float32:
            raise TypeError(f"fake cupy: elementwise {self.name} takes float32 x, got {a.dtype}")
        return ndarray(_run(lambda: self.fn(a).astype(np.float32), makes=True, inputs=a, what=self.name))


def _elementwise_on_cpu(module, name, a):
    flat = np.ascontiguousarray(a).reshape(-1)
    out = np.empty_like(flat)
    module.launch(name, (max(1, -(-flat.size // 128)),), (128,), (flat, out, np.int64(flat.size)))
    return out.reshape(a.shape)


REAL_MODULES = ("cuda_ops", "cuda_rows", "cuda_moe")  # the cuda modules whose own Python runs here, their kernels stood in


def real_module(name: str) -> types.ModuleType:
    """A fresh copy of tinyspec.fast.<name> imported against the `cupy` now in sys.modules (this fake): its
    checks, allocations and launches run here, only its kernels are stood in (RAW_KERNELS, ELEMENTWISE)."""
    import importlib.util

    import tinyspec.fast

    spec = importlib.util.spec_from_file_location(f"tinyspec.fast.{name}",
                                                  os.path.join(os.path.dirname(tinyspec.fast.__file__), f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


KERNELS = "oracle"  # what a RawKernel launch runs: "oracle" (the stand-ins above) or "cpu" (install's kernels=)


def install(monkeypatch, kernels: str = "oracle") -> None:
    """While a test runs: `import cupy` and the cuda kernel modules resolve to these stand-ins, and a GPU is
    "available" (what the `cuda` fixtures of the cuda-path tests do). kernels="cpu": every RawKernel and RawModule
    kernel launch runs its own CUDA source, compiled for the CPU by tests/cuda_on_cpu.py, instead of the oracle
    (the caller checks a compiler exists: cuda_on_cpu.compiler()), the elementwise kernels' operations too."""
    import tinyspec.fast
    from tinyspec import backends

    if kernels not in ("oracle", "cpu"):
        raise ValueError(f"fake cupy: kernels must be 'oracle' or 'cpu', got {kernels!r}")
    monkeypatch.setattr(sys.modules[__name__], "KERNELS", kernels)

    monkeypatch.setitem(sys.modules, "cupy", module())
    real = {name: real_module(name) for name in REAL_MODULES}  # their own Python, on this fake
    for name, stand_in in real.items():
        monkeypatch.setitem(sys.modules, f"tinyspec.fast.{name}", stand_in)
        monkeypatch.setattr(tinyspec.fast, name, stand_in, raising=False)
    monkeypatch.setattr(backends, "cuda_available", lambda: True)

