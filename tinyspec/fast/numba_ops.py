"""Numba CPU kernels for the fused dequant-matmul: quant_linear and get_rows straight from GGUF bytes.

Same names, arguments and results as the oracle in tinyspec/ops.py:

    quant_linear(x, raw, ggml_type, shape)   y[t, r] = sum_j W[r, j] * x[t, j]      [T, in] -> [T, out]
    get_rows(raw, ggml_type, shape, ids)     W[ids]                                  [n] -> [n, in]

where W = dequantize(raw, ggml_type, shape) is never built. A row of raw is a run of blocks (byte tables
in tinyspec/quants: floats.py, legacy.py dequantize_q4_0 / q8_0, kquants.py dequantize_q2_k .. q6_k).
Each block decodes on its own into float32 values bit-identical to the oracle's: the same f32
operations in the same order (`d * q`, `(d * sc) * q - (dmin * m)`), no fused multiply-add.

Loop structure (weight-stationary: x is small, W is the memory traffic):

    for each task of ROWS output rows, in parallel (prange):
        for each row r:
            acc[t, l] = 0                                     T x LANES float32 partial sums
            for each span of up to SPAN = 4096 values of the row:
                wbuf = decode(span)                           read the bytes once, exact f32 weights
                for t in range(T):                            reuse them for every input row
                    for j in span:  acc[t, j % LANES] += wbuf[j] * x[t, j]      (j in increasing order)
            y[t, r] = pairwise sum of acc[t, 0..LANES-1]      fixed tree: (l, l + 128), (l, l + 64), ...

Batch invariance (row t of a T-row call is bitwise equal to a 1-row call on x[t]): the operations that
produce y[t, r] - which products, added into which lane, in which order, then the fixed lane tree -
depend only on r, on t's own row of x and on the constants SPAN and LANES, never on T or on the other
rows of x. Nothing is compiled with fastmath, so LLVM may vectorize across the LANES independent
accumulators but may neither reassociate a sum nor contract a multiply-add into an FMA. Threads split
output rows, never a sum. Checked bitwise for T = 1..16 by tests/test_numba_ops.py.

Accuracy against the oracle (BLAS `W @ x[t]`, another summation order of the same exact products):
a float32 sum of n products, in any order, is within gamma_n * S of the exact sum, S = sum_j |W[r, j]
x[t, j]| and gamma_n = n u / (1 - n u), u = 2^-24 (Higham, Accuracy and Stability of Numerical
Algorithms, 2nd ed., section 3.1). Two such sums differ by at most 2 gamma_n S, hence the bound we
test: |y - y_oracle| <= 1.1 * in * 2^-23 * S. Measured errors are far below it: each lane sums only
in / 256 products, so y is within ~2e-8 S of the float64 sum at the Qwen shapes, 2-4x closer than
BLAS (tests/test_numba_ops.py::test_accuracy_against_float64 asserts < 1e-6 S).

get_rows runs the same decoders on one thread (a few embedding rows are not worth a parallel region)
and copies the decoded spans out.

Official implementation: ggml `ggml-cpu/ggml-cpu.c` ggml_compute_forward_mul_mat and the
`ggml_vec_dot_q4_K_q8_K` family. Those quantize x to 8 bits and sum integers; we keep x in float32, so
the result stays within float rounding of the oracle. Does NOT include: the other GGML types (they
raise ValueError and the caller falls back to the oracle), SIMD intrinsics, integer dot products.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..quants import GGMLType

LANES = 256  # float32 partial sums per (row, t): value j of a row goes to lane j % LANES
SPAN = 4096  # values decoded per call into the float32 buffer (16 KB); a multiple of LANES and of 256
ROWS = 8  # output rows per parallel task (buffers are allocated once per task)

SUPPORTED = (GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q4_0, GGMLType.Q8_0,
             GGMLType.Q2_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K)
# Plain ints for the kernels (numba reads module globals as compile-time constants).
_F32, _F16, _BF16 = int(GGMLType.F32), int(GGMLType.F16), int(GGMLType.BF16)
_Q4_0, _Q8_0 = int(GGMLType.Q4_0), int(GGMLType.Q8_0)
_Q2_K, _Q4_K, _Q5_K, _Q6_K = int(GGMLType.Q2_K), int(GGMLType.Q4_K), int(GGMLType.Q5_K), int(GGMLType.Q6_K)

_POW2 = np.array([2.0 ** (e - 25) for e in range(32)], dtype=np.float32)  # fp16 exponent e -> 2^(e-25)


# ---------------------------------------------------------------------------------------------
# Decoders. `blocks` is the weight as [out, n_blocks, type_size] uint8 (plain types: [out, in, 2 or 4],
# one value per block). A decoder writes nb consecutive blocks b0 .. b0 + nb - 1 of row r into `dst`,
# peeling fields in the order of the byte tables in tinyspec/quants. Block types write `dst` = the
# span buffer seen as [SPAN / 32, 32] groups (a legacy block, or one of the 8 groups of a super-block).
#
# Written for LLVM's loop vectorizer: codes stay np.uint8 / np.int8 up to the float conversion (a
# Python-int intermediate would be int64); inner indices are a loop variable plus constants, so numba's
# negative-index wraparound folds away; the inner trip count G = dst.shape[1] is read at run time, so
# LLVM vectorizes that loop (behind a run-time alias check) instead of unrolling it into scalar code.


@njit(cache=True)
def _f16(lo, hi):  # two little-endian bytes -> float32, exact
    """fp16 -> f32 for one scale: (1024 + mantissa) * 2^(e - 25), or mantissa * 2^-24 (subnormal)."""
    h = np.int32(lo) | (np.int32(hi) << 8)
    e = (h >> 10) & 31
    m = h & 1023
    if e == 0:
        v = np.float32(m) * np.float32(2.0**-24)
    elif e == 31:
        v = np.float32(np.inf) if m == 0 else np.float32(np.nan)
    else:
        v = np.float32(m + 1024) * _POW2[e]
    return -v if h & 0x8000 else v


@njit(cache=True)
def _decode_f32(blocks, r, b0, n, dst):  # n values of 4 bytes: the IEEE bits themselves
    v = blocks[r, b0:b0 + n].view(np.float32)  # [n, 1]
    for j in range(n):
        dst[j] = v[j, 0]


@njit(cache=True)
def _decode_bf16(blocks, r, b0, n, dst):  # n values of 2 bytes: the high half of the f32 bits
    h, bits = blocks[r, b0:b0 + n].view(np.uint16), dst.view(np.uint32)  # [n, 1], [SPAN]
    for j in range(n):
        bits[j] = np.uint32(h[j, 0]) << 16


@njit(cache=True)
def _decode_f16(blocks, r, b0, n, dst):  # n values of 2 bytes
    """fp16 -> f32 in three vector passes: place exponent and mantissa 13 bits up (an f32 2^112 too
    small, subnormals included), multiply by 2^112 (exact), then OR in the sign and inf/NaN exponent."""
    h, bits = blocks[r, b0:b0 + n].view(np.uint16), dst.view(np.uint32)  # [n, 1], [SPAN]
    for j in range(n):
        bits[j] = (np.uint32(h[j, 0]) & 0x7FFF) << 13
    for j in range(n):
        dst[j] = dst[j] * np.float32(2.0**112)
    for j in range(n):
        inf_nan = np.uint32(0x7F800000) if (h[j, 0] & 0x7C00) == 0x7C00 else np.uint32(0)
        bits[j] |= ((np.uint32(h[j, 0]) & 0x8000) << 16) | inf_nan


@njit(cache=True)
def _decode_q4_0(blocks, r, b0, nb, dst):  # 18 bytes: d, qs[16];  x = d * (q - 8)
    G = dst.shape[1] // 2  # 16: byte l holds value l (low nibble) and value 16 + l (high nibble)
    for k in range(nb):
        d = _f16(blocks[r, b0 + k, 0], blocks[r, b0 + k, 1])
        for l in range(G):
            q = blocks[r, b0 + k, 2 + l]
            dst[k, l] = d * (np.float32(np.uint8(q & 15)) - np.float32(8))
            dst[k, 16 + l] = d * (np.float32(np.uint8(q >> 4)) - np.float32(8))


@njit(cache=True)
def _decode_q8_0(blocks, r, b0, nb, dst):  # 34 bytes: d, qs[32] int8;  x = d * q
    G = dst.shape[1]  # 32
    for k in range(nb):
        d = _f16(blocks[r, b0 + k, 0], blocks[r, b0 + k, 1])
        for l in range(G):
            dst[k, l] = d * np.float32(np.int8(blocks[r, b0 + k, 2 + l]))


@njit(cache=True)
def _decode_q2_k(blocks, r, b0, nb, dst):  # 84 bytes: scales[16], qs[64], d, dmin
    """x = (d * sc) * q - (dmin * m). Group 4c + s (values 128c + 32s + l) is bit pair s of qs[32c + l];
    its two 16-value halves use scales[8c + 2s] and scales[8c + 2s + 1] (sc low nibble, m high)."""
    G = dst.shape[1]  # 32
    for k in range(nb):
        b = b0 + k
        d, dmin = _f16(blocks[r, b, 80], blocks[r, b, 81]), _f16(blocks[r, b, 82], blocks[r, b, 83])
        for c in range(2):
            for s in range(4):
                j = 8 * c + 2 * s
                dl0, ml0 = d * np.float32(blocks[r, b, j] & 15), dmin * np.float32(blocks[r, b, j] >> 4)
                dl1, ml1 = d * np.float32(blocks[r, b, j + 1] & 15), dmin * np.float32(blocks[r, b, j + 1] >> 4)
                for l in range(G):
                    dl, ml = (dl0, ml0) if l < 16 else (dl1, ml1)
                    q = np.uint8((blocks[r, b, 16 + 32 * c + l] >> (2 * s)) & 3)
                    dst[8 * k + 4 * c + s, l] = dl * np.float32(q) - ml


@njit(cache=True)
def _scale_min_k(blocks, r, b, j):  # Q4_K/Q5_K: 6-bit (sc[j], m[j]) from the 12 bytes at offset 4
    if j < 4:
        return np.uint8(blocks[r, b, 4 + j] & 63), np.uint8(blocks[r, b, 8 + j] & 63)
    sc = (blocks[r, b, 8 + j] & 15) | ((blocks[r, b, j] >> 6) << 4)
    m = (blocks[r, b, 8 + j] >> 4) | ((blocks[r, b, 4 + j] >> 6) << 4)
    return np.uint8(sc), np.uint8(m)


@njit(cache=True)
def _decode_q4_k(blocks, r, b0, nb, dst):  # 144 bytes: d, dmin, scales[12], qs[128]
    """x = (d * sc) * q - (dmin * m); qs[32c + l] holds value l of group 2c (low nibble) and 2c + 1."""
    G = dst.shape[1]  # 32
    for k in range(nb):
        b = b0 + k
        d, dmin = _f16(blocks[r, b, 0], blocks[r, b, 1]), _f16(blocks[r, b, 2], blocks[r, b, 3])
        for c in range(4):
            sc0, m0 = _scale_min_k(blocks, r, b, 2 * c)
            sc1, m1 = _scale_min_k(blocks, r, b, 2 * c + 1)
            dl0, ml0 = d * np.float32(sc0), dmin * np.float32(m0)
            dl1, ml1 = d * np.float32(sc1), dmin * np.float32(m1)
            for l in range(G):
                q = blocks[r, b, 16 + 32 * c + l]
                dst[8 * k + 2 * c, l] = dl0 * np.float32(np.uint8(q & 15)) - ml0
                dst[8 * k + 2 * c + 1, l] = dl1 * np.float32(np.uint8(q >> 4)) - ml1


@njit(cache=True)
def _decode_q5_k(blocks, r, b0, nb, dst):  # 176 bytes: d, dmin, scales[12], qh[32], qs[128]
    """As Q4_K (qs at offset 48), plus the fifth bit (16) of value l of group j: bit j of qh[l]."""
    G = dst.shape[1]  # 32
    for k in range(nb):
        b = b0 + k
        d, dmin = _f16(blocks[r, b, 0], blocks[r, b, 1]), _f16(blocks[r, b, 2], blocks[r, b, 3])
        for c in range(4):
            sc0, m0 = _scale_min_k(blocks, r, b, 2 * c)
            sc1, m1 = _scale_min_k(blocks, r, b, 2 * c + 1)
            dl0, ml0 = d * np.float32(sc0), dmin * np.float32(m0)
            dl1, ml1 = d * np.float32(sc1), dmin * np.float32(m1)
            for l in range(G):
                q, qh = blocks[r, b, 48 + 32 * c + l], blocks[r, b, 16 + l]
                q0 = np.uint8((q & 15) | (((qh >> (2 * c)) & 1) << 4))
                q1 = np.uint8((q >> 4) | (((qh >> (2 * c + 1)) & 1) << 4))
                dst[8 * k + 2 * c, l] = dl0 * np.float32(q0) - ml0
                dst[8 * k + 2 * c + 1, l] = dl1 * np.float32(q1) - ml1


@njit(cache=True)
def _decode_q6_k(blocks, r, b0, nb, dst):  # 210 bytes: ql[128], qh[64], scales[16] int8, d
    """x = (d * sc) * (q - 32). Group 4h + g (values 128h + 32g + l): low 4 bits are nibble g // 2 of
    ql[64h + 32(g % 2) + l], high 2 bits are bits 2g of qh[32h + l]; scales[8h + 2g] for l < 16, then
    scales[8h + 2g + 1]."""
    G = dst.shape[1]  # 32
    for k in range(nb):
        b = b0 + k
        d = _f16(blocks[r, b, 208], blocks[r, b, 209])
        for h in range(2):
            for g in range(4):
                dl0 = d * np.float32(np.int8(blocks[r, b, 192 + 8 * h + 2 * g]))
                dl1 = d * np.float32(np.int8(blocks[r, b, 193 + 8 * h + 2 * g]))
                for l in range(G):
                    dl = dl0 if l < 16 else dl1
                    low4 = (blocks[r, b, 64 * h + 32 * (g % 2) + l] >> (4 * (g // 2))) & 15
                    high2 = (blocks[r, b, 128 + 32 * h + l] >> (2 * g)) & 3
                    q = np.float32(np.uint8(low4 | (high2 << 4))) - np.float32(32)
                    dst[8 * k + 4 * h + g, l] = dl * q


@njit(cache=True)
def _decode_span(kind, blocks, r, v0, n, wbuf, groups):
    """Values v0 .. v0 + n of row r -> wbuf[:n] (groups = wbuf seen as [SPAN / 32, 32])."""
    if kind == _Q4_K:
        _decode_q4_k(blocks, r, v0 // 256, n // 256, groups)
    elif kind == _Q6_K:
        _decode_q6_k(blocks, r, v0 // 256, n // 256, groups)
    elif kind == _Q8_0:
        _decode_q8_0(blocks, r, v0 // 32, n // 32, groups)
    elif kind == _Q5_K:
        _decode_q5_k(blocks, r, v0 // 256, n // 256, groups)
    elif kind == _Q4_0:
        _decode_q4_0(blocks, r, v0 // 32, n // 32, groups)
    elif kind == _Q2_K:
        _decode_q2_k(blocks, r, v0 // 256, n // 256, groups)
    elif kind == _F16:
        _decode_f16(blocks, r, v0, n, wbuf)
    elif kind == _BF16:
        _decode_bf16(blocks, r, v0, n, wbuf)
    else:
        _decode_f32(blocks, r, v0, n, wbuf)


# ---------------------------------------------------------------------------------------------
# The two kernels. x and the get_rows output are [T, chunks, LANES]: the row cut into LANES-wide chunks.


@njit(cache=True)
def _sum_lanes(acc, t):  # fixed pairwise tree over acc[t, 0..LANES-1] (overwrites it)
    h = LANES // 2
    while h > 0:
        for l in range(h):
            acc[t, l] = acc[t, l] + acc[t, l + h]
        h //= 2
    return acc[t, 0]


@njit(cache=True, parallel=True)
def _quant_linear_kernel(xc, blocks, kind, n_in, y):  # xc [T, chunks, LANES] f32, blocks u8 -> y [T, out]
    T = xc.shape[0]
    n_out = blocks.shape[0]
    for task in prange((n_out + ROWS - 1) // ROWS):
        wbuf = np.zeros(SPAN, np.float32)
        groups, chunks = wbuf.reshape(SPAN // 32, 32), wbuf.reshape(SPAN // LANES, LANES)
        acc = np.empty((T, LANES), np.float32)
        for r in range(task * ROWS, min(n_out, (task + 1) * ROWS)):
            acc[:] = np.float32(0)
            for v0 in range(0, n_in, SPAN):
                n = min(SPAN, n_in - v0)
                _decode_span(kind, blocks, r, v0, n, wbuf, groups)
                c0, full = v0 // LANES, n // LANES  # first chunk of the span, whole chunks in it
                for t in range(T):
                    # acc[t, j] += chunk c's value j * x, for c = 0, 1, ... in order. Vertical loops over
                    # j: LLVM vectorizes them without reordering any lane's sum. Four chunks per pass
                    # make the same additions in the same order with 1/4 of the acc loads and stores.
                    c = 0
                    while c + 4 <= full:
                        for j in range(LANES):
                            a = acc[t, j] + chunks[c, j] * xc[t, c0 + c, j]
                            a = a + chunks[c + 1, j] * xc[t, c0 + c + 1, j]
                            a = a + chunks[c + 2, j] * xc[t, c0 + c + 2, j]
                            acc[t, j] = a + chunks[c + 3, j] * xc[t, c0 + c + 3, j]
                        c += 4
                    while c < full:
                        for j in range(LANES):
                            acc[t, j] += chunks[c, j] * xc[t, c0 + c, j]
                        c += 1
                    for j in range(n - LANES * full):  # a last, partial chunk (plain types only)
                        acc[t, j] += chunks[full, j] * xc[t, c0 + full, j]
            for t in range(T):
                y[t, r] = _sum_lanes(acc, t)


@njit(cache=True)
def _get_rows_kernel(blocks, kind, n_in, ids, out):  # blocks u8, ids [n] int64 -> out [n, chunks, LANES]
    wbuf = np.zeros(SPAN, np.float32)  # one thread: an embedding lookup is a few rows, memory-bound
    groups, chunks = wbuf.reshape(SPAN // 32, 32), wbuf.reshape(SPAN // LANES, LANES)
    for i in range(ids.size):
        for v0 in range(0, n_in, SPAN):
            n = min(SPAN, n_in - v0)
            _decode_span(kind, blocks, ids[i], v0, n, wbuf, groups)
            for c in range((n + LANES - 1) // LANES):
                for j in range(min(LANES, n - LANES * c)):
                    out[i, v0 // LANES + c, j] = chunks[c, j]


# ---------------------------------------------------------------------------------------------
# Public functions: argument checks in NumPy, then one kernel call.


def _weight_blocks(raw: np.ndarray, ggml_type, shape) -> tuple[GGMLType, np.ndarray]:
    """Validate type and sizes; return the type and raw as a C-contiguous [out, n_blocks, type_size] view."""
    try:
        qtype = GGMLType(ggml_type)
    except ValueError:
        raise ValueError(f"numba_ops: unknown ggml type id {ggml_type!r}") from None
    if qtype not in SUPPORTED:
        names = ", ".join(t.name for t in SUPPORTED)
        raise ValueError(f"numba_ops: ggml type {qtype.name} is not supported (supported: {names}); "
                         "use tinyspec.ops for it")
    if len(shape) != 2 or min(shape) < 0:
        raise ValueError(f"numba_ops: shape must be (out, in) >= 0, got {tuple(shape)}")
    n_out, n_in = int(shape[0]), int(shape[1])
    if n_in % qtype.block_size:
        raise ValueError(f"numba_ops: {qtype.name} row length {n_in} is not a multiple of the block size "
                         f"{qtype.block_size}")
    raw = np.asarray(raw)
    n_blocks = n_in // qtype.block_size
    if raw.dtype != np.uint8 or raw.size != n_out * n_blocks * qtype.type_size:
        raise ValueError(f"numba_ops: {qtype.name} shape {tuple(shape)} needs {n_out * n_blocks * qtype.type_size}"
                         f" uint8 bytes, got {raw.size} of {raw.dtype}")
    blocks = np.ascontiguousarray(raw).reshape(n_out, n_blocks, qtype.type_size)  # a view when raw is contiguous
    blocks.flags.writeable = False  # read-only always: one compiled kernel for memory maps and arrays alike
    return qtype, blocks


def quant_linear(x: np.ndarray, raw: np.ndarray, ggml_type: GGMLType | int, shape: tuple[int, int]) -> np.ndarray:
    """y[t] = dequantize(raw) @ x[t] without the float32 matrix: [T, in] -> [T, out] float32.

    Batch-invariant bit for bit (row t never depends on T); within 1.1 * in * 2^-23 * (|W| @ |x|)
    of tinyspec.ops.quant_linear. Raises ValueError for unsupported types and mismatched shapes.
    """
    qtype, blocks = _weight_blocks(raw, ggml_type, shape)
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[1] != blocks.shape[1] * qtype.block_size:
        raise ValueError(f"numba_ops: x must be [T, {shape[1]}] for weight shape {tuple(shape)}, got {x.shape}")
    T, n_in = x.shape
    n_chunks = -(-n_in // LANES)
    xc = np.zeros((T, n_chunks * LANES), dtype=np.float32)  # x cut into LANES-wide chunks, zero-padded
    xc[:, :n_in] = x
    y = np.zeros((T, blocks.shape[0]), dtype=np.float32)
    if y.size and n_in:
        _quant_linear_kernel(xc.reshape(T, n_chunks, LANES), blocks, int(qtype), n_in, y)
    return y


def get_rows(raw: np.ndarray, ggml_type: GGMLType | int, shape: tuple[int, int], ids: np.ndarray) -> np.ndarray:
    """Rows `ids` of the [n_rows, n_cols] weight in `raw`: [n] -> [n, n_cols] float32, bit-exact with
    tinyspec.ops.get_rows (negative ids count from the end, as in NumPy)."""
    qtype, blocks = _weight_blocks(raw, ggml_type, shape)
    n_rows, n_in = blocks.shape[0], blocks.shape[1] * qtype.block_size
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    if ids.size and (ids.min() < -n_rows or ids.max() >= n_rows):
        raise IndexError(f"numba_ops: row ids must be in [-{n_rows}, {n_rows}), got {ids.min()}..{ids.max()}")
    ids = np.where(ids < 0, ids + n_rows, ids)
    n_chunks = -(-n_in // LANES)
    out = np.zeros((ids.size, n_chunks, LANES), dtype=np.float32)
    if out.size:
        _get_rows_kernel(blocks, int(qtype), n_in, ids, out)
    out = out.reshape(ids.size, n_chunks * LANES)
    return out if n_in == n_chunks * LANES else np.ascontiguousarray(out[:, :n_in])
