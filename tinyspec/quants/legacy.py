"""Legacy 32-value block quants: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.

Every block holds 32 consecutive values of a row and one fp16 scale `d` (plus an fp16 offset `m` in
the `_1` types). The integer codes q are unsigned n-bit numbers; the symmetric `_0` types subtract
the midpoint, the `_1` types add the offset instead:

    Q4_0   x = d * (q - 8)      q in 0..15          Q4_1   x = d * q + m      q in 0..15
    Q5_0   x = d * (q - 16)     q in 0..31          Q5_1   x = d * q + m      q in 0..31
    Q8_0   x = d * q            q in -128..127 (int8)

Nibble order: byte j of `qs` holds value j in its low nibble and value j + 16 in its high nibble
(the first half of the block in low nibbles, the second half in high nibbles). In Q5_* the fifth
bit of value j is bit j of `qh` read as a little-endian uint32.

Bit-exactness: d and m are widened fp16 -> f32 first, then the product is one f32 multiply of d
by the (exact) float code, then one f32 add of m, never fused. That is gguf-py's order, and ggml's
scalar `dequantize_row_*` when the C compiler does not contract it into an FMA.

Official implementation: ggml `ggml-common.h` block_q4_0 .. block_q8_0, `ggml-quants.c`
dequantize_row_q4_0 .. q8_0 and quantize_row_q4_0_ref / q5_0_ref / q5_1_ref / q8_0_ref; gguf-py `quants.py`.
Does NOT include: a quantizer for Q4_1 (files we read carry it only as weights to load).
"""

from __future__ import annotations

import numpy as np

from .types import GGMLType

QK = 32  # values per legacy block


