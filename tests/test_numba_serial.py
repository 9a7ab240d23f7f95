"""The scan and attention kernels on the calling thread and threaded: the same bits, and the cheap path chosen.

fast/numba_gdn.py and fast/numba_attention.py run a call's (sequence, value head) or (row, kv head) pairs either
shared by the threads (prange) or one after another on the calling thread, by the call's size against the
module's SERIAL_BELOW (a parallel region costs more than a small model's decode token). The pairs are
independent and each does the same float operations wherever it runs, so both loops must give the same bits:
forced here by setting SERIAL_BELOW to 0 (always threaded) or beyond any size (never), at the shipped tiny
model's shapes, Qwen3.5's and odd ones, ragged batches, with and without per-token snapshots (plain and
streamed) and in-place updates. Then: which loop a decode token of the tiny model takes, read-only and
list inputs, and the wrappers' checks.
"""

import numpy as np
import pytest

pytest.importorskip("numba")

from test_numba_gdn import inputs

from tinyspec import gdn
from tinyspec.fast import numba_attention, numba_gdn
from tinyspec.state import zeros_aligned

NEVER = 1 << 62  # a SERIAL_BELOW no call reaches: every call on the calling thread


def bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


def ragged_bounds(rng, B, most=5):
    return np.cumsum([0, *rng.integers(1, most + 1, B)])


def scan_both(monkeypatch, *args, kinds, outs):
    """gdn_scan_ragged(*args) threaded and on the calling thread, each on fresh copies of the states and snapshot
    buffers (kinds[b]: 0 none, 1 plain, 2 64-byte aligned; outs[b]: 0 fresh, 1 in place, 2 another buffer)."""
    q, k, v, log_decay, beta, bounds, states = args
    HV, K, V = states[0].shape
    runs = []
    for below in (0, NEVER):
        monkeypatch.setattr(numba_gdn, "SERIAL_BELOW", below)
        live = [s.copy() for s in states]
        snaps = [[None, np.zeros((hi - lo + 1, HV, K, V), np.float32), zeros_aligned((hi - lo + 1, HV, K, V))][kind]
                 for lo, hi, kind in zip(bounds[:-1], bounds[1:], kinds)]
        out = [[None, live[b], np.zeros_like(live[b])][o] for b, o in enumerate(outs)]
        o, new = numba_gdn.gdn_scan_ragged(q, k, v, log_decay, beta, bounds, live, snaps, out)
        runs.append((o, new, snaps, live))
    return runs


@pytest.mark.parametrize("HV,K,V", [(8, 32, 32), (16, 128, 128), (3, 16, 33), (2, 5, 7)],
                         ids=["tiny-target", "0.8b-heads", "odd", "tiny"])
@pytest.mark.parametrize("seed,B", [(0, 1), (1, 1), (2, 3), (3, 4)])
def test_scan_threaded_and_calling_thread_bitwise_equal(monkeypatch, seed, B, HV, K, V):
    """Outputs, new states, snapshots and in-place states: the same bits from either loop, and the oracle's."""
    rng = np.random.default_rng(seed * 10 + HV)
    bounds = ragged_bounds(rng, B)
    q, k, v, log_decay, beta, _ = inputs(rng, bounds[-1], HV, K, V)
    states = [rng.standard_normal((HV, K, V)).astype(np.float32) for _ in range(B)]
    kinds, outs = rng.integers(0, 3, B), rng.integers(0, 3, B)
    kinds[0], outs[0] = seed % 3, (seed + 1) % 3  # seeds 0, 1, 2: the first sequence takes each kind of both
    threaded, serial = scan_both(monkeypatch, q, k, v, log_decay, beta, bounds, states, kinds=kinds, outs=outs)
    o_ref, new_ref = gdn.gdn_scan_ragged(q, k, v, log_decay, beta, bounds, states)
    (o, new, snaps, live), (o1, new1, snaps1, live1) = threaded, serial
    assert np.array_equal(bits(o), bits(o_ref)) and np.array_equal(bits(o1), bits(o_ref))
    for b in range(B):
        assert np.array_equal(bits(new[b]), bits(new_ref[b])) and np.array_equal(bits(new1[b]), bits(new_ref[b])), b
        assert np.array_equal(bits(live[b]), bits(live1[b])), b  # updated in place, or left alone, alike
        assert (new[b] is live[b]) == (new1[b] is live1[b]) == (outs[b] == 1), b
        if kinds[b]:
            assert np.array_equal(bits(snaps[b]), bits(snaps1[b])), b


