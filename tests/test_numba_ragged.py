"""The ragged Numba kernels (one call for every sequence of a batch) against the oracle's per-sequence loops.

tinyspec.gdn.gdn_scan_ragged / causal_conv_ragged and tinyspec.attention.attend_paged_ragged are loops of the
one-sequence functions; fast/numba_gdn.py and fast/numba_attention.py run all sequences in one kernel call.
Each sequence's rows must be what it computes alone: bitwise the oracle for the conv and the scan (outputs,
new states, every per-token snapshot), and for attention bitwise the one-sequence Numba call (the oracle's
BLAS sums in another order: float32 rounding of it). Batches of 1..5 sequences of 1..9 rows, at Qwen3.5's
head shape and at odd ones, with and without per-token states; then a whole cpu model's verify pass with
SnapshotRing and ReplayRing rings against the same pass made one sequence at a time.
"""

import dataclasses

import numpy as np
import pytest

pytest.importorskip("numba")

from tinyspec import attention, gdn  # noqa: E402
from tinyspec.fast import numba_attention, numba_gdn  # noqa: E402
from tinyspec.state import GDNState, zeros_aligned  # noqa: E402


def bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


from test_numba_gdn import inputs  # noqa: E402


def ragged_bounds(rng, B, most=9):
    return np.cumsum([0] + list(rng.integers(1, most + 1, B)))  # [B+1], 1..most rows each


def scan_inputs(rng, R, HV, K, V):  # q, k, v, log_decay, beta of R rows (test_numba_gdn's, without its state)
    return inputs(rng, R, HV, K, V)[:5]


CASES = [(seed, B) for seed in range(3) for B in range(1, 6)]


@pytest.mark.parametrize("HV,K,V", [(16, 128, 128), (3, 16, 33), (2, 5, 7)], ids=["0.8b-heads", "odd", "tiny"])
@pytest.mark.parametrize("seed,B", CASES)
def test_scan_ragged_bitwise_equal_to_the_oracle_loop(seed, B, HV, K, V):
    """Outputs, new states and snapshots bit for bit; a sequence keeps snapshots (plain or 64-byte aligned,
    streamed) or none, and updates its state in place (out = state), into another buffer (a ReplayRing's
    spare) or into a fresh array."""
    rng = np.random.default_rng(100 * seed + B + HV)
    bounds = ragged_bounds(rng, B)
    q, k, v, log_decay, beta = scan_inputs(rng, bounds[-1], HV, K, V)
    states = [rng.standard_normal((HV, K, V)).astype(np.float32) for _ in range(B)]
    kinds = rng.integers(0, 3, B)  # 0: no snapshots, 1: plain buffer, 2: aligned (streaming stores)
    outs = rng.integers(0, 3, B)  # 0: fresh array, 1: in place, 2: a separate buffer

    def snaps(b):
        T = bounds[b + 1] - bounds[b]
        return [None, np.zeros((T + 1, HV, K, V), np.float32), zeros_aligned((T + 1, HV, K, V))][kinds[b]]

    def run(scan):
        live = [s.copy() for s in states]
        so = [snaps(b) for b in range(B)]
        out = [[None, live[b], np.zeros_like(live[b])][outs[b]] for b in range(B)]
        o, new = scan(q, k, v, log_decay, beta, bounds, live, so, out)
        return o, new, so, live

    o_ref, new_ref, so_ref, live_ref = run(gdn.gdn_scan_ragged)
    o, new, so, live = run(numba_gdn.gdn_scan_ragged)
    assert np.array_equal(bits(o), bits(o_ref))
    for b in range(B):
        assert np.array_equal(bits(new[b]), bits(new_ref[b])), b
        assert np.array_equal(bits(live[b]), bits(live_ref[b])), b  # in place, or left alone
        if kinds[b]:
            assert np.array_equal(bits(so[b]), bits(so_ref[b])), b
        if outs[b] == 1:
            assert new[b] is live[b]


