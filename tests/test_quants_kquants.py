"""K-quants (tinyspec/quants/kquants.py): Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.

1. one hand-worked super-block per type, expected values computed on paper from the byte layout,
   and the 6-bit scale/min packing of Q4_K/Q5_K as a round trip;
2. dequantizers bit-exact with gguf-py on 2,000 random blocks per type and as a hypothesis property;
3. quantizers (Q4_K, Q5_K, Q6_K): round-trip error bounds, zero/constant blocks, requantization, byte
   lengths and the public dispatch; with TINYSPEC_LLAMA_CPP set, byte equality with ggml's C reference
   quantizers (quantize_row_*_ref) compiled from that checkout.

Random blocks get every fp16 field (d, dmin) replaced by a finite fp16 (random sign, exponent and mantissa,
subnormals and zeros included): NaN * 0 and inf - inf make NaNs whose payload depends on operand order,
and no real file has such a scale.
"""

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from numpy.testing import assert_array_equal

from tinyspec.quants import GGMLType, dequantize, kquants, quantize

gguf_quants = pytest.importorskip("gguf.quants")
GQT = pytest.importorskip("gguf.constants").GGMLQuantizationType

from quant_helpers import assert_bits_equal, block, f16, rel_rms, with_finite_f16_fields  # noqa: E402

TYPES = list(kquants.DEQUANT)
F16_FIELDS = {  # byte offsets of the fp16 fields in each super-block
    GGMLType.Q2_K: [80, 82], GGMLType.Q3_K: [108], GGMLType.Q4_K: [0, 2], GGMLType.Q5_K: [0, 2],
    GGMLType.Q6_K: [208],
}


# ---------------------------------------------------------------- 1. by hand

# Q4_K / Q5_K scales: sc = (1, 2, 3, 4, 17, 33, 50, 63), m = (0, 1, 10, 20, 16, 31, 47, 62), packed as
#   bytes 0..3   sc[0..3] | (sc[4..7] >> 4) << 6  = 1|1<<6, 2|2<<6, 3|3<<6, 4|3<<6
#   bytes 4..7   m[0..3]  | (m[4..7] >> 4) << 6   = 0|1<<6, 1|1<<6, 10|2<<6, 20|3<<6
#   bytes 8..11  (sc[4..7] & 15) | (m[4..7] & 15) << 4 = 1|0<<4, 1|15<<4, 2|15<<4, 15|14<<4
SC = [1, 2, 3, 4, 17, 33, 50, 63]
M = [0, 1, 10, 20, 16, 31, 47, 62]
SCALES_12 = [0x41, 0x82, 0xC3, 0xC4, 0x40, 0x41, 0x8A, 0xD4, 0x01, 0xF1, 0xF2, 0xEF]


def test_scale_min_packing_by_hand():
    sc, m = kquants._unpack_scale_min(np.array([SCALES_12], np.uint8))
    assert_array_equal(sc[0], SC)
    assert_array_equal(m[0], M)
    assert_array_equal(kquants._pack_scale_min(sc, m)[0], SCALES_12)


@settings(max_examples=50, deadline=None)
@given(sc=arrays(np.uint8, (4, 8), elements=st.integers(0, 63)),
       m=arrays(np.uint8, (4, 8), elements=st.integers(0, 63)))
def test_scale_min_packing_round_trips(sc, m):
    sc2, m2 = kquants._unpack_scale_min(kquants._pack_scale_min(sc, m))
    assert_array_equal(sc2, sc)
    assert_array_equal(m2, m)


def test_q4_k_by_hand():
    # d = 1, dmin = 0.5; every qs byte 0x53: sub-blocks 0, 2, 4, 6 (low nibbles) get q = 3, odd ones q = 5
    # value = sc * q - 0.5 * m: 1*3-0, 2*5-0.5, 3*3-5, 4*5-10, 17*3-8, 33*5-15.5, 50*3-23.5, 63*5-31
    raw = block(GGMLType.Q4_K, f16(1.0), f16(0.5), SCALES_12, [0x53] * 128)
    expected = [3, 9.5, 4, 10, 43, 149.5, 126.5, 284]
    assert_array_equal(kquants.dequantize_q4_k(raw)[0], np.repeat(expected, 32))


