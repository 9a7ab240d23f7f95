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

Official implementation: llama.cpp `src/models/qwen35.cpp` graph_mtp (docs/qwen35.md section 4). HF
transformers drops mtp.* weights on load, so tests build a reference from its decoder layer.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Generator

import numpy as np

from .attention import attention_layer_ragged
from .model import ATTN_TENSORS, FFN_TENSORS, Model, ModelError, check_ffn, checked_ids
from .ops import join_rows
from .sampling import DraftVocabulary, SamplingParams, draft_probability, draft_token, sample
from .drafting import Draft, Drafting, Proposing, StopRule, device_draft, fetch_drafts
from .paged import BlockPool, PagedKVCache, ViewTable
from .state import KVCache
from .tree import Calibration, Guess, TreeBuilder, p_bin

NEXTN_TENSORS = ("nextn.eh_proj.weight", "nextn.enorm.weight", "nextn.hnorm.weight")


class MTPHead:
    """The nextn block at blk.{n_trunk} of a Model that has one (qwen35.nextn_predict_layers = 1)."""

    def __init__(self, model: Model):
        cfg = self.cfg = model.cfg
        if cfg.n_nextn != 1:
            raise ModelError("this model has no MTP block (qwen35.nextn_predict_layers is 0 or absent)")
        prefix = f"blk.{cfg.n_trunk}."
        missing = [prefix + n for n in NEXTN_TENSORS + ATTN_TENSORS + FFN_TENSORS[:2] if prefix + n not in model.tensors]
        if missing:
            raise ModelError(f"MTP block is missing tensors: {', '.join(missing)}")
        check_ffn(model.tensors, prefix, cfg)  # dense, or qwen35moe's experts
        self.w = {n[len(prefix):]: t for n, t in model.tensors.items() if n.startswith(prefix)}
        self.model = model  # its kernels (the functions the head uses) and placement (array module, copies)
        self.embed_tokens = self.w.get("nextn.embed_tokens.weight", model.token_embd)
        self.head_norm = self.w.get("nextn.shared_head_norm.weight", model.output_norm)
        self.head = self.w.get("nextn.shared_head_head.weight", model.output)

    def new_cache(self, pool: BlockPool | None = None) -> KVCache | PagedKVCache:
        """An empty cache for one sequence: its own contiguous KVCache, or, in a batch engine's pool, one layer
        of the target's row shape in the pool's blocks (paged.ViewTable: S * block_size positions a block)."""
        if pool is None:
            return KVCache(self.cfg.n_head_kv, self.cfg.head_dim, xp=self.model.xp)
        return PagedKVCache(ViewTable(pool, [0], self.cfg.n_head_kv, self.cfg.head_dim), 0)

    def forward(self, tokens, hidden_prev: np.ndarray, cache: KVCache,
                logits: bool = True) -> tuple[np.ndarray | None, np.ndarray]:
        """tokens [T] at positions cache.n .., hidden_prev [T, D] (h_{p-1} per row) -> logits [T, N], h_mtp [T, D].

        logits=False skips the output projection (None instead of logits): feeding the cache with kept
        tokens needs only the KV rows, and the [N, D] head is most of the block's cost on a small model."""
        out, h_mtp, _ = self.forward_batch([tokens], [hidden_prev], [cache], logits)
        return out, h_mtp

    def forward_batch(self, tokens: list, hidden_prev: list, caches: list, logits: bool = True,
                      to_host: bool = True, ahead: list | None = None) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
        """forward for several sequences in one pass (each its own cache): rows packed as in
        Model.forward_batch, which bounds [B+1] locates; every row is the one that sequence computes alone.
        tokens[b] are host ids or device ids (a greedy draft's argmax: model.embed_rows); hidden_prev rows may be
        host or device arrays (the target's, where it left them); to_host=False leaves logits and h_mtp where
        the head computes, as Model.forward does. ahead: per sequence (its own rows, the one-row passes that will
        follow), handed to the device pass (Placement.device_pass: their maps may ride this pass's upload)."""
        cfg, place = self.cfg, self.model.placement
        sizes = [len(t) for t in tokens]
        for n, h in zip(sizes, hidden_prev):
            if h.shape != (n, cfg.n_embd):
                raise ValueError(f"hidden_prev has shape {h.shape}, expected {(n, cfg.n_embd)}")
        # host ids checked here, before anything changes; device ids (a drafter's argmax) are in range already
        tokens = [checked_ids(t, cfg.n_vocab, place.xp) for t in tokens]
        bounds = np.cumsum([0] + sizes)
        hidden_prev = join_rows([place.to_device(h.astype(np.float32)) for h in hidden_prev])  # [R, D]
        # a device pass (the cuda backend's): the block reads its rows from one map, replayed from a CUDA graph
        # (placement.py, Placement.device_pass); None: the host path
        device = place.device_pass(cfg, tokens, [[c] for c in caches], bounds, [None] * len(caches), logits, ahead)
        if device is None:
            e = join_rows([place.to_device(self.embed_tokens[t]) for t in tokens])  # [R, D]
            out, h_mtp = self.block(e, hidden_prev, caches, bounds, None, logits)
        else:
            out, h_mtp = device.run(lambda rows, h_prev: self.block(self.embed_tokens[rows.ids], h_prev, caches,
                                                                    bounds, rows, logits), hidden_prev)
        if to_host:
            out, h_mtp = (place.to_host(out) if out is not None else None), place.to_host(h_mtp)
        return out, h_mtp, bounds

    def block(self, e, hidden_prev, caches: list, bounds: np.ndarray, rows=None,
              logits: bool = True) -> tuple[np.ndarray | None, np.ndarray]:
        """forward_batch's device work: the token rows e [R, D] and hidden_prev [R, D] through the block ->
        (logits [R, N] or None, h_mtp [R, D]) where the head computes. rows: a device pass's row map
        (fast/rowmap.py's RowViews) for the attention, or None (it reads the caches' lengths on the host)."""
        cfg, w, kern = self.cfg, self.w, self.model.kernels
        e = kern.rms_norm(e, w["nextn.enorm.weight"], cfg.rms_eps)  # [R, D]
        h = kern.rms_norm(hidden_prev, w["nextn.hnorm.weight"], cfg.rms_eps)
        y = kern.linear(np.concatenate([e, h], axis=1), w["nextn.eh_proj.weight"])  # [R, 2D] -> [R, D]
        y = y + attention_layer_ragged(kern.rms_norm(y, w["attn_norm.weight"], cfg.rms_eps), w, caches, bounds, cfg,
                                       kern, rows)
        y = kern.ffn_residual(y, w, cfg, kern)  # y + ffn(rms_norm(y)), as every trunk layer
        h_mtp = kern.rms_norm(y, self.head_norm, cfg.rms_eps)  # [R, D]
        return (kern.linear(h_mtp, self.head) if logits else None), h_mtp  # [R, N]

    def draft_pass(self, asks: list["HeadPass"]) -> list[tuple[np.ndarray, np.ndarray]]:
        """The head passes several drafting sequences asked for (MTPDrafter.drafting), made as one: each ask's
        rows into its own cache, then only each ask's last row scored against its `scores` (asks that share
        the scores weight share one product). -> per ask (h_mtp of its last row [1, D], its scores [n]), both
        where the head computes (a greedy draft is an argmax there: one int comes back, not [n] scores)."""
        kern = self.model.kernels
        ends = [a.cache.n + len(a.tokens) - a.filler for a in asks]  # where each cache ends without its filler
        ahead = [(len(a.tokens) - a.filler, a.then) for a in asks] if any(a.then for a in asks) else None
        _, h_mtp, bounds = self.forward_batch([a.tokens for a in asks], [a.rows for a in asks],
                                              [a.cache for a in asks], logits=False, to_host=False, ahead=ahead)
        for a, end in zip(asks, ends):
            if a.cache.n > end:  # the filler's KV rows: forgotten, so the next pass writes where it would have (its
                a.cache.rewind(end)  # blocks kept: the next passes' maps may have been made with them)
        last = join_rows([h_mtp[i - a.filler - 1 : i - a.filler] for i, a in zip(bounds[1:], asks)])
        scores = [None] * len(asks)
        for weight in {id(a.scores): a.scores for a in asks}.values():
            rows = [b for b, a in enumerate(asks) if a.scores is weight]
            mine = last if len(rows) == len(asks) else join_rows([last[b : b + 1] for b in rows])
            out = kern.linear(mine, weight)  # [b, n]
            for j, b in enumerate(rows):
                scores[b] = out[j]
        return [(last[b : b + 1], scores[b]) for b in range(len(asks))]