@pytest.mark.parametrize("seed,B", CASES)
def test_scan_ragged_rows_are_each_sequence_alone(seed, B):
    """Sequence b's rows of one ragged call == its own one-sequence call (numba_gdn.gdn_scan), bit for bit."""
    rng = np.random.default_rng(seed * 7 + B)
    bounds = ragged_bounds(rng, B)
    q, k, v, log_decay, beta = scan_inputs(rng, bounds[-1], 4, 32, 32)
    states = [rng.standard_normal((4, 32, 32)).astype(np.float32) for _ in range(B)]
    o, new = numba_gdn.gdn_scan_ragged(q, k, v, log_decay, beta, bounds, states)
    for b, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
        o_b, s_b = numba_gdn.gdn_scan(q[lo:hi], k[lo:hi], v[lo:hi], log_decay[lo:hi], beta[lo:hi], states[b])
        assert np.array_equal(bits(o[lo:hi]), bits(o_b)) and np.array_equal(bits(new[b]), bits(s_b)), b


@pytest.mark.parametrize("C,w", [(6144, 4), (7, 3), (32, 4), (3, 1)])
@pytest.mark.parametrize("seed,B", CASES)
def test_causal_conv_ragged_bitwise_equal_to_the_oracle_loop(seed, B, C, w):
    """Rows, new windows and per-token windows bit for bit; a sequence keeps per-token windows or none, and
    writes its new window in place (out = its conv_state, the layer's update), into another buffer or into a
    fresh array."""
    rng = np.random.default_rng(seed * 31 + B + C)
    bounds = ragged_bounds(rng, B)
    x = rng.standard_normal((bounds[-1], C)).astype(np.float32)
    weight = rng.standard_normal((C, w)).astype(np.float32)
    states = [rng.standard_normal((C, w - 1)).astype(np.float32) for _ in range(B)]
    keep = rng.integers(0, 2, B).astype(bool)
    outs = rng.integers(0, 3, B)  # 0: fresh array, 1: in place, 2: a separate buffer

    def run(conv):
        so = [np.zeros((hi - lo + 1, C, w - 1), np.float32) if kp else None
              for lo, hi, kp in zip(bounds[:-1], bounds[1:], keep)]
        live = [s.copy() for s in states]
        out = [[None, live[b], np.zeros_like(live[b])][outs[b]] for b in range(B)]
        y, new = conv(x, bounds, live, weight, so, out)
        return y, new, so, live, out

    y_ref, new_ref, so_ref, live_ref, _ = run(gdn.causal_conv_ragged)
    y, new, so, live, out = run(numba_gdn.causal_conv_ragged)
    assert np.array_equal(bits(y), bits(y_ref))
    for b in range(B):
        assert np.array_equal(bits(new[b]), bits(new_ref[b])), b
        assert np.array_equal(bits(live[b]), bits(live_ref[b])), b  # in place, or left alone
        assert new[b] is out[b] if outs[b] else not any(new[b] is a for a in live), b
        if keep[b]:
            assert np.array_equal(bits(so[b]), bits(so_ref[b])), b


def test_a_batch_of_any_size_reuses_one_kernel():
    """A Numba tuple's type carries its length: per-sequence states passed as a tuple of B compiled one kernel
    per B, seconds each, mid-run. The kernels take them by address instead (numba_gdn._f32_at), so after one
    batch, batches of 1 to 9 sequences add no signature (asserted as sets: other tests may have compiled more
    in this process)."""
    rng = np.random.default_rng(7)
    HV, K, V, C, w = 2, 5, 7, 32, 4

    def run(B):
        bounds = ragged_bounds(rng, B, most=3)
        q, k, v, log_decay, beta = scan_inputs(rng, bounds[-1], HV, K, V)
        numba_gdn.gdn_scan_ragged(q, k, v, log_decay, beta, bounds, [np.zeros((HV, K, V), np.float32)] * B,
                                  [zeros_aligned((4, HV, K, V))] * B)
        x = rng.standard_normal((bounds[-1], C)).astype(np.float32)
        numba_gdn.causal_conv_ragged(x, bounds, [np.zeros((C, w - 1), np.float32)] * B,
                                     rng.standard_normal((C, w)).astype(np.float32), [None] * B)
        return set(numba_gdn._scan_ragged.signatures), set(numba_gdn._causal_conv_ragged.signatures)

    one = run(1)
    assert all(run(B) == one for B in range(2, 10))


