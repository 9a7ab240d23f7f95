"""Ternary (TQ1_0, TQ2_0) and 4-bit float (MXFP4, NVFP4) types: tiny codes times one shared scale.

    type    values/block  bytes  code per value              scale
    TQ1_0   256           54     trit t in {0,1,2}, 5 a byte  fp16 d at the END of the block
    TQ2_0   256           66     2 bits q in {0..3}           fp16 d at the END of the block
    MXFP4   32            17     E2M1 nibble                  E8M0 byte (a power of two) at the start
    NVFP4   64            36     E2M1 nibble                  4 UE4M3 bytes, one per 16 values, at the start

    TQ:   value = (t - 1) * d                     (t = 3 gives 2d in TQ2_0; ggml never writes it)
    FP4:  value = KVALUES_FP4[nibble] * scale/2   (KVALUES_FP4 = E2M1 values doubled, so scale is halved)

E2M1 (1 sign, 2 exponent, 1 mantissa bit) has the 16 values +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}; ggml stores them
doubled as integers. Its -0 (nibble 8) is the integer 0, so it dequantizes to +0.0 (bit-exact with ggml).

Official implementation: ggml `ggml-quants.c` dequantize_row_tq1_0/tq2_0/mxfp4/nvfp4, `ggml-impl.h`
ggml_e8m0_to_fp32_half and ggml_ue4m3_to_fp32; gguf-py `gguf/quants.py` (our bit-exact test oracle).
MXFP4: OCP Microscaling Formats (MX) v1.0 spec. Does NOT include: quantizers.
"""

from __future__ import annotations

import numpy as np

from .iq_grids import KVALUES_FP4, UE4M3_HALF
from .types import GGMLType

_POW3 = np.array([1, 3, 9, 27, 81], dtype=np.uint8)


def _trits(packed: np.ndarray, n: int) -> np.ndarray:  # [B, m] uint8 -> [B, n, m] int
    """The first n base-3 digits of each byte (most significant first).

    A byte holds 5 trits as a fraction: byte ~= 256 * (t0 t1 t2 t3 t4)_3 / 243, rounded up. Multiplying by
    3^i (mod 256, i.e. uint8 overflow on purpose) shifts digit i to the top; * 3 >> 8 then reads it off.
    """
    shifted = packed[:, None, :] * _POW3[:n, None]  # [B, n, m] uint8, wraps mod 256
    return (shifted.astype(np.uint16) * 3) >> 8


def dequantize_tq1_0(blocks: np.ndarray) -> np.ndarray:  # [B, 54] uint8 -> [B, 256] f32
    """TQ1_0, 1.69 bits/weight: ternary values packed 5 per byte (3^5 = 243 <= 256).

    offset bytes field  meaning
    0      48    qs     bytes 0-31: trit i of byte m = value 32 i + m          (i < 5; values 0-159)
                        bytes 32-47: trit i of byte m = value 160 + 16 i + m  (values 160-239)
    48     4     qh     trit i of byte m = value 240 + 4 i + m                 (i < 4; values 240-255)
    52     2     d      fp16 scale

    value = (trit - 1) * d
    """
    B = blocks.shape[0]
    qs, qh = blocks[:, 0:48], blocks[:, 48:52]
    d = blocks[:, 52:54].copy().view("<f2").astype(np.float32)  # [B, 1]
    trits = np.concatenate([
        _trits(qs[:, 0:32], 5).reshape(B, 160),
        _trits(qs[:, 32:48], 5).reshape(B, 80),
        _trits(qh, 4).reshape(B, 16),
    ], axis=-1)  # [B, 256]
    return (trits.astype(np.float32) - 1) * d


def dequantize_tq2_0(blocks: np.ndarray) -> np.ndarray:  # [B, 66] uint8 -> [B, 256] f32
    """TQ2_0, 2.06 bits/weight: ternary values in 2-bit fields, 4 per byte.

    offset bytes field  meaning
    0      64    qs     two halves of 32 bytes; bits 2l..2l+1 of byte m of half h = value 128 h + 32 l + m
    64     2     d      fp16 scale

    value = (q - 1) * d
    """
    B = blocks.shape[0]
    qs = blocks[:, 0:64].reshape(B, 2, 1, 32)  # [B, half, 1, 32]
    d = blocks[:, 64:66].copy().view("<f2").astype(np.float32)  # [B, 1]
    q = (qs >> np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]) & 0x03  # [B, half, 4, 32]
    return (q.reshape(B, 256).astype(np.float32) - 1) * d


def e8m0_half(e: np.ndarray) -> np.ndarray:  # [...] uint8 -> [...] f32
    """E8M0 byte -> 2^(e - 127) / 2 = 2^(e - 128), as ggml_e8m0_to_fp32_half.

    e = 0 and 1 give the float32 subnormals 2^-128 and 2^-127; e = 255 (the spec's NaN) gives 2^127.
    """
    return np.ldexp(np.float32(1), e.astype(np.int32) - 128)


def dequantize_mxfp4(blocks: np.ndarray) -> np.ndarray:  # [B, 17] uint8 -> [B, 32] f32
    """MXFP4, 4.25 bits/weight (OCP microscaling: 32 E2M1 values sharing one power-of-two scale).

    offset bytes field  meaning
    0      1     e      E8M0 shared exponent: scale = 2^(e - 127)
    1      16    qs     byte j: low nibble = E2M1 code of value j, high nibble = code of value j + 16

    value = KVALUES_FP4[code] * 2^(e - 128)
    """
    d = e8m0_half(blocks[:, 0:1])  # [B, 1]
    qs = blocks[:, 1:17]  # [B, 16]
    code = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # [B, 32]
    return KVALUES_FP4[code] * d


def dequantize_nvfp4(blocks: np.ndarray) -> np.ndarray:  # [B, 36] uint8 -> [B, 64] f32
    """NVFP4, 4.5 bits/weight: E2M1 values in sub-blocks of 16, each with its own UE4M3 (fp8) scale.

    offset bytes field  meaning
    0      4     d      one UE4M3 byte per 16 values (unsigned E4M3, bias 7; see iq_grids.UE4M3_HALF)
    4      32    qs     8 bytes per sub-block s: byte j low nibble = value 16 s + j, high = value 16 s + j + 8

    value = KVALUES_FP4[code] * UE4M3_HALF[d]
    """
    B = blocks.shape[0]
    scale = UE4M3_HALF[blocks[:, 0:4]]  # [B, 4]
    qs = blocks[:, 4:36].reshape(B, 4, 8)  # [B, 4, 8]
    code = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # [B, 4, 16]
    return (KVALUES_FP4[code] * scale[..., None]).reshape(B, 64)


DEQUANT = {
    GGMLType.TQ1_0: dequantize_tq1_0,
    GGMLType.TQ2_0: dequantize_tq2_0,
    GGMLType.MXFP4: dequantize_mxfp4,
    GGMLType.NVFP4: dequantize_nvfp4,
}
QUANTIZE: dict = {}  # read-only family: no quantizers
