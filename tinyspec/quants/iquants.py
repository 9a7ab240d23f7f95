"""I-quants: values drawn from lattice codebooks ("grids") or a non-uniform 4-bit code, 1.56 to 4.5 bits/weight.

An IQ2/IQ3/IQ1 block stores no per-value numbers. It stores, for every group of 8 (or 4) values, an INDEX
into a fixed grid of codewords (magnitudes only), plus sign bits and a few small per-sub-block scales:

    value = d * scale(s) * grid[index][k] * sign[k]        (IQ2_*, IQ3_*)
    value = d * (2 s + 1) * (grid[index][k] + delta)       (IQ1_*: grid in {-1, 0, 1}, delta = +-1/8)
    value = d * kvalues[q]                                 (IQ4_*: a 16-level non-uniform 4-bit code)

    type     bytes  bits/w  grid (codewords x width)  scale of a sub-block     sign bits
    IQ2_XXS   66    2.06    IQ2XXS_GRID 256 x 8       (0.5 + s4) / 4, per 32   7-bit index into KSIGNS
    IQ2_XS    74    2.31    IQ2XS_GRID  512 x 8       (0.5 + s4) / 4, per 16   7-bit index into KSIGNS
    IQ2_S     82    2.56    IQ2S_GRID  1024 x 8       (0.5 + s4) / 4, per 16   8 explicit bits
    IQ3_XXS   98    3.06    IQ3XXS_GRID 256 x 4       (0.5 + s4) / 2, per 32   7-bit index into KSIGNS
    IQ3_S    110    3.44    IQ3S_GRID   512 x 4       1 + 2 s4, per 32         8 explicit bits
    IQ1_S     50    1.56    IQ1S_GRID  2048 x 8       2 s3 + 1, per 32         none (delta sign bit)
    IQ1_M     56    1.75    IQ1S_GRID  2048 x 8       2 s3 + 1, per 16         none (delta sign bit)
    IQ4_NL    18    4.50    KVALUES_IQ4NL (16)        none (32-value blocks)   in the level
    IQ4_XS   136    4.25    KVALUES_IQ4NL (16)        s6 - 32, per 32          in the level

d is an fp16 super-block scale (IQ1_M scatters its 16 bits over the high nibbles of `scales`). KSIGNS turns
7 stored sign bits into 8 by making the number of minus signs even, which saves a bit per 8 values.
The tables live in iq_grids.py (generated from ggml-common.h). Glossary: B blocks, G sub-blocks of 32 values.

Every product here is exact in float32: an fp16 d has at most 11 significant bits, a sub-block scale at
most 5 and a grid level or kvalue at most 7, so no product needs more than 23 of float32's 24 bits. The
result does not depend on the order of the multiplications (we still follow ggml's), only inf/NaN d would.

Official implementation: ggml `ggml-quants.c` dequantize_row_iq*, block_iq* in `ggml-common.h`;
gguf-py `gguf/quants.py` (our bit-exact test oracle). Does NOT include: quantizers (they need ggml's
importance-weighted lattice search; these types are only read here).
"""

from __future__ import annotations

import numpy as np

from .iq_grids import IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS, KVALUES_IQ4NL
from .types import GGMLType

IQ1_DELTA = np.float32(0.125)  # ggml IQ1S_DELTA / IQ1M_DELTA: shifts the {-1, 0, 1} grid off zero


def _f16(raw: np.ndarray) -> np.ndarray:  # [B, 2] uint8 -> [B, 1] f32
    return np.ascontiguousarray(raw).view("<f2").astype(np.float32)


def _u16(raw: np.ndarray) -> np.ndarray:  # [B, 2n] uint8 -> [B, n] uint16 (little-endian)
    return np.ascontiguousarray(raw).view("<u2")


def _u32(raw: np.ndarray) -> np.ndarray:  # [B, 4n] uint8 -> [B, n] uint32 (little-endian)
    return np.ascontiguousarray(raw).view("<u4")


