"""The Numba delta-rule scan (tinyspec/fast/numba_gdn.py) against the oracle tinyspec.gdn.gdn_scan: bitwise.

Same float32 operations in the same order, so outputs, the final state and every snapshot must be
equal bit for bit - at the Qwen3.5-0.8B head shape, at odd shapes, for T = 1..5, with the snapshot
ring filled; the input state is not modified unless it is passed as `out` (the model's in-place update),
which gives the same bits, on the oracle as on Numba.
"""

import numpy as np
import pytest

pytest.importorskip("numba")

from tinyspec.fast import numba_gdn  # noqa: E402
from tinyspec.gdn import causal_conv, gdn_scan  # noqa: E402


def inputs(rng, T, HV, K, V):
    q = rng.standard_normal((T, HV, K)).astype(np.float32) / np.float32(np.sqrt(K))
    k = rng.standard_normal((T, HV, K)).astype(np.float32)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((T, HV, V)).astype(np.float32)
    log_decay = -np.abs(rng.standard_normal((T, HV))).astype(np.float32)
    beta = rng.uniform(0, 1, (T, HV)).astype(np.float32)
    state = rng.standard_normal((HV, K, V)).astype(np.float32)
    return q, k, v, log_decay, beta, state


@pytest.mark.parametrize("aligned", [False, True], ids=["plain-snapshots", "streamed-snapshots"])
@pytest.mark.parametrize("T,HV,K,V", [(1, 16, 128, 128), (4, 16, 128, 128), (3, 2, 5, 7), (5, 3, 16, 33)])
def test_scan_bitwise_equal_to_oracle(T, HV, K, V, aligned):
    """Bit for bit the oracle: outputs, final state and every snapshot, written by plain stores or (64-byte
    aligned buffers, as SnapshotRing allocates them) by streaming stores."""
    from tinyspec.state import zeros_aligned

    rng = np.random.default_rng(T * 1000 + K)
    q, k, v, log_decay, beta, state = inputs(rng, T, HV, K, V)
    before = state.copy()
    snaps_ref = np.zeros((T + 1, HV, K, V), np.float32)
    snaps = zeros_aligned((T + 1, HV, K, V)) if aligned else np.zeros((T + 1, HV, K, V), np.float32)
    assert not aligned or snaps.ctypes.data % 64 == 0
    o_ref, s_ref = gdn_scan(q, k, v, log_decay, beta, state, states_out=snaps_ref)
    o, s = numba_gdn.gdn_scan(q, k, v, log_decay, beta, state, states_out=snaps)
    assert np.array_equal(o.view(np.uint32), o_ref.view(np.uint32))
    assert np.array_equal(s.view(np.uint32), s_ref.view(np.uint32))
    assert np.array_equal(snaps.view(np.uint32), snaps_ref.view(np.uint32))
    assert np.array_equal(state, before)  # not modified in place
    o2, s2 = numba_gdn.gdn_scan(q, k, v, log_decay, beta, state)  # without snapshots: the same bits
    assert np.array_equal(o2.view(np.uint32), o.view(np.uint32)) and np.array_equal(s2, s)


@pytest.mark.parametrize("T,HV,K,V", [(1, 16, 128, 128), (3, 2, 5, 7)])
def test_update_in_place_with_out(T, HV, K, V):
    rng = np.random.default_rng(11)
    q, k, v, log_decay, beta, state = inputs(rng, T, HV, K, V)
    o_ref, s_ref = gdn_scan(q, k, v, log_decay, beta, state)
    for scan in (gdn_scan, numba_gdn.gdn_scan):
        live = state.copy()
        o, s = scan(q, k, v, log_decay, beta, live, out=live)
        assert s is live and np.array_equal(live.view(np.uint32), s_ref.view(np.uint32))
        assert np.array_equal(o.view(np.uint32), o_ref.view(np.uint32))
        other = np.empty_like(state)  # a separate out leaves the input alone
        _, s = scan(q, k, v, log_decay, beta, state, out=other)
        assert s is other and np.array_equal(other, s_ref)
    with pytest.raises(ValueError, match="out must be"):
        numba_gdn.gdn_scan(q, k, v, log_decay, beta, state, out=np.empty((HV, K, V), np.float64))