@dataclass(frozen=True)
class HeadPass:
    """One head pass a drafting sequence asks for: tokens [T] with their h_{p-1} rows [T, D] into `cache`,
    its last own row scored against `scores` (the head, or a draft vocabulary's rows of it). filler: how many of
    the rows at the end are not its own (token 0, a zero hidden row) but pad the pass to a fixed row count, so
    that a pass whose row count varies step to step gets one shape, for a CUDA graph (Placement.pad_rows); their
    KV rows are dropped after the pass. The filler changes none of the own rows (each attends to its own past
    only, and every kernel is batch-invariant). then: how many one-row passes of device ids the drafting will ask
    for after this one if it does not stop early (a greedy drafting's first pass: k - 1), so that a device pass
    can upload their maps with this one's (Placement.device_pass's ahead)."""
    tokens: list[int]
    rows: np.ndarray
    cache: KVCache
    scores: object
    filler: int = 0
    then: int = 0


@dataclass(frozen=True)
class HeadWindow:
    """Where an MTP head's cache stands in its sequence: its row 0 is the sequence's position `start` (0 until a
    restart from a window) and it has fed `fed` tokens from there; the sequence's tokens after those are queued.
    What MTPDrafter.release() returns and start() rebuilds the same cache and queue from, with the tree scores'
    counts (tree.Calibration) so far, which a resumed sequence drafts by as it would have."""
    start: int
    fed: int
    calibration: Calibration | None = None


