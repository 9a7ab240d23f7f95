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

Where the ranking comes from (`ranking_for`), first match wins:
  1. a file you pass (--ranking FILE.npy: ids by descending frequency; `rank_tokens` + `save_ranking`
     make one from any text you choose, e.g. the language and domain you will generate in);
  2. the GGUF's own record: the shipped model stores its training corpus's token counts at export
     (key `training.token_ranking`, written by tools/train_tiny.py);
  3. with the model's tokenizer at hand (the CLI's `generate`): `text_ranking` counts the tokens of the
     Python standard library's sources (STDLIB_BYTES of them, in path order: text every machine that
     runs tinyspec has, no download), once per vocabulary, cached as a .npy under `cache_dir()`
     ($TINYSPEC_CACHE, else $XDG_CACHE_HOME/tinyspec, else ~/.cache/tinyspec). It favours code and
     English; for other text pass your own ranking. Cost: one tokenizer pass over 2 MB, paid once per
     vocabulary (LESSONS 3 times it);
  4. else id order: correct, only slower to accept (byte-level BPE ids are roughly frequency-ordered).
`generate --spec mtp|draft` drafts over AUTO_SIZE tokens by default when the vocabulary is larger than
AUTO_ABOVE (Qwen3.5's 248k: a draft step reads 27 MB of the head instead of 200 MB); --draft-vocab 0
turns it off. Output is the same either way; only the cost and acceptance of drafts change.

Cost: W_draft is a copy of N rows (N x row bytes: 32k rows of 0.8B's Q6_K head are 27 MB), made once.

Reference: Zhao et al. 2025, "FR-Spec: Accelerating Large-Vocabulary Language Models via
Frequency-Ranked Speculative Sampling".
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

RANKING_KEY = "training.token_ranking"
AUTO_ABOVE = 65536  # generate drafts over AUTO_SIZE tokens by default above this vocabulary size
AUTO_SIZE = 32768
STDLIB_BYTES = 2_000_000  # text ranked by text_ranking: the first 2 MB of the standard library's .py files


def subset_rows(weight, ids: np.ndarray):
    """Rows `ids` of an [V, D] weight as a weight of the same kind: a float32 array, or a PackedWeight
    (its GGUF bytes, row by row: each row of a quantized matrix is a whole number of blocks)."""
    ids = np.asarray(ids, dtype=np.int64)
    if isinstance(weight, np.ndarray):
        return np.ascontiguousarray(weight[ids])
    from ..ops import asarray_like

    rows, cols = weight.shape
    table = weight.raw.reshape(rows, weight.raw.size // rows)  # NumPy or CuPy bytes: the ids go where they are
    raw = table[asarray_like(ids, table)].reshape(-1)
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

    # the drafters' view of it (sampling.DraftVocabulary): which output rows to score, and a draft from their logits
    def rows(self, weight):  # [V, D] -> [n, D]
        return subset_rows(weight, self.ids)

    def draw(self, logits_sub: np.ndarray, params, rng) -> tuple[int, np.ndarray | None]:
        return draw(self, logits_sub, params, rng)


def draw(vocab: DraftVocab, logits_sub: np.ndarray, params, rng) -> tuple[int, np.ndarray | None]:
    """One draft from subset logits [n]: (token id, its proposal law over the whole vocabulary [V]), or at
    temperature 0 (the subset's argmax, None): a deterministic draft, q one-hot on it as verify_step reads None."""
    from ..sampling import draft_token

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


def cache_dir() -> Path:
    """Where tinyspec caches what it derives from a model (token rankings): $TINYSPEC_CACHE, else
    $XDG_CACHE_HOME/tinyspec, else ~/.cache/tinyspec."""
    if os.environ.get("TINYSPEC_CACHE"):
        return Path(os.environ["TINYSPEC_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tinyspec"


def stdlib_texts(max_bytes: int = STDLIB_BYTES) -> list[str]:
    """The Python standard library's own .py sources in path order, up to max_bytes of text."""
    texts, total = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if total >= max_bytes:
            break
        try:
            text = path.read_text(encoding="utf-8", errors="replace")[: max_bytes - total]
        except OSError:
            continue
        texts.append(text)
        total += len(text)
    return texts


def vocab_digest(metadata) -> str:
    """sha1 of what decides token ids: the GGUF's tokenizer model, pre-tokenizer, tokens and merges."""
    h = hashlib.sha1()
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
        value = metadata.get(key, "")
        items = value if isinstance(value, (list, tuple)) else [value]
        h.update(key.encode() + b"\0" + "\x1f".join(str(v) for v in items).encode("utf-8", "surrogatepass") + b"\0")
    return h.hexdigest()


def text_ranking(tokenizer, metadata, progress: Callable[[str], None] | None = None) -> np.ndarray:
    """rank_tokens over stdlib_texts(), computed once per vocabulary and cached under cache_dir()
    (an unwritable cache only costs the recount)."""
    path = cache_dir() / "rankings" / f"{vocab_digest(metadata)}-stdlib{STDLIB_BYTES}.npy"
    try:
        ranking = np.load(path)
        if ranking.ndim == 1 and ranking.size == tokenizer.n_vocab:
            return ranking.astype(np.int64)
    except (OSError, ValueError):
        pass
    if progress:
        progress(f"ranking the {tokenizer.n_vocab} token ids by their count in {STDLIB_BYTES / 1e6:.0f} MB of the "
                 f"Python standard library (once per vocabulary; cached in {path.parent})")
    ranking = rank_tokens(tokenizer, stdlib_texts())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp.npy")
        save_ranking(tmp, ranking)
        os.replace(tmp, path)
    except OSError as e:
        if progress:
            progress(f"could not cache the ranking in {path.parent} ({e.strerror}): it is counted again next time")
    return ranking


def ranking_for(model, path: str | os.PathLike | None = None, tokenizer=None,
                progress: Callable[[str], None] | None = None) -> np.ndarray:
    """The model's token ranking: from `path` (a .npy of ids) if given, else the GGUF's training record,
    else (with its tokenizer) the cached standard-library count, else id order."""
    n_vocab = model.cfg.n_vocab
    if path is not None:
        ranking = np.load(Path(path))
    elif RANKING_KEY in model.metadata:
        ranking = np.asarray(model.metadata[RANKING_KEY])
    elif tokenizer is not None and tokenizer.n_vocab == n_vocab:
        ranking = text_ranking(tokenizer, model.metadata, progress)
    else:
        return np.arange(n_vocab)
    ranking = np.asarray(ranking, dtype=np.int64).reshape(-1)
    if ranking.size == 0 or ranking.min() < 0 or ranking.max() >= n_vocab:
        raise ValueError(f"token ranking{f' {path}' if path else ''} does not hold ids of a {n_vocab}-token vocabulary")
    return ranking
