"""tinyspec/quants/q8_k.py: the Q8_K activation rounding of llama.cpp's CPU integer dot products.

Hand-worked blocks for each rule of quantize_row_q8_K_ref (ggml-quants.c): the value of largest
magnitude maps to exactly -127 whatever its sign, halves round to even, the first of two equal
magnitudes wins, a block of zeros gets d = 0; then the round trip error bound and the bsums.
(gguf-py has no Q8_K, the type never appears in files; the cpu kernels' copy of this rule is checked
bit for bit against this one in tests/test_numba_ops.py.)
"""

import numpy as np
import pytest

from tinyspec.quants.q8_k import bsums_q8_k, dequantize_q8_k, quantize_q8_k


def one_block(*head: float) -> np.ndarray:  # [1, 256]: the given values, then zeros
    x = np.zeros((1, 256), np.float32)
    x[0, :len(head)] = head
    return x


def test_negative_max_maps_to_minus_127():
    q, d = quantize_q8_k(one_block(-2.0, 1.0, 0.5, -0.25))
    # iscale = -127 / -2 = 63.5: 1.0 -> 63.5 -> 64 (half to even), 0.5 -> 31.75 -> 32, -0.25 -> -15.875 -> -16
    assert q[0, :5].tolist() == [-127, 64, 32, -16, 0]
    assert d[0, 0] == np.float32(1) / np.float32(63.5)


def test_positive_max_also_maps_to_minus_127():
    q, d = quantize_q8_k(one_block(2.0, -1.0, 0.5))
    # iscale = -63.5: 2 -> -127, -1 -> 63.5 -> 64, 0.5 -> -31.75 -> -32; d < 0 undoes the sign
    assert q[0, :3].tolist() == [-127, 64, -32] and d[0, 0] < 0
    assert np.allclose(dequantize_q8_k(q, d)[0, :3], [2.0, -1.0, 0.5], atol=abs(d[0, 0]) / 2)


def test_ties_of_magnitude_take_the_first_and_clamp_to_127():
    q, _ = quantize_q8_k(one_block(3.0, -3.0))
    assert q[0, :2].tolist() == [-127, 127]  # -3 * (-127 / 3) = 127: min(127, .) keeps it in range
    q, _ = quantize_q8_k(one_block(-3.0, 3.0))
    assert q[0, :2].tolist() == [-127, 127]


def test_half_to_even():
    # max 127 -> iscale = -1: q = rint(-x); -0.5 -> 0, -1.5 -> 2, -2.5 -> 2, 0.5 -> -0 = 0
    q, _ = quantize_q8_k(one_block(127.0, -0.5, -1.5, -2.5, 0.5))
    assert q[0, :5].tolist() == [-127, 0, 2, 2, 0]


def test_zero_block_and_independent_blocks():
    x = np.zeros((2, 512), np.float32)
    x[1, 256:] = np.linspace(-1, 1, 256, dtype=np.float32)
    q, d = quantize_q8_k(x)
    assert d.shape == (2, 2) and d[0].tolist() == [0.0, 0.0] and d[1, 0] == 0.0 and d[1, 1] != 0
    assert not q[0].any() and not q[1, :256].any()
    assert np.array_equal(dequantize_q8_k(q, d)[0], x[0])


def test_round_trip_error_is_half_a_step(rng):
    x = (rng.standard_normal((5, 1024)) * rng.choice([1e-6, 1.0, 1e6], (5, 1))).astype(np.float32)
    q, d = quantize_q8_k(x)
    step = np.abs(np.repeat(d, 256, axis=1))
    assert np.all(np.abs(q.astype(np.int32)) <= 127)
    assert np.all(np.abs(dequantize_q8_k(q, d) - x) <= step * (0.5 + 1e-5))


def test_bsums(rng):
    q, _ = quantize_q8_k(rng.standard_normal((3, 512), dtype=np.float32))
    bs = bsums_q8_k(q)
    assert bs.dtype == np.int16 and bs.shape == (3, 32)
    assert np.array_equal(bs, q.reshape(3, 32, 16).astype(np.int64).sum(-1))


@pytest.mark.parametrize("shape", [(256,), (1, 255), (2, 300)])
def test_shape_errors(shape):
    with pytest.raises(ValueError, match="multiple of 256"):
        quantize_q8_k(np.zeros(shape, np.float32))
