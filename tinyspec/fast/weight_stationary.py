"""Why a verify pass of k + 1 tokens costs about one token: a weight-stationary matmul, plainly written.

At decode sizes a matrix-vector product reads every weight from memory once and does two flops with it,
so its time is the bytes of W over the memory bandwidth. A pass of T tokens (the pending token and k
drafts) multiplies the same W by T rows of x. Read W row by row, and use each row for all T inputs while
it sits in cache: the memory traffic stays one W, only the arithmetic grows with T.

    for each output row r (rows split over the cores):
        w = decode(W[r])                        read the row's bytes once (Q8_0: d * q per 32-value block)
        for t in range(T):                      the weight stays, x moves
            y[t, r] = dot(w, x[t])

As long as T dot products of a row cost less than fetching it, y for T tokens takes about the time of
y for one: that is what makes speculation pay on memory-bound hardware. Each y[t, r] is computed by the
same loop whatever T is, so row t of a T-row call is bitwise the one-row result (batch invariance, the
property greedy speculative == greedy plain rests on); fastmath lets the compiler vectorize the dot, in an
order fixed at compile time, so it agrees with the oracle's `ops.quant_linear` to float32 rounding.

This is the teaching version, for Q8_0 weights only: tinyspec/fast/numba_ops.py is the production one
(every GGUF type, integer dot products on x rounded as llama.cpp rounds it, explicit SIMD, two weight rows a
call), and notebooks/07_performance.ipynb times both.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..quants import GGMLType

Q8_0_BLOCK = 34  # bytes: an fp16 scale d, then 32 int8 codes q; value = d * q


def split_q8_0(raw: np.ndarray, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """The GGUF bytes of an [out, in] Q8_0 weight as scales d [out, nb] float32 and codes q [out, nb, 32] int8
    (a view of the bytes; nb = in / 32 blocks a row)."""
    out, n_in = shape
    blocks = np.asarray(raw, dtype=np.uint8).reshape(out, n_in // 32, Q8_0_BLOCK)  # [out, nb, 34]
    d = np.ascontiguousarray(blocks[:, :, :2]).view(np.float16)[:, :, 0].astype(np.float32)  # [out, nb]
    return d, blocks[:, :, 2:].view(np.int8)  # [out, nb], [out, nb, 32]


@njit(parallel=True, fastmath=True, cache=True)
def _linear_q8_0(x, d, q, y):  # x [T, in] f32, d [out, nb] f32, q [out, nb, 32] i8 -> y [T, out]
    T = x.shape[0]
    out, nb = d.shape
    for r in prange(out):
        w = np.empty(nb * 32, np.float32)  # this row, decoded once: exact, as dequantize does it
        for b in range(nb):
            for i in range(32):
                w[32 * b + i] = d[r, b] * np.float32(q[r, b, i])
        for t in range(T):  # ... and used for every input row while it is in cache
            acc = np.float32(0.0)
            for j in range(nb * 32):
                acc += w[j] * x[t, j]
            y[t, r] = acc


def quant_linear(x: np.ndarray, raw: np.ndarray, ggml_type: GGMLType | int, shape: tuple[int, int]) -> np.ndarray:
    """ops.quant_linear for Q8_0 weights, weight-stationary: [T, in] -> [T, out]."""
    if GGMLType(ggml_type) != GGMLType.Q8_0:
        raise ValueError(f"the teaching kernel reads Q8_0 weights only, got {GGMLType(ggml_type).name}")
    out, n_in = shape
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != n_in or n_in % 32:
        raise ValueError(f"x must be [T, {n_in}] with {n_in} a multiple of 32, got {x.shape}")
    d, q = split_q8_0(raw, shape)
    y = np.empty((x.shape[0], out), np.float32)
    _linear_q8_0(x, d, q, y)
    return y