def test_ragged_kernels_reject_bad_bounds_and_shapes():
    rng = np.random.default_rng(0)
    q, k, v, log_decay, beta = scan_inputs(rng, 5, 2, 4, 4)
    states = [np.zeros((2, 4, 4), np.float32)] * 2
    with pytest.raises(ValueError, match="bounds"):
        numba_gdn.gdn_scan_ragged(q, k, v, log_decay, beta, np.array([0, 2, 4]), states)
    with pytest.raises(ValueError, match="states_out"):
        numba_gdn.gdn_scan_ragged(q, k, v, log_decay, beta, np.array([0, 2, 5]), states,
                                  [None, np.zeros((2, 2, 4, 4), np.float32)])
    x, weight = np.zeros((5, 8), np.float32), np.zeros((8, 4), np.float32)
    with pytest.raises(ValueError, match="bounds"):
        numba_gdn.causal_conv_ragged(x, np.array([0, 6]), [np.zeros((8, 3), np.float32)], weight)
    with pytest.raises(ValueError, match="causal_conv shapes"):
        numba_gdn.causal_conv_ragged(x, np.array([0, 5]), [np.zeros((8, 2), np.float32)], weight)
    windows = [np.zeros((8, 3), np.float32)] * 2
    for bad in (np.zeros((8, 2), np.float32), np.zeros((8, 3)), np.zeros((3, 8), np.float32).T):  # shape, dtype, order
        with pytest.raises(ValueError, match="causal_conv out must be"):
            numba_gdn.causal_conv_ragged(x, np.array([0, 2, 5]), windows, weight, None, [None, bad])


