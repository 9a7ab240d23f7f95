"""fast/cuda_attention.py's Python side, on the CPU: the row map, the one upload a call makes, the backend's
wiring, and a graph replay that reads new lengths from device memory.

The kernel runs here as the fake CuPy's stand-in (tests/fake_cupy.py RawKernel: the oracle, reading the same
arguments the CUDA kernel gets), so these check what the wrapper builds and hands over, not the CUDA code:
its numbers are checked against the oracle on a GPU by tests/test_cuda_ops.py (section 6), and its source
compiles for every architecture (tests/test_cuda_compile.py).
"""

from __future__ import annotations

import numpy as np
import pytest

import fake_cupy
from tinyspec import attention, backends
from tinyspec.fast import cuda_attention
from tinyspec.fast.cuda_attention import DeviceAttention, row_map, split

H_KV, G, D, BS, N_BLOCKS = 2, 3, 16, 4, 24
SCALE = np.float32(D ** -0.5)


@pytest.fixture
def cuda(monkeypatch):
    fake_cupy.install(monkeypatch)


def pool(rng):  # k_pool, v_pool [N_BLOCKS, BS, H_KV, D]
    return (rng.standard_normal((N_BLOCKS, BS, H_KV, D)).astype(np.float32),
            rng.standard_normal((N_BLOCKS, BS, H_KV, D)).astype(np.float32))


def dev(a):
    return fake_cupy.asarray(a)


def test_row_map_by_hand():
    """Two sequences, block size 4: A has 5 positions before its 2 rows (7: blocks [3, 0]), B none before its 3
    rows (3: block [6]); ids past the used ones are dropped."""
    rows, R, B = row_map([np.array([3, 0, 9]), np.array([6, 1])], [5, 0], np.array([0, 2, 5]), 4, 10)
    assert (R, B) == (5, 2) and rows.dtype == np.int32
    #                      seq        | row0 | n_past | tab0 | tables
    assert rows.tolist() == [0, 0, 1, 1, 1, 0, 2, 5, 0, 0, 2, 3, 0, 6]
    seq, row0, n_past, tab0, tables = split(rows, R, B)
    assert seq.tolist() == [0, 0, 1, 1, 1] and tables[tab0[1]:].tolist() == [6]


@pytest.mark.parametrize("tables,n_pasts,bounds,match", [
    ([np.array([3])], [5], [0, 2], "too short"),
    ([np.array([3, 99])], [5], [0, 2], "out of range"),
    ([np.array([3, -1])], [5], [0, 2], "out of range"),
    ([np.array([3, 4])], [-1], [0, 2], "n_past"),
    ([np.array([3, 4])], [5], [1, 2], "bounds"),
    ([np.array([3.0, 4.0])], [5], [0, 2], "integer block ids"),
])
def test_row_map_refuses_what_the_kernel_would_misread(tables, n_pasts, bounds, match):
    with pytest.raises(ValueError, match=match):
        row_map(tables, n_pasts, np.array(bounds), 4, 10)


def test_every_form_is_the_oracle_with_one_upload_and_one_launch(rng):
    """Through the fake (the kernel is the oracle there), so equal bit for bit: this checks the map the wrapper
    builds. Each call uploads its row map once (4 bytes per int: R + 3B + the used ids) and launches once."""
    att = DeviceAttention(fake_cupy)
    k_pool, v_pool = pool(rng)
    tables = [np.array([3, 7, 1, 9, 4]), np.array([0, 2, 5]), np.array([11, 12]), np.array([8, 10])]
    n_pasts, bounds = [10, 0, 5, 2], np.array([0, 4, 9, 9, 12])  # the third sequence has no rows this call
    q = rng.standard_normal((12, H_KV, G, D)).astype(np.float32)
    want = attention.attend_paged_ragged(q, k_pool, v_pool, tables, n_pasts, bounds, SCALE)
    q_dev, k_dev, v_dev = dev(q), dev(k_pool), dev(v_pool)
    with fake_cupy.counting() as ledger:
        got = att.attend_paged_ragged(q_dev, k_dev, v_dev, tables, n_pasts, bounds, SCALE)
    used = [4, 2, 2, 2]  # ceil((n_past + T_b) / 4): 14, 5, 5, 5 positions
    assert np.array_equal(fake_cupy.asnumpy(got), want)
    assert len(ledger.uploads) == 1 and ledger.uploads[0].nbytes == 4 * (12 + 3 * 4 + sum(used))
    with fake_cupy.counting() as ledger:
        got = att.attend_paged(q_dev[:4], k_dev, v_dev, tables[0], 10, SCALE)
    assert np.array_equal(fake_cupy.asnumpy(got), want[:4]) and len(ledger.uploads) == 1 and ledger.launches == 1
    keys, values = rng.standard_normal((2, 40, H_KV, D)).astype(np.float32)  # a contiguous cache, spare room
    want = attention.attend(q[:9], keys, values, 20, SCALE)
    keys_dev, values_dev = dev(keys), dev(values)
    with fake_cupy.counting() as ledger:
        got = att.attend(q_dev[:9], keys_dev, values_dev, 20, SCALE)
    assert np.array_equal(fake_cupy.asnumpy(got), want)
    assert len(ledger.uploads) == 1 and ledger.uploads[0].nbytes == 4 * (9 + 4) and ledger.launches == 1


