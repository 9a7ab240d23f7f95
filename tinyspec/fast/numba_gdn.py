"""Numba delta-rule scan: tinyspec.gdn.gdn_scan's contract, bit for bit, without NumPy's temporaries.

    gdn_scan(q, k, v, log_decay, beta, state, states_out=None, out=None) -> (o [T, HV, V], state [HV, K, V])
    causal_conv(x, conv_state, weight, states_out=None) -> (y [T, C], conv_state [C, w-1])  (tinyspec.gdn.causal_conv)

The oracle (tinyspec/gdn.py delta_rule_step) builds four [HV, K, V] temporaries per token (decay,
S * k, the rank-1 update, S * q), 1 MB each at the Qwen3.5-0.8B shape (18 GDN layers, HV = 16,
K = V = 128): memory traffic that made the scan a large share of a decode step (docs/performance-log.md
old 19). Here each value head makes two passes over its K x V memory, one K row (V contiguous floats,
vectorized) at a time:

    pass 1, for each row kk:  S[kk] = decay * S[kk];  pred += S[kk] * k[kk]          (S^T k)
    delta = beta * (v - pred)
    pass 2, for each row kk:  S[kk] = S[kk] + k[kk] * delta;  o += S[kk] * q[kk]    (S^T q)

The same float32 operations in the same order as the oracle: a product rounded, then added (no fused
multiply-add, no fast-math), and the sums over K run kk = 0, 1, ... exactly as NumPy reduces a
non-contiguous axis. exp(log_decay) is taken by NumPy before the kernel. So the result is bitwise the
oracle's (tests/test_numba_gdn.py), and batch invariance needs no argument of its own: a T-token call
is T one-token steps. Value heads run in parallel (prange) above a size where threads pay.

The new state goes to `out` (the model passes the state itself: an update in place) or, without it, to
a fresh array, leaving the caller's state untouched; states_out[t] receives a copy of the state after
token t, by streaming stores when it is 64-byte aligned (SnapshotRing's buffers are): 72 MB of snapshots
in a 4-token pass at the 0.8B shape (18 layers x 4 tokens x 1 MB), which a normal store would first read
line by line before overwriting it (docs/performance-log.md old 24). Token 0's first pass reads the
caller's state and writes the new one, so no copy is made first. (A fresh 1 MB array per layer and call
paid its page faults on every call: LESSONS 14.)
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from . import kernel_cache, simd


@njit(cache=True, inline="always", error_model="numpy", boundscheck=False)
def _head_step(S0, S, q, k, v, decay, beta, pred, o):  # S0 -> S [K, V] (S0 may be S); q, k [K]; v, pred, o [V]
    K, V = S.shape
    pred[:] = np.float32(0)
    wide = V % 16 == 0  # 16 lanes at a time (simd.py); the same operations per element either way
    for kk in range(K):
        kv = k[kk]
        if wide:
            for j in range(0, V, 16):
                simd.decay_predict16(S0, kk * V + j, S, kk * V + j, pred, j, decay, kv)
        else:
            for j in range(V):
                s = decay * S0[kk, j]
                S[kk, j] = s
                pred[j] = pred[j] + s * kv
    for j in range(V):
        pred[j] = beta * (v[j] - pred[j])  # pred now holds delta
    o[:] = np.float32(0)
    for kk in range(K):
        kv, qv = k[kk], q[kk]
        if wide:
            for j in range(0, V, 16):
                simd.write_read16(S, kk * V + j, pred, j, kv, o, qv)
        else:
            for j in range(V):
                s = S[kk, j] + kv * pred[j]
                S[kk, j] = s
                o[j] = o[j] + s * qv


@njit(cache=True, parallel=True, error_model="numpy", boundscheck=False)
def _scan(q, k, v, decay, beta, S0, S, o, states_out, keep, stream):  # S0 [HV, K, V] read, S written (fresh)
    T, HV, K = q.shape
    V = v.shape[2]
    if V == 128:  # whole rows a step, pred and o in registers (simd.decay_predict_rows8 / write_read_rows8)
        mode = (2 if stream else 1) if keep else 0
        for h in prange(HV):
            pred = np.empty(V, np.float32)
            Sf = S[h].reshape(-1)
            for t in range(T):
                simd.decay_predict_rows8(S0[h].reshape(-1) if t == 0 else Sf, Sf, K, decay[t, h], k[t, h], pred)
                for j in range(V):
                    pred[j] = beta[t, h] * (v[t, h, j] - pred[j])  # pred now holds delta
                snap = states_out[t, h].reshape(-1) if keep else Sf
                simd.write_read_rows8(Sf, K, pred, k[t, h], q[t, h], o[t, h], snap, mode)
            if stream:
                simd.store_fence()
        return
    for h in prange(HV):
        pred = np.empty(V, np.float32)
        for t in range(T):  # token 0 reads the caller's state, the rest update S in place
            _head_step(S0[h] if t == 0 else S[h], S[h], q[t, h], k[t, h], v[t, h], decay[t, h], beta[t, h], pred,
                       o[t, h])
            if keep and stream:  # streaming stores: 64-byte aligned, whole vectors (checked by gdn_scan)
                dst, src = states_out[t, h].reshape(-1), S[h].reshape(-1)
                for j in range(0, src.size, 16):
                    simd.stream16(dst, j, src, j)
            elif keep:
                states_out[t, h] = S[h]
        if keep and stream:
            simd.store_fence()


def gdn_scan(q, k, v, log_decay, beta, state, states_out=None, out=None):
    # [T, HV, K] x2, [T, HV, V], [T, HV] x2, [HV, K, V] -> [T, HV, V], [HV, K, V]
    """The gated delta rule over T tokens, bitwise equal to tinyspec.gdn.gdn_scan (out: the same contract,
    `state` itself or an array that does not overlap it)."""
    f32 = lambda a: np.ascontiguousarray(a, dtype=np.float32)  # noqa: E731
    q, k, v, beta = f32(q), f32(k), f32(v), f32(beta)
    decay = f32(np.exp(f32(log_decay)))  # NumPy's exp, as the oracle's
    T, HV, K = q.shape
    if k.shape != q.shape or v.shape[:2] != (T, HV) or decay.shape != (T, HV) or beta.shape != (T, HV) \
            or state.shape != (HV, K, v.shape[2]):
        raise ValueError(f"numba_gdn: shapes q {q.shape}, k {k.shape}, v {v.shape}, log_decay {decay.shape}, "
                         f"beta {beta.shape}, state {state.shape} do not fit [T, HV, K] / [HV, K, V]")
    S0 = np.ascontiguousarray(state, dtype=np.float32)  # read by the first step, which writes S
    if out is None:
        S = np.empty_like(S0)  # a fresh array (it pays page faults: LESSONS 14; the model passes out=state)
    elif out.shape != S0.shape or out.dtype != np.float32 or not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError(f"numba_gdn: out must be a writeable C-contiguous float32 {S0.shape}, got {out.dtype} "
                         f"{out.shape}")
    else:
        S = out
    o = np.empty(v.shape, np.float32)
    keep = states_out is not None
    if keep and (states_out.shape[0] < T or states_out.shape[1:] != S.shape or states_out.dtype != np.float32):
        raise ValueError(f"numba_gdn: states_out must be float32 [>= {T}, {HV}, {K}, {v.shape[2]}], "
                         f"got {states_out.dtype} {states_out.shape}")
    snaps = states_out if keep else np.empty((1, 1, 1, 1), np.float32)  # untouched when not keep
    if T == 0:
        S[...] = S0
        return o, S
    # snapshots by streaming stores when every head's slot starts on a 64-byte line (SnapshotRing allocates so)
    stream = keep and snaps.flags.c_contiguous and snaps.ctypes.data % 64 == 0 and (K * v.shape[2]) % 16 == 0
    _scan(q, k, v, decay, beta, S0, S, o, snaps, keep, stream)
    return o, S


@njit(cache=True, error_model="numpy", boundscheck=False)
def _causal_conv(x, conv_state, weight, y, new_state, states_out, keep):  # [T, C], [C, w-1], [C, w] -> y, [C, w-1]
    T, C = x.shape
    w = weight.shape[1]
    if w == 4 and C % 16 == 0:  # Qwen3.5's width: 16 channels a vector, the same operations (simd.conv4_16)
        for c0 in range(0, C, 16):
            simd.conv4_16(x, conv_state, weight, y, new_state, states_out, c0, C, T, keep)
        return
    taps = np.empty((w, C), np.float32)  # weight transposed: tap k of every channel, contiguous
    old = np.empty((max(w - 1, 1), C), np.float32)  # the carried state, time-major
    for c in range(C):
        for k in range(w):
            taps[k, c] = weight[c, k]
        for j in range(w - 1):
            old[j, c] = conv_state[c, j]
    y[:] = np.float32(0)  # the oracle's y starts at +0.0 and adds tap k = 0, 1, ... (0 + -0.0 = +0.0)
    for t in range(T):
        for k in range(w):  # per output the same w products in the same order; channels innermost (vectorized)
            j = t + k  # window row: j < w - 1 is the carried state, the rest x
            if j < w - 1:
                for c in range(C):
                    y[t, c] = y[t, c] + taps[k, c] * old[j, c]
            else:
                for c in range(C):
                    y[t, c] = y[t, c] + taps[k, c] * x[j - (w - 1), c]
    for c in range(C):  # the last w - 1 window rows
        for j in range(w - 1):
            jj = T + j
            new_state[c, j] = conv_state[c, jj] if jj < w - 1 else x[jj - (w - 1), c]
    if keep:  # the state after token t: window rows t + 1 .. t + w - 1
        for t in range(T):
            for c in range(C):
                for j in range(w - 1):
                    jj = t + 1 + j
                    states_out[t, c, j] = conv_state[c, jj] if jj < w - 1 else x[jj - (w - 1), c]


def causal_conv(x, conv_state, weight, states_out=None):
    """tinyspec.gdn.causal_conv bit for bit (each output sums its w rounded products in tap order, from
    +0.0), without NumPy's per-tap temporaries. At the 0.8B shape (C = 6144, w = 4) those temporaries were
    most of a NumPy call, and scalar Numba spent its time on strided weight and state reads, so the channels
    go 16 at a time as vectors (simd.conv4_16; docs/performance-log.md old 24 times the three)."""
    f32 = lambda a: np.ascontiguousarray(a, dtype=np.float32)  # noqa: E731
    x, conv_state, weight = f32(x), f32(conv_state), f32(weight)
    T, C = x.shape
    if conv_state.shape != (C, weight.shape[1] - 1) or weight.shape[0] != C:
        raise ValueError(f"numba_gdn: causal_conv shapes x {x.shape}, conv_state {conv_state.shape}, "
                         f"weight {weight.shape} do not fit [T, C] / [C, w-1] / [C, w]")
    keep = states_out is not None
    if keep and (states_out.ndim != 3 or states_out.shape[0] < T or states_out.shape[1:] != conv_state.shape
                 or states_out.dtype != np.float32 or not states_out.flags.c_contiguous):
        raise ValueError(f"numba_gdn: causal_conv states_out must be C-contiguous float32 [>= {T}, "
                         f"{conv_state.shape[0]}, {conv_state.shape[1]}], got {states_out.dtype} {states_out.shape}")
    y = np.empty((T, C), np.float32)
    new_state = np.empty_like(conv_state)
    _causal_conv(x, conv_state, weight, y, new_state, states_out if keep else np.empty((1, 1, 1), np.float32), keep)
    return y, new_state


kernel_cache.sync(_scan)  # cached kernels compiled from older sources (simd.py) are dropped
