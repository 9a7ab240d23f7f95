"""Plain element types (tinyspec/quants/floats.py).

1. hand-worked bit patterns: widening F16/BF16, BF16 round-to-nearest-even and NaN quieting;
2. bit-exact agreement with gguf-py: every one of the 65,536 F16 and BF16 patterns, random F32 bits,
   BF16 quantization of random bit patterns (NaNs, infinities, subnormals, ties) and as a property;
3. the public `dequantize` / `quantize` dispatch with multi-row shapes, and the integer types.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from numpy.testing import assert_array_equal

from tinyspec.quants import GGMLType, dequantize, floats, quantize

gguf_quants = pytest.importorskip("gguf.quants")
GQT = pytest.importorskip("gguf.constants").GGMLQuantizationType


def u32_as_f32(*bits: int) -> np.ndarray:  # -> [n, 1] f32 with exactly these bits
    return np.array(bits, dtype=np.uint32).view(np.float32)[:, None]


def bf16_bits(x: np.ndarray) -> np.ndarray:  # [n, 1] f32 -> [n] uint16
    return floats.quantize_bf16(x).view("<u2")[:, 0]


# ---------------------------------------------------------------- 1. by hand

def test_widening_by_hand():
    assert floats.DEQUANT[GGMLType.F16](np.array([[0x00, 0x3C]], np.uint8))[0, 0] == 1.0  # 0x3c00
    assert floats.DEQUANT[GGMLType.F16](np.array([[0x01, 0x00]], np.uint8))[0, 0] == 2.0**-24  # subnormal
    assert floats.dequantize_bf16(np.array([[0x80, 0x3F]], np.uint8))[0, 0] == 1.0  # 0x3f80
    assert floats.dequantize_bf16(np.array([[0x49, 0xC0]], np.uint8))[0, 0] == -3.140625  # 0xc049


def test_bf16_rounding_by_hand():
    # keep the top 16 bits, round the dropped 16 to nearest, ties to the even kept pattern
    cases = {
        0x3F800000: 0x3F80,  # 1.0, exact
        0x3F807FFF: 0x3F80,  # just below half an ulp: down
        0x3F808000: 0x3F80,  # tie, kept pattern even: stays
        0x3F818000: 0x3F82,  # tie, kept pattern odd: up to even
        0x3F808001: 0x3F81,  # just above half: up
        0x40490FDB: 0x4049,  # pi -> 3.140625
        0x7F7FFFFF: 0x7F80,  # largest finite f32 rounds up to bf16 +inf
        0xFF800000: 0xFF80,  # -inf stays
        0x00000001: 0x0000,  # smallest subnormal rounds to +0
        0x80000000: 0x8000,  # -0 keeps its sign
    }
    assert_array_equal(bf16_bits(u32_as_f32(*cases)), list(cases.values()))


def test_bf16_nan_is_kept_and_quieted_by_hand():
    # a NaN never rounds into inf: its top 16 bits are kept and the quiet bit (0x0040) set
    cases = {0x7FC00000: 0x7FC0, 0x7F800001: 0x7FC0, 0xFF800001: 0xFFC0, 0x7FFFFFFF: 0x7FFF, 0x7F810000: 0x7FC1}
    assert_array_equal(bf16_bits(u32_as_f32(*cases)), list(cases.values()))


# ---------------------------------------------------------------- 2. against gguf-py

def assert_bits_equal(ours: np.ndarray, ref: np.ndarray) -> None:
    assert ours.dtype == np.float32
    assert_array_equal(ours.reshape(-1).view(np.uint32), np.asarray(ref, np.float32).reshape(-1).view(np.uint32))


@pytest.mark.parametrize("qtype", [GGMLType.F16, GGMLType.BF16], ids=lambda t: t.name)
def test_every_16_bit_pattern_widens_like_gguf_py(qtype):
    raw = np.arange(2**16, dtype="<u2").view(np.uint8).reshape(-1, 2)  # [65536, 2]
    with np.errstate(invalid="ignore"):
        ref = gguf_quants.dequantize(raw.reshape(-1), GQT[qtype.name])
    assert_bits_equal(floats.DEQUANT[qtype](raw), ref)


def test_f32_random_bits_like_gguf_py(rng):
    raw = rng.integers(0, 256, (5000, 4), dtype=np.uint8)
    assert_bits_equal(floats.DEQUANT[GGMLType.F32](raw), gguf_quants.dequantize(raw.reshape(-1), GQT.F32))


def test_bf16_quantize_random_bits_like_gguf_py(rng):
    bits = rng.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32)
    special = [0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFFFFFFF, 0x00000001, 0x80008000, 0x3F808000]
    bits = np.concatenate([bits, np.array(special, np.uint32)])
    bits[::7] = (bits[::7] & 0xFFFF0000) | 0x8000  # many exact ties
    bits[1::7] |= 0x7F800000  # many NaNs and infinities
    x = bits.view(np.float32)[:, None]
    ref = gguf_quants.quantize(x.reshape(-1), GQT.BF16)
    assert_array_equal(floats.quantize_bf16(x).reshape(-1), ref.view(np.uint8))


@settings(max_examples=200, deadline=None)
@given(arrays(np.uint32, st.integers(1, 64)))
def test_bf16_quantize_property(bits):
    x = bits.view(np.float32)[:, None]
    ref = gguf_quants.quantize(x.reshape(-1), GQT.BF16)
    assert_array_equal(floats.quantize_bf16(x).reshape(-1), ref.view(np.uint8))
    # and widening the result back is what gguf-py gets too
    assert_bits_equal(floats.dequantize_bf16(floats.quantize_bf16(x)), gguf_quants.dequantize(ref, GQT.BF16))


@pytest.mark.parametrize("qtype", [GGMLType.F32, GGMLType.F16], ids=lambda t: t.name)
def test_f32_f16_quantize_like_gguf_py(qtype, rng):
    x = (rng.standard_normal(4096) * np.exp(rng.uniform(-20, 20, 4096))).astype(np.float32)
    with np.errstate(over="ignore"):
        ref = gguf_quants.quantize(x, GQT[qtype.name])
        ours = quantize(x, qtype)
    assert_array_equal(ours, ref.view(np.uint8))


# ---------------------------------------------------------------- 3. dispatch and integer types

@pytest.mark.parametrize("qtype", [GGMLType.F32, GGMLType.F16, GGMLType.BF16], ids=lambda t: t.name)
def test_dispatch_round_trip_with_shapes(qtype, rng):
    x = rng.standard_normal((3, 5, 7)).astype(np.float32)
    raw = quantize(x, qtype)
    assert raw.dtype == np.uint8 and raw.shape == (3, 5, 7 * qtype.type_size)
    y = dequantize(raw.reshape(-1), qtype, x.shape)
    assert y.dtype == np.float32 and y.shape == x.shape
    tolerance = {GGMLType.F32: 0, GGMLType.F16: 2.0**-11, GGMLType.BF16: 2.0**-8}[qtype]
    np.testing.assert_allclose(y, x, rtol=tolerance, atol=0)


@pytest.mark.parametrize("qtype, dtype", [
    (GGMLType.F64, "<f8"), (GGMLType.I8, "i1"), (GGMLType.I16, "<i2"),
    (GGMLType.I32, "<i4"), (GGMLType.I64, "<i8"),
], ids=lambda v: getattr(v, "name", str(v)))
def test_other_plain_types_convert_like_numpy(qtype, dtype, rng):
    values = rng.integers(-100, 100, (4, 6)).astype(dtype)
    if qtype == GGMLType.F64:
        values = values * np.pi
    y = dequantize(values.view(np.uint8).reshape(-1), qtype, (4, 6))
    assert y.dtype == np.float32
    assert_array_equal(y, values.astype(np.float32))