def _signs(sign_bytes: np.ndarray) -> np.ndarray:  # [...] uint8 -> [..., 8] f32
    """Bit k of each byte set -> element k is -1, else +1."""
    bits = np.unpackbits(sign_bytes[..., None], axis=-1, bitorder="little")
    return np.where(bits == 1, np.float32(-1), np.float32(1))


def _ksigns(aux: np.ndarray) -> np.ndarray:  # [B, G] uint32 -> [B, G, 4, 8] f32
    """Bits 0-27 of a uint32 = four 7-bit sign indices (one per 8 values), expanded through KSIGNS."""
    index = (aux[..., None] >> np.array([0, 7, 14, 21], dtype=np.uint32)) & 0x7F  # [B, G, 4]
    return _signs(KSIGNS[index])


def dequantize_iq2_xxs(blocks: np.ndarray) -> np.ndarray:  # [B, 66] uint8 -> [B, 256] f32
    """IQ2_XXS, 2.06 bits/weight.

    offset bytes field  meaning
    0      2     d      fp16 super-block scale
    2      64    qs     8 sub-blocks of 32 values, 8 bytes each:
                          bytes 0-3  four uint8 indices into IQ2XXS_GRID, one per 8 values
                          bytes 4-7  uint32: bits 0-27 four 7-bit KSIGNS indices, bits 28-31 the scale s

    value = d * (0.5 + s) * 0.25 * IQ2XXS_GRID[index][k] * sign[k]
    """
    B = blocks.shape[0]
    d = _f16(blocks[:, 0:2])  # [B, 1]
    qs = blocks[:, 2:66].reshape(B, 8, 8)  # [B, G, 8]
    index = qs[:, :, 0:4]  # [B, G, 4]
    aux = _u32(qs[:, :, 4:8].reshape(B, 32))  # [B, G]
    db = d * (0.5 + (aux >> 28).astype(np.float32)) * 0.25  # [B, G]
    values = db[:, :, None, None] * IQ2XXS_GRID[index] * _ksigns(aux)  # [B, G, 4, 8]
    return values.reshape(B, 256)


def dequantize_iq2_xs(blocks: np.ndarray) -> np.ndarray:  # [B, 74] uint8 -> [B, 256] f32
    """IQ2_XS, 2.31 bits/weight.

    offset bytes field   meaning
    0      2     d       fp16 super-block scale
    2      64    qs      32 uint16, one per 8 values: bits 0-8 index into IQ2XS_GRID, bits 9-15 KSIGNS index
    66     8     scales  one byte per 32 values: low nibble = s of the first 16, high nibble = s of the last 16

    value = d * (0.5 + s) * 0.25 * IQ2XS_GRID[index][k] * sign[k]
    """
    B = blocks.shape[0]
    d = _f16(blocks[:, 0:2])  # [B, 1]
    qs = _u16(blocks[:, 2:66]).reshape(B, 8, 4)  # [B, G, 4]
    scales = blocks[:, 66:74]  # [B, G]
    s = np.stack([scales & 0x0F, scales >> 4], axis=-1).astype(np.float32)  # [B, G, 2] one per 16 values
    db = d[:, :, None] * (0.5 + s) * 0.25  # [B, G, 2]
    db = np.repeat(db, 2, axis=-1)  # [B, G, 4] one per 8 values
    grid = IQ2XS_GRID[qs & 0x1FF]  # [B, G, 4, 8]
    signs = _signs(KSIGNS[qs >> 9])  # [B, G, 4, 8]
    return (db[..., None] * grid * signs).reshape(B, 256)


