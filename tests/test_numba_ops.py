"""Numba fused dequant-matmul (tinyspec/fast/numba_ops.py) against the NumPy oracle (tinyspec/ops.py).

1. one hand-worked Q8_0 block, and the two fp16 decoders on all 65,536 bit patterns;
2. get_rows bit-exact with ops.get_rows: quantized random weights, random block bytes, odd shapes,
   lengths of many 256-value spans, every F16 pattern, random BF16/F32 bit patterns;
3. quant_linear within 1.1 * in * 2^-23 * (|x| @ |W|^T) of ops.quant_linear (the float32 rounding bound
   of two summation orders, see the module docstring), for every supported type, and within 1e-6 of
   that scale of the float64 dot;
4. batch invariance, bitwise: row t of a k-row call equals the 1-row call and the 16-row call, for
   k = 1..16 (a hypothesis property over types, shapes and T), and for 1 vs 2 threads;
5. clear errors: unsupported or unknown types, sizes that do not fit, ids out of range;
6. the integer path (quant_linear_q8, what the cpu backend runs) for K-quants, IQ4_XS, Q8_0, Q4_0, Q5_0, IQ4_NL:
   its Q8_K rounding bit for bit tinyspec/quants/q8_k.py's and its Q8_0 rounding bit for bit legacy.py's
   quantize_q8_0 (fp16 scales: simd.round_f16 against NumPy), its products within the same bound of ops.quant_linear_q8,
   batch invariant (in 4.), the AVX-512 instructions bitwise their plain-IR twin, errors for other types.

Random blocks get their fp16 scale fields made finite (tests/quant_helpers.with_finite_f16_fields):
a NaN or inf scale gives NaN sums whose bits depend on the summation order.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.testing import assert_array_equal

pytest.importorskip("numba")

from quant_helpers import assert_bits_equal, block, f16, rounded_x, with_finite_f16_fields  # noqa: E402

from tinyspec import ops  # noqa: E402
from tinyspec.fast import numba_ops, simd  # noqa: E402
from tinyspec.quants import GGMLType, dequantize, quantize  # noqa: E402
from tinyspec.quants.q8_k import bsums_q8_k, dequantize_q8_k, quantize_q8_k  # noqa: E402

G = GGMLType
QUANTIZABLE = [G.F32, G.F16, G.BF16, G.Q8_0, G.Q4_0, G.Q4_K, G.Q5_K, G.Q6_K]
BLOCK_TYPES = [G.Q8_0, G.Q4_0, G.Q4_1, G.Q5_0, G.Q5_1, G.Q2_K, G.Q3_K, G.Q4_K, G.Q5_K, G.Q6_K,
               G.IQ1_S, G.IQ1_M, G.IQ2_XXS, G.IQ2_XS, G.IQ2_S, G.IQ3_XXS, G.IQ3_S, G.IQ4_NL, G.IQ4_XS,
               G.MXFP4, G.NVFP4]
F16_FIELDS = {G.Q8_0: [0], G.Q4_0: [0], G.Q4_1: [0, 2], G.Q5_0: [0], G.Q5_1: [0, 2], G.Q2_K: [80, 82],
              G.Q3_K: [108], G.Q4_K: [0, 2], G.Q5_K: [0, 2], G.Q6_K: [208],
              G.IQ1_S: [0], G.IQ1_M: [], G.IQ2_XXS: [0], G.IQ2_XS: [0], G.IQ2_S: [0], G.IQ3_XXS: [0],
              G.IQ3_S: [0], G.IQ4_NL: [0], G.IQ4_XS: [0], G.MXFP4: [], G.NVFP4: []}
# Row lengths per type: one block, several, a partial LANES chunk, and many 256-value spans.
LENGTHS = {G.F32: [1, 3, 257, 4099], G.F16: [2, 255, 4097], G.BF16: [5, 300],
           G.Q8_0: [32, 96, 4128], G.Q4_0: [32, 160], G.Q4_1: [32, 288], G.Q5_0: [32, 288], G.Q5_1: [32, 288],
           G.Q2_K: [256, 768], G.Q3_K: [256, 768], G.Q4_K: [256, 1280, 4352], G.Q5_K: [256, 512],
           G.Q6_K: [256, 4352],
           G.IQ1_S: [256, 768], G.IQ1_M: [256, 768], G.IQ2_XXS: [256, 1024], G.IQ2_XS: [256, 768],
           G.IQ2_S: [256, 768], G.IQ3_XXS: [256, 768], G.IQ3_S: [256, 768], G.IQ4_NL: [32, 96, 4128],
           G.IQ4_XS: [256, 1024], G.MXFP4: [32, 96, 4128], G.NVFP4: [64, 192, 4160]}


def random_weight(qtype: GGMLType, shape, rng) -> np.ndarray:  # -> [out, row bytes] uint8
    """A quantized N(0, 1) weight where tinyspec can quantize the type, else random finite blocks."""
    if qtype in QUANTIZABLE:
        return quantize(rng.standard_normal(shape, dtype=np.float32), qtype)
    return random_blocks(qtype, shape, rng)


def random_blocks(qtype: GGMLType, shape, rng) -> np.ndarray:  # -> [out, row bytes] uint8
    n_blocks = shape[0] * shape[1] // qtype.block_size
    raw = rng.integers(0, 256, (n_blocks, qtype.type_size), dtype=np.uint8)
    if qtype == G.MXFP4:  # E8M0 exponents near 2^0: products and sums stay finite
        raw[:, 0] = rng.integers(118, 136, len(raw))
    if qtype == G.IQ1_M:  # d is spread over the top nibbles of the 4 scale words (bytes 49, 51, 53, 55)
        bits = int(np.float16(rng.uniform(0.5, 2.0)).view(np.uint16))
        for word in range(4):
            raw[:, 49 + 2 * word] = (raw[:, 49 + 2 * word] & 0x0F) | (((bits >> (4 * word)) & 15) << 4)
    return with_finite_f16_fields(raw, F16_FIELDS[qtype]).reshape(shape[0], -1)


def assert_close_to_oracle(x, raw, qtype, shape):
    y = numba_ops.quant_linear(x, raw, qtype, shape)
    ref = ops.quant_linear(x, raw, qtype, shape)
    w = dequantize(raw, qtype, shape)
    bound = 1.1 * shape[1] * 2.0**-23 * (np.abs(x).astype(np.float64) @ np.abs(w).T.astype(np.float64))
    err = np.abs(y.astype(np.float64) - ref)
    assert y.dtype == np.float32 and y.shape == ref.shape
    assert np.all(err <= bound), f"{qtype.name} {shape}: max err/bound {np.max(err / np.maximum(bound, 1e-300)):.3g}"


# ---------------------------------------------------------------- 1. by hand


def test_q8_0_block_by_hand():
    """d = 0.5, q = -16..15: the row is 0.5 * q, so with x = 1 the dot is 0.5 * (-16) = -8."""
    raw = block(G.Q8_0, f16(0.5), list(np.arange(-16, 16, dtype=np.int8).view(np.uint8)))
    assert_array_equal(numba_ops.get_rows(raw, G.Q8_0, (1, 32), [0])[0], 0.5 * np.arange(-16, 16))
    x = np.ones((2, 32), np.float32)
    x[1, 16:] = 0  # second row: only q = -16..-1, so 0.5 * (-136) = -68
    assert_array_equal(numba_ops.quant_linear(x, raw, G.Q8_0, (1, 32)), [[-8.0], [-68.0]])


def test_scalar_f16_decoder_on_every_pattern():
    """_f16 (the block scales) widens all 65,536 fp16 patterns exactly like NumPy (NaN stays NaN)."""
    bits = np.arange(65536, dtype=np.uint16)
    ref = bits.view(np.float16).astype(np.float32)
    ours = np.array([numba_ops._f16(b & 0xFF, b >> 8) for b in bits.tolist()], dtype=np.float32)
    finite = ~np.isnan(ref)
    assert_array_equal(np.isnan(ours), ~finite)
    assert_bits_equal(ours[finite], ref[finite])


def test_f16_rows_on_every_pattern():
    """The vector F16 decoders keep even NaN payloads, signalling NaNs included: 16 at a time by vcvtph2ps
    (simd.halves16; rows of 32768) and the three-pass tail (exponent shift, * 2^112, sign and inf/NaN bits;
    rows of 13, all tail)."""
    raw = np.arange(65536, dtype="<u2").view(np.uint8)
    assert_bits_equal(numba_ops.get_rows(raw, G.F16, (2, 32768), [0, 1, -1]),
                      ops.get_rows(raw, G.F16, (2, 32768), [0, 1, -1]))
    rows = np.arange(65536 - 65536 % 13, dtype="<u2").view(np.uint8)
    ids = np.arange(65536 // 13)
    assert_bits_equal(numba_ops.get_rows(rows, G.F16, (65536 // 13, 13), ids),
                      ops.get_rows(rows, G.F16, (65536 // 13, 13), ids))


@pytest.mark.parametrize("qtype", [G.F32, G.BF16])
def test_random_bit_patterns_copy_exactly(qtype, rng):
    """Every F32/BF16 bit pattern (NaN, inf, subnormal) comes out with its bits unchanged."""
    raw = rng.integers(0, 256, (3, 2000 * qtype.type_size), dtype=np.uint8)
    assert_bits_equal(numba_ops.get_rows(raw, qtype, (3, 2000), [2, 0]), ops.get_rows(raw, qtype, (3, 2000), [2, 0]))


# ---------------------------------------------------------------- 2. get_rows bit-exact


@pytest.mark.parametrize("qtype", list(LENGTHS), ids=lambda t: t.name)
def test_get_rows_bit_exact(qtype, rng):
    for n_in in LENGTHS[qtype]:
        shape = (7, n_in)
        ids = np.array([6, 0, 3, 3, -1])
        for raw in (random_weight(qtype, shape, rng), random_blocks(qtype, shape, rng) if qtype in BLOCK_TYPES else None):
            if raw is None:
                continue
            assert_bits_equal(numba_ops.get_rows(raw, qtype, shape, ids), ops.get_rows(raw, qtype, shape, ids))
            assert_bits_equal(numba_ops.get_rows(raw.reshape(-1), qtype, shape, ids[:1]),
                              ops.get_rows(raw, qtype, shape, ids[:1]))  # flat bytes are accepted too


def test_get_rows_empty_ids():
    raw = quantize(np.ones((4, 256), np.float32), G.Q4_K)
    assert numba_ops.get_rows(raw, G.Q4_K, (4, 256), np.array([], np.int64)).shape == (0, 256)


# ---------------------------------------------------------------- 3. quant_linear vs the oracle


@pytest.mark.parametrize("qtype", list(LENGTHS), ids=lambda t: t.name)
def test_quant_linear_matches_oracle(qtype, rng):
    for n_in in LENGTHS[qtype]:
        for n_out, T in ((1, 1), (13, 3), (67, 16)):
            shape = (n_out, n_in)
            x = rng.standard_normal((T, n_in), dtype=np.float32)
            assert_close_to_oracle(x, random_weight(qtype, shape, rng), qtype, shape)
            if qtype in BLOCK_TYPES:
                assert_close_to_oracle(x, random_blocks(qtype, shape, rng), qtype, shape)


def test_quant_linear_qwen_shapes(rng):
    """The Qwen3.5-0.8B projection shapes (hidden 1024, ffn 3584) in the Q4_K_M mix (random blocks:
    quantizing 3.7M values would take longer than the test)."""
    for qtype, shape in ((G.Q4_K, (3584, 1024)), (G.Q6_K, (1024, 3584)), (G.Q8_0, (1024, 1024))):
        x = rng.standard_normal((4, shape[1]), dtype=np.float32)
        assert_close_to_oracle(x, random_blocks(qtype, shape, rng), qtype, shape)


def test_accuracy_against_float64(rng):
    """Lane sums of in / 256 products keep y within ~2e-8 * S of the float64 dot (measured); the
    assertion leaves a 50x margin. S = |x| @ |W|^T, the scale of the rounding error."""
    for qtype, shape in ((G.Q4_K, (256, 1024)), (G.Q6_K, (128, 3584)), (G.F32, (64, 4099))):
        raw = random_weight(qtype, shape, rng)
        x = rng.standard_normal((3, shape[1]), dtype=np.float32)
        w = dequantize(raw, qtype, shape).astype(np.float64)
        exact, scale = x.astype(np.float64) @ w.T, np.abs(x).astype(np.float64) @ np.abs(w).T
        assert np.max(np.abs(numba_ops.quant_linear(x, raw, qtype, shape) - exact) / scale) < 1e-6


def test_degenerate_sizes(rng):
    raw = quantize(rng.standard_normal((5, 256), dtype=np.float32), G.Q4_K)
    assert numba_ops.quant_linear(np.zeros((0, 256), np.float32), raw, G.Q4_K, (5, 256)).shape == (0, 5)
    empty = np.zeros(0, np.uint8)
    assert numba_ops.quant_linear(np.ones((3, 256), np.float32), empty, G.Q4_K, (0, 256)).shape == (3, 0)
    assert_array_equal(numba_ops.quant_linear(np.ones((2, 0), np.float32), empty, G.F32, (4, 0)), np.zeros((2, 4)))


def test_read_only_memory_map(tmp_path, rng):
    """The model hands in read-only views of the GGUF memory map; the caller's array stays untouched."""
    raw = quantize(rng.standard_normal((9, 512), dtype=np.float32), G.Q6_K)
    raw.tofile(tmp_path / "w.bin")
    mapped = np.memmap(tmp_path / "w.bin", dtype=np.uint8, mode="r", shape=raw.shape)
    x = rng.standard_normal((2, 512), dtype=np.float32)
    assert_bits_equal(numba_ops.quant_linear(x, mapped, G.Q6_K, (9, 512)), numba_ops.quant_linear(x, raw, G.Q6_K, (9, 512)))
    assert_bits_equal(numba_ops.get_rows(mapped, G.Q6_K, (9, 512), [8, 1]), ops.get_rows(raw, G.Q6_K, (9, 512), [8, 1]))
    assert raw.flags.writeable


