"""A frequency-ranked draft vocabulary (the FR-Spec idea): drafters score only the N most frequent tokens.

A draft step costs the draft network plus an output projection over the whole vocabulary. For
Qwen3.5 the projection is 248,320 rows x 1024 (0.8B): about 200 MB of Q6_K, more than the MTP block
itself, paid for every draft token. Scoring only the N most frequent tokens reads N rows instead:

    W_draft = W_out[ids]                  ids [N]: token ids by descending corpus frequency, picked once
    q_sub   = law(W_draft @ h)            [N]     (temperature / top-k / top-p applied on the subset)
    draft   = ids[j],  j ~ q_sub          (greedy: j = argmax)
    q       = scatter(q_sub -> ids)       [V]     zero outside the subset, what verification sees

Output stays exactly the target's, because the draft is only a proposal:
  - greedy: the verify pass accepts a draft iff it equals the target's argmax; a token outside the
    subset is simply never proposed, so the step ends there with the target's own token.
  - sampling: the rejection rule (spec_sampling.py) is exact for ANY proposal law q: accept d with
    min(1, p(d) / q(d)), else draw from norm(max(0, p - q)). Tokens outside the subset have q = 0, so
    the residual gives them exactly their p mass. Acceptance drops by the target mass outside the
    subset (small for N in the thousands: token frequencies are Zipf-like).

Where the ranking comes from (`ranking_for`): the shipped model records the token counts of its
training corpus at export (GGUF key `training.token_ranking`, ids by descending count, written by
tools/train_tiny.py); for any other model, `rank_tokens(tokenizer, texts)` counts tokens in text you
choose (tinyspec's CLI uses the Python standard library sources, which every machine has) and the
result can be saved beside the model (`save_ranking`). With no ranking at all, ids are taken in id
order: correct, only slower to accept (byte-level BPE ids are roughly frequency-ordered anyway).

Cost: W_draft is a copy of N rows (N x row bytes: 32k rows of 0.8B's Q6_K head are 27 MB), made once.

Reference: Zhao et al. 2025, "FR-Spec: Accelerating Large-Vocabulary Language Models via
Frequency-Ranked Speculative Sampling".
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

import numpy as np

RANKING_KEY = "training.token_ranking"


def subset_rows(weight, ids: np.ndarray):
    """Rows `ids` of an [V, D] weight as a weight of the same kind: a float32 array, or a PackedWeight
    (its GGUF bytes, row by row: each row of a quantized matrix is a whole number of blocks)."""
    ids = np.asarray(ids, dtype=np.int64)
    if isinstance(weight, np.ndarray):
        return np.ascontiguousarray(weight[ids])
    rows, cols = weight.shape
    raw = weight.raw.reshape(rows, weight.raw.size // rows)[ids].reshape(-1)  # NumPy or CuPy bytes
    return type(weight)(raw, weight.ggml_type, (ids.size, cols), weight.kernels)


class DraftVocab:
    """The first n ids of a ranking, and the maps between subset positions and token ids."""

    def __init__(self, ranking: np.ndarray, n: int, n_vocab: int):
        ranking = np.asarray(ranking, dtype=np.int64)
        if not 1 <= n <= n_vocab:
            raise ValueError(f"draft vocabulary size must be in 1..{n_vocab}, got {n}")
        if ranking.ndim != 1 or ranking.size < n or ranking.min() < 0 or ranking.max() >= n_vocab:
            raise ValueError(f"the token ranking must list at least {n} ids in 0..{n_vocab - 1}")
        self.ids = ranking[:n].copy()  # [n]
        if np.unique(self.ids).size != n:
            raise ValueError("the token ranking repeats ids")
        self.n_vocab = n_vocab

    def __len__(self) -> int:
        return self.ids.size

    def full_law(self, q_sub: np.ndarray) -> np.ndarray:  # [n] -> [V], zero outside the subset
        q = np.zeros(self.n_vocab, dtype=np.float64)
        q[self.ids] = q_sub
        return q


def draw(vocab: DraftVocab, logits_sub: np.ndarray, params, rng) -> tuple[int, np.ndarray | None]:
    """One draft from subset logits [n]: (token id, its proposal law over the whole vocabulary [V]), or at
    temperature 0 (the subset's argmax, None): a deterministic draft, q one-hot on it as verify_step reads None."""
    from .sampling import draft_token

    token, q_sub = draft_token(logits_sub, params, rng)
    return int(vocab.ids[token]), None if q_sub is None else vocab.full_law(q_sub)


def rank_ids(ids: np.ndarray, n_vocab: int) -> np.ndarray:
    """Token ids by descending count in the id stream `ids` (ties by id), every id of the vocabulary once."""
    return np.lexsort((np.arange(n_vocab), -np.bincount(np.asarray(ids, dtype=np.int64), minlength=n_vocab)))


def rank_tokens(tokenizer, texts: Iterable[str]) -> np.ndarray:
    """Token ids by descending count in `texts` (ties by id), then every id never seen, in id order."""
    return rank_ids([t for text in texts for t in tokenizer.encode(text)], tokenizer.n_vocab)


def save_ranking(path: str | os.PathLike, ranking: np.ndarray) -> None:
    np.save(Path(path), np.asarray(ranking, dtype=np.int32))


def ranking_for(model, path: str | os.PathLike | None = None) -> np.ndarray:
    """The model's token ranking: from `path` (a .npy of ids) if given, else the GGUF's training record,
    else id order."""
    n_vocab = model.cfg.n_vocab
    if path is not None:
        ranking = np.load(Path(path))
    elif RANKING_KEY in model.metadata:
        ranking = np.asarray(model.metadata[RANKING_KEY])
    else:
        return np.arange(n_vocab)
    ranking = np.asarray(ranking, dtype=np.int64).reshape(-1)
    if ranking.size == 0 or ranking.min() < 0 or ranking.max() >= n_vocab:
        raise ValueError(f"token ranking{f' {path}' if path else ''} does not hold ids of a {n_vocab}-token vocabulary")
    return ranking
