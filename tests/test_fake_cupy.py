"""The fake CuPy (tests/fake_cupy.py) is as strict as CuPy: what real CuPy lacks, the fake refuses by name.

The cuda-path tests (test_cuda_host_device.py, test_cuda_syncs.py, test_gpu_check.py) are only worth what
the fake refuses. These tests pin the refusals down: a device array is no index (CuPy's ndarray has no
__index__), the conversions sync where CuPy's do, and every call is checked against tests/cupy_api.py (the
API CuPy 13.x and 14.x both have): a function, a method, a keyword outside it raises NotInCuPy.
"""

from __future__ import annotations

import operator
import warnings

import numpy as np
import pytest

import cupy_api
import fake_cupy
from fake_cupy import NotInCuPy


def dev(*values, dtype=np.float32):
    return fake_cupy.asarray(np.array(values, dtype=dtype))


def syncs_of(fn):
    """(what fn returned, how many syncs it made)."""
    with fake_cupy.counting() as ledger:
        out = fn()
    return out, len(ledger.syncs)


# --- a device array is no index: CuPy's ndarray has no __index__

def test_a_device_array_is_not_an_index():
    n = fake_cupy.asarray(np.array(2, np.int64))  # a 0-d device integer, as an argmax or a count gives
    assert not hasattr(fake_cupy.ndarray, "__index__")
    with pytest.raises(TypeError):
        operator.index(n)
    with pytest.raises(TypeError):
        range(n)
    with pytest.raises(TypeError):
        [1, 2, 3][:n]
    with pytest.raises(TypeError):
        dev(1, 2, 3)[:n]
    assert syncs_of(lambda: [1, 2, 3][:int(n)]) == ([1, 2], 1)  # int() first: a sync, and visibly one


def test_conversions_sync_where_cupy_syncs():
    x = fake_cupy.asarray(np.array(1.5, np.float32))  # 0-d: a reduction's result
    assert syncs_of(lambda: float(x)) == (1.5, 1)
    assert syncs_of(lambda: int(x)) == (1, 1)
    assert syncs_of(lambda: bool(x)) == (True, 1)
    assert syncs_of(lambda: x.item()) == (1.5, 1)
    assert syncs_of(lambda: x.tolist()) == (1.5, 1)
    assert syncs_of(lambda: len(dev(1, 2, 3))) == (3, 0)  # the shape is on the host
    rows, n = syncs_of(lambda: list(dev(1, 2, 3)))
    assert n == 0 and all(isinstance(r, fake_cupy.ndarray) for r in rows)  # rows stay on the device