# ---------------------------------------------------------------- 4. batch invariance


@settings(max_examples=40, deadline=None)
@given(qtype=st.sampled_from(list(LENGTHS)), n_out=st.integers(1, 40), length=st.integers(0, 2),
       seed=st.integers(0, 2**32 - 1), q8=st.booleans())
def test_batch_invariance_bitwise(qtype, n_out, length, seed, q8):
    """Row t of quant_linear(x[:k]) is bitwise quant_linear(x[t:t+1])[0] for every k = 1..16: a k-token
    verify pass reproduces one-token decode exactly (the greedy-lossless guarantee rests on it). The same
    for quant_linear_q8 on the K-quants (each row of x is rounded to Q8_K on its own)."""
    q8 = q8 and qtype in numba_ops.Q8_TYPES
    linear = numba_ops.quant_linear_q8 if q8 else numba_ops.quant_linear
    rng = np.random.default_rng(seed)
    n_in = LENGTHS[qtype][length % len(LENGTHS[qtype])]
    shape = (n_out, n_in)
    raw = random_weight(qtype, shape, rng)
    x = (rng.standard_normal((16, n_in)) * rng.choice([1e-3, 1.0, 1e3], (16, 1))).astype(np.float32)
    full = linear(x, raw, qtype, shape)
    for k in range(1, 17):
        assert_bits_equal(linear(x[:k], raw, qtype, shape), full[:k])
    for t in range(16):
        assert_bits_equal(linear(x[t:t + 1], raw, qtype, shape), full[t:t + 1])


