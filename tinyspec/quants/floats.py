"""Plain element types: F32, F16, BF16, F64 and the integer types I8..I64 (block size 1).

    type  bytes  layout (little-endian)
    F32   4      IEEE binary32
    F16   2      IEEE binary16
    BF16  2      the high 16 bits of a binary32: value = bits << 16 viewed as f32 (exact widening)
    F64   8      IEEE binary64, rounded to nearest f32
    I8..I64      two's-complement integers, converted to f32 (exact up to 2^24)

Quantizers round to nearest-even (F16 via NumPy; BF16 as ggml's `ggml_compute_fp32_to_bf16`: NaN
kept quiet, otherwise add 0x7fff plus the lowest kept bit and truncate).
"""

from __future__ import annotations

import numpy as np

from .types import GGMLType


def _viewer(dtype):
    def dequantize_plain(blocks: np.ndarray) -> np.ndarray:  # [B, itemsize] uint8 -> [B, 1] f32
        return blocks.view(np.dtype(dtype).newbyteorder("<")).astype(np.float32)

    dequantize_plain.__name__ = f"dequantize_{np.dtype(dtype).name}"
    return dequantize_plain


def dequantize_bf16(blocks: np.ndarray) -> np.ndarray:  # [B, 2] uint8 -> [B, 1] f32
    bits = blocks.view("<u2").astype(np.uint32) << 16
    return bits.view(np.float32)


def quantize_f32(x: np.ndarray) -> np.ndarray:  # [B, 1] f32 -> [B, 4] uint8
    return x.astype("<f4").view(np.uint8)


def quantize_f16(x: np.ndarray) -> np.ndarray:  # [B, 1] f32 -> [B, 2] uint8
    return x.astype("<f2").view(np.uint8)


def quantize_bf16(x: np.ndarray) -> np.ndarray:  # [B, 1] f32 -> [B, 2] uint8
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16
    quiet_nan = (bits >> 16) | 64
    return np.where(is_nan, quiet_nan, rounded).astype("<u2").view(np.uint8)


DEQUANT = {
    GGMLType.F32: _viewer(np.float32),
    GGMLType.F16: _viewer(np.float16),
    GGMLType.BF16: dequantize_bf16,
    GGMLType.F64: _viewer(np.float64),
    GGMLType.I8: _viewer(np.int8),
    GGMLType.I16: _viewer(np.int16),
    GGMLType.I32: _viewer(np.int32),
    GGMLType.I64: _viewer(np.int64),
}
QUANTIZE = {
    GGMLType.F32: quantize_f32,
    GGMLType.F16: quantize_f16,
    GGMLType.BF16: quantize_bf16,
}
