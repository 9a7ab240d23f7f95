"""One sequence in the engine: what it asked for and got (SeqResult), and where it stands in its slot (Running).

The loop (speculate.py) reads and writes a Running for each sequence of a pass; the scheduler (scheduler.py)
admits, chunks and preempts them; a caller (generate, batch, serve) hands in SeqResults and reads them back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .sampling import SamplingParams


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
    stats: object  # its speculate.SpecStats
    t_join: float
    state: object = None  # its ModelState while it holds a slot (KV in the engine's pool, if it has one)
    pending: int = -1  # the next token, chosen, not yet fed
    history: list[int] = field(default_factory=list)  # what its prefill feeds
    hidden_rows: list = field(default_factory=list)  # the prefill's hidden rows so far (the drafter starts from them)
    save_at: list[int] = field(default_factory=list)  # token counts where the prefix cache keeps its GDN state
    order: int = 0  # admission order: the newest is preempted first
    resume: object = None  # what its drafter's release() returned when it was preempted: handed to start() on resume

    @property
    def prefilling(self) -> bool:
        return self.state.pos < len(self.history)

    def room(self, k_max: int) -> int:
        """Drafts it may make this step: k_max, fewer where max_new leaves less room (the last token is never fed)."""
        return min(k_max, self.max_new - len(self.seq.tokens) - 1)
