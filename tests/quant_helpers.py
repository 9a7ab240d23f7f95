"""Helpers shared by the quant tests: hand-built blocks, finite fp16 scale fields, bit comparisons, x as the
cpu integer path rounds it."""

import numpy as np
import pytest
from numpy.testing import assert_array_equal

from tinyspec import ops
from tinyspec.quants import GGMLType, dequantize, quantize
from tinyspec.quants.q8_k import dequantize_q8_k, quantize_q8_k


def f16(x: float) -> list[int]:
    """The two little-endian bytes of x as fp16."""
    return list(np.float16(x).tobytes())


def block(qtype: GGMLType, *fields: list[int]) -> np.ndarray:  # -> [1, type_size] uint8
    raw = np.array([b for f in fields for b in f], dtype=np.uint8)[None, :]
    assert raw.shape[1] == qtype.type_size
    return raw


def with_finite_f16_fields(raw: np.ndarray, offsets: list[int]) -> np.ndarray:  # [B, type_size] -> copy
    """Clear the top exponent bit of inf/NaN fp16 patterns at these byte offsets (exponent 31 -> 15)."""
    raw = raw.copy()
    for offset in offsets:
        bits = raw[:, offset:offset + 2].copy().view("<u2")
        bits = np.where((bits & 0x7C00) == 0x7C00, bits & 0xBFFF, bits).astype("<u2")
        raw[:, offset:offset + 2] = bits.view(np.uint8)
    return raw


def assert_bits_equal(ours: np.ndarray, ref: np.ndarray) -> None:
    assert ours.dtype == np.float32 and ours.shape == ref.shape
    assert_array_equal(ours.view(np.uint32), np.asarray(ref, dtype=np.float32).view(np.uint32))


def rel_rms(y: np.ndarray, x: np.ndarray) -> float:
    return float(np.sqrt(np.mean((y - x) ** 2) / np.mean(x**2)))


def reference(raw: np.ndarray, qtype: GGMLType) -> np.ndarray:
    """gguf-py's dequantization of blocks [B, type_size] (skips the test when gguf is not installed)."""
    gguf_quants = pytest.importorskip("gguf.quants")
    gguf_constants = pytest.importorskip("gguf.constants")
    with np.errstate(invalid="ignore", over="ignore"):
        return gguf_quants.dequantize(raw, gguf_constants.GGMLQuantizationType[qtype.name])


def rounded_x(x: np.ndarray, qtype: GGMLType) -> np.ndarray:
    """x as the cpu integer path rounds it for a weight of qtype: Q8_0 blocks for ops.X_Q8_0, else Q8_K (the
    K-quants, IQ4_XS); what ops.quant_linear_q8 multiplies."""
    if qtype in ops.X_Q8_0:
        return dequantize(quantize(x, GGMLType.Q8_0), GGMLType.Q8_0, x.shape)
    return dequantize_q8_k(*quantize_q8_k(x))


def magnitude(raw, qtype, shape) -> np.ndarray:
    """|W| as the kernels' sums see it: for Q4_K/Q5_K, W = (d*sc) q - (dmin*m) and the tensor-core kernel
    sums the two terms separately (dl * sum(q x) - ml * sum(x)), so |dl q| + |ml| (raw with dmin, then d,
    zeroed) bounds what it adds; for every other type |W| itself. [out, in] float64."""
    if qtype not in (GGMLType.Q4_K, GGMLType.Q5_K):
        return np.abs(dequantize(raw, qtype, shape).astype(np.float64))
    parts = []
    for field in (slice(2, 4), slice(0, 2)):  # zero dmin -> the dl * q term; zero d -> the -ml term
        blocks = np.array(raw, copy=True).reshape(-1, qtype.type_size)
        blocks[:, field] = 0
        parts.append(np.abs(dequantize(blocks.reshape(raw.shape), qtype, shape).astype(np.float64)))
    return parts[0] + parts[1]
