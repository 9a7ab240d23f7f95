"""Replay draft-length policies on recorded MTP drafts: every policy on the same text, without timing noise.

    python tools/replay_adaptive.py [--backend cpu] [--prompts 12] [--max-new 128] [--depth 16] [--json]

Greedy speculative decoding is deterministic once you know where a step starts. At position t of the plain
greedy output (the pending token is out[t]) the MTP head's chain of drafts d_1..d_D and its probability p_j
of each are fixed: the head's cache holds exactly the kept tokens, whatever steps came before (target rows
are batch-invariant, so the hidden rows it is fed are too). Let m_t be the length of the chain's prefix that
equals out[t+1..]. Then a step that drafts j tokens keeps min(j, m_t) of them, and

    step at t drafting j  ->  emits min(j, m_t) + 1 tokens, the next step starts at t + min(j, m_t) + 1
    its cost T(j):           T(0) a plain step; T(j) = c0 + c1 j for j >= 1

with T measured on this machine (timed steps of fixed-k runs, a least-squares line). One recording of (m_t, p_t)
per position then replays any policy in milliseconds: fixed k, a probability threshold (llama.cpp's
--draft-p-min with --draft-max D), the adaptive policy itself (tinyspec/fast/adaptive.py, fed T(j) as its measured
step times), and the best possible: the step lengths that take the fewest seconds on this trace, found by
dynamic programming over positions with the m_t known, a bound no policy can pass.

tools/bench_adaptive.py measures the same policies with the clock: every repeat moves 2-5% on a shared
machine and its "best fixed k" is the largest of 8 noisy medians. Here the only error is the cost model's
(a line through timed steps; the tool prints it next to the measured means), so differences of 1% between
policies are real differences on this text, and the replay also shows what a policy cannot see: its gap
to the best possible. What the replay leaves out: the policy's own Python (choose, keep_drafting, the
drafter's probability of each draft: ~1-2% of a step on the shipped model), that a step after a plain
one feeds the head the skipped tokens in one pass, and the withdrawal of drafts under the policy's floor
(none of the shipped model's drafts is that low).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))

from tinyspec.backends import load_model  # noqa: E402
from tinyspec.drafting import FixedDraftLength, StopRule  # noqa: E402
from tinyspec.fast.adaptive import AdaptiveDraftLength  # noqa: E402
from tinyspec.generate import speculative_generate  # noqa: E402
from tinyspec.mtp import MTPDrafter  # noqa: E402
from tinyspec.sampling import SamplingParams  # noqa: E402

ASSETS = REPO / "tinyspec" / "assets"


@dataclass
class Trace:
    """One prompt's recording: at position t (pending token tokens[t]) the head's chain keeps kept[t] drafts,
    and probs[t][j] is its probability of draft j + 1."""
    tokens: list[int]  # the plain greedy output, max_new + depth tokens
    kept: list[int]  # [max_new]
    probs: list[list[float]]  # [max_new][depth]


def record(model, prompt: list[int], max_new: int, depth: int) -> Trace:
    """Plain greedy decoding one token at a time; before each token the MTP head drafts `depth` tokens from
    it (then forgets them, as a step that keeps none of its drafts would)."""
    params = SamplingParams()
    state = model.new_state()
    logits, hidden = model.forward(np.array(prompt), state)
    drafter = MTPDrafter(model)
    go_on = StopRule(keep_going=lambda probs: True)  # draft all `depth`, reporting the probability of each
    drafter.start(list(prompt), hidden, depth)
    pending = int(np.argmax(logits[-1]))
    tokens, chains = [pending], []
    for _ in range(max_new + depth):
        draft = drafter.propose(pending, depth, params, None, go_on)
        chains.append(([int(d) for d in draft.tokens], list(draft.probs)))
        logits, hidden = model.forward(np.array([pending]), state)
        drafter.commit([pending], hidden)
        pending = int(np.argmax(logits[-1]))
        tokens.append(pending)
    kept = []
    for t, (drafts, _) in enumerate(chains[:max_new]):
        m = 0
        while m < depth and drafts[m] == tokens[t + 1 + m]:
            m += 1
        kept.append(m)
    return Trace(tokens, kept, [p for _, p in chains[:max_new]])


# ------------------------------------------------------------------------------------------- costs


@dataclass
class Costs:
    plain: float  # seconds of a plain step (a one-token target pass inside the speculative loop)
    c0: float  # T(j) = c0 + c1 j seconds for a step drafting j >= 1
    c1: float
    measured: dict  # k -> mean seconds of a fixed-k step

    def __call__(self, j: int) -> float:
        return self.plain if j == 0 else self.c0 + self.c1 * j


class _Timer(FixedDraftLength):
    """The fixed-k policy, recording each step's drafts and seconds (what the engine tells observe())."""

    def __post_init__(self):
        super().__post_init__()
        self.steps: list[tuple[int, float]] = []  # (drafts, seconds) per step

    def observe(self, drafts, accepted, draft_s, verify_s, rows):
        self.steps.append((len(drafts[0].tokens), draft_s + verify_s))


