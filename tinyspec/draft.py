"""A separate small draft model with the same vocabulary proposes the drafts.

The draft model keeps its own ModelState and steps one token at a time: from the pending token it
feeds pending, d_1, ..., d_{k-1} (k forwards) and samples d_1..d_k from its own laws q_i. After the
target keeps pending + d_1..d_m, the draft state must hold exactly those tokens too. It is hybrid
like the target, so its GDN state cannot be truncated either: a SnapshotRing (allocated once) takes a
copy after each draft forward, and commit restores slot m, or, when every draft was kept, feeds
d_k, the one token the draft model has not seen yet.

Official implementation: llama.cpp common/speculative.cpp draft-simple (qwen35.md section 5.5).
"""

from __future__ import annotations

import numpy as np

from .draft_vocab import DraftVocab, draw, subset_rows
from .model import Model
from .ops import linear
from .sampling import SamplingParams, draft_token
from .state import SnapshotRing


class DraftModelDrafter:
    def __init__(self, draft_model: Model, target: Model | None = None, max_draft: int = 16,
                 vocab: DraftVocab | None = None):
        if target is not None and draft_model.cfg.n_vocab != target.cfg.n_vocab:
            raise ValueError(f"the draft model's vocabulary ({draft_model.cfg.n_vocab} tokens) differs from the "
                             f"target's ({target.cfg.n_vocab}); drafts must be target token ids")
        self.model = draft_model
        self.ring = SnapshotRing(draft_model.cfg, max_draft, draft_model.xp)
        self.state = draft_model.new_state()
        self.n_drafted = 0  # forwards made by the last propose
        self.vocab = vocab  # draft over these ids only (draft_vocab.py); None: the whole vocabulary
        self.output_sub = subset_rows(draft_model.output, vocab.ids) if vocab is not None else None  # [n, D]

    def start(self, prompt: list[int], hidden: np.ndarray) -> None:
        self.state = self.model.new_state()
        self.model.forward(np.array(prompt), self.state)

    def propose(self, pending: int, k: int, params: SamplingParams,
                rng: np.random.Generator) -> tuple[list[int], list[np.ndarray]]:
        if k > self.ring.slots:
            raise ValueError(f"draft length {k} exceeds the draft ring's {self.ring.slots} slots")
        drafts, q_rows, token = [], [], pending
        self.ring.filled = 0
        for i in range(k):
            logits, hidden = self.model.forward(np.array([token]), self.state, logits=self.vocab is None)
            self.ring.save(self.state, i)  # slot i: pending + d_1..d_i fed
            if self.vocab is None:
                token, q_draft = draft_token(logits[0], params, rng)
            else:
                token, q_draft = draw(self.vocab, linear(hidden, self.output_sub)[0], params, rng)
            drafts.append(token)
            q_rows.append(q_draft)
        self.n_drafted = k
        return drafts, q_rows

    def commit(self, fed: list[int], hidden: np.ndarray) -> None:
        n = len(fed)
        if self.n_drafted and n <= self.n_drafted:
            self.ring.restore(self.state, n - 1)
        else:  # nothing drafted, or every draft kept: feed what the draft model has not seen
            self.model.forward(np.array(fed[self.n_drafted:]), self.state, logits=False)
        self.n_drafted = 0
