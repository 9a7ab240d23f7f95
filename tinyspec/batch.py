"""Many sequences at once: the speculative engine (speculate.py) over slots, one ragged verify pass per step.

A server runs up to B sequences at once, each in a slot, so that every weight read of a pass serves B
sequences instead of one (decoding is memory-bound: the weights, not the arithmetic, are the cost of a
pass). speculate.Engine already steps any number of slots; this module gives it what many sequences need:

    a KV pool    the attention layers' keys and values in fixed-size blocks shared by all sequences
                 (paged.py): a sequence takes blocks as its positions are written and gives them back when
                 a rollback truncates or the sequence ends, so a finished slot's memory serves the next prompt;
                 its drafter's KV (the MTP head's, a draft model's) takes blocks of the same pool, in the same bytes
    chunked prefill  a joining prompt is fed `chunk` rows per step as rows of the verify pass (speculate.Engine):
                 the running slots never stop for it, and wait at most `chunk` extra rows a step
    admission    a sequence joins a free slot while the pool's available blocks hold the next step of every
                 running sequence (its drafter's drafting too) and its own first chunk: no worst-case reservation
    preemption   when a step would not fit the pool (the running sequences grew), the newest sequence gives its
                 blocks back, its drafter's too, and waits in front of the queue; it resumes by prefilling its
                 prompt and tokens again (or from the prefix cache), its drafter rebuilt from what it handed back
                 (Drafter.release), exactly where it was (its stats count `preemptions`)
    prefix cache full blocks of prefilled prompts found again by their tokens and shared by reference, with GDN
                 states saved at chosen block boundaries (prefix_cache.py): a prompt that shares a cached prefix
                 prefills only the rest
    batch_generate   prompts in, results out in input order, with the batch's stats

Exact, per sequence: each gets exactly the tokens it gets alone (speculate.py says why), whatever the chunk
size, the preemptions and the prefix hits; tests/test_batch.py checks it over random arrival schedules, greedy
and sampled.

Does NOT include: the drafters' GDN states in the pool (a draft model's, like the target's, are per sequence and
not counted), swapping a preempted sequence's blocks to the host (it recomputes), priorities.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from .drafting import Drafter, DraftPolicy, policy_for
from .model import Model
from .paged import BlockPool
from .prefix_cache import PrefixCache
from .sampling import SamplingParams
from .speculate import Engine, SeqResult, blocks_per_run, check_prompt


@dataclass
class BatchResult:
    sequences: list[SeqResult]  # in input order
    stats: dict


class Batch(Engine):
    """The engine over a paged KV pool of n_blocks blocks of block_size positions (the module docstring):
    add(seq, max_new, seed) queues a sequence, step() runs one step of every slot (speculate.Engine).
    chunk: prefill rows per pass (None: each prompt whole); prefix_cache: share cached prefixes, keeping at most
    max_states saved GDN states (and one every state_every blocks, 0: only at prompt ends and branch points)."""

    def __init__(self, model: Model, slots: int, n_blocks: int, block_size: int = 16,
                 drafter: Drafter | None = None, policy: DraftPolicy | None = None,
                 params: SamplingParams = SamplingParams(), stop_ids: Sequence[int] = (),
                 on_finish: Callable[[SeqResult], None] | None = None, chunk: int | None = None,
                 prefix_cache: bool = False, max_states: int = 16, state_every: int = 0):
        pool = BlockPool(model.cfg, n_blocks, block_size, model.xp)
        cache = PrefixCache(pool, max_states, state_every) if prefix_cache else None
        super().__init__(model, slots, drafter, policy, params, stop_ids, pool, on_finish=on_finish, chunk=chunk,
                         prefix_cache=cache)


def batch_generate(model: Model, prompts: Sequence[Sequence[int]], max_new: int, slots: int = 4,
                   drafter: Drafter | None = None, draft_n: int | None = None,
                   policy: DraftPolicy | None = None, params: SamplingParams = SamplingParams(),
                   seeds: Sequence[int] | None = None, stop_ids: Sequence[int] = (), block_size: int = 16,
                   n_blocks: int | None = None,
                   on_finish: Callable[[SeqResult], None] | None = None, chunk: int | None = None,
                   prefix_cache: bool = False, max_states: int = 16, state_every: int = 0) -> BatchResult:
    """Generate up to max_new tokens after each prompt, up to `slots` sequences at a time (the rest wait in
    input order). drafter: None for plain decoding, else the first slot's Drafter (the others get
    drafter.another()), proposing draft_n drafts per slot and step (default 3), or as many as `policy` plans.
    seeds[i]: prompt i's random stream (default: i), the seed its solo run takes for the same tokens. n_blocks: the KV pool (default: room for
    `slots` of the longest runs, their drafters' KV included). A prompt that cannot run (empty, too long, bad ids) is reported in its
    SeqResult.error and the others run. on_finish(result): called as each sequence ends (streamed output).
    chunk, prefix_cache, max_states, state_every: as Batch. A pool smaller than the sequences' needs is not an
    error: sequences wait, or are preempted and resumed (stats: preemptions)."""
    if not len(prompts):
        raise ValueError("no prompts: give at least one")
    if not isinstance(slots, (int, np.integer)) or slots < 1 or block_size < 1:
        raise ValueError(f"slots and block_size must be at least 1, got {slots} and {block_size}")
    if max_new < 0:
        raise ValueError(f"max_new (tokens to generate) must be >= 0, got {max_new}")
    policy = policy_for(draft_n, policy, default=0 if drafter is None else 3)
    seeds = list(range(len(prompts))) if seeds is None else [int(s) for s in seeds]
    if len(seeds) != len(prompts):
        raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts")
    if any(s < 0 for s in seeds):
        raise ValueError(f"seeds must be non-negative integers, got {min(seeds)}")
    results = [SeqResult(i, [int(t) for t in p]) for i, p in enumerate(prompts)]
    runnable = [r for r in results if check_prompt(model, r.prompt_tokens, max_new) is None]
    longest = max((len(r.prompt_tokens) for r in runnable), default=1) + max_new + policy.k_max + 1
    if n_blocks is None:
        n_blocks = slots * blocks_per_run(model, drafter, longest, block_size)
    engine = Batch(model, slots, n_blocks, block_size, drafter, policy, params, stop_ids, on_finish, chunk,
                   prefix_cache, max_states, state_every)
    for r in results:
        engine.add(r, max_new, seeds[r.index])
    t0 = time.perf_counter()
    while not engine.done():
        engine.step()
    wall = time.perf_counter() - t0
    decode_s = wall - engine.phase_s["prefill"]
    pool, generated = engine.pool, sum(len(r.tokens) for r in results)
    stats = {"sequences": len(results), "failed": sum(r.error is not None for r in results), "slots": engine.slots,
             "k_max": engine.k_max, "generated": generated, "wall_s": wall,
             "tok_s": generated / wall if wall > 0 else 0.0,
             "decode_tok_s": engine.emitted / decode_s if decode_s > 0 else 0.0, "steps": engine.steps,
             "rows_per_pass": engine.rows / engine.steps if engine.steps else 0.0,
             "phase_ms": {k: 1000 * v for k, v in engine.phase_s.items()},
             "kv_block_size": pool.block_size, "kv_blocks": pool.n_blocks, "kv_blocks_peak": pool.peak_used,
             "kv_bytes_peak": pool.peak_used * pool.bytes_per_block(), "chunk": engine.chunk,
             "passes": engine.passes, "prefill_rows": engine.prefill_rows, "preemptions": engine.preemptions}
    if engine.prefix_cache is not None:
        stats |= engine.prefix_cache.stats()
    if engine.policy.summary() is not None:
        stats["policy"] = engine.policy.summary()
    return BatchResult(results, stats)
