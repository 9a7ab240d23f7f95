"""K-quants: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (256-value super-blocks with quantized sub-block scales).

A super-block holds 256 consecutive values of a row, cut into sub-blocks of 16 or 32 values. Each
sub-block has its own small integer scale `sc` (and in Q2_K/Q4_K/Q5_K an integer min `m`); those
integers are in turn scaled by the super-block's fp16 `d` (and `dmin`):

    Q2_K  16 x 16 values  x = (d * sc) * q - (dmin * m)   q in 0..3,   sc, m 4-bit
    Q3_K  16 x 16 values  x = (d * (sc - 32)) * q          q in -4..3,  sc 6-bit
    Q4_K   8 x 32 values  x = (d * sc) * q - (dmin * m)   q in 0..15,  sc, m 6-bit
    Q5_K   8 x 32 values  x = (d * sc) * q - (dmin * m)   q in 0..31,  sc, m 6-bit
    Q6_K  16 x 16 values  x = (d * sc) * q                 q in -32..31, sc int8

Bit-exactness: each bracket is one f32 multiply of the widened fp16 scale by the exact float
integer, then one f32 multiply by q, then one f32 subtract (never fused) - gguf-py's order.

Code order within `qs`: the 2-bit types (Q2_K, Q3_K low bits) fill a 32-byte chunk per 128 values,
bits 0-1 of byte l holding value l, bits 2-3 value 32 + l, bits 4-5 value 64 + l, bits 6-7 value
96 + l. The 4-bit types (Q4_K, Q5_K low bits) fill a 32-byte chunk per 64 values: low nibble of
byte l is value l, high nibble value 32 + l. Q6_K mixes both, see its docstring.

Official implementation: ggml `ggml-common.h` block_q2_K .. block_q6_K, `ggml-quants.c`
dequantize_row_q2_K .. q6_K, quantize_row_q4_K_ref / q5_K_ref / q6_K_ref with their helpers
make_qkx2_quants and make_qx_quants; gguf-py `quants.py` (the dequantizers).
The quantizers give the same bytes as ggml's `_ref` ones (checked against the compiled C by
tests/test_quants_kquants.py::test_quantizers_equal_ggml_reference_bytes, run when TINYSPEC_LLAMA_CPP
names a llama.cpp checkout).
Does NOT include: quantizers for Q2_K and Q3_K; the importance-matrix weighted quantizers
(`quantize_q4_K_impl` ...) that llama-quantize uses when given an imatrix.
"""

from __future__ import annotations

import numpy as np

from .types import QK_K, GGMLType


def _f16(field: np.ndarray) -> np.ndarray:  # [B, 2] uint8 -> [B, 1] f32
    return field.view("<f2").astype(np.float32)


def _crumbs(qs: np.ndarray) -> np.ndarray:  # [B, 64] uint8 -> [B, 256] uint8 codes 0..3
    """2-bit codes: chunk c of 32 bytes, shift s -> values 128c + 32s + l."""
    B = qs.shape[0]
    shift = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    return ((qs.reshape(B, 2, 1, 32) >> shift) & 3).reshape(B, QK_K)  # [B, 2, 4, 32]


def _nibbles(qs: np.ndarray) -> np.ndarray:  # [B, 128] uint8 -> [B, 8, 32] uint8 codes 0..15
    """4-bit codes: chunk c of 32 bytes -> sub-block 2c in low nibbles, 2c + 1 in high nibbles."""
    B = qs.shape[0]
    q = qs.reshape(B, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (q & 0x0F).reshape(B, 8, 32)


def _unpack_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # [B, 12] -> 2 x [B, 8]
    """The 12 bytes holding eight 6-bit scales `sc` and eight 6-bit mins `m` (Q4_K, Q5_K).

    byte   bits 7-6      bits 5-0     | byte   bits 7-4     bits 3-0
    0..3   sc[4..7]>>4   sc[0..3]     | 8..11  m[4..7]&15   sc[4..7]&15
    4..7   m[4..7]>>4    m[0..3]      |
    """
    lo_sc, lo_m, packed = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]  # [B, 4] each
    sc = np.concatenate([lo_sc & 63, (packed & 0x0F) | ((lo_sc >> 6) << 4)], axis=-1)
    m = np.concatenate([lo_m & 63, (packed >> 4) | ((lo_m >> 6) << 4)], axis=-1)
    return sc, m


