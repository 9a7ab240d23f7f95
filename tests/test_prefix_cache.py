"""Serving pieces of the batch engine on a hybrid model: chunked prefill, preemption, the prefix cache.

    chunks     a prompt fed in chunks of any size leaves the bits of a one-pass prefill (state and last row), on
               numpy and cpu: what makes chunked prefill and recompute-on-resume exact; with --chunk c a pass
               holds at most c prefill rows beside the running slots' rows
    pool       reference counts, idle cached blocks evicted least recently used, no write into a shared block
    prefix     prompts sharing a prefix prefill only the rest (rows counted), outputs unchanged; where the states
               are saved (prompt end, branch point, every N) and the memory they take
    preemption a pool too small for every sequence at once: the newest gives its blocks back and resumes,
               outputs unchanged, preemptions in the stats

tests/test_batch.py runs all of them together under random schedules, after every step.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_batch import BACKENDS, models, one_numba_thread, solo_greedy

from tinyspec.batch import batch_generate
from tinyspec.lookup import LookupDrafter
from tinyspec.mtp import MTPDrafter, MTPHead, shift_hidden
from tinyspec.paged import BlockPool, PagedKVCache, ViewTable
from tinyspec.prefix_cache import PrefixCache
from tinyspec.scheduler import EngineOptions
from tinyspec.sequence import SeqResult
from tinyspec.speculate import Engine

pytestmark = pytest.mark.usefixtures(one_numba_thread.__name__)  # the cpu backend on one thread here too

SYSTEM = [220, 11, 1, 4, 220, 11, 1, 4, 3, 5, 2, 9, 15, 7, 2, 11]  # a 16-token shared prefix ("system prompt")


# ------------------------------------------------------------------------------------------------ 1. chunks
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("chunk", [1, 3, 7])
def test_a_prompt_fed_in_chunks_leaves_the_bits_of_one_pass(backend, chunk):
    """T tokens in chunks of `chunk` rows (each chunk in a ragged pass beside another sequence's rows) equal one
    T-token pass: every GDN state, every KV position, and the last row's logits, bitwise."""
    target, _ = models(backend)
    prompt = SYSTEM + [5, 6, 7]
    whole = target.new_state()
    logits_whole, _ = target.forward(np.array(prompt), whole)
    pieces, other = target.new_state(), target.new_state()
    target.forward(np.array([9, 9]), other)
    for lo in range(0, len(prompt), chunk):
        logits, _, bounds = target.forward_batch([[3], prompt[lo : lo + chunk]], [other, pieces])
    assert pieces.max_abs_diff(whole) == 0.0
    assert np.array_equal(logits[bounds[1] :][-1], logits_whole[-1])


@pytest.mark.parametrize("chunk", [None, 2, 5])
def test_chunked_prefill_bounds_the_rows_a_running_slot_waits_for(chunk):
    """Two short prompts decode while a long one joins: with chunk c no pass holds more than c prefill rows beside
    the running rows, the long prompt takes ceil(T / c) steps to join, and every output is solo greedy."""
    target, _ = models("numpy")
    long_prompt = SYSTEM * 2  # 32 tokens
    engine = Engine(target, options=EngineOptions(slots=3, n_blocks=64, block_size=4, chunk=chunk))
    seqs = [SeqResult(0, [1, 2]), SeqResult(1, [7, 8]), SeqResult(2, long_prompt)]
    engine.add(seqs[0], 24, 0)  # long enough to run through the long prompt's 16 chunks of 2
    engine.add(seqs[1], 24, 1)
    engine.step()  # the short prompts' prefill
    engine.add(seqs[2], 4, 2)
    passes = []
    real = target.forward_batch

    def recording(tokens, states, rings=None, **kw):
        if len(tokens) == 3 and states[2].pos < len(long_prompt):  # a pass with a chunk of the long prompt (last)
            passes.append([len(t) for t in tokens])
        return real(tokens, states, rings, **kw)

    target.forward_batch = recording
    try:
        while not engine.done():
            engine.step()
    finally:
        del target.forward_batch
    joining = [p[2] for p in passes]
    assert sum(joining) == len(long_prompt)
    assert max(joining) == (chunk or len(long_prompt)) and len(joining) == -(-len(long_prompt) // (chunk or 99))
    assert all(p[:2] == [1, 1] for p in passes)  # the running slots went on, a row each
    for seq, max_new in zip(seqs, (24, 24, 4)):
        assert seq.tokens == solo_greedy("numpy", seq.prompt_tokens, max_new)


# ------------------------------------------------------------------------------------------------ 2. the pool
def test_pool_reference_counts_idle_blocks_and_lru_eviction():
    target, _ = models("numpy")
    pool = BlockPool(target.cfg, 3, 2)
    a, b = pool.take(), pool.take()
    pool.cached[a], pool.cached[b] = "entry a", "entry b"  # what a prefix cache does on register
    pool.share(a)
    assert pool.refs[a] == 2 and not pool.writable(a) and not pool.writable(b)  # shared / cached: read only
    pool.give_back([a, b])  # b idle (cached, nobody's), a still used once
    assert list(pool.idle) == [b] and pool.refs[a] == 1 and pool.available == 2
    pool.give_back([a])
    assert list(pool.idle) == [b, a]  # least recently used first
    pool.share(a)  # found again: in use
    assert list(pool.idle) == [b]
    c = pool.take()  # the free block first
    assert c not in (a, b) and pool.available == 1
    assert pool.take() == b and b not in pool.cached  # then the least recently used idle one, evicted
    with pytest.raises(RuntimeError, match="all in use"):
        pool.take()
    with pytest.raises(ValueError, match="does not use it"):
        pool.give_back([b, b])


def test_a_write_into_a_shared_block_raises():
    """The guard every KV append passes (BlockTable.check_writable): a sequence that shares a full block must
    never write it, and one whose block is cached must not either."""
    target, _ = models("numpy")
    engine = Engine(target, options=EngineOptions(slots=2, n_blocks=16, block_size=4, prefix_cache=True))
    engine.add(SeqResult(0, SYSTEM + [5]), 2, 0)
    while not engine.done():
        engine.step()
    state = target.new_state(engine.pool)
    match = engine.prefix_cache.lookup(SYSTEM + [6], 4)
    engine.prefix_cache.start(state, match)
    assert state.pos == 16 and all(engine.pool.refs[b] == 1 for b in state.table.blocks)
    layer = next(layer for layer in state.layers if isinstance(layer, PagedKVCache))
    layer.n = 12  # pretend a rollback into the shared blocks
    k = np.zeros((1, target.cfg.n_head_kv, target.cfg.head_dim), np.float32)
    with pytest.raises(RuntimeError, match="shared or cached"):
        layer.append(k, k)


def test_a_view_table_puts_chunk_c_of_layer_l_in_slab_c_times_l_plus_l_of_its_blocks():
    """The layout worked by hand (paged.ViewTable): the tiny target has S = 2 attention layers of rows [1, 64], so a
    block of 4 positions is 2 slabs of 4 such rows; slab a of block b is slab a * n_blocks + b of the view. A model
    of L = 3 layers of the same rows puts chunk c (4 positions) of its layer l in its slab i = 3c + l, slab i % 2
    of its block i // 2: 5 positions are 2 chunks, 6 slabs, 3 blocks."""
    target, _ = models("numpy")
    pool = BlockPool(target.cfg, 8, 4)
    table = ViewTable(pool, [0, 5, 9], 1, 64)
    assert table.block_size == 4 and table.blocks_for(4) == 2 and table.blocks_for(5) == 3 and table.blocks_for(0) == 0
    table.reserve(5)
    b0, b1, b2 = table.blocks
    assert list(table.ids(0)) == [0 * 8 + b0, 1 * 8 + b1]  # i = 0: (0, b0); i = 3: (1, b1)
    assert list(table.ids(5)) == [1 * 8 + b0, 0 * 8 + b2]  # i = 1: (1, b0); i = 4: (0, b2)
    assert list(table.ids(9)) == [0 * 8 + b1, 1 * 8 + b2]  # i = 2: (0, b1); i = 5: (1, b2)
    assert pool.used == 3
    table.keep(4)  # one chunk: 3 slabs, 2 blocks
    assert table.blocks == [b0, b1] and pool.used == 2 and list(table.ids(9)) == [b1]
    k_view, _, P = pool.view(2, 32)  # another row shape of the same 64 floats: 4 positions a slab
    assert P == 4 and k_view.shape == (2 * 8, 4, 2, 32) and np.shares_memory(k_view, pool.k[2])
    assert pool.view(1, 16)[2] == 16  # rows of 16 floats: 16 positions a slab
    with pytest.raises(ValueError, match="tile"):
        pool.view(3, 64)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_drafters_kv_in_the_pool_is_bitwise_their_own_and_takes_blocks_of_one_budget(backend):
    """The MTP head's cache (MTPHead.new_cache(pool)) and the draft model's state (its layout differs from the
    target's: BlockPool.table_for gives it a ViewTable) in the target's pool, fed in two passes: the same keys,
    values and outputs as their own contiguous caches fed in one, bitwise; their blocks and the target's come from
    one free list, none in two tables, and go back on truncate / release."""
    target, draft = models(backend)
    tokens = SYSTEM[:11]
    _, hidden = target.forward(np.array(tokens), target.new_state())
    rows = shift_hidden(hidden)
    pool = BlockPool(target.cfg, 16, 4, target.xp)
    head = MTPHead(target)
    paged, own = head.new_cache(pool), head.new_cache()
    h_paged = np.concatenate([head.forward(tokens[:5], rows[:5], paged)[1], head.forward(tokens[5:], rows[5:], paged)[1]])
    h_own = head.forward(tokens, rows, own)[1]
    assert paged.max_abs_diff(own) == 0.0 and np.array_equal(h_paged, h_own)
    assert len(paged.table.blocks) == 2  # 11 positions: 3 chunks of 4, 2 slabs a block
    state, alone = draft.new_state(pool), draft.new_state()
    assert isinstance(state.table, ViewTable)
    logits = np.concatenate([draft.forward(np.array(tokens[:5]), state)[0], draft.forward(np.array(tokens[5:]), state)[0]])
    assert np.array_equal(logits, draft.forward(np.array(tokens), alone)[0]) and state.max_abs_diff(alone) == 0.0
    trunk = target.new_state(pool)
    target.forward(np.array(tokens), trunk)
    held = paged.table.blocks + state.table.blocks + trunk.table.blocks
    assert len(set(held)) == len(held) == pool.used == 2 + 2 + 3
    paged.truncate(4)  # one chunk left: one block
    assert len(paged.table.blocks) == 1 and pool.used == 6
    state.release()
    trunk.release()
    paged.truncate(0)
    assert pool.used == 0 and sorted(pool.free) == list(range(16))


# ------------------------------------------------------------------------------------------------ 3. prefix cache
@pytest.mark.parametrize("backend", BACKENDS)
def test_prompts_sharing_a_prefix_prefill_only_the_rest(backend):
    """Eight prompts = a 16-token prefix + 3 tokens of their own, in 2 slots, blocks of 4: the first two are
    admitted together (nothing is cached yet), prefill everything and save the state after block 4, the deepest
    boundary before their last token (their own tokens start there); every later one starts from it. Outputs
    are solo greedy (MTP drafts: the head starts from the cached hidden rows); prefill rows drop from 8 x 19
    to 2 x 19 + 6 x 3."""
    target, _ = models(backend)
    prompts = [SYSTEM + [30 + i, 31 + i, 32 + i] for i in range(8)]
    off = batch_generate(target, prompts, 4, drafter=MTPDrafter(target), draft_n=2,
                         options=EngineOptions(slots=2, block_size=4))
    on = batch_generate(target, prompts, 4, drafter=MTPDrafter(target), draft_n=2,
                        options=EngineOptions(slots=2, block_size=4, prefix_cache=True))
    for a, b, prompt in zip(off.sequences, on.sequences, prompts):
        assert a.tokens == b.tokens == solo_greedy(backend, prompt, 4)
    assert off.stats["prefill_rows"] == 8 * 19
    # prompts 0 and 1 are admitted together (nothing cached yet), so both prefill all 19 rows; prompt 1 saves
    # the state at 16 (its prompt end's block boundary: the same block 4 as the branch point)
    assert on.stats["prefill_rows"] == 2 * 19 + 6 * 3
    assert on.stats["prefix_hits"] == 6 and on.stats["prefix_tokens_reused"] == 6 * 16
    assert [s.stats["prefix_tokens_reused"] for s in on.sequences] == [0, 0] + [16] * 6
    cfg = target.cfg
    one_state = sum(cfg.ssm_conv_channels * (cfg.ssm_conv_kernel - 1) * 4 +
                    cfg.ssm_n_v_heads * cfg.ssm_head_k_dim * cfg.ssm_head_v_dim * 4 for r in cfg.recurrent if r)
    assert on.stats["prefix_state_bytes"] == on.stats["prefix_states_kept"] * one_state


def test_state_save_points_prompt_end_branch_point_and_every_n():
    target, _ = models("numpy")
    cache = PrefixCache(BlockPool(target.cfg, 8, 4), max_states=4, state_every=2)
    # 23 tokens: its last token is in block 5 (0-based), so the deepest boundary before it is 5 blocks = 20
    assert cache.save_points(23, 0, 0) == [8, 16, 20]  # every 2 blocks, the end
    assert cache.save_points(23, 1, 3) == [8, 12, 16, 20]  # + the branch point at block 3
    assert cache.save_points(23, 5, 5) == []  # starts at its end already
    assert PrefixCache(BlockPool(target.cfg, 8, 4)).save_points(16, 0, 0) == [12]  # 16 tokens: block 3 ends at 12


def test_saved_states_are_capped_and_evicted_blocks_are_forgotten():
    """max_states bounds the GDN states kept (least recently used dropped); a pool that needs blocks evicts idle
    cached ones, and a lookup then finds nothing there (never a stale block)."""
    target, _ = models("numpy")
    prompts = [[40 + i] * 9 for i in range(4)]  # nothing shared: each saves its own end state (block 2)
    engine = Engine(target, options=EngineOptions(n_blocks=8, block_size=4, prefix_cache=True,
                                                  max_states=2))
    for i, p in enumerate(prompts):
        engine.add(SeqResult(i, p), 2, i)
    while not engine.done():
        engine.step()
    cache = engine.prefix_cache
    assert cache.states_saved == 4 and len(cache.with_state) == 2
    assert cache.lookup(prompts[0], 2).entry is None  # dropped (oldest)
    assert cache.lookup(prompts[3], 2).entry is not None
    # a long run takes every block: the idle cached ones are evicted
    engine.add(SeqResult(9, [1, 2, 3]), 25, 0)
    while not engine.done():
        engine.step()
    assert cache.lookup(prompts[3], 2).entry is None and cache.stats()["prefix_blocks_cached"] <= 8


def test_a_sequence_registers_again_after_the_first_copy_of_its_prefix_was_evicted():
    """The bug: an engine (slots 3, 17 blocks of 4, chunk 8, prefix cache) over three prompts sharing a 14-token prefix
    raised "block 7 is cached under other tokens" (notebook 09's preemption trace met it). A resumed sequence's
    copy of a block hung under an entry pointing at another sequence's copy of the same tokens; that copy was
    evicted, the sequence registered the block again from its own copy (a new entry id), and its next block,
    still cached under the old parent's id, was taken for another path's. It is the same path: the entry is
    found again under its new parent, and a lookup walks the sequence's own blocks."""
    target, _ = models("numpy")
    pool = BlockPool(target.cfg, 8, 2)
    cache = PrefixCache(pool)
    tokens = [1, 2, 3, 4, 5, 6, 7, 8]
    first = [pool.take(), pool.take()]  # a sequence writes blocks 0-1 of the tokens and ends: idle, cached
    cache.register(tokens, first, 2, None)
    pool.give_back(first)
    own = [pool.take() for _ in range(4)]  # another writes its own copy and two blocks more
    cache.register(tokens, own, 3, None)  # blocks 0-1: the first copy's entries; block 2 under them
    assert [pool.cached.get(b) is not None for b in own] == [False, False, True, False]
    while first[1] in pool.cached:  # the pool needs blocks: the first copy's block 1 is evicted (block 0 is not)
        pool.take()
    cache.register(tokens, own, 4, None)  # raised here
    match = cache.lookup(tokens + [9], 4)
    assert match.matched == 4
    assert [e.block for e in cache._walk(tokens, 4)] == [first[0]] + own[1:]


# ------------------------------------------------------------------------------------------------ 4. preemption
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("prefix_cache", [False, True])
def test_a_small_pool_preempts_the_newest_and_outputs_are_unchanged(backend, prefix_cache):
    """Three sequences in three slots with a pool that holds one longest run and a bit: admission takes them
    while blocks are free, and as they grow the newest is preempted (blocks back, resumed first, by recompute
    or from its prompt's saved state); outputs are solo greedy, every preemption is counted."""
    target, _ = models(backend)
    prompts = [SYSTEM[:9], SYSTEM[3:12], SYSTEM[5:14]]
    result = batch_generate(target, prompts, 14, drafter=LookupDrafter(), draft_n=3,
                            options=EngineOptions(slots=3, block_size=4, n_blocks=8, prefix_cache=prefix_cache))
    for seq, prompt in zip(result.sequences, prompts):
        assert seq.error is None and seq.tokens == solo_greedy(backend, prompt, 14)
    assert result.stats["preemptions"] > 0
    assert result.stats["preemptions"] == sum(s.stats["preemptions"] for s in result.sequences)
    assert result.sequences[0].stats["preemptions"] == 0  # the oldest always runs on
    assert result.stats["kv_blocks_peak"] <= 8
    if prefix_cache:  # a resumed sequence starts from its own prompt's saved state
        assert result.stats["prefix_hits"] > 0