def dequantize_iq2_s(blocks: np.ndarray) -> np.ndarray:  # [B, 82] uint8 -> [B, 256] f32
    """IQ2_S, 2.56 bits/weight.

    offset bytes field   meaning
    0      2     d       fp16 super-block scale
    2      32    qs      low 8 bits of 32 indices into IQ2S_GRID, one per 8 values
    34     32    signs   one byte per 8 values, bit k set = element k negative
    66     8     qh      one byte per 32 values: bits 2l, 2l+1 = index bits 8-9 of its l-th group of 8
    74     8     scales  one byte per 32 values: low nibble = s of the first 16, high nibble = s of the last 16

    value = d * (0.5 + s) * 0.25 * IQ2S_GRID[index][k] * sign[k]
    """
    B = blocks.shape[0]
    d = _f16(blocks[:, 0:2])  # [B, 1]
    qs = blocks[:, 2:34].reshape(B, 8, 4).astype(np.uint16)  # [B, G, 4]
    signs = _signs(blocks[:, 34:66].reshape(B, 8, 4))  # [B, G, 4, 8]
    qh = blocks[:, 66:74]  # [B, G]
    scales = blocks[:, 74:82]  # [B, G]
    high = (qh[..., None] >> np.array([0, 2, 4, 6], dtype=np.uint8)) & 0x03  # [B, G, 4]
    index = qs | high.astype(np.uint16) << 8  # [B, G, 4] 10-bit
    s = np.stack([scales & 0x0F, scales >> 4], axis=-1).astype(np.float32)  # [B, G, 2]
    db = np.repeat(d[:, :, None] * (0.5 + s) * 0.25, 2, axis=-1)  # [B, G, 4]
    return (db[..., None] * IQ2S_GRID[index] * signs).reshape(B, 256)


def dequantize_iq3_xxs(blocks: np.ndarray) -> np.ndarray:  # [B, 98] uint8 -> [B, 256] f32
    """IQ3_XXS, 3.06 bits/weight. The grid codewords are 4 wide, so each group of 8 values uses two.

    offset bytes field   meaning
    0      2     d       fp16 super-block scale
    2      64    qs      uint8 indices into IQ3XXS_GRID, one per 4 values (8 per 32 values)
    66     32    aux     8 uint32, one per 32 values: bits 0-27 four 7-bit KSIGNS indices, bits 28-31 scale s

    value = d * (0.5 + s) * 0.5 * IQ3XXS_GRID[index][k] * sign[k]
    """
    B = blocks.shape[0]
    d = _f16(blocks[:, 0:2])  # [B, 1]
    qs = blocks[:, 2:66].reshape(B, 8, 8)  # [B, G, 8]
    aux = _u32(blocks[:, 66:98])  # [B, G]
    db = d * (0.5 + (aux >> 28).astype(np.float32)) * 0.5  # [B, G]
    grid = IQ3XXS_GRID[qs].reshape(B, 8, 4, 8)  # [B, G, 8, 4] -> [B, G, 4, 8]
    values = db[:, :, None, None] * grid * _ksigns(aux)  # [B, G, 4, 8]
    return values.reshape(B, 256)


def dequantize_iq3_s(blocks: np.ndarray) -> np.ndarray:  # [B, 110] uint8 -> [B, 256] f32
    """IQ3_S, 3.44 bits/weight.

    offset bytes field   meaning
    0      2     d       fp16 super-block scale
    2      64    qs      low 8 bits of indices into IQ3S_GRID, one per 4 values (8 per 32 values)
    66     8     qh      one byte per 32 values: bit j = index bit 8 of its j-th qs byte
    74     32    signs   one byte per 8 values, bit k set = element k negative
    106    4     scales  one byte per 64 values: low nibble = s of the first 32, high nibble = s of the next 32

    value = d * (1 + 2 s) * IQ3S_GRID[index][k] * sign[k]
    """
    B = blocks.shape[0]
    d = _f16(blocks[:, 0:2])  # [B, 1]
    qs = blocks[:, 2:66].reshape(B, 8, 8).astype(np.uint16)  # [B, G, 8]
    qh = blocks[:, 66:74]  # [B, G]
    signs = _signs(blocks[:, 74:106].reshape(B, 8, 4))  # [B, G, 4, 8]
    scales = blocks[:, 106:110]  # [B, 4]
    high = np.unpackbits(qh[..., None], axis=-1, bitorder="little")  # [B, G, 8]
    index = qs | high.astype(np.uint16) << 8  # [B, G, 8] 9-bit
    s = np.stack([scales & 0x0F, scales >> 4], axis=-1).reshape(B, 8)  # [B, G]
    db = d * (1 + 2 * s).astype(np.float32)  # [B, G]
    grid = IQ3S_GRID[index].reshape(B, 8, 4, 8)  # [B, G, 4, 8]
    return (db[:, :, None, None] * grid * signs).reshape(B, 256)