def test_q5_k_by_hand():
    # d = dmin = 1; qs bytes 0x21: even sub-blocks get low 4 bits 1, odd ones 2;
    # qh bytes 0x42: the fifth bit (16) is set on sub-blocks 1 and 6
    # q = 1, 18, 1, 2, 1, 2, 17, 2;  value = sc * q - m
    raw = block(GGMLType.Q5_K, f16(1.0), f16(1.0), SCALES_12, [0x42] * 32, [0x21] * 128)
    expected = [1 * 1 - 0, 2 * 18 - 1, 3 * 1 - 10, 4 * 2 - 20,
                17 * 1 - 16, 33 * 2 - 31, 50 * 17 - 47, 63 * 2 - 62]
    assert_array_equal(kquants.dequantize_q5_k(raw)[0], np.repeat(expected, 32))


def test_q2_k_by_hand():
    # scales byte j = j | (15 - j) << 4 (sc = j, m = 15 - j); d = 0.5, dmin = 0.25
    # qs bytes 0xe4 = 0b11_10_01_00: the 32 values at shift s of each chunk get q = s, so the 16-value
    # sub-block j has q = (j % 8) // 2;  value = 0.5 * j * q - 0.25 * (15 - j)
    raw = block(GGMLType.Q2_K, [j | (15 - j) << 4 for j in range(16)], [0xE4] * 64, f16(0.5), f16(0.25))
    expected = [-3.75, -3.5, -2.25, -1.5, 1.25, 2.5, 6.75, 8.5,
                -1.75, -1.5, 3.75, 4.5, 11.25, 12.5, 20.75, 22.5]
    assert_array_equal(kquants.dequantize_q2_k(raw)[0], np.repeat(expected, 16))


def test_q3_k_by_hand():
    # 6-bit scales sc_i = 24 + i (signed sc_i - 32 = i - 8). Low nibbles: byte k holds sc_k (low) and
    # sc_{k+8} (high): (8 + k) | k << 4. High 2 bits: 1 for i < 8, 2 for i >= 8; byte 8 + r holds those of
    # sc_r, sc_{r+4}, sc_{r+8}, sc_{r+12} in bit pairs 0, 2, 4, 6: 1 | 1<<2 | 2<<4 | 2<<6 = 0xa5.
    # qs bytes 0xe4: 32-value group g has low bits g % 4; hmask bytes 0x55: groups 0, 2, 4, 6 have the
    # bit set (no -4), odd groups subtract 4. q per group: 0, -3, 2, -1, 0, -3, 2, -1.
    # sub-block i (16 values) is in group i // 2:  value = (i - 8) * q
    scales = [(8 + k) | k << 4 for k in range(8)] + [0xA5] * 4
    raw = block(GGMLType.Q3_K, [0x55] * 32, [0xE4] * 64, scales, f16(1.0))
    expected = [0, 0, 18, 15, -8, -6, 2, 1, 0, 0, -6, -9, 8, 10, -6, -7]
    assert_array_equal(kquants.dequantize_q3_k(raw)[0], np.repeat(expected, 16))


def test_q6_k_by_hand():
    # ql: half 0 bytes 0..31 = 0x21 (quarter 0 low 1, quarter 2 low 2), 32..63 = 0x43 (quarter 1: 3,
    # quarter 3: 4); half 1 likewise 0x65 and 0x87.  qh: half 0 bytes 0xe4 (quarter k high bits k),
    # half 1 bytes 0x1b (quarter k high bits 3 - k).  q = low | high << 4 - 32 per quarter:
    #   half 0: 1-32, 3+16-32, 2+32-32, 4+48-32 = -31, -13, 2, 20
    #   half 1: 5+48-32, 7+32-32, 6+16-32, 8-32 = 21, 7, -10, -24
    # int8 scales (one per 16 values) include the extremes -128 and 127; d = 0.25
    ql = [0x21] * 32 + [0x43] * 32 + [0x65] * 32 + [0x87] * 32
    qh = [0xE4] * 32 + [0x1B] * 32
    scales = [1, -1, 2, -2, 3, -3, 4, -4, 5, -5, 6, -6, 7, -7, -128, 127]
    raw = block(GGMLType.Q6_K, ql, qh, list(np.int8(scales).view(np.uint8)), f16(0.25))
    q = [-31, -13, 2, 20, 21, 7, -10, -24]
    expected = 0.25 * np.repeat(scales, 16) * np.repeat(q, 32)
    assert_array_equal(kquants.dequantize_q6_k(raw)[0], expected)


# ---------------------------------------------------------------- 2. dequantizers against gguf-py

@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_random_blocks_match_gguf_py(qtype, rng):
    raw = with_finite_f16_fields(rng.integers(0, 256, (2000, qtype.type_size), dtype=np.uint8), F16_FIELDS[qtype])
    assert_bits_equal(kquants.DEQUANT[qtype](raw), gguf_quants.dequantize(raw, GQT[qtype.name]))


