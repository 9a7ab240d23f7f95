"""Numba causal attention over the KV cache: tinyspec.attention.attend's contract, one loop nest, no temporaries.

    attend(q [T, H_kv, G, d], keys [>= n_past + T, H_kv, d], values [same], n_past, scale) -> o [T, H_kv, G, d]

The oracle (tinyspec/attention.py attend) makes, per query row, two transposed copies of the visible
keys and values and five NumPy calls (two matmuls, a softmax of three reductions): ~10 small calls per
row and layer, whose overhead, not the arithmetic, was nearly all of attention's share of a verify pass at
the 0.8B shape (6 attention layers; LESSONS 7, docs/performance-log.md old 28). Here each (row t, kv head h)
is one pass over the n = n_past + t + 1 keys it may see, reading the cache in place, each key row once for
the G query heads that share it; (t, h) pairs run in parallel. Per query head:

    s_j = scale * (q . k_j)                 d = 256 (every Qwen3.5 size): the 256 products summed by a fixed
                                            tree in registers (simd.dot256); other d: 16 at a time (dot16)
    p_j = exp(s_j - max s) / sum_j exp(s_j - max s)      sums in key order j = 0, 1, ..
    o   = sum_j p_j v_j                     in key order, one fma per element and key (simd.axpy256 / axpy16)

Batch invariance by construction: row t's numbers depend only on q[t] and the first n keys, with the
same operations in the same order whatever T is, so a verify pass's row equals the one-token pass at
that position bit for bit (tests/test_numba_attention.py). Against the oracle (BLAS matmuls, whose
summation order is the library's) it agrees to float32 rounding, not bitwise, like the linear kernels.
No fast-math: LLVM may not reorder the sums, so the vector work is written as simd.py intrinsics.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from . import kernel_cache, simd


@njit(cache=True, parallel=True, error_model="numpy", boundscheck=False)
def _attend(q, keys, values, n_past, scale, o):  # see the module docstring; o is written
    T, H_kv, G, d = q.shape
    d16 = d - d % 16
    qf, kf, vf, of = q.reshape(-1), keys.reshape(-1), values.reshape(-1), o.reshape(-1)
    for item in prange(T * H_kv):  # (row, kv head) pairs; each one's arithmetic is the same on any thread
        t, h = item // H_kv, item % H_kv
        n = n_past + t + 1  # keys visible to this row (causal)
        p = np.empty((G, n), np.float32)  # scores, then exponentials, of the G query heads sharing head h
        q0 = (t * H_kv + h) * G * d  # q[t, h, 0] and o[t, h, 0] in qf, of
        for j in range(n):
            ko = (j * H_kv + h) * d  # keys[j, h] and values[j, h] in kf, vf
            for g in range(G):  # the key row is read once for the G query heads (no store in between)
                if d == 256:  # Qwen3.5's head size: the whole row in registers
                    s = simd.dot256(qf, q0 + g * d, kf, ko)
                else:  # 16 elements at a time, the chunks summed in order, then the tail
                    s = np.float32(0)
                    for c in range(0, d16, 16):
                        s += simd.dot16(qf, q0 + g * d + c, kf, ko + c)
                    for c in range(d16, d):
                        s += qf[q0 + g * d + c] * kf[ko + c]
                p[g, j] = s * scale
        for g in range(G):
            top = np.float32(-np.inf)
            for j in range(n):
                top = max(top, p[g, j])
            total = np.float32(0)
            for j in range(n):
                e = np.exp(p[g, j] - top)
                p[g, j] = e
                total += e
            qo = q0 + g * d
            of[qo:qo + d] = np.float32(0)
            for j in range(n):
                w = np.float32(p[g, j] / total)
                vo = (j * H_kv + h) * d
                if d == 256:
                    simd.axpy256(of, qo, w, vf, vo)
                else:
                    for c in range(0, d16, 16):
                        simd.axpy16(of, qo + c, w, vf, vo + c)
                    for c in range(d16, d):
                        of[qo + c] = np.float32(w * vf[vo + c] + of[qo + c])


def attend(q, keys, values, n_past, scale):
    """tinyspec.attention.attend on the cpu backend (float32 arrays; keys/values: the cache's, unsliced)."""
    q = np.ascontiguousarray(q, dtype=np.float32)
    T, H_kv, G, d = q.shape
    if keys.shape[0] < n_past + T or keys.shape[1:] != (H_kv, d) or values.shape != keys.shape:
        raise ValueError(f"keys/values {keys.shape}/{values.shape} do not hold {n_past + T} positions of {(H_kv, d)}")
    o = np.empty_like(q)
    _attend(q, np.ascontiguousarray(keys, dtype=np.float32), np.ascontiguousarray(values, dtype=np.float32),
            n_past, np.float32(scale), o)
    return o


kernel_cache.sync(_attend)  # cached kernels compiled from older sources (simd.py) are dropped
