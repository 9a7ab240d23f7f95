"""Speculative decoding: draft k tokens cheaply, verify them with ONE target pass, keep what agrees.

The engine runs B sequences at once, each in a slot; one sequence (speculative_generate, and plain decoding:
no drafter) is the B = 1 case of the same step, so every fix and every speed-up lands once. Per sequence,
pending is the next token, already chosen but not yet fed to the target. Each step (Engine.step), for every
decoding sequence b:

    Step 1  draft    d_1..d_k = drafter.drafting(pending, k)       with proposal laws q_1..q_k (k from the
                     policy's plan; a drafter may stop early or propose nothing). Drafters that run a model
                     (the MTP head, a draft model) make all sequences' passes together, one per draft depth
    Step 2  verify   logits = target.forward_batch([pending, d_1..d_k] for every b)   ONE pass of
                     R = sum_b (k_b + 1) rows, packed sequence after sequence (bounds[b]: where b's rows
                     start). "Folded": row i is the target's law p_i for the token after input i, so the last
                     row doubles as the next step's logits and there is never a separate "commit" forward
    Step 3  accept   keep d_1..d_m while the rule accepts (greedy: d_i == argmax p_{i-1}); then a correction
                     from the residual law, or, if all k were kept, a bonus token from p_k. A draft tree
                     (Draft.parents, tree.py): the pass feeds its nodes in row order, each row computed as a
                     one-token decode of its path (Model.forward_batch's trees), and spec_tree's rule keeps a
                     path from the root
    Step 4  rollback the pass fed k+1 tokens but only pending + d_1..d_m are kept: restore every GDN layer
                     from the ring's entry m (written during the pass, no recompute; or, with a ReplayRing,
                     rescan the m+1 kept tokens from the pre-pass memory), truncate the KV cache, tell the
                     drafter which tokens were kept. A tree: the GDN state of the path's last row from the
                     slot's tree ring (a SnapshotRing), the path's KV rows moved to the positions a plain
                     decode writes (SnapshotRing.restore_path)
    Step 5  emit     d_1..d_m and the new token, which becomes the next pending token

Stops (EOS, stop ids, the token cap) can land inside the emitted run: the run is cut there and the rollback
keeps exactly the tokens before the cut, so every piece of state (target KV, GDN, MTP KV, drafter) always
equals that of a sequence that plainly decoded the emitted tokens. The final emitted token is never fed (as in
plain generation), and a pending token is never redrawn.

Which sequences ride a pass is the scheduler's answer (scheduler.py: admission, chunked prefill, preemption,
the KV pool's budget, the prefix cache). A joining sequence's prompt chunk is a row run of the same pass, after
the decoding rows; its first token is picked from its final chunk's last row, and its drafter starts then.

Lossless, per sequence. Greedy output equals plain greedy output token for token because the target computes
each row of a pass bit for bit as a one-token decode of that sequence alone would (batch invariance: the
matmul is row-by-row, the conv, the scan and attention run per sequence on its own state; kernels.py), and
greedy acceptance is an equality test. Sampled output has exactly the target's law by the rejection rule
(spec_sampling.py); with its own random stream, a sequence draws the same tokens alone or in a batch.

Where the numbers are, decided once a pass (Pass): all greedy, the logits and hidden rows stay where the model
computes (a GPU on the cuda backend): the drafters leave their drafts there (Draft.ids), the verify pass is fed
from there, and the model's Placement.accept_greedy runs every sequence's rule there and brings back every run and its
drafts in one transfer. A sampled sequence reads its laws on the host, so a pass that holds one brings the
logits there for every rule, and keeps each sequence's hidden rows where its solo run keeps them.

Official implementation: llama.cpp examples/speculative-simple + common/speculative.cpp
(docs/qwen35.md section 5). Papers: Leviathan et al. 2023, Chen et al. 2023.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from .drafting import (
    NO_DRAFT,
    Draft,
    Drafter,
    DraftPolicy,
    Plan,
    policy_for,
    run_together,
)
from .model import Model
from .ops import join_rows
from .placement import Placement
from .sampling import SamplingParams, pick, probs_from_logits
from .scheduler import EngineOptions, Scheduler, check_prompt
from .sequence import PHASES, Running, SeqResult, SpecStats
from .spec_sampling import verify_greedy, verify_step
from .spec_tree import verify_tree, verify_tree_greedy


class PhaseClock:
    """Seconds per phase: lap(name) charges the time since the previous lap to `name`; begin() starts afresh (what
    happened since the last lap, outside the engine, is nobody's phase)."""

    def __init__(self, phase_s: dict[str, float]):
        self.phase_s, self.now = phase_s, time.perf_counter
        self.begin()

    def begin(self) -> None:
        self.t_begin = self.t_lap = self.now()

    def lap(self, phase: str) -> float:
        t = self.now()
        spent, self.t_lap = t - self.t_lap, t
        self.phase_s[phase] += spent
        return spent


def cut_at_stop(emitted: list[int], stops: set[int], room: int) -> list[int]:
    """A stop token inside the run ends it there (emitted, then nothing); max_new leaves `room` tokens."""
    for j, token in enumerate(emitted):
        if token in stops:
            return emitted[: min(j + 1, room)]
    return emitted[:room]


def token_marks(draft: Draft, n_accepted: int, path: list[int] | None = None) -> list[str]:
    """How each token of a step's run was produced: accepted drafts, then the target's own token (a bonus when
    every draft of its row's line was kept: the chain's last, or a tree leaf; path: a tree's kept rows)."""
    leaf = n_accepted == len(draft.tokens) if path is None else path[-1] not in draft.parents
    last = "target" if not draft.tokens else "bonus" if leaf else "correction"
    return ["accepted"] * n_accepted + [last]  # a plain step's token is the target's own, as in plain decoding


@dataclass
class Pass:
    """One verify pass, as one flat record: what its five steps read and write. Rows are packed sequence after
    sequence: the B decoding sequences' [pending, d_1..d_k] first, then the J joining sequences' prefill chunks."""
    slots: list[int]  # [B] the decoding sequences' slots, in row order
    seqs: list[Running]  # [B]
    joining: list[int]  # [J] the joining sequences' slots
    chunks: list[list[int]]  # [J] each one's next chunk of its history
    states: list  # [B + J] their ModelStates, in row order
    sampled: list[bool]  # [B + J] which sequences sample (they read their laws on the host)
    plans: list[Plan] = field(default_factory=list)  # [B] what the policy asked of each decoding sequence
    drafts: list[Draft] = field(default_factory=list)  # [B]
    own: list[int] = field(default_factory=list)  # [B] its rows [pending, d_1..d_k]; filler rows may follow them
    bounds: np.ndarray | None = None  # [B + J + 1] sequence i's rows are bounds[i] .. bounds[i+1]-1
    logits: object = None  # [R, N]
    hidden: object = None  # [R, D] the target's post-norm rows (what a drafter reads)

    @property
    def host_logits(self) -> bool:
        """A sequence samples: the logits come to the host for every rule (greedy ones take the same argmax)."""
        return any(self.sampled)

    @property
    def all_host(self) -> bool:
        """Every sequence samples: logits and hidden rows come to the host in the verify pass's one transfer."""
        return all(self.sampled)


def accept(p: Pass, place: Placement) -> list[tuple[int, int, Draft, list[int] | None]]:
    """Step 3 for every decoding sequence of a pass: (drafts its rule keeps, the target's own next token, its Draft
    with the drafts as host ints, and for a tree the kept path's rows [0, r1, ..]: None for a chain). All greedy,
    the chains' rule runs where the logits are (place.accept_greedy: one transfer brings back every run and the drafts
    left there); else a sampled sequence reads its laws with its own random stream, a greedy one takes the same
    argmax rule, on the host. A tree's rule (spec_tree.py) reads its rows on the host. Only each sequence's own rows
    are read (filler rows after them, Placement.pad_rows, are not)."""
    B = len(p.seqs)
    out: list = [None] * B
    for b, d in enumerate(p.drafts):
        if d.is_tree:
            out[b] = accept_tree(p, b, place.to_host)
    chains = [b for b in range(B) if out[b] is None]
    if chains and not p.host_logits:
        lows = [int(p.bounds[b]) for b in chains]
        own = [p.own[b] for b in chains]
        logits, bounds = p.logits, p.bounds[: B + 1]
        if len(chains) < B or any(int(p.bounds[b + 1]) - lo != n for b, lo, n in zip(chains, lows, own)):
            logits, bounds = join_rows([logits[lo : lo + n] for lo, n in zip(lows, own)]), np.cumsum([0] + own)
        drafts = [p.drafts[b] for b in chains]
        runs = place.accept_greedy(logits, bounds, [d.ids if d.tokens is None else d.tokens for d in drafts])
        for b, (n, token, tokens), d in zip(chains, runs, drafts):
            out[b] = (n, token, d if d.tokens is not None else d.with_tokens(tokens), None)
        return out
    for b in chains:
        lo, d, s = int(p.bounds[b]), p.drafts[b], p.seqs[b]
        logits, params = p.logits[lo : lo + p.own[b]], s.seq.params
        if params.greedy:
            out[b] = (*verify_greedy(logits, d.tokens), d, None)
        else:
            p_rows = [probs_from_logits(row, params) for row in logits]
            out[b] = (*verify_step(p_rows, d.tokens, list(d.q_rows), s.rng), d, None)
    return out


def accept_tree(p: Pass, b: int, to_host: Callable) -> tuple[int, int, Draft, list[int]]:
    """Step 3 for a sequence that drafted a tree (its drafts are host ints): spec_tree's rule on its rows, read on
    the host; the path it keeps."""
    lo, d, s = int(p.bounds[b]), p.drafts[b], p.seqs[b]
    logits, params = p.logits[lo : lo + p.own[b]], s.seq.params
    if params.greedy:
        path, token = verify_tree_greedy(to_host(logits), d.tokens, d.parents)
    else:
        p_rows = [probs_from_logits(row, params) for row in to_host(logits)]
        path, token = verify_tree(p_rows, d.tokens, d.parents, list(d.q_rows), s.rng)
    return len(path) - 1, token, d, path


class Engine:
    """Up to options.slots sequences decoding together, one step() at a time: add() queues a sequence, step()
    makes ONE pass for every running one (the module docstring's five steps), done() says when all have ended.

    drafter: None (plain decoding) or the first slot's Drafter (the others get drafter.another(), in the KV pool if
    there is one); policy: a DraftPolicy (its k_max sizes the rings); options: how it is built (slots, KV pool,
    chunked prefill, prefix cache, default sampling and stops: scheduler.EngineOptions); on_emit(seq, tokens,
    marks): each step's run as it is decided; on_finish(seq): as each sequence ends. `active` maps slot ->
    Running, the state a test or a notebook may look at between steps."""

    def __init__(self, model: Model, drafter: Drafter | None = None, policy: DraftPolicy | None = None,
                 options: EngineOptions = EngineOptions(),
                 on_emit: Callable[[SeqResult, list[int], list[str]], None] | None = None,
                 on_finish: Callable[[SeqResult], None] | None = None):
        if options.chunked_prefill and drafter is not None:
            raise ValueError("chunked prefill is for plain decoding: a speculative run prefills with the scan")
        self.model, self.options, self.on_emit, self.on_finish = model, options, on_emit, on_finish
        self.policy = policy or policy_for(0 if drafter is None else None, None)
        self.k_max = self.policy.k_max
        self.pool = options.make_pool(model, drafter, self.k_max)
        self.drafters = None  # one per slot; with a pool, each keeps its KV in the pool's blocks
        if drafter is not None:
            self.drafters = [drafter.another(self.pool) for _ in range(options.slots)] if self.pool is not None \
                else [drafter] + [drafter.another() for _ in range(options.slots - 1)]
        self.scheduler = Scheduler(model, options, self.pool, self.drafters, self.k_max)
        self.rings = [model.new_ring(self.k_max + 1) for _ in range(options.slots)]  # per slot, allocated once
        self.tree_rings: list = [None] * options.slots  # per slot, a SnapshotRing when it first drafts a tree
        self.finished: list[Running] = []
        self.steps = self.rows = self.emitted = 0  # passes with decoding rows, those rows, tokens emitted
        self.passes = self.prefill_rows = 0  # every pass, and its prefill rows
        self.phase_s = dict.fromkeys(PHASES, 0.0)
        self.clock = PhaseClock(self.phase_s)

    # what a caller reads between steps: the options, and where the scheduler holds the sequences
    slots = property(lambda self: self.options.slots)
    chunk = property(lambda self: self.options.chunk)
    active = property(lambda self: self.scheduler.active)  # slot -> Running
    waiting = property(lambda self: self.scheduler.waiting)  # Running, never admitted yet
    preempted = property(lambda self: self.scheduler.preempted)  # Running, resumed first
    preemptions = property(lambda self: self.scheduler.preemptions)
    prefix_cache = property(lambda self: self.scheduler.cache)

    def add(self, seq: SeqResult, max_new: int, seed: int | np.random.Generator,
            params: SamplingParams | None = None, stop_ids: Sequence[int] | None = None,
            draft_n: int | None = None) -> None:
        """Queue a sequence with its random stream (a seed, or a Generator), its sampling and its stop ids (None:
        the engine's); one that cannot run gets seq.error instead (the others are not affected). Sequences with
        different params share a pass: each gets the tokens it gets alone.

        draft_n: its most drafts a step, 0..k_max (0: it never drafts; None: as the policy plans). The policy is
        handed min(room, draft_n) for it (Running.room), so a fixed policy drafts exactly that and an adaptive one
        at most that, while the others in the pass keep theirs. What it then gets alone: greedy, plain greedy
        output (as always); sampled, the tokens and counts of generate(..., drafter=<this engine's kind>,
        draft_n=draft_n) with its seed, under a fixed policy; and with draft_n = 0 also those of generate with no
        drafter, since a step that drafts nothing draws its one token from the target's row with the sequence's
        stream, drafter or not (its drafter is still told every kept token: commit, so it stays consistent).
        tests/test_batch_requests.py checks each."""
        seq.params = self.options.params if params is None else params
        seq.stop_ids = frozenset(self.options.stop_ids if stop_ids is None else (int(t) for t in stop_ids))
        seq.error = check_prompt(self.model, seq.prompt_tokens, max_new)
        if seq.error is None and not isinstance(seed, np.random.Generator):
            if not isinstance(seed, (int, np.integer)) or seed < 0:
                seq.error = f"a seed must be a non-negative integer, got {seed}"
            else:
                seed = np.random.default_rng(int(seed))
        if seq.error is None and draft_n is not None:
            whole = isinstance(draft_n, (int, np.integer)) and not isinstance(draft_n, bool)
            if not whole or not 0 <= draft_n <= self.k_max:
                seq.error = f"draft_n must be an integer in 0..{self.k_max} (the engine's k_max), got {draft_n!r}"
            else:
                draft_n = int(draft_n)
        if seq.error is None:
            k_max = self.k_max if draft_n is None else draft_n  # its stats count positions up to its own cap
            self.scheduler.add(Running(seq, seed, max_new, SpecStats(k_max), time.perf_counter(), k_cap=draft_n))

    def done(self) -> bool:
        return self.scheduler.done()

    def cancel(self, seq: SeqResult) -> bool:
        """Stop a sequence between steps (a client gone, a stop string met): a queued one leaves its queue, a
        running one ends as if it had met a stop (slot and KV blocks freed, on_finish called, stats for what it
        emitted). False if it already ended."""
        if self.scheduler.unqueue(seq):
            return True
        b = self.scheduler.slot_of(seq)
        if b is not None:
            self._finish(b)
        return b is not None

    def step(self) -> None:
        """One pass for every running sequence: the five steps for the decoding ones, a chunk for the joining ones."""
        clock = self.clock
        clock.begin()
        p = self._next_pass()
        if p is None:
            return
        # Step 1: draft, as many as the policy plans for each sequence (never more than max_new leaves room for)
        p.drafts = self._draft(p)
        clock.lap("draft")
        # Step 2: verify: ONE target pass over every sequence's [pending, d_1..d_k] and every joining chunk; a
        # decoding sequence's ring receives the state after each of its rows
        p.own = [d.n + 1 for d in p.drafts]
        fed = [self._fed(s.pending, d, self.k_max - d.n if self.scheduler.pads else 0) for s, d in zip(p.seqs, p.drafts)]
        # a tree's rows (tree.py) start from their parents' states: its ring is a SnapshotRing, which keeps them
        rings = [self._tree_ring(b) if d.is_tree else self.rings[b] if len(f) > 1 else None
                 for b, f, d in zip(p.slots, fed, p.drafts)] + [None] * len(p.joining)
        trees = [d.parents + (0,) * (len(f) - d.n - 1) if d.is_tree else None for f, d in zip(fed, p.drafts)]
        fed += p.chunks
        chunked = self.options.chunked_prefill and not p.seqs
        p.logits, p.hidden, p.bounds = self.model.forward_batch(fed, p.states, rings, to_host=p.all_host,
                                                                chunked=chunked, trees=trees + [None] * len(p.joining))
        if p.host_logits and not p.all_host:  # greedy and sampled mixed: only the logits come to the host
            p.logits = self.model.to_host(p.logits)
        verify_s = clock.lap("verify" if p.seqs else "prefill")
        # Step 3: accept: per sequence, the drafts its rule keeps and the target's own next token
        runs = accept(p, self.model.placement) if p.seqs else []
        clock.lap("accept")
        for i, (b, s, (n_accepted, token, draft, path)) in enumerate(zip(p.slots, p.seqs, runs)):
            # the drafts kept, in order: a chain's first n_accepted, a tree's path (its rows after the root)
            kept = draft.tokens[:n_accepted] if path is None else [draft.tokens[r - 1] for r in path[1:]]
            run = cut_at_stop(kept + [token], s.seq.stop_ids, s.max_new - len(s.seq.tokens))
            n_keep = len(run)  # pending and the run but its last token are kept; the last is the next pending
            # Step 4: rollback: every GDN layer from the ring's entry of the last kept row; the KV truncated to the
            # kept rows (a tree's path moved to the positions a plain decode writes: SnapshotRing.restore_path)
            if path is not None:
                self._tree_ring(b).restore_path(s.state, path[:n_keep])
                s.stats.rollbacks += int(n_keep < p.bounds[i + 1] - p.bounds[i])
            elif n_keep < p.bounds[i + 1] - p.bounds[i]:  # (its rows: [pending] + drafts, and any filler after them)
                self.rings[b].restore(s.state, n_keep - 1)
                s.stats.rollbacks += 1
            clock.lap("rollback")
            if self.drafters is not None:  # the drafter is told what was kept, with the target's hidden rows
                rows = None if path is None else path[:n_keep]
                self.drafters[b].commit([s.pending] + kept[: n_keep - 1], self._hidden(p, i, n_keep, rows))
            clock.lap("draft")  # the drafter's bookkeeping counts as drafting
            # Step 5: emit
            s.stats.record(draft.n, n_accepted)
            self.emitted += n_keep
            self._emit(b, s, run, token_marks(draft, n_accepted, path)[:n_keep])
            clock.lap("accept")
        for j, b in enumerate(p.joining):
            self._prefilled(b, p, len(p.seqs) + j)
        clock.lap("prefill")
        self._count(p, runs, verify_s)

    def _next_pass(self) -> Pass | None:
        """The scheduler's rows for this pass, as a Pass with its plans and where its numbers live."""
        rows = self.scheduler.next_pass()
        if rows is None:
            return None
        decoding, chunk_rows = rows
        seqs, joining = [self.active[b] for b in decoding], sorted(chunk_rows)
        chunks = [self.active[b].history[self.active[b].state.pos :][: chunk_rows[b]] for b in joining]
        everyone = seqs + [self.active[b] for b in joining]
        sampled = [not s.seq.params.greedy for s in everyone]  # where the pass's numbers live follows from these
        p = Pass(decoding, seqs, joining, chunks, [s.state for s in everyone], sampled)
        rooms = [s.room(self.k_max) for s in seqs]
        p.plans = self.policy.plan(rooms, sum(chunk_rows.values())) if seqs else []
        if len(p.plans) != len(rooms) or any(not 0 <= pl.k <= room for pl, room in zip(p.plans, rooms)):
            raise ValueError(f"the policy planned k = {[pl.k for pl in p.plans]} for sequences whose rooms are {rooms}")
        return p

    def _draft(self, p: Pass) -> list[Draft]:
        """Step 1 for every decoding sequence the policy gives k > 0: its drafter's coroutine, all run together
        (one pass per draft depth for all of them); all greedy, the drafts may stay where the drafter computes."""
        if self.drafters is None or not any(pl.k for pl in p.plans):
            return [NO_DRAFT] * len(p.seqs)
        drafting = [self.drafters[b].drafting(s.pending, pl.k, s.seq.params, s.rng, pl.stop, not p.host_logits)
                    for b, s, pl in zip(p.slots, p.seqs, p.plans) if pl.k]
        made = iter(run_together(drafting, self.drafters[0].draft_pass))
        return [next(made) if pl.k else NO_DRAFT for pl in p.plans]

    def _fed(self, pending: int, draft: Draft, filler: int = 0):
        """What a sequence feeds the verify pass: [pending, d_1..d_k] and `filler` rows of token 0, host ints, or
        where the drafts are. Filler (Scheduler.pads: where the backend graphs its passes, every decoding
        sequence feeds k_max + 1 rows, so a batch's verify passes take one shape per batch size) changes none of its
        own rows (batch-invariant rows, each attending to its past only): the rollback restores the state after the
        last kept row from the ring and truncates the KV past it, and only the own rows are accepted from."""
        if draft.tokens is not None:
            return [pending] + draft.tokens + [0] * filler
        to_device = self.model.to_device  # embed_rows: unchecked
        head = to_device(np.array([pending] + [0] * filler))  # one upload: the pending token and the filler's
        return np.concatenate([head[:1], to_device(draft.ids), head[1:]] if filler else [head, to_device(draft.ids)])

    def _tree_ring(self, b: int):
        """Slot b's ring for a tree pass (a SnapshotRing whatever the placement's rollback: Model.new_ring), made
        when its first tree comes."""
        if self.tree_rings[b] is None:
            self.tree_rings[b] = self.model.new_ring(self.k_max + 1, tree=True)
        return self.tree_rings[b]

    def _hidden(self, p: Pass, i: int, n: int, path: list[int] | None = None):
        """Sequence i's first n hidden rows of the pass (a tree's: the rows of its kept path), where its solo run
        keeps them: a sampled one's on the host, a greedy one's where the model computes (they differ only in a pass
        that mixes the two)."""
        lo = int(p.bounds[i])
        rows = p.hidden[lo : lo + n] if path is None else p.hidden[lo + np.asarray(path, np.int64)]
        return self.model.to_host(rows) if p.sampled[i] and not p.all_host else rows

    def _prefilled(self, b: int, p: Pass, i: int) -> None:
        """Joining sequence i's chunk went through the pass: keep its hidden rows (only a drafter reads them), let
        the scheduler save what the prefix cache wants; once its history is all fed, start its drafter and pick its
        first token from the chunk's last row."""
        s = self.active[b]
        if self.drafters is not None:
            s.hidden_rows.append(self._hidden(p, i, int(p.bounds[i + 1] - p.bounds[i])))
        self.scheduler.chunk_done(s)
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
        self._emit(b, s, [pick(p.logits[p.bounds[i + 1] - 1], s.seq.params, s.rng)], ["target"])

    def _count(self, p: Pass, runs: list, verify_s: float) -> None:
        self.passes, self.prefill_rows = self.passes + 1, self.prefill_rows + sum(len(c) for c in p.chunks)
        if not p.seqs:
            return
        self.steps, self.rows = self.steps + 1, self.rows + int(p.bounds[len(p.seqs)])
        step_s = self.clock.now() - self.clock.t_begin
        for s in p.seqs:  # a step: a pass with decoding rows
            s.stats.step_s.append(step_s)
        # the policy is charged the whole step: besides the pass, drafting and the drafter's commit (an MTP head
        # pass over the kept rows), acceptance and rollback, all of which grow with k
        self.policy.observe([r[2] for r in runs], [r[0] for r in runs], step_s - verify_s, verify_s, int(p.bounds[-1]))

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
        s = self.scheduler.leave(b)
        s.stats.emitted, s.stats.wall_s = len(s.seq.tokens), time.perf_counter() - s.t_join
        s.seq.stats = {k: v for k, v in s.stats.as_dict().items() if k != "phase_ms"}  # phases: the engine's
        s.seq.stats["prompt_tokens"] = len(s.seq.prompt_tokens)
        self.finished.append(s)
        if self.on_finish:
            self.on_finish(s.seq)
