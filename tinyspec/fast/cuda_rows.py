"""Fused row functions for CuPy arrays: ops.rms_norm, l2_norm, sigmoid, silu and softplus in one launch each.

The oracle's versions run unchanged on CuPy arrays (NumPy dispatches them), but each is four to six CuPy
launches, and at decode sizes a launch costs Python time, not GPU time (LESSONS 10). backends.cuda_kernels
names these in the cuda backend's Kernels (for CuPy arrays; a function that returns None declines, and the
oracle's computes that call), and the model calls them through its kernels.

    norm_rows   one block of 128 threads per row: thread t sums x[j]^2 for j = t, t + 128, ... in order,
                then a fixed tree over the 128 partial sums; y = x / sqrt(sum (/ n for rms) + eps) (* w)
    sigmoid     1 / (1 + exp(-x));  silu  x * sigmoid(x);  softplus  max(x, 0) + log1p(exp(-|x|))

Same functions as tinyspec/ops.py to float rounding (the row sums run in another order than NumPy's pairwise
sum; the elementwise ones are the same float32 operations). Batch-invariant: a row's arithmetic depends only
on its length, never on how many rows there are (tests/test_backends.py checks the whole model bitwise on a GPU).
"""

from __future__ import annotations

import functools

import cupy as cp
import numpy as np

NORM_SOURCE = r"""
extern "C" __global__ void norm_rows(const float* __restrict__ x, const float* __restrict__ w,
                                     float* __restrict__ y, int n, float eps, int mean, int has_w) {
    __shared__ float part[128];
    const long long r = blockIdx.x;
    const float* xr = x + r * n;
    float* yr = y + r * n;
    float s = 0.0f;
    for (int j = threadIdx.x; j < n; j += 128) s = __fadd_rn(s, __fmul_rn(xr[j], xr[j]));
    part[threadIdx.x] = s;
    __syncthreads();
    for (int h = 64; h > 0; h >>= 1) {
        if (threadIdx.x < h) part[threadIdx.x] = __fadd_rn(part[threadIdx.x], part[threadIdx.x + h]);
        __syncthreads();
    }
    float ms = part[0];
    if (mean) ms = __fdiv_rn(ms, (float)n);
    const float den = __fsqrt_rn(__fadd_rn(ms, eps));
    for (int j = threadIdx.x; j < n; j += 128) {
        const float v = __fdiv_rn(xr[j], den);
        yr[j] = has_w ? __fmul_rn(v, w[j]) : v;
    }
}
"""

ELEMENTWISE = {  # name -> the float32 expression CuPy wraps in an elementwise kernel
    "sigmoid": "y = 1.0f / (1.0f + expf(-x))",
    "silu": "y = x * (1.0f / (1.0f + expf(-x)))",
    "softplus": "y = fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x)))",
}


@functools.cache
def _kernel(name: str):  # built on first use (CuPy compiles at the first launch and caches the cubin)
    if name == "norm_rows":
        return cp.RawKernel(NORM_SOURCE, "norm_rows")
    return cp.ElementwiseKernel("float32 x", "float32 y", ELEMENTWISE[name], f"tinyspec_{name}")


def _norm(x, w, eps: float, mean: bool):
    x = cp.ascontiguousarray(x, dtype=cp.float32)
    n = x.shape[-1]
    y = cp.empty_like(x)
    rows = x.size // n if n else 0
    if rows:
        wv = cp.ascontiguousarray(w, dtype=cp.float32) if w is not None else x
        args = (x, wv, y, np.int32(n), np.float32(eps), np.int32(mean), np.int32(w is not None))
        _kernel("norm_rows")((rows,), (128,), args)
    return y


def rms_norm(x, w, eps: float):  # [..., D], [D] -> [..., D]
    if w.size != x.shape[-1]:  # a broadcast the row kernel does not do: the oracle's way
        return None
    return _norm(x, w, eps, True)


def l2_norm(x, eps: float):  # [..., K] -> [..., K]
    return _norm(x, None, eps, False)


def sigmoid(x):
    return _kernel("sigmoid")(cp.asarray(x, dtype=cp.float32))


def silu(x):
    return _kernel("silu")(cp.asarray(x, dtype=cp.float32))


def softplus(x):
    return _kernel("softplus")(cp.asarray(x, dtype=cp.float32))
