"""A synthetic-acceptance drafter: draft the target's own greedy continuation, right with probability a.

Speed work on a random-weight model at a real shape (tinyspec.fast.synth) cannot use a real drafter: the
model's drafts mean nothing, so its acceptance says nothing about the engine. This drafter replaces
the draft model by a dial. It is given the target's true greedy continuation r_0 r_1 r_2 ... (a plain
greedy run of the same prompt) and, at each draft position, proposes the true next token at rate a
(every joint frequency as for independent draws, see below), otherwise a token that is certainly wrong:

    pending = r_i (the engine's next token; i is tracked from commit, see below)
    draft j = r_{i+j}        if u_j(s) < a             j = 1..k, s = the step (the s-th propose)
            = r_{i+j} -+ 1   otherwise (never equal to r_{i+j})

The draws u_j(s) are a seeded low-discrepancy (Kronecker) sequence rather than independent uniforms:

    u_j(s) = frac(c_j + s alpha_j)      alpha_j = frac(sqrt(j-th prime)), shifts c_j seeded uniforms

Over the steps, (u_1, .., u_k) fills the unit cube evenly (Weyl: 1, alpha_1, .., alpha_k are independent
over the rationals), so every joint frequency P(u_1 < a, .., u_j < a) tends to a^j as with independent
draws, but with discrepancy ~(log N)^k / N instead of 1 / sqrt(N): the realised rate stays near a from
the first dozens of steps, while independent draws wander far enough over a bench run's few dozen steps
to move the tokens per step, and with them a measured speedup, noticeably (LESSONS 13 measures both
spreads over 200 seeds). A speedup measured "at acceptance 0.8" is then measured at 0.8, not at
whatever one seed drew.
Greedy verification keeps drafts while they equal the target's argmax, i.e. up to the first wrong
one, so the number of accepted drafts m is a truncated geometric variable, P(m >= j) = a^j, and a
verify step emits m + 1 tokens. The expected tokens per step ("mean accepted length", SpecStats'
mean_accepted_length) for k drafts is

    E[m + 1] = sum_{j=0..k} a^j = (1 - a^(k+1)) / (1 - a)          (k + 1 when a = 1)

and the acceptance rate E[m] / k = a (1 - a^k) / (k (1 - a)). Draws after the first wrong draft do
not change m (greedy stops there), but they are still made, so the RNG stream does not depend on
where rejections fell. Greedy speculative output equals plain greedy output for any a, like every
drafter (the engine is lossless); tests/test_synthetic.py checks both claims on a tiny target.

Position tracking: the drafter never guesses where it is. commit(fed) says which tokens the target
kept (pending + the accepted drafts), so the index of the next pending token is i + len(fed). The
kept tokens are checked against the reference: if the output leaves it (a sampled run, or a
reference made by another engine whose greedy path differs), the drafter records diverged_at = the
first differing index and stops drafting (empty drafts), since it no longer knows the continuation.
Past the end of the reference it drafts nothing either.

    reference = generate(model, prompt, max_new).tokens                   # plain greedy
    drafter = SyntheticDrafter(reference, acceptance=0.7, seed=0)
    spec = speculative_generate(model, drafter, prompt, max_new, draft_n=4)
    spec.tokens == reference; spec.stats.as_dict()["mean_accepted_length"] ~ (1 - 0.7**5) / 0.3

Official implementation: llama.cpp's benchmarking options --spec-synth-len L / --spec-synth-rates
(common/speculative.cpp common_speculative_synth_rates_resolve, tools/server/server-context.cpp
server_sample_and_accept_synth). Departs from it: llama.cpp flips the coin in the VERIFIER and keeps a
draft whatever the target says ("generated output is not valid"); here the coin makes the DRAFT right
or wrong, so verification is real and the output stays the greedy output. The rate means the same:
llama.cpp's --spec-synth-len L with n_max = k solves sum_{j=1..k} p^j = L - 1 for p, which is
acceptance_for_mean_length(L, k) here.
Drafting costs: alone, this drafter drafts for free, so a measured speedup is the engine's verify-side
ceiling. With inner=<a real drafter> (e.g. MTPDrafter) every propose first runs the real drafter for
the same k and discards its tokens, and start/commit reach it too, so the run pays exactly the real
drafting cost (bench --synth-len, as llama.cpp's --spec-synth-len does with real drafting).
Many sequences (batch.py): given the reference per prompt (a mapping or a function), each slot's drafter
(another()) looks up the reference of the prompt its slot runs, and the inner drafters' passes are made
together, one pass per draft depth for every slot, their tokens discarded (bench --slots).
Does NOT include: per-position rates other than p, p^2, .. (llama.cpp's --spec-synth-rates),
content-dependent rates, sampled targets (a sampled run leaves the greedy reference at once), serial
independence: step s + 1's draws are step s's turned by alpha (a drafter-side predictor could learn
that; the adaptive draft length's estimates only average, adaptive.py).
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from ..sampling import SamplingParams
from ..drafting import Draft, Drafting, Proposing, StopRule


def kronecker_steps(n: int) -> np.ndarray:
    """alpha_j = frac(sqrt(p_j)) for the first n primes p_j: the per-position steps of the draws."""
    primes, c = [], 2
    while len(primes) < n:
        if all(c % p for p in primes if p * p <= c):
            primes.append(c)
        c += 1
    return np.sqrt(np.array(primes, dtype=np.float64)) % 1.0


def expected_mean_accepted_length(acceptance: float, k: int) -> float:
    """Expected tokens per verify step with k drafts at per-position rate a: (1 - a^(k+1)) / (1 - a)."""
    a = float(acceptance)
    return float(k + 1) if a == 1.0 else (1 - a ** (k + 1)) / (1 - a)


def acceptance_for_mean_length(length: float, k: int) -> float:
    """The rate a whose expected tokens per step with k drafts is `length` (1 <= length <= k + 1), by
    bisection as llama.cpp resolves --spec-synth-len (the mean length is increasing in a)."""
    if k < 1 or not 1.0 <= length <= k + 1:
        raise ValueError(f"need k >= 1 and 1 <= length <= k + 1, got length={length}, k={k}")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if expected_mean_accepted_length(mid, k) < length else (lo, mid)
    return 0.5 * (lo + hi)


class SyntheticDrafter(Proposing):
    """The drafter protocol (drafting.Drafter) over a known greedy continuation, right with probability `acceptance`.

    references: the target's greedy output after the prompt (r_0 is the first generated token); or, for a
    drafter that runs many sequences one after another (a batch slot), the output per prompt: a mapping
    tuple(prompt) -> tokens, or a function prompt -> tokens, looked up when a sequence starts.
    inner: a real drafter whose drafting is run and paid for, and whose tokens are dropped (or None).
    history: one (drafted, kept) pair per verify step: drafts proposed, drafts the target kept.
    another(): the drafter of the next slot, with seed + 1 (so the slots do not accept in lockstep) and
    inner.another() (so a batch pays one real pass per draft depth for all slots).
    """

    stops_by_confidence = False  # the synthetic drafts ignore a stop rule (an inner drafter sees it)

    def __init__(self, references: Sequence[int] | Mapping[tuple, Sequence[int]] | Callable[[list[int]], Sequence[int]],
                 acceptance: float, seed: int = 0, inner=None):
        if not 0.0 <= float(acceptance) <= 1.0:
            raise ValueError(f"acceptance must be in [0, 1], got {acceptance}")
        self.references = references
        self.reference = [] if isinstance(references, Mapping) or callable(references) else self._checked(references)
        self.acceptance, self.seed = float(acceptance), seed
        self.inner = inner  # a real drafter whose cost is paid (its tokens are not used), or None
        self.i, self.diverged_at, self.history, self._n_drafted, self.step = 0, None, [], 0, 0
        self._shifts = self._alphas = np.zeros(0)

    @staticmethod
    def _checked(tokens: Sequence[int]) -> list[int]:
        tokens = [int(t) for t in tokens]
        if any(t < 0 for t in tokens):
            raise ValueError("reference tokens must be non-negative token ids")
        return tokens

    def another(self, pool=None) -> "SyntheticDrafter":
        inner = self.inner.another(pool) if self.inner is not None else None  # its KV, if any, in the pool
        return SyntheticDrafter(self.references, self.acceptance, self.seed + 1, inner)

    # the memory half of the protocol is the inner drafter's (the synthetic drafts keep no KV)
    def release(self) -> object:
        return self.inner.release() if self.inner is not None else None

    @property
    def kv_table(self):
        return self.inner.kv_table if self.inner is not None else None

    def start(self, prompt: list[int], hidden: np.ndarray | None, k_max: int = 0, resume: object = None) -> None:
        if isinstance(self.references, Mapping):
            key = tuple(int(t) for t in prompt)
            if key not in self.references:
                raise ValueError(f"SyntheticDrafter: no reference continuation for the prompt {list(key)[:8]}..")
            self.reference = self._checked(self.references[key])
        elif callable(self.references):
            self.reference = self._checked(self.references(list(prompt)))
        if self.inner is not None:
            self.inner.start(prompt, hidden, k_max, resume)
        self.step = 0  # every generation sees the same draws
        self.i = 0  # index in the reference of the pending token
        self.diverged_at: int | None = None
        self.history: list[tuple[int, int]] = []
        self._n_drafted = 0

    def _check(self, index: int, token: int) -> None:
        """Record the first index where the output leaves the reference (past its end nothing is known)."""
        if self.diverged_at is None and index < len(self.reference) and self.reference[index] != token:
            self.diverged_at = index

    def drafting(self, pending: int, k: int, params: SamplingParams, rng: np.random.Generator,
                 stop: StopRule | None = None, on_device: bool = False) -> Drafting:
        """The synthetic drafts; with inner, its drafting for as many drafts first (its passes are this
        coroutine's, so a batch makes them together; its tokens are dropped)."""
        self._n_drafted = 0
        self._check(self.i, int(pending))
        if self.diverged_at is not None:
            return Draft()
        truth = self.reference[self.i + 1:self.i + 1 + k]  # cut at the end of the reference
        if self.inner is not None and truth:
            yield from self.inner.drafting(pending, len(truth), params, rng, stop)  # pay the real drafting cost
        right = self.draws(len(truth)) < self.acceptance  # one draw per position, used or not
        self.step += 1
        drafts = [t if ok else (t - 1 if t > 0 else t + 1) for t, ok in zip(truth, right)]
        self._n_drafted = len(drafts)
        return Draft(drafts, [None] * len(drafts))  # deterministic proposals: q is one-hot

    def draft_pass(self, asks: list) -> list:
        """The inner drafter's passes (the synthetic drafts make none)."""
        return self.inner.draft_pass(asks) if self.inner is not None else []

    def draws(self, k: int) -> np.ndarray:
        """u_1(s) .. u_k(s) for the current step s (shifts c_j: the first k uniforms of the seed's stream)."""
        if len(self._shifts) < k:  # a prefix of the seed's stream: c_j does not depend on k
            self._shifts, self._alphas = np.random.default_rng(self.seed).random(k), kronecker_steps(k)
        return (self._shifts[:k] + self.step * self._alphas[:k]) % 1.0

    def commit(self, fed: list[int], hidden: np.ndarray) -> None:
        if self.inner is not None:
            self.inner.commit(fed, hidden)
        for j, token in enumerate(fed):
            self._check(self.i + j, int(token))
        self.history.append((self._n_drafted, len(fed) - 1))
        self._n_drafted = 0  # a step without drafting (k = 0: no room left, or an adaptive plain step) drafted 0
        self.i += len(fed)  # the next pending token sits right after the kept ones
