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


# --- paged KV cache: attend_paged reads keys/values through a block table, in place --------------------------------

try:  # the oracle; a local copy of its contract until tinyspec/attention.py has it
    from tinyspec.attention import attend_paged as oracle_attend_paged  # noqa: E402
except ImportError:
    def oracle_attend_paged(q, k_pool, v_pool, table, n_past, scale):
        bs = k_pool.shape[1]
        n = n_past + q.shape[0]
        blocks = np.asarray(table[: -(-n // bs)], dtype=np.int64)
        keys = k_pool[blocks].reshape(-1, *k_pool.shape[2:])
        values = v_pool[blocks].reshape(-1, *v_pool.shape[2:])
        return attend(q, keys, values, n_past, scale)

# (T, n_past, H_kv, G, d, block_size): d = 256 (dot256) and 64, 33 (16 at a time, and a tail); n_past 0, a
# multiple of the block size, and not one
PAGED = [(T, n_past, 2, G, d, bs) for bs in (1, 4, 16) for d in (256, 64, 33) for G in (1, 4) for T in (1, 5)
         for n_past in (0, 13, 32)]


def paged_inputs(seed, T, n_past, H_kv, G, d, bs, spare_blocks=3):
    """A pool with blocks of other sequences (NaN: never to be read) and this sequence's blocks in shuffled
    order; the unfilled tail of its last block is NaN too. The table carries junk after the ids it needs."""
    rng = np.random.default_rng(seed)
    n = n_past + T
    used = -(-n // bs)
    n_blocks = used + spare_blocks
    q = rng.standard_normal((T, H_kv, G, d)).astype(np.float32)
    k_pool = np.full((n_blocks, bs, H_kv, d), np.nan, np.float32)
    v_pool = np.full((n_blocks, bs, H_kv, d), np.nan, np.float32)
    table = rng.permutation(n_blocks)[:used]
    keys = rng.standard_normal((n, H_kv, d)).astype(np.float32)
    values = rng.standard_normal((n, H_kv, d)).astype(np.float32)
    for j in range(n):
        k_pool[table[j // bs], j % bs] = keys[j]
        v_pool[table[j // bs], j % bs] = values[j]
    table = np.concatenate([table, [-1, n_blocks + 7]])  # entries past the needed ones are not read
    return q, k_pool, v_pool, table, np.float32(d ** -0.5)


def gathered(pool, table, n, bs):
    return pool[table[: -(-n // bs)]].reshape(-1, *pool.shape[2:])


@pytest.mark.parametrize("T,n_past,H_kv,G,d,bs", PAGED)
def test_attend_paged_is_attend_over_the_gathered_keys_bitwise(T, n_past, H_kv, G, d, bs):
    q, k_pool, v_pool, table, scale = paged_inputs(T + 3 * n_past + d + bs, T, n_past, H_kv, G, d, bs)
    n = n_past + T
    want = numba_attention.attend(q, gathered(k_pool, table, n, bs), gathered(v_pool, table, n, bs), n_past, scale)
    got = numba_attention.attend_paged(q, k_pool, v_pool, table, n_past, scale)
    assert got.shape == q.shape and got.dtype == np.float32
    assert np.array_equal(got, want)  # also: no NaN, so no row outside the sequence's positions was read


@pytest.mark.parametrize("T,n_past,H_kv,G,d,bs", PAGED)
def test_attend_paged_matches_the_oracle(T, n_past, H_kv, G, d, bs):
    q, k_pool, v_pool, table, scale = paged_inputs(5 * T + n_past + d + bs, T, n_past, H_kv, G, d, bs)
    want = oracle_attend_paged(q, k_pool, v_pool, table, n_past, scale)
    got = numba_attention.attend_paged(q, k_pool, v_pool, table, n_past, scale)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("T,n_past,H_kv,G,d,bs", [s for s in PAGED if s[0] > 1])
def test_attend_paged_is_batch_invariant(T, n_past, H_kv, G, d, bs):
    """Row t of a T-row paged pass == a one-row paged pass at position n_past + t, bit for bit."""
    q, k_pool, v_pool, table, scale = paged_inputs(11 * T + n_past + d + bs, T, n_past, H_kv, G, d, bs)
    batch = numba_attention.attend_paged(q, k_pool, v_pool, table, n_past, scale)
    for t in range(T):
        one = numba_attention.attend_paged(q[t:t + 1], k_pool, v_pool, table, n_past + t, scale)
        assert np.array_equal(one[0], batch[t]), t


def test_attend_paged_rejects_bad_tables_and_shapes():
    T, n_past, bs = 3, 10, 4  # 13 positions: 4 blocks
    q, k_pool, v_pool, table, scale = paged_inputs(1, T, n_past, 2, 2, 16, bs)
    n_blocks = k_pool.shape[0]
    with pytest.raises(ValueError, match="table too short"):
        numba_attention.attend_paged(q, k_pool, v_pool, table[:3], n_past, scale)
    for bad in (n_blocks, n_blocks + 100, -1):
        t = table.copy()
        t[2] = bad
        with pytest.raises(ValueError, match=f"block id {bad} out of range"):
            numba_attention.attend_paged(q, k_pool, v_pool, t, n_past, scale)
    with pytest.raises(ValueError, match="integer block ids"):
        numba_attention.attend_paged(q, k_pool, v_pool, table.astype(np.float64), n_past, scale)
    with pytest.raises(ValueError, match="k_pool/v_pool"):
        numba_attention.attend_paged(q, k_pool, v_pool[:, :, :1], table, n_past, scale)
    with pytest.raises(ValueError, match="k_pool/v_pool"):
        numba_attention.attend_paged(q, k_pool[..., :8], v_pool[..., :8], table, n_past, scale)
    with pytest.raises(ValueError, match="n_past"):
        numba_attention.attend_paged(q, k_pool, v_pool, table, -1, scale)
