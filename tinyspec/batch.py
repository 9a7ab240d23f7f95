"""Many sequences at once: speculative decoding over slots, one ragged verify pass per step for all of them.

speculate.py runs the loop for one sequence. A server runs it for up to B sequences at once, each in a
slot, so that every weight read of a pass serves B sequences instead of one (decoding is memory-bound:
the weights, not the arithmetic, are the cost of a pass). Each step:

    join      free slots take waiting prompts (continuous batching). A prefill is the sequence's own pass,
              so it never changes another slot's numbers
    plan      the batch policy gives every active slot b its draft length k_b (0: a plain step for b)
    draft     every slot's drafter proposes; drafters that run a model (the MTP head, a draft model) make
              all slots' passes together, one pass per draft depth (run_together)
    verify    ONE target pass over every slot's [pending_b, d_b1 .. d_bk_b], rows packed slot after slot
              (bounds[b] = where slot b's rows start, like cu_seqlens): R = sum_b (k_b + 1) rows, every
              weight read once. The GDN conv and scan run per slot from its own state into its own ring;
              attention reads each slot's own KV blocks (Model.forward_batch)
    accept    per slot: its own rule on its own rows, with its own random stream (speculate.accept)
    rollback  per slot: its GDN state from its own ring slot m_b, its KV truncated (tail blocks back to the
              pool), its drafter told what was kept
    emit      per slot; EOS, a stop id or max_new inside a slot's run ends that slot alone: its run is cut
              there, its state is that of a sequence that plainly decoded exactly the emitted tokens, and
              its KV blocks go back to the pool for the next waiting prompt

Exact, per sequence. A row of the packed pass is bitwise the row that sequence computes alone (the matmul
is batch-invariant across rows, the mixers run per sequence; kernels.py), and nothing a slot decides reads
another slot's rows or random stream. So each sequence gets exactly the tokens it gets alone: greedy, its
plain greedy tokens whatever else is in the batch and whatever each k_b; sampled, with its seed, the tokens
of its solo speculative run with the same k (and the target's law with any k). tests/test_batch.py checks
both, over random arrival schedules.

What is allocated when (nothing per step): the KV pool (paged.py) and one rollback ring per slot at setup;
a sequence's GDN state and its drafter's state when it joins. A sequence is admitted only when the blocks
its longest run needs (prompt + max_new + k_max + 1 positions) are free of every other admitted sequence's
such need, so the pool never runs out mid-step; the blocks themselves are taken as positions are written,
so `kv_blocks_peak` reports memory used, not context reserved.

Does NOT include: prefill sharing the verify pass (chunked prefill mixed into decode, as vLLM and SGLang
schedule it), preemption, prefix caching, priorities.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import numpy as np

from .model import Model
from .paged import BlockPool
from .sampling import SamplingParams, pick
from .speculate import (NO_DRAFT, Draft, Drafter, FixedDraftLength, Plan, SpecStats, StopRule, accept,
                        check_lengths, cut_at_stop, token_marks)


# ----------------------------------------------------------------------------------------------- drafters
@dataclass(frozen=True)
class Ask:
    """What a slot asks its drafter for this step (speculate.Drafter.propose's arguments)."""
    slot: int
    pending: int
    k: int
    params: SamplingParams
    rng: np.random.Generator
    stop: StopRule | None = None


class BatchDrafter(Protocol):
    """A drafter for every slot: start and commit per slot, propose for all slots of a step at once."""

    stops_by_confidence: bool
    n_slots: int  # slots 0 .. n_slots-1 it holds a drafter for

    def start(self, slot: int, prompt: list[int], hidden: np.ndarray, k_max: int) -> None: ...

    def propose(self, asks: list[Ask]) -> list[Draft]: ...

    def commit(self, slot: int, fed: list[int], hidden: np.ndarray) -> None: ...


class EachAlone:
    """One speculate.Drafter per slot, each proposing on its own (a drafter without a model to batch: lookup,
    the synthetic drafter). make() builds a slot's drafter."""

    def __init__(self, make: Callable[[], Drafter], n_slots: int):
        self.drafters = [make() for _ in range(n_slots)]
        self.n_slots, self.stops_by_confidence = n_slots, self.drafters[0].stops_by_confidence

    def start(self, slot: int, prompt: list[int], hidden: np.ndarray, k_max: int) -> None:
        self.drafters[slot].start(prompt, hidden, k_max)

    def propose(self, asks: list[Ask]) -> list[Draft]:
        return [self.drafters[a.slot].propose(a.pending, a.k, a.params, a.rng, a.stop) if a.k else NO_DRAFT
                for a in asks]

    def commit(self, slot: int, fed: list[int], hidden: np.ndarray) -> None:
        self.drafters[slot].commit(fed, hidden)


class PassDrafter(Drafter, Protocol):
    """A drafter whose proposing is a coroutine of passes (mtp.MTPDrafter, draft.DraftModelDrafter)."""

    def drafting(self, pending: int, k: int, params: SamplingParams, rng: np.random.Generator,
                 stop: StopRule | None = None): ...  # a generator: yields passes, returns a Draft

    def draft_pass(self, asks: list) -> list: ...  # several sequences' passes made as one

    def another(self) -> "PassDrafter": ...  # a drafter for another sequence, sharing the model


class Together:
    """A PassDrafter per slot (first.another() for the others), all slots' drafting run together: one pass per
    draft depth over every slot still drafting (run_together), e.g. the MTP head for all slots at once."""

    def __init__(self, first: PassDrafter, n_slots: int):
        self.drafters = [first] + [first.another() for _ in range(n_slots - 1)]
        self.n_slots, self.stops_by_confidence = n_slots, first.stops_by_confidence

    def start(self, slot: int, prompt: list[int], hidden: np.ndarray, k_max: int) -> None:
        self.drafters[slot].start(prompt, hidden, k_max)

    def propose(self, asks: list[Ask]) -> list[Draft]:
        drafting = [self.drafters[a.slot].drafting(a.pending, a.k, a.params, a.rng, a.stop) for a in asks if a.k]
        drafts = iter(run_together(drafting, self.drafters[0].draft_pass))
        return [next(drafts) if a.k else NO_DRAFT for a in asks]  # k = 0: not asked, as speculate.py does

    def commit(self, slot: int, fed: list[int], hidden: np.ndarray) -> None:
        self.drafters[slot].commit(fed, hidden)


def run_together(drafting: list, step: Callable[[list], list]) -> list[Draft]:
    """Run several drafting coroutines to their Drafts in lockstep: each round, the passes every coroutine still
    running asks for are made by ONE step(asks) -> answers (speculate.run_alone is the one-sequence case).
    A coroutine's draws come from its own random stream in its own order, so its Draft is the one it makes
    alone (the passes are batch-invariant)."""
    drafts: list[Draft | None] = [None] * len(drafting)
    asks = {}
    for b, coroutine in enumerate(drafting):
        try:
            asks[b] = next(coroutine)
        except StopIteration as done:
            drafts[b] = done.value
    while asks:
        answers = step(list(asks.values()))
        for (b, _), answer in zip(list(asks.items()), answers):
            try:
                asks[b] = drafting[b].send(answer)
            except StopIteration as done:
                drafts[b] = done.value
                del asks[b]
    return drafts


# ------------------------------------------------------------------------------------------------ policy
class BatchPolicy(Protocol):
    """How many drafts each slot makes this step (speculate.DraftPolicy for a batch).

    plan(rooms)  rooms[b]: the drafts slot b's max_new leaves room for -> a Plan per slot
    observe(drafts, accepted, draft_s, verify_s, rows)   what the step drafted, kept and cost (rows: R)"""

    k_max: int

    def plan(self, rooms: list[int]) -> list[Plan]: ...

    def observe(self, drafts: list[Draft], accepted: list[int], draft_s: float, verify_s: float,
                rows: int) -> None: ...

    def summary(self) -> dict | None: ...


@dataclass
class SameDraftLength(FixedDraftLength):
    """The textbook batch policy: speculate.FixedDraftLength for every slot, k drafts every step (fewer where
    max_new leaves less room)."""

    def plan(self, rooms: list[int]) -> list[Plan]:
        return [FixedDraftLength.plan(self, room) for room in rooms]

    def observe(self, drafts, accepted, draft_s, verify_s, rows) -> None:
        pass


# ------------------------------------------------------------------------------------------------ engine
@dataclass
class SeqResult:
    index: int  # position in the input
    prompt_tokens: list[int]
    tokens: list[int] = field(default_factory=list)  # generated ids, exactly as the sequence alone gets them
    marks: list[str] = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    error: str | None = None  # the prompt could not run (empty, too long, bad ids): reported, others run


@dataclass
class BatchResult:
    sequences: list[SeqResult]  # in input order
    stats: dict


@dataclass
class _Slot:
    """An active sequence in a slot: everything the step reads and writes for it."""
    seq: SeqResult
    state: object  # its ModelState, KV in the shared pool
    rng: np.random.Generator
    max_new: int
    pending: int
    stats: SpecStats
    reserved: int  # pool blocks held back for its longest run
    t_join: float


def check_prompt(model: Model, prompt: list[int], max_new: int) -> str | None:
    """Why a prompt cannot run (None: it can): empty, ids outside the vocabulary, longer than the context."""
    bad = [t for t in prompt if not 0 <= t < model.cfg.n_vocab]
    if bad:
        return f"token id {bad[0]} is outside the vocabulary (0 .. {model.cfg.n_vocab - 1})"
    try:
        check_lengths(model, len(prompt), max_new)
    except ValueError as e:
        return str(e)
    return None


class Batch:
    """The engine: up to `slots` sequences decoding together, one step() at a time (batch_generate runs it).

    add(prompt, max_new, seed) queues a sequence; step() admits waiting ones into free slots, then makes one
    ragged verify pass for every active slot (the module docstring's steps); `active` maps slot -> _Slot, the
    state a test or a notebook may look at between steps. drafter: None (plain decoding) or a BatchDrafter;
    policy: a BatchPolicy (its k_max sizes the rings); n_blocks, block_size: the KV pool."""

    def __init__(self, model: Model, slots: int, n_blocks: int, block_size: int = 16,
                 drafter: BatchDrafter | None = None, policy: BatchPolicy | None = None,
                 params: SamplingParams = SamplingParams(), stop_ids: Sequence[int] = (),
                 on_finish: Callable[[SeqResult], None] | None = None):
        if not isinstance(slots, (int, np.integer)) or slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        if drafter is not None and drafter.n_slots < slots:
            raise ValueError(f"the drafter holds {drafter.n_slots} slots' drafters, the batch has {slots} slots")
        self.model, self.slots, self.drafter, self.params, self.on_finish = model, int(slots), drafter, params, on_finish
        self.policy = policy or SameDraftLength(0 if drafter is None else 3)
        self.k_max, self.stops = self.policy.k_max, {int(t) for t in stop_ids}
        self.pool = BlockPool(model.cfg, n_blocks, block_size, model.xp)
        self.rings = [model.new_ring(self.k_max + 1) for _ in range(self.slots)]  # per slot, allocated once
        self.waiting: deque[tuple[SeqResult, int, int]] = deque()  # (result, max_new, seed)
        self.active: dict[int, _Slot] = {}
        self.reserved = 0  # pool blocks promised to the active sequences' longest runs
        self.steps = self.rows = self.emitted = 0
        self.phase_s = {"prefill": 0.0, "draft": 0.0, "verify": 0.0, "accept": 0.0}

    def add(self, seq: SeqResult, max_new: int, seed: int) -> None:
        """Queue a sequence; one that cannot run gets seq.error instead (the others are not affected)."""
        seq.error = check_prompt(self.model, seq.prompt_tokens, max_new)
        if seq.error is None and (not isinstance(seed, (int, np.integer)) or seed < 0):
            seq.error = f"a seed must be a non-negative integer, got {seed}"
        if seq.error is None:
            self.waiting.append((seq, max_new, int(seed)))

    def done(self) -> bool:
        return not self.waiting and not self.active

    def step(self) -> None:
        t = time.perf_counter()
        self._join()
        self.phase_s["prefill"] += time.perf_counter() - t
        if self.active:
            self._decode()

    def _join(self) -> None:
        """Free slots take waiting sequences, in order, while the pool can hold their longest runs."""
        pool, model = self.pool, self.model
        for b in range(self.slots):
            while b not in self.active and self.waiting:
                seq, max_new, seed = self.waiting[0]
                need = pool.blocks_for(len(seq.prompt_tokens) + max_new + self.k_max + 1)
                if need > pool.n_blocks:  # could never fit: reported, the others go on
                    self.waiting.popleft()
                    seq.error = f"the KV pool ({pool.n_blocks} blocks of {pool.block_size}) cannot hold this run"
                    continue
                if self.reserved + need > pool.n_blocks:
                    return  # wait for a running sequence to give its blocks back
                self.waiting.popleft()
                t = time.perf_counter()
                state, rng = model.new_state(pool), np.random.default_rng(seed)
                logits, hidden = model.forward(np.array(seq.prompt_tokens), state)  # the sequence's own prefill
                self.reserved += need
                s = self.active[b] = _Slot(seq, state, rng, max_new, -1, SpecStats(self.k_max), need, t)
                if self.drafter is not None:
                    self.drafter.start(b, seq.prompt_tokens, hidden, self.k_max)
                if max_new == 0:
                    self._finish(b)
                    continue
                s.pending = pick(logits[-1], self.params, rng)
                seq.tokens, seq.marks = [s.pending], ["target"]
                if s.pending in self.stops or max_new == 1:
                    self._finish(b)

    def _decode(self) -> None:
        """One step for every active slot: plan, draft, ONE verify pass, then accept / rollback / emit per slot."""
        active, order, params = self.active, sorted(self.active), self.params  # order: where each slot's rows sit
        t = time.perf_counter()
        rooms = [min(self.k_max, active[b].max_new - len(active[b].seq.tokens) - 1) for b in order]
        plans = self.policy.plan(rooms)
        if len(plans) != len(rooms) or any(not 0 <= p.k <= room for p, room in zip(plans, rooms)):  # before drafting
            raise ValueError(f"the policy planned k = {[p.k for p in plans]} for slots whose rooms are {rooms}")
        asks = [Ask(b, active[b].pending, plan.k, params, active[b].rng, plan.stop) for b, plan in zip(order, plans)]
        drafts = self.drafter.propose(asks) if self.drafter is not None else [NO_DRAFT] * len(order)
        t_draft = time.perf_counter() - t
        t = time.perf_counter()
        fed = [[active[b].pending] + [int(d) for d in draft.tokens] for b, draft in zip(order, drafts)]
        rings = [self.rings[b] if draft.tokens else None for b, draft in zip(order, drafts)]
        logits, hidden, bounds = self.model.forward_batch(fed, [active[b].state for b in order], rings)
        t_verify = time.perf_counter() - t
        t = time.perf_counter()
        accepted = []
        for j, (b, draft) in enumerate(zip(order, drafts)):
            s, rows = active[b], slice(bounds[j], bounds[j + 1])
            n_accepted, new_token = accept(logits[rows], fed[j], draft, params, s.rng)
            run = cut_at_stop(fed[j][1 : 1 + n_accepted] + [new_token], self.stops, s.max_new - len(s.seq.tokens))
            n_keep = len(run)  # the run's last token is the next pending one: fed next step
            if n_keep < len(fed[j]):
                self.rings[b].restore(s.state, n_keep - 1)
                s.stats.rollbacks += 1
            if self.drafter is not None:
                self.drafter.commit(b, fed[j][:n_keep], hidden[rows][:n_keep])
            s.seq.tokens += run
            s.seq.marks += token_marks(draft, n_accepted)[:n_keep]
            s.pending = run[-1]
            s.stats.record(len(draft.tokens), n_accepted)
            accepted.append(n_accepted)
            self.emitted += n_keep
            if run[-1] in self.stops or len(s.seq.tokens) >= s.max_new:
                self._finish(b)
        self.steps, self.rows = self.steps + 1, self.rows + int(bounds[-1])
        self.policy.observe(drafts, accepted, t_draft, t_verify, int(bounds[-1]))
        self.phase_s["draft"] += t_draft
        self.phase_s["verify"] += t_verify
        self.phase_s["accept"] += time.perf_counter() - t

    def _finish(self, b: int) -> None:
        s = self.active.pop(b)
        s.state.release()  # every KV block back to the pool
        self.reserved -= s.reserved
        s.stats.emitted, s.stats.wall_s = len(s.seq.tokens), time.perf_counter() - s.t_join
        s.seq.stats = {k: v for k, v in s.stats.as_dict().items() if k != "phase_ms"}  # phases: the batch's (one pass)
        if self.on_finish:
            self.on_finish(s.seq)


def batch_generate(model: Model, prompts: Sequence[Sequence[int]], max_new: int, slots: int = 4,
                   drafter: BatchDrafter | None = None, draft_n: int | None = None,
                   policy: BatchPolicy | None = None, params: SamplingParams = SamplingParams(),
                   seeds: Sequence[int] | None = None, stop_ids: Sequence[int] = (), block_size: int = 16,
                   n_blocks: int | None = None,
                   on_finish: Callable[[SeqResult], None] | None = None) -> BatchResult:
    """Generate up to max_new tokens after each prompt, up to `slots` sequences at a time (the rest wait in
    input order). drafter: None for plain decoding, else a BatchDrafter (EachAlone, Together) proposing draft_n
    drafts per slot and step (default 3), or as many as `policy` plans. seeds[i]: prompt i's random stream
    (default: i), the seed its solo run takes for the same tokens. n_blocks: the KV pool (default: room for
    `slots` of the longest runs). A prompt that cannot run (empty, too long, bad ids) is reported in its
    SeqResult.error and the others run. on_finish(result): called as each sequence ends (streamed output)."""
    if not len(prompts):
        raise ValueError("no prompts: give at least one")
    if not isinstance(slots, (int, np.integer)) or slots < 1 or block_size < 1:
        raise ValueError(f"slots and block_size must be at least 1, got {slots} and {block_size}")
    if max_new < 0:
        raise ValueError(f"max_new (tokens to generate) must be >= 0, got {max_new}")
    policy = policy or SameDraftLength(0 if drafter is None else 3 if draft_n is None else draft_n)
    if draft_n is not None and draft_n != policy.k_max:
        raise ValueError(f"draft_n={draft_n} and a policy of k_max={policy.k_max} disagree: give one of them")
    seeds = list(range(len(prompts))) if seeds is None else [int(s) for s in seeds]
    if len(seeds) != len(prompts):
        raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts")
    if any(s < 0 for s in seeds):
        raise ValueError(f"seeds must be non-negative integers, got {min(seeds)}")
    results = [SeqResult(i, [int(t) for t in p]) for i, p in enumerate(prompts)]
    runnable = [r for r in results if check_prompt(model, r.prompt_tokens, max_new) is None]
    longest = max((len(r.prompt_tokens) for r in runnable), default=1) + max_new + policy.k_max + 1
    if n_blocks is None:
        n_blocks = slots * -(-longest // block_size)
    engine = Batch(model, slots, n_blocks, block_size, drafter, policy, params, stop_ids, on_finish)
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
             "kv_bytes_peak": pool.peak_used * pool.bytes_per_block()}
    if engine.policy.summary() is not None:
        stats["policy"] = engine.policy.summary()
    return BatchResult(results, stats)
