"""I-quant dequantizers and their grid tables.

1. the tables: hand-read entries of ggml-common.h, the ksigns parity rule, equality with gguf-py's grids,
   and the generator (tools/gen_iq_grids.py) on a tiny synthetic header;
2. one hand-worked block per type, expected values computed on paper from the byte layout;
3. bit-exact agreement with gguf-py on many random blocks and as a hypothesis property, and through the
   public `dequantize` with multi-row shapes.

Random blocks get their fp16 d replaced by a finite fp16 (random sign, exponent and mantissa, subnormals and
zeros included). Non-finite d is tested separately and compared by value, not bits: inf * 0 and NaN inputs
make NaNs whose sign/payload depends on operand order inside the CPU, and no real file has such a d.
"""

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from numpy.testing import assert_array_equal

from tinyspec.quants import GGMLType, dequantize, iq_grids, iquants

from quant_helpers import assert_bits_equal, block, f16, reference  # noqa: E402

TYPES = list(iquants.DEQUANT)
ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- helpers



def finite_f16_bits(bits: np.ndarray) -> np.ndarray:  # uint16 -> uint16
    """Clear the top exponent bit of inf/NaN patterns (exponent 31 -> 15): a finite fp16, same sign."""
    return np.where((bits & 0x7C00) == 0x7C00, bits & 0xBFFF, bits).astype(np.uint16)


def iq1_m_d_bits(raw: np.ndarray) -> np.ndarray:  # [B, 56] -> [B] uint16: the fp16 bits of d
    sc = raw[:, 48:56].copy().view("<u2")  # [B, 4]
    nibbles = sc >> 12  # [B, 4], least significant nibble of d first
    return (nibbles[:, 0] | nibbles[:, 1] << 4 | nibbles[:, 2] << 8 | nibbles[:, 3] << 12).astype(np.uint16)


def set_iq1_m_d_bits(raw: np.ndarray, d_bits: np.ndarray) -> None:  # in place
    sc = raw[:, 48:56].copy().view("<u2")  # [B, 4]
    nibbles = (d_bits[:, None] >> np.array([0, 4, 8, 12], dtype=np.uint16)) & 0xF
    raw[:, 48:56] = ((sc & 0x0FFF) | nibbles << 12).astype("<u2").view(np.uint8)


def with_finite_d(raw: np.ndarray, qtype: GGMLType) -> np.ndarray:  # [B, type_size] -> copy
    """Every i-quant but IQ1_M starts with its fp16 d at byte 0."""
    raw = raw.copy()
    if qtype == GGMLType.IQ1_M:
        set_iq1_m_d_bits(raw, finite_f16_bits(iq1_m_d_bits(raw)))
    else:
        raw[:, 0:2] = finite_f16_bits(raw[:, 0:2].copy().view("<u2")).view(np.uint8)
    return raw








def u16(*values: int) -> list[int]:
    return list(np.array(values, dtype="<u2").tobytes())


def u32(*values: int) -> list[int]:
    return list(np.array(values, dtype="<u4").tobytes())


# ---------------------------------------------------------------- 1. tables

def test_grid_entries_read_off_ggml_common_h():
    # iq2xxs_grid[1] = 0x080808080808082b: byte 0 (least significant) is element 0
    assert_array_equal(iq_grids.IQ2XXS_GRID[1], [43, 8, 8, 8, 8, 8, 8, 8])
    assert_array_equal(iq_grids.IQ2S_GRID[256], [25, 25, 25, 25, 25, 8, 25, 8])  # 0x0819081919191919
    assert_array_equal(iq_grids.IQ3XXS_GRID[5], [62, 12, 4, 4])  # 0x04040c3e
    assert_array_equal(iq_grids.IQ3S_GRID[256], [7, 5, 9, 5])  # 0x05090507
    assert_array_equal(iq_grids.IQ1S_GRID[0], [-1] * 8)  # 0xffffffffffffffff
    assert_array_equal(iq_grids.IQ1S_GRID[1], [1] + [-1] * 7)  # 0xffffffffffffff01
    assert_array_equal(iq_grids.IQ1S_GRID[2047], [1] * 8)  # 0x0101010101010101
    shapes = {"IQ2XXS_GRID": (256, 8), "IQ2XS_GRID": (512, 8), "IQ2S_GRID": (1024, 8),
              "IQ3XXS_GRID": (256, 4), "IQ3S_GRID": (512, 4), "IQ1S_GRID": (2048, 8)}
    for name, shape in shapes.items():
        grid = getattr(iq_grids, name)
        assert grid.shape == shape and grid.dtype == np.float32, name
        assert len(np.unique(grid, axis=0)) == shape[0], f"{name}: codewords are distinct"


