"""A separate small draft model with the same vocabulary proposes the drafts.

The draft model keeps its own ModelState and steps one token at a time: from the pending token it
feeds pending, d_1, ..., d_{k-1} (k forwards) and samples d_1..d_k from its own laws q_i. After the
target keeps pending + d_1..d_m, the draft state must hold exactly those tokens too. It is hybrid
like the target, so its GDN state cannot be truncated either: a SnapshotRing (allocated once) takes a
copy after each draft forward, and commit restores slot m, or, when every draft was kept, feeds
d_k, the one token the draft model has not seen yet. With a keep_going hook (adaptive.py keep_drafting)
drafting stops early after a draft the model is unsure of; k is then the drafts actually made.
Tokens the draft model still has to see (a plain step, k = 0, or the last draft when all were kept) are
queued and fed with the next propose's first pass (one forward for all of them: rows are batch-invariant,
so the state is the same bits), so a run of plain steps costs the draft model nothing until drafting
resumes; reading `state` feeds the queue.

Official implementation: llama.cpp common/speculative.cpp draft-simple (qwen35.md section 5.5).
"""

from __future__ import annotations

import numpy as np

from .fast.draft_vocab import DraftVocab, draw, subset_rows
from .model import Model
from .ops import linear
from .sampling import SamplingParams, draft_probability, draft_token
from .speculate import MAX_DRAFT
from .state import SnapshotRing


class DraftModelDrafter:
    def __init__(self, draft_model: Model, target: Model | None = None, max_draft: int = 16,
                 vocab: DraftVocab | None = None):
        if target is not None and draft_model.cfg.n_vocab != target.cfg.n_vocab:
            raise ValueError(f"the draft model's vocabulary ({draft_model.cfg.n_vocab} tokens) differs from the "
                             f"target's ({target.cfg.n_vocab}); drafts must be target token ids")
        if not 1 <= max_draft <= MAX_DRAFT:
            raise ValueError(f"max_draft must be in 1..{MAX_DRAFT}, got {max_draft}")
        self.model = draft_model
        self.ring = SnapshotRing(draft_model.cfg, max_draft, draft_model.xp)
        self._state = draft_model.new_state()
        self.queue: list[int] = []  # kept tokens the draft model has not been fed yet (see commit)
        self.n_drafted = 0  # forwards made by the last propose
        self.vocab = vocab  # draft over these ids only (draft_vocab.py); None: the whole vocabulary
        self.keep_going = None  # keep_going(probs) -> draft another? (adaptive.py keep_drafting; set by the engine)
        self.probs: list[float] = []  # the last propose's probability of each draft (with keep_going)
        self.output_sub = subset_rows(draft_model.output, vocab.ids) if vocab is not None else None  # [n, D]

    @property
    def state(self):  # the draft model's ModelState, every kept token fed
        if self.queue:
            self.model.forward(np.array(self.queue), self._state, logits=False)
            self.queue = []
        return self._state

    def start(self, prompt: list[int], hidden: np.ndarray) -> None:
        self._state, self.queue = self.model.new_state(), []
        self.model.forward(np.array(prompt), self._state, logits=False)

    def propose(self, pending: int, k: int, params: SamplingParams,
                rng: np.random.Generator) -> tuple[list[int], list[np.ndarray]]:
        if k > self.ring.slots:
            raise ValueError(f"draft length {k} exceeds the draft ring's {self.ring.slots} slots")
        drafts, q_rows, self.probs = [], [], []
        tokens, self.queue = self.queue + [pending], []  # the first pass also feeds the queued kept tokens
        self.ring.filled = 0
        dev, host = self.model.to_device, self.model.to_host
        head = self.model.output if self.vocab is None else self.output_sub  # [N, D] or [n, D]
        for i in range(k):
            _, hidden = self.model.forward(np.array(tokens), self._state, logits=False)
            self.ring.save(self._state, i)  # slot i: pending + d_1..d_i fed
            scores = host(linear(dev(hidden[-1:]), head))[0]  # the last row only: queued rows need no logits
            if self.vocab is None:
                token, q_draft = draft_token(scores, params, rng)
            else:
                token, q_draft = draw(self.vocab, scores, params, rng)
            drafts.append(token)
            q_rows.append(q_draft)
            if self.keep_going is not None:  # how sure the draft model is of this draft decides whether to go on
                self.probs.append(draft_probability(scores, token, q_draft))
                if not self.keep_going(self.probs):
                    break
            tokens = [token]
        if not k:  # nothing drafted: what was queued stays queued (commit queues the pending token)
            self.queue = tokens[:-1]
        self.n_drafted = len(drafts)
        return drafts, q_rows

    def commit(self, fed: list[int], hidden: np.ndarray) -> None:
        n = len(fed)
        if self.n_drafted and n <= self.n_drafted:
            self.ring.restore(self._state, n - 1)
        else:  # nothing drafted, or every draft kept: queue what the draft model has not seen (fed lazily)
            self.queue += fed[self.n_drafted:]
        self.n_drafted = 0
