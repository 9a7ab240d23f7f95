"""The serving floor: which sequences ride the next pass, and with how many rows.

The loop (speculate.py) asks one question a step, `Scheduler.next_pass()`, and gets the decoding slots and the
joining slots' prefill chunks. Everything a server needs to answer it lives here, and nothing else touches it:

    admission   free slots take preempted sequences first (oldest first), then waiting ones in order; with a
                KV pool, only while its available blocks hold every running sequence's next step and the
                newcomer's first chunk (no worst-case reservation: memory grows with the tokens held)
    chunking    a joining prompt is fed `chunk` rows a pass at most, as rows of the verify pass, shared by the
                joining sequences in admission order: running sequences wait at most `chunk` extra rows a step.
                A T-token chunk computes the bits of T one-token passes, so chunking changes no output
    preemption  when a step would not fit the pool (sequences grew), the newest sequence gives its blocks back
                (its drafter's too, keeping what the drafter needs to restart: Drafter.release) and waits in
                front; it resumes by prefilling prompt + tokens[:-1] again, or from the prefix cache
    the budget  one pool, counted once: the target's KV (paged.KVTable.blocks_to_hold) and every drafter's
                (its Drafter.kv_table: a drafter's KV holds at most its sequence's positions plus its k drafts)
    prefix cache  a joining sequence starts from the deepest cached state (prefix_cache.py), and its chunks end
                at the save points, where the cache keeps a GDN state

Exact, per sequence: admission, chunks, preemptions and prefix hits decide only WHEN a sequence's rows ride a
pass, never what they compute; every sequence gets exactly its solo run's tokens (tests/test_batch.py checks it
over random arrival schedules, greedy and sampled).

EngineOptions is how every engine is built (generate, batch, serve, bench, the demo, the CLI): its flags are
checked once, there.

Does NOT include: swapping a preempted sequence's blocks to the host (it recomputes), priorities or fairness
beyond first come, first served.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .drafting import Drafter, check_draft_length
from .paged import BlockPool
from .prefix_cache import PrefixCache
from .sampling import SamplingParams
from .sequence import Running, SeqResult


def check_lengths(model, n_prompt: int, max_new: int, k_max: int = 0) -> None:
    """Reject a generation that cannot run before anything is allocated: an empty prompt, a negative or
    too long draft, or a prompt and output that do not fit the model's context (qwen35.context_length)."""
    if n_prompt < 1:
        raise ValueError("the prompt is empty: give at least one token")
    if max_new < 0:
        raise ValueError(f"max_new (tokens to generate) must be >= 0, got {max_new}")
    check_draft_length(k_max)
    n_ctx = model.cfg.n_ctx
    if n_prompt + max_new > n_ctx:
        room = f"at most {n_ctx - n_prompt} new tokens after this prompt" if n_prompt < n_ctx else "a shorter prompt"
        raise ValueError(f"a prompt of {n_prompt} tokens and {max_new} new tokens exceed the model's context length "
                         f"{n_ctx} (context_length in the file): ask for {room}")


def check_prompt(model, prompt: list[int], max_new: int) -> str | None:
    """Why a prompt cannot run (None: it can): empty, ids outside the vocabulary, longer than the context."""
    bad = [t for t in prompt if not 0 <= t < model.cfg.n_vocab]
    if bad:
        return f"token id {bad[0]} is outside the vocabulary (0 .. {model.cfg.n_vocab - 1})"
    try:
        check_lengths(model, len(prompt), max_new)
    except ValueError as e:
        return str(e)
    return None


def run_blocks(pool: BlockPool, drafter: Drafter | None, n_positions: int) -> int:
    """Pool blocks one run of n_positions holds at most: its KV, and its drafter's (Drafter.kv_table)."""
    table = None if drafter is None else drafter.kv_table
    return pool.blocks_for(n_positions) + (0 if table is None else table.blocks_for(n_positions))


def blocks_per_run(model, drafter: Drafter | None, n_positions: int, block_size: int) -> int:
    """run_blocks before a pool exists (what sizes one): the drafter's table counted on a one-block pool of the
    same geometry, since how many blocks a table takes depends on the geometry only."""
    probe = BlockPool(model.cfg, 1, block_size, model.xp)
    return run_blocks(probe, None if drafter is None else drafter.another(probe), n_positions)