def test_ksigns_is_the_even_parity_completion():
    for i, s in enumerate(iq_grids.KSIGNS):
        assert s & 0x7F == i
        assert bin(int(s)).count("1") % 2 == 0


def test_value_tables():
    assert_array_equal(iq_grids.KVALUES_IQ4NL, [-127, -104, -83, -65, -49, -35, -22, -10,
                                                1, 13, 25, 38, 53, 69, 89, 113])
    assert iq_grids.KVALUES_IQ4NL.dtype == np.float32


@pytest.mark.parametrize("name, ours", [
    ("IQ2_XXS", "IQ2XXS_GRID"), ("IQ2_XS", "IQ2XS_GRID"), ("IQ2_S", "IQ2S_GRID"),
    ("IQ3_XXS", "IQ3XXS_GRID"), ("IQ3_S", "IQ3S_GRID"), ("IQ1_S", "IQ1S_GRID"),
])
def test_grids_equal_gguf_py(name, ours):
    gguf_quants = pytest.importorskip("gguf.quants")
    cls = getattr(gguf_quants, name)
    cls.init_grid()
    grid = getattr(iq_grids, ours)
    assert_array_equal(cls.grid.reshape(grid.shape), grid)


def load_generator():
    spec = importlib.util.spec_from_file_location("gen_iq_grids", ROOT / "tools" / "gen_iq_grids.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generator_on_a_tiny_header():
    gen = load_generator()
    header = """
    GGML_TABLE_BEGIN(uint64_t, iq2xxs_grid, 2)
        0x0808080808080808, 0x080808080808082b, // a comment 0x1234
    GGML_TABLE_END()
    GGML_TABLE_BEGIN(int8_t, kvalues_iq4nl, 3)
        -127, -104, 113,
    GGML_TABLE_END()
    """
    tables = gen.parse_tables(header)
    assert tables["iq2xxs_grid"] == ("uint64_t", [0x0808080808080808, 0x080808080808082B])
    assert tables["kvalues_iq4nl"] == ("int8_t", [-127, -104, 113])
    text, levels = gen.render_grid("iq2xxs_grid", "G", tables["iq2xxs_grid"][1], 8, 8)
    assert levels == [8, 43]
    assert '"00000000 10000000"  # 0' in text
    assert gen.word_bytes(0xFFFFFFFFFFFFFF01, 8, signed=True) == [1] + [-1] * 7


@pytest.mark.llamacpp
def test_iq_grids_py_is_regenerated_from_ggml_common_h():
    root = os.environ.get("TINYSPEC_LLAMA_CPP")
    if not root:
        pytest.skip("set TINYSPEC_LLAMA_CPP to a llama.cpp checkout")
    header = Path(root) / "ggml" / "src" / "ggml-common.h"
    text = load_generator().render(header.read_text())
    assert text == (ROOT / "tinyspec" / "quants" / "iq_grids.py").read_text()


# ---------------------------------------------------------------- 2. hand-worked blocks

def test_iq2_xxs_by_hand():
    # every sub-block: indices (1, 0, 0, 0); aux = scale 3 | sign index 1 for group 0
    # db = 1 * (0.5 + 3) * 0.25 = 0.875; codeword 1 = (43, 8 x7); KSIGNS[1] = 0x81: elements 0 and 7 negative
    sub = [1, 0, 0, 0] + u32(3 << 28 | 1)
    raw = block(GGMLType.IQ2_XXS, f16(1.0), sub * 8)
    group0 = [-37.625, 7, 7, 7, 7, 7, 7, -7]
    assert_array_equal(iquants.dequantize_iq2_xxs(raw)[0], np.tile(group0 + [7] * 24, 8))


def test_iq2_xs_by_hand():
    # d = 2; group 0: index 0, sign index 127 (KSIGNS[127] = 0xff, all negative); scales 0x10 -> s = 0, 1
    # first 16 values: 2 * 0.5 * 0.25 * 8 = 2; last 16: 2 * 1.5 * 0.25 * 8 = 6
    qs = u16(127 << 9, 0, 0, 0) * 8
    raw = block(GGMLType.IQ2_XS, f16(2.0), qs, [0x10] * 8)
    assert_array_equal(iquants.dequantize_iq2_xs(raw)[0], np.tile([-2] * 8 + [2] * 8 + [6] * 16, 8))


def test_iq2_s_by_hand():
    # qh = 0x01: group 0 of each sub-block uses codeword 256 = (25, 25, 25, 25, 25, 8, 25, 8);
    # sign byte 0x01 on group 1; scales 0x21 -> 0.375 (first 16), 0.625 (last 16)
    qs = [0] * 32
    signs = [0x00, 0x01, 0x00, 0x00] * 8
    raw = block(GGMLType.IQ2_S, f16(1.0), qs, signs, [0x01] * 8, [0x21] * 8)
    sub = [9.375] * 5 + [3, 9.375, 3] + [-3] + [3] * 7 + [5] * 16
    assert_array_equal(iquants.dequantize_iq2_s(raw)[0], np.tile(sub, 8))


def test_iq3_xxs_by_hand():
    # qs byte 0 of each sub-block = 5 -> codeword (62, 12, 4, 4), others 0 -> (4, 4, 4, 4)
    # aux = scale 1 | sign index 3 (KSIGNS[3] = 0x03: elements 0, 1 negative); db = (0.5 + 1) * 0.5 = 0.75
    qs = ([5] + [0] * 7) * 8
    raw = block(GGMLType.IQ3_XXS, f16(1.0), qs, u32(*[1 << 28 | 3] * 8))
    sub = [-46.5, -9] + [3] * 30
    assert_array_equal(iquants.dequantize_iq3_xxs(raw)[0], np.tile(sub, 8))


def test_iq3_s_by_hand():
    # d = 0.5; all indices 0 -> (1, 1, 1, 1) except sub-block 0's first (qh bit 0 -> 256 = (7, 5, 9, 5));
    # scales byte 0 = 0x21 -> db 0.5 * 3 = 1.5 (sub-block 0), 0.5 * 5 = 2.5 (sub-block 1), 0.5 for the rest;
    # sign byte 0 = 0x80 -> element 7 negative
    qh = [0x01] + [0] * 7
    signs = [0x80] + [0] * 31
    raw = block(GGMLType.IQ3_S, f16(0.5), [0] * 64, qh, signs, [0x21, 0, 0, 0])
    expected = [10.5, 7.5, 13.5, 7.5, 1.5, 1.5, 1.5, -1.5] + [1.5] * 24 + [2.5] * 32 + [0.5] * 192
    assert_array_equal(iquants.dequantize_iq3_s(raw)[0], expected)


def test_iq1_s_by_hand():
    # sub-block 0: group 0 index 1 = (1, -1 x7), group 1 index 0x7ff = (1 x8) [qs 0xff, qh bits 3-5 = 7];
    # qh[0] scale 2 -> dl = 5, bit 15 -> delta -1/8.  Other sub-blocks: index 0 = (-1 x8), dl 1, delta +1/8
    qs = [1, 0xFF, 0, 0] + [0] * 28
    qh = u16(0x8000 | 2 << 12 | 7 << 3, *[0] * 7)
    raw = block(GGMLType.IQ1_S, f16(1.0), qs, qh)
    sub0 = [4.375] + [-5.625] * 7 + [4.375] * 8 + [-5.625] * 16
    assert_array_equal(iquants.dequantize_iq1_s(raw)[0], sub0 + [-0.875] * 224)


def test_iq1_m_by_hand():
    # d = 1.0 = fp16 0x3c00, nibbles (0x0, 0x0, 0xc, 0x3) in the tops of the 4 scale words;
    # scale word 0 low bits: s = 1 (values 0-15, dl 3), s = 2 (values 16-31, dl 5); all other s = 0 (dl 1)
    # group 0: index 0x7ff = (1 x8), delta +; group 1: index 0 = (-1 x8), qh high nibble bit 3 -> delta -
    qs = [0xFF] + [0] * 31
    qh = [0x87] + [0] * 15
    scales = u16(0x0000 | 2 << 3 | 1, 0x0000, 0xC000, 0x3000)
    raw = block(GGMLType.IQ1_M, qs, qh, scales)
    expected = [3.375] * 8 + [-3.375] * 8 + [-4.375] * 16 + [-0.875] * 224
    assert_array_equal(iquants.dequantize_iq1_m(raw)[0], expected)


def test_iq4_nl_by_hand():
    # d = 1; byte j holds code j (low) and 15 - j (high): values 0-15 = kvalues, 16-31 = kvalues reversed
    kvalues = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]
    raw = block(GGMLType.IQ4_NL, f16(1.0), [j | (15 - j) << 4 for j in range(16)])
    assert_array_equal(iquants.dequantize_iq4_nl(raw)[0], kvalues + kvalues[::-1])