def _pack_scale_min(sc: np.ndarray, m: np.ndarray) -> np.ndarray:  # 2 x [B, 8] 0..63 -> [B, 12]
    """Inverse of _unpack_scale_min."""
    lo_sc = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    lo_m = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    packed = (sc[:, 4:8] & 0x0F) | ((m[:, 4:8] & 0x0F) << 4)
    return np.concatenate([lo_sc, lo_m, packed], axis=-1).astype(np.uint8)


def dequantize_q2_k(blocks: np.ndarray) -> np.ndarray:  # [B, 84] uint8 -> [B, 256] f32
    """Q2_K: 2-bit codes, 16 sub-blocks of 16 with 4-bit scale and min (2.625 bits per value).

    offset  bytes  field   meaning
    0       16     scales  byte j: sub-block j's scale sc in bits 0-3, its min m in bits 4-7
    16      64     qs      2-bit codes, 32 bytes per 128 values (see module docstring)
    80      2      d       fp16 super-scale of sc
    82      2      dmin    fp16 super-scale of m

    x = (d * sc) * q - (dmin * m)
    """
    B = blocks.shape[0]
    scales = blocks[:, 0:16]  # [B, 16]
    d, dmin = _f16(blocks[:, 80:82]), _f16(blocks[:, 82:84])  # [B, 1]
    dl = (d * (scales & 0x0F).astype(np.float32))[:, :, None]  # [B, 16, 1]
    ml = (dmin * (scales >> 4).astype(np.float32))[:, :, None]  # [B, 16, 1]
    q = _crumbs(blocks[:, 16:80]).reshape(B, 16, 16).astype(np.float32)
    return (dl * q - ml).reshape(B, QK_K)


def dequantize_q3_k(blocks: np.ndarray) -> np.ndarray:  # [B, 110] uint8 -> [B, 256] f32
    """Q3_K: 3-bit codes, 16 sub-blocks of 16 with a 6-bit scale (3.4375 bits per value).

    offset  bytes  field   meaning
    0       32     hmask   bit k of byte l: third bit of value 32k + l; SET means q >= 0
    32      64     qs      low 2 bits of the codes, 32 bytes per 128 values (module docstring)
    96      12     scales  sixteen 6-bit scales: low 4 bits of sc[i] are nibble i//8 of byte i%8,
                           high 2 bits are bits 2(i//4)..2(i//4)+1 of byte 8 + i%4
    108     2      d       fp16 super-scale

    q = low2 - (0 if hmask bit else 4), in -4..3;   x = (d * (sc - 32)) * q
    The inverted hmask (a set bit *removes* the -4) is ggml's; it is easy to read backwards.
    """
    B = blocks.shape[0]
    hmask, scales = blocks[:, 0:32], blocks[:, 96:108]
    d = _f16(blocks[:, 108:110])  # [B, 1]
    low4 = (scales[:, 0:8, None] >> np.array([0, 4], dtype=np.uint8)) & 0x0F  # [B, 8, 2]
    low4 = low4.transpose(0, 2, 1).reshape(B, 16)  # sc[i] low bits from byte i % 8
    high2 = (scales[:, None, 8:12] >> np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]) & 3  # [B, 4, 4]
    sc = (low4 | (high2.reshape(B, 16) << 4)).astype(np.int8) - 32  # [B, 16] in -32..31
    dl = (d * sc.astype(np.float32))[:, :, None]  # [B, 16, 1]
    third = (hmask[:, None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1  # [B, 8, 32]
    q = _crumbs(blocks[:, 32:96]).astype(np.int8) - 4 * (1 - third.reshape(B, QK_K).astype(np.int8))
    return (dl * q.reshape(B, 16, 16).astype(np.float32)).reshape(B, QK_K)


def dequantize_q4_k(blocks: np.ndarray) -> np.ndarray:  # [B, 144] uint8 -> [B, 256] f32
    """Q4_K: 4-bit codes, 8 sub-blocks of 32 with 6-bit scale and min (4.5 bits per value).

    offset  bytes  field   meaning
    0       2      d       fp16 super-scale of sc
    2       2      dmin    fp16 super-scale of m
    4       12     scales  eight 6-bit sc and eight 6-bit m (table in _unpack_scale_min)
    16      128    qs      byte 32c + l: sub-block 2c value l in bits 0-3, sub-block 2c+1 in 4-7

    x = (d * sc) * q - (dmin * m)
    """
    B = blocks.shape[0]
    d, dmin = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])  # [B, 1]
    sc, m = _unpack_scale_min(blocks[:, 4:16])  # [B, 8]
    dl = (d * sc.astype(np.float32))[:, :, None]  # [B, 8, 1]
    ml = (dmin * m.astype(np.float32))[:, :, None]  # [B, 8, 1]
    q = _nibbles(blocks[:, 16:144]).astype(np.float32)  # [B, 8, 32]
    return (dl * q - ml).reshape(B, QK_K)


