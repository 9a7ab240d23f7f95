"""Numba delta-rule scan: tinyspec.gdn.gdn_scan's contract, bit for bit, without NumPy's temporaries.

    gdn_scan(q, k, v, log_decay, beta, state, states_out=None) -> (o [T, HV, V], state [HV, K, V])

The oracle (tinyspec/gdn.py delta_rule_step) builds four [HV, K, V] temporaries per token (decay,
S * k, the rank-1 update, S * q) - about 25 ms of a Qwen3.5-0.8B decode step (18 GDN layers, HV = 16,
K = V = 128) on this 2-core machine. Here each value head makes two passes over its K x V memory,
one K row (V contiguous floats, vectorized) at a time:

    pass 1, for each row kk:  S[kk] = decay * S[kk];  pred += S[kk] * k[kk]          (S^T k)
    delta = beta * (v - pred)
    pass 2, for each row kk:  S[kk] = S[kk] + k[kk] * delta;  o += S[kk] * q[kk]    (S^T q)

The same float32 operations in the same order as the oracle: a product rounded, then added (no fused
multiply-add, no fast-math), and the sums over K run kk = 0, 1, ... exactly as NumPy reduces a
non-contiguous axis. exp(log_decay) is taken by NumPy before the kernel. So the result is bitwise the
oracle's (tests/test_numba_gdn.py), and batch invariance needs no argument of its own: a T-token call
is T one-token steps. Value heads run in parallel (prange) above a size where threads pay.

The state is never modified in place: the new state is a fresh array (a caller may hold the old one,
e.g. a snapshot), and states_out[t] receives a copy of the state after token t.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(cache=True, inline="always", error_model="numpy", boundscheck=False)
def _head_step(S, q, k, v, decay, beta, pred, o):  # S [K, V] in place; q, k [K]; v, pred, o [V]
    K, V = S.shape
    pred[:] = np.float32(0)
    for kk in range(K):
        kv = k[kk]
        for j in range(V):
            s = decay * S[kk, j]
            S[kk, j] = s
            pred[j] = pred[j] + s * kv
    for j in range(V):
        pred[j] = beta * (v[j] - pred[j])  # pred now holds delta
    o[:] = np.float32(0)
    for kk in range(K):
        kv, qv = k[kk], q[kk]
        for j in range(V):
            s = S[kk, j] + kv * pred[j]
            S[kk, j] = s
            o[j] = o[j] + s * qv


@njit(cache=True, parallel=True, error_model="numpy", boundscheck=False)
def _scan(q, k, v, decay, beta, S, o, states_out, keep):  # S [HV, K, V] updated in place (a fresh copy)
    T, HV, _ = q.shape
    V = v.shape[2]
    for h in prange(HV):
        pred = np.empty(V, np.float32)
        for t in range(T):
            _head_step(S[h], q[t, h], k[t, h], v[t, h], decay[t, h], beta[t, h], pred, o[t, h])
            if keep:
                states_out[t, h] = S[h]


def gdn_scan(q, k, v, log_decay, beta, state, states_out=None):
    # [T, HV, K] x2, [T, HV, V], [T, HV] x2, [HV, K, V] -> [T, HV, V], [HV, K, V]
    """The gated delta rule over T tokens, bitwise equal to tinyspec.gdn.gdn_scan."""
    f32 = lambda a: np.ascontiguousarray(a, dtype=np.float32)  # noqa: E731
    q, k, v, beta = f32(q), f32(k), f32(v), f32(beta)
    decay = f32(np.exp(f32(log_decay)))  # NumPy's exp, as the oracle's
    T, HV, K = q.shape
    if k.shape != q.shape or v.shape[:2] != (T, HV) or decay.shape != (T, HV) or beta.shape != (T, HV) \
            or state.shape != (HV, K, v.shape[2]):
        raise ValueError(f"numba_gdn: shapes q {q.shape}, k {k.shape}, v {v.shape}, log_decay {decay.shape}, "
                         f"beta {beta.shape}, state {state.shape} do not fit [T, HV, K] / [HV, K, V]")
    S = np.array(state, dtype=np.float32, order="C", copy=True)
    o = np.empty(v.shape, np.float32)
    keep = states_out is not None
    if keep and (states_out.shape[0] < T or states_out.shape[1:] != S.shape or states_out.dtype != np.float32):
        raise ValueError(f"numba_gdn: states_out must be float32 [>= {T}, {HV}, {K}, {v.shape[2]}], "
                         f"got {states_out.dtype} {states_out.shape}")
    out = states_out if keep else np.empty((1,) + S.shape, np.float32)
    _scan(q, k, v, decay, beta, S, o, out, keep)
    return o, S
