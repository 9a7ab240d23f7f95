"""From logits to a token: temperature, top-k, top-p, and a draw from a Generator you pass in.

    probs = softmax(logits / temperature) restricted to the top-k tokens and then to the smallest
            set of most likely tokens whose mass reaches top_p, renormalised
          = exp(z) / sum exp(z),  z = (logits - max logits) / temperature  (the same law for every
            temperature > 0, however small: z <= 0, the argmax's exactly 0, nothing overflows; as the
            temperature shrinks the law tends to one-hot on the argmax, uniform over tied maxima)
    temperature = 0 means greedy: probs is one-hot on argmax (ties -> lowest id), so ratio tests in
            speculative sampling stay exact (jaymody/speculative-sampling issue #3)

The same function makes the target's p and a drafter's q, so both see identical truncation rules.
RNG is always an argument (numpy.random.Generator), never global state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off

    def __post_init__(self):
        if not (self.temperature >= 0 and np.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def probs_from_logits(logits: np.ndarray, params: SamplingParams) -> np.ndarray:  # [N] -> [N] f64, sums to 1
    logits = np.asarray(logits, dtype=np.float64)
    if params.greedy:
        probs = np.zeros_like(logits)
        probs[int(np.argmax(logits))] = 1.0
        return probs
    if params.top_k and params.top_k < logits.size:  # on the logits: the temperature does not change the order
        kth = np.partition(logits, -params.top_k)[-params.top_k]
        logits = np.where(logits >= kth, logits, -np.inf)
    # the max subtracted BEFORE dividing: every z <= 0 and the argmax's is exactly 0, so no T > 0 overflows
    # (logits / 1e-308 is +-inf, and inf - inf a NaN law); a tiny T sends the others to -inf, exp to 0
    with np.errstate(over="ignore"):  # -inf is the intended value for the others at a tiny T
        z = (logits - logits.max()) / params.temperature
    e = np.exp(z)  # float64 throughout: probabilities feed ratio tests
    probs = e / e.sum()
    if params.top_p < 1:
        order = np.argsort(-probs, kind="stable")
        mass_before = np.cumsum(probs[order]) - probs[order]
        keep = order[mass_before < params.top_p]  # always keeps the most likely token
        kept = np.zeros_like(probs)
        kept[keep] = probs[keep]
        probs = kept / kept.sum()
    return probs


def pick(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """sample(probs_from_logits(logits, params), rng): at temperature 0 just the argmax, the same token
    without building a float64 law over the whole vocabulary (work per row that grows with the vocabulary;
    LESSONS 12 measures it at 248k entries) or drawing a uniform."""
    if params.greedy:
        return int(np.argmax(logits))
    return sample(probs_from_logits(logits, params), rng)


def draft_token(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> tuple[int, np.ndarray | None]:
    """A drafter's proposal from its logits: (token, its law q), or at temperature 0 (argmax, None), a
    deterministic draft whose q is one-hot on it (as verify_step reads None), without the law's cost."""
    if params.greedy:
        return int(np.argmax(logits)), None
    q = probs_from_logits(logits, params)
    return sample(q, rng), q


class DraftVocabulary(Protocol):
    """A subset of the vocabulary a drafter scores instead of all of it (tinyspec.fast.draft_vocab.DraftVocab):
    verification is unchanged, so output is too; drafts only get cheaper, and sometimes worse."""

    ids: np.ndarray  # [n] the token id of each subset position (a draft tree's top-W over the subset, mtp.py)

    def rows(self, weight):  # an [N, D] output weight -> the [n, D] rows to score (same kind of weight)
        ...

    def draw(self, logits_sub: np.ndarray, params: SamplingParams,
             rng: np.random.Generator) -> tuple[int, np.ndarray | None]:  # [n] -> (token id, its law over [N] | None)
        ...


def draft_probability(logits: np.ndarray, token: int, q: np.ndarray | None) -> float:
    """How sure a drafter is of its draft `token`: q[token] for a sampled draft (q: its law over the
    vocabulary), else (q None: greedy, the draft is the argmax) the softmax probability of the largest logit."""
    if q is not None:
        return float(q[token])
    z = logits - logits.max()  # <= 0: no overflow; exps in the logits' own precision (no float64 copy)
    return float(1.0 / np.exp(z, out=z).sum())


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from a probability vector (inverse CDF of a single uniform)."""
    cdf = np.cumsum(probs)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), probs.size - 1))