@pytest.mark.parametrize("H_kv,G,d,bs", [(1, 5, 64, 16), (2, 4, 256, 16), (3, 1, 33, 5), (1, 2, 16, 1)],
                         ids=["tiny-target", "qwen3.5", "odd", "block-of-one"])
@pytest.mark.parametrize("seed,B", [(0, 1), (1, 1), (2, 3), (3, 5)])
def test_attention_threaded_and_calling_thread_bitwise_equal(monkeypatch, seed, B, H_kv, G, d, bs):
    """attend_paged_ragged, attend_paged and attend: the same bits from either loop."""
    rng = np.random.default_rng(seed * 7 + d)
    bounds = ragged_bounds(rng, B)
    n_pasts = [int(n) for n in rng.integers(0, 60, B)]
    n_blocks = B * -(-70 // bs) + 2
    free = list(rng.permutation(n_blocks))
    tables = [np.array([free.pop() for _ in range(-(-(n + hi - lo) // bs))], np.int64)
              for n, lo, hi in zip(n_pasts, bounds[:-1], bounds[1:])]
    k_pool = rng.standard_normal((n_blocks, bs, H_kv, d)).astype(np.float32)
    v_pool = rng.standard_normal((n_blocks, bs, H_kv, d)).astype(np.float32)
    q = rng.standard_normal((bounds[-1], H_kv, G, d)).astype(np.float32)
    scale = np.float32(d ** -0.5)
    T0 = bounds[1]
    keys = k_pool[tables[0]].reshape(-1, H_kv, d)
    values = v_pool[tables[0]].reshape(-1, H_kv, d)
    runs = []
    for below in (0, NEVER):
        monkeypatch.setattr(numba_attention, "SERIAL_BELOW", below)
        runs.append((numba_attention.attend_paged_ragged(q, k_pool, v_pool, tables, n_pasts, bounds, scale),
                     numba_attention.attend_paged(q[:T0], k_pool, v_pool, tables[0], n_pasts[0], scale),
                     numba_attention.attend(q[:T0], keys, values, n_pasts[0], scale)))
    for threaded, serial in zip(*runs):
        assert np.array_equal(bits(threaded), bits(serial))
    assert np.array_equal(bits(runs[1][0][:T0]), bits(runs[1][1]))  # and a row is its sequence's alone
    assert np.array_equal(bits(runs[1][1]), bits(runs[1][2]))  # paged is contiguous over the gathered keys


def spy(monkeypatch, module, name):
    """Replace module.name (the threaded kernel) and module.name_serial (its entry on the calling thread) by
    recorders that still run them: True for a threaded call, False for one on the calling thread."""
    seen = []
    for kernel_name, threaded in ((name, True), (name + "_serial", False)):
        def run(*args, kernel=getattr(module, kernel_name), threaded=threaded):
            seen.append(threaded)
            return kernel(*args)

        monkeypatch.setattr(module, kernel_name, run)
    return seen


def test_a_tiny_model_decode_token_stays_on_the_calling_thread(monkeypatch):
    """The shipped target's shapes (8 value heads of 32 x 32; 5 query heads over 1 kv head of 64, a short
    context): one token, and a 4-token verify, take the loop without a parallel region; Qwen3.5-0.8B's scan
    (16 heads of 128 x 128) and a long context at d = 256 take the threads; one (row, kv head) pair, which
    threads cannot split, never does."""
    rng = np.random.default_rng(0)
    scans = spy(monkeypatch, numba_gdn, "_scan_ragged")
    for R, HV, K in ((1, 8, 32), (4, 8, 32), (1, 16, 128)):
        q, k, v, log_decay, beta, state = inputs(rng, R, HV, K, K)
        numba_gdn.gdn_scan(q, k, v, log_decay, beta, state, out=state)
    assert scans == [False, False, True]
    attends = spy(monkeypatch, numba_attention, "_attend")
    for T, n_past, H_kv, G, d in ((1, 40, 1, 5, 64), (4, 40, 1, 5, 64), (4, 1000, 2, 4, 256), (1, 3000, 1, 5, 64)):
        pool = rng.standard_normal((-(-(n_past + T) // 16), 16, H_kv, d)).astype(np.float32)
        q = rng.standard_normal((T, H_kv, G, d)).astype(np.float32)
        numba_attention.attend_paged(q, pool, pool, np.arange(pool.shape[0]), n_past, 0.125)
    assert attends == [False, False, True, False]


def test_read_only_and_list_inputs():
    """A read-only state (no writeable buffer to take the address from) and bounds, tables and n_pasts as lists:
    the same bits as writeable arrays."""
    rng = np.random.default_rng(3)
    q, k, v, log_decay, beta, state = inputs(rng, 3, 2, 16, 16)
    o_ref, s_ref = numba_gdn.gdn_scan(q, k, v, log_decay, beta, state)
    frozen = state.copy()
    frozen.flags.writeable = False
    o, (s,) = numba_gdn.gdn_scan_ragged(q, k, v, log_decay, beta, [0, 3], [frozen])
    assert np.array_equal(bits(o), bits(o_ref)) and np.array_equal(bits(s), bits(s_ref))
    x = rng.standard_normal((3, 32)).astype(np.float32)
    window, weight = rng.standard_normal((32, 3)).astype(np.float32), rng.standard_normal((32, 4)).astype(np.float32)
    y_ref, w_ref = numba_gdn.causal_conv(x, window, weight)
    window.flags.writeable = False
    y, (w,) = numba_gdn.causal_conv_ragged(x, [0, 3], [window], weight)
    assert np.array_equal(bits(y), bits(y_ref)) and np.array_equal(bits(w), bits(w_ref))
    pool = rng.standard_normal((4, 4, 1, 16)).astype(np.float32)
    qa = rng.standard_normal((2, 1, 2, 16)).astype(np.float32)
    ref = numba_attention.attend_paged(qa, pool, pool, np.array([2, 0, 3]), 7, 0.25)
    assert np.array_equal(bits(numba_attention.attend_paged_ragged(qa, pool, pool, [[2, 0, 3]], [7], [0, 2], 0.25)),
                          bits(ref))


def test_the_cheap_checks_still_refuse():
    """The checks on Python ints refuse what the NumPy ones did, with the same messages."""
    rng = np.random.default_rng(4)
    q, k, v, log_decay, beta, state = inputs(rng, 4, 2, 4, 4)
    states = [state, state.copy()]
    for bad in ([0, 3, 2, 4], [1, 2, 4], [0, 2, 5], [[0, 2, 4]]):  # decreasing, not from 0, not to R, not 1-D
        B = len(bad) - 1 if len(bad) > 1 else 2
        with pytest.raises(ValueError, match=f"do not cut 4 rows into {B} sequences"):
            numba_gdn.gdn_scan_ragged(q, k, v, log_decay, beta, bad, [state] * B)
        with pytest.raises(ValueError, match=f"do not cut 4 rows into {B} sequences"):
            numba_gdn.causal_conv_ragged(np.zeros((4, 8), np.float32), bad, [np.zeros((8, 3), np.float32)] * B,
                                         np.zeros((8, 4), np.float32))
    with pytest.raises(ValueError, match="states_out must be"):
        numba_gdn.gdn_scan_ragged(q, k, v, log_decay, beta, [0, 2, 4], states,
                                  [None, np.zeros((2, 2, 4, 4), np.float64)])
    with pytest.raises(ValueError, match="out must be"):  # an out error is named before a states_out one, as before
        numba_gdn.gdn_scan_ragged(q, k, v, log_decay, beta, [0, 2, 4], states,
                                  [np.zeros((1, 2, 4, 4), np.float32), None], [None, state[:1]])
    pool = rng.standard_normal((3, 4, 1, 16)).astype(np.float32)
    qa = rng.standard_normal((2, 1, 2, 16)).astype(np.float32)
    with pytest.raises(ValueError, match="block id -1 out of range"):
        numba_attention.attend_paged_ragged(qa, pool, pool, [[0, -1], [2, 5]], [4, 2], [0, 1, 2], 0.25)
    with pytest.raises(ValueError, match="block id 5 out of range"):
        numba_attention.attend_paged_ragged(qa, pool, pool, [[0, 1], [2, 5]], [3, 4], [0, 1, 2], 0.25)
    with pytest.raises(ValueError, match="n_past 2.5"):
        numba_attention.attend_paged_ragged(qa, pool, pool, [[0], [1]], [0, 2.5], [0, 1, 2], 0.25)
    with pytest.raises(ValueError, match="do not cut 2 rows"):
        numba_attention.attend_paged_ragged(qa, pool, pool, [[0], [1]], [0, 0], [0, 2, 1], 0.25)