def _at_least_one(value, what: str, none_ok: bool = False) -> None:
    if value is None and none_ok:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{what} must be >= 1, got {value}")


@dataclass(frozen=True)
class EngineOptions:
    """How an engine is built; every value is checked here, once (the CLI, batch, serve and bench pass theirs).

    slots            sequences decoded at once, one verify pass a step for all
    n_blocks         a KV pool of this many blocks (paged.py) for every sequence and its drafter, with admission by
                     free blocks and preemption
    run_length       or a pool sized for `slots` runs of this many positions (prompt + max_new; drafts included)
                     (neither: each sequence keeps its KV in arrays of its own, admitted as soon as a slot is free)
    block_size       positions a block holds
    chunk            prefill rows a pass takes at most (None: each joining prompt whole)
    prefix_cache     share cached prompt prefixes (prefix_cache.py; needs the pool), keeping at most max_states
                     saved GDN states, and one every state_every blocks (0: only at prompt ends and branch points)
    chunked_prefill  a pass of prefill rows alone runs the GDN layers in their chunked form (plain decoding only)
    params, stop_ids what a sequence samples with and stops at unless Engine.add gives its own"""
    slots: int = 1
    n_blocks: int | None = None
    run_length: int | None = None
    block_size: int = 16
    chunk: int | None = None
    prefix_cache: bool = False
    max_states: int = 16
    state_every: int = 0
    chunked_prefill: bool = False
    params: SamplingParams = SamplingParams()
    stop_ids: tuple[int, ...] = ()

    def __post_init__(self):
        _at_least_one(self.slots, "slots (sequences decoded at once)")
        _at_least_one(self.chunk, "chunk (prefill rows per pass)", none_ok=True)
        _at_least_one(self.block_size, "block_size (positions per KV block)")
        _at_least_one(self.n_blocks, "n_blocks (KV blocks in the pool)", none_ok=True)
        _at_least_one(self.run_length, "run_length (positions a run holds)", none_ok=True)
        if self.max_states < 0 or self.state_every < 0:
            raise ValueError(f"max_states and state_every must be >= 0, got {self.max_states}, {self.state_every}")
        object.__setattr__(self, "stop_ids", tuple(int(t) for t in self.stop_ids))

    @property
    def paged(self) -> bool:
        """Whether the sequences' KV lives in one pool of blocks."""
        return self.n_blocks is not None or self.run_length is not None

    def make_pool(self, model, drafter: Drafter | None, k_max: int) -> BlockPool | None:
        """The KV pool these options ask for (None: none); sized by run_length, it holds `slots` of the longest runs
        (run_length positions, a pass's k_max drafts and its drafter's KV included): admission then never waits."""
        if not self.paged:
            if self.prefix_cache:
                raise ValueError("a prefix cache shares KV blocks: it needs a pool (n_blocks or run_length)")
            return None
        n_blocks = self.n_blocks
        if n_blocks is None:
            n_blocks = self.slots * blocks_per_run(model, drafter, self.run_length + k_max + 1, self.block_size)
        return BlockPool(model.cfg, n_blocks, self.block_size, model.xp)


