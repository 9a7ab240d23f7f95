"""Speculative decoding: draft k tokens cheaply, verify them with ONE target pass, keep what agrees.

The engine runs B sequences at once, each in a slot; one sequence (speculative_generate) is the B = 1 case
of the same step, so every fix and every speed-up lands once. Per sequence, pending is the next token,
already chosen but not yet fed to the target. Each step, for every running sequence b:

    Step 1  draft    d_1..d_k = drafter.drafting(pending, k)       with proposal laws q_1..q_k (k from the
                     policy's plan; a drafter may stop early or propose nothing). Drafters that run a model
                     (the MTP head, a draft model) make all sequences' passes together, one per draft depth
    Step 2  verify   logits = target.forward_batch([pending, d_1..d_k] for every b)   ONE pass of
                     R = sum_b (k_b + 1) rows, packed sequence after sequence (bounds[b]: where b's rows
                     start). "Folded": row i is the target's law p_i for the token after input i, so the last
                     row doubles as the next step's logits and there is never a separate "commit" forward
    Step 3  accept   keep d_1..d_m while the rule accepts (greedy: d_i == argmax p_{i-1}); then a correction
                     from the residual law, or, if all k were kept, a bonus token from p_k
    Step 4  rollback the pass fed k+1 tokens but only pending + d_1..d_m are kept: restore every GDN layer
                     from the ring's entry m (written during the pass, no recompute; or, with a ReplayRing,
                     rescan the m+1 kept tokens from the pre-pass memory), truncate the KV cache, tell the
                     drafter which tokens were kept
    Step 5  emit     d_1..d_m and the new token, which becomes the next pending token

Stops (EOS, stop ids, the token cap) can land inside the emitted run: the run is cut there and the rollback
keeps exactly the tokens before the cut, so every piece of state (target KV, GDN, MTP KV, drafter) always
equals that of a sequence that plainly decoded the emitted tokens. The final emitted token is never fed (as in
plain generation), and a pending token is never redrawn. A sequence that ends frees its slot (and its KV
blocks, in a paged pool) for the next waiting one: continuous batching.

Joining is a row run of the same pass. A sequence admitted to a slot first prefills its prompt as plain rows
(no ring) after the decoding sequences' rows, `chunk` rows a step at most (Engine), and its first token is
picked from its final chunk's last row; its drafter starts then. A T-token chunk computes the bits of T
one-token passes, so chunking (and recomputing a preempted sequence's history) changes no output.

Lossless, per sequence. Greedy output equals plain greedy output token for token because the target computes
each row of a pass bit for bit as a one-token decode of that sequence alone would (batch invariance: the
matmul is row-by-row, the conv, the scan and attention run per sequence on its own state; kernels.py), and
greedy acceptance is an equality test. Sampled output has exactly the target's law by the rejection rule
(spec_sampling.py); with its own random stream, a sequence draws the same tokens alone or in a batch.

Where the numbers are. Greedy, the logits and hidden rows stay where the model computes (a GPU on the cuda
backend): the drafters ask nothing of the host while drafting and leave their drafts there (Draft.ids), the
verify pass is fed from there, and Placement.accept_greedy runs every sequence's rule there and brings back
every run and its drafts in one transfer. Sampled, the laws are read on the host. Each sequence brings its own
sampling and stop ids (Engine.add: a server's requests); a pass mixing greedy and sampled sequences brings its
logits to the host for every rule, and keeps each sequence's hidden rows where its solo run keeps them.

Official implementation: llama.cpp examples/speculative-simple + common/speculative.cpp
(docs/qwen35.md section 5). Papers: Leviathan et al. 2023, Chen et al. 2023.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from .drafting import NO_DRAFT, Draft, Drafter, DraftPolicy, check_draft_length, policy_for, run_together
from .generate import SeqResult, step_ms
from .model import Model
from .paged import BlockPool
from .prefix_cache import PrefixCache
from .sampling import SamplingParams, pick, probs_from_logits
from .spec_sampling import verify_greedy, verify_step


def check_lengths(model: Model, n_prompt: int, max_new: int, k_max: int = 0) -> None:
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


def blocks_per_run(model: Model, drafter: Drafter | None, n_positions: int, block_size: int) -> int:
    """KV pool blocks (paged.BlockPool of block_size) that one run of n_positions holds at most: the target's and
    its drafter's (the MTP head's, a draft model's KV: counted on a one-block pool of the same geometry, since a
    drafter's count depends on the geometry only). What sizes a pool for `slots` such runs before it exists."""
    probe = BlockPool(model.cfg, 1, block_size, model.xp)
    own = 0 if drafter is None else drafter.another(probe).blocks_to_start(n_positions)
    return probe.blocks_for(n_positions) + own


