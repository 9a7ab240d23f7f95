"""Legacy 32-value block quants (tinyspec/quants/legacy.py): Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.

1. one hand-worked block per type, expected values computed on paper from the byte layout, and
   hand-worked quantizations (Q8_0's ties away from zero, Q4_0's sign trick and its all-zero block);
2. dequantizers bit-exact with gguf-py on 2,000 random blocks per type and as a hypothesis property;
3. quantizers: Q8_0, Q4_0, Q5_0 and Q5_1 byte-exact with gguf-py (which reproduces ggml's quantize_row_*_ref),
   round-trip error bounds, zero/constant blocks, requantization, and the public dispatch.

Random blocks get every fp16 field (d, m) replaced by a finite fp16 (random sign, exponent and mantissa,
subnormals and zeros included): NaN * 0 and inf - inf make NaNs whose payload depends on operand order,
and no real file has such a scale.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from numpy.testing import assert_array_equal

from tinyspec.quants import GGMLType, dequantize, legacy, quantize

gguf_quants = pytest.importorskip("gguf.quants")
GQT = pytest.importorskip("gguf.constants").GGMLQuantizationType

from quant_helpers import assert_bits_equal, block, f16, rel_rms, with_finite_f16_fields  # noqa: E402

TYPES = list(legacy.DEQUANT)
F16_FIELDS = {  # byte offsets of the fp16 fields in each block
    GGMLType.Q4_0: [0], GGMLType.Q4_1: [0, 2], GGMLType.Q5_0: [0], GGMLType.Q5_1: [0, 2], GGMLType.Q8_0: [0],
}


# ---------------------------------------------------------------- 1. by hand

def test_q8_0_by_hand():
    raw = block(GGMLType.Q8_0, f16(2.0), list(np.arange(-16, 16, dtype=np.int8).view(np.uint8)))
    assert_array_equal(legacy.dequantize_q8_0(raw)[0], 2.0 * np.arange(-16, 16))


def test_q4_0_by_hand():
    # byte j = j | (15 - j) << 4: value j is 0.5 * (j - 8), value 16 + j is 0.5 * (15 - j - 8)
    raw = block(GGMLType.Q4_0, f16(0.5), [j | (15 - j) << 4 for j in range(16)])
    expected = [0.5 * (j - 8) for j in range(16)] + [0.5 * (7 - j) for j in range(16)]
    assert_array_equal(legacy.dequantize_q4_0(raw)[0], expected)


def test_q4_1_by_hand():
    # d = 0.25, m = -1; byte j = j | j << 4: values j and 16 + j are both 0.25 * j - 1
    raw = block(GGMLType.Q4_1, f16(0.25), f16(-1.0), [j | j << 4 for j in range(16)])
    half = [0.25 * j - 1 for j in range(16)]
    assert_array_equal(legacy.dequantize_q4_1(raw)[0], half + half)


def test_q5_0_by_hand():
    # qh = 0xffff0000: the fifth bit is set on values 16..31 only; byte j = j | j << 4
    # value j = (j + 0) - 16, value 16 + j = (j + 16) - 16: together -16..15
    raw = block(GGMLType.Q5_0, f16(1.0), [0x00, 0x00, 0xFF, 0xFF], [j | j << 4 for j in range(16)])
    assert_array_equal(legacy.dequantize_q5_0(raw)[0], np.arange(-16, 16))


def test_q5_1_by_hand():
    # d = 0.5, m = 1; qh = 0x0000ffff: fifth bit on values 0..15; byte j = j | (15 - j) << 4
    qs = [j | (15 - j) << 4 for j in range(16)]
    raw = block(GGMLType.Q5_1, f16(0.5), f16(1.0), [0xFF, 0xFF, 0x00, 0x00], qs)
    expected = [0.5 * (j + 16) + 1 for j in range(16)] + [0.5 * (15 - j) + 1 for j in range(16)]
    assert_array_equal(legacy.dequantize_q5_1(raw)[0], expected)


def test_q8_0_quantize_by_hand():
    # max |x| = 127 -> d = 1 exactly; C roundf sends halves away from zero (np.rint would give 2, -64, -0)
    x = np.zeros((1, 32), np.float32)
    x[0, :5] = [127, -63.5, 2.5, -0.5, 0.49999997]
    expected_q = [127, -64, 3, -1, 0] + [0] * 27
    expected = block(GGMLType.Q8_0, f16(1.0), list(np.int8(expected_q).view(np.uint8)))
    assert_array_equal(legacy.quantize_q8_0(x), expected)


def test_q4_0_quantize_by_hand():
    # x = j - 16: the largest |x| is x[0] = -16, so d = -16 / -8 = 2 and x[0] lands on code 0 (= -8 d).
    # q_j = trunc((j - 16) / 2 + 8.5) = trunc(j / 2 + 0.5) = (j + 1) // 2, clamped to 15 (j = 31 gives 16)
    x = (np.arange(32) - 16).astype(np.float32)[None, :]
    q = [min(15, (j + 1) // 2) for j in range(32)]
    expected = block(GGMLType.Q4_0, f16(2.0), [q[j] | q[16 + j] << 4 for j in range(16)])
    assert_array_equal(legacy.quantize_q4_0(x), expected)


def test_q4_0_all_zero_block_follows_ggml_not_gguf_py():
    """ggml's loop starts from max = +0 and keeps it when every |x| is 0, so d = +0 / -8 = -0 (fp16 0x8000).
    gguf-py takes x[argmax |x|], which is -0.0 here, and stores d = +0. The values are 0 either way."""
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = -0.0
    assert_array_equal(legacy.quantize_q4_0(x), block(GGMLType.Q4_0, [0x00, 0x80], [0x88] * 16))
    assert_array_equal(gguf_quants.quantize(x, GQT.Q4_0)[0, :2], [0x00, 0x00])


# ---------------------------------------------------------------- 2. dequantizers against gguf-py

@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_random_blocks_match_gguf_py(qtype, rng):
    raw = with_finite_f16_fields(rng.integers(0, 256, (2000, qtype.type_size), dtype=np.uint8), F16_FIELDS[qtype])
    assert_bits_equal(legacy.DEQUANT[qtype](raw), gguf_quants.dequantize(raw, GQT[qtype.name]))


@settings(max_examples=100, deadline=None)
@given(qtype=st.sampled_from(TYPES), data=st.data())
def test_dequantize_property(qtype, data):
    n_blocks = data.draw(st.integers(1, 8), label="n_blocks")
    raw = data.draw(arrays(np.uint8, (n_blocks, qtype.type_size)), label="raw")
    raw = with_finite_f16_fields(raw, F16_FIELDS[qtype])
    assert_bits_equal(legacy.DEQUANT[qtype](raw), gguf_quants.dequantize(raw, GQT[qtype.name]))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_dispatch_with_multi_row_shape(qtype, rng):
    raw = with_finite_f16_fields(rng.integers(0, 256, (3 * 512 // 32, qtype.type_size), dtype=np.uint8), F16_FIELDS[qtype])
    y = dequantize(raw.reshape(-1), qtype, (3, 512))
    assert y.dtype == np.float32 and y.shape == (3, 512)
    assert_bits_equal(y, legacy.DEQUANT[qtype](raw).reshape(3, 512))


# ---------------------------------------------------------------- 3. quantizers

QUANT_TYPES = list(legacy.QUANTIZE)
# Relative RMS error of quantize -> dequantize on the Gaussian (64, 1024) rows of
# test_round_trip_error, measured: Q8_0 0.00537, Q4_0 0.0862, Q5_0 0.0428, Q5_1 0.0380 (ggml's reference gives
# the same bytes).
ERROR_BOUND = {GGMLType.Q8_0: 0.006, GGMLType.Q4_0: 0.095, GGMLType.Q5_0: 0.05, GGMLType.Q5_1: 0.05}


def gaussian_rows(rng, rows=64, n=1024) -> np.ndarray:
    return rng.standard_normal((rows, n)).astype(np.float32)


@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
def test_quantize_matches_gguf_py(qtype, rng):
    # rows at very different scales, plus blocks with repeated extremes of both signs (the argmax tie rule)
    x = gaussian_rows(rng) * np.exp(rng.uniform(-10, 10, (64, 1))).astype(np.float32)
    x[0, :32] = np.where(np.arange(32) % 2, 3.0, -3.0)
    x[1, :32] = np.where(np.arange(32) % 2, -3.0, 3.0)
    ref = gguf_quants.quantize(x, GQT[qtype.name])
    assert_array_equal(quantize(x, qtype), ref)


@settings(max_examples=100, deadline=None)
@given(qtype=st.sampled_from(QUANT_TYPES),
       x=arrays(np.float32, (2, 32), elements=st.floats(-1e4, 1e4, width=32, allow_subnormal=False)))
def test_quantize_property(qtype, x):
    # below ~1e-30 the scale d = max / 127 is subnormal, 1 / d overflows and C's float -> int8 is undefined;
    # +0.0 turns -0.0 into +0.0, the one input where gguf-py and ggml disagree (test above)
    x = np.where(np.abs(x) < 1e-30, 0, x).astype(np.float32) + np.float32(0)
    assert_array_equal(legacy.QUANTIZE[qtype](x), gguf_quants.quantize(x, GQT[qtype.name]))


@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
def test_round_trip_error(qtype, rng):
    x = gaussian_rows(rng)
    raw = quantize(x, qtype)
    assert raw.dtype == np.uint8 and raw.shape == (64, 1024 // 32 * qtype.type_size)
    y = dequantize(raw, qtype, x.shape)
    assert rel_rms(y, x) < ERROR_BOUND[qtype], f"{qtype.name}: relative RMS error {rel_rms(y, x):.5f}"


@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
def test_zero_and_constant_blocks(qtype, rng):
    zeros = np.zeros((4, 32), np.float32)
    assert_array_equal(legacy.DEQUANT[qtype](legacy.QUANTIZE[qtype](zeros)), zeros)
    constant = np.repeat(rng.standard_normal((16, 1)).astype(np.float32) * 10, 32, axis=1)
    y = legacy.DEQUANT[qtype](legacy.QUANTIZE[qtype](constant))
    # the constant lands on the extreme code exactly; only d's rounding to fp16 (2^-11 relative) remains
    np.testing.assert_allclose(y, constant, rtol=2.0**-11, atol=0)


@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
def test_requantizing_dequantized_values_is_a_fixed_point(qtype, rng):
    x = gaussian_rows(rng, rows=16) * np.exp(rng.uniform(-5, 5, (16, 1))).astype(np.float32)
    raw = quantize(x, qtype)
    y = dequantize(raw, qtype, x.shape)
    assert_array_equal(quantize(y, qtype), raw)


@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
def test_quantize_dispatch_keeps_leading_axes(qtype, rng):
    x = rng.standard_normal((3, 512)).astype(np.float32)
    raw = quantize(x, qtype)
    assert raw.shape == (3, 512 // 32 * qtype.type_size)
    assert_array_equal(raw.reshape(-1, qtype.type_size), legacy.QUANTIZE[qtype](x.reshape(-1, 32)))
    y = dequantize(raw, qtype, (3, 512))
    assert_array_equal(y.reshape(-1, 32), legacy.DEQUANT[qtype](raw.reshape(-1, qtype.type_size)))