def test_thread_count_does_not_change_bits(rng):
    numba = pytest.importorskip("numba")
    raw = quantize(rng.standard_normal((300, 512), dtype=np.float32), G.Q4_K)
    x = rng.standard_normal((5, 512), dtype=np.float32)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = numba_ops.quant_linear(x, raw, G.Q4_K, (300, 512))
    finally:
        numba.set_num_threads(before)
    assert_bits_equal(numba_ops.quant_linear(x, raw, G.Q4_K, (300, 512)), one)


# ---------------------------------------------------------------- 5. errors


@pytest.mark.parametrize("qtype", [G.TQ1_0, G.TQ2_0, G.F64, G.I8])
def test_unsupported_type_is_named(qtype):
    raw = np.zeros(qtype.row_nbytes(256) * 2, np.uint8)
    with pytest.raises(ValueError, match=qtype.name):
        numba_ops.quant_linear(np.zeros((1, 256), np.float32), raw, qtype, (2, 256))
    with pytest.raises(ValueError, match=qtype.name):
        numba_ops.get_rows(raw, qtype, (2, 256), [0])


def test_shape_errors(rng):
    raw = quantize(rng.standard_normal((4, 512), dtype=np.float32), G.Q4_K)
    x = np.zeros((1, 512), np.float32)
    with pytest.raises(ValueError, match="unknown ggml type"):
        numba_ops.quant_linear(x, raw, 999, (4, 512))
    with pytest.raises(ValueError, match="bytes"):
        numba_ops.quant_linear(x, raw, G.Q4_K, (5, 512))  # raw too short for 5 rows
    with pytest.raises(ValueError, match="bytes"):
        numba_ops.quant_linear(x, raw.view(np.int8), G.Q4_K, (4, 512))  # not uint8
    with pytest.raises(ValueError, match="block size"):
        numba_ops.quant_linear(np.zeros((1, 300), np.float32), raw, G.Q4_K, (4, 300))
    with pytest.raises(ValueError, match=r"x must be \[T, 512\]"):
        numba_ops.quant_linear(np.zeros((1, 256), np.float32), raw, G.Q4_K, (4, 512))
    with pytest.raises(ValueError, match=r"x must be"):
        numba_ops.quant_linear(np.zeros(512, np.float32), raw, G.Q4_K, (4, 512))
    with pytest.raises(IndexError):
        numba_ops.get_rows(raw, G.Q4_K, (4, 512), [4])
    with pytest.raises(IndexError):
        numba_ops.get_rows(raw, G.Q4_K, (4, 512), [-5])