PHASES = ("prefill", "draft", "verify", "accept", "rollback")


@dataclass
class SpecStats:
    k_max: int  # drafts a step at most (the policy's)
    steps: int = 0  # target passes after the prefill (a plain step, no drafts, is one too)
    plain_steps: int = 0  # of which drafted nothing (k = 0: the policy's choice, or no room left)
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    accepted_per_position: list[int] = field(default_factory=list)  # [i] = steps whose draft i+1 was accepted
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_length_histogram: dict[int, int] = field(default_factory=dict)  # accepted drafts per step -> steps
    phase_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    rollbacks: int = 0
    preemptions: int = 0  # times the pool ran out and this sequence gave its blocks back (resumed by recompute)
    prefix_tokens_reused: int = 0  # prompt tokens not prefilled: found in the prefix cache (prefix_cache.py)
    step_s: list[float] = field(default_factory=list)  # each step's seconds (the engine's whole step)
    wall_s: float = 0.0
    adaptive: dict | None = None  # the policy's summary (the adaptive policy's chosen k's and estimates)

    def __post_init__(self):
        self.accepted_per_position = self.accepted_per_position or [0] * self.k_max
        self.drafted_per_position = self.drafted_per_position or [0] * self.k_max

    def record(self, n_drafted: int, n_accepted: int) -> None:
        self.steps += 1
        self.plain_steps += n_drafted == 0
        self.drafted += n_drafted
        self.accepted += n_accepted
        for i in range(n_drafted):
            self.drafted_per_position[i] += 1
            self.accepted_per_position[i] += i < n_accepted
        self.accepted_length_histogram[n_accepted] = self.accepted_length_histogram.get(n_accepted, 0) + 1

    def as_dict(self) -> dict:
        decode_s = self.wall_s - self.phase_s["prefill"]
        return {
            "k_max": self.k_max, "steps": self.steps, "plain_steps": self.plain_steps, "drafted": self.drafted,
            "accepted": self.accepted,
            "emitted": self.emitted,
            "acceptance_rate": self.accepted / self.drafted if self.drafted else 0.0,
            "mean_accepted_length": (self.accepted + self.steps) / self.steps if self.steps else 0.0,
            "accepted_per_position": [a / d if d else 0.0 for a, d in zip(self.accepted_per_position, self.drafted_per_position)],
            "accepted_length_histogram": {str(k): v for k, v in sorted(self.accepted_length_histogram.items())},
            "phase_ms": {k: 1000 * v for k, v in self.phase_s.items()},
            "rollbacks": self.rollbacks, "preemptions": self.preemptions,
            "prefix_tokens_reused": self.prefix_tokens_reused,
            "tokens_per_s": self.emitted / decode_s if decode_s > 0 else 0.0,
        } | step_ms(self.step_s) | ({"adaptive": self.adaptive} if self.adaptive is not None else {})


class PhaseClock:
    """Seconds per phase: lap(name) charges the time since the previous lap to `name`."""

    def __init__(self, phase_s: dict[str, float]):
        self.phase_s, self.now = phase_s, time.perf_counter
        self.t_begin = self.t_lap = self.now()

    def begin(self) -> None:
        """Start timing afresh (what happened since the last lap, outside the engine, is nobody's phase)."""
        self.t_begin = self.t_lap = self.now()

    def since_begin(self) -> float:
        return self.now() - self.t_begin

    def lap(self, phase: str) -> float:
        t = self.now()
        spent = t - self.t_lap
        self.phase_s[phase] += spent
        self.t_lap = t
        return spent