# Before anything is counted, a head's first guess is taken to be kept at least this often: the adaptive policy's
# prior acceptance a draft (fast/adaptive.py a0). The shipped head gives its first guess p ~ 0.6 where the target
# keeps it ~0.9 of the time; scored by p, its first steps' trees traded deep chain nodes for siblings and lost
# (tools/tree_gain.py: 0.96-0.98x the chain at k = 2, 4; with this prior >= 1.00x everywhere).
FIRST_GUESS = 0.8


def top_tokens(logits: np.ndarray, w: int, vocab: DraftVocabulary | None = None) -> tuple[list[int], list[float]]:
    """The w most likely tokens of host logits [N] (or [n] over a draft vocabulary: mapped to its ids), best first
    (ties: the lower position, as argmax), with their softmax probabilities."""
    w, top_logit = min(w, logits.shape[0]), logits.max()
    top = np.flatnonzero(logits >= np.partition(logits, logits.shape[0] - w)[-w])  # the w largest and their ties,
    order = top[np.argsort(-logits[top], kind="stable")][:w]  # in position order: a sort of a few, not of N
    total = np.exp(logits - top_logit).sum(dtype=np.float64)  # the softmax's denominator (exp in float32: fast)
    ids = order if vocab is None else vocab.ids[order]
    return [int(t) for t in ids], [float(np.exp(np.float64(logits[t]) - top_logit) / total) for t in order]


def shift_hidden(hidden: np.ndarray, h_before: np.ndarray | None = None) -> np.ndarray:
    """Pair row p with h_{p-1}: [T, D] -> [T, D], first row = h_before (zeros at the start of a sequence)."""
    first = np.zeros_like(hidden[:1]) if h_before is None else h_before.reshape(1, -1)  # where hidden is
    return np.concatenate([first, hidden[:-1]], axis=0)


