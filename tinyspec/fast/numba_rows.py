"""Numba row functions: ops.rms_norm, l2_norm, sigmoid, silu and softplus as one compiled call each.

The oracle's versions are NumPy expressions of three to six operations each (a square, a mean, a sqrt, a
divide, a multiply, a cast), every one a Python-level call with a fresh temporary. At decode sizes (a row of
320 floats) the arithmetic is nothing and the calls are everything: one rms_norm took ~6.5 us of NumPy against
~0.5 us for this module's one call, and a decode step of the shipped model calls the row functions about
50 times. backends.cpu_kernels names these in the cpu backend's Kernels, and the model calls them through
its kernels, as the cuda backend's fast/cuda_rows.py.

    rms_norm   y = x / sqrt(mean(x^2) + eps) * w      per row of the last axis; w [D] (the weight)
    l2_norm    y = x / sqrt(sum(x^2) + eps)           per row of the last axis
    sigmoid    1 / (1 + exp(-x));  silu  x * sigmoid(x);  softplus  max(x, 0) + log1p(exp(-|x|))

Same functions as tinyspec/ops.py to float rounding: the row's sum of squares runs in float64 from j = 0 up
(NumPy sums float32 pairwise), then is rounded to float32 and the rest are the oracle's float32 operations in
its order (x / den, then * w). Batch-invariant: a row's arithmetic depends only on its own values and length,
never on how many rows there are; nothing is compiled with fastmath, so LLVM may not reorder the sum.
A call these kernels do not cover (a weight that is not one value per column, a dtype other than float32)
goes to the oracle's function, which is the same function.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .. import ops
from . import simd


@njit(cache=True, inline="always", error_model="numpy", boundscheck=False)
def _norm_row(x, w, y, eps, mean, has_w):  # x, y [D] (y may be x); w [D] (read when has_w)
    D = x.shape[0]
    s = 0.0  # float64: the row's sum of squares, j = 0, 1, ... (each square rounded to float32 first)
    for j in range(D):
        v = x[j]
        s += np.float32(v * v)
    ms = np.float32(s)
    if mean:
        ms = np.float32(ms / np.float32(D))
    den = np.float32(np.sqrt(np.float32(ms + eps)))
    for j in range(D):
        v = np.float32(x[j] / den)
        y[j] = np.float32(v * w[j]) if has_w else v


@njit(cache=True, error_model="numpy", boundscheck=False)
def _norm_rows(x, w, y, eps, mean, has_w):  # x, y [R, D]; w [D] (read when has_w)
    for r in range(x.shape[0]):
        _norm_row(x[r], w, y[r], eps, mean, has_w)


@njit(cache=True, inline="always", error_model="numpy", boundscheck=False)
def exp32(v):  # float32 -> float32: e^v within 1 ulp, 0 below the normal range, inf above 88.72
    """e^v in float32 arithmetic a loop can vectorize (NumPy's and libm's exp are calls, one value each): v = k ln2
    + r with |r| <= ln2 / 2 (ln2 in two parts, Cody-Waite), e^r by a degree-7 polynomial (Cephes' expf
    coefficients), times 2^k built from exponent bits (two factors of 2^(k/2): exact). Measured within 1 ulp of the float64 exp over
    [-87, 88] (NumPy's float32 exp: within 2.3); a result below the smallest normal float (v < -87.34) is 0."""
    c = min(max(v, np.float32(-87.33654)), np.float32(88.72283))
    k = np.floor(c * np.float32(1.44269504) + np.float32(0.5))
    r = c - k * np.float32(0.693359375)
    r = r - k * np.float32(-2.12194440e-4)
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    p = p * r * r + r + np.float32(1)
    ki = np.int32(k)  # -126 .. 128: 2^k as two exact factors, since 2^128 itself is not a float32
    h = ki >> np.int32(1)
    e = p * simd.f32_from_bits((ki - h + np.int32(127)) << np.int32(23)) * simd.f32_from_bits((h + np.int32(127))
                                                                                            << np.int32(23))
    if v > np.float32(88.72283):
        e = np.float32(np.inf)
    elif v < np.float32(-87.33654):
        e = np.float32(0)
    return e


@njit(cache=True, inline="always", error_model="numpy", boundscheck=False)
def sigmoid1(v):  # one value: 1 / (1 + e^-v)
    return np.float32(1) / (np.float32(1) + exp32(-v))


@njit(cache=True, inline="always", error_model="numpy", boundscheck=False)
def silu1(v):  # one value: v * sigmoid(v)
    return v * sigmoid1(v)


@njit(cache=True, inline="always", error_model="numpy", boundscheck=False)
def softplus1(v):  # one value: max(v, 0) + log1p(e^-|v|)
    return max(v, np.float32(0)) + np.log1p(exp32(-abs(v)))


@njit(cache=True, error_model="numpy", boundscheck=False)
def _sigmoid(x, y):  # flat float32
    for i in range(x.size):
        y[i] = sigmoid1(x[i])


@njit(cache=True, error_model="numpy", boundscheck=False)
def _silu(x, y):
    for i in range(x.size):
        y[i] = silu1(x[i])


@njit(cache=True, error_model="numpy", boundscheck=False)
def _softplus(x, y):
    for i in range(x.size):
        y[i] = softplus1(x[i])


_NO_W = np.ones(1, np.float32)  # l2_norm's weight: not read (has_w False)


def _rows(x) -> np.ndarray | None:  # x as a C-contiguous float32 [R, D] view, or None (the oracle takes it)
    if not isinstance(x, np.ndarray) or x.dtype != np.float32 or x.ndim == 0 or x.shape[-1] == 0:
        return None
    x = x if x.flags.c_contiguous else np.ascontiguousarray(x)
    return x.reshape(-1, x.shape[-1])


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:  # [..., D], [D] -> [..., D]
    """ops.rms_norm in one compiled call (to float rounding of it)."""
    if type(x) is np.ndarray and x.ndim == 2 and x.dtype == np.float32 and x.flags.c_contiguous \
            and type(w) is np.ndarray and w.dtype == np.float32 and w.shape == (x.shape[1],) and x.shape[1]:
        y = np.empty_like(x)  # the model's common case, [T, D] rows, with the fewest checks (~17 calls a step)
        _norm_rows(x, w, y, np.float32(eps), True, True)
        return y
    rows = _rows(x)
    if rows is None or not isinstance(w, np.ndarray) or w.dtype != np.float32 or w.shape != (x.shape[-1],):
        return ops.rms_norm(x, w, eps)
    y = np.empty(x.shape, np.float32)
    _norm_rows(rows, w, y.reshape(rows.shape), np.float32(eps), True, True)
    return y


def l2_norm(x: np.ndarray, eps: float) -> np.ndarray:  # [..., K] -> [..., K]
    """ops.l2_norm in one compiled call (to float rounding of it)."""
    rows = _rows(x)
    if rows is None:
        return ops.l2_norm(x, eps)
    y = np.empty(x.shape, np.float32)
    _norm_rows(rows, _NO_W, y.reshape(rows.shape), np.float32(eps), False, False)
    return y


def _elementwise(kernel, oracle):
    def row(x: np.ndarray) -> np.ndarray:
        if not isinstance(x, np.ndarray) or x.dtype != np.float32:
            return oracle(x)
        x = x if x.flags.c_contiguous else np.ascontiguousarray(x)
        y = np.empty(x.shape, np.float32)
        kernel(x.reshape(-1), y.reshape(-1))
        return y

    row.__name__ = row.__qualname__ = oracle.__name__
    row.__doc__ = f"ops.{oracle.__name__} in one compiled call (the same float32 operations; exp may differ in " \
                  "its last bit)."
    return row


sigmoid = _elementwise(_sigmoid, ops.sigmoid)
silu = _elementwise(_silu, ops.silu)
softplus = _elementwise(_softplus, ops.softplus)