@pytest.mark.parametrize("qtype,q8", [(G.Q4_K, False), (G.Q6_K, False), (G.Q8_0, False), (G.F16, False),
                                      (G.Q4_K, True), (G.Q5_K, True), (G.Q6_K, True), (G.Q8_0, True),
                                      (G.IQ4_XS, True), (G.Q4_0, True), (G.Q5_0, True), (G.IQ4_NL, True)])
def test_serial_and_parallel_paths_agree(qtype, q8, rng, monkeypatch):
    """Small matrices run on one thread (SERIAL_BELOW; the integer path has a serial compilation of its
    kernel); forcing the threaded path changes no bit."""
    linear = numba_ops.quant_linear_q8 if q8 else numba_ops.quant_linear
    shape = (45, 512)
    raw = random_weight(qtype, shape, rng)
    x = rng.standard_normal((5, 512), dtype=np.float32)
    serial = linear(x, raw, qtype, shape)
    monkeypatch.setattr(numba_ops, "SERIAL_BELOW", 0)
    assert_bits_equal(linear(x, raw, qtype, shape), serial)
    for t in range(5):
        assert_bits_equal(linear(x[t:t + 1], raw, qtype, shape), serial[t:t + 1])


# ---------------------------------------------------------------- 6. K-quants times Q8_K activations


