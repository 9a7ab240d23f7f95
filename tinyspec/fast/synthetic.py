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
Many sequences (batch.py): SyntheticBatch is the batch drafter of the same dial, one SyntheticDrafter per
slot, each over the reference of the prompt its slot runs, and an inner BATCH drafter (Together(MTPDrafter))
that makes every slot's real drafting as one pass per depth and whose tokens are discarded (bench --slots).
Does NOT include: per-position rates other than p, p^2, .. (llama.cpp's --spec-synth-rates),
content-dependent rates, sampled targets (a sampled run leaves the greedy reference at once), serial
independence: step s + 1's draws are step s's turned by alpha (a drafter-side predictor could learn
that; the adaptive draft length's estimates only average, adaptive.py).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Mapping, Sequence

import numpy as np

from ..sampling import SamplingParams
from ..speculate import NO_DRAFT, Draft, StopRule


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


class SyntheticDrafter:
    """The drafter protocol (speculate.py) over a known greedy continuation, right with probability `acceptance`.

    reference_tokens: the target's greedy output after the prompt (r_0 is the first generated token).
    history: one (drafted, kept) pair per verify step: drafts proposed, drafts the target kept.
    """

    def __init__(self, reference_tokens: Sequence[int], acceptance: float, seed: int = 0, inner=None):
        if not 0.0 <= float(acceptance) <= 1.0:
            raise ValueError(f"acceptance must be in [0, 1], got {acceptance}")
        self.reference = [int(t) for t in reference_tokens]
        if any(t < 0 for t in self.reference):
            raise ValueError("reference tokens must be non-negative token ids")
        self.acceptance, self.seed = float(acceptance), seed
        self.inner = inner  # a real drafter whose cost is paid (its tokens are not used), or None
        self.i, self.diverged_at, self.history, self._n_drafted, self.step = 0, None, [], 0, 0
        self._shifts = self._alphas = np.zeros(0)

    stops_by_confidence = False
    drafts_on_device = False  # its drafts are host ints (the reference's); inner's are fetched and dropped

    def start(self, prompt: list[int], hidden: np.ndarray | None, k_max: int = 0) -> None:
        if self.inner is not None:
            self.inner.start(prompt, hidden, k_max)
        self.step = 0  # every generation sees the same draws
        self.i = 0  # index in the reference of the pending token
        self.diverged_at: int | None = None
        self.history: list[tuple[int, int]] = []
        self._n_drafted = 0

    def _check(self, index: int, token: int) -> None:
        """Record the first index where the output leaves the reference (past its end nothing is known)."""
        if self.diverged_at is None and index < len(self.reference) and self.reference[index] != token:
            self.diverged_at = index

    def drafts_for(self, pending: int, k: int) -> int:
        """How many drafts propose(pending, k) makes: k cut at the reference's end, 0 once the output has left
        the reference (SyntheticBatch asks, to make its inner drafter pay for exactly these)."""
        self._check(self.i, int(pending))
        return 0 if self.diverged_at is not None else len(self.reference[self.i + 1:self.i + 1 + k])

    def propose(self, pending: int, k: int, params: SamplingParams, rng: np.random.Generator,
                stop: StopRule | None = None) -> Draft:
        self._n_drafted = 0
        self._check(self.i, int(pending))
        if self.diverged_at is not None:
            return Draft()
        truth = self.reference[self.i + 1:self.i + 1 + k]  # cut at the end of the reference
        if self.inner is not None and truth:
            self.inner.propose(pending, len(truth), params, rng, stop)  # pay the real drafting cost
        right = self.draws(len(truth)) < self.acceptance  # one draw per position, used or not
        self.step += 1
        drafts = [t if ok else (t - 1 if t > 0 else t + 1) for t, ok in zip(truth, right)]
        self._n_drafted = len(drafts)
        return Draft(drafts, [None] * len(drafts))  # deterministic proposals: q is one-hot

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
        self._n_drafted = 0  # a step without propose (k = 0: no room left, or an adaptive plain step) drafted 0
        self.i += len(fed)  # the next pending token sits right after the kept ones


class SyntheticBatch:
    """The synthetic dial for many sequences (batch.BatchDrafter, as batch.EachAlone): one SyntheticDrafter per
    slot, without inner, plus an optional `inner` batch drafter (e.g. batch.Together(MTPDrafter(model), B))
    whose cost is paid and whose tokens are discarded, as SyntheticDrafter's inner does for one sequence.

    references: the target's plain greedy continuation of each prompt, as a mapping tuple(prompt) -> tokens or
    a function prompt -> tokens; a slot looks its prompt up when a sequence starts in it (a slot runs several
    sequences one after another under continuous batching). The j-th sequence started draws with seed + j
    (sequences start in input order), so the slots do not accept in lockstep.

    propose(asks) first runs inner.propose for the same asks with k capped to what each slot's synthetic drafter
    will draft (its reference's end, or 0 once it has left it), so the real batched drafting cost is paid for
    exactly the drafts proposed; then it returns the synthetic drafts. start and commit reach both.
    history: (drafted, kept) per verify step of every sequence, in step order, sequences mixed."""

    stops_by_confidence = False  # the synthetic drafts ignore a stop rule (the inner drafter sees it)

    def __init__(self, references: Mapping[tuple, Sequence[int]] | Callable[[list[int]], Sequence[int]],
                 acceptance: float, n_slots: int, seed: int = 0, inner=None):
        if not 0.0 <= float(acceptance) <= 1.0:
            raise ValueError(f"acceptance must be in [0, 1], got {acceptance}")
        self.references, self.acceptance, self.seed, self.inner = references, float(acceptance), seed, inner
        self.drafters: list[SyntheticDrafter | None] = [None] * n_slots
        self.n_slots = n_slots
        self.started = 0
        self.history: list[tuple[int, int]] = []

    def reference_for(self, prompt: list[int]) -> list[int]:
        if callable(self.references):
            return list(self.references(prompt))
        key = tuple(int(t) for t in prompt)
        if key not in self.references:
            raise ValueError(f"SyntheticBatch: no reference continuation for the prompt {list(key)[:8]}..")
        return list(self.references[key])

    def start(self, slot: int, prompt: list[int], hidden: np.ndarray, k_max: int) -> None:
        drafter = self.drafters[slot] = SyntheticDrafter(self.reference_for(prompt), self.acceptance,
                                                         seed=self.seed + self.started)
        self.started += 1
        drafter.start(prompt, hidden, k_max)
        if self.inner is not None:
            self.inner.start(slot, prompt, hidden, k_max)

    def propose(self, asks: list) -> list[Draft]:
        if self.inner is not None:  # pay the real drafting cost, for as many drafts as the dial makes
            paid = [replace(a, k=self.drafters[a.slot].drafts_for(a.pending, a.k)) if a.k else a for a in asks]
            self.inner.propose(paid)
        return [self.drafters[a.slot].propose(a.pending, a.k, a.params, a.rng, a.stop) if a.k else NO_DRAFT
                for a in asks]

    def commit(self, slot: int, fed: list[int], hidden: np.ndarray) -> None:
        drafter = self.drafters[slot]
        drafter.commit(fed, hidden)
        self.history.append(drafter.history[-1])
        if self.inner is not None:
            self.inner.commit(slot, fed, hidden)