def measure_costs(model, prompts: list[list[int]], max_new: int, ks=(0, 1, 2, 4, 8), repeats: int = 3) -> Costs:
    """Median step seconds of fixed-k runs (k drafts made, steps cut short at the end left out; each
    generation's first step also pays its warm-up and is left out too), then the line through k >= 1."""
    seconds = {k: [] for k in ks}
    for _ in range(repeats):
        for k in ks:
            for prompt in prompts:
                if k == 0:  # plain steps: the mean step of a run without drafts (nothing timed per step)
                    s = speculative_generate(model, MTPDrafter(model), prompt, max_new, 0).stats
                    seconds[0].append((s.wall_s - s.phase_s["prefill"]) / max(s.steps, 1))
                    continue
                timer = _Timer(k)
                speculative_generate(model, MTPDrafter(model), prompt, max_new, policy=timer)
                seconds[k] += [s for j, s in timer.steps[1:] if j == k]
    measured = {k: statistics.median(v) for k, v in seconds.items() if v}
    xs = [k for k in measured if k > 0]
    c1, c0 = np.polyfit(xs, [measured[k] for k in xs], 1)
    return Costs(measured.get(0, c0), float(c0), float(c1), measured)


# ------------------------------------------------------------------------------------------- replay


def replay(trace: Trace, decide, cost: Costs, max_new: int) -> tuple[float, list[tuple[int, int]]]:
    """(seconds, [(drafts made, drafts kept)] per step) of a generation of max_new tokens in which each step drafts
    j = decide(t, room) tokens (decide may return (j, after) with after(j, n_kept) called once the step is
    known); the first token comes from the prefill, as in speculate.py."""
    t, seconds, made = 0, 0.0, []
    while t + 1 < max_new:
        room = max_new - t - 2
        out = decide(t, room)
        j, after = out if isinstance(out, tuple) else (out, None)
        j = min(j, room, len(trace.probs[t]))
        n = min(j, trace.kept[t])
        seconds += cost(j)
        made.append((j, n))
        if after is not None:
            after(j, n)
        t += n + 1
    return seconds, made


def fixed(trace: Trace, k: int):
    return lambda t, room: k


def threshold(trace: Trace, p_min: float, cap: int):
    """Draft until a draft with probability below p_min (it is still proposed) or cap drafts."""
    def decide(t, room):
        j = 0
        for p in trace.probs[t][:min(cap, room)]:
            j += 1
            if p < p_min:
                break
        return j
    return decide


def best_possible(trace: Trace, cost: Costs, max_new: int) -> float:
    """The fewest seconds any choice of step lengths can take on this trace (each step drafting 0..depth):
    V(t) = min_j T(j) + V(t + min(j, kept[t]) + 1), V(t) = 0 once the generation is complete. It knows which
    drafts will be kept, so no policy reaches it; how far one stays below it is what it could still learn."""
    depth = len(trace.probs[0]) if trace.probs else 0
    v = [0.0] * (max_new + depth + 2)
    for t in range(max_new - 2, -1, -1):
        room = min(depth, max_new - t - 2)
        v[t] = min(cost(j) + v[t + min(j, trace.kept[t]) + 1] for j in range(room + 1))
    return v[0]


def adaptive(trace: Trace, cap: int, cost: Costs):
    """The shipped policy (a fresh one per generation, as generate runs it): choose() sets the cap, keep_drafting
    ends the step by the head's confidence, update() learns from the outcome and T(j)."""
    policy = AdaptiveDraftLength(cap, by_confidence=True)  # the MTP head reports how sure it is

    def decide(t, room):
        k = policy.choose(room)
        probs = []
        for p in trace.probs[t][:k]:
            probs.append(p)
            if not policy.keep_drafting(probs):
                break
        return len(probs), lambda j, n: policy.update(j, n, cost(j), probs if j else None)
    return decide


