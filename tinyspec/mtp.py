"""The MTP (nextn) head of qwen35: one extra full-attention block that predicts the token after next.

Row p pairs token x_p with the target's post-final-norm hidden h_{p-1} (the row whose LM head
predicted x_p; a zero row at p = 0) and predicts x_{p+1}:

    e      = token_embd[x_p]                       (nextn.embed_tokens when the file has one)
    y      = eh_proj @ concat(rms_norm(e, enorm), rms_norm(h_{p-1}, hnorm))    embedding half FIRST
    y      = y + attention(rms_norm(y, attn_norm))           its own KV cache, position p
    y      = y + FFN(rms_norm(y, post_attention_norm))
    h_mtp  = rms_norm(y, shared_head_norm)                   (output_norm when absent)
    logits = output @ h_mtp                                  (shared_head_head when present)

h_mtp is what a chained draft step feeds back in place of h. The head's KV cache must see every
position of the sequence (not only the drafted ones), so it is fed alongside the target.

Official implementation: llama.cpp `src/models/qwen35.cpp` graph_mtp (qwen35.md section 4). HF
transformers drops mtp.* weights on load, so tests build a reference from its decoder layer.
"""

from __future__ import annotations

import numpy as np

from .attention import attention_layer
from .fast.draft_vocab import DraftVocab, draw, subset_rows
from .model import ATTN_TENSORS, FFN_TENSORS, Model, ModelError, ffn
from .ops import linear, rms_norm
from .state import KVCache

NEXTN_TENSORS = ("nextn.eh_proj.weight", "nextn.enorm.weight", "nextn.hnorm.weight")


class MTPHead:
    """The nextn block at blk.{n_trunk} of a Model that has one (qwen35.nextn_predict_layers = 1)."""

    def __init__(self, model: Model):
        cfg = self.cfg = model.cfg
        if cfg.n_nextn != 1:
            raise ModelError("this model has no MTP block (qwen35.nextn_predict_layers is 0 or absent)")
        prefix = f"blk.{cfg.n_trunk}."
        missing = [prefix + n for n in NEXTN_TENSORS + ATTN_TENSORS + FFN_TENSORS if prefix + n not in model.tensors]
        if missing:
            raise ModelError(f"MTP block is missing tensors: {', '.join(missing)}")
        self.w = {n[len(prefix):]: t for n, t in model.tensors.items() if n.startswith(prefix)}
        self.model = model  # its array module and host/device copies (model.xp, to_device, to_host)
        self.embed_tokens = self.w.get("nextn.embed_tokens.weight", model.token_embd)
        self.head_norm = self.w.get("nextn.shared_head_norm.weight", model.output_norm)
        self.head = self.w.get("nextn.shared_head_head.weight", model.output)

    def new_cache(self) -> KVCache:
        return KVCache(self.cfg.n_head_kv, self.cfg.head_dim, xp=self.model.xp)

    def forward(self, tokens, hidden_prev: np.ndarray, cache: KVCache,
                logits: bool = True) -> tuple[np.ndarray | None, np.ndarray]:
        """tokens [T] at positions cache.n .., hidden_prev [T, D] (h_{p-1} per row) -> logits [T, N], h_mtp [T, D].

        logits=False skips the output projection (None instead of logits): feeding the cache with kept
        tokens needs only the KV rows, and the [N, D] head is most of the block's cost on a small model."""
        cfg, w = self.cfg, self.w
        tokens = np.asarray(tokens, dtype=np.int64)
        if hidden_prev.shape != (tokens.size, cfg.n_embd):
            raise ValueError(f"hidden_prev has shape {hidden_prev.shape}, expected {(tokens.size, cfg.n_embd)}")
        dev = self.model.to_device
        e = rms_norm(dev(self.embed_tokens[tokens]), w["nextn.enorm.weight"], cfg.rms_eps)  # [T, D]
        h = rms_norm(dev(hidden_prev.astype(np.float32)), w["nextn.hnorm.weight"], cfg.rms_eps)  # [T, D]
        y = linear(np.concatenate([e, h], axis=1), w["nextn.eh_proj.weight"])  # [T, 2D] -> [T, D]
        y = y + attention_layer(rms_norm(y, w["attn_norm.weight"], cfg.rms_eps), w, cache, cfg, self.model.attend)
        y = y + ffn(rms_norm(y, w["post_attention_norm.weight"], cfg.rms_eps), w)
        h_mtp = rms_norm(y, self.head_norm, cfg.rms_eps)
        host = self.model.to_host
        return (host(linear(h_mtp, self.head)) if logits else None), host(h_mtp)