@settings(max_examples=100, deadline=None)
@given(qtype=st.sampled_from(TYPES), data=st.data())
def test_dequantize_property(qtype, data):
    n_blocks = data.draw(st.integers(1, 4), label="n_blocks")
    raw = data.draw(arrays(np.uint8, (n_blocks, qtype.type_size)), label="raw")
    raw = with_finite_f16_fields(raw, F16_FIELDS[qtype])
    assert_bits_equal(kquants.DEQUANT[qtype](raw), gguf_quants.dequantize(raw, GQT[qtype.name]))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_dispatch_with_multi_row_shape(qtype, rng):
    raw = with_finite_f16_fields(rng.integers(0, 256, (3 * 512 // 256, qtype.type_size), dtype=np.uint8), F16_FIELDS[qtype])
    y = dequantize(raw.reshape(-1), qtype, (3, 512))
    assert y.dtype == np.float32 and y.shape == (3, 512)
    assert_bits_equal(y, kquants.DEQUANT[qtype](raw).reshape(3, 512))


# ---------------------------------------------------------------- 3. quantizers

QUANT_TYPES = list(kquants.QUANTIZE)
# Relative RMS error of quantize -> dequantize on the Gaussian (64, 1024) rows of test_round_trip_error,
# measured: Q4_K 0.0715, Q5_K 0.0363, Q6_K 0.0178 (about halving per extra bit; ggml's C gives the same bytes).
ERROR_BOUND = {GGMLType.Q4_K: 0.08, GGMLType.Q5_K: 0.04, GGMLType.Q6_K: 0.02}


def gaussian_rows(rng, rows=64, n=1024) -> np.ndarray:
    return rng.standard_normal((rows, n)).astype(np.float32)


@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
def test_round_trip_error(qtype, rng):
    x = gaussian_rows(rng)
    raw = quantize(x, qtype)
    assert raw.dtype == np.uint8 and raw.shape == (64, 1024 // 256 * qtype.type_size)
    y = dequantize(raw, qtype, x.shape)
    assert rel_rms(y, x) < ERROR_BOUND[qtype], f"{qtype.name}: relative RMS error {rel_rms(y, x):.5f}"


@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
def test_round_trip_error_does_not_depend_on_scale(qtype, rng):
    """The same rows at std 1e-2 (typical LLM weights) and 1e3 stay under the bound.
    Smaller is not free: the fp16 super-scale goes subnormal (< 6.1e-5). Q6_K's d is about 3 std / 4096,
    so already below std 0.08; measured relative RMS error at std 1e-3 / 1e-4: Q6_K 0.0202 / 0.112,
    Q5_K 0.0372 / 0.055, Q4_K 0.0716 / 0.080 (Q8_0 and Q4_0, whose d is max / 127 or max / 8, hold)."""
    x = gaussian_rows(rng)
    for factor in (1e-2, 1e3):
        y = dequantize(quantize(x * factor, qtype), qtype, x.shape)
        assert rel_rms(y, x * factor) < ERROR_BOUND[qtype], f"{qtype.name} x {factor}"


@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
def test_zero_block_is_all_zero_bytes(qtype):
    raw = kquants.QUANTIZE[qtype](np.zeros((2, 256), np.float32))
    assert_array_equal(raw, np.zeros((2, qtype.type_size), np.uint8))


@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
def test_constant_blocks_round_trip_nearly(qtype, rng):
    constant = np.repeat(rng.standard_normal((16, 1)).astype(np.float32) * 10, 256, axis=1)
    y = kquants.DEQUANT[qtype](kquants.QUANTIZE[qtype](constant))
    # only the fp16 rounding of d (or dmin) and the 6/8-bit sub-scale grid remain
    np.testing.assert_allclose(y, constant, rtol=2e-3, atol=0)


@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
def test_requantizing_dequantized_values_does_not_drift(qtype, rng):
    """Dequantized values are representable, but the scale search need not find that grid again.
    Measured on the (64, 1024) rows: Q4_K gives back the same bytes; Q6_K the same values, but 16% of
    blocks change bytes (a sub-block's int8 scale and its codes both negated, sc * q unchanged); Q5_K moves
    the values by 0.104 x the first trip's error, a third trip by 0.047 x. What must hold: each trip moves
    them less than the one before."""
    x = gaussian_rows(rng)
    y = dequantize(quantize(x, qtype), qtype, x.shape)
    y2 = dequantize(quantize(y, qtype), qtype, x.shape)
    assert rel_rms(y2, y) <= 0.25 * rel_rms(y, x), qtype.name
    y3 = dequantize(quantize(y2, qtype), qtype, x.shape)
    assert rel_rms(y3, y2) <= rel_rms(y2, y), qtype.name


@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
def test_quantize_dispatch_keeps_leading_axes(qtype, rng):
    x = rng.standard_normal((3, 512)).astype(np.float32)
    raw = quantize(x, qtype)
    assert raw.shape == (3, 512 // 256 * qtype.type_size)
    assert_array_equal(raw.reshape(-1, qtype.type_size), kquants.QUANTIZE[qtype](x.reshape(-1, 256)))


# ---------------------------------------------------------------- 3b. against ggml's C, opt-in

STUBS = """
#include <stdlib.h>
#include <stddef.h>
const char * ggml_type_name(int t) { return "?"; }
void ggml_abort(const char * file, int line, const char * fmt, ...) { abort(); }
size_t ggml_row_size(int t, long n) { abort(); }
size_t ggml_type_size(int t) { abort(); }
"""


@pytest.fixture(scope="module")
def ggml_quants_c(tmp_path_factory):
    """ggml-quants.c from $TINYSPEC_LLAMA_CPP, compiled alone with four stubs for what it links against.
    -ffp-contract=off keeps the C from fusing multiply-adds, so it rounds like NumPy."""
    root = os.environ.get("TINYSPEC_LLAMA_CPP")
    if not root:
        pytest.skip("set TINYSPEC_LLAMA_CPP to a llama.cpp checkout")
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    ggml = Path(root) / "ggml"
    out = tmp_path_factory.mktemp("ggml")
    (out / "stubs.c").write_text(STUBS)
    lib = out / "libggml_quants.so"
    subprocess.run([cc, "-O2", "-ffp-contract=off", "-fPIC", "-shared",
                    f"-I{ggml / 'include'}", f"-I{ggml / 'src'}", str(ggml / "src" / "ggml-quants.c"),
                    str(out / "stubs.c"), "-lm", "-o", str(lib)], check=True)
    return ctypes.CDLL(str(lib))


def c_call(lib, name: str, src: np.ndarray, dst: np.ndarray, n: int) -> np.ndarray:
    pointer = ctypes.c_void_p
    getattr(lib, name)(src.ctypes.data_as(pointer), dst.ctypes.data_as(pointer), ctypes.c_int64(n))
    return dst


@pytest.mark.llamacpp
@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
def test_quantizers_equal_ggml_reference_bytes(qtype, ggml_quants_c, rng):
    """Byte equality with quantize_row_q*_K_ref needs its left-to-right float sums (kquants._sum), the
    grid spanning the current best min, and the level-1 codes kept where a stored scale is 0."""
    n = 512
    gauss = rng.standard_normal((n, 256))
    cases = {
        "gaussian": gauss,
        "positive": rng.uniform(0, 1, (n, 256)),
        "heavy tails": rng.standard_t(2, (n, 256)),
        "sparse with -0": np.where(rng.random((n, 256)) < 0.9, -0.0, gauss),
        "tiny (fp16 d underflows)": gauss * 1e-6,
        "mixed scales": gauss * np.exp(rng.uniform(-8, 8, (n, 1))),
        "constant": np.repeat(gauss[:, :1], 256, axis=1),
        "small integers": rng.integers(-3, 4, (n, 256)),
    }
    name = f"quantize_row_{qtype.name.lower().replace('_k', '_K')}_ref"
    for label, x in cases.items():
        x = np.ascontiguousarray(x, dtype=np.float32)
        ref = c_call(ggml_quants_c, name, x, np.zeros((n, qtype.type_size), np.uint8), x.size)
        assert_array_equal(kquants.QUANTIZE[qtype](x), ref, err_msg=f"{qtype.name} {label}")


@pytest.mark.llamacpp
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_dequantizers_equal_ggml_c(qtype, ggml_quants_c, rng):
    raw = with_finite_f16_fields(rng.integers(0, 256, (500, qtype.type_size), dtype=np.uint8), F16_FIELDS[qtype])
    name = f"dequantize_row_{qtype.name.lower().replace('_k', '_K')}"
    ref = c_call(ggml_quants_c, name, raw, np.zeros((500, 256), np.float32), 500 * 256)
    assert_bits_equal(kquants.DEQUANT[qtype](raw), ref)
