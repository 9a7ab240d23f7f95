"""The Numba attention over the KV cache (tinyspec/fast/numba_attention.py) against the oracle attention.attend.

Float sums in another order than the oracle's BLAS, so equal to float32 rounding (the bound below), and
batch-invariant on its own: row t of a T-row call is bit for bit the one-row call at that position, which
is what keeps greedy speculation lossless on the cpu backend. Shapes: Qwen3.5's d = 256 (the dot256 path)
and odd d (the 16-at-a-time path and its tail), grouped heads, an empty and a long past.
"""

import numpy as np
import pytest

pytest.importorskip("numba")

from tinyspec.attention import attend  # noqa: E402
from tinyspec.fast import numba_attention  # noqa: E402

SHAPES = [(1, 0, 1, 1, 16), (4, 37, 2, 4, 256), (3, 5, 2, 2, 40), (5, 0, 1, 3, 7), (2, 300, 2, 4, 256), (4, 9, 3, 1, 33)]


def inputs(seed, T, n_past, H_kv, G, d, spare=3):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((T, H_kv, G, d)).astype(np.float32)
    keys = rng.standard_normal((n_past + T + spare, H_kv, d)).astype(np.float32)  # a cache with spare capacity
    values = rng.standard_normal((n_past + T + spare, H_kv, d)).astype(np.float32)
    keys[n_past + T:] = np.nan  # beyond the filled positions: must never be read
    values[n_past + T:] = np.nan
    return q, keys, values, np.float32(d ** -0.5)


@pytest.mark.parametrize("T,n_past,H_kv,G,d", SHAPES)
def test_attend_matches_the_oracle(T, n_past, H_kv, G, d):
    q, keys, values, scale = inputs(T + n_past + d, T, n_past, H_kv, G, d)
    want = attend(q, keys, values, n_past, scale)
    got = numba_attention.attend(q, keys, values, n_past, scale)
    assert got.shape == want.shape and got.dtype == np.float32
    # outputs are convex combinations of unit-scale values: absolute error of a few float32 ulps of 1
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)


@pytest.mark.parametrize("T,n_past,H_kv,G,d", SHAPES)
def test_attend_is_batch_invariant(T, n_past, H_kv, G, d):
    """Row t of a T-row pass == a one-row pass at position n_past + t, bit for bit."""
    q, keys, values, scale = inputs(7 * T + d, T, n_past, H_kv, G, d)
    batch = numba_attention.attend(q, keys, values, n_past, scale)
    for t in range(T):
        one = numba_attention.attend(q[t:t + 1], keys, values, n_past + t, scale)
        assert np.array_equal(one[0], batch[t]), t


def test_attend_rejects_a_cache_too_short():
    q, keys, values, scale = inputs(0, 3, 4, 2, 2, 16, spare=0)
    with pytest.raises(ValueError, match="do not hold"):
        numba_attention.attend(q, keys[:6], values[:6], 4, scale)


def test_cpu_model_uses_it():
    from tinyspec.backends import load_model
    from tinyspec.demo import TARGET

    assert load_model(TARGET, "cpu").kernels.attend is numba_attention.attend