def test_k_steps_equal_one_step_at_a_time():
    rng = np.random.default_rng(7)
    q, k, v, log_decay, beta, state = inputs(rng, 4, 4, 32, 32)
    o_all, s_all = numba_gdn.gdn_scan(q, k, v, log_decay, beta, state)
    s = state
    for t in range(4):
        o_t, s = numba_gdn.gdn_scan(q[t:t + 1], k[t:t + 1], v[t:t + 1], log_decay[t:t + 1], beta[t:t + 1], s)
        assert np.array_equal(o_t[0].view(np.uint32), o_all[t].view(np.uint32))
    assert np.array_equal(s.view(np.uint32), s_all.view(np.uint32))


def test_bad_shapes_are_named():
    rng = np.random.default_rng(0)
    q, k, v, log_decay, beta, state = inputs(rng, 2, 2, 4, 4)
    with pytest.raises(ValueError, match="numba_gdn: shapes"):
        numba_gdn.gdn_scan(q, k, v, log_decay, beta, state[:, :3])
    with pytest.raises(ValueError, match="states_out"):
        numba_gdn.gdn_scan(q, k, v, log_decay, beta, state, states_out=np.zeros((1, 2, 4, 4), np.float32))


@pytest.mark.parametrize("T,C,w", [(1, 6144, 4), (4, 6144, 4), (5, 7, 3), (2, 3, 5), (1, 4, 1)])
def test_causal_conv_bitwise_equal_to_oracle(T, C, w):
    rng = np.random.default_rng(T * 100 + w)
    x = rng.standard_normal((T, C)).astype(np.float32)
    state = rng.standard_normal((C, w - 1)).astype(np.float32)
    weight = rng.standard_normal((C, w)).astype(np.float32)
    x[:, 0], weight[0, :] = 0.0, -1.0  # every product of channel 0 is -0.0; the oracle sums from +0.0
    state[0, :] = 0.0
    before = state.copy()
    snaps_ref, snaps = np.zeros((T + 1, C, w - 1), np.float32), np.zeros((T + 1, C, w - 1), np.float32)
    y_ref, s_ref = causal_conv(x, state, weight, states_out=snaps_ref)
    y, s = numba_gdn.causal_conv(x, state, weight, states_out=snaps)
    assert np.array_equal(y.view(np.uint32), y_ref.view(np.uint32))
    assert np.array_equal(s.view(np.uint32), s_ref.view(np.uint32))
    assert np.array_equal(snaps.view(np.uint32), snaps_ref.view(np.uint32))
    assert np.array_equal(state, before)
    y2, s2 = numba_gdn.causal_conv(x, state, weight)  # without snapshots: the same bits
    assert np.array_equal(y2.view(np.uint32), y.view(np.uint32)) and np.array_equal(s2.view(np.uint32), s.view(np.uint32))
    with pytest.raises(ValueError, match="states_out"):
        numba_gdn.causal_conv(x, state, weight, states_out=np.zeros((T, C + 1, w - 1), np.float32))
    with pytest.raises(ValueError, match="causal_conv shapes"):
        numba_gdn.causal_conv(x, state[:, :0] if w > 1 else np.zeros((C, 1), np.float32), weight)


@pytest.mark.parametrize("T,C,w", [(1, 6144, 4), (2, 32, 4), (5, 32, 4), (5, 7, 3)])
def test_causal_conv_out_in_place(T, C, w):
    """out as the oracle's: the new window written into it and returned as it, bitwise the fresh one, also when
    out is conv_state itself (the kernel reads the old window before the copy); a wrong out is refused."""
    rng = np.random.default_rng(T + C + w)
    x = rng.standard_normal((T, C)).astype(np.float32)
    state = rng.standard_normal((C, w - 1)).astype(np.float32)
    weight = rng.standard_normal((C, w)).astype(np.float32)
    y_ref, s_ref = causal_conv(x, state, weight)
    for conv in (causal_conv, numba_gdn.causal_conv):
        live = state.copy()
        y, s = conv(x, live, weight, out=live)
        assert s is live and np.array_equal(live.view(np.uint32), s_ref.view(np.uint32))
        assert np.array_equal(y.view(np.uint32), y_ref.view(np.uint32))
        other = np.empty_like(state)  # a separate out leaves the input alone
        _, s = conv(x, state, weight, out=other)
        assert s is other and np.array_equal(other.view(np.uint32), s_ref.view(np.uint32))
    with pytest.raises(ValueError, match="causal_conv out must be"):
        numba_gdn.causal_conv(x, state, weight, out=np.empty((C, w), np.float32))
