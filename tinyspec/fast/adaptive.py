"""Adaptive draft length: choose k for each step to maximise expected tokens per second.

A speculative step with k drafts emits E(k) tokens on average and costs T(k) seconds:

    E(k) = 1 + sum_{i=1..k} prod_{j=1..i} a_j     a_j = P(draft j accepted | drafts 1..j-1 accepted)
    T(k) = drafting k tokens + a verify pass of k + 1 tokens + rollback + the drafter's bookkeeping

and the policy takes k* = argmax_{0 <= k <= k_max} E(k) / T(k). k = 0 is a plain decode step: when
drafts keep failing (a_1 small) or drafting costs more than it returns, speculation switches itself
off instead of losing to plain decoding.

Estimates, updated after every step from what the step measured (online, per generation):
    a_j    the mean of the accept (1) / reject (0) outcomes at position j, the prior a0 counting as one
           outcome at position 1 and as prior_deep (3) at the later ones, until there are 1/rate of
           them; then a moving average with weight `rate` (recent text matters more). Positions after
           the first rejection are not observed that step, and a position beyond the k being run is
           not observed at all, so one early rejection at position 2 must not sink a_2 to where a
           longer k is never tried again (position 1 decides whether to draft at all: it reacts fast)
    T(k)   before any step is timed, 1 + cost_prior * k plain steps (a verify pass of k + 1 tokens costs
           about 1 + 0.33 k one-token passes on the cpu backend, drafting extra; LESSONS 4). Once
           drafting steps of at least two sizes are timed, T(k) = c0 + c1 k for k >= 1: a line fitted
           by least squares to all of them, older steps weighing less ((1 - rate / 2) a step). A step of
           k drafts does k times the same work (a head pass, a verify row) on top of a fixed part, so
           two numbers describe every k, and they come from every step instead of k_max separate
           averages, each fed by the few steps that happened to draft that k: keep_drafting's threshold
           for draft j + 1 is R (T(j + 1) - T(j)) / a, and as differences of two noisy averages the
           thresholds at different depths spread over 29% of the first one (median over steps, shipped
           model); as the slope c1 they are one number (LESSONS 19). A plain step,
           T(0), is its own moving average (no head pass, no drafter bookkeeping). A step timed beyond
           `outlier` (1.5) times its estimate counts as 1.5 times it: a busy machine moves an estimate
           a bounded step. Until the line exists, a moving average per k; a k never run is estimated
           from those that were: linear between the nearest two, above them grown from the longest
           measured k as the prior grows (flat was too optimistic: drafts failing at position 1 left
           a_2.. at the prior, so a k = 3 step looked as cheap as a measured k = 1 and was tried
           again), and below them halfway between flat and
           proportional to k + 1 (with pure k + 1 scaling a good drafter left k_max just to measure a
           plain step, a fifth of a short generation; flat, a failing one waited for a probe). A longer step cannot
           cost less than a shorter one (it does the same work and more), so T(k) is raised to the
           largest T(j), j < k (with the line: to T(0)): timing noise then cannot make k = 2 look
           cheaper than a plain step

Exploration: a k that is not chosen is not measured again, so one slow measurement (a busy machine)
could rule it out for good; and with k = 0 nothing is learnt about a_j. So every `probe_every`-th
step is a probe: a plain step when the policy is drafting, one draft when it is not. A probe costs at
most one step in `probe_every` run at a worse k. Optionally (probe_max > probe_every) the gap
between probing drafts doubles while they fail, so a drafter that must catch up on the tokens it
skipped (the MTP head's cache, mtp.py) pays for fewer of them; off by default, because a failed probe
is also what a good drafter produces now and then, and backing off on it locked the policy into plain
steps on prompts where every fixed k won (random-token prompts, tools/bench_adaptive.py: 0.92x plain
against 1.1-1.25x for fixed k). The other way round, a probing draft that is kept brings the next
probe forward (2 steps): a prompt whose first drafts fail and later ones would be kept (the model's
continuation of noise, LESSONS 4) resumes drafting in a few steps instead of a few probe gaps, while
drafts that keep failing keep the full gap. With the priors a0 and cost_prior and nothing measured
the policy starts at the k they favour (3 of 4 with the defaults); the first step's time is not recorded
(it also pays the generation's warm-up: first passes of new shapes, allocations), only its outcomes.
Whether to draft at all is decided optimistically (hopeful_tokens): with a_1 at its mean plus `optimism`
(1) standard errors, sqrt(a_1 (1 - a_1) / (n + 1)) after n outcomes at position 1, and if that says
drafting may pay, the step drafts the k the plain estimates favour (or up to k_max, by confidence). A
plain step observes nothing, so an estimate that two unlucky rejections took from 0.8 to 0.27 stayed
there until a probe: in a 40-token generation that was most of it (the demo's prompts, whose first two
drafts fail and whose next thirty are kept: 1.30x plain against 1.44x for k = 3; now 1.64x, replayed,
docs/performance-log.md old 32; LESSONS 4). The bound shrinks as outcomes come in, so a drafter that fails
from the start costs one long step and a few short ones (the bound after 1..4 rejections: 0.75, 0.52, 0.40,
0.32), then plain steps.

Depth by confidence (by_confidence; `for_drafter` turns it on for a drafter whose stops_by_confidence
says it can): a drafter that reports its probability p of each draft (MTPDrafter, DraftModelDrafter: the
softmax of its greedy draft, q of a sampled one) gets keep_drafting as its stop rule's keep_going (plan(),
speculate.StopRule), and k from choose() becomes a cap: 0 (a plain step) or k_max (1 for
a probing draft). After each
draft the step goes on only while the chance that every draft so far is kept, the product of the
calibrated rates confidence(p) (per bin of p, a prior updated online from the drafts' outcomes), makes
the next draft pay at the best rate the model promises (keep_drafting's docstring). The per-step
information is what no fixed k has: on the shipped model 0.62 of the drafts at p < 0.3 are kept and 1.0
at p >= 0.9, so a step ends at an unsure draft and runs long through sure ones (LESSONS 5).
A draft below `floor` (0.01; greedy only; the plan's StopRule.floor) is not even proposed: the drafter
withdraws it and says so in its Draft (Draft.withdrawn; MTPDrafter). The head is guessing, and
verifying it costs a verify row and a rollback for nothing. If it was the step's first draft, the step
is a plain pass and update() counts a rejection at position 1 without recording its time. At the 0.8B
shape with random weights (every draft p ~ 1e-3) a drafting step then costs one head pass more than a
plain one instead of ~1.5 plain steps: drafts that always fail 0.92-0.95x -> 0.98-1.00x plain (LESSONS 5).

Greedy output does not depend on k (each step's output is the target's), so adaptive k keeps the
lossless guarantee as is. With sampling the law is exact for every k too, but the k sequence follows
measured times, so a fixed seed does not fix the sample path: use a fixed --draft-n for that.

Official implementation: none in llama.cpp (a fixed --spec-draft-n-max with a probability cutoff --spec-draft-p-min);
the model is the one in Leviathan et al. 2023, section 3.5 (optimal gamma), with online estimates.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..speculate import Draft, Plan, StopRule


def _expected(accept: list[float]) -> list[float]:
    """[E(0), .., E(len(accept))] for the per-position rates accept: E(k) = 1 + sum_{i<=k} prod_{j<=i} a_j."""
    out, run = [1.0], 1.0
    for a in accept:
        run *= a
        out.append(out[-1] + run)
    return out


@dataclass
class AdaptiveDraftLength:
    k_max: int
    a0: float = 0.8  # prior acceptance per position
    cost_prior: float = 0.3  # prior T(k) = 1 + cost_prior * k (in plain steps) until a step is timed
    prior_deep: int = 3  # outcomes the prior a0 counts as at positions j >= 2 (1 at position 1)
    rate: float = 0.15  # weight of the newest observation in every moving average
    probe_every: int = 16  # every probe_every-th step re-measures the alternative (plain vs drafting)
    probe_max: int = 16  # the longest gap between probing drafts while drafts keep failing (16: no backoff)
    optimism: float = 1.0  # whether to draft is decided with a_1 at its mean + this many standard errors
    floor: float = 0.01  # greedy: a draft its drafter gives less than this is withdrawn, not verified (StopRule.floor)
    accept: list[float] = field(init=False)  # a_j estimates, j = 1..k_max
    seen: list[int] = field(init=False)  # outcomes observed at each position
    step_s: dict[int, float] = field(init=False, default_factory=dict)  # k -> seconds of a step
    fit: list[float] = field(init=False, default_factory=lambda: [0.0] * 5)  # T(k) line: sums of w, wk, ws, wk^2, wks
    outlier: float = 1.5  # a step timed beyond this factor of its estimate counts as this factor (a busy machine)
    since_probe: int = field(init=False, default=0)  # steps since the last probe
    gap: int = field(init=False, default=0)  # steps between probes now (probe_every, doubled while drafts fail)
    probing: bool = field(init=False, default=False)  # the step just chosen is a probing draft
    chosen: dict[int, int] = field(init=False, default_factory=dict)  # k -> steps
    updates: int = field(init=False, default=0)  # steps folded in so far
    probe_ok: bool = field(init=False, default=False)  # the last probing draft was accepted
    # draft depth by confidence (keep_drafting): the drafter's probability of its draft, in bins, calibrated online
    edges: tuple = (0.3, 0.5, 0.7, 0.9)  # bin edges of the drafter's probability p of its draft
    kept_prior: tuple = (0.5, 0.75, 0.9, 0.97, 0.99)  # prior fraction kept per bin (LESSONS 5 measured 0.62 .. 1.0)
    prior_weight: float = 4.0  # outcomes the prior counts as, per bin
    by_confidence: bool = False  # the drafter stops where keep_drafting says (it reports each draft's probability)
    kept: list[float] = field(init=False)  # per bin: drafts kept, drafts seen (observed outcomes)
    seen_bin: list[float] = field(init=False)
    _need: list[float] = field(init=False, default_factory=list)  # keep_drafting's thresholds for this step
    _chain: float = field(init=False, default=1.0)  # the product of the step's confidences so far

    def __post_init__(self):
        if self.k_max < 1:
            raise ValueError(f"adaptive draft length needs k_max >= 1, got {self.k_max}")
        self.accept = [self.a0] * self.k_max
        self.seen = [0] * self.k_max
        if len(self.kept_prior) != len(self.edges) + 1:
            raise ValueError("kept_prior needs one value per bin: len(edges) + 1")
        if any(not 0 < e < 1 for e in self.edges) or any(a >= b for a, b in zip(self.edges, self.edges[1:])):
            raise ValueError(f"edges must increase strictly inside (0, 1), got {self.edges}")
        if any(not 0 < c <= 1 for c in self.kept_prior) or self.prior_weight <= 0:
            raise ValueError(f"kept_prior must lie in (0, 1] and prior_weight be > 0, got {self.kept_prior}, "
                             f"{self.prior_weight}")
        self.kept, self.seen_bin = [0.0] * len(self.kept_prior), [0.0] * len(self.kept_prior)

    # ------------------------------------------------------------------ the model

    def expected_tokens(self, k: int) -> float:  # E(k)
        return _expected(self.accept[:k])[k]

    def step_cost(self, k: int) -> float:  # T(k): never below the cost of a shorter step
        line = self._line()
        if line is not None and k >= 1:  # the line rises with k: only a plain step's time can floor it
            return max(line[0] + line[1] * k, self._estimate(0))
        return max([self._estimate(k)] + [v for m, v in self.step_s.items() if m < k])

    def _line(self) -> tuple[float, float] | None:
        """(c0, c1) of T(k) = c0 + c1 k for k >= 1, least squares over the timed drafting steps (each weighted
        (1 - rate / 2)^age); None until their k spread enough to fix a slope (variance >= 1/4)."""
        w, wk, ws, wkk, wks = self.fit
        det = w * wkk - wk * wk  # w^2 times the weighted variance of k
        if w <= 0 or det < 0.25 * w * w:
            return None
        c1 = max((w * wks - wk * ws) / det, 0.0)
        c0 = (ws - c1 * wk) / w
        return (c0, c1) if c0 > 0 else None

    def _estimate(self, k: int) -> float:  # T(k) from the measurements, guessed where k was not measured
        known = sorted(self.step_s)
        if not known:
            return 1.0 + self.cost_prior * k  # nothing timed yet: the prior, in plain steps
        if k in self.step_s:
            return self.step_s[k]
        below = [m for m in known if m < k]
        above = [m for m in known if m > k]
        if below and above:
            lo, hi = below[-1], above[0]
            t = (k - lo) / (hi - lo)
            return (1 - t) * self.step_s[lo] + t * self.step_s[hi]
        if below:  # above the measured range: grown from the longest measured k as the prior grows
            m = below[-1]
            return self.step_s[m] * (1 + self.cost_prior * k) / (1 + self.cost_prior * m)
        m = above[0]
        return self.step_s[m] * (1 + (k + 1) / (m + 1)) / 2  # below: halfway between flat and proportional

    def tables(self) -> tuple[list[float], list[float]]:
        """[E(k)] and [T(k)] for k = 0..k_max in one pass each (what expected_tokens and step_cost give one by
        one): choose runs once a step, and on a small model a step is ~1 ms, so the policy's own time counts."""
        expected = _expected(self.accept)
        if (line := self._line()) is not None:
            plain = self._estimate(0)
            return expected, [plain] + [max(line[0] + line[1] * k, plain) for k in range(1, self.k_max + 1)]
        known = sorted(self.step_s)
        costs, floor, i = [], 0.0, 0  # floor: the largest measured T(m), m < k
        for k in range(self.k_max + 1):
            while i < len(known) and known[i] < k:
                floor = max(floor, self.step_s[known[i]])
                i += 1
            costs.append(max(self._estimate(k), floor) if known else self._estimate(k))
        return expected, costs

    def choose(self, limit: int | None = None) -> int:
        """k for the next step, at most `limit` (the room left before max_new)."""
        top = min(self.k_max, self.k_max if limit is None else max(0, limit))
        expected, costs = self.tables()
        rates = [e / t for e, t in zip(expected, costs)]
        best = max(range(top + 1), key=lambda k: (rates[k], -k))
        if not best and top:  # whether to draft at all: a_1 at its upper confidence bound (hopeful_tokens);
            hope = self.hopeful_tokens()  # how far: the estimates themselves (or the drafter's confidence)
            if max(hope[k] / costs[k] for k in range(1, top + 1)) > rates[0]:
                best = max(range(1, top + 1), key=lambda k: (rates[k], -k))
        if best:
            self.gap = self.probe_every
        gap = self.gap or self.probe_every
        if not best and self.probe_ok:  # the last probing draft was kept: probe again soon, so an unlucky
            gap = min(gap, 2)  # start is undone in a few steps (drafts that keep failing keep the full gap)
        probe = top > 0 and self.since_probe + 1 >= gap
        self.since_probe = 0 if probe else self.since_probe + 1
        self.probing = probe and best == 0
        k = (0 if best else 1) if probe else best
        if k and self.by_confidence and not probe:  # how far to draft is keep_drafting's call, draft by draft
            k = top
            a_next = (sum(self.kept) + self.prior_weight * self.a0) / (sum(self.seen_bin) + self.prior_weight)
            scale = max(rates) / max(a_next, 1e-6)
            self._need = [scale * (costs[m + 1] - costs[m]) for m in range(k)]
        self.chosen[k] = self.chosen.get(k, 0) + 1
        return k

    def hopeful_tokens(self) -> list[float]:
        """[E(k)] for k = 0..k_max with a_1 at its upper confidence bound a_1 + optimism sqrt(a_1 (1 - a_1) / (n + 1)),
        n the outcomes seen at position 1: what choose() decides with. Two early rejections take a_1 from the prior
        0.8 to 0.27, and a plain step observes nothing, so the estimate would stay there until a probe; at n = 2
        the bound is 0.52 and drafting goes on, while a drafter that keeps failing drives a_1 and its bound to 0."""
        a = self.accept[0]
        return _expected([min(1.0, a + self.optimism * (a * (1.0 - a) / (self.seen[0] + 1)) ** 0.5)] + self.accept[1:])

    def _bin(self, p: float) -> int:  # the confidence bin of probability p: edges below or at it
        return sum(p >= e for e in self.edges)

    def confidence(self, p: float) -> float:
        """P(a draft is kept | the drafter gave it probability p, the drafts before it kept): its bin's rate."""
        b = self._bin(p)
        return (self.kept[b] + self.prior_weight * self.kept_prior[b]) / (self.seen_bin[b] + self.prior_weight)

    def keep_drafting(self, probs: list[float]) -> bool:
        """After drafts with probabilities probs (j = len(probs) of them): is draft j + 1 worth making?

        It adds a token if all j drafts and it are kept, P = prod_i confidence(p_i) times a, the kept fraction
        of all drafts observed (pooled: its confidence is not known before it is drafted, and a per-position
        a_{j+1} is a noisy moving average), and costs T(j+1) - T(j); the step goes on while that token comes at
        least at the best rate R = max_k E(k) / T(k) the model promises: P >= R (T(j+1) - T(j)) / a. So an
        unsure draft ends the step and a confident
        chain runs to k_max. Myopic on purpose: valuing the drafts after j + 1 too (continue if some m > j
        pays) drafted longer and measured 0.91x the best fixed k on held-out prompts instead of ~1.0x.
        The thresholds are computed once per step (choose), the product as it grows."""
        j = len(probs)
        if j >= len(self._need):
            return False
        self._chain = (1.0 if j == 1 else self._chain) * self.confidence(probs[-1])
        return self._chain >= self._need[j]

    def update(self, k: int, n_accepted: int, step_s: float, probs: list[float] | None = None,
               withdrawn: bool = False) -> None:
        """Fold in one step: k drafted, the first n_accepted kept, the step took step_s seconds; probs: the
        drafter's probability of each draft (calibrates confidence: the accepted ones and the first rejection).
        withdrawn with k = 0: the step drafted and withdrew its first draft (its probability under `floor`):
        a rejection at position 1 as far as a_1 goes (a draft the head gives under 1% is next to never kept),
        and no time recorded (a plain pass plus a head pass is neither T(0) nor T(1))."""
        r = self.rate
        self.updates += 1
        for j, p in enumerate((probs or [])[: n_accepted + 1]):
            b = self._bin(p)
            self.seen_bin[b] += 1
            self.kept[b] += 1.0 if j < n_accepted else 0.0
        if self.probing:  # a probing draft: back off while drafts keep failing
            self.gap = self.probe_every if n_accepted else min(2 * (self.gap or self.probe_every), self.probe_max)
            self.probing = False
            self.probe_ok = n_accepted > 0
        for j in range(min(max(k, int(withdrawn)), n_accepted + 1)):  # the accepted ones and the first rejection
            self.seen[j] += 1
            w = max(r, 1.0 / (self.seen[j] + (1 if j == 0 else self.prior_deep)))
            self.accept[j] += w * ((1.0 if j < n_accepted else 0.0) - self.accept[j])
        if self.updates == 1 or (withdrawn and not k):  # a generation's first step also pays its warm-up (first
            return  # passes of new shapes, allocations): its time would make that k look dear for good
        line, old = self._line(), self.step_s.get(k)
        guess = line[0] + line[1] * k if line is not None and k >= 1 else old
        if guess is not None:  # one slow step (another process took the core) moves an estimate a bounded step
            step_s = min(max(step_s, guess / self.outlier), guess * self.outlier)
        self.step_s[k] = step_s if old is None else old + r * (step_s - old)
        if k >= 1:
            f = 1.0 - r / 2
            self.fit = [f * v + x for v, x in zip(self.fit, (1.0, k, step_s, k * k, k * step_s))]

    # ------------------------------------------------------------------ the engine's view (speculate.DraftPolicy)

    @classmethod
    def for_drafter(cls, drafter, k_max: int, **options) -> "AdaptiveDraftLength":
        """The policy for this drafter: depth by confidence when the drafter can stop by it."""
        return cls(k_max, by_confidence=drafter.stops_by_confidence, **options)

    def plan(self, room: int) -> Plan:
        """choose()'s k, with keep_drafting as the stop rule when drafting by confidence, and the floor."""
        k = self.choose(room)
        return Plan(k, StopRule(self.keep_drafting if self.by_confidence else None, self.floor))

    def observe(self, draft: Draft, n_accepted: int, step_s: float) -> None:
        self.update(len(draft.tokens), n_accepted, step_s, draft.probs if draft.tokens else None, draft.withdrawn)

    def summary(self) -> dict:
        return self.as_dict()

    def as_dict(self) -> dict:
        out = {"chosen_k": {str(k): v for k, v in sorted(self.chosen.items())},
               "accept_estimates": [round(a, 4) for a in self.accept],
               "step_ms": {str(k): round(1000 * v, 3) for k, v in sorted(self.step_s.items())}}
        if (line := self._line()) is not None:  # T(k) = c0 + c1 k, k >= 1, what choose() uses
            out["step_ms_line"] = [round(1000 * line[0], 3), round(1000 * line[1], 3)]
        if self.by_confidence:  # the calibrated rate of each probability bin, from its lower edge
            out["kept_by_confidence"] = {str(e): round(self.confidence(e), 3) for e in (0.0,) + self.edges}
        return out