def test_q8_k_rounding_is_the_oracle_bit_for_bit(rng):
    x = (rng.standard_normal((6, 1024)) * rng.choice([1e-30, 1e-3, 1.0, 1e4], (6, 1))).astype(np.float32)
    x[0, :256] = 0  # a zero block
    x[1, 256:512] = np.round(x[1, 256:512] * 4) / 4  # many exact halves after scaling
    x[1, 300], x[1, 301] = 8.0, -8.0  # a tie of magnitudes: the first wins
    x[2, :256] = -np.abs(x[2, :256])  # a negative max
    x[3, :256] = -0.0  # a zero block of negative zeros (the max is taken over the bits with the sign cleared)
    x[4, 1023] = 1e6  # the max in the last lane
    T, n = x.shape
    qx, dx, bs = np.zeros(T * n, np.int8), np.zeros(T * n // 256, np.float32), np.zeros(T * n // 16, np.int16)
    numba_ops._quantize_q8_k(x, n, qx, dx, bs)
    q, d = quantize_q8_k(x)
    assert_array_equal(qx.reshape(T, n), q)
    assert_bits_equal(dx.reshape(T, -1), d)
    assert_array_equal(bs.reshape(T, -1), bsums_q8_k(q))


def assert_q8_close_to_oracle(x, raw, qtype, shape):
    y = numba_ops.quant_linear_q8(x, raw, qtype, shape)
    ref = ops.quant_linear_q8(x, raw, qtype, shape)
    xq = rounded_x(x, qtype).astype(np.float64)
    w = dequantize(raw, qtype, shape).astype(np.float64)
    bound = 1.1 * shape[1] * 2.0**-23 * (np.abs(xq) @ np.abs(w).T)
    assert y.dtype == np.float32 and y.shape == ref.shape
    assert np.all(np.abs(y.astype(np.float64) - ref) <= bound)


@pytest.mark.parametrize("qtype", numba_ops.Q8_TYPES, ids=lambda t: t.name)
def test_quant_linear_q8_matches_oracle(qtype, rng):
    for n_in in LENGTHS[qtype]:
        for n_out, T in ((1, 1), (13, 3), (67, 16)):
            shape = (n_out, n_in)
            x = rng.standard_normal((T, n_in), dtype=np.float32)
            assert_q8_close_to_oracle(x, random_weight(qtype, shape, rng), qtype, shape)
            assert_q8_close_to_oracle(x, random_blocks(qtype, shape, rng), qtype, shape)
    shape = (3584, 1024) if qtype != G.Q6_K else (1024, 3584)  # a Qwen3.5-0.8B projection
    x = rng.standard_normal((4, shape[1]), dtype=np.float32)
    assert_q8_close_to_oracle(x, random_blocks(qtype, shape, rng), qtype, shape)


BLOCKS = [("q4_k", G.Q4_K, False), ("q4_k", G.Q4_K, True), ("q5_k", G.Q5_K, False), ("q5_k", G.Q5_K, True),
          ("q6_k", G.Q6_K, False), ("q6_k", G.Q6_K, True), ("q6_k_signed", G.Q6_K, True), ("iq4_xs", G.IQ4_XS, True),
          ("q2_k", G.Q2_K, False), ("q2_k", G.Q2_K, True), ("q3_k", G.Q3_K, False), ("q3_k", G.Q3_K, True)]


@pytest.mark.parametrize("kind, qtype, vnni", BLOCKS, ids=[f"{k}-{'vnni' if v else 'pairs'}" for k, _, v in BLOCKS])
def test_block_intrinsics_native_portable_and_exact(kind, qtype, vnni, rng):
    """One super-block times T = 3 input rows, through the block intrinsic of each kind and scale layout: the
    native instructions (where this CPU has them) and the plain-IR twin give the same bits, on random and
    extreme codes and activations (u8 63 x i8 -127, scales -128), and the 16 lanes of each row sum to the
    float64 dot product of the dequantized block and the row rounded to Q8_K (the integer sums are exact,
    each lane adds two rounded terms)."""
    from numba import njit

    have = simd.NATIVE_VNNI if vnni else simd.NATIVE_MADD
    if kind in ("q6_k_signed", "iq4_xs"):
        make = simd._q6_k_signed_block if kind == "q6_k_signed" else simd._iq4_xs_block
        twins = [make(False)] + ([make(True)] if have else [])
    else:
        twins = [simd._k_block(kind, False, vnni)] + ([simd._k_block(kind, True, vnni)] if have else [])

    unsigned_x = kind in ("q6_k_signed", "iq4_xs")  # a constant to Numba: the other call is pruned

    def runner(block):
        @njit
        def run(raw, qx, qxu, bs, dx, T):
            acc = np.zeros(16 * T, np.float32)
            if unsigned_x:
                block(raw, 0, qxu, 0, 256, dx, 0, 1, acc, T)
            else:
                block(raw, 0, qx, 0, 256, bs, dx, 0, 1, acc, T)
            return acc
        return run

    x = rng.standard_normal((3, 256)).astype(np.float32)
    x[2] = -np.abs(x[2]).max()  # every code -127
    qx, dx = quantize_q8_k(x)
    qx = qx.reshape(-1).astype(np.int8)
    qxu = (qx.astype(np.int16) + 128).astype(np.uint8)
    bs = bsums_q8_k(qx.reshape(3, 256)).reshape(-1).astype(np.int16)
    dx = dx.reshape(-1).astype(np.float32)
    bs = -(np.repeat(dx, 16) * bs.astype(np.float32))  # the kernel's offset terms, -(dx * bsum) per 16 values
    extreme = (quantize(np.full((1, 256), -3.0, np.float32), qtype) if qtype in QUANTIZABLE  # else every code
               else with_finite_f16_fields(np.full((1, qtype.type_size), 255, np.uint8), F16_FIELDS[qtype]))  # at max
    blocks = [random_blocks(qtype, (1, 256), rng), extreme]
    wide = kind == "q4_k" and vnni  # Q4_K on VNNI reads x in simd.Q4_K_WIDE_X order, its lanes in LANE_SWAP order
    qx_in = qx.reshape(3, 2, 128)[:, :, list(simd.Q4_K_WIDE_X)].reshape(-1) if wide else qx
    bs_in = bs.reshape(3, 16)[:, list(simd.LANE_SWAP)].reshape(-1) if wide else bs
    for raw in blocks:
        raw = np.ascontiguousarray(raw).reshape(-1)
        out = [runner(b)(raw, qx_in, qxu, bs_in, dx, 3) for b in twins]
        if wide:  # the same integers and floats as the value-order kernel, in other lanes: bit for bit
            value_order = [runner(simd._k_block(kind, native, vnni, wide=False))(raw, qx, qxu, bs, dx, 3)
                           for native in ([False, True] if have else [False])]
            for got, want in zip(out, value_order):
                assert_bits_equal(got.reshape(3, 16)[:, list(simd.LANE_SWAP)], want.reshape(3, 16))
        for other in out[1:]:
            assert_bits_equal(other, out[0])
        w = dequantize(raw, qtype, (1, 256)).astype(np.float64)[0]
        xq = dequantize_q8_k(qx.reshape(3, 256), dx.reshape(3, 1)).astype(np.float64)
        want = xq @ w
        got = out[0].reshape(3, 16).astype(np.float64).sum(1)
        assert np.allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(xq).max() * np.abs(w).max() * 256), (got, want)


