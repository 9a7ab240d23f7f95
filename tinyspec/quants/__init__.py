"""Dequantization and quantization of GGML tensor types, one family per file.

    dequantize(raw, ggml_type, shape) -> float32 array of `shape`
    quantize(x, ggml_type)            -> uint8 array [..., row bytes]

Every family file exposes functions on whole blocks, `dequantize_<type>(blocks [B, type_size] uint8)
-> [B, block_size] float32` and `quantize_<type>(x [B, block_size] float32) -> [B, type_size] uint8`,
and its own DEQUANT / QUANTIZE dicts; they are merged here into the one registry keyed by GGMLType.

Families:
    floats.py   F32, F16, BF16, F64, I8..I64 (plain element arrays)
    legacy.py   Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (32-value blocks, one scale)
    kquants.py  Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (256-value super-blocks with packed sub-block scales)
    iquants.py  IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS (lattice codebooks)
    fp4.py      TQ1_0, TQ2_0 (ternary), MXFP4, NVFP4 (4-bit floats with shared scales)
    q8_k.py     Q8_K, the activation rounding of integer dot products (its own functions, not in the
                registry: quantize_q8_k(x [T, n]) -> codes, scales; used by ops.quant_linear_q8)

Reference: gguf-py `gguf/quants.py` (llama.cpp's NumPy dequantizers, our bit-exact test oracle) and
ggml `ggml-quants.c` `dequantize_row_*`. Does NOT include: Q8_1 and Q8_K as weight types (activation-only
types that files do not carry), Q1_0 and Q2_0 (no reference dequantizer to check against).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from . import floats, fp4, iquants, kquants, legacy
from .types import LAYOUT, QK_K, GGMLType

DEQUANT: dict[GGMLType, Callable[[np.ndarray], np.ndarray]] = {}
QUANTIZE: dict[GGMLType, Callable[[np.ndarray], np.ndarray]] = {}
for _family in (floats, legacy, kquants, iquants, fp4):
    DEQUANT.update(_family.DEQUANT)
    QUANTIZE.update(_family.QUANTIZE)


class QuantError(ValueError):
    """A tensor cannot be (de)quantized as asked: unsupported type or sizes that do not fit."""


def _as_type(ggml_type: GGMLType | int) -> GGMLType:
    try:
        return GGMLType(ggml_type)
    except ValueError:
        raise QuantError(f"unknown ggml type id {ggml_type!r}") from None


def dequantize(raw: np.ndarray, ggml_type: GGMLType | int, shape: tuple[int, ...]) -> np.ndarray:
    """Bytes of one tensor -> float32 values of NumPy `shape` (last axis = ggml ne0, the row).

    raw: uint8 array of exactly the tensor's bytes (any shape; read in C order).
    """
    qtype = _as_type(ggml_type)
    if qtype not in DEQUANT:
        raise QuantError(f"no dequantizer for ggml type {qtype.name}")
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise QuantError(f"{qtype.name}: negative dimension in shape {shape}")
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    row = shape[-1] if shape else 1
    if row % qtype.block_size:
        raise QuantError(f"{qtype.name}: row length {row} is not a multiple of the block size {qtype.block_size}")
    n_blocks = n // qtype.block_size
    raw = np.asarray(raw)
    if raw.dtype != np.uint8:
        raise QuantError(f"{qtype.name}: raw data must be uint8 bytes, got {raw.dtype}")
    if raw.size != n_blocks * qtype.type_size:
        raise QuantError(
            f"{qtype.name}: shape {shape} needs {n_blocks * qtype.type_size} bytes, got {raw.size}"
        )
    blocks = np.ascontiguousarray(raw).reshape(n_blocks, qtype.type_size)  # [B, type_size]
    values = DEQUANT[qtype](blocks)  # [B, block_size]
    return values.astype(np.float32, copy=False).reshape(shape)


def quantize(x: np.ndarray, ggml_type: GGMLType | int) -> np.ndarray:
    """float values [..., n] -> uint8 bytes [..., n / block_size * type_size] (same leading axes)."""
    qtype = _as_type(ggml_type)
    if qtype not in QUANTIZE:
        raise QuantError(f"no quantizer for ggml type {qtype.name}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim == 0:
        x = x.reshape(1)
    row = x.shape[-1]
    if row % qtype.block_size:
        raise QuantError(f"{qtype.name}: row length {row} is not a multiple of the block size {qtype.block_size}")
    blocks = x.reshape(-1, qtype.block_size)  # [B, block_size]
    packed = QUANTIZE[qtype](blocks)  # [B, type_size]
    return packed.reshape(*x.shape[:-1], row // qtype.block_size * qtype.type_size)


__all__ = ["DEQUANT", "QUANTIZE", "LAYOUT", "QK_K", "GGMLType", "QuantError", "dequantize", "quantize"]