def _f16(field: np.ndarray) -> np.ndarray:  # [B, 2] uint8 -> [B, 1] f32
    return field.view("<f2").astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:  # [B, 16] uint8 -> [B, 32] uint8 codes 0..15
    """Low nibbles are values 0..15 of the block, high nibbles values 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:  # [B, 4] uint8 -> [B, 32] uint8 in {0, 16}
    """Bit j of the little-endian uint32 `qh`, placed at weight 16, for value j."""
    return np.unpackbits(qh, axis=-1, bitorder="little") << 4


def dequantize_q4_0(blocks: np.ndarray) -> np.ndarray:  # [B, 18] uint8 -> [B, 32] f32
    """Q4_0: 4-bit codes around 8, one fp16 scale per 32 values (4.5 bits per value).

    offset  bytes  field  meaning
    0       2      d      fp16 scale
    2       16     qs     byte j: value j in bits 0-3, value j+16 in bits 4-7

    x = d * (q - 8)
    """
    d = _f16(blocks[:, 0:2])  # [B, 1]
    q = _nibbles(blocks[:, 2:18]).astype(np.int8) - 8  # [B, 32] in -8..7
    return d * q.astype(np.float32)


def dequantize_q4_1(blocks: np.ndarray) -> np.ndarray:  # [B, 20] uint8 -> [B, 32] f32
    """Q4_1: 4-bit codes with an fp16 scale and an fp16 offset per 32 values (5 bits per value).

    offset  bytes  field  meaning
    0       2      d      fp16 scale
    2       2      m      fp16 offset (the block minimum)
    4       16     qs     byte j: value j in bits 0-3, value j+16 in bits 4-7

    x = d * q + m
    """
    d = _f16(blocks[:, 0:2])  # [B, 1]
    m = _f16(blocks[:, 2:4])  # [B, 1]
    q = _nibbles(blocks[:, 4:20]).astype(np.float32)  # [B, 32] in 0..15
    return d * q + m


def dequantize_q5_0(blocks: np.ndarray) -> np.ndarray:  # [B, 22] uint8 -> [B, 32] f32
    """Q5_0: 5-bit codes around 16, one fp16 scale per 32 values (5.5 bits per value).

    offset  bytes  field  meaning
    0       2      d      fp16 scale
    2       4      qh     little-endian uint32: bit j is the fifth bit (weight 16) of value j
    6       16     qs     byte j: low 4 bits of value j in bits 0-3, of value j+16 in bits 4-7

    x = d * (q - 16)
    """
    d = _f16(blocks[:, 0:2])  # [B, 1]
    q = _nibbles(blocks[:, 6:22]) | _fifth_bits(blocks[:, 2:6])  # [B, 32] in 0..31
    return d * (q.astype(np.int8) - 16).astype(np.float32)


def dequantize_q5_1(blocks: np.ndarray) -> np.ndarray:  # [B, 24] uint8 -> [B, 32] f32
    """Q5_1: 5-bit codes with an fp16 scale and an fp16 offset per 32 values (6 bits per value).

    offset  bytes  field  meaning
    0       2      d      fp16 scale
    2       2      m      fp16 offset (the block minimum)
    4       4      qh     little-endian uint32: bit j is the fifth bit (weight 16) of value j
    8       16     qs     byte j: low 4 bits of value j in bits 0-3, of value j+16 in bits 4-7

    x = d * q + m
    """
    d = _f16(blocks[:, 0:2])  # [B, 1]
    m = _f16(blocks[:, 2:4])  # [B, 1]
    q = _nibbles(blocks[:, 8:24]) | _fifth_bits(blocks[:, 4:8])  # [B, 32] in 0..31
    return d * q.astype(np.float32) + m


def dequantize_q8_0(blocks: np.ndarray) -> np.ndarray:  # [B, 34] uint8 -> [B, 32] f32
    """Q8_0: int8 codes, one fp16 scale per 32 values (8.5 bits per value).

    offset  bytes  field  meaning
    0       2      d      fp16 scale
    2       32     qs     int8 code of value j at byte 2 + j

    x = d * q
    """
    d = _f16(blocks[:, 0:2])  # [B, 1]
    q = blocks[:, 2:34].view(np.int8).astype(np.float32)  # [B, 32]
    return d * q


# ---------------------------------------------------------------------------------------------
# Quantizers. Both reproduce ggml's reference (`quantize_row_*_ref`) bit for bit: the scale and its
# inverse are computed in f32 from the block's extreme value, the codes from x * (1/d) in f32
# (the unrounded f32 d, not the stored fp16 one), and only then is d rounded to fp16.


def _inverse(d: np.ndarray) -> np.ndarray:  # [B, 1] f32 -> [B, 1] f32, 1/d or 0 where d == 0
    with np.errstate(divide="ignore"):
        return np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)


def _round_half_away(v: np.ndarray) -> np.ndarray:  # f32 -> f64 integers, C roundf
    """C `roundf`: halves go away from zero (np.rint would send 2.5 to 2).

    The + 0.5 happens in f64, where it is exact for any f32 input, so 0.49999997 stays below 1/2.
    """
    return np.copysign(np.floor(np.abs(v.astype(np.float64)) + 0.5), v)


def quantize_q8_0(x: np.ndarray) -> np.ndarray:  # [B, 32] f32 -> [B, 34] uint8
    """d = max|x| / 127, q = round(x / d) (ties away from zero), as ggml quantize_row_q8_0_ref."""
    x = x.astype(np.float32)
    d = np.abs(x).max(axis=-1, keepdims=True) / np.float32(127)  # [B, 1]
    q = _round_half_away(x * _inverse(d)).astype(np.int8)  # [B, 32]
    return np.concatenate([d.astype("<f2").view(np.uint8), q.view(np.uint8)], axis=-1)


def quantize_q4_0(x: np.ndarray) -> np.ndarray:  # [B, 32] f32 -> [B, 18] uint8
    """d = -(signed value of largest magnitude) / 8, so that value lands exactly on code 0 (= -8d).

    The sign trick uses the whole asymmetric range -8..7: the extreme value gets -8, everything
    else fits in -8..7 after rounding. Codes are trunc(x / d + 8.5) clamped to 15 (ggml's
    quantize_row_q4_0_ref; the first index of the largest |x| wins ties, as in its loop).
    The one input we know where gguf-py and ggml differ: an all-zero block whose first zero is
    -0.0 (gguf-py stores d = +0.0, ggml d = -0.0); we follow ggml.
    """
    x = x.astype(np.float32)
    i_max = np.abs(x).argmax(axis=-1)[:, None]  # [B, 1]
    peak = np.take_along_axis(x, i_max, axis=-1)  # [B, 1]
    # An all-zero block keeps ggml's starting +0 even if it holds -0s, so d = +0 / -8 = -0.
    peak = np.where(peak == 0, np.float32(0), peak)
    d = peak / np.float32(-8)  # [B, 1]
    q = np.trunc(x * _inverse(d) + np.float32(8.5))  # [B, 32] f32, in 0..16
    q = np.minimum(q, 15).astype(np.uint8)
    qs = q[:, :16] | (q[:, 16:] << 4)  # [B, 16]
    return np.concatenate([d.astype("<f2").view(np.uint8), qs], axis=-1)


def _pack_five_bits(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # [B, 32] codes 0..31 -> qh [B, 4], qs [B, 16]
    """The Q5_* code fields: the fifth bits as a little-endian uint32 (bit j = value j), the low nibbles as in Q4_0."""
    qh = np.packbits(q >> 4, axis=-1, bitorder="little")  # [B, 4]
    low = q & 0x0F
    return qh, low[:, :16] | (low[:, 16:] << 4)


def quantize_q5_0(x: np.ndarray) -> np.ndarray:  # [B, 32] f32 -> [B, 22] uint8
    """Q4_0's sign trick with 5 bits: d = -peak / 16, codes trunc(x / d + 16.5) clamped to 31 (ggml's
    quantize_row_q5_0_ref; the fallback llama-quantize takes for a Q4_K row that is not a multiple of 256)."""
    x = x.astype(np.float32)
    peak = np.take_along_axis(x, np.abs(x).argmax(axis=-1)[:, None], axis=-1)  # [B, 1]
    peak = np.where(peak == 0, np.float32(0), peak)  # an all-zero block: d = +0 / -16 = -0, as in Q4_0
    d = peak / np.float32(-16)  # [B, 1]
    q = np.minimum(np.trunc(x * _inverse(d) + np.float32(16.5)), 31).astype(np.uint8)  # [B, 32]
    qh, qs = _pack_five_bits(q)
    return np.concatenate([d.astype("<f2").view(np.uint8), qh, qs], axis=-1)


def quantize_q5_1(x: np.ndarray) -> np.ndarray:  # [B, 32] f32 -> [B, 24] uint8
    """m = block minimum, d = (max - m) / 31, codes trunc((x - m) / d + 0.5) (ggml's quantize_row_q5_1_ref;
    llama-quantize's fallback for a Q5_K row that is not a multiple of 256)."""
    x = x.astype(np.float32)
    low, high = x.min(axis=-1, keepdims=True), x.max(axis=-1, keepdims=True)  # [B, 1]
    d = (high - low) / np.float32(31)
    q = np.minimum(np.trunc((x - low) * _inverse(d) + np.float32(0.5)), 31).astype(np.uint8)  # [B, 32]
    qh, qs = _pack_five_bits(q)
    return np.concatenate([d.astype("<f2").view(np.uint8), low.astype("<f2").view(np.uint8), qh, qs], axis=-1)


DEQUANT = {
    GGMLType.Q4_0: dequantize_q4_0,
    GGMLType.Q4_1: dequantize_q4_1,
    GGMLType.Q5_0: dequantize_q5_0,
    GGMLType.Q5_1: dequantize_q5_1,
    GGMLType.Q8_0: dequantize_q8_0,
}
QUANTIZE = {
    GGMLType.Q4_0: quantize_q4_0,
    GGMLType.Q5_0: quantize_q5_0,
    GGMLType.Q5_1: quantize_q5_1,
    GGMLType.Q8_0: quantize_q8_0,
}
