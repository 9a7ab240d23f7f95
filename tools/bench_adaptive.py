"""Adaptive draft length vs every fixed k vs plain decoding, on the shipped model.

    python tools/bench_adaptive.py [--backend numpy] [--prompts 12] [--max-new 128] [--repeats 5] [--p-min P] [--json]

Held-out prompts (the training corpus's held-out files, as tools/eval_tiny.py picks them) and one
adversarial prompt where MTP drafts fail (random token ids: the model's continuation of noise is hard
to predict). For each method, greedy generation of --max-new tokens per prompt; tokens/s counts emitted
tokens over decode time (prefill excluded, it is the same for every method). Methods are interleaved
inside each repeat and the median over repeats is reported, so a burst of load hits all of them alike.

    plain          one target pass per token
    mtp_k1..k8     MTP drafting with a fixed k
    mtp_adaptive   per step a plain step or drafting up to 8, each step ending where the head's confidence
                   says the next draft does not pay (tinyspec/fast/adaptive.py keep_drafting), a fresh policy per
                   generation, as `python -m tinyspec generate --spec mtp` runs by default

Every speculative output is checked equal to the plain one. The summary compares the adaptive policy with the
best fixed k on these prompts (picked after measuring them: the largest of 8 noisy medians; also per repeat, the
adaptive's rate over that k's in the same repeat) and with the fixed k picked on the other half of the prompts
(2-fold: even / odd prompts), as a user would have to pick it. 12 prompts x 128 tokens by default (until LESSONS
19: 6 x 64, where a generation is ~15 steps, the policy's learning a larger share of it, and one run moved the
ratios by 5%). tools/replay_adaptive.py measures the same policies on recorded drafts without timing noise.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))

from tinyspec.backends import load_model  # noqa: E402
from tinyspec.fast.adaptive import AdaptiveDraftLength  # noqa: E402
from tinyspec.generate import generate, speculative_generate  # noqa: E402
from tinyspec.mtp import MTPDrafter  # noqa: E402
from tinyspec.tokenizer import Tokenizer  # noqa: E402

ASSETS = REPO / "tinyspec" / "assets"
FIXED = tuple(range(1, 9))


def run(model, method: str, prompt: list[int], max_new: int, p_min: float = 0.0) -> tuple[list[int], float, dict]:
    """(tokens, decode seconds, stats) of one greedy generation (p_min: MTPDrafter's, for every MTP method)."""
    if method == "plain":
        r = generate(model, prompt, max_new)
        return r.tokens, r.stats["decode_s"], {}
    if method == "mtp_adaptive":
        drafter = MTPDrafter(model, p_min=p_min)
        spec = speculative_generate(model, drafter, prompt, max_new,
                                    policy=AdaptiveDraftLength.for_drafter(drafter, max(FIXED)))
    else:
        spec = speculative_generate(model, MTPDrafter(model, p_min=p_min), prompt, max_new, int(method[len("mtp_k"):]))
    s = spec.stats
    return spec.tokens, s.wall_s - s.phase_s["prefill"], s.as_dict()


def measure(model, prompts: list[list[int]], max_new: int, repeats: int, p_min: float = 0.0) -> dict:
    methods = ["plain"] + [f"mtp_k{k}" for k in FIXED] + ["mtp_adaptive"]
    plain = {i: generate(model, p, max_new).tokens for i, p in enumerate(prompts)}
    per_repeat = {m: [] for m in methods}
    cells = {m: [] for m in methods}  # per repeat, per prompt: (tokens, seconds)
    extra = {m: {"steps": 0, "emitted": 0, "accepted": 0, "drafted": 0, "chosen_k": {}} for m in methods}
    identical = True
    for r in range(repeats):
        for m in methods:
            tokens_total, seconds = 0, 0.0
            cells[m].append([])
            for i, p in enumerate(prompts):
                tokens, dt, stats = run(model, m, p, max_new, p_min)
                identical &= tokens == plain[i]
                cells[m][-1].append((len(tokens), dt))
                tokens_total, seconds = tokens_total + len(tokens), seconds + dt
                if r == 0 and stats:
                    e = extra[m]
                    for key in ("steps", "emitted", "accepted", "drafted"):
                        e[key] += stats[key]
                    for k, n in stats.get("adaptive", {}).get("chosen_k", {}).items():
                        e["chosen_k"][k] = e["chosen_k"].get(k, 0) + n
            per_repeat[m].append(tokens_total / seconds)
    out = {}
    base = statistics.median(per_repeat["plain"])
    for m in methods:
        tok_s = statistics.median(per_repeat[m])
        out[m] = {"tok_s": tok_s, "vs_plain": tok_s / base}
        e = extra[m]
        if e["steps"]:
            out[m] |= {"tokens_per_step": (e["accepted"] + e["steps"]) / e["steps"],
                       "acceptance_rate": e["accepted"] / e["drafted"] if e["drafted"] else 0.0}
        if e["chosen_k"]:
            out[m]["chosen_k"] = dict(sorted(e["chosen_k"].items()))
    best_fixed = max((f"mtp_k{k}" for k in FIXED), key=lambda m: out[m]["tok_s"])
    per_repeat_ratio = [a / f for a, f in zip(per_repeat["mtp_adaptive"], per_repeat[best_fixed])]
    out["summary"] = {"best_fixed": best_fixed, "identical_to_plain": identical,
                      "adaptive_vs_best_fixed": out["mtp_adaptive"]["tok_s"] / out[best_fixed]["tok_s"],
                      "adaptive_vs_best_fixed_per_repeat": per_repeat_ratio,
                      "adaptive_vs_plain": out["mtp_adaptive"]["vs_plain"]}
    if len(prompts) >= 2:
        out["summary"] |= chosen_elsewhere(cells, len(prompts), repeats)
    return out


def chosen_elsewhere(cells: dict, n_prompts: int, repeats: int) -> dict:
    """The fixed k a user would have picked on other text: the best k on the even-numbered prompts runs the odd
    ones and the other way round (2-fold cross-validation). The best fixed k on the measured prompts themselves
    is the largest of len(FIXED) noisy medians, picked after seeing them: an optimistic bar."""
    halves = [range(0, n_prompts, 2), range(1, n_prompts, 2)]

    def rate(m, r, idx):  # tokens/s of method m in repeat r over the prompts idx
        return sum(cells[m][r][i][0] for i in idx) / sum(cells[m][r][i][1] for i in idx)

    picks = [max((f"mtp_k{k}" for k in FIXED), key=lambda m: statistics.median(rate(m, r, h) for r in range(repeats)))
             for h in halves]
    fixed, adaptive = [], []
    for r in range(repeats):  # the pick of each half runs the other half; tokens and seconds added up
        tok = sum(cells[picks[1 - j]][r][i][0] for j, h in enumerate(halves) for i in h)
        sec = sum(cells[picks[1 - j]][r][i][1] for j, h in enumerate(halves) for i in h)
        fixed.append(tok / sec)
        adaptive.append(rate("mtp_adaptive", r, range(n_prompts)))
    return {"fixed_k_picked_on_the_other_half": picks,
            "adaptive_vs_fixed_k_picked_elsewhere": statistics.median(a / f for a, f in zip(adaptive, fixed))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--target", type=Path, default=ASSETS / "tiny-target.gguf")
    ap.add_argument("--backend", default="numpy", help="numpy (default: fastest on the tiny model), cpu or cuda")
    ap.add_argument("--prompts", type=int, default=12, help="held-out prompts (12)")
    ap.add_argument("--max-new", type=int, default=128, help="tokens generated per prompt (128)")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved repeats; medians are reported (5)")
    ap.add_argument("--p-min", type=float, default=0.0,
                    help="every MTP method stops drafting after a draft the head is less sure of (MTPDrafter p_min; 0)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.prompts < 1 or a.max_new < 2 or a.repeats < 1 or not 0 <= a.p_min <= 1:
        ap.error("--prompts and --repeats must be >= 1, --max-new >= 2, --p-min in [0, 1]")
    from eval_tiny import heldout_prompts

    model = load_model(a.target, a.backend)
    tok = Tokenizer.from_gguf(model.metadata)
    held = heldout_prompts(tok, a.prompts, 64)
    noise = [[int(t) for t in np.random.default_rng(s).integers(0, model.cfg.n_vocab - 1, 64)] for s in range(2)]
    report = {"target": str(a.target), "backend": a.backend, "max_new": a.max_new, "repeats": a.repeats,
              "p_min": a.p_min, "heldout": measure(model, held, a.max_new, a.repeats, a.p_min),
              "adversarial": measure(model, noise, a.max_new, a.repeats, a.p_min)}
    if a.json:
        print(json.dumps(report, indent=1))
        return 0
    for name in ("heldout", "adversarial"):
        r = report[name]
        print(f"{name}:")
        for m, v in r.items():
            if m != "summary":
                extra = f"  {v['tokens_per_step']:.2f} tokens/step" if "tokens_per_step" in v else ""
                extra += f"  k chosen {v['chosen_k']}" if "chosen_k" in v else ""
                print(f"  {m:<13} {v['tok_s']:7.1f} tok/s  {v['vs_plain']:.2f}x plain{extra}")
        print(f"  {r['summary']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