def cut_at_stop(emitted: list[int], stops: set[int], room: int) -> list[int]:
    """A stop token inside the run ends it there (emitted, then nothing); max_new leaves `room` tokens."""
    for j, token in enumerate(emitted):
        if token in stops:
            return emitted[: min(j + 1, room)]
    return emitted[:room]


def accept(logits, bounds: np.ndarray, drafts: list[Draft], params: list[SamplingParams],
           rngs: list[np.random.Generator], placement, on_device: bool) -> list[tuple[int, int, Draft]]:
    """Step 3 for every sequence of a verify pass (logits [R, N]; sequence b's rows bounds[b] .. bounds[b+1]-1
    for its fed [pending, d_1..d_k]; params[b] its sampling): the drafts its rule keeps, the target's own next
    token (a correction, or a bonus after all k), and its Draft with the drafts as host ints. on_device (the
    pass was all greedy): the rule runs where the logits are (Placement.accept_greedy: one transfer brings back
    every run, and the drafts that were left there). Otherwise the logits are on the host (any_sampled): a
    sampled sequence reads its rows with its own random stream, a greedy one takes the same argmax rule."""
    if on_device:
        runs = placement.accept_greedy(logits, bounds, [d.ids if d.tokens is None else d.tokens for d in drafts])
        return [(n, token, d if d.tokens is not None else d.with_tokens(tokens))
                for (n, token, tokens), d in zip(runs, drafts)]
    out = []
    for lo, hi, d, p, rng in zip(bounds[:-1], bounds[1:], drafts, params, rngs):
        if p.greedy:
            out.append((*verify_greedy(logits[lo:hi], d.tokens), d))
            continue
        p_rows = [probs_from_logits(row, p) for row in logits[lo:hi]]
        out.append((*verify_step(p_rows, d.tokens, list(d.q_rows), rng), d))
    return out


def any_sampled(params: list[SamplingParams]) -> bool:
    """Does a pass hold a sampled sequence? Then its logits come to the host (sampling reads laws there) and every
    drafter returns host ints: a greedy sequence beside it gets the same argmax either way."""
    return not all(p.greedy for p in params)


def token_marks(draft: Draft, n_accepted: int) -> list[str]:
    """How each token of a step's run was produced: accepted drafts, then the target's own token."""
    last = "target" if not draft.tokens else "bonus" if n_accepted == len(draft.tokens) else "correction"
    return ["accepted"] * n_accepted + [last]  # a plain step's token is the target's own, as in plain decoding


@dataclass
class Running:
    """A sequence in a slot: everything the step reads and writes for it.

    A sequence first prefills `history` (its prompt; a preempted one resumed: prompt + tokens[:-1]) a chunk per
    step, as rows of the verify pass, while state.pos < len(history); then it decodes."""
    seq: SeqResult
    state: object  # its ModelState (KV in the engine's pool, if it has one)
    rng: np.random.Generator
    max_new: int
    stats: SpecStats
    t_join: float
    pending: int = -1  # the next token, chosen, not yet fed
    history: list[int] = field(default_factory=list)  # what its prefill feeds
    hidden_rows: list = field(default_factory=list)  # the prefill's hidden rows so far (the drafter starts from them)
    save_at: list[int] = field(default_factory=list)  # token counts where the prefix cache keeps its GDN state
    order: int = 0  # admission order: the newest is preempted first
    resume: object = None  # what its drafter's release() returned when it was preempted: handed to start() on resume

    @property
    def prefilling(self) -> bool:
        return self.state.pos < len(self.history)


