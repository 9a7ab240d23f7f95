"""A/B of the adaptive draft length's prior cost curve on one model: the dense 1 + 0.3 k against the model's own
(expert_union.step_cost_curve: on a mixture of experts, plus the extra experts' bytes of k + 1 verify rows).

    python tools/ab_cost_prior.py --model synth-35b-a3b-4l.gguf [--synth-len 2.95] [--rounds 3] [--json]

Real MTP drafting over a 32k draft vocabulary whose drafts are right at the synthetic rate giving --synth-len
tokens a step at k = 3 (as bench's mtp_synth_adaptive_vocab), for k_max = 3 and 6. Each round runs plain, dense
prior and model prior back to back (round 0 warms up, untimed); speedups are medians of the per-round ratios.
Every run's tokens are checked equal to plain greedy.
"""

from __future__ import annotations

import argparse
import json
import statistics

import numpy as np

from tinyspec.backends import load_model
from tinyspec.fast.adaptive import AdaptiveDraftLength
from tinyspec.fast.draft_vocab import DraftVocab
from tinyspec.fast.synthetic import SyntheticDrafter, acceptance_for_mean_length
from tinyspec.generate import generate
from tinyspec.mtp import MTPDrafter


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--backend", default="cpu")
    p.add_argument("--synth-len", type=float, default=2.95)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-new", type=int, default=128)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    m = load_model(args.model, args.backend)
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, m.cfg.n_vocab, 32)]
    vocab = DraftVocab(np.arange(m.cfg.n_vocab), min(32768, m.cfg.n_vocab), m.cfg.n_vocab)  # id order: timing only
    ref = generate(m, prompt, args.max_new).tokens
    rate = acceptance_for_mean_length(args.synth_len, 3)
    report = {"model": args.model, "synth_len": args.synth_len, "acceptance": rate, "rounds": args.rounds, "k_max": {}}
    for k_max in (3, 6):
        tok_s = {"plain": [], "dense": [], "model": []}
        chosen = {}
        for r in range(args.rounds + 1):
            runs = {"plain": generate(m, prompt, args.max_new)}
            for name in ("dense", "model"):
                drafter = SyntheticDrafter(ref, rate, seed=0, inner=MTPDrafter(m, vocab))
                policy = AdaptiveDraftLength.for_drafter(drafter, k_max, m if name == "model" else None)
                runs[name] = generate(m, prompt, args.max_new, drafter=drafter, policy=policy)
                assert runs[name].tokens == ref, "speculative output differs from plain greedy"
                chosen[name] = runs[name].stats["adaptive"]["chosen_k"]
            if r:
                for name, res in runs.items():
                    tok_s[name].append(res.stats["decode_tok_s" if name == "plain" else "tokens_per_s"])
        report["k_max"][k_max] = {name: {"speedup": statistics.median(a / b for a, b in zip(tok_s[name], tok_s["plain"])),
                                         "chosen_k": chosen[name]} for name in ("dense", "model")}
        report["k_max"][k_max]["plain_tok_s"] = statistics.median(tok_s["plain"])
    if args.json:
        print(json.dumps(report))
    else:
        for k_max, r in report["k_max"].items():
            print(f"k_max {k_max}: plain {r['plain_tok_s']:.1f} tok/s; dense prior {r['dense']['speedup']:.2f}x "
                  f"{r['dense']['chosen_k']}; model prior {r['model']['speedup']:.2f}x {r['model']['chosen_k']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