PAIRED = [("q4_k", G.Q4_K), ("q5_k", G.Q5_K), ("q6_k_signed", G.Q6_K), ("q6_k", G.Q6_K), ("q2_k", G.Q2_K),
          ("q3_k", G.Q3_K), ("iq4_xs", G.IQ4_XS)]


@pytest.mark.parametrize("kind, qtype", PAIRED, ids=[k for k, _ in PAIRED])
def test_two_row_intrinsics_are_two_single_rows(kind, qtype, rng):
    """The rows = 2 block intrinsics (two weight rows a call, each input row's codes loaded once for both,
    what the kernel runs for T > 1; every K-quant and IQ4_XS) give each weight row the bits its one-row
    intrinsic gives, native and plain IR, on random and extreme blocks; so T = 1 (one row a call) and T > 1
    stay batch-invariant."""
    from numba import njit

    vnni = simd.VNNI_LAYOUT
    if kind == "q6_k_signed" and not vnni:
        pytest.skip("Q6_K takes the signed path on VNNI only")
    signed = kind in ("q6_k_signed", "iq4_xs")  # x' = qx + 128, no offsets
    natives = [False] + ([True] if (simd.NATIVE_VNNI if vnni or kind == "iq4_xs" else simd.NATIVE_MADD) else [])

    def make(native, rows):
        if signed:
            return (simd._q6_k_signed_block if kind == "q6_k_signed" else simd._iq4_xs_block)(native, rows=rows)
        return simd._k_block(kind, native, vnni, rows=rows)

    def runner(one, two):
        @njit
        def run(raw, o2, qx, qxu, bs, dx, T):
            acc1 = np.zeros(16 * T, np.float32)
            acc2 = np.zeros(16 * T, np.float32)
            pair = np.zeros(32 * T, np.float32)
            if signed:
                one(raw, 0, qxu, 0, 256, dx, 0, 1, acc1, T)
                one(raw, o2, qxu, 0, 256, dx, 0, 1, acc2, T)
                two(raw, 0, o2, qxu, 0, 256, dx, 0, 1, pair, T)
            else:
                one(raw, 0, qx, 0, 256, bs, dx, 0, 1, acc1, T)
                one(raw, o2, qx, 0, 256, bs, dx, 0, 1, acc2, T)
                two(raw, 0, o2, qx, 0, 256, bs, dx, 0, 1, pair, T)
            return acc1, acc2, pair
        return run

    T = 3
    x = rng.standard_normal((T, 256)).astype(np.float32)
    x[2] = -np.abs(x[2]).max()
    qx, dx = quantize_q8_k(x)
    qx = qx.reshape(-1).astype(np.int8)
    qxu = (qx.astype(np.int16) + 128).astype(np.uint8)
    bs = -(np.repeat(dx.reshape(-1), 16) * bsums_q8_k(qx.reshape(T, 256)).reshape(-1)).astype(np.float32)
    dx = dx.reshape(-1).astype(np.float32)
    extreme = (quantize(np.full((1, 256), -3.0, np.float32), qtype) if qtype in QUANTIZABLE  # else every code
               else with_finite_f16_fields(np.full((1, qtype.type_size), 255, np.uint8), F16_FIELDS[qtype]))  # at max
    raw = np.concatenate([random_blocks(qtype, (1, 256), rng).reshape(-1), np.asarray(extreme).reshape(-1)])
    for native in natives:
        acc1, acc2, pair = runner(make(native, 1), make(native, 2))(raw, qtype.type_size, qx, qxu, bs, dx, T)
        pair = pair.reshape(T, 2, 16)
        assert_bits_equal(pair[:, 0], acc1.reshape(T, 16))
        assert_bits_equal(pair[:, 1], acc2.reshape(T, 16))


