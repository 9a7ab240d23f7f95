"""A pass's row map (tinyspec/fast/rowmap.py): its layout by hand, its claims, and the device path's layers on the oracle.

1. pack and views: every array of the map for two sequences of a pool, worked by hand; rope's angles are
   ops.rope_angles' bits; the table room is a power of two.
2. claim: what it claims (room, blocks, n) and what it refuses, claiming nothing (several sequences with caches
   of their own, another model's views of a pool).
3. The oracle's layers through rowmap.host_pass (the map built on the host, read by attention.attend_rows_own
   and the map's rope angles: the code a device pass runs) give the host path's bits: one sequence (prefill, a
   verify pass with a ring, decode steps past the cache's first capacity) and a batch in a pool.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

import tinyspec
from tinyspec.fast import rowmap
from tinyspec.model import Model
from tinyspec.ops import rope_angles
from tinyspec.paged import BlockPool
from tinyspec.placement import HOST

ASSETS = Path(tinyspec.__file__).resolve().parent / "assets"


@pytest.fixture(scope="module")
def models() -> tuple[Model, Model]:
    """(host path, device path) of the shipped tiny target on the oracle."""
    host = Model.from_gguf(ASSETS / "tiny-target.gguf")
    return host, host.with_placement(dataclasses.replace(HOST, device_pass=rowmap.host_pass))


def test_maps_planned_ahead_are_the_maps_the_passes_then_make(models):
    """rowmap.plan_ahead (an MTP drafting's one-row passes, packed with its first pass's upload) against what each
    pass's own plan makes when it comes: two head caches in a pool of blocks of 4, the first pass padded (filler
    forgotten with rewind, its blocks kept), three passes ahead for one sequence and two for the other, crossing
    blocks; then a contiguous cache of one sequence."""
    from tinyspec.mtp import MTPHead

    host, _ = models
    head = MTPHead(host)
    cfg = host.cfg
    pool = BlockPool(cfg, 32, 4)
    caches = [head.new_cache(pool), head.new_cache(pool)]
    for c, n in zip(caches, (6, 3)):
        c.claim(n)
    own, filler, depths = [2, 4], [3, 1], [3, 2]
    bounds = np.cumsum([0] + [o + f for o, f in zip(own, filler)])
    assert rowmap.plan(cfg, np.zeros(bounds[-1], np.int64), [[c] for c in caches], bounds) is not None
    starts = [c.n - f for c, f in zip(caches, filler)]
    for c, start in zip(caches, starts):
        c.rewind(start)
    ahead = rowmap.plan_ahead(cfg, caches, starts, depths)
    assert [seqs for _, _, seqs in ahead] == [[0, 1], [0, 1], [0]]
    for layout, planned, seqs in ahead:
        made = rowmap.plan(cfg, np.zeros(len(seqs), np.int64), [[caches[b]] for b in seqs], np.arange(len(seqs) + 1))
        assert made[0] == layout and np.array_equal(made[1], planned)
    one = head.new_cache()
    one.claim(5)
    (layout, planned, seqs), = rowmap.plan_ahead(cfg, [one], [5], [1])
    made = rowmap.plan(cfg, np.zeros(1, np.int64), [[one]], np.arange(2))
    assert made[0] == layout and np.array_equal(made[1], planned)


# ------------------------------------------------------------------------------------------ 1. pack and views
def test_pack_by_hand():
    """Two sequences of a pool of 10 blocks of 4: the first holds 5 positions and feeds 2 rows (positions 5, 6 in
    its second block, id 0), the second holds none and feeds 3 (positions 0..2 in its block 6)."""
    layout, buf = rowmap.pack(np.array([11, 12, 21, 22, 23]), [np.array([3, 0, 9]), np.array([6, 1])], [5, 0],
                              np.array([0, 2, 5]), 4, 10, n_rot=4, rope_base=10000.0)
    assert layout == rowmap.PassMap(R=5, B=2, half=2, room=8) and buf.dtype == np.int32 and buf.size == layout.size
    v = layout.views(buf)
    assert v.ids.tolist() == [11, 12, 21, 22, 23]
    assert v.dest.tolist() == [0 * 4 + 1, 0 * 4 + 2, 6 * 4 + 0, 6 * 4 + 1, 6 * 4 + 2]  # block id * 4 + row
    assert v.seq.tolist() == [0, 0, 1, 1, 1] and v.row0.tolist() == [0, 2] and v.n_past.tolist() == [5, 0]
    assert v.tab0.tolist() == [0, 2] and v.tables.tolist() == [3, 0, 6, 0, 0, 0, 0, 0]  # used ids, then zeros
    assert v.attention == (v.seq, v.row0, v.n_past, v.tab0, v.tables)
    cos, sin = rope_angles(np.array([5, 6, 0, 1, 2]), 4, 10000.0)
    assert v.cos.dtype == np.float32 and v.cos.tobytes() == cos.tobytes() and v.sin.tobytes() == sin.tobytes()


@pytest.mark.parametrize("n, room", [(0, 8), (1, 8), (8, 8), (9, 16), (16, 16), (17, 32), (1000, 1024)])
def test_room_is_a_power_of_two_of_at_least_eight(n, room):
    assert rowmap.room_for(n) == room


def test_pack_refuses_a_table_that_does_not_hold_the_rows():
    with pytest.raises(ValueError, match="table too short"):
        rowmap.pack(np.zeros(3, np.int64), [np.array([1])], [3], np.array([0, 3]), 4, 10, 4, 10000.0)
    with pytest.raises(ValueError, match="table room"):
        rowmap.pack(np.zeros(3, np.int64), [np.arange(10)], [37], np.array([0, 3]), 4, 10, 4, 10000.0, room=8)


# ------------------------------------------------------------------------------------------ 2. claim
def test_claim_of_one_sequence_with_its_own_cache(models):
    host, _ = models
    state = host.new_state()
    host.forward(np.arange(1, 61), state)  # 60 positions in a cache of capacity 64
    tables, n_pasts, block_size, n_blocks = rowmap.claim([state.layers], np.array([0, 9]))
    kv = [layer for layer in state.layers if hasattr(layer, "k")]
    assert n_pasts == [60] and n_blocks == 1 and [t.tolist() for t in tables] == [[0]]
    assert all(c.n == 69 and c.k.shape[0] == 128 for c in kv) and block_size == 128  # grown, then claimed
    assert state.pos == 60  # the state's count moves when the pass ran (Model.forward_batch)


def test_claim_refuses_what_one_map_cannot_say_and_claims_nothing(models):
    host, _ = models
    a, b = host.new_state(), host.new_state()
    assert rowmap.claim([a.layers, b.layers], np.array([0, 1, 2])) is None  # two caches, two sets of arrays
    assert all(layer.n == 0 for s in (a, b) for layer in s.layers if hasattr(layer, "n"))
    pool = BlockPool(host.cfg, 16, block_size=4)
    paged = [host.new_state(pool) for _ in range(2)]
    tables, n_pasts, block_size, n_blocks = rowmap.claim([s.layers for s in paged], np.array([0, 3, 8]))
    assert (n_pasts, block_size, n_blocks) == ([0, 0], 4, 16) and [len(t) for t in tables] == [1, 2]
    assert len(set(tables[0].tolist() + tables[1].tolist())) == 3  # each sequence its own blocks
    other = BlockPool(host.cfg, 16, block_size=4)
    assert rowmap.claim([paged[0].layers, host.new_state(other).layers], np.array([0, 1, 2])) is None  # two pools


# ------------------------------------------------------------------------------------------ 3. the device path's bits
def test_the_device_path_gives_the_host_paths_bits_for_one_sequence(models):
    """Prefill, a verify pass with a snapshot ring and its rollback, then decode steps past the cache's first
    capacity (64: the cache grows between passes): logits, hidden rows and every state equal, bit for bit."""
    host, device = models
    states = [host.new_state(), device.new_state()]
    rings = [host.new_ring(4), device.new_ring(4)]

    def both(tokens, ring=False):
        outs = [m.forward(np.array(tokens), s, ring=r if ring else None) for m, s, r in zip((host, device), states,
                                                                                                 rings)]
        for a, b in zip(*outs):
            assert a.tobytes() == b.tobytes()
        assert states[0].max_abs_diff(states[1]) == 0.0

    both(list(range(1, 40)))
    both([5, 6, 7, 8], ring=True)
    for ring, state in zip(rings, states):
        ring.restore(state, 1)
    assert states[0].max_abs_diff(states[1]) == 0.0
    for t in range(30):
        both([(7 * t) % 200 + 1])


def test_the_device_path_gives_the_host_paths_bits_for_a_batch_in_a_pool(models):
    host, device = models
    runs = []
    for m in (host, device):
        pool = BlockPool(m.cfg, 32, block_size=4)
        states = [m.new_state(pool) for _ in range(3)]
        outs = [m.forward_batch([np.arange(1, 8), np.arange(3, 5), np.arange(9, 20)], states)]
        outs.append(m.forward_batch([np.array([4, 5, 6]), np.array([7]), np.array([8, 9])], states))
        runs.append((outs, states))
    (outs_h, states_h), (outs_d, states_d) = runs
    for (lh, hh, bh), (ld, hd, bd) in zip(outs_h, outs_d):
        assert lh.tobytes() == ld.tobytes() and hh.tobytes() == hd.tobytes() and bh.tolist() == bd.tolist()
    assert all(a.max_abs_diff(b) == 0.0 for a, b in zip(states_h, states_d))