class MTPDrafter(Proposing):
    """Self-speculation with the MTP head: chain the nextn block k times from the pending token.

    Draft i feeds (d_{i-1}, h) where h is the target's hidden row for the first draft and the head's own
    h_mtp afterwards (qwen35 has one MTP layer, reused for every depth). Drafting appends rows to the
    head's KV cache; they are dropped afterwards and the kept tokens are re-fed with the TARGET's hidden
    rows, so the cache always ends exactly at the accepted prefix, as llama.cpp keeps it.

    The re-feed is lazy: commit() queues the kept tokens with their hidden rows and the next propose()
    feeds the whole queue in the same head pass as its first draft (the queue's rows, then the pending
    token's; only the last row is projected to the vocabulary). A run of plain steps (k = 0) then costs no
    head pass at all until drafting resumes, and cache and drafts are the same bit for bit as feeding first
    (the head's rows are batch-invariant like the trunk's). Reading `cache` feeds the queue. If more than
    `max_queue` tokens queue up (a long run of plain steps), the head restarts from a fresh cache holding
    only the last max_queue of them: drafting then attends to a window of the recent past (rope depends
    only on relative positions, so the window is consistent), which costs draft quality, never correctness
    (drafts are only proposals), and bounds what a suspended drafter pays to catch up.

    In a batch engine's KV pool (another(pool)) the head's cache takes the pool's blocks like the target's KV
    (new_cache; the engine counts them through kv_table). A preempted sequence's release()
    gives them back and returns its HeadWindow (where the cache starts in the sequence, how many tokens it fed);
    on resume, start(history, hidden, k_max, window) feeds the same window's tokens with the target's hidden rows
    (recomputed by the resumed prefill: the same bits) and queues the rest, as the cache and queue stood. A fresh
    cache of the whole history would differ after a restart (the solo head attends to its window only), and so
    would the next restart's moment (it comes when the queue passes max_queue): the drafts, and so a sampled
    sequence's draws, would no longer be its solo run's.

    Options (constructor arguments; a policy's StopRule adds to them per step):
    vocab: score only these token ids when drafting (sampling.DraftVocabulary, e.g. the wing's
    draft_vocab.DraftVocab); verification is unchanged.
    p_min: stop drafting after a draft whose probability under the head's law is below p_min (greedy: the
    softmax of its logits; sampled: q of the drawn token), as llama.cpp's --spec-draft-p-min: the uncertain draft
    is still proposed (its head pass is paid), the next ones are not. A confident head is usually right
    (LESSONS 5: the drafter's confidence), so the cost of drafting and verifying past an unsure draft is skipped
    where it would mostly be thrown away. 0 (the default) drafts all k.
    p_floor (greedy only): a draft whose probability is below p_floor (or the stop rule's floor) is not
    proposed at all, and drafting stops (Draft.withdrawn says so). A head that gives its own best token
    under 1% is guessing, and verifying such a draft costs a verify row and a rollback for nothing. Only
    greedy: choosing whether to propose a sampled draft from its own q would bias the law the rejection
    rule assumes. 0 (the default) proposes every draft made.
    """

    stops_by_confidence = True  # drafting reports each draft's probability and honours stop.keep_going

    def __init__(self, model: Model, vocab: DraftVocabulary | None = None, max_queue: int = 32,
                 p_min: float = 0.0, p_floor: float = 0.0, head: MTPHead | None = None, scores=None,
                 pool: BlockPool | None = None, tree: int = 1):
        if not 0.0 <= p_min <= 1.0 or not 0.0 <= p_floor <= 1.0:
            raise ValueError(f"p_min and p_floor must be in [0, 1], got {p_min}, {p_floor}")
        if tree < 1:
            raise ValueError(f"tree must be at least 1 (1: a chain), got {tree}")
        self.tree = tree  # guesses per depth: > 1 drafts a tree (growing), 1 the chain
        self.calibration = Calibration()  # a tree's scores, learned (and the last tree proposed)
        if max_queue < 1:
            raise ValueError(f"max_queue must be at least 1, got {max_queue}")
        self.p_min, self.p_floor = float(p_min), float(p_floor)
        self.head = head or MTPHead(model)  # head, scores: shared with the drafters another() makes
        self.pool = pool  # a batch engine's BlockPool the cache takes blocks from, or None
        self.fed_cache = self.head.new_cache(pool)  # the head's KV of the tokens fed so far (`cache` feeds the queue)
        self.window_start = 0  # the sequence position of the cache's row 0 (> 0 after a restart from a window)
        self.queue: list[tuple[list[int], np.ndarray]] = []  # kept tokens not yet fed, with their h_{p-1} rows
        self.max_queue = max_queue
        self.h_last: np.ndarray | None = None  # target hidden row that predicted the pending token
        self.vocab = vocab  # draft over these ids only; None: the whole vocabulary
        if scores is None:
            scores = self.head.head if vocab is None else vocab.rows(self.head.head)
        self.scores = scores  # [N, D] or [n, D]
        self.filler_rows: dict = {}  # n -> [n, D] zeros where the head computes (_zeros)

    def another(self, pool: BlockPool | None = None) -> "MTPDrafter":
        """A drafter for another sequence of the same batch: its own cache (in `pool`, if given) and queue, this
        one's head, options and scores weight (so a batch's head passes score every sequence with one product)."""
        return MTPDrafter(self.head.model, self.vocab, self.max_queue, self.p_min, self.p_floor, self.head, self.scores,
                          pool, self.tree)

    @property
    def cache(self) -> KVCache | PagedKVCache:  # the head's KV cache, every kept token fed
        self._feed_queue()
        return self.fed_cache

    @property
    def window(self) -> HeadWindow:
        """Where the cache stands in the sequence, read without feeding anything."""
        return HeadWindow(self.window_start, self.fed_cache.n)

    def _queued(self) -> int:
        return sum(len(fed) for fed, _ in self.queue)

    def _feed_queue(self) -> None:
        if self.queue:
            tokens = [t for fed, _ in self.queue for t in fed]
            rows = np.concatenate([h for _, h in self.queue])  # [n, D]
            self.queue = []
            self.head.forward(tokens, rows, self.fed_cache, logits=False)

    def start(self, prompt: list[int], hidden: np.ndarray, k_max: int = 0, resume: HeadWindow | None = None) -> None:
        """The target prefilled `prompt` (hidden [n, D], its rows): feed the head every token, or, resuming a
        preempted sequence (resume: what release() returned), the window's fed tokens, and queue the rest."""
        window = resume or HeadWindow(0, len(prompt))
        begin, end = window.start, window.start + window.fed
        if not 0 <= begin <= end <= len(prompt):
            raise ValueError(f"{window} does not lie in a history of {len(prompt)} tokens")
        self.fed_cache.truncate(0)  # (in a pool it holds no block here: release() came first)
        self.window_start, self.queue = begin, []
        self.calibration = window.calibration or Calibration()  # the sequence's own counts (tree.Calibration)
        rows = shift_hidden(hidden)  # [n, D]: row p is h_{p-1}, a zero row at p = 0
        if end > begin:
            self.head.forward(prompt[begin:end], rows[begin:end], self.fed_cache, logits=False)
        if end < len(prompt):
            self.queue = [(list(prompt[end:]), rows[end:])]
        self.h_last = hidden[-1]

    def release(self) -> HeadWindow:
        """Give every pool block back (the sequence is preempted or done) and forget the tokens; returns the
        HeadWindow that start() rebuilds this cache and queue (and the tree scores' counts) from."""
        window = replace(self.window, calibration=self.calibration)
        self.fed_cache.truncate(0)
        self.queue = []
        return window

    def _zeros(self, n: int):
        """n zero rows [n, D] where the head computes (a padded pass's filler hidden rows: read, never written),
        made once per n."""
        if n not in self.filler_rows:
            self.filler_rows[n] = self.head.model.xp.zeros((n, self.head.cfg.n_embd), np.float32)
        return self.filler_rows[n]

    @property
    def kv_table(self):
        """The head cache's table in the engine's pool (None without one): the engine budgets its blocks."""
        return None if self.pool is None else self.fed_cache.table

    def draft_pass(self, asks: list[HeadPass]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Several sequences' head passes as one (MTPHead.draft_pass)."""
        return self.head.draft_pass(asks)

    def _first_pass(self, pending: int, k: int, then: int = 0) -> tuple[HeadPass, int]:
        """A drafting's first head pass, and how many rows the cache keeps after the drafting (cache.n then).

        It feeds the queued kept tokens and the pending token together (one pass of the block, not two: rows are
        batch-invariant, so the cache and the draft are the same bits either way). Its rows n (the kept tokens of
        the last verify, plus the pending one: 1 after a start, else 2 .. k_last + 2) are padded to k + 2 where the
        backend graphs its passes (Placement.pad_rows): one shape a step for this k. Its filler's KV stays within
        the rule the engine budgets by (drafting.Drafter: <= the sequence's positions pos + k + 2; the cache holds
        pos + 1 - n before the pass, pos + k + 3 - n after it) and is dropped after the pass."""
        fed = [t for f, _ in self.queue for t in f]
        rows = [h for _, h in self.queue]
        self.queue = []
        n_kept = self.fed_cache.n + len(fed)
        n = len(fed) + 1
        filler = k + 2 - n if self.head.model.placement.pad_rows and n <= k + 2 else 0
        tokens = fed + [pending] + [0] * filler
        hs = np.concatenate([self.head.model.to_device(h) for h in rows + [self.h_last[None, :]]]
                            + ([self._zeros(filler)] if filler else []))
        return HeadPass(tokens, hs, self.fed_cache, self.scores, filler, then), n_kept

    def drafting(self, pending: int, k: int, params: SamplingParams, rng: np.random.Generator,
                 stop: StopRule | None = None, on_device: bool = False) -> Drafting:
        """The k drafts as a coroutine (drafting.Drafter): yields each head pass it needs (a HeadPass), is sent
        back (h_mtp of the pass's last row, its scores), returns the Draft.

        A greedy draft over the whole vocabulary is an argmax where the head computes, and the next pass embeds
        it there (model.embed_rows: device ids, in range by construction): the k drafts come to the host
        together at the end, or with on_device stay there as Draft.ids for the verify pass (drafting.py). A
        draft is read on the host by itself only when its probability is asked for (p_min, a floor, the stop
        rule's keep_going: one float per draft), with a draft vocabulary (its draw maps ids on the host), or
        when sampled (the law q is read on the host)."""
        if not k:  # nothing to draft: the queued kept tokens stay queued for the next drafting step
            return Draft()
        stop = stop or StopRule()
        floor = max(self.p_floor, stop.floor)
        wants_p = bool(self.p_min or floor or stop.keep_going)  # a probability per draft: work only when asked
        argmax_ids = params.greedy and self.vocab is None  # drafts stay where the head computes until the end
        if self.tree > 1:  # a tree of guesses: host ints, whatever on_device asks
            builder, withdrawn = yield from self.growing(pending, k, params, rng, stop, self.tree, self.calibration)
            return self.calibration.propose(builder.grow(k), withdrawn)
        cache = self.fed_cache
        drafts, q_rows, probs, withdrawn = [], [], [], False
        then = k - 1 if argmax_ids else 0  # the next passes feed device ids: their maps can ride this one's upload
        ask, n_kept = self._first_pass(pending, k, then)
        for _ in range(k):
            h, logits = yield ask  # h [1, D], logits [N] or [n], where the head computes
            if argmax_ids:  # [1] id where the head computes: no transfer
                token, q_draft = np.argmax(logits).reshape(1), None
            else:  # a sampled draft reads the law on the host
                logits = logits if params.greedy else self.head.model.to_host(logits)
                token, q_draft = draft_token(logits, params, rng) if self.vocab is None else \
                    self.vocab.draw(logits, params, rng)
            p = draft_probability(logits, token, q_draft) if wants_p else None
            if p is not None and p < floor and params.greedy:  # the head is guessing: not worth a verify row
                withdrawn = True
                break
            drafts.append(token)
            q_rows.append(q_draft)
            if p is not None:
                probs.append(p)
                if p < self.p_min or (stop.keep_going is not None and not stop.keep_going(probs)):
                    break
            ask = HeadPass(token if argmax_ids else [token], h, cache, self.scores)
        cache.truncate(n_kept)
        if argmax_ids and on_device and drafts:  # asked to leave them: the verify step fetches them with its run
            return device_draft(drafts, q_rows, probs, withdrawn)
        return Draft(fetch_drafts(drafts, self.head.model) if argmax_ids else drafts, q_rows, probs, withdrawn)

    def growing(self, pending: int, k: int, params: SamplingParams, rng: np.random.Generator,
                stop: StopRule | None = None, width: int = 2,
                calibration: Calibration | None = None,
                builder: TreeBuilder | None = None) -> Generator[HeadPass, tuple, tuple[TreeBuilder, bool]]:
        """A tree's candidates as a coroutine of head passes (as drafting's), returning (builder, withdrawn):
        the chain's node at each depth and `width` - 1 siblings beside it; the caller keeps the k best
        (builder.grow(k); mixed.py adds lookup branches first).

        The chain is drafting's (each pass feeds the chain's draft; drafts are host ints here). At depth i:
            greedy   the head's top-`width` tokens (over the draft vocabulary's ids with one), one-hot; with
                     p_r the softmax probability of the r-th and P the chain's path score before depth i, the
                     chain node (r = 1) scores P * c(p_1) and sibling r scores P * c(p_r), c the chance that the
                     target keeps such a guess (calibration's count per first-or-not and decile of p, tree.py,
                     its prior p, FIRST_GUESS at least for the first guess; without one, c = that prior)
            sampled  the chain node is drafting's draw from q, the siblings `width` - 1 more independent draws
                     from the same q (this rng, after the chain's draw, in order), q_rows q. A drawn node's
                     score must not depend on its own token (tree.TreeBuilder), so it uses m = max q instead
                     of q(token): the chain node scores P * c(m, 1), the r-th draw P * c(m, r), c counted per
                     (decile of m, r) by the calibration from what was kept before (never from this step's
                     draws), with the prior m * (1 - m) ** (r - 1) (tried only if the r - 1 before it are
                     rejected, each kept with about m)
        probs: per node the head's probability of its token (greedy p_r, sampled q(token)). The stop rule and
        p_min, p_floor act on the chain node as in drafting. The chain stops early once k nodes score at least
        as much as its last node: nothing deeper (every node below it scores no more) could be kept. builder: one
        holding other drafters' guesses already (mixed.py), which count in that test: a head pass whose guesses
        could not be kept is not made."""
        builder = TreeBuilder() if builder is None else builder
        if not k:
            return builder, False
        stop = stop or StopRule()
        floor = max(self.p_floor, stop.floor)
        ask, n_kept = self._first_pass(pending, k)
        parent, path_score, chain_probs, withdrawn = 0, 1.0, [], False
        for _ in range(k):
            h, logits = yield ask
            logits = self.head.model.to_host(logits)  # [N] or [n]
            if params.greedy:
                tokens, p_top = top_tokens(logits, width, self.vocab)
                p = p_top[0]
                if p < floor:  # the head is guessing: not worth a verify row (nor are its siblings)
                    withdrawn = True
                    break
                keys = [("mtp", r == 0, p_bin(pr)) for r, pr in enumerate(p_top)]  # the first guess, or another
                priors = [max(pr, FIRST_GUESS) if r == 0 else pr for r, pr in enumerate(p_top)]
                guesses = [Guess(t, None, path_score * (prior if calibration is None else calibration.rate(key, prior)),
                                 pr, key) for t, pr, prior, key in zip(tokens, p_top, priors, keys)]
            else:
                token, q = draft_token(logits, params, rng) if self.vocab is None else \
                    self.vocab.draw(logits, params, rng)
                draws = [token] + [sample(q, rng) for _ in range(width - 1)]
                m = float(q.max())
                p = float(q[token])
                keys = [("mtp-drawn", p_bin(m), min(r, 2)) for r in range(len(draws))]  # never the token drawn
                priors = [m * (1 - m) ** r for r in range(len(draws))]
                guesses = [Guess(t, q, path_score * (prior if calibration is None else calibration.rate(key, prior)),
                                 float(q[t]), key) for t, key, prior in zip(draws, keys, priors)]
            node = builder.add(parent, guesses[0], "mtp")
            for guess in guesses[1:]:
                builder.add(parent, guess, "mtp")
            chain_probs.append(p)
            if p < self.p_min or (stop.keep_going is not None and not stop.keep_going(chain_probs)):
                break
            last = guesses[0].score
            if sum(g.score >= last for g in builder.guesses[1:]) >= k:  # nothing deeper could be kept
                break
            parent, path_score = node, last
            ask = HeadPass([guesses[0].token], h, self.fed_cache, self.scores)
        self.fed_cache.truncate(n_kept)
        return builder, withdrawn

    def commit(self, fed: list[int], hidden: np.ndarray) -> None:
        self.calibration.learn(fed)  # what the target kept of the last tree: how good each kind of guess is
        self.queue.append((list(fed), shift_hidden(hidden, self.h_last)))
        self.h_last = hidden[-1]
        queued = self._queued()
        if queued > self.max_queue:  # restart from a window of the recent past (its blocks go back to the pool)
            tokens = [t for f, _ in self.queue for t in f][-self.max_queue:]
            rows = np.concatenate([h for _, h in self.queue])[-self.max_queue:]
            self.window_start += self.fed_cache.n + queued - self.max_queue
            self.fed_cache.truncate(0)
            self.queue = [(tokens, rows)]
