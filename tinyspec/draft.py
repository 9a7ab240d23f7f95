"""A separate small draft model with the same vocabulary proposes the drafts.

The draft model keeps its own ModelState and steps one token at a time: from the pending token it
feeds pending, d_1, ..., d_{k-1} (k forwards) and samples d_1..d_k from its own laws q_i. After the
target keeps pending + d_1..d_m, the draft state must hold exactly those tokens too. It is hybrid
like the target, so its GDN state cannot be truncated either: a SnapshotRing (allocated once) takes a
copy after each draft forward, and commit restores entry m, or, when every draft was kept, feeds
d_k, the one token the draft model has not seen yet. The ring is sized at start() from the most drafts
the engine will ask for (k_max), once per generation. With a stop rule's keep_going (the adaptive
policy's keep_drafting) drafting stops early after a draft the model is unsure of; k is then the drafts
actually made.
Tokens the draft model still has to see (a plain step, k = 0, or the last draft when all were kept) are
queued and fed with the next propose's first pass (one forward for all of them: rows are batch-invariant,
so the state is the same bits), so a run of plain steps costs the draft model nothing until drafting
resumes; reading `state` feeds the queue.

In a batch engine's KV pool (another(pool)) the draft model's attention layers take the pool's blocks, seen in its
own row shape (paged.ViewTable; the pool's BlockPool.table_for picks it), so admission and preemption count them
with the target's. A preempted sequence's release() gives them back; start() on resume prefills the draft model
with the same history, which is exactly the state it had (no window, and its queue is fed with the next draft in
one pass of the same bits), so release() has nothing to hand back.

Official implementation: llama.cpp common/speculative.cpp draft-simple (docs/qwen35.md section 5.5).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .model import Model
from .sampling import DraftVocabulary, SamplingParams, draft_probability, draft_token
from .drafting import Draft, Drafting, Proposing, StopRule, device_draft, fetch_drafts
from .paged import BlockPool
from .state import SnapshotRing


@dataclass(frozen=True)
class DraftPass:
    """One draft-model pass a drafting sequence asks for: tokens into its state, the last row scored."""
    tokens: list[int]
    state: object  # the sequence's draft ModelState
    scores: object  # the draft model's output weight, or a draft vocabulary's rows of it


class DraftModelDrafter(Proposing):
    stops_by_confidence = True  # it knows its law over each draft, and honours stop.keep_going

    def __init__(self, draft_model: Model, target: Model, vocab: DraftVocabulary | None = None, scores=None,
                 pool: BlockPool | None = None):
        """target: the model the drafts are for; its vocabulary must be the draft model's (a draft is a target
        token id, fed to the target from where the draft model made it, unchecked on a GPU). pool: a batch
        engine's BlockPool the draft model's KV takes blocks from (None: its own caches)."""
        if draft_model.cfg.n_vocab != target.cfg.n_vocab:
            raise ValueError(f"the draft model's vocabulary ({draft_model.cfg.n_vocab} tokens) differs from the "
                             f"target's ({target.cfg.n_vocab}); drafts must be target token ids")
        self.model, self.target = draft_model, target
        self.ring: SnapshotRing | None = None  # one entry per draft, allocated by start()
        self.pool = pool
        self.fed_state = draft_model.new_state(pool)  # the tokens fed so far (`state` feeds the queue first)
        self.queue: list[int] = []  # kept tokens the draft model has not been fed yet (see commit)
        self.n_drafted = 0  # forwards made by the last propose
        self.vocab = vocab  # draft over these ids only (sampling.DraftVocabulary); None: the whole vocabulary
        if scores is None:  # given by a batch whose sequences share it (another())
            scores = draft_model.output if vocab is None else vocab.rows(draft_model.output)
        self.scores = scores  # [N, D] or [n, D]

    def another(self, pool: BlockPool | None = None) -> "DraftModelDrafter":
        """A drafter for another sequence of the same batch: its own state (its KV in `pool`, if given) and ring,
        this one's draft model and scores weight (so a batch's draft passes score every sequence with one product)."""
        return DraftModelDrafter(self.model, self.target, self.vocab, self.scores, pool)

    @property
    def state(self):  # the draft model's ModelState, every kept token fed
        if self.queue:
            self.model.forward(np.array(self.queue), self.fed_state, logits=False)
            self.queue = []
        return self.fed_state

    def start(self, prompt: list[int], hidden: np.ndarray, k_max: int, resume: None = None) -> None:
        if self.ring is None or self.ring.size < max(1, k_max):
            self.ring = SnapshotRing(self.model.cfg, max(1, k_max), self.model.xp)
        self.fed_state.release()  # (in a pool it holds no block here: release() came first)
        self.fed_state, self.queue, self.n_drafted = self.model.new_state(self.pool), [], 0
        self.model.forward(np.array(prompt), self.fed_state, logits=False)

    def release(self) -> None:
        """Give every pool block back (the sequence is preempted or done); a resumed start() rebuilds the state
        from the history alone, so nothing is handed back."""
        self.fed_state.release()
        self.queue, self.n_drafted = [], 0

    @property
    def kv_table(self):
        """The draft model's table in the engine's pool (None without one): the engine budgets its blocks."""
        return None if self.pool is None else self.fed_state.table

    def drafting(self, pending: int, k: int, params: SamplingParams, rng: np.random.Generator,
                 stop: StopRule | None = None, on_device: bool = False) -> Drafting:
        """The k drafts as a coroutine (drafting.Drafter): yields each draft-model pass it needs (a DraftPass), is
        sent back the scores of the pass's last row, returns the Draft. Where the drafts are: as in
        mtp.MTPDrafter.drafting (argmaxes stay where the draft model computes; a draft is read on the host by
        itself only when the stop rule asks for its probability, with a draft vocabulary, or when sampled)."""
        if self.ring is None or k > self.ring.size:
            raise ValueError(f"a draft of {k} exceeds the drafts start() was told of "
                             f"({0 if self.ring is None else self.ring.size})")
        keep_going = stop.keep_going if stop is not None else None
        argmax_ids = params.greedy and self.vocab is None  # drafts stay where the draft model computes until the end
        drafts, q_rows, probs = [], [], []
        tokens, self.queue = self.queue + [pending], []  # the first pass also feeds the queued kept tokens
        self.ring.filled = 0
        for i in range(k):
            scores = yield DraftPass(tokens, self.fed_state, self.scores)  # [N] or [n]: the pass's last row
            self.ring.save(self.fed_state, i)  # entry i: pending + d_1..d_i fed
            if argmax_ids:  # [1] id where the draft model computes: no transfer
                token, q_draft = np.argmax(scores).reshape(1), None
            else:  # a sampled draft reads the law on the host
                scores = scores if params.greedy else self.model.to_host(scores)
                token, q_draft = draft_token(scores, params, rng) if self.vocab is None else \
                    self.vocab.draw(scores, params, rng)
            drafts.append(token)
            q_rows.append(q_draft)
            if keep_going is not None:  # how sure the draft model is of this draft decides whether to go on
                probs.append(draft_probability(scores, token, q_draft))
                if not keep_going(probs):
                    break
            tokens = token if argmax_ids else [token]
        if not k:  # nothing drafted: what was queued stays queued (commit queues the pending token)
            self.queue = tokens[:-1]
        self.n_drafted = len(drafts)
        if argmax_ids and on_device and drafts:  # asked to leave them: the verify step fetches them with its run
            return device_draft(drafts, q_rows, probs)
        return Draft(fetch_drafts(drafts, self.model) if argmax_ids else drafts, q_rows, probs)

    def draft_pass(self, asks: list["DraftPass"]) -> list[np.ndarray]:
        """The draft-model passes several drafting sequences asked for, made as one (Model.forward_batch, each
        into its own state), then each ask's last row scored (asks sharing a scores weight: one product)."""
        model = self.model
        _, hidden, bounds = model.forward_batch([a.tokens for a in asks], [a.state for a in asks], logits=False,
                                                to_host=False)
        last = hidden[bounds[1:] - 1]  # [B, D]
        out = [None] * len(asks)
        for weight in {id(a.scores): a.scores for a in asks}.values():
            rows = [b for b, a in enumerate(asks) if a.scores is weight]
            scores = model.kernels.linear(last[rows], weight)  # [b, n], where the model computes
            for j, b in enumerate(rows):
                out[b] = scores[j]
        return out

    def commit(self, fed: list[int], hidden: np.ndarray) -> None:
        n = len(fed)
        if self.n_drafted and n <= self.n_drafted:
            self.ring.restore(self.fed_state, n - 1)
        else:  # nothing drafted, or every draft kept: queue what the draft model has not seen (fed lazily)
            self.queue += fed[self.n_drafted:]
        self.n_drafted = 0
