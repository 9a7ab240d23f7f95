"""What a speculative step costs on the machine at hand, timed before the generation, so the adaptive draft length
starts from this machine's costs instead of a guess:

    C(k) = S(k) / S(0)                    a step drafting k, in plain steps; C(0) = 1
    S(k) median seconds of a whole engine step drafting k (short generations at k = 0, 1 and 3; a line between)

AdaptiveDraftLength(cost_curve=C) (adaptive.py) weighs E(k), the tokens a step emits, against it from the first
step. Its parts are timed too, for the reader: V(T) a verify pass of T tokens alone (verify_times: the model's ring,
the same post-prompt state) and D one draft. S(k) is more than V(k + 1) + k D: the engine's step also accepts, rolls
back and tells the drafter what was kept (on the shipped model a step of k = 1 measured 1.8 plain steps where
V(2) + D made 1.35), and a policy priced on the parts drafted where it lost.

Why measure instead of assume: the prior 1 + 0.3 k holds where a pass of k + 1 tokens costs about one (weights
streamed from memory, a GPU); the shipped model's weights sit in the CPU's cache, where each extra verify row costs
about 0.2 of a step and each MTP draft a third to a half of one (C(3) = 2.4-2.7 measured on a 2-vCPU VM, the
prior's 1.9), so the policy trusted drafting that lost and learned otherwise only after many steps.

    verify_times(model, prompt, sizes, repeats, tree)   {T: [seconds of each pass]} (bench times these too)
    reset_to(scratch, state)                            a scratch state set back to `state` in place
    measure_step_costs(model, drafter, k_max, prompt)   -> StepCosts(verify, draft, steps)
    StepCosts.curve()                                   C(0..k_max) for the policy
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np

from ..generate import generate
from ..model import Model
from ..state import GDNState


def bushy_tree(n: int, width: int) -> tuple[int, ...]:
    """n nodes, each row up to `width` children, filled breadth first: a tree as wide as `width` allows, the shape
    whose pass differs most from a chain's (every depth's rows in one ragged call, every row's own path)."""
    return tuple((i - 1) // width for i in range(1, n + 1))


def verify_times(model: Model, prompt: list[int], sizes=(1, 2, 4, 8), repeats: int = 5,
                 tree: int | None = None) -> dict[int, list[float]]:
    """{T: seconds of each timed verify pass of T tokens (k = T - 1 drafts)} from the same post-prompt state, with
    the model's ring (Model.new_ring: snapshots written, or the base kept for a replay; a rollback is not part of
    the pass).

    Each size has one scratch state, set back to the post-prompt state before every pass (reset_to: the GDN
    arrays copied in place, the KV truncated), as an engine reuses a sequence's state: the same arrays every
    pass, so on cuda the pass's CUDA graph (keyed by those arrays, fast/cuda_pass.py) is what is timed. Two untimed
    passes per size first: the cache grows to its size, the graph is captured. tree W: the same T tokens as a draft
    tree (bushy_tree(T - 1, W)), with a tree's ring (Model.new_ring(T, tree=True))."""
    state = model.new_state()
    model.forward(np.array(prompt), state)
    window = list(np.random.default_rng(0).integers(0, model.cfg.n_vocab, max(sizes)))
    rings = {T: model.new_ring(T, tree=tree is not None) for T in sizes}
    scratch = {T: state.copy() for T in sizes}
    trees = {T: [bushy_tree(T - 1, tree)] if tree else None for T in sizes}

    def one(T: int) -> float:
        reset_to(scratch[T], state)
        t0 = time.perf_counter()
        model.forward_batch([np.array(window[:T])], [scratch[T]], [rings[T]], trees=trees[T])
        return time.perf_counter() - t0

    for T in sizes:
        one(T), one(T)
    times: dict[int, list[float]] = {T: [] for T in sizes}
    for _ in range(repeats):  # interleaved: a burst of load on a shared machine hits every size alike
        for T in sizes:
            times[T].append(one(T))
    return times


def reset_to(scratch, state) -> None:
    """Set `scratch` (a copy of `state` that ran ahead) back to `state` in place: every GDN layer's window and memory
    copied into the scratch's own arrays, its KV truncated to state.pos (positions below it were never rewritten)."""
    for mine, theirs in zip(scratch.layers, state.layers):
        if isinstance(mine, GDNState):
            np.copyto(mine.conv, theirs.conv)
            np.copyto(mine.ssm, theirs.ssm)
    scratch.truncate_kv(state.pos)


@dataclass(frozen=True)
class StepCosts:
    """Measured costs in seconds: verify[T - 1] a verify pass of T tokens (T = 1..k_max + 1) alone; draft one draft;
    steps {k: median seconds of a whole engine step drafting k} for k = 0 (a plain step), 1 and min(3, k_max)."""

    verify: tuple[float, ...]
    draft: float
    steps: dict

    @property
    def k_max(self) -> int:
        return len(self.verify) - 1

    def curve(self) -> tuple[float, ...]:
        """C(k), k = 0..k_max: a whole step's cost in plain steps, the line through the measured step of k = 1 with
        the slope of the measured steps (k = 1 to the deeper k: a step repeats one draft and one verify row per k
        on a fixed part), but never below what one more draft and one more verify row cost when timed alone
        (D + (V(k_max + 1) - V(2)) / (k_max - 1), medians of repeated passes: two whole steps' difference is the
        noisier figure, and on a busy VM it came out at half the parts'), never falling and above a plain step
        (a noisy timing is lifted, not believed)."""
        plain, ks = self.steps[0], sorted(k for k in self.steps if k)
        lo, hi = ks[0], ks[-1]
        slope = max((self.steps[hi] - self.steps[lo]) / (hi - lo), 0.0) if hi > lo else 0.0
        if self.k_max > 1:
            slope = max(slope, self.draft + (self.verify[-1] - self.verify[1]) / (self.k_max - 1))
        out, top = [1.0], 1.0 + 1e-3
        for k in range(1, self.k_max + 1):
            top = max(top, (self.steps[lo] + slope * (k - lo)) / plain)
            out.append(top)
        return tuple(out)

    def as_dict(self) -> dict:
        return {"verify_ms": [round(1e3 * v, 4) for v in self.verify], "draft_ms": round(1e3 * self.draft, 4),
                "step_ms": {str(k): round(1e3 * v, 4) for k, v in sorted(self.steps.items())},
                "cost_curve": [round(c, 3) for c in self.curve()]}


def measure_step_costs(model: Model, drafter, k_max: int, prompt: list[int], repeats: int = 5,
                       tokens: int = 32) -> StepCosts:
    """StepCosts on this machine now, from `prompt`: verify passes of 1..k_max + 1 tokens (verify_times, medians
    of `repeats`); whole engine steps from generations of `tokens` tokens, plain and with the drafter at a fixed
    k = 1 and k = min(3, k_max) (each run twice, the second timed: the first compiles and allocates), a step's
    median time (the drafts, the verify pass, acceptance, rollback, the drafter's commit: what the policy is
    charged); a draft's mean seconds from the deeper run (0 where the drafter drafted nothing)."""
    if k_max < 1:
        raise ValueError(f"measure_step_costs needs k_max >= 1, got {k_max}")
    room = model.cfg.n_ctx - (k_max + 1) - tokens - 4
    prompt = list(prompt)[-room:] if room > 0 else list(prompt)[:1]
    verify = verify_times(model, prompt, tuple(range(1, k_max + 2)), repeats)
    medians = tuple(statistics.median(verify[T]) for T in range(1, k_max + 2))

    def run(k: int) -> dict:
        for _ in range(2):
            res = generate(model, prompt, tokens, drafter=drafter if k else None, draft_n=k if k else None)
        return res.stats

    steps, draft = {}, 0.0
    for k in sorted({0, 1, min(3, k_max)}):
        stats = run(k)
        steps[k] = stats["step_ms"]["median"] / 1e3
        if k and stats.get("drafted"):
            draft = stats["phase_ms"].get("draft", 0.0) / 1e3 / stats["drafted"]
    return StepCosts(medians, draft, steps)