def test_the_kernel_takes_device_arrays_only(rng):
    att = DeviceAttention(fake_cupy)
    k_pool, v_pool = pool(rng)
    q = rng.standard_normal((2, H_KV, G, D)).astype(np.float32)
    host_map = split(row_map([np.array([1])], [0], np.array([0, 2]), BS, N_BLOCKS)[0], 2, 1)
    with pytest.raises(ValueError, match="int32 device array"):
        att.attend_rows(dev(q), dev(k_pool), dev(v_pool), *host_map, SCALE)
    with pytest.raises(TypeError, match="host/device leak"):  # a host pool handed to the kernel
        att.attend_rows(dev(q), k_pool, v_pool, *[dev(a) for a in host_map], SCALE)


def test_the_cuda_backend_attends_on_the_device_and_a_host_q_goes_to_the_oracle(cuda, rng):
    """backends.cuda_kernels names DeviceAttention's three forms, behind device_rows: a device q is one launch
    of the kernel, a host q (with host keys) is the oracle's call, untouched (no upload, nothing launched)."""
    kern = backends.cuda_kernels()
    k_pool, v_pool = pool(rng)
    q = rng.standard_normal((3, H_KV, G, D)).astype(np.float32)
    tables, n_pasts, bounds = [np.array([5, 6]), np.array([7])], [4, 1], np.array([0, 2, 3])
    want = attention.attend_paged_ragged(q, k_pool, v_pool, tables, n_pasts, bounds, SCALE)
    q_dev, k_dev, v_dev = dev(q), dev(k_pool), dev(v_pool)
    with fake_cupy.counting() as ledger:
        got = kern.attend_paged_ragged(q_dev, k_dev, v_dev, tables, n_pasts, bounds, SCALE)
    assert np.array_equal(fake_cupy.asnumpy(got), want) and len(ledger.uploads) == 1
    with fake_cupy.counting() as ledger:
        host = kern.attend_paged_ragged(q, k_pool, v_pool, tables, n_pasts, bounds, SCALE)
        one = kern.attend_paged(q[:2], k_pool, v_pool, tables[0], 4, SCALE)
        keys = k_pool.reshape(-1, H_KV, D)
        flat = kern.attend(q, keys, keys, 5, SCALE)
    assert isinstance(host, np.ndarray) and np.array_equal(host, want) and np.array_equal(one, want[:2])
    assert np.array_equal(flat, attention.attend(q, keys, keys, 5, SCALE))
    assert ledger.snapshot() == (0, 0, 0, 0, 0)
    assert kern.attend.__name__ == "attend" and kern.attend_paged_ragged.__name__ == "attend_paged_ragged"


def test_a_head_too_wide_for_the_kernel_is_declined_to_the_oracle(cuda, rng):
    """G * d beyond the kernel's shared memory: the wrapper returns None and device_rows runs the oracle on the
    device arrays (NumPy dispatching to CuPy), with no row map uploaded."""
    kern = backends.cuda_kernels()
    d = 8192  # q and the running sums alone would take 64 KB of shared memory
    assert cuda_attention.shared_bytes(1, d) > cuda_attention.MAX_SHARED
    q, keys = rng.standard_normal((2, 1, 1, d)).astype(np.float32), rng.standard_normal((3, 1, d)).astype(np.float32)
    q_dev, keys_dev = dev(q), dev(keys)
    with fake_cupy.counting() as ledger:
        got = kern.attend(q_dev, keys_dev, keys_dev, 1, np.float32(0.01))
    assert not ledger.uploads and isinstance(got, fake_cupy.ndarray)
    np.testing.assert_array_equal(fake_cupy.asnumpy(got), attention.attend(q, keys, keys, 1, np.float32(0.01)))


def test_a_graph_replays_the_kernel_with_the_lengths_in_device_memory(cuda, rng):
    """Issue 35 item 5's prerequisite: attend_rows takes every length and block id from device arrays, so a graph
    captured once replays with new ones. Capture at one step's map, copy the next step's map into the same
    buffer (same R, B and number of ids: the sequences moved on by one position, a block changed), replay: the
    oracle's result at the new lengths, and the fake's check_replay finds no host scalar (a length, an offset)
    that the capture baked in and the call would now change. The host-int form cannot be captured: its upload
    raises."""
    att = DeviceAttention(fake_cupy)
    k_pool, v_pool = pool(rng)
    q, out = dev(rng.standard_normal((4, H_KV, G, D)).astype(np.float32)), fake_cupy.empty((4, H_KV, G, D), np.float32)
    k_dev, v_dev = dev(k_pool), dev(v_pool)
    bounds = np.array([0, 1, 4])
    steps = [([np.array([2, 3]), np.array([9, 4])], [4, 2]), ([np.array([2, 3]), np.array([9, 5])], [5, 3])]
    host_map, R, B = row_map(steps[0][0], steps[0][1], bounds, BS, N_BLOCKS)
    buf = dev(host_map)
    def rerun():
        return att.attend_rows(q, k_dev, v_dev, *split(buf, R, B), SCALE, out=out)

    rerun()  # eager once
    stream = fake_cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        rerun()
        with pytest.raises(RuntimeError, match="inside a CUDA graph capture"):
            att.attend_paged_ragged(q, k_dev, v_dev, steps[0][0], steps[0][1], bounds, SCALE)
        graph = stream.end_capture()
    for tables, n_pasts in steps:
        new_map = row_map(tables, n_pasts, bounds, BS, N_BLOCKS)[0]
        assert new_map.shape == host_map.shape
        buf.set(new_map)  # an upload, outside the capture
        fake_cupy.check_replay(graph, rerun)  # the new lengths are data: no host scalar the graph baked in changed
        graph.launch(stream)
        want = attention.attend_paged_ragged(fake_cupy.asnumpy(q), k_pool, v_pool, tables, n_pasts, bounds, SCALE)
        assert np.array_equal(fake_cupy.asnumpy(out), want)