@dataclass
class Scheduler:
    """The sequences of one engine, by where they are: waiting, preempted, or running in a slot (`active`).

    drafters: each slot's drafter (None: plain decoding), whose KV the budget counts and whose release() a
    preemption keeps; k_max: drafts a step at most (a decoding sequence's next step is room + 1 rows)."""
    model: object  # the target Model (new_state: a sequence's state, in the pool if there is one)
    options: EngineOptions
    pool: BlockPool | None
    drafters: list | None
    k_max: int
    cache: PrefixCache | None = None
    waiting: deque = field(default_factory=deque)  # Running, never admitted, in arrival order
    preempted: deque = field(default_factory=deque)  # Running, resumed before anything waiting, oldest first
    active: dict = field(default_factory=dict)  # slot -> Running
    admitted: int = 0  # sequences admitted so far (Running.order)
    preemptions: int = 0
    states: dict = field(default_factory=dict)  # slot -> its ModelState, made once and reset for each sequence

    def __post_init__(self):
        if self.options.prefix_cache:
            self.cache = PrefixCache(self.pool, self.options.max_states, self.options.state_every)

    def done(self) -> bool:
        return not self.waiting and not self.preempted and not self.active

    def add(self, s: Running) -> None:
        self.waiting.append(s)

    def unqueue(self, seq: SeqResult) -> bool:
        """Take a waiting or preempted sequence out (it holds no memory); False if it is in neither queue."""
        for queue in (self.waiting, self.preempted):
            for s in queue:
                if s.seq is seq:
                    queue.remove(s)
                    return True
        return False

    def slot_of(self, seq: SeqResult) -> int | None:
        return next((b for b, s in self.active.items() if s.seq is seq), None)

    def next_pass(self) -> tuple[list[int], dict[int, int]] | None:
        """Which rows ride this pass: (the decoding slots, in row order; each joining slot's prefill rows), after
        admitting what fits and preempting while the step would not fit the pool. None: nothing to run."""
        self._join()
        chunks = self._chunks()
        while self.pool is not None and self.active and self._blocks_needed(chunks) > self.pool.available:
            self._preempt(max(self.active, key=lambda b: self.active[b].order))  # the newest
            chunks = self._chunks()
        if not self.active:
            return None
        return [b for b in sorted(self.active) if not self.active[b].prefilling], chunks

    def leave(self, b: int) -> Running:
        """Slot b's sequence ended: every KV block back to the pool, its drafter's too."""
        s = self.active.pop(b)
        if self.pool is not None:
            s.state.release()
            if self.drafters is not None:
                self.drafters[b].release()
        return s

    def chunk_done(self, s: Running) -> None:
        """A joining sequence's chunk went through a pass: where its prefill reached a save point or its end, the
        prefix cache registers its full blocks (with the hidden rows a drafter starts from) and saves its state."""
        pos, cache = s.state.pos, self.cache
        if cache is None or not (pos in s.save_at or pos == len(s.history)):
            return
        rows = np.concatenate(s.hidden_rows) if s.hidden_rows else None
        cache.register(s.history, s.state.table.blocks, pos // self.pool.block_size, rows)
        if pos in s.save_at:
            cache.save_state(s.history, pos // self.pool.block_size, s.state)

    # ---------------------------------------------------------------- admission
    def _join(self) -> None:
        """Free slots take preempted sequences (oldest first), then waiting ones in order, while the pool holds them;
        a run that could never fit the whole pool is refused (its SeqResult.error) and the next one is tried."""
        pool = self.pool
        for b in range(self.options.slots):
            while b not in self.active and (self.preempted or self.waiting):
                queue = self.preempted or self.waiting
                s = queue[0]
                if queue is self.waiting:
                    longest = len(s.seq.prompt_tokens) + s.max_new + self.k_max + 1
                    drafter = None if self.drafters is None else self.drafters[0]
                    if pool is not None and (need := run_blocks(pool, drafter, longest)) > pool.n_blocks:
                        queue.popleft()  # could never fit: reported, the others run
                        s.seq.error = (f"the KV pool ({pool.n_blocks} blocks of {pool.block_size}) cannot hold this "
                                       f"run: it needs {need}")
                        continue
                    s.t_join, s.history = time.perf_counter(), list(s.seq.prompt_tokens)
                if not self._admit(b, s):
                    return  # wait for running sequences to give blocks back
                queue.popleft()

    def _admit(self, b: int, s: Running) -> bool:
        """Give s slot b and a fresh state (from the prefix cache's deepest saved state, if any), if the pool holds
        it; False (nothing changed) if not."""
        pool, cache = self.pool, self.cache
        if s.seq.tokens:  # a preempted sequence: its history is everything committed; the last token is pending
            s.history, s.pending = s.seq.prompt_tokens + s.seq.tokens[:-1], s.seq.tokens[-1]
        match = None if cache is None else cache.lookup(s.history, (len(s.history) - 1) // pool.block_size)
        if pool is not None:
            start = 0 if match is None else len(match.blocks) * pool.block_size
            first = min(len(s.history) - start, self.options.chunk or len(s.history))
            own = pool.blocks_for(start + first) - start // pool.block_size  # its first chunk's new blocks
            if start + first == len(s.history):  # and its drafter's start
                own += self._drafter_blocks(b, len(s.history))
            idle_adopted = 0 if match is None else pool.idle_among(match.blocks)
            if self._blocks_needed(self._chunks()) + own > pool.available - idle_adopted:
                return False
        s.state, s.hidden_rows, s.save_at, s.order = self._fresh_state(b), [], [], self.admitted
        self.admitted += 1
        if match is not None:
            cache.start(s.state, match)
            if match.entry is not None:
                s.stats.prefix_tokens_reused += s.state.pos
                s.hidden_rows = list(match.hidden) if self.drafters is not None else []
            s.save_at = cache.save_points(len(s.history), len(match.blocks), match.matched)
        self.active[b] = s
        return True

    @property
    def pads(self) -> bool:
        """Every decoding sequence feeds k_max + 1 rows to a verify pass, its own and filler after them: where the
        engine drafts and the backend graphs its passes (Placement.pad_rows), so that a batch's verify passes take
        one shape per batch size (speculate.Engine._fed)."""
        return self.drafters is not None and self.model.placement.pad_rows

    def verify_rows(self, s: Running) -> int:
        """The rows a decoding sequence feeds its next verify pass at most: its room + 1, or k_max + 1 (pads)."""
        return self.k_max + 1 if self.pads else s.room(self.k_max) + 1

    def _fresh_state(self, b: int):
        """Slot b's state, fresh: made at the slot's first sequence, then reset in place (ModelState.reset) for each
        next one. So the device arrays of a slot's GDN layers are the same for every sequence it holds, and a CUDA
        graph captured for a pass over these slots replays for the sequences that come after (fast/cuda_pass.py keys
        a graph by the arrays it writes). A finished sequence's state is its slot's: the next admission reuses it."""
        state = self.states.get(b)
        if state is None:
            state = self.states[b] = self.model.new_state(self.pool)
        else:
            state.reset()
        return state

    def _chunks(self) -> dict[int, int]:
        """Prefill rows this step per joining slot: the chunk budget shared in admission order, each chunk ending
        at the sequence's next save point (the prefix cache keeps a state only where a pass ends)."""
        chunk = self.options.chunk
        budget, out = chunk if chunk is not None else float("inf"), {}
        for b, s in sorted(self.active.items(), key=lambda item: item[1].order):
            if s.prefilling and budget:
                end = min([p for p in s.save_at if p > s.state.pos] + [len(s.history)])
                out[b] = min(end - s.state.pos, budget)
                budget -= out[b]
        return out

    # ---------------------------------------------------------------- the budget
    def _drafter_blocks(self, b: int, n_positions: int) -> int:
        """New blocks slot b's drafter's KV takes to hold n_positions (0: no drafter, or one that keeps no KV)."""
        table = None if self.drafters is None else self.drafters[b].kv_table
        return 0 if table is None else table.blocks_to_hold(n_positions)

    def _blocks_needed(self, chunks: dict[int, int]) -> int:
        """New pool blocks this step takes at most: a joining sequence's chunk (and its drafter's start if the chunk
        ends its prefill), a decoding sequence's k + 1 rows and its drafter's drafting of k, at the most k."""
        if self.pool is None:
            return 0
        need = 0
        for b, s in self.active.items():
            rows = chunks.get(b, 0) if s.prefilling else self.verify_rows(s)
            need += s.state.table.blocks_to_hold(s.state.pos + rows)
            if s.prefilling and s.state.pos + rows == len(s.history):  # its drafter starts after this chunk
                need += self._drafter_blocks(b, len(s.history))
            elif not s.prefilling and s.room(self.k_max):  # its drafter drafts k <= room (+ 2: drafting.Drafter)
                need += self._drafter_blocks(b, s.state.pos + s.room(self.k_max) + 2)
        return need

    def _preempt(self, b: int) -> None:
        """Give slot b's blocks back, its drafter's too; keep its tokens, stats, random stream and what its drafter
        needs to restart as it stood (release()'s record); resume it before anything waiting."""
        s = self.active.pop(b)
        if self.drafters is not None and not s.prefilling:  # (a prefilling one's drafter has not started: its
            s.resume = self.drafters[b].release()  # record from an earlier preemption, if any, still holds)
        s.state.release()
        s.state, s.hidden_rows, s.save_at = None, [], []
        s.stats.preemptions += 1
        self.preemptions += 1
        self.preempted.appendleft(s)  # preempted newest first: the older ones end up in front