def compare(traces: list[Trace], cost: Costs, max_new: int, depth: int) -> dict:
    """tokens/s of each policy over all traces, as a ratio to plain decoding."""
    plain_rate = 1.0 / cost(0)

    def ratio(make):
        total = sum(replay(tr, make(tr), cost, max_new)[0] for tr in traces)
        return len(traces) * max_new / total / plain_rate

    out = {"fixed": {k: ratio(lambda tr, k=k: fixed(tr, k)) for k in range(1, depth + 1)}}
    best = max(out["fixed"], key=out["fixed"].get)
    caps = sorted({c for c in (8, depth) if c <= depth})
    out["threshold"] = {f"{p}@{c}": ratio(lambda tr, p=p, c=c: threshold(tr, p, c))
                        for c in caps for p in (0.3, 0.4, 0.5)}
    out["adaptive"] = {c: ratio(lambda tr, c=c: adaptive(tr, c, cost)) for c in caps}
    out["best_possible"] = len(traces) * max_new / sum(best_possible(tr, cost, max_new) for tr in traces) / plain_rate
    out["best_fixed_k"] = best
    out["adaptive_vs_best_fixed"] = {c: v / out["fixed"][best] for c, v in out["adaptive"].items()}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--target", type=Path, default=ASSETS / "tiny-target.gguf")
    ap.add_argument("--backend", default="cpu",
                    help="cpu (default), numpy or cuda: it records the drafts and times the steps")
    ap.add_argument("--prompts", type=int, default=12, help="held-out prompts (12)")
    ap.add_argument("--max-new", type=int, default=128, help="tokens generated per prompt (128)")
    ap.add_argument("--depth", type=int, default=16, help="drafts recorded per position: the longest k replayed (16)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.prompts < 1 or a.max_new < 2 or not 1 <= a.depth <= 32:
        ap.error("--prompts must be >= 1, --max-new >= 2, --depth in 1..32")
    from eval_tiny import heldout_prompts

    from tinyspec.tokenizer import Tokenizer

    model = load_model(a.target, a.backend)
    held = heldout_prompts(Tokenizer.from_gguf(model.metadata), a.prompts, 64)
    noise = [[int(t) for t in np.random.default_rng(s).integers(0, model.cfg.n_vocab - 1, 64)] for s in range(2)]
    t0 = time.perf_counter()
    print(f"timing fixed-k steps on {min(4, len(held))} prompts ...", file=sys.stderr)
    cost = measure_costs(model, held[:4], a.max_new)
    report = {"target": str(a.target), "backend": a.backend, "max_new": a.max_new, "depth": a.depth,
              "costs_ms": {"plain": 1e3 * cost.plain, "c0": 1e3 * cost.c0, "c1": 1e3 * cost.c1,
                           "measured": {k: 1e3 * v for k, v in cost.measured.items()}}}
    for name, prompts in (("heldout", held), ("adversarial", noise)):
        print(f"recording {len(prompts)} {name} prompts x {a.max_new} positions x {a.depth} drafts ...",
              file=sys.stderr)
        traces = [record(model, p, a.max_new, a.depth) for p in prompts]
        report[name] = compare(traces, cost, a.max_new, a.depth)
        report[name]["kept_at_position_1"] = float(np.mean([m > 0 for tr in traces for m in tr.kept]))
    report["seconds"] = time.perf_counter() - t0
    if a.json:
        print(json.dumps(report, indent=1))
        return 0
    c = report["costs_ms"]
    print(f"step cost: plain {c['plain']:.3f} ms, drafting j: {c['c0']:.3f} + {c['c1']:.3f} j ms  (measured: "
          + ", ".join(f"k={k} {v:.3f}" for k, v in c["measured"].items()) + ")")
    for name in ("heldout", "adversarial"):
        r = report[name]
        print(f"{name} (drafts kept at position 1: {r['kept_at_position_1']:.2f}), tokens/s as a ratio to plain:")
        print("  fixed k    " + " ".join(f"{k}:{v:.3f}" for k, v in r["fixed"].items()))
        print("  threshold  " + " ".join(f"p<{k}:{v:.3f}" for k, v in r["threshold"].items()))
        print("  adaptive   " + " ".join(f"cap {k}: {v:.3f} ({r['adaptive_vs_best_fixed'][k]:.3f} of the best fixed "
                                         f"k = {r['best_fixed_k']})" for k, v in r["adaptive"].items()))
        print(f"  the best possible (knowing which drafts are kept) {r['best_possible']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