def test_q8_0_rounding_is_the_oracle_bit_for_bit(rng):
    """The kernel's Q8_0 rounding of x (numba_ops._quantize_q8_0: codes as x' = q + 128, fp16-rounded scales)
    is tinyspec/quants/legacy.py quantize_q8_0 (ggml quantize_row_q8_0_ref), byte for byte."""
    x = (rng.standard_normal((7, 160)) * rng.choice([1e-30, 1e-6, 1e-3, 1.0, 1e4], (7, 1))).astype(np.float32)
    x[0, :32] = 0  # a zero block
    x[1, 32:64] = np.float32(127) / (2 * np.arange(32) + 1)  # max 127: x * (1 / d) lands on halves...
    x[1, 64:96] = (np.arange(32) - 15.5).astype(np.float32)  # ...and on exact halves (ties away from zero)
    x[2, :32] = -np.abs(x[2, :32])  # a negative max
    x[3, :32] = -0.0
    x[4, 159] = 6e6  # the max in the last lane; a scale near the fp16 limit
    x[5, :32] = rng.standard_normal(32).astype(np.float32) * 2e-6  # fp16-subnormal scales
    T, n = x.shape
    W = 64 * ((n // 32 + 1) // 2)
    qxu = np.full(T * W, 128, np.uint8)
    dxb = np.zeros(T * W // 32 * 8, np.float32)  # each scale 8 times
    numba_ops._quantize_q8_0(x, n, W, qxu, dxb)
    blocks = quantize(x, G.Q8_0).reshape(T, n // 32, 34)
    codes = (qxu.reshape(T, W)[:, :n].astype(np.int16) - 128).astype(np.int8)
    assert_array_equal(codes.reshape(T, n // 32, 32).view(np.uint8), blocks[:, :, 2:])
    d = blocks[:, :, :2].copy().view(np.float16)[..., 0].astype(np.float32)
    lanes = dxb.reshape(T, -1, 8)
    assert_bits_equal(lanes[:, :n // 32, 0], d)
    assert_bits_equal(lanes, np.repeat(lanes[:, :, :1], 8, axis=2))
    assert np.all(qxu.reshape(T, W)[:, n:] == 128) and np.all(lanes[:, n // 32:] == 0)


def test_round_f16_is_numpy_float16(rng):
    """simd.round_f16 (LLVM fptrunc to half, fpext back) is NumPy's float32 -> float16 -> float32: ties to
    even, fp16 subnormals, overflow to inf, on random bit patterns and every boundary region."""
    from numba import njit

    @njit
    def run(v, out):
        for i in range(v.size):
            out[i] = simd.round_f16(v[i])

    bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    near = np.arange(0x33000000, 0x47800000 + 4096, 4093, dtype=np.uint32)  # 2^-25 .. past 65536
    halves = np.arange(0, 2**16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32).view(np.uint32)
    v = np.concatenate([bits, near, near | 0x80000000, halves, halves + 1, halves - 1, halves + 0x1000]).view(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        want = v.astype(np.float16).astype(np.float32)
    got = np.empty_like(v)
    run(v, got)
    finite = ~np.isnan(want)
    assert_bits_equal(got[finite], want[finite])
    assert np.all(np.isnan(got[~finite]))


@pytest.mark.parametrize("kind, qtype", [("q8_0", G.Q8_0), ("q4_0", G.Q4_0), ("q5_0", G.Q5_0), ("iq4_nl", G.IQ4_NL)])
@pytest.mark.parametrize("blocks", [2, 1])
def test_q8_0_intrinsics_native_portable_and_exact(blocks, kind, qtype, rng):
    """simd.q8_0_pair and its Q4_0 / Q5_0 / IQ4_NL forms (two blocks) and the lone-block form, T = 3 rows: vpdpbusd
    and vpshufb (where this CPU has them) and the plain-IR twin give the same bits, on random and extreme
    blocks (Q8_0 weights -128 and 127 against x' 0 and 255; every nibble 0 or 15), and the 16 lanes of each
    row sum to the float64 dot of the dequantized blocks and the rounded rows (exact integer sums; each lane
    adds rounded terms)."""
    from numba import njit

    twins = [simd._q8_0_pair(False, blocks, kind)] + ([simd._q8_0_pair(True, blocks, kind)] if simd.NATIVE_VNNI else [])

    def runner(pair):
        @njit
        def run(raw, qxu, dxb, T):
            acc = np.zeros(16 * T, np.float32)
            pair(raw, 0, qxu, 0, 64, dxb, 0, 2, acc, T)
            return acc
        return run

    n = 32 * blocks
    x = rng.standard_normal((3, 64)).astype(np.float32)
    x[2, ::2], x[2, 1::2] = -1.0, 1.0  # x' = 0 and 255 (codes -127 ... 127 after the +128 shift)
    W = 64
    qxu, dxb = np.full(3 * W, 128, np.uint8), np.zeros(3 * 2 * 8, np.float32)
    numba_ops._quantize_q8_0(x[:, :n].copy(), n, W, qxu, dxb)
    size = qtype.type_size
    extremes = [np.where(np.arange(size - 2) % 2, 127, 128), np.full(size - 2, 0xF0)] if kind == "q8_0" else \
        [np.full(size - 2, 0xF0), np.full(size - 2, 0x0F)]
    extremes = [np.tile(np.concatenate([np.array(f16(0.75), np.uint8), e.astype(np.uint8)]), 2) for e in extremes]
    for raw in [random_blocks(qtype, (1, 64), rng).reshape(-1)] + extremes:
        raw = np.ascontiguousarray(raw)
        out = [runner(p)(raw, qxu, dxb, 3) for p in twins]
        for other in out[1:]:
            assert_bits_equal(other, out[0])
        w = dequantize(raw[:size * blocks], qtype, (1, n)).astype(np.float64)[0]
        xq = rounded_x(x[:, :n].copy(), qtype).astype(np.float64)
        want = xq @ w
        got = out[0].reshape(3, 16).astype(np.float64).sum(1)
        assert np.allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(xq).max() * np.abs(w).max() * n), (got, want)


@pytest.mark.parametrize("qtype", [G.F16, G.Q4_1, G.IQ2_XXS])
def test_quant_linear_q8_names_the_types_it_reads(qtype, rng):
    raw = random_weight(qtype, (2, 256), rng)
    with pytest.raises(ValueError, match="Q4_K, Q5_K, Q6_K"):
        numba_ops.quant_linear_q8(np.zeros((1, 256), np.float32), raw, qtype, (2, 256))


def test_no_two_cached_kernels_share_a_cache_entry():
    """The serial and parallel K-quant kernels are one py_func compiled twice. Numba's cache names an entry by
    the function's module, qualified name and first line (its index file, `numba_ops.<name>-<line>.py311.nbi`),
    not by its flags, so two cache=True dispatchers of one py_func share an entry and whichever compiles first is
    loaded for both (it happened: after the tests compiled the serial twin first, every "parallel" matmul ran
    on one thread). So every cached kernel in the fast modules must own its index file, and the two twins must
    differ in the flag that matters. Structural, no compile (a fresh-cache compile of both took 35 s)."""
    import numba
    from tinyspec.fast import numba_attention, numba_gdn

    cached = {}
    for module in (numba_ops, numba_gdn, numba_attention):
        for name, obj in vars(module).items():
            if isinstance(obj, numba.core.dispatcher.Dispatcher) and \
                    isinstance(obj._cache, numba.core.caching.FunctionCache):
                cached[f"{module.__name__}.{name}"] = obj._cache._cache_file._index_name
    assert "tinyspec.fast.numba_ops._quant_linear_q8_serial" in cached, sorted(cached)
    assert len(set(cached.values())) == len(cached), sorted(cached.items(), key=lambda kv: kv[1])
    assert numba_ops._quant_linear_q8_parallel.targetoptions.get("parallel")
    assert not numba_ops._quant_linear_q8_serial.targetoptions.get("parallel")


@pytest.mark.parametrize("kind, qtype", [("q8_0", G.Q8_0), ("q4_0", G.Q4_0), ("q5_0", G.Q5_0), ("iq4_nl", G.IQ4_NL)])
@pytest.mark.parametrize("nbk", [1, 2, 5])
def test_q8_0_rows_are_the_pair_calls_of_each_input_row(nbk, kind, qtype, rng):
    """simd.q8_0_rows (a decode step's and a verify pass's path: whole weight rows, every (row, input) sum in a
    register; two weight rows sharing one input's loads, or one row against 1, 2 or 4 input rows) gives bitwise
    what the pair loop gives: q8_0_pair over the full pairs, q8_0_single for an odd last block, then lane_sum16;
    with vpdpbusd and with the plain-IR twin."""
    from numba import njit

    pair, single = simd._q8_0_pair(False, 2, kind), simd._q8_0_pair(False, 1, kind)

    @njit
    def by_pairs(raw, qxu, dxb, nbk, bb, W, nb2, T):
        acc = np.zeros(16 * T, np.float32)
        for p in range(nbk // 2):
            pair(raw, 2 * bb * p, qxu, 64 * p, W, dxb, 2 * p, nb2, acc, T)
        if nbk % 2:
            p = nbk // 2
            single(raw, 2 * bb * p, qxu, 64 * p, W, dxb, 2 * p, nb2, acc, T)
        return np.array([simd.lane_sum16(acc, 16 * t) for t in range(T)], np.float32)

    def runner(rows_fn, n_rows):
        @njit
        def run(raw, qxu, dxb, nbk, row_bytes, W, nb2, n_out):
            y = np.zeros((4, n_out), np.float32)  # [input rows, weight rows]
            for r in range(0, n_out, n_rows):
                rows_fn(raw, r * row_bytes, row_bytes, nbk, qxu, 0, W, dxb, 0, nb2, 64, y, r, n_out)
            return y
        return run

    n, npair = 32 * nbk, (nbk + 1) // 2
    W, nb2, T = 64 * npair, 2 * npair, 4
    x = rng.standard_normal((T, n)).astype(np.float32)
    qxu, dxb = np.full(T * W, 128, np.uint8), np.zeros(T * nb2 * 8, np.float32)
    numba_ops._quantize_q8_0(x, n, W, qxu, dxb)
    raw = np.ascontiguousarray(random_blocks(qtype, (2, n), rng).reshape(-1))  # two weight rows
    row_bytes = qtype.type_size * nbk
    want = np.stack([by_pairs(raw[r * row_bytes:], qxu, dxb, nbk, qtype.type_size, W, nb2, T) for r in range(2)], 1)
    for native in [False, True] if simd.NATIVE_VNNI else [False]:
        for n_rows, inputs in ((2, 1), (1, 1), (1, 2), (1, 4)):
            got = runner(simd._q8_0_rows(native, kind, n_rows, inputs), n_rows)(raw, qxu, dxb, nbk, row_bytes, W, nb2, 2)
            assert_bits_equal(got[:inputs], want[:inputs])
