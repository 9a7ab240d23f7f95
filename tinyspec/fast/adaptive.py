"""Adaptive draft length: choose k for each step to maximise expected tokens per second.

A step with k drafts emits E(k) tokens on average and costs T(k) seconds; the policy drafts k*:

    E(k) = 1 + sum_{i=1..k} prod_{j=1..i} a_j     a_j = P(draft j kept | drafts 1..j-1 kept)
    T(k) = drafting k tokens + a verify pass of k + 1 tokens + rollback + the drafter's bookkeeping
    k*   = argmax_{0 <= k <= k_max} E(k) / T(k)      k = 0 is a plain step: when drafts fail, or cost
                                                     more than they return, speculation switches itself off;
                                                     a k >= 1 must beat E(0) / T(0) by `margin` (5%): a
                                                     predicted tie is a loss once the estimates' noise and
                                                     the step's untimed bookkeeping are paid

Estimates, per generation, updated after every step (update):
    a_j   the mean of the kept (1) / rejected (0) outcomes at position j, the prior a0 counting as one
          outcome at position 1 (it decides whether to draft at all, so it reacts fast) and as prior_deep
          later; after 1 / rate outcomes a moving average. A step sees no position past its first
          rejection or its k, so with a light prior one early rejection at position 2 would hold a good
          drafter at a short k for good (LESSONS 4).
    T(k)  the prior curve C(k) plain steps (1 + cost_prior k, or the curve step_costs.py measured on this machine
          before the generation: for_drafter(costs=...)), then averages per k (_estimate guesses unmeasured
          ones); once two drafting sizes are timed, a line c0 + c1 x(k) (k >= 1) fitted to every timed drafting
          step, older ones weighing less, with x(k) = (C(k) - C(0)) / (C(1) - C(0)) (= k for the default curve):
          a k-draft step repeats one unit of work k times on a fixed part, and one line fed by every step is far
          steadier than averages per k, whose differences set keep_drafting's thresholds (LESSONS 19). On a
          mixture of experts a verify row is not one unit of work: each may route to experts no other row read,
          so the pass's cost follows the number of distinct experts it reads (expert_union.py), and
          cost_curve carries that shape (expert_union.step_cost_curve: C(k) = 1 + cost_prior k + the extra
          expert bytes of k + 1 rows over one row's); the line is then fitted in x(k), not in k. T(0) stays an average. A step over `outlier` times its estimate counts as that (a busy
          machine); T(k) never falls below a shorter step's; a first step (it pays the warm-up) is not timed.

Exploration: an unchosen k is never re-timed and a plain step learns no a_j, so every probe_every-th step is a
probe (plain while drafting, one draft while not). After a kept probing draft the next probe comes within 2
steps, so a prompt whose first drafts fail resumes drafting soon, while drafts that keep failing keep the full
gap. Backing off a failing drafter's probes (probe_max) is off: good drafters fail probes too, and the backoff
locked them into plain steps (docs/performance-log.md old 18, 32). What does wait is a probe that cannot pay
whatever it accepts: while (k + 1) / T(k), the rate of drafts always kept, is below plain's for every k (a step
costs more than its most tokens: the shipped model on a CPU), probes come every hopeless_gap steps, to re-time the
costs, not every probe_every (a probe there costs 2-3 plain steps, so one in 16 steps cost ~10%). Whether to draft is a bandit's choice (a
plain step earns a known rate and learns nothing), so choose() makes it with a_1 at its upper confidence bound
(hopeful_tokens): an unlucky start is undone within a few steps, while drafts that always fail, as the bound
shrinks, cost one long step and a few short ones before plain steps (LESSONS 4).

Depth by confidence (by_confidence; for_drafter sets it for a drafter that reports its probability p of
each draft): choose() only picks plain or drafting, up to k_max, and keep_drafting, the step's stop rule,
drafts on while the chance that all drafts so far are kept (confidence(p), calibrated online per bin of p)
makes the next one pay at the best modelled rate: a step ends at an unsure draft and runs long through
sure ones, as no fixed k can (LESSONS 5). The floor: a greedy draft below `floor` is withdrawn, not
verified (StopRule.floor, Draft.withdrawn), since the head is guessing and a verify row and a rollback
would buy nothing; it counts as a rejection at position 1 with no time recorded, so drafts that always
fail cost about one extra head pass a step (LESSONS 5).

Greedy output does not depend on k: lossless as is. Sampling keeps the target's law for every k, but k
follows measured times, so only a fixed --draft-n fixes the sample path. The model: Leviathan et al. 2023,
section 3.5 (optimal gamma), with online estimates; llama.cpp has none (fixed --spec-draft-n-max, a cutoff).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..drafting import Draft, Plan, StopRule


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
    a0: float = 0.8  # prior acceptance per position (with cost_prior, E(k) / T(k) peaks at k = 3 until timed)
    cost_prior: float = 0.3  # prior T(k) = 1 + cost_prior * k (in plain steps) until a step is timed
    prior_deep: int = 3  # outcomes the prior a0 counts as at positions j >= 2 (1 at position 1)
    rate: float = 0.15  # weight of the newest observation in every moving average
    probe_every: int = 16  # every probe_every-th step re-measures the alternative (plain vs drafting)
    probe_max: int = 16  # the longest gap between probing drafts while drafts keep failing (16: no backoff)
    hopeless_gap: int = 64  # the gap between probes while even drafts always kept could not pay at these costs
    optimism: float = 1.0  # whether to draft is decided with a_1 at its mean + this many standard errors
    floor: float = 0.01  # greedy: a draft its drafter gives less than this is withdrawn, not verified (StopRule.floor)
    margin: float = 0.05  # a drafting k is chosen only if its E(k) / T(k) beats a plain step's by this fraction
    cost_curve: tuple[float, ...] | None = None  # prior T(k) in plain steps, k = 0..k_max (None: 1 + cost_prior k)
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
    kept_prior: tuple = (0.5, 0.75, 0.9, 0.97, 0.99)  # prior fraction kept per bin (LESSONS 5 measures the rates)
    prior_weight: float = 4.0  # outcomes the prior counts as, per bin
    by_confidence: bool = False  # the drafter stops where keep_drafting says (it reports each draft's probability)
    kept: list[float] = field(init=False)  # per bin: drafts kept, drafts seen (observed outcomes)
    seen_bin: list[float] = field(init=False)
    _need: list[float] = field(init=False, default_factory=list)  # keep_drafting's thresholds for this step
    _chain: float = field(init=False, default=1.0)  # the product of the step's confidences so far
    _xs: list[float] = field(init=False, default_factory=list)  # x(k), the T(k) line's abscissa, k = 0..k_max

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
        if self.cost_curve is None:  # x(k) = k exactly
            self.cost_curve = tuple(1.0 + self.cost_prior * k for k in range(self.k_max + 1))
            self._xs = [float(k) for k in range(self.k_max + 1)]
        else:
            c = self.cost_curve = tuple(float(v) for v in self.cost_curve)
            if len(c) != self.k_max + 1 or c[0] <= 0 or c[1] <= c[0] or any(b < a for a, b in zip(c, c[1:])):
                raise ValueError(f"cost_curve needs k_max + 1 = {self.k_max + 1} positive values rising from "
                                 f"C(0) < C(1), got {c}")
            self._xs = [(v - c[0]) / (c[1] - c[0]) for v in c]  # x(k): the line's abscissa

    # ------------------------------------------------------------------ the model

    def expected_tokens(self, k: int) -> float:  # E(k)
        return _expected(self.accept[:k])[k]

    def step_cost(self, k: int) -> float:  # T(k): never below the cost of a shorter step
        line = self._line()
        if line is not None and k >= 1:  # the line rises with k: only a plain step's time can floor it
            return max(line[0] + line[1] * self._xs[k], self._estimate(0))
        return max([self._estimate(k)] + [v for m, v in self.step_s.items() if m < k])

    def _line(self) -> tuple[float, float] | None:
        """(c0, c1) of T(k) = c0 + c1 x(k) for k >= 1, least squares over the timed drafting steps (each weighted
        (1 - rate / 2)^age); None until their x(k) spread enough to fix a slope (variance >= 1/4)."""
        w, wk, ws, wkk, wks = self.fit
        det = w * wkk - wk * wk  # w^2 times the weighted variance of x(k)
        if w <= 0 or det < 0.25 * w * w:
            return None
        c1 = max((w * wks - wk * ws) / det, 0.0)
        c0 = (ws - c1 * wk) / w
        return (c0, c1) if c0 > 0 else None

    def _estimate(self, k: int) -> float:  # T(k) from the measurements, guessed where k was not measured
        known = sorted(self.step_s)
        if not known:
            return self.cost_curve[k]  # nothing timed yet: the prior, in plain steps
        if k in self.step_s:
            return self.step_s[k]
        below = [m for m in known if m < k]
        above = [m for m in known if m > k]
        if below and above:
            lo, hi = below[-1], above[0]
            t = (k - lo) / (hi - lo)
            return (1 - t) * self.step_s[lo] + t * self.step_s[hi]
        if below:  # above the measured range: grown from the longest measured k as the prior grows (flat was
            # too optimistic: drafts failing at position 1 leave a_2.. at the prior, so a k = 3 step looked as
            # cheap as a measured k = 1 and was tried again; docs/performance-log.md old 22)
            m = below[-1]
            return self.step_s[m] * self.cost_curve[k] / self.cost_curve[m]
        m = above[0]
        # below: halfway between flat and proportional to k + 1. Proportional made a good drafter leave k_max
        # just to measure a plain step (docs/performance-log.md old 18); flat made a failing one wait for a probe.
        return self.step_s[m] * (1 + (k + 1) / (m + 1)) / 2

    def tables(self) -> tuple[list[float], list[float]]:
        """[E(k)] and [T(k)] for k = 0..k_max in one pass each (what expected_tokens and step_cost give one by
        one): choose runs once a step, and on a small model a step is so short that the policy's own Python
        shows (docs/performance-log.md old 31)."""
        expected = _expected(self.accept)
        if (line := self._line()) is not None:
            plain = self._estimate(0)
            return expected, [plain] + [max(line[0] + line[1] * self._xs[k], plain) for k in range(1, self.k_max + 1)]
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
        bar = rates[0] * (1.0 + self.margin)  # drafting must beat a plain step by the margin, not tie it
        if best and rates[best] < bar:
            best = 0
        if not best and top:  # whether to draft at all: a_1 at its upper confidence bound (hopeful_tokens);
            hope = self.hopeful_tokens()  # how far: the estimates themselves (or the drafter's confidence)
            if max(hope[k] / costs[k] for k in range(1, top + 1)) > bar:
                best = max(range(1, top + 1), key=lambda k: (rates[k], -k))
        if best:
            self.gap = self.probe_every
        gap = self.gap or self.probe_every
        # the last probing draft was kept: probe again soon, so an unlucky start is undone in a few steps (drafts
        # that keep failing keep the full gap), unless even drafts that are always kept could not pay at these
        # costs (E(k) = k + 1): then a kept probe teaches nothing that could change the choice
        ceiling = max(((k + 1) / costs[k] for k in range(1, top + 1)), default=0.0)
        if not best and self.probe_ok and ceiling > bar:
            gap = min(gap, 2)
        if not best and ceiling <= bar:  # no acceptance could make drafting pay here: a probe only re-times the costs
            gap = max(gap, self.hopeless_gap)
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
        pays) drafted longer and lost to the best fixed k on held-out prompts (docs/performance-log.md old 29).
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
        guess = line[0] + line[1] * self._xs[k] if line is not None and k >= 1 else old
        if guess is not None:  # one slow step (another process took the core) moves an estimate a bounded step
            step_s = min(max(step_s, guess / self.outlier), guess * self.outlier)
        self.step_s[k] = step_s if old is None else old + r * (step_s - old)
        if k >= 1:
            f = 1.0 - r / 2
            x = self._xs[k]
            self.fit = [f * v + d for v, d in zip(self.fit, (1.0, x, step_s, x * x, x * step_s))]

    # ------------------------------------------------------------------ the engine's view (drafting.DraftPolicy)

    @classmethod
    def for_drafter(cls, drafter, k_max: int, model=None, costs=None, **options) -> "AdaptiveDraftLength":
        """The policy for this drafter: depth by confidence when the drafter can stop by it. costs: a StepCosts
        measured on this machine (step_costs.measure_step_costs): its curve is the prior T(k). Else model: the
        target, whose verify cost shapes the prior T(k) (expert_union.step_cost_curve: a mixture of experts pays for
        the experts each extra row reads; a dense model gets the default 1 + cost_prior k)."""
        if costs is not None and "cost_curve" not in options:
            curve = costs.curve()
            if len(curve) != k_max + 1:
                raise ValueError(f"costs measured up to k = {len(curve) - 1}, the policy drafts up to {k_max}")
            options["cost_curve"] = curve
        if model is not None and "cost_curve" not in options:
            from .expert_union import step_cost_curve

            options["cost_curve"] = step_cost_curve(model, k_max, options.get("cost_prior", cls.cost_prior))
        return cls(k_max, by_confidence=drafter.stops_by_confidence, **options)

    def plan(self, rooms: list[int], prefill_rows: int = 0) -> list[Plan]:
        """choose()'s k, with keep_drafting as the stop rule when drafting by confidence, and the floor. A policy
        for one sequence: its one choice serves every sequence there is (each within its own room); the rows
        of joining prompts are not priced (batch_draft_length.py prices them)."""
        k = self.choose(max(rooms))
        stop = StopRule(self.keep_drafting if self.by_confidence else None, self.floor)
        return [Plan(min(k, room), stop) for room in rooms]

    def observe(self, drafts: list[Draft], accepted: list[int], draft_s: float, verify_s: float, rows: int) -> None:
        """A step costs its drafting and its verify pass (what the choice of k changes). A tree (Draft.parents) counts
        as k = its nodes, n_accepted = the length of the path kept (what a row count returns); its probabilities are
        per node in row order, not along the path kept, so they calibrate no confidence bin."""
        for draft, n_accepted in zip(drafts, accepted):
            probs = draft.probs if draft.tokens and not draft.is_tree else None
            self.update(len(draft.tokens), n_accepted, draft_s + verify_s, probs, draft.withdrawn)

    def summary(self) -> dict:
        return self.as_dict()

    def as_dict(self) -> dict:
        out = {"chosen_k": {str(k): v for k, v in sorted(self.chosen.items())},
               "accept_estimates": [round(a, 4) for a in self.accept],
               "step_ms": {str(k): round(1000 * v, 3) for k, v in sorted(self.step_s.items())}}
        if (line := self._line()) is not None:  # T(k) = c0 + c1 x(k), k >= 1, what choose() uses
            out["step_ms_line"] = [round(1000 * line[0], 3), round(1000 * line[1], 3)]
        if self.by_confidence:  # the calibrated rate of each probability bin, from its lower edge
            out["kept_by_confidence"] = {str(e): round(self.confidence(e), 3) for e in (0.0,) + self.edges}
        return out