def dequantize_q5_k(blocks: np.ndarray) -> np.ndarray:  # [B, 176] uint8 -> [B, 256] f32
    """Q5_K: 5-bit codes, 8 sub-blocks of 32 with 6-bit scale and min (5.5 bits per value).

    offset  bytes  field   meaning
    0       2      d       fp16 super-scale of sc
    2       2      dmin    fp16 super-scale of m
    4       12     scales  eight 6-bit sc and eight 6-bit m (table in _unpack_scale_min)
    16      32     qh      bit j of byte l: fifth bit (weight 16) of value l of sub-block j
    48      128    qs      low 4 bits, laid out as Q4_K's qs

    x = (d * sc) * q - (dmin * m)
    """
    B = blocks.shape[0]
    d, dmin = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])  # [B, 1]
    sc, m = _unpack_scale_min(blocks[:, 4:16])  # [B, 8]
    dl = (d * sc.astype(np.float32))[:, :, None]  # [B, 8, 1]
    ml = (dmin * m.astype(np.float32))[:, :, None]  # [B, 8, 1]
    fifth = (blocks[:, None, 16:48] >> np.arange(8, dtype=np.uint8)[:, None]) & 1  # [B, 8, 32]
    q = (_nibbles(blocks[:, 48:176]) | (fifth << 4)).astype(np.float32)  # [B, 8, 32]
    return (dl * q - ml).reshape(B, QK_K)