def test_bool_follows_cupys_nonzero():
    with pytest.raises(ValueError, match="more than one element"):  # refused before anything is read back
        syncs_of(lambda: bool(dev(1, 2)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert syncs_of(lambda: bool(fake_cupy.zeros(0))) == (False, 0)
    assert any(issubclass(w.category, DeprecationWarning) for w in caught)
    with pytest.raises(TypeError):
        len(fake_cupy.asarray(np.array(1.0)))  # len() of a 0-d array, as CuPy and NumPy
    with pytest.raises(ValueError):
        dev(1, 2).item()


# --- only what CuPy has: functions, ufuncs, methods, attributes, keywords

def test_what_cupy_has_runs():
    x = dev(3, 1, 2)
    assert int(np.argmax(x, axis=-1)) == 0
    assert x.astype(np.int64, copy=False).dtype == np.int64
    assert float(np.sum(x, axis=0, keepdims=True)[0]) == 6.0
    np.add(x, x, out=x)
    assert fake_cupy.asnumpy(x).tolist() == [6, 2, 4]
    assert fake_cupy.asnumpy(np.concat([x, x])).size == 6  # NumPy's alias reaches cupy.concatenate by name
    assert float(np.linalg.norm(dev(3, 4))) == 5.0


@pytest.mark.parametrize("call, missing", [
    (lambda x: np.cumulative_sum(x), "np.cumulative_sum"),  # CuPy 14.x only
    (lambda x: np.busday_count(x, x), "np.busday_count"),
    (lambda x: np.spacing(x), "np.spacing"),  # a NumPy ufunc CuPy has none of
    (lambda x: x.resize(2), "cupy.ndarray.resize"),
    (lambda x: x.byteswap(), "cupy.ndarray.byteswap"),  # CuPy 14.x only
    (lambda x: x.ctypes, "cupy.ndarray.ctypes"),
], ids=["function", "numpy-only", "ufunc", "method", "method-14", "attribute"])
def test_an_api_cupy_lacks_is_refused_by_name(call, missing):
    with pytest.raises(NotInCuPy, match=missing.replace(".", r"\.")):
        call(dev(1, 2, 3))


@pytest.mark.parametrize("call, keyword", [
    (lambda x: np.add(x, x, where=x > 1), "where"),  # CuPy's ufuncs take out, dtype, casting
    (lambda x: np.sum(x, initial=0.0), "initial"),
    (lambda x: x.reshape(shape=(3,)), "shape"),
    (lambda x: x.sort(kind="stable"), "kind"),  # CuPy 14.x only
    (lambda x: x.astype(np.int32, device="cpu"), "device"),
    (lambda x: fake_cupy.asarray(np.ones(3), copy=False), "copy"),  # CuPy 14.x only
    (lambda x: fake_cupy.zeros(3, np.float32, like=x), "like"),
    (lambda x: x.sum(0, None, None, False, 1), "too many"),  # one positional argument more than CuPy's
], ids=["ufunc-where", "sum-initial", "reshape-shape", "sort-kind", "astype-device", "asarray-copy",
        "zeros-like", "positional"])
def test_a_keyword_cupy_lacks_is_refused(call, keyword):
    with pytest.raises(NotInCuPy, match=keyword):
        call(dev(1, 2, 3))


def test_the_module_and_cuda_refuse_what_cupy_lacks():
    cupy = fake_cupy.module()
    with pytest.raises(NotInCuPy, match="cupy.bfloat16"):
        cupy.bfloat16
    assert not hasattr(cupy, "bfloat16")  # an AttributeError too, as CuPy's own
    with pytest.raises(AttributeError, match="does not emulate") as e:
        cupy.where  # CuPy's, not the fake's: not a CuPy gap
    assert not isinstance(e.value, NotInCuPy)
    with pytest.raises(NotInCuPy, match="cupy.cuda.Event"):
        cupy.cuda.Event
    with pytest.raises(TypeError):
        cupy.cuda.Stream(non_blocking=True, priority=0)  # CuPy 14.x only


def test_not_in_cupy_is_caught_as_cupy_would_raise():
    with pytest.raises(TypeError):  # NumPy's dispatch finding no cupy function, an unknown keyword
        np.cumulative_sum(dev(1, 2))
    with pytest.raises(AttributeError):  # a missing method
        dev(1, 2).resize(1)


def test_the_allow_list_is_well_formed():
    """Every parameter list parses, and every name the fake defines is on the list (the list's origin, CuPy's
    sources, is in tests/cupy_api.py's docstring: CI has no CuPy to check it against)."""
    for params in [*cupy_api.FUNCTIONS.values(), *cupy_api.NDARRAY_METHODS.values(), *cupy_api.UFUNC_METHODS.values()]:
        fake_cupy._signature(params)
    for name in fake_cupy._EXPORTS:
        assert name in cupy_api.FUNCTIONS or name in cupy_api.NAMES, name
    for name, members in cupy_api.CUDA.items():
        member = getattr(fake_cupy.cuda, name)
        member = member() if name == "Device" else member  # its id and compute_capability are per device
        assert all(hasattr(member, m) for m in members), name


def test_module_functions_dispatch_to_numpy_and_refuse_host_data():
    """cupy.argmax, cumprod, take, concatenate (what tools/gpu_check.py's raw capture calls): NumPy's function on
    device arrays, device arrays back; with only host data CuPy would refuse, and so does the fake."""
    x = dev(3, 9, 9, 1)
    assert fake_cupy.asnumpy(fake_cupy.argmax(x)).item() == 1  # the first of the tied maxima
    both = fake_cupy.concatenate([x, fake_cupy.cumprod(x)])
    assert isinstance(both, fake_cupy.ndarray) and fake_cupy.asnumpy(both).tolist() == [3, 9, 9, 1, 3, 27, 243, 243]
    assert fake_cupy.asnumpy(fake_cupy.take(x, dev(2, dtype=np.int64))).tolist() == [9]
    with pytest.raises(TypeError, match="host data"):
        fake_cupy.argmax(np.arange(3))


def test_a_capture_traces_the_host_scalars_it_bakes_in():
    """Every call made while capturing is traced with the host numbers among its arguments (check_replay's
    record): a slice bound, an axis, a fill value; arrays are not scalars."""
    x = dev(1, 2, 3, 4)
    stream = fake_cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        y = x[1:3].sum(axis=0)
        y[...] = 7
        graph = stream.end_capture()
    assert graph.trace == [("ndarray[]", (1, 3)), ("ndarray.sum", (0,)), ("ndarray[]=", (7,))]


def test_a_raw_kernel_launch_is_checked_against_its_c_signature():
    """Issue 45, fault 5: the fake's RawKernel ran its stand-in on whatever it was handed. A GPU reads a kernel's
    arguments by its C signature: a missing argument, a float64 array where it reads float*, a Python int where
    it reads int, a block over 1024 threads or its __launch_bounds__, or shared memory past 48 KB without opting
    in is a wrong answer or a launch failure there. The fake now reads the signature from the source and refuses
    each, as the real cuda_attention launch (tests/test_cuda_attention.py) passes."""
    from tinyspec.fast import cuda_attention

    cp = fake_cupy.module()
    params, bound = fake_cupy.kernel_signature(cuda_attention.SOURCE, "attend_rows")
    assert bound == cuda_attention.THREADS and len(params) == 14
    assert params[0] == ("float", True) and params[3] == ("int", True) and params[-1] == ("float", False)
    kernel = cp.RawKernel(cuda_attention.SOURCE, "attend_rows", options=cuda_attention.OPTIONS)
    f32, i32 = cp.zeros((1, 1, 1, 4), dtype=np.float32), cp.zeros(1, dtype=np.int32)
    pool = cp.zeros((1, 4, 1, 4), dtype=np.float32)
    good = [f32, pool, pool, i32, i32, i32, i32, i32, cp.zeros((1, 1, 1, 4), dtype=np.float32),
            np.int32(1), np.int32(1), np.int32(4), np.int32(4), np.float32(0.5)]
    bad = {"an argument missing": (good[:-1], (1,), (128,), 0),
           "a float64 array for float*": ([cp.zeros((1, 1, 1, 4), dtype=np.float64)] + good[1:], (1,), (128,), 0),
           "a host array for int*": (good[:3] + [np.zeros(1, np.int32)] + good[4:], (1,), (128,), 0),
           "a Python int for int": (good[:9] + [1] + good[10:], (1,), (128,), 0),
           "past __launch_bounds__": (good, (1,), (256,), 0),
           "over 1024 threads": (good, (1,), (32, 64), 0),
           "shared memory past 48 KB": (good, (1,), (128,), 64 * 1024)}
    for why, (args, grid, block, shared) in bad.items():
        with pytest.raises((TypeError, ValueError)):
            kernel(grid, block, tuple(args), shared_mem=shared)
    fake_cupy.check_launch("attend_rows", (params, bound), (1,), (128,), good, 1024)  # the right launch passes


def test_a_graph_that_replays_into_memory_freed_after_its_capture_is_refused():
    """Issue 45, fault 5: the fake's memory pool did nothing, so a graph writing an array its capture did not own,
    replayed after the array was dropped, ran on as if the memory were still there; on a GPU the pool may have
    handed it to another array by then (fault 1 was that: a replaced scratch buffer). The fake now counts the
    device arrays that view each allocation; a replay touching a freed one that the graph did not allocate itself
    raises. Arrays made during the capture are the graph's (its private pool) and never count as freed."""
    import gc

    cp = fake_cupy.module()
    scratch = {"buf": cp.zeros(4, dtype=np.float32)}  # the pattern of fault 1: module-level scratch
    x = cp.asarray(np.arange(4, dtype=np.float32))

    def work():
        np.multiply(x, 2, out=scratch["buf"])  # into the scratch the capture sees
        return scratch["buf"] + 1  # a new array: the graph's own

    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        out = work()
        graph = stream.end_capture()
    graph.launch()
    assert np.array_equal(cp.asnumpy(out), [1, 3, 5, 7])
    scratch["buf"] = cp.zeros(8, dtype=np.float32)  # a larger call replaces the scratch; nothing holds the old
    gc.collect()
    with pytest.raises(RuntimeError, match="freed after its capture"):
        graph.launch()
    kept = cp.zeros(4, dtype=np.float32)  # the fix: the old buffer kept alive while a graph may replay it
    scratch["buf"] = kept
    with stream:
        stream.begin_capture()
        work()
        graph = stream.end_capture()
    retired = [scratch["buf"]]
    scratch["buf"] = cp.zeros(8, dtype=np.float32)
    graph.launch()  # the retired buffer is alive: the replay is sound
    assert retired[0] is kept
