"""Q8_K: the 8-bit activation type of llama.cpp's CPU integer dot products (never stored in files).

A row of activations x (length a multiple of 256) is rounded, per block of 256 values, to

    x ~ d * q,    q = min(127, round_half_even(-127 / max * x)),   d = 1 / (-127 / max)

where `max` is the value of largest magnitude in the block, sign included (the first one on ties), so
that value maps to exactly -127 and every q lies in [-127, 127]. A block of zeros gets d = 0, q = 0.
The bsums are the sums of each run of 16 consecutive q (they let a K-quant's per-group offset be
applied once per group instead of once per value: sum_i m * q_i = m * bsum).

The cpu backend multiplies K-quant and IQ4_XS weights by activations rounded this way, in integers (see
tinyspec/fast/numba_ops.py quant_linear_q8); its oracle is tinyspec/ops.py quant_linear_q8, the float
matmul on dequantize_q8_k(*quantize_q8_k(x)).

Official implementation: ggml `ggml-quants.c` quantize_row_q8_K_ref (same rule: iscale = -127 / max,
nearest_int is round-half-to-even) and block_q8_K in `ggml-common.h` (d float32, qs[256] int8,
bsums[16] int16).
"""

from __future__ import annotations

import numpy as np

from .types import QK_K


def quantize_q8_k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[T, n] float32 (n a multiple of 256) -> q [T, n] int8, d [T, n / 256] float32."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] % QK_K:
        raise ValueError(f"quantize_q8_k: x must be [T, n] with n a multiple of {QK_K}, got {x.shape}")
    T, n = x.shape
    blocks = x.reshape(T, n // QK_K, QK_K)
    first = np.abs(blocks).argmax(axis=-1)[..., None]  # the first value of largest magnitude
    mx = np.take_along_axis(blocks, first, axis=-1)  # [T, nb, 1], signed
    zero = mx == 0
    with np.errstate(divide="ignore"):
        iscale = np.where(zero, np.float32(0), np.float32(-127) / np.where(zero, np.float32(1), mx))
    q = np.minimum(np.rint(iscale * blocks), 127).astype(np.int8)
    d = np.where(zero, np.float32(0), np.float32(1) / np.where(zero, np.float32(1), iscale))
    return q.reshape(T, n), d[..., 0].astype(np.float32)


def dequantize_q8_k(q: np.ndarray, d: np.ndarray) -> np.ndarray:
    """q [T, n] int8, d [T, n / 256] -> d * q as [T, n] float32."""
    T, n = q.shape
    return (d[:, :, None] * q.reshape(T, n // QK_K, QK_K).astype(np.float32)).reshape(T, n)


def bsums_q8_k(q: np.ndarray) -> np.ndarray:
    """q [T, n] int8 -> sums of each 16 consecutive values, [T, n / 16] int16 (|sum| <= 2032)."""
    T, n = q.shape
    return q.reshape(T, n // 16, 16).astype(np.int16).sum(axis=-1, dtype=np.int16)