def dequantize_iq1_s(blocks: np.ndarray) -> np.ndarray:  # [B, 50] uint8 -> [B, 256] f32
    """IQ1_S, 1.56 bits/weight. The grid holds -1, 0, +1; delta = +-1/8 moves the codeword off zero.

    offset bytes field  meaning
    0      2     d      fp16 super-block scale
    2      32    qs     low 8 bits of 32 indices into IQ1S_GRID, one per 8 values
    34     16    qh     8 uint16, one per 32 values: bits 3l..3l+2 = index bits 8-10 of its l-th group,
                        bits 12-14 = scale s, bit 15 = sign of delta (set = -1/8)

    value = d * (2 s + 1) * (IQ1S_GRID[index][k] + delta)
    """
    B = blocks.shape[0]
    d = _f16(blocks[:, 0:2])  # [B, 1]
    qs = blocks[:, 2:34].reshape(B, 8, 4).astype(np.uint16)  # [B, G, 4]
    qh = _u16(blocks[:, 34:50])  # [B, G]
    high = (qh[..., None] >> np.array([0, 3, 6, 9], dtype=np.uint16)) & 0x07  # [B, G, 4]
    index = qs | high << 8  # [B, G, 4] 11-bit
    dl = d * (2 * ((qh >> 12) & 0x07) + 1).astype(np.float32)  # [B, G]
    delta = np.where((qh & 0x8000) != 0, -IQ1_DELTA, IQ1_DELTA)  # [B, G]
    values = dl[:, :, None, None] * (IQ1S_GRID[index] + delta[:, :, None, None])  # [B, G, 4, 8]
    return values.reshape(B, 256)


def dequantize_iq1_m(blocks: np.ndarray) -> np.ndarray:  # [B, 56] uint8 -> [B, 256] f32
    """IQ1_M, 1.75 bits/weight. Like IQ1_S with a scale per 16 values and a delta sign per 8, and no d field:
    the fp16 d is spread over the top nibbles of the four scale words.

    offset bytes field   meaning
    0      32    qs      low 8 bits of 32 indices into IQ1S_GRID, one per 8 values
    32     16    qh      one nibble per index (low nibble first): bits 0-2 = index bits 8-10,
                         bit 3 = sign of delta (set = -1/8)
    48     8     scales  4 uint16, one per 64 values: bits 3j..3j+2 = scale s of its j-th 16 values,
                         bits 12-15 = nibble w of d; d's fp16 bits = w0 | w1 << 4 | w2 << 8 | w3 << 12

    value = d * (2 s + 1) * (IQ1S_GRID[index][k] + delta)
    """
    B = blocks.shape[0]
    qs = blocks[:, 0:32].astype(np.uint16)  # [B, 32] one per 8 values
    qh = blocks[:, 32:48]  # [B, 16]
    sc = _u16(blocks[:, 48:56])  # [B, 4]
    nibble = np.stack([qh & 0x0F, qh >> 4], axis=-1).reshape(B, 32)  # [B, 32] one per 8 values
    index = qs | (nibble & 0x07).astype(np.uint16) << 8  # [B, 32] 11-bit
    delta = np.where((nibble & 0x08) != 0, -IQ1_DELTA, IQ1_DELTA)  # [B, 32]
    d_bits = (sc >> 12) << np.array([0, 4, 8, 12], dtype=np.uint16)  # [B, 4]
    d = np.bitwise_or.reduce(d_bits, axis=-1, keepdims=True).view(np.float16).astype(np.float32)  # [B, 1]
    s = (sc[..., None] >> np.array([0, 3, 6, 9], dtype=np.uint16)) & 0x07  # [B, 4, 4]
    dl = d * (2 * s.reshape(B, 16) + 1).astype(np.float32)  # [B, 16] one per 16 values
    grid = IQ1S_GRID[index] + delta[..., None]  # [B, 32, 8]
    values = dl[:, :, None, None] * grid.reshape(B, 16, 2, 8)  # [B, 16, 2, 8]
    return values.reshape(B, 256)


