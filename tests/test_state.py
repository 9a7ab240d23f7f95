"""Per-sequence state (tinyspec/state.py): the contiguous KV cache grows in place and keeps what it held."""

import numpy as np
from numpy.testing import assert_array_equal

from tinyspec.state import KVCache


def test_kv_cache_grows_past_its_capacity_and_keeps_every_position(rng):
    """Appends of 3, then 5 (past capacity 4: doubled to 8), then 20 (doubling to 16 is too small: grown to
    exactly 28) positions leave keys and values equal to the rows appended, in order; truncate forgets the
    tail, and a later append overwrites it."""
    H_kv, d = 2, 3
    cache = KVCache(H_kv, d, capacity=4)
    rows = [rng.standard_normal((T, H_kv, d)).astype(np.float32) for T in (3, 5, 20)]
    values = [-r for r in rows]
    for k, v in zip(rows, values):
        cache.append(k, v)
    assert cache.n == 28 and cache.k.shape == cache.v.shape == (28, H_kv, d)
    keys, vals = cache.contents()
    assert_array_equal(keys, np.concatenate(rows))
    assert_array_equal(vals, np.concatenate(values))

    cache.truncate(5)
    cache.append(rows[0], values[0])
    keys, vals = cache.contents()
    assert_array_equal(keys, np.concatenate([rows[0], rows[1][:2], rows[0]]))
    assert_array_equal(vals, -keys)
