"""Batch-aware draft length: one k for every slot of a step, chosen from the measured cost of a pass of R rows.

For one sequence a verify pass of k + 1 tokens costs little more than one token, because decoding reads
every weight once per pass and the arithmetic of a few rows hides under that read (LESSONS 7). A batch
already fills the pass: B slots put B rows into a plain step, and drafting puts B (k + 1). Once R rows cost
more than one row's weight read (the pass turns compute-bound), drafts stop being free, and at some B a
plain step of all slots earns more tokens per second than a speculative one (users see it as "MTP lowers
throughput under load", docs/peers.md section 4). So the policy prices a whole step:

    tokens(k)  = B E(k)                     E(k) = 1 + sum_{i<=k} prod_{j<=i} a_j (adaptive.py), a_j pooled
                                            over every slot's drafts (the slots share a drafter)
    seconds(k) = verify(B (k + 1) + C) + draft(k)     C: the rows of joining prompts' prefill chunks in the same
                                            pass (chunked prefill, speculate.Engine): they cost the pass whatever k
                                            is, so next to a long chunk the drafts' extra rows cost relatively
                                            little and drafting pays where alone it would not
    verify(R)  = v0 + v1 R                  a line fitted to every timed pass (R rows, its seconds), older
                                            passes weighing less: a pass reads the weights (v0) and does per-row
                                            work (v1); on a memory-bound pass v1 R << v0, on a busy one it is not
    draft(k)   = d k                        drafters of a batch make one pass per depth for all slots together
    k*         = argmax_{0 <= k <= k_max} tokens(k) / seconds(k)       (k = 0: plain, every slot)

Every slot drafts k* (less where its max_new leaves less room). The pass-cost line needs two row counts, so
the first steps are two plain ones (the first is not timed: warm-up) and one of a draft per slot (the
cheapest drafting pass; plain and one draft alternate until some draft is made: a lookup drafter may have
none to offer); afterwards a probe
now and then times the alternative to k*: a plain step while the batch drafts, and while it does not,
one draft in ONE slot (in turn), which measures acceptance and a pass of one more row for the price of a row,
where a drafting step of every slot would also make every slot's drafter catch up on the tokens it skipped.
Probes come every probe_every steps at first; each probe that finds the choice unchanged doubles the gap
(up to probe_max), a changed choice resets it. So a cost or an acceptance that changes (slots join and leave) is
followed, and a settled batch pays for few probes. Lossless like every policy: k only decides how much is drafted (greedy output is unchanged; a
sampled run keeps the target's law, but only a fixed k fixes its sample path).

LESSONS 23 holds the measured curve (tok/s against B, plain and speculative) this policy was built for.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..drafting import Draft, Plan, check_draft_length
from .adaptive import _expected


@dataclass
class BatchDraftLength:
    k_max: int
    a0: float = 0.7  # prior acceptance per position, counted as `prior` outcomes
    prior: float = 2.0
    memory: float = 200.0  # outcomes (per position) and passes the estimates remember: older ones fade
    probe_every: int = 8  # the gap between probes of the alternative, at first and after the choice changes
    probe_max: int = 64  # the longest gap, reached while every probe finds the same choice
    margin: float = 0.03  # drafting must beat plain by this fraction: near a tie, plain (speculation never loses)
    kept: list[float] = field(init=False)  # per position j = 1..k_max: kept outcomes (faded)
    seen: list[float] = field(init=False)  # per position: outcomes
    fit: list[float] = field(init=False, default_factory=lambda: [0.0] * 5)  # sums w, wR, ws, wR^2, wRs
    draft_per_depth: float | None = field(init=False, default=None)  # seconds per draft depth, moving average
    steps: int = field(init=False, default=0)
    probes: int = field(init=False, default=0)  # drafting probes made (which slot probes next)
    gap: int = field(init=False, default=0)  # steps from this probe to the next
    next_probe: int = field(init=False, default=0)  # the step that probes next
    probed_best: int | None = field(init=False, default=None)  # the choice at the last probe
    chosen: dict[int, int] = field(init=False, default_factory=dict)  # k -> steps

    def __post_init__(self):
        self.k_max = check_draft_length(self.k_max)
        self.kept = [self.a0 * self.prior] * self.k_max
        self.seen = [self.prior] * self.k_max
        self.gap = self.next_probe = self.probe_every

    # ---------------------------------------------------------------- the model
    def acceptance(self) -> list[float]:  # a_j, j = 1..k_max
        return [k / s for k, s in zip(self.kept, self.seen)]

    def verify_line(self) -> tuple[float, float] | None:
        """(v0, v1) of verify(R) = v0 + v1 R, None until two row counts were timed."""
        w, wr, ws, wrr, wrs = self.fit
        det = w * wrr - wr * wr
        if w <= 0 or det <= 1e-12 * max(1.0, w * wrr):
            return None
        v1 = (w * wrs - wr * ws) / det
        v1 = max(v1, 0.0)  # a pass of more rows never costs less
        return (ws - v1 * wr) / w, v1

    def rates(self, n_slots: int, prefill_rows: int = 0) -> list[float] | None:
        """Expected tokens per second for k = 0 .. k_max at n_slots decoding slots and prefill_rows rows of joining
        prompts in the same pass (None: not timed yet)."""
        line = self.verify_line()
        if line is None:
            return None
        v0, v1 = line
        d = self.draft_per_depth or 0.0
        e = _expected(self.acceptance())
        return [n_slots * e[k] / max(v0 + v1 * (n_slots * (k + 1) + prefill_rows) + d * k, 1e-9)
                for k in range(self.k_max + 1)]

    def choose(self, n_slots: int, prefill_rows: int = 0) -> tuple[int, bool]:
        """(k for every slot, whether this step is a probe)."""
        self.steps += 1
        rates = self.rates(n_slots, prefill_rows)
        if rates is None:  # the line needs two row counts: plain steps (the first pays warm-up), then one draft,
            return (self.steps % 2 if self.steps >= 3 else 0), False  # alternating until a draft is made
        best = max(range(1, self.k_max + 1), key=lambda k: rates[k])
        best = best if rates[best] > (1 + self.margin) * rates[0] else 0
        if self.steps < self.next_probe:
            return best, False
        # a probe: time the alternative (plain while drafting, else a draft). While the choice stays the same from
        # probe to probe the gap doubles (each probe costs a little), and a changed choice brings it back
        self.gap = min(2 * self.gap, self.probe_max) if best == self.probed_best else self.probe_every
        self.probed_best, self.next_probe = best, self.steps + self.gap
        return (0 if best else 1), True

    # ---------------------------------------------------------------- the DraftPolicy protocol (drafting.py)
    def plan(self, rooms: list[int], prefill_rows: int = 0) -> list[Plan]:
        k, probe = self.choose(len(rooms), prefill_rows)
        self.chosen[k] = self.chosen.get(k, 0) + 1
        if probe and k:  # a drafting probe while the batch decodes plainly: one slot drafts one token, in turn
            self.probes += 1
            one = self.probes % len(rooms)  # (cheap: one more row, and one drafter catching up, not all)
            return [Plan(min(1, room) if b == one else 0) for b, room in enumerate(rooms)]
        return [Plan(min(k, room)) for room in rooms]

    def observe(self, drafts: list[Draft], accepted: list[int], draft_s: float, verify_s: float, rows: int) -> None:
        fade = 1.0 - 1.0 / self.memory
        for draft, m in zip(drafts, accepted):
            for j in range(len(draft.tokens)):
                if j > m:
                    break  # positions past the first rejection were never tested
                self.kept[j] = self.kept[j] * fade + (j < m)
                self.seen[j] = self.seen[j] * fade + 1.0
        if self.steps > 1:  # the first pass pays warm-up (a Numba compile of its shapes, a cold cache)
            self.fit = [a * fade for a in self.fit]
            for i, v in enumerate((1.0, rows, verify_s, rows * rows, rows * verify_s)):
                self.fit[i] += v
        depth = max((len(d.tokens) for d in drafts), default=0)
        if depth:
            per = draft_s / depth
            self.draft_per_depth = per if self.draft_per_depth is None else 0.8 * self.draft_per_depth + 0.2 * per

    def summary(self) -> dict:
        line = self.verify_line()
        return {"chosen_k": {str(k): n for k, n in sorted(self.chosen.items())},
                "acceptance": [round(a, 3) for a in self.acceptance()],
                "verify_ms": None if line is None else {"per_pass": 1000 * line[0], "per_row": 1000 * line[1]},
                "draft_ms_per_depth": None if self.draft_per_depth is None else 1000 * self.draft_per_depth}