def dequantize_q6_k(blocks: np.ndarray) -> np.ndarray:  # [B, 210] uint8 -> [B, 256] f32
    """Q6_K: 6-bit codes, 16 sub-blocks of 16 with an int8 scale (6.5625 bits per value).

    offset  bytes  field   meaning
    0       128    ql      low 4 bits; per 128 values h, byte 64h + l holds value l (bits 0-3)
                           and 64 + l (bits 4-7), byte 64h + 32 + l holds 32 + l and 96 + l
    128     64     qh      high 2 bits; byte 32h + l holds values l, 32+l, 64+l, 96+l in bit
                           pairs 0-1, 2-3, 4-5, 6-7
    192     16     scales  int8 scale sc of each 16-value sub-block
    208     2      d       fp16 super-scale

    q = (low4 | high2 << 4) - 32, in -32..31;   x = (d * sc) * q
    """
    B = blocks.shape[0]
    ql, qh = blocks[:, 0:128].reshape(B, 2, 2, 32), blocks[:, 128:192].reshape(B, 2, 1, 32)
    sc = blocks[:, 192:208].view(np.int8).astype(np.float32)  # [B, 16]
    d = _f16(blocks[:, 208:210])  # [B, 1]
    low4 = np.concatenate([ql & 0x0F, ql >> 4], axis=2)  # [B, 2, 4, 32]
    high2 = (qh >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 3  # [B, 2, 4, 32]
    q = (low4 | (high2 << 4)).astype(np.int8) - 32
    return ((d * sc)[:, :, None] * q.reshape(B, 16, 16).astype(np.float32)).reshape(B, QK_K)


# ---------------------------------------------------------------------------------------------
# Quantizers: ggml's reference quantizers (quantize_row_q4_K_ref, _q5_K_ref, _q6_K_ref), vectorized
# over sub-blocks and super-blocks. Two levels of fitting:
#   1. every sub-block gets a float scale (and min) by a small least-squares search over grids;
#   2. those floats are quantized against the super-block's largest one (6 or 8 bits), and the
#      codes are recomputed from the scales actually stored. Where a stored scale is 0, ggml keeps
#      the level-1 codes (the value is then the same for any code), so we keep them too.
# The search compares near-equal float errors, so sums run left to right like ggml's C loops.


def _sum(a: np.ndarray) -> np.ndarray:  # [S, n] -> [S, 1]
    """Left-to-right f32 sum, as a C loop does. np.sum adds pairwise, which can change the last bit
    of an error and so flip which grid wins; with this sum the bytes equal ggml's."""
    return np.cumsum(a, axis=-1)[:, -1:]


def _fit_scale_min(x, weights, nmax, rmin, rdelta, nstep):  # [S, n] f32 -> [S], [S], [S, n]
    """Fit x ~= scale * L + low, L in 0..nmax, low <= 0, minimizing the weighted squared error.

    ggml make_qkx2_quants: start from the grid of nmax steps spanning [low, hi] (low = min(x, 0),
    hi = max(x)), then try nstep + 1 stretched grids of nmax + rmin + rdelta * i steps; for each,
    round to get L and solve the 2x2 weighted least squares for (scale, low); keep the best.
    Like ggml, each grid spans [current best low, hi], so the grids move as the fit improves.
    A positive offset is not representable, so a fit that wants one is refit through zero.
    Returns (scale, the_min, L) with the_min = -low >= 0.
    """
    hi = x.max(axis=-1, keepdims=True)  # [S, 1]
    low = np.minimum(x.min(axis=-1, keepdims=True), 0)  # [S, 1]
    flat = hi == low  # all zero, or constant <= 0: scale 0, the_min = -low, L = 0

    def grid(steps, low):  # codes of x on `steps` steps from low to hi -> [S, n] f32
        iscale = steps / np.where(flat, 1, hi - low)
        return np.where(flat, 0, np.clip(np.rint(iscale * (x - low)), 0, nmax))

    def weighted_error(scale, low, L):  # -> [S, 1]
        return _sum(weights * (scale * L + low - x) ** 2)

    L = grid(np.float32(nmax), low)
    scale = np.where(flat, 0, np.float32(1) / (np.float32(nmax) / np.where(flat, 1, hi - low)))
    best_error = weighted_error(scale, low, L)
    sum_w, sum_x = _sum(weights), _sum(weights * x)
    for i in range(nstep + 1):
        this_L = grid(np.float32(rmin) + np.float32(rdelta) * np.float32(i) + np.float32(nmax), low)
        sum_l, sum_l2 = _sum(weights * this_L), _sum(weights * this_L * this_L)
        sum_xl = _sum(weights * this_L * x)
        det = sum_w * sum_l2 - sum_l * sum_l
        solvable = det > 0
        det = np.where(solvable, det, 1)
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
        this_low = (sum_l2 * sum_x - sum_l * sum_xl) / det
        through_zero = this_low > 0
        this_scale = np.where(through_zero, sum_xl / np.where(sum_l2 > 0, sum_l2, 1), this_scale)
        this_low = np.where(through_zero, 0, this_low)
        error = weighted_error(this_scale, this_low, this_L)
        better = solvable & (error < best_error)  # [S, 1]
        L = np.where(better, this_L, L)
        scale, low = np.where(better, this_scale, scale), np.where(better, this_low, low)
        best_error = np.where(better, error, best_error)
    return scale[:, 0].astype(np.float32), (-low[:, 0]).astype(np.float32), L


def _quantize_scale_min_k(x: np.ndarray, nmax: int, rmin: float, nstep: int):  # [B, 256] f32
    """Q4_K and Q5_K: returns d, dmin [B, 2] fp16 bytes, packed scales [B, 12], codes L [B, 8, 32]."""
    B = x.shape[0]
    sub = x.reshape(B * 8, 32)  # [S, 32]
    # ggml weights each value by rms(sub-block) + |x|: big values matter more, none count zero.
    weights = np.sqrt(_sum(sub * sub) / np.float32(32)) + np.abs(sub)
    scale, the_min, L_fit = _fit_scale_min(sub, weights, nmax, rmin, 0.1, nstep)
    scale, the_min = scale.reshape(B, 8), the_min.reshape(B, 8)

    # Level 2: 6-bit multiples of d = max_scale / 63 and dmin = max_min / 63 (maxima start at +0).
    max_scale, max_min = scale.max(axis=-1, keepdims=True), the_min.max(axis=-1, keepdims=True)
    max_scale = np.where(max_scale > 0, max_scale, 0)  # [B, 1]; +0, never the -0 of an all-zero fit
    max_min = np.where(max_min > 0, max_min, 0)
    with np.errstate(divide="ignore"):
        inv_scale = np.where(max_scale > 0, np.float32(63) / max_scale, 0)
        inv_min = np.where(max_min > 0, np.float32(63) / max_min, 0)
    sc = np.clip(np.rint(inv_scale * scale), 0, 63).astype(np.uint8)  # [B, 8]
    m = np.clip(np.rint(inv_min * the_min), 0, 63).astype(np.uint8)
    d = (max_scale / np.float32(63)).astype("<f2")  # [B, 1]
    dmin = (max_min / np.float32(63)).astype("<f2")

    # Codes from the stored scales: q = round((x + dmin*m) / (d*sc)).
    dl = (d.astype(np.float32) * sc)[:, :, None]  # [B, 8, 1]
    ml = (dmin.astype(np.float32) * m)[:, :, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        L = np.clip(np.rint((x.reshape(B, 8, 32) + ml) / dl), 0, nmax)
    L = np.where(dl == 0, L_fit.reshape(B, 8, 32), L).astype(np.uint8)  # [B, 8, 32]
    return d.view(np.uint8), dmin.view(np.uint8), _pack_scale_min(sc, m), L


def quantize_q4_k(x: np.ndarray) -> np.ndarray:  # [B, 256] f32 -> [B, 144] uint8
    """Q4_K as ggml quantize_row_q4_K_ref: 4-bit codes, grids of 14.0, 14.1, ... 16.0 steps."""
    d, dmin, scales, L = _quantize_scale_min_k(x.astype(np.float32), nmax=15, rmin=-1.0, nstep=20)
    qs = (L[:, 0::2] | (L[:, 1::2] << 4)).reshape(-1, 128)  # sub-blocks (0,1), (2,3), ...
    return np.concatenate([d, dmin, scales, qs], axis=-1)


def quantize_q5_k(x: np.ndarray) -> np.ndarray:  # [B, 256] f32 -> [B, 176] uint8
    """Q5_K as ggml quantize_row_q5_K_ref: 5-bit codes, grids of 30.5, 30.6, ... 32.0 steps."""
    d, dmin, scales, L = _quantize_scale_min_k(x.astype(np.float32), nmax=31, rmin=-0.5, nstep=15)
    low4 = L & 0x0F
    qs = (low4[:, 0::2] | (low4[:, 1::2] << 4)).reshape(-1, 128)
    qh = np.bitwise_or.reduce((L >> 4) << np.arange(8, dtype=np.uint8)[:, None], axis=1)  # [B, 32]
    return np.concatenate([d, dmin, scales, qh, qs], axis=-1)


def _fit_signed_scale(x: np.ndarray, nmax: int):  # [S, n] f32 -> [S], [S, n] codes 0..2*nmax-1
    """Fit x ~= scale * l, l in -nmax..nmax-1, weighting each value by x**2 (ggml make_qx_quants
    with rmse_type 1). Returns scale and the codes L = l + nmax.

    The value of largest magnitude, `peak`, goes to l = -nmax (the asymmetric end of the range), so
    scale ~= -peak / nmax has the opposite sign of peak. 18 slightly stretched grids (nmax +- 0.1 k
    levels) are tried around that, each scored by its least-squares gain sum_xl**2 / sum_l2.
    An all-zero sub-block gets scale 0 and codes 0.
    """
    peak = np.take_along_axis(x, np.abs(x).argmax(axis=-1)[:, None], axis=-1)  # [S, 1]
    zero = np.abs(peak) < 1e-15
    peak = np.where(zero, 1, peak)
    w = x * x

    def fit(levels):  # -> codes l [S, n], sum_xl [S, 1], sum_l2 [S, 1]
        l = np.clip(np.rint((-levels / peak) * x), -nmax, nmax - 1)
        return l, _sum(w * x * l), _sum(w * l * l)

    l, sum_xl, sum_l2 = fit(np.float32(nmax))
    scale = np.where(sum_l2 > 0, sum_xl / np.where(sum_l2 > 0, sum_l2, 1), 0)
    best = scale * sum_xl  # the gain sum_xl**2 / sum_l2, compared cross-multiplied as ggml does
    for step in [k for k in range(-9, 10) if k != 0]:
        this_l, sum_xl, sum_l2 = fit(np.float32(nmax) + np.float32(0.1) * np.float32(step))
        better = (sum_l2 > 0) & (sum_xl * sum_xl > best * sum_l2)  # [S, 1]
        l = np.where(better, this_l, l)
        scale = np.where(better, sum_xl / np.where(sum_l2 > 0, sum_l2, 1), scale)
        best = np.where(better, scale * sum_xl, best)
    L = np.where(zero, 0, l + nmax)
    return np.where(zero, 0, scale)[:, 0].astype(np.float32), L


def quantize_q6_k(x: np.ndarray) -> np.ndarray:  # [B, 256] f32 -> [B, 210] uint8
    """Q6_K as ggml quantize_row_q6_K_ref: signed 6-bit codes, int8 sub-block scales.

    Level 2 reuses the asymmetric trick: the sub-block scale of largest magnitude becomes -128,
    so d = -max_scale / 128 and every other int8 scale lands in -128..127. A super-block whose
    scales are all ~0 is stored as all zero bytes.
    """
    B = x.shape[0]
    x = x.astype(np.float32)
    scale, L_fit = _fit_signed_scale(x.reshape(B * 16, 16), nmax=32)
    scale = scale.reshape(B, 16)  # [B, 16]
    max_scale = np.take_along_axis(scale, np.abs(scale).argmax(axis=-1)[:, None], axis=-1)  # [B, 1]
    empty = np.abs(max_scale) < 1e-15
    iscale = np.float32(-128) / np.where(empty, 1, max_scale)
    sc = np.clip(np.rint(iscale * scale), -128, 127).astype(np.int8)  # [B, 16]
    d = (np.float32(1) / iscale).astype("<f2")  # [B, 1]

    dl = (d.astype(np.float32) * sc)[:, :, None]  # [B, 16, 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        L = np.clip(np.rint(x.reshape(B, 16, 16) / dl), -32, 31) + 32
    L = np.where(dl == 0, L_fit.reshape(B, 16, 16), L).astype(np.uint8).reshape(B, 2, 4, 32)
    low4, high2 = L & 0x0F, L >> 4  # [B, half, quarter, 32]
    ql = (low4[:, :, 0:2] | (low4[:, :, 2:4] << 4)).reshape(B, 128)
    qh = np.bitwise_or.reduce(high2 << np.array([0, 2, 4, 6], dtype=np.uint8)[:, None], axis=2)
    packed = np.concatenate([ql, qh.reshape(B, 64), sc.view(np.uint8), d.view(np.uint8)], axis=-1)
    return np.where(empty, 0, packed).astype(np.uint8)


DEQUANT = {
    GGMLType.Q2_K: dequantize_q2_k,
    GGMLType.Q3_K: dequantize_q3_k,
    GGMLType.Q4_K: dequantize_q4_k,
    GGMLType.Q5_K: dequantize_q5_k,
    GGMLType.Q6_K: dequantize_q6_k,
}
QUANTIZE = {
    GGMLType.Q4_K: quantize_q4_k,
    GGMLType.Q5_K: quantize_q5_k,
    GGMLType.Q6_K: quantize_q6_k,
}