def paged_batch(rng, B, H_kv, G, d, bs):
    """B sequences in one pool: each its own shuffled blocks, 0..40 positions before its 1..9 new rows."""
    bounds = ragged_bounds(rng, B)
    n_pasts = [int(n) for n in rng.integers(0, 41, B)]
    n_blocks = B * -(-50 // bs) + 3  # room for every sequence, and spare blocks nobody owns
    free = list(rng.permutation(n_blocks))
    tables = []
    for b in range(B):
        n = n_pasts[b] + bounds[b + 1] - bounds[b]
        tables.append(np.array([free.pop() for _ in range(-(-n // bs))], np.int64))
    k_pool = rng.standard_normal((n_blocks, bs, H_kv, d)).astype(np.float32)
    v_pool = rng.standard_normal((n_blocks, bs, H_kv, d)).astype(np.float32)
    q = rng.standard_normal((bounds[-1], H_kv, G, d)).astype(np.float32)
    return q, k_pool, v_pool, tables, n_pasts, bounds, np.float32(d ** -0.5)


@pytest.mark.parametrize("H_kv,G,d,bs", [(2, 4, 256, 16), (3, 1, 33, 5), (1, 2, 16, 1)])
@pytest.mark.parametrize("seed,B", CASES)
def test_attend_paged_ragged_is_each_sequence_alone(seed, B, H_kv, G, d, bs):
    """Bitwise the one-sequence Numba calls (each row sees its own sequence's keys only); the oracle's loop to
    float32 rounding (its BLAS sums in another order)."""
    rng = np.random.default_rng(seed * 13 + B + d)
    q, k_pool, v_pool, tables, n_pasts, bounds, scale = paged_batch(rng, B, H_kv, G, d, bs)
    got = numba_attention.attend_paged_ragged(q, k_pool, v_pool, tables, n_pasts, bounds, scale)
    for b, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
        alone = numba_attention.attend_paged(q[lo:hi], k_pool, v_pool, tables[b], n_pasts[b], scale)
        assert np.array_equal(bits(got[lo:hi]), bits(alone)), b
    want = attention.attend_paged_ragged(q, k_pool, v_pool, tables, n_pasts, bounds, scale)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)


def test_attend_paged_ragged_rejects_bad_tables():
    rng = np.random.default_rng(1)
    q, k_pool, v_pool, tables, n_pasts, bounds, scale = paged_batch(rng, 3, 1, 2, 16, 4)
    short = [tables[0], tables[1][:0] if n_pasts[1] + bounds[2] - bounds[1] else tables[1], tables[2]]
    with pytest.raises(ValueError, match="table too short"):
        numba_attention.attend_paged_ragged(q, k_pool, v_pool, short, n_pasts, bounds, scale)
    bad = [tables[0], tables[1], np.full_like(tables[2], k_pool.shape[0])]
    with pytest.raises(ValueError, match="out of range"):
        numba_attention.attend_paged_ragged(q, k_pool, v_pool, bad, n_pasts, bounds, scale)
    with pytest.raises(ValueError, match="bounds"):
        numba_attention.attend_paged_ragged(q, k_pool, v_pool, tables, n_pasts[:2], bounds, scale)


def attend_each(q, k_pool, v_pool, tables, n_pasts, bounds, scale):
    """attention.attend_paged_ragged's loop over the one-sequence Numba kernel."""
    return np.concatenate([numba_attention.attend_paged(q[lo:hi], k_pool, v_pool, table, n_past, scale)
                           for lo, hi, table, n_past in zip(bounds[:-1], bounds[1:], tables, n_pasts)])


@pytest.mark.parametrize("rollback", ["snapshot", "replay"])
def test_cpu_model_ragged_pass_equals_per_sequence_loop(rollback):
    """A whole verify pass of B = 4 sequences (1..5 rows, KV in one pool, a ring each) on the cpu backend:
    the ragged kernels against the oracle's loops over the one-sequence Numba kernels give the same logits,
    states and rings bit for bit, and a rollback of each sequence restores the same bits. With a SnapshotRing
    every GDN window is written in place (the same array after the pass); a ReplayRing's pass makes new ones."""
    from functools import partial

    from tinyspec.backends import load_model
    from tinyspec.demo import TARGET
    from tinyspec.paged import BlockPool

    fused = load_model(TARGET, "cpu")
    fused = fused.with_placement(dataclasses.replace(fused.placement, rollback=rollback))
    looped = fused.with_kernels(dataclasses.replace(
        fused.kernels, gdn_scan_ragged=partial(gdn.gdn_scan_ragged, scan=numba_gdn.gdn_scan),
        causal_conv_ragged=partial(gdn.causal_conv_ragged, conv=numba_gdn.causal_conv),
        attend_paged_ragged=attend_each))
    rng = np.random.default_rng(5)
    prompts = [list(rng.integers(0, fused.cfg.n_vocab, n)) for n in (3, 7, 1, 5)]
    passes = [list(rng.integers(0, fused.cfg.n_vocab, n)) for n in (2, 5, 1, 4)]

    def run(model):
        pool = BlockPool(model.cfg, 32, block_size=4)
        states = [model.new_state(pool) for _ in prompts]
        model.forward_batch(prompts, states)
        rings = [model.new_ring(5) for _ in prompts]
        windows = lambda s: [layer.conv for layer in s.layers if isinstance(layer, GDNState)]  # noqa: E731
        before = [windows(s) for s in states]
        logits, hidden, _ = model.forward_batch(passes, states, rings)
        same = [all(a is b for a, b in zip(w, windows(s))) for w, s in zip(before, states)]
        assert all(same) if rollback == "snapshot" else not any(same)  # in place; a ReplayRing keeps the old one
        after = [numbers(s) for s in states]
        for b, (s, r) in enumerate(zip(states, rings)):
            if len(passes[b]) > 1:
                r.restore(s, len(passes[b]) - 2)  # keep all but the last token
        return logits, after + [numbers(s) for s in states]

    logits, kept = run(fused)
    logits_ref, kept_ref = run(looped)
    assert np.array_equal(bits(logits), bits(logits_ref))
    assert len(kept) == len(kept_ref)
    for a, b in zip(kept, kept_ref):
        assert len(a) == len(b) and all(np.array_equal(bits(x), bits(y)) for x, y in zip(a, b))


def numbers(state):
    """Copies of every number a sequence's state holds: each GDN layer's window and memory, each attention
    layer's keys and values (gathered from the pool)."""
    out = []
    for layer in state.layers:
        out += [a.copy() for a in ((layer.conv, layer.ssm) if isinstance(layer, GDNState) else layer.contents())]
    return out