def dequantize_iq4_nl(blocks: np.ndarray) -> np.ndarray:  # [B, 18] uint8 -> [B, 32] f32
    """IQ4_NL, 4.5 bits/weight: Q4_0's layout with the 16 non-uniform levels KVALUES_IQ4NL instead of q - 8.

    offset bytes field  meaning
    0      2     d      fp16 block scale
    2      16    qs     byte j: low nibble = code of value j, high nibble = code of value j + 16

    value = d * KVALUES_IQ4NL[code]
    """
    d = _f16(blocks[:, 0:2])  # [B, 1]
    qs = blocks[:, 2:18]  # [B, 16]
    code = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # [B, 32]
    return d * KVALUES_IQ4NL[code]


def dequantize_iq4_xs(blocks: np.ndarray) -> np.ndarray:  # [B, 136] uint8 -> [B, 256] f32
    """IQ4_XS, 4.25 bits/weight: eight IQ4_NL-style sub-blocks of 32 sharing one fp16 d, with 6-bit scales.

    offset bytes field     meaning
    0      2     d         fp16 super-block scale
    2      2     scales_h  uint16: bits 2g, 2g+1 = high 2 bits of sub-block g's scale
    4      4     scales_l  one nibble per sub-block (low nibble first) = low 4 bits of its scale
    8      128   qs        16 bytes per sub-block: byte j low nibble = code of value j, high = value j + 16

    value = d * (scale - 32) * KVALUES_IQ4NL[code],  scale = 6-bit unsigned, so scale - 32 in [-32, 31]
    """
    B = blocks.shape[0]
    d = _f16(blocks[:, 0:2])  # [B, 1]
    scales_h = _u16(blocks[:, 2:4])  # [B, 1]
    scales_l = blocks[:, 4:8]  # [B, 4]
    low = np.stack([scales_l & 0x0F, scales_l >> 4], axis=-1).reshape(B, 8)  # [B, G]
    high = (scales_h >> np.arange(0, 16, 2, dtype=np.uint16)) & 0x03  # [B, G]
    scale = low.astype(np.int32) | high.astype(np.int32) << 4  # [B, G] in [0, 63]
    dl = d * (scale - 32).astype(np.float32)  # [B, G]
    qs = blocks[:, 8:136].reshape(B, 8, 16)  # [B, G, 16]
    code = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # [B, G, 32]
    return (dl[..., None] * KVALUES_IQ4NL[code]).reshape(B, 256)


DEQUANT = {
    GGMLType.IQ2_XXS: dequantize_iq2_xxs,
    GGMLType.IQ2_XS: dequantize_iq2_xs,
    GGMLType.IQ2_S: dequantize_iq2_s,
    GGMLType.IQ3_XXS: dequantize_iq3_xxs,
    GGMLType.IQ3_S: dequantize_iq3_s,
    GGMLType.IQ1_S: dequantize_iq1_s,
    GGMLType.IQ1_M: dequantize_iq1_m,
    GGMLType.IQ4_NL: dequantize_iq4_nl,
    GGMLType.IQ4_XS: dequantize_iq4_xs,
}
QUANTIZE: dict = {}  # read-only family: no quantizers
