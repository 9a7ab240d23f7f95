"""Many prompts at once: batch_generate runs the engine (speculate.py) over slots until every prompt has ended.

A server runs up to B sequences at once, each in a slot, so that every weight read of a pass serves B
sequences instead of one (decoding is memory-bound: the weights, not the arithmetic, are the cost of a
pass). The engine steps any number of slots with ONE verify pass a step; what many sequences need besides is
the scheduler's (scheduler.py): a KV pool of blocks shared by all sequences and their drafters (paged.py),
chunked prefill, admission by free blocks, preemption, and the prefix cache (prefix_cache.py).

    engine = Engine(model, drafter, policy, EngineOptions(slots=4, n_blocks=256, chunk=64))
    engine.add(SeqResult(0, prompt), max_new, seed)      # as many as you like; the rest wait for a slot
    while not engine.done(): engine.step()

batch_generate does exactly that for a list of prompts and returns them in input order with the batch's stats.

Exact, per sequence: each gets exactly the tokens it gets alone (speculate.py says why), whatever the chunk
size, the preemptions and the prefix hits; tests/test_batch.py checks it over random arrival schedules, greedy
and sampled.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from .drafting import Drafter, DraftPolicy, policy_for
from .model import Model
from .scheduler import EngineOptions, check_prompt
from .sequence import SeqResult
from .speculate import Engine


@dataclass
class BatchResult:
    sequences: list[SeqResult]  # in input order
    stats: dict


def batch_generate(model: Model, prompts: Sequence[Sequence[int]], max_new: int, drafter: Drafter | None = None,
                   draft_n: int | None = None, policy: DraftPolicy | None = None, seeds: Sequence[int] | None = None,
                   options: EngineOptions = EngineOptions(slots=4),
                   on_finish: Callable[[SeqResult], None] | None = None) -> BatchResult:
    """Generate up to max_new tokens after each prompt, up to options.slots sequences at a time (the rest wait in
    input order), in one KV pool. drafter: None for plain decoding, else the first slot's Drafter (the others get
    drafter.another()), proposing draft_n drafts per slot and step (default 3), or as many as `policy` plans.
    seeds[i]: prompt i's random stream (default: i), the seed its solo run takes for the same tokens. options: the
    engine's (scheduler.EngineOptions); without n_blocks the pool holds `slots` of the longest runs, their drafters'
    KV included. A prompt that cannot run (empty, too long, bad ids) is reported in its SeqResult.error and the
    others run. on_finish(result): called as each sequence ends (streamed output). A pool smaller than the
    sequences' needs is not an error: sequences wait, or are preempted and resumed (stats: preemptions)."""
    if not len(prompts):
        raise ValueError("no prompts: give at least one")
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
    if options.n_blocks is None:  # the pool: room for `slots` of the longest runs
        longest = max((len(r.prompt_tokens) for r in runnable), default=1) + max_new
        options = replace(options, run_length=longest)
    engine = Engine(model, drafter, policy, options, on_finish=on_finish)
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