def shift_hidden(hidden: np.ndarray, h_before: np.ndarray | None = None) -> np.ndarray:
    """Pair row p with h_{p-1}: [T, D] -> [T, D], first row = h_before (zeros at the start of a sequence)."""
    first = np.zeros((1, hidden.shape[1]), np.float32) if h_before is None else h_before.reshape(1, -1)
    return np.concatenate([first, hidden[:-1]], axis=0)


class MTPDrafter:
    """Self-speculation with the MTP head: chain the nextn block k times from the pending token.

    Draft i feeds (d_{i-1}, h) where h is the target's hidden row for the first draft and the head's own
    h_mtp afterwards (qwen35 has one MTP layer, reused for every depth). Drafting appends rows to the
    head's KV cache; they are dropped afterwards and the kept tokens are re-fed with the TARGET's hidden
    rows, so the cache always ends exactly at the accepted prefix, as llama.cpp keeps it.

    The re-feed is lazy: commit() queues the kept tokens with their hidden rows and the next propose()
    feeds the whole queue in the same head pass as its first draft (the queue's rows, then the pending
    token's; only the last row is projected to the vocabulary). A run of plain steps (k = 0, adaptive.py)
    then costs no head pass at all until drafting resumes, and cache and drafts are the same bit for bit
    as feeding first (the head's rows are batch-invariant like the trunk's). Reading `cache` feeds the
    queue. If more than `max_queue`
    tokens queue up (a long run of plain steps), the head restarts from a fresh cache holding only the
    last max_queue of them: drafting then attends to a window of the recent past (rope depends only on
    relative positions, so the window is consistent), which costs draft quality, never correctness
    (drafts are only proposals), and bounds what a suspended drafter pays to catch up.
    vocab: score only these token ids when drafting (draft_vocab.py); verification is unchanged.
    p_min: stop drafting after a draft whose probability under the head's law is below p_min (greedy: the
    softmax of its logits; sampled: q of the drawn token), as llama.cpp's --draft-p-min: the uncertain draft
    is still proposed (its head pass is paid), the next ones are not. A confident head is usually right
    (the shipped model, held-out text: 0.99-1.0 of drafts at p >= 0.7 are kept, 0.62 at p < 0.3), so the
    cost of drafting and verifying past an unsure draft is skipped where it would mostly be thrown away.
    0 (the default) drafts all k.
    p_floor (greedy only): a draft whose probability is below p_floor is not proposed at all, and drafting
    stops (`withdrawn` says so). A head that gives its own best token under 1% is guessing (a random-weight
    head at the 0.8B shape: 2e-4 over 248k tokens, 1e-3 over a 32k draft vocabulary; of the shipped model's
    drafts none fell below 0.014 in 33,000), and verifying such a draft costs a verify row and a
    rollback for nothing. Only greedy: choosing whether to propose a sampled draft from its own q would bias
    the law the rejection rule assumes. 0 (the default) proposes every draft made; the adaptive policy sets
    it (adaptive.py `floor`).
    """

    def __init__(self, model: Model, vocab: DraftVocab | None = None, max_queue: int = 32, p_min: float = 0.0,
                 p_floor: float = 0.0):
        if not 0.0 <= p_min <= 1.0 or not 0.0 <= p_floor <= 1.0:
            raise ValueError(f"p_min and p_floor must be in [0, 1], got {p_min}, {p_floor}")
        self.p_min, self.p_floor = float(p_min), float(p_floor)
        self.withdrawn = False  # the last propose made a draft under p_floor and did not propose it
        self.keep_going = None  # keep_going(probs) -> draft another? (adaptive.py keep_drafting; set by the engine)
        self.probs: list[float] = []  # the last propose's probability of each draft (with p_min or keep_going)
        self.head = MTPHead(model)
        self._cache = self.head.new_cache()
        self.queue: list[tuple[list[int], np.ndarray]] = []  # kept tokens not yet fed, with their h_{p-1} rows
        self.max_queue = max_queue
        self.h_last: np.ndarray | None = None  # target hidden row that predicted the pending token
        self.vocab = vocab  # draft over these ids only (draft_vocab.py); None: the whole vocabulary
        self.head_sub = subset_rows(self.head.head, vocab.ids) if vocab is not None else None  # [n, D]

    @property
    def cache(self) -> KVCache:  # the head's KV cache, every kept token fed
        self._feed_queue()
        return self._cache

    def _feed_queue(self) -> None:
        if self.queue:
            tokens = [t for fed, _ in self.queue for t in fed]
            rows = np.concatenate([h for _, h in self.queue])  # [n, D]
            self.queue = []
            self.head.forward(tokens, rows, self._cache, logits=False)

    def start(self, prompt: list[int], hidden: np.ndarray) -> None:
        self._cache, self.queue = self.head.new_cache(), []
        self.head.forward(prompt, shift_hidden(hidden), self._cache, logits=False)
        self.h_last = hidden[-1]

    def propose(self, pending: int, k: int, params, rng) -> tuple[list[int], list[np.ndarray]]:
        from .sampling import draft_probability, draft_token

        cache = self._cache
        # the first pass feeds the queued kept tokens and the pending token together (one pass of the block,
        # not two: rows are batch-invariant, so the cache and the draft are the same bits either way)
        fed = [t for f, _ in self.queue for t in f]
        rows = [h for _, h in self.queue]
        self.queue = []
        n_kept = cache.n + len(fed)
        drafts, q_rows, self.probs, self.withdrawn = [], [], [], False
        tokens, hs = fed + [pending], np.concatenate(rows + [self.h_last[None, :]])
        for _ in range(k):
            _, h_mtp = self.head.forward(tokens, hs, cache, logits=False)
            h = h_mtp[-1:]  # [1, D]: the row that predicts the next draft
            dev, host = self.head.model.to_device, self.head.model.to_host
            logits = host(linear(dev(h), self.head.head if self.vocab is None else self.head_sub))[0]
            if self.vocab is None:
                token, q_draft = draft_token(logits, params, rng)
            else:
                token, q_draft = draw(self.vocab, logits, params, rng)
            p = draft_probability(logits, token, q_draft) if self.p_min or self.p_floor or self.keep_going else None
            if p is not None and p < self.p_floor and params.greedy:  # the head is guessing: not worth a verify row
                self.withdrawn = True
                break
            drafts.append(token)
            q_rows.append(q_draft)
            if p is not None:
                self.probs.append(p)
                if p < self.p_min or (self.keep_going is not None and not self.keep_going(self.probs)):
                    break
            tokens, hs = [token], h
        cache.truncate(n_kept)
        return drafts, q_rows

    def commit(self, fed: list[int], hidden: np.ndarray) -> None:
        self.queue.append((list(fed), shift_hidden(hidden, self.h_last)))
        self.h_last = hidden[-1]
        if sum(len(f) for f, _ in self.queue) > self.max_queue:  # restart from a window of the recent past
            tokens = [t for f, _ in self.queue for t in f][-self.max_queue:]
            rows = np.concatenate([h for _, h in self.queue])[-self.max_queue:]
            self._cache, self.queue = self.head.new_cache(), [(tokens, rows)]
