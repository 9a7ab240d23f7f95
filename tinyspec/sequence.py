"""One sequence in the engine: what it asked for and got (SeqResult), where it stands in its slot (Running), and
its counts (SpecStats).

The loop (speculate.py) reads and writes a Running for each sequence of a pass; the scheduler (scheduler.py)
admits, chunks and preempts them (and counts its preemptions and prefix hits in its stats); a caller (generate,
batch, serve) hands in SeqResults and reads them back, with the stats as a dict.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .sampling import SamplingParams

PHASES = ("prefill", "draft", "verify", "accept", "rollback")


def step_ms(step_s: list[float]) -> dict:
    """The steps' times as {"step_ms": {median, min, max}} (nothing when no step was timed): how steady the
    run's own timing was, so a reader can tell a slow run from a noisy one."""
    if not step_s:
        return {}
    ms = sorted(1000 * s for s in step_s)
    return {"step_ms": {"median": float(np.median(ms)), "min": ms[0], "max": ms[-1], "steps": len(ms)}}


@dataclass
class SpecStats:
    """One sequence's counts: what it drafted, kept and emitted, per draft position too, and its time."""
    k_max: int  # drafts a step at most (the policy's, or the sequence's own cap: Engine.add draft_n)
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
            "accepted": self.accepted, "emitted": self.emitted, "generated": self.emitted,
            "acceptance_rate": self.accepted / self.drafted if self.drafted else 0.0,
            "mean_accepted_length": (self.accepted + self.steps) / self.steps if self.steps else 0.0,
            "accepted_per_position": [a / d if d else 0.0 for a, d in zip(self.accepted_per_position, self.drafted_per_position)],
            "drafted_at": list(self.drafted_per_position), "accepted_at": list(self.accepted_per_position),
            "accepted_length_histogram": {str(k): v for k, v in sorted(self.accepted_length_histogram.items())},
            "phase_ms": {k: 1000 * v for k, v in self.phase_s.items()},
            "rollbacks": self.rollbacks, "preemptions": self.preemptions,
            "prefix_tokens_reused": self.prefix_tokens_reused,
            "prefill_s": self.phase_s["prefill"], "decode_s": decode_s,
            "tokens_per_s": self.emitted / decode_s if decode_s > 0 else 0.0,
            "decode_tok_s": self.emitted / decode_s if decode_s > 0 else 0.0,
        } | step_ms(self.step_s) | ({"adaptive": self.adaptive} if self.adaptive is not None else {})


@dataclass
class SeqResult:
    """One sequence's output, from generate() or from the engine (speculate.py, batch.py, serve.py)."""
    index: int  # position in the input (generate: 0)
    prompt_tokens: list[int]
    tokens: list[int] = field(default_factory=list)  # generated ids, exactly as the sequence alone gets them
    marks: list[str] = field(default_factory=list)  # per token: target (plain, or the first), accepted, correction, bonus
    stats: dict = field(default_factory=dict)
    error: str | None = None  # the prompt could not run (empty, too long, bad ids): reported, others run
    params: SamplingParams | None = None  # how it samples (Engine.add: the engine's unless given its own)
    stop_ids: frozenset[int] | None = None  # the ids that end it (Engine.add: the engine's unless given its own)


@dataclass
class Running:
    """A sequence the engine holds: everything a step reads and writes for it.

    It first prefills `history` (its prompt; a preempted one resumed: prompt + tokens[:-1]) a chunk per pass, as
    rows of the verify pass, while state.pos < len(history); then it decodes: `pending` is the next token,
    chosen and not yet fed."""
    seq: SeqResult
    rng: np.random.Generator
    max_new: int
    stats: SpecStats
    t_join: float
    state: object = None  # its ModelState while it holds a slot (KV in the engine's pool, if it has one)
    pending: int = -1  # the next token, chosen, not yet fed
    history: list[int] = field(default_factory=list)  # what its prefill feeds
    hidden_rows: list = field(default_factory=list)  # the prefill's hidden rows so far (the drafter starts from them)
    save_at: list[int] = field(default_factory=list)  # token counts where the prefix cache keeps its GDN state
    order: int = 0  # admission order: the newest is preempted first
    resume: object = None  # what its drafter's release() returned when it was preempted: handed to start() on resume
    k_cap: int | None = None  # its own most drafts a step (Engine.add draft_n; 0: never drafts), None: the policy's

    @property
    def prefilling(self) -> bool:
        return self.state.pos < len(self.history)

    def room(self, k_max: int) -> int:
        """Drafts it may make this step: k_max, or its own cap k_cap if lower, fewer where max_new leaves less room
        (the last token is never fed). The policy plans within it, and the scheduler budgets its rows by it."""
        cap = k_max if self.k_cap is None else min(k_max, self.k_cap)
        return min(cap, self.max_new - len(self.seq.tokens) - 1)
