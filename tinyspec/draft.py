"""A separate small draft model with the same vocabulary proposes the drafts.

The draft model keeps its own ModelState and steps one token at a time: from the pending token it
feeds pending, d_1, ..., d_{k-1} (k forwards) and samples d_1..d_k from its own laws q_i. After the
target keeps pending + d_1..d_m, the draft state must hold exactly those tokens too. It is hybrid
like the target, so its GDN state cannot be truncated either: a SnapshotRing (allocated once) takes a
copy after each draft forward, and commit restores slot m, or, when every draft was kept, feeds
d_k, the one token the draft model has not seen yet. The ring is sized at start() from the most drafts
the engine will ask for (k_max), once per generation. With a stop rule's keep_going (the adaptive
policy's keep_drafting) drafting stops early after a draft the model is unsure of; k is then the drafts
actually made.
Tokens the draft model still has to see (a plain step, k = 0, or the last draft when all were kept) are
queued and fed with the next propose's first pass (one forward for all of them: rows are batch-invariant,
so the state is the same bits), so a run of plain steps costs the draft model nothing until drafting
resumes; reading `state` feeds the queue.

Official implementation: llama.cpp common/speculative.cpp draft-simple (docs/qwen35.md section 5.5).
"""

from __future__ import annotations

import numpy as np

from .model import Model
from .sampling import DraftVocabulary, SamplingParams, draft_probability, draft_token
from .speculate import Draft, StopRule
from .state import SnapshotRing


class DraftModelDrafter:
    stops_by_confidence = True  # it knows its law over each draft, and honours stop.keep_going

    def __init__(self, draft_model: Model, target: Model | None = None, vocab: DraftVocabulary | None = None):
        if target is not None and draft_model.cfg.n_vocab != target.cfg.n_vocab:
            raise ValueError(f"the draft model's vocabulary ({draft_model.cfg.n_vocab} tokens) differs from the "
                             f"target's ({target.cfg.n_vocab}); drafts must be target token ids")
        self.model = draft_model
        self.ring: SnapshotRing | None = None  # one slot per draft, allocated by start()
        self._state = draft_model.new_state()
        self.queue: list[int] = []  # kept tokens the draft model has not been fed yet (see commit)
        self.n_drafted = 0  # forwards made by the last propose
        self.vocab = vocab  # draft over these ids only (sampling.DraftVocabulary); None: the whole vocabulary
        self.scores = draft_model.output if vocab is None else vocab.rows(draft_model.output)  # [N, D] or [n, D]

    @property
    def state(self):  # the draft model's ModelState, every kept token fed
        if self.queue:
            self.model.forward(np.array(self.queue), self._state, logits=False)
            self.queue = []
        return self._state

    def start(self, prompt: list[int], hidden: np.ndarray, k_max: int) -> None:
        if self.ring is None or self.ring.slots < max(1, k_max):
            self.ring = SnapshotRing(self.model.cfg, max(1, k_max), self.model.xp)
        self._state, self.queue, self.n_drafted = self.model.new_state(), [], 0
        self.model.forward(np.array(prompt), self._state, logits=False)

    def propose(self, pending: int, k: int, params: SamplingParams, rng: np.random.Generator,
                stop: StopRule | None = None) -> Draft:
        if self.ring is None or k > self.ring.slots:
            raise ValueError(f"a draft of {k} exceeds the drafts start() was told of "
                             f"({0 if self.ring is None else self.ring.slots})")
        keep_going = stop.keep_going if stop is not None else None
        drafts, q_rows, probs = [], [], []
        tokens, self.queue = self.queue + [pending], []  # the first pass also feeds the queued kept tokens
        self.ring.filled = 0
        dev, host = self.model.to_device, self.model.to_host
        for i in range(k):
            _, hidden = self.model.forward(np.array(tokens), self._state, logits=False)
            self.ring.save(self._state, i)  # slot i: pending + d_1..d_i fed
            scores = host(self.model.kernels.linear(dev(hidden[-1:]), self.scores))[0]  # the last row only
            token, q_draft = draft_token(scores, params, rng) if self.vocab is None else \
                self.vocab.draw(scores, params, rng)
            drafts.append(token)
            q_rows.append(q_draft)
            if keep_going is not None:  # how sure the draft model is of this draft decides whether to go on
                probs.append(draft_probability(scores, token, q_draft))
                if not keep_going(probs):
                    break
            tokens = [token]
        if not k:  # nothing drafted: what was queued stays queued (commit queues the pending token)
            self.queue = tokens[:-1]
        self.n_drafted = len(drafts)
        return Draft(drafts, q_rows, probs)

    def commit(self, fed: list[int], hidden: np.ndarray) -> None:
        n = len(fed)
        if self.n_drafted and n <= self.n_drafted:
            self.ring.restore(self._state, n - 1)
        else:  # nothing drafted, or every draft kept: queue what the draft model has not seen (fed lazily)
            self.queue += fed[self.n_drafted:]
        self.n_drafted = 0