class Engine:
    """Up to `slots` sequences decoding together, one step() at a time.

    add(seq, max_new, rng) queues a sequence; step() admits waiting ones into free slots, then makes ONE pass
    for every running sequence: each decoding one's verify rows (the module docstring's steps) and each
    joining one's next prefill chunk (rows like any others: a T-token chunk computes the bits T one-token
    steps would). `active` maps slot -> Running, the state a test or a notebook may look at between steps.
    drafter: None (plain decoding) or the first slot's Drafter (the others get drafter.another()); with a pool,
    every slot's is drafter.another(pool), whose KV (the MTP head's, a draft model's) takes the pool's blocks too;
    policy: a DraftPolicy (its k_max sizes the rings); pool: a paged.BlockPool the sequences' KV lives in
    (None: each its own cache; a sequence is then admitted at once). on_emit(seq, tokens, marks): each step's
    run as it is decided; on_finish(seq): as each sequence ends.

    chunk: prefill rows a pass takes at most, shared by the joining sequences in admission order (None: each
    joining prompt whole, in the pass that follows its admission). A running sequence then waits at most
    `chunk` extra rows per step for a joining prompt, and a long prompt takes several steps to join.
    With a pool, a sequence is admitted while the pool's available blocks hold the next step of every running
    sequence (its rows, its drafter's drafting) and its own first chunk (and its drafter's start, if that chunk
    ends its prefill); when a step would not fit (sequences grew), the newest sequence is preempted: its blocks
    and its drafter's go back, its tokens, random stream and its drafter's release() record are kept, and it is
    resumed first, by prefilling prompt + tokens[:-1] again (pending: its last token; its drafter restarted on
    that history from the record, exactly as it stood: a sampled sequence draws its solo run's tokens).
    prefix_cache: a prefix_cache.PrefixCache over the pool: a joining sequence starts from the deepest saved
    state whose blocks are cached, and its prefill saves states where the cache chooses (prefix_cache.py)."""

    def __init__(self, model: Model, slots: int = 1, drafter: Drafter | None = None, policy: DraftPolicy | None = None,
                 params: SamplingParams = SamplingParams(), stop_ids: Sequence[int] = (), pool=None,
                 on_emit: Callable[[SeqResult, list[int], list[str]], None] | None = None,
                 on_finish: Callable[[SeqResult], None] | None = None, chunk: int | None = None,
                 prefix_cache: PrefixCache | None = None):
        if not isinstance(slots, (int, np.integer)) or slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        if chunk is not None and (not isinstance(chunk, (int, np.integer)) or chunk < 1):
            raise ValueError(f"chunk (prefill rows per pass) must be at least 1, got {chunk}")
        if prefix_cache is not None and prefix_cache.pool is not pool:
            raise ValueError("the prefix cache must be over the engine's KV pool")
        self.model, self.slots, self.params, self.pool = model, int(slots), params, pool
        self.chunk, self.prefix_cache = chunk, prefix_cache
        self.on_emit, self.on_finish = on_emit, on_finish
        if drafter is None:
            self.drafters = None
        elif pool is None:
            self.drafters = [drafter] + [drafter.another() for _ in range(self.slots - 1)]
        else:  # every slot's drafter keeps its KV in the pool
            self.drafters = [drafter.another(pool) for _ in range(self.slots)]
        self.policy = policy or policy_for(0 if drafter is None else None, None)
        self.k_max, self.stops = self.policy.k_max, {int(t) for t in stop_ids}
        self.rings = [model.new_ring(self.k_max + 1) for _ in range(self.slots)]  # per slot, allocated once
        self.waiting: deque[tuple[SeqResult, int, np.random.Generator]] = deque()
        self.preempted: deque[Running] = deque()  # resumed before anything waiting, oldest first
        self.active: dict[int, Running] = {}
        self.finished: list[Running] = []
        self.admitted = 0  # sequences admitted so far (Running.order)
        self.steps = self.rows = self.emitted = 0  # passes with decoding rows, those rows, tokens emitted
        self.passes = self.prefill_rows = self.preemptions = 0  # every pass, its prefill rows, preemptions
        self.phase_s = dict.fromkeys(PHASES, 0.0)
        self.clock = PhaseClock(self.phase_s)

    def add(self, seq: SeqResult, max_new: int, seed: int | np.random.Generator,
            params: SamplingParams | None = None, stop_ids: Sequence[int] | None = None) -> None:
        """Queue a sequence with its random stream (a seed, or a Generator), its sampling and its stop ids (None:
        the engine's); one that cannot run gets seq.error instead (the others are not affected). Sequences with
        different params share a pass: each gets the tokens it gets alone."""
        seq.params = self.params if params is None else params
        seq.stop_ids = frozenset(self.stops if stop_ids is None else (int(t) for t in stop_ids))
        seq.error = check_prompt(self.model, seq.prompt_tokens, max_new)
        rng = seed
        if seq.error is None and not isinstance(seed, np.random.Generator):
            if not isinstance(seed, (int, np.integer)) or seed < 0:
                seq.error = f"a seed must be a non-negative integer, got {seed}"
            else:
                rng = np.random.default_rng(int(seed))
        if seq.error is None:
            self.waiting.append((seq, max_new, rng))

    def done(self) -> bool:
        return not self.waiting and not self.preempted and not self.active

    def cancel(self, seq: SeqResult) -> bool:
        """Stop a sequence between steps (a client gone, a stop string met): a waiting one leaves the queue, a
        running one ends as if it had met a stop (its slot, KV blocks and reservation freed, on_finish called,
        stats for what it emitted). False if it is neither waiting nor running (it already ended)."""
        for entry in self.waiting:
            if entry[0] is seq:
                self.waiting.remove(entry)
                return True
        for s in self.preempted:
            if s.seq is seq:  # its blocks went back when it was preempted
                self.preempted.remove(s)
                return True
        for b, s in self.active.items():
            if s.seq is seq:
                self._finish(b)
                return True
        return False

    def step(self) -> None:
        """Admit waiting sequences, then one pass for every running one: the five steps for the decoding ones, a
        prefill chunk for the joining ones, all rows in one forward_batch."""
        self.clock.begin()
        self._join()
        chunks = self._make_room()  # slot -> prefill rows this step
        if not self.active:
            return
        decoding = [b for b in sorted(self.active) if not self.active[b].prefilling]  # their rows come first
        seqs, clock = [self.active[b] for b in decoding], self.clock
        joining = [b for b in sorted(chunks)]
        # all greedy: logits, hidden rows and greedy drafts stay where the model computes (module docstring); greedy
        # and sampled mixed: the logits come to the host for every rule, and each sequence's hidden rows stay where
        # its solo run keeps them (greedy: where the model computes; sampled: the host), for its drafter
        params = [s.seq.params for s in seqs] + [self.active[b].seq.params for b in joining]
        on_device = not any_sampled(params)
        mixed = not on_device and any(p.greedy for p in params)
        # Step 1: draft, as many as the policy plans for each sequence (never more than max_new leaves room for)
        drafts = self._draft(decoding, seqs, self._plan(seqs, sum(chunks.values())), on_device) if seqs else []
        draft_s = clock.lap("draft")
        # Step 2: verify: ONE target pass over every sequence's [pending, d_1..d_k] and every joining chunk;
        # a decoding sequence's ring receives its states
        fed = [self._fed(s.pending, d) for s, d in zip(seqs, drafts)]
        fed += [self.active[b].history[self.active[b].state.pos :][: chunks[b]] for b in joining]
        rings = [self.rings[b] if d.n else None for b, d in zip(decoding, drafts)] + [None] * len(joining)
        states = [s.state for s in seqs] + [self.active[b].state for b in joining]
        logits, hidden, bounds = self.model.forward_batch(fed, states, rings, to_host=not on_device and not mixed)
        logits = self.model.to_host(logits) if mixed else logits
        verify_s = clock.lap("verify" if seqs else "prefill")
        runs = self._decode(decoding, seqs, drafts, logits, hidden, bounds[: len(seqs) + 1], on_device, mixed) \
            if seqs else []
        for b, lo, hi in zip(joining, bounds[len(seqs) : -1], bounds[len(seqs) + 1 :]):
            self._prefilled_chunk(b, logits, hidden, lo, hi, mixed)
        clock.lap("prefill")
        self.passes, self.prefill_rows = self.passes + 1, self.prefill_rows + int(sum(chunks.values()))
        if seqs:  # a step: a pass with decoding rows (steps and rows count those, as before chunked prefill)
            self.steps, self.rows = self.steps + 1, self.rows + int(bounds[len(seqs)])
        for s in seqs:
            s.stats.step_s.append(clock.since_begin())
        if seqs:
            self.policy.observe([r[2] for r in runs], [r[0] for r in runs], draft_s, verify_s, int(bounds[-1]))

    def _decode(self, slots: list[int], seqs: list[Running], drafts: list[Draft], logits, hidden,
                bounds, on_device: bool, mixed: bool) -> list[tuple[int, int, Draft]]:
        """Steps 3-5 for the decoding sequences, whose rows are logits[:bounds[-1]]; returns accept's runs."""
        clock = self.clock
        # Step 3: accept: per sequence, the drafts its rule keeps and the target's own token
        runs = accept(logits, bounds, drafts, [s.seq.params for s in seqs], [s.rng for s in seqs], self.model.placement,
                      on_device)
        clock.lap("accept")
        for b, s, (n_accepted, token, draft), lo in zip(slots, seqs, runs, bounds):
            fed_b = [s.pending] + draft.tokens
            run = cut_at_stop(draft.tokens[:n_accepted] + [token], s.seq.stop_ids, s.max_new - len(s.seq.tokens))
            n_keep = len(run)  # the run's last token is the next pending one: fed next step
            # Step 4: rollback: keep pending and the run but its last token
            if n_keep < len(fed_b):
                self.rings[b].restore(s.state, n_keep - 1)
                s.stats.rollbacks += 1
            clock.lap("rollback")
            if self.drafters is not None:
                rows = hidden[lo : lo + n_keep]
                if mixed and not s.seq.params.greedy:
                    rows = self.model.to_host(rows)
                self.drafters[b].commit(fed_b[:n_keep], rows)
            clock.lap("draft")  # the drafter's bookkeeping counts as drafting
            # Step 5: emit
            s.stats.record(draft.n, n_accepted)
            self.emitted += n_keep
            self._emit(b, s, run, token_marks(draft, n_accepted)[:n_keep])
            clock.lap("accept")
        return runs

    def _room(self, s: Running) -> int:
        return min(self.k_max, s.max_new - len(s.seq.tokens) - 1)

    def _plan(self, seqs: list[Running], prefill_rows: int) -> list:
        """The policy's Plan per sequence, checked before anything is drafted: k_b within the room max_new leaves
        (prefill_rows: the joining chunks' rows in the same pass, which the policy may count in its cost)."""
        rooms = [self._room(s) for s in seqs]
        plans = self.policy.plan(rooms, prefill_rows)
        if len(plans) != len(rooms) or any(not 0 <= p.k <= room for p, room in zip(plans, rooms)):
            raise ValueError(f"the policy planned k = {[p.k for p in plans]} for sequences whose rooms are {rooms}")
        return plans

    def _draft(self, slots: list[int], seqs: list[Running], plans: list, on_device: bool) -> list[Draft]:
        """Step 1 for every sequence: its drafter's coroutine for those the policy gives k > 0, run together
        (one pass per draft depth for all of them). on_device (the pass is all greedy): the drafts may stay
        where the drafter's model computes: the verify pass is fed from there."""
        if self.drafters is None or not any(p.k for p in plans):
            return [NO_DRAFT] * len(seqs)
        drafting = [self.drafters[b].drafting(s.pending, p.k, s.seq.params, s.rng, p.stop, on_device)
                    for b, s, p in zip(slots, seqs, plans) if p.k]
        made = iter(run_together(drafting, self.drafters[0].draft_pass))
        return [next(made) if p.k else NO_DRAFT for p in plans]

    def _fed(self, pending: int, draft: Draft):
        """What a sequence feeds the verify pass: [pending, d_1..d_k], host ints, or where the drafts are."""
        if draft.tokens is not None:
            return [pending] + draft.tokens
        to_device = self.model.to_device
        return np.concatenate([to_device(np.array([pending])), to_device(draft.ids)])  # embed_rows: unchecked

    # ---------------------------------------------------------------- admission, prefill, preemption
    def _join(self) -> None:
        """Free slots take preempted sequences (oldest first), then waiting ones in order; with a pool, while its
        available blocks hold the running sequences' next step and the newcomer's first chunk."""
        pool = self.pool
        for b in range(self.slots):
            while b not in self.active and (self.preempted or self.waiting):
                if self.preempted:
                    s = self.preempted[0]
                else:
                    seq, max_new, rng = self.waiting[0]
                    longest = len(seq.prompt_tokens) + max_new + self.k_max + 1
                    if pool is not None and self._run_blocks(longest) > pool.n_blocks:  # could never fit: reported
                        self.waiting.popleft()
                        seq.error = f"the KV pool ({pool.n_blocks} blocks of {pool.block_size}) cannot hold this run"
                        continue
                    s = Running(seq, None, rng, max_new, SpecStats(self.k_max), time.perf_counter(),
                                history=list(seq.prompt_tokens))
                if not self._admit(b, s):
                    return  # wait for running sequences to give blocks back
                if self.preempted and self.preempted[0] is s:
                    self.preempted.popleft()
                else:
                    self.waiting.popleft()

    def _admit(self, b: int, s: Running) -> bool:
        """Give s slot b and a fresh state (from the prefix cache's deepest saved state, if any), if the pool holds
        it; False (nothing changed) if not."""
        pool, cache, model = self.pool, self.prefix_cache, self.model
        if s.seq.tokens:  # a preempted sequence: its history is everything committed; the last token is pending
            s.history, s.pending = s.seq.prompt_tokens + s.seq.tokens[:-1], s.seq.tokens[-1]
        match = None
        if cache is not None:
            match = cache.lookup(s.history, (len(s.history) - 1) // pool.block_size)
        if pool is not None:
            start = 0 if match is None else len(match.blocks) * pool.block_size
            first = min(len(s.history) - start, self.chunk or len(s.history))
            idle_adopted = 0 if match is None else sum(pool.refs[blk] == 0 for blk in match.blocks)
            own = pool.blocks_for(start + first) - start // pool.block_size  # its first chunk's new blocks
            if self.drafters is not None and start + first == len(s.history):  # and its drafter's start
                own += self.drafters[b].blocks_to_start(len(s.history), s.resume)
            if self._blocks_needed(self._chunks()) + own > pool.available - idle_adopted:
                return False
        s.state, s.hidden_rows, s.save_at, s.order = model.new_state(pool), [], [], self.admitted
        self.admitted += 1
        if match is not None:
            cache.start(s.state, match)
            if match.entry is not None and self.drafters is not None:
                s.hidden_rows = list(match.hidden)
            if match.entry is not None:
                s.stats.prefix_tokens_reused += s.state.pos
            s.save_at = cache.save_points(len(s.history), len(match.blocks), match.matched)
        self.active[b] = s
        return True

    def _chunks(self) -> dict[int, int]:
        """Prefill rows this step per joining slot: the chunk budget shared in admission order, each chunk ending
        at the sequence's next save point (the prefix cache keeps a state only where a pass ends)."""
        budget, out = self.chunk if self.chunk is not None else float("inf"), {}
        for b, s in sorted(self.active.items(), key=lambda item: item[1].order):
            if s.prefilling and budget:
                end = min([p for p in s.save_at if p > s.state.pos] + [len(s.history)])
                out[b] = min(end - s.state.pos, budget)
                budget -= out[b]
        return out

    def _blocks_needed(self, chunks: dict[int, int]) -> int:
        """New pool blocks this step takes at most: a joining sequence's chunk (and its drafter's start if the chunk
        ends its prefill), a decoding sequence's k + 1 rows and its drafter's drafting of k, at the most k."""
        if self.pool is None:
            return 0
        need = 0
        for b, s in self.active.items():
            rows = chunks.get(b, 0) if s.prefilling else self._room(s) + 1
            need += max(0, self.pool.blocks_for(s.state.pos + rows) - len(s.state.table.blocks))
            if self.drafters is None:
                continue
            if not s.prefilling:
                need += self.drafters[b].blocks_to_draft(self._room(s))
            elif s.state.pos + rows == len(s.history):
                need += self.drafters[b].blocks_to_start(len(s.history), s.resume)
        return need

    def _run_blocks(self, n_positions: int) -> int:
        """Pool blocks a run of n_positions holds at most: its KV and its drafter's."""
        drafter = 0 if self.drafters is None else self.drafters[0].blocks_to_start(n_positions)
        return self.pool.blocks_for(n_positions) + drafter

    def _make_room(self) -> dict[int, int]:
        """This step's chunks, after preempting the newest sequences while the step's rows would not fit the pool."""
        chunks = self._chunks()
        while self.pool is not None and self.active and self._blocks_needed(chunks) > self.pool.available:
            b = max(self.active, key=lambda slot: self.active[slot].order)
            self._preempt(b)
            chunks = self._chunks()
        return chunks

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

    def _prefilled_chunk(self, b: int, logits, hidden, lo: int, hi: int, mixed: bool) -> None:
        """A joining sequence's chunk went through the pass (rows lo .. hi-1): keep its hidden rows, save its state
        where chosen, and when its history is all fed, start its drafter and pick its first token."""
        s, cache = self.active[b], self.prefix_cache
        if self.drafters is not None:  # (only a drafter reads them, so only then does the prefix cache keep them)
            rows = hidden[lo:hi]
            s.hidden_rows.append(self.model.to_host(rows) if mixed and not s.seq.params.greedy else rows)
        pos = s.state.pos
        if cache is not None and (pos in s.save_at or pos == len(s.history)):
            rows = np.concatenate(s.hidden_rows) if s.hidden_rows else None
            cache.register(s.history, s.state.table.blocks, pos // self.pool.block_size, rows)
            if pos in s.save_at:
                cache.save_state(s.history, pos // self.pool.block_size, s.state)
        if s.prefilling:
            return
        if self.drafters is not None:
            self.drafters[b].start(s.history, np.concatenate(s.hidden_rows), self.k_max, s.resume)
        s.hidden_rows, s.resume = [], None
        if s.seq.tokens:  # a resumed sequence: its pending token was chosen before it was preempted
            return
        if s.max_new == 0:
            self._finish(b)
            return
        first = pick(logits[hi - 1], s.seq.params, s.rng)  # the first token: the prefill's own
        self._emit(b, s, [first], ["target"])

    def _emit(self, b: int, s: Running, run: list[int], marks: list[str]) -> None:
        """Step 5: the run joins the output; its last token is the next pending one. A stop or max_new ends it."""
        s.seq.tokens += run
        s.seq.marks += marks
        s.pending = run[-1]
        if self.on_emit:
            self.on_emit(s.seq, run, marks)
        if run[-1] in s.seq.stop_ids or len(s.seq.tokens) >= s.max_new:
            self._finish(b)

    def _finish(self, b: int) -> None:
        s = self.active.pop(b)
        if self.pool is not None:
            s.state.release()  # every KV block back to the pool, its drafter's too
            if self.drafters is not None:
                self.drafters[b].release()
        s.stats.emitted, s.stats.wall_s = len(s.seq.tokens), time.perf_counter() - s.t_join
        s.seq.stats = {k: v for k, v in s.stats.as_dict().items() if k != "phase_ms"}  # phases: the engine's
        self.finished.append(s)
        if self.on_finish:
            self.on_finish(s.seq)


@dataclass
class SpecResult:
    tokens: list[int]  # emitted after the prompt
    stats: SpecStats
    state: object  # the target's ModelState: prompt + tokens[:-1] fed
    marks: list[str] = field(default_factory=list)  # per token: target (first), accepted, correction, bonus


def speculative_generate(model: Model, drafter: Drafter, prompt: Sequence[int], max_new: int,
                         draft_n: int | None = None, params: SamplingParams = SamplingParams(),
                         rng: np.random.Generator | None = None, stop_ids: Sequence[int] = (),
                         policy: DraftPolicy | None = None,
                         on_emit: Callable[[list[int], list[str]], None] | None = None) -> SpecResult:
    """Generate up to max_new tokens after `prompt`, with draft_n drafts per verify pass (default 3), or as many
    as `policy` plans each step (tinyspec.fast.adaptive.AdaptiveDraftLength; its k_max bounds them): the engine
    with one slot. on_emit(tokens, marks): called with each step's emitted tokens as they are decided."""
    policy = policy_for(draft_n, policy)
    prompt = [int(t) for t in prompt]
    check_lengths(model, len(prompt), max_new, policy.k_max)
    seq = SeqResult(0, prompt)
    engine = Engine(model, 1, drafter, policy, params, stop_ids,
                    on_emit=(lambda _, tokens, marks: on_emit(tokens, marks)) if on_emit else None)
    engine.add(seq, max_new, rng if rng is not None else np.random.default_rng())
    if seq.error is not None:
        raise ValueError(seq.error)
    while not engine.done():
        engine.step()
    done = engine.finished[0]
    done.stats.phase_s, done.stats.adaptive = engine.phase_s, policy.summary()
    return SpecResult(seq.tokens, done.stats, done.state, seq.marks)
