"""Ternary and 4-bit float dequantizers: hand-worked blocks, scale decoders over all 256 bytes, then
bit-exact agreement with gguf-py on random blocks, as a hypothesis property and through `dequantize`.

Which random bytes are safe to compare bit for bit:
    TQ1_0, TQ2_0  fp16 d at the end of the block: replaced by a finite fp16 (inf * 0 would make NaNs whose
                  bits depend on operand order); non-finite d is compared by value in its own test.
    MXFP4         every E8M0 byte decodes to a finite power of two; e >= 254 times a large code overflows
                  to +-inf in both implementations, identically. So all bytes stay random.
    NVFP4         every UE4M3 byte decodes to a finite value (0x7F -> 0, 0xFF -> 240). All bytes random.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from numpy.testing import assert_array_equal

from tinyspec.quants import GGMLType, dequantize, fp4, iq_grids

from quant_helpers import assert_bits_equal, block, f16, reference, with_finite_f16_fields  # noqa: E402

TYPES = list(fp4.DEQUANT)
D_AT = {GGMLType.TQ1_0: 52, GGMLType.TQ2_0: 64}  # byte offset of the fp16 d; the FP4 types have none
E2M1 = [0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6]




def with_finite_d(raw: np.ndarray, qtype: GGMLType) -> np.ndarray:  # [B, type_size] -> copy
    return with_finite_f16_fields(raw, [D_AT[qtype]] if qtype in D_AT else [])


def ours(raw: np.ndarray, qtype: GGMLType) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        return fp4.DEQUANT[qtype](raw)






# ---------------------------------------------------------------- hand-worked

def test_trits_by_hand():
    # trits (2, 0, 1, 2, 0) = 162 + 0 + 9 + 6 + 0 = 177 -> byte ceil(177 * 256 / 243) = 187
    packed = np.array([[187, 0, 128, 255]], dtype=np.uint8)
    trits = fp4._trits(packed, 5)[0].T  # [4 bytes, 5 digits]
    assert_array_equal(trits, [[2, 0, 1, 2, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1], [2, 2, 2, 2, 2]])


def test_tq1_0_by_hand():
    # every byte 187 = trits (2, 0, 1, 2, 0) -> values (t - 1) * d = (1, -1, 0, 1, -1) * d, digit-major
    d = 0.5
    raw = block(GGMLType.TQ1_0, [187] * 48, [187] * 4, f16(d))
    expected = [v for t in (1, -1, 0, 1, -1) for v in [t * d] * 32]  # bytes 0-31
    expected += [v for t in (1, -1, 0, 1, -1) for v in [t * d] * 16]  # bytes 32-47
    expected += [v for t in (1, -1, 0, 1) for v in [t * d] * 4]  # qh: 4 trits
    assert_array_equal(fp4.dequantize_tq1_0(raw)[0], expected)


def test_tq2_0_by_hand():
    # all 2-bit fields = 2 (byte 0b10101010) -> (2 - 1) * d = d
    raw = block(GGMLType.TQ2_0, [0xAA] * 64, f16(1.5))
    assert_array_equal(fp4.dequantize_tq2_0(raw)[0], [1.5] * 256)
    # byte 0b11100100 = fields (0, 1, 2, 3) from the low bits up -> (-d, 0, d, 2d), 32 values each, twice
    raw = block(GGMLType.TQ2_0, [0xE4] * 64, f16(1.5))
    assert_array_equal(fp4.dequantize_tq2_0(raw)[0], np.repeat([-1.5, 0, 1.5, 3.0], 32).tolist() * 2)


def test_mxfp4_by_hand():
    # e = 127 -> scale 2^0 = 1, so the values are the plain E2M1 numbers; byte j = codes (j, 15 - j)
    qs = [j | (15 - j) << 4 for j in range(16)]
    got = fp4.dequantize_mxfp4(block(GGMLType.MXFP4, [127], qs))[0]
    assert_array_equal(got, E2M1 + E2M1[::-1])
    assert got.view(np.uint32)[8] == 0  # E2M1's "-0" (code 8) comes out as +0.0, as in ggml
    got = fp4.dequantize_mxfp4(block(GGMLType.MXFP4, [130], qs))[0]  # scale 2^3
    assert_array_equal(got, [8 * v for v in E2M1 + E2M1[::-1]])


def test_nvfp4_by_hand():
    # scales: 0x38 = e7 m0 -> 1.0; 0x40 = e8 -> 2.0; 0x00 -> 0; 0x01 = subnormal 1 * 2^-9
    # sub-block s byte j = codes (j, j + 8), so each sub-block reads the codes 0..15 in order
    qs = [j | (j + 8) << 4 for j in range(8)] * 4
    got = fp4.dequantize_nvfp4(block(GGMLType.NVFP4, [0x38, 0x40, 0x00, 0x01], qs))[0]
    zeros = [0.0] * 9 + [-0.0] * 7  # 0 * (negative code) = -0.0, kept by ggml and gguf-py alike
    expected = np.array(E2M1 + [2 * v for v in E2M1] + zeros + [2.0**-9 * v for v in E2M1], dtype=np.float32)
    assert_bits_equal(got, expected)


def test_scale_bytes_by_hand():
    assert fp4.e8m0_half(np.array([127, 128, 0, 1, 255], dtype=np.uint8)).tolist() == [
        0.5, 1.0, 2.0**-128, 2.0**-127, 2.0**127]
    table = iq_grids.UE4M3_HALF  # value / 2
    assert table[0x38] == 0.5  # 1.0
    assert table[0x7E] == 224  # e15 m6: 1.75 * 2^8 = 448, the UE4M3 maximum
    assert table[0x7F] == 0 and table[0x00] == 0  # NaN code and zero both -> 0
    assert table[0xFF] == 240  # sign bit ignored, and 0xFF is not treated like 0x7F
    assert table[0x01] == 2.0**-10  # subnormal 1 * 2^-9
    assert_array_equal(table[0x81:0xFF], table[0x01:0x7F])


def test_scale_decoders_equal_gguf_py_for_all_bytes():
    gguf_quants = pytest.importorskip("gguf.quants")
    every = np.arange(256, dtype=np.uint8)
    assert_bits_equal(fp4.e8m0_half(every), gguf_quants.MXFP4.e8m0_to_fp32_half(every))
    assert_bits_equal(iq_grids.UE4M3_HALF, gguf_quants.NVFP4.ue4m3_to_fp32(every))


# ---------------------------------------------------------------- bit-exact against gguf-py

@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_random_blocks_match_gguf_py(qtype, rng):
    raw = with_finite_d(rng.integers(0, 256, (2000, qtype.type_size), dtype=np.uint8), qtype)
    got = ours(raw, qtype)
    assert got.shape == (2000, qtype.block_size)
    assert_bits_equal(got, reference(raw, qtype))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_property_matches_gguf_py(qtype, data):
    raw = data.draw(arrays(np.uint8, (data.draw(st.integers(1, 6)), qtype.type_size)))
    raw = with_finite_d(raw, qtype)
    assert_bits_equal(ours(raw, qtype), reference(raw, qtype))


@pytest.mark.parametrize("qtype", [GGMLType.TQ1_0, GGMLType.TQ2_0], ids=lambda t: t.name)
def test_nonfinite_d_matches_gguf_py_by_value(qtype, rng):
    raw = rng.integers(0, 256, (64, qtype.type_size), dtype=np.uint8)
    at = D_AT[qtype]
    raw[:, at:at + 2] = np.array([0x7C00, 0xFC00, 0x7E00, 0xFE01] * 16, dtype="<u2").view(np.uint8).reshape(64, 2)
    assert_array_equal(ours(raw, qtype), reference(raw, qtype))  # NaNs compare equal position by position


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_public_dequantize_multi_row(qtype, rng):
    shape = (3, 512)
    n_blocks = 3 * 512 // qtype.block_size
    raw = with_finite_d(rng.integers(0, 256, (n_blocks, qtype.type_size), dtype=np.uint8), qtype)
    with np.errstate(over="ignore"):
        got = dequantize(raw.reshape(-1), qtype, shape)
    assert got.shape == shape and got.dtype == np.float32
    assert_bits_equal(got, reference(raw.reshape(3, -1), qtype))
