"""Small pure NumPy functions every layer uses. float32 in, float32 out.

    rms_norm(x, w)   x / sqrt(mean(x^2) + eps) * w          over the last axis
    l2_norm(x)       x / sqrt(sum(x^2) + eps)               over the last axis (GDN q and k)
    silu(x)          x * sigmoid(x)
    softplus(x)      log(1 + exp(x)), computed without overflow
    softmax(x)       exp(x - max) / sum                      over the last axis
    linear(x, W)     y[t] = W @ x[t]                          W: [out, in] (NumPy shape of a GGUF weight)
    quant_linear(x, raw, type, shape)   linear(x, dequantize(raw))   the contract every fast kernel meets
    quant_linear_q8(x, raw, type, shape)  quant_linear(x rounded to Q8_K for K-quants and IQ4_XS, to Q8_0
                                          for Q8_0, Q4_0, Q5_0, IQ4_NL)   the cpu backend's contract
    get_rows(raw, type, shape, ids)     dequantize(raw)[ids]         embedding lookup without the whole table
    join_rows(parts)                    np.concatenate(parts) (at most 8 at a time), one part as it is
    rope_neox(x, positions, n_rot, base)   rotate dims (i, i + n_rot/2) of the first n_rot dims
                                        (rope_angles on the host, then rope_rows where x is)

Batch invariance: linear() computes every row with its own matrix-vector product, so row t of a
T-row call is bitwise identical to a 1-row call on x[t]. A float32 BLAS gemm (`X @ W.T`) splits the
reduction differently for different T, so its rows move by float32 rounding with T (LESSONS 6 measures
how far), which would break "greedy speculative == greedy plain". Everything else here is elementwise or
reduces along the last axis of one row, which NumPy does the same way whatever the number of rows.

Other array libraries: the functions run unchanged on CuPy arrays (the cuda backend keeps activations on
the GPU), because NumPy hands its calls to the array's own library (NEP 18). asarray_like(a, x) covers the
rest: it puts a host-made array where x lives (rope's cos/sin). No fast path hides in here: a backend that
has faster versions of these functions (fast/cuda_rows.py) names them in the Kernels it hands the model
(kernels.py), and the model calls those.
"""

from __future__ import annotations

import functools
import sys

import numpy as np

from .quants import GGMLType, dequantize, quantize
from .quants.q8_k import dequantize_q8_k, quantize_q8_k


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:  # [..., D], [D] -> [..., D]
    ms = np.mean(np.square(x), axis=-1, keepdims=True, dtype=np.float32)
    return (x / np.sqrt(ms + np.float32(eps)) * w).astype(np.float32, copy=False)


def l2_norm(x: np.ndarray, eps: float) -> np.ndarray:  # [..., K] -> [..., K]
    ss = np.sum(np.square(x), axis=-1, keepdims=True, dtype=np.float32)
    return (x / np.sqrt(ss + np.float32(eps))).astype(np.float32, copy=False)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-x))).astype(np.float32, copy=False)


def silu(x: np.ndarray) -> np.ndarray:
    return (x * sigmoid(x)).astype(np.float32, copy=False)


def softplus(x: np.ndarray) -> np.ndarray:
    # log(1 + e^x) = max(x, 0) + log1p(e^-|x|): no overflow for large |x|
    return (np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))).astype(np.float32, copy=False)


def softmax(x: np.ndarray) -> np.ndarray:  # [..., N] -> [..., N]
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return (e / np.sum(e, axis=-1, keepdims=True)).astype(np.float32, copy=False)


def swiglu(x: np.ndarray, gate, up, down, kern) -> np.ndarray:  # [T, D] -> [T, D]
    """The SwiGLU FFN: down(silu(gate x) * (up x)), with kern's matmul and silu (a Kernels: the caller's)."""
    return kern.linear(kern.silu(kern.linear(x, gate)) * kern.linear(x, up), down)  # [T, F] inside


def linear(x: np.ndarray, w: np.ndarray) -> np.ndarray:  # [T, in], [out, in] -> [T, out]
    """y[t] = w @ x[t], one matrix-vector product per row (batch-invariant, see module docstring).

    w may also be a backend's packed weight (tinyspec/backends.py): it multiplies itself, with a kernel
    that is batch-invariant too. The oracle only ever passes float32 arrays.
    """
    if not isinstance(w, np.ndarray):
        return w.linear(x)
    T = x.shape[0]
    y = np.empty((T, w.shape[0]), dtype=np.float32)
    for t in range(T):
        y[t] = w @ x[t]
    return y


def quant_linear(x: np.ndarray, raw: np.ndarray, ggml_type: GGMLType | int, shape: tuple[int, int]) -> np.ndarray:
    """y[t] = dequantize(raw) @ x[t]: [T, in] -> [T, out], raw = the GGUF bytes of an [out, in] weight.

    The oracle of the fused dequant-matmul kernels in tinyspec/fast/ (same name, same arguments): they
    read the quantized blocks directly and never build the float32 matrix this one builds.
    """
    return linear(x, dequantize(raw, ggml_type, shape))


X_Q8_0 = (GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.IQ4_NL, GGMLType.Q8_0)  # weights whose x llama.cpp rounds to Q8_0