def test_iq4_xs_by_hand():
    # 6-bit scale of sub-block g = low nibble g | high bits 0b10 << 4 = 32 + g, so dl = 0.5 * g;
    # except g = 0 whose high bits are 0b00: scale 0, dl = 0.5 * (0 - 32) = -16.
    # codes: all 8 (kvalue 1), except sub-block 7 byte 0 = 0x0f: value 0 -> 113, value 16 -> -127
    scales_h = u16(0xAAA8)
    scales_l = [0x10, 0x32, 0x54, 0x76]
    qs = [0x88] * 112 + [0x0F] + [0x88] * 15
    raw = block(GGMLType.IQ4_XS, f16(0.5), scales_h, scales_l, qs)
    expected = [-16] * 32 + [v for g in range(1, 7) for v in [0.5 * g] * 32]
    expected += [3.5 * 113] + [3.5] * 15 + [3.5 * -127] + [3.5] * 15
    assert_array_equal(iquants.dequantize_iq4_xs(raw)[0], expected)


# ---------------------------------------------------------------- 3. bit-exact against gguf-py

@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_random_blocks_match_gguf_py(qtype, rng):
    raw = with_finite_d(rng.integers(0, 256, (1000, qtype.type_size), dtype=np.uint8), qtype)
    ours = iquants.DEQUANT[qtype](raw)
    assert ours.shape == (1000, qtype.block_size)
    assert_bits_equal(ours, reference(raw, qtype))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_property_matches_gguf_py(qtype, data):
    raw = data.draw(arrays(np.uint8, (data.draw(st.integers(1, 6)), qtype.type_size)))
    raw = with_finite_d(raw, qtype)
    assert_bits_equal(iquants.DEQUANT[qtype](raw), reference(raw, qtype))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_nonfinite_d_matches_gguf_py_by_value(qtype, rng):
    raw = rng.integers(0, 256, (64, qtype.type_size), dtype=np.uint8)
    d_bits = np.array([0x7C00, 0xFC00, 0x7E00, 0xFE01] * 16, dtype=np.uint16)  # +inf, -inf, NaN, -NaN
    if qtype == GGMLType.IQ1_M:
        set_iq1_m_d_bits(raw, d_bits)
    else:
        raw[:, 0:2] = d_bits.astype("<u2").view(np.uint8).reshape(64, 2)
    with np.errstate(invalid="ignore"):
        ours = iquants.DEQUANT[qtype](raw)
    assert_array_equal(ours, reference(raw, qtype))  # NaNs compare equal position by position


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_public_dequantize_multi_row(qtype, rng):
    shape = (3, 512)
    n_blocks = 3 * 512 // qtype.block_size
    raw = with_finite_d(rng.integers(0, 256, (n_blocks, qtype.type_size), dtype=np.uint8), qtype)
    ours = dequantize(raw.reshape(-1), qtype, shape)
    assert ours.shape == shape and ours.dtype == np.float32
    assert_bits_equal(ours, reference(raw.reshape(3, -1), qtype))
    assert_bits_equal(ours.reshape(-1, qtype.block_size), iquants.DEQUANT[qtype](raw))