def quant_linear_q8(x: np.ndarray, raw: np.ndarray, ggml_type: GGMLType | int, shape: tuple[int, int]) -> np.ndarray:
    """quant_linear on x rounded to llama.cpp's vec_dot_type of the weight: Q8_0 blocks of 32 for Q8_0, Q4_0,
    Q5_0 and IQ4_NL weights (X_Q8_0; tinyspec/quants/legacy.py quantize_q8_0, fp16 scales), Q8_K blocks of 256
    for the K-quants and IQ4_XS (tinyspec/quants/q8_k.py). The value the cpu backend's integer dot products compute, as llama.cpp's
    CPU backend does. [T, in] -> [T, out]."""
    if GGMLType(ggml_type) in X_Q8_0:
        x = np.asarray(x, dtype=np.float32)
        return quant_linear(dequantize(quantize(x, GGMLType.Q8_0), GGMLType.Q8_0, x.shape), raw, ggml_type, shape)
    q, d = quantize_q8_k(x)
    return quant_linear(dequantize_q8_k(q, d), raw, ggml_type, shape)


def get_rows(raw: np.ndarray, ggml_type: GGMLType | int, shape: tuple[int, int], ids: np.ndarray) -> np.ndarray:
    """Rows `ids` of the [n_rows, n_cols] weight stored in `raw`: [n] -> [n, n_cols] float32."""
    n_rows, n_cols = shape
    row_bytes = raw.size // n_rows
    ids = np.asarray(ids, dtype=np.int64)
    rows = np.asarray(raw).reshape(n_rows, row_bytes)[ids].reshape(-1)
    return dequantize(rows, ggml_type, (ids.size, n_cols))


def asarray_like(a: np.ndarray, x):
    """The NumPy array `a` as an array of x's kind: itself for a NumPy x; else through the asarray of x's
    own module (a CuPy x: an upload). Lets the model code run on another array library unchanged: every
    other NumPy call here dispatches on its arguments (NEP 18), only arrays made from host data need this."""
    if isinstance(x, np.ndarray):
        return a
    return sys.modules[type(x).__module__.split(".")[0]].asarray(a)


JOIN_AT_ONCE = 8  # arrays one concatenate joins at most (below)


def rows_of(bounds, seqs: list[int]) -> tuple[np.ndarray, np.ndarray]:  # [B+1], some b -> rows [r], bounds
    """The packed rows of some of a pass's sequences (sequence b: rows bounds[b] .. bounds[b+1]-1), in order, and
    their own bounds within those rows: a layer runs the chains of a pass that also holds draft trees this way."""
    rows = np.concatenate([np.arange(bounds[b], bounds[b + 1]) for b in seqs])
    return rows, np.cumsum([0] + [int(bounds[b + 1] - bounds[b]) for b in seqs])


def join_rows(parts: list) -> np.ndarray:  # [T_b, ...] each -> [sum T_b, ...]
    """The parts stacked along the first axis, as np.concatenate, but one part is returned as it is (no copy):
    a layer's per-sequence results joined back into the packed rows, for one sequence or many.

    At most JOIN_AT_ONCE arrays a concatenate (more: joined in groups, then the groups; the same numbers). CuPy
    joins more than 8 small arrays with one kernel that reads their addresses from a table it uploads first, and
    a CUDA graph capture refuses that upload: a pass of 9 or more sequences could never be captured."""
    if len(parts) == 1:
        return parts[0]
    if len(parts) <= JOIN_AT_ONCE:
        return np.concatenate(parts)
    return join_rows([join_rows(parts[i : i + JOIN_AT_ONCE]) for i in range(0, len(parts), JOIN_AT_ONCE)])


def rope_neox(x: np.ndarray, positions: np.ndarray, n_rot: int, base: float) -> np.ndarray:
    """Rotary embedding, NEOX pairing, on the first n_rot dims of each head; the rest pass through.

    x: [T, H, d], positions: [T] ints. Pair i (< n_rot/2) is (x[i], x[i + n_rot/2]) rotated by
    angle pos * base^(-2i / n_rot). For text tokens this equals qwen35's IMROPE (every section gets the
    same position), see docs/qwen35.md section 3.2. rope_angles (on the host) then rope_rows (where x is).
    """
    cos, sin = rope_angles(positions, n_rot, base)  # [T, half] each, host
    return rope_rows(x, asarray_like(cos, x), asarray_like(sin, x), n_rot)


def rope_angles(positions: np.ndarray, n_rot: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of every row's angles, [T] positions -> [T, n_rot/2] float32 each, on the host: what a pass
    computes once for all its rows (fast/rowmap.py packs them into the pass's one upload on a device backend)."""
    angle = np.asarray(positions).astype(np.float32)[:, None] * rope_freqs(n_rot, base)[None, :]  # [T, half]
    return np.cos(angle), np.sin(angle)


@functools.lru_cache(maxsize=16)
def rope_freqs(n_rot: int, base: float) -> np.ndarray:  # [n_rot/2] float32: base^(-2i / n_rot), i = 0 .. n_rot/2 - 1
    """Each pair's angle per position, computed in float64 and rounded once; the same for every pass of a model
    (so computed once: an lru_cache, read-only)."""
    half = n_rot // 2
    freqs = (1.0 / (base ** (np.arange(half, dtype=np.float64) * 2 / n_rot))).astype(np.float32)
    freqs.flags.writeable = False
    return freqs


def rope_rows(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, n_rot: int) -> np.ndarray:
    """The rotation itself: x [T, H, d], cos and sin [T, n_rot/2] where x is -> [T, H, d]."""
    half = n_rot // 2
    cos, sin = cos[:, None, :], sin[:, None, :]  # [T, 1, half]
    x1, x2 = x[..., :half], x[..., half:n_rot]
    out = x.copy()
    out[..., :half] = x1 * cos - x2 * sin
    out[..., half:n_rot] = x2 * cos + x1 * sin
    return out.astype(np.float32, copy=False)
