"""Tokens per verify pass of draft trees against chains at the same rows, on the shipped model (greedy).

    python tools/tree_gain.py [--backend cpu] [--ks 2,4,8] [--widths 2,3] [--max-new 128] [--json]
    python tools/tree_gain.py --temperature 1 --seeds 8      # sampled: every run of a prompt with seeds 0..7

For every k (the rows of a pass are k + 1 for a chain of k drafts and for a tree of k nodes alike) and every
prompt of the demo (three code continuations, three "edit this code" prompts whose answers copy their input),
each drafter decodes greedily and we count its tokens and its verify passes. A row of the table is the pooled
tokens per pass (all tokens / all passes) over a prompt set:

    mtp        the MTP head's chain            mtp/W       its tree, up to W guesses a depth
    lookup     prompt lookup's chain           lookup/W    several matches as a tree
    mtp+lookup/W   one tree of both (mixed.py)

Greedy, every run is checked against plain greedy decoding (identical tokens), so a figure is never an inexact
run's; greedy tokens per pass do not depend on timing, so they carry no noise (wall-clock lives in `bench --tree
W`). Sampled, each drafter's runs are its own draws (the law is the target's, not the tokens), so a figure has
the spread of its seeds: the table gives the pooled figure and, in brackets, the lowest and highest of the
per-seed ones.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from tinyspec.assets import TARGET
from tinyspec.backends import load_model
from tinyspec.demo import EDITS, PROMPTS
from tinyspec.drafters import DraftOptions, build_drafter
from tinyspec.generate import generate
from tinyspec.sampling import SamplingParams
from tinyspec.tokenizer import Tokenizer


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="cpu", choices=("numpy", "cpu"))
    ap.add_argument("--ks", default="2,4,8", help="draft budgets (nodes a pass; rows = k + 1)")
    ap.add_argument("--widths", default="2,3", help="tree widths W to try (guesses a node)")
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy (the default); > 0: sampled")
    ap.add_argument("--seeds", type=int, default=1, help="sampled: runs a prompt, seeds 0 .. N-1")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    ks = [int(k) for k in args.ks.split(",")]
    widths = [int(w) for w in args.widths.split(",")]
    model = load_model(TARGET, args.backend)
    tok = Tokenizer.from_gguf(model.metadata)
    sets = {"edit": [tok.encode(a + "\n\n" + b) for a, b in EDITS], "code": [tok.encode(p) for p in PROMPTS]}
    runs = [("mtp", 1), *[("mtp", w) for w in widths], ("lookup", 1), *[("lookup", w) for w in widths],
            *[("mtp+lookup", w) for w in [1] + widths]]
    params = SamplingParams(temperature=args.temperature)
    seeds = range(args.seeds if args.temperature > 0 else 1)
    plain = {name: [generate(model, p, args.max_new, stop_ids=tok.eog_ids).tokens for p in prompts]
             for name, prompts in sets.items()} if params.greedy else {}
    out, spread = {}, {}
    for k in ks:
        for name, prompts in sets.items():
            for kind, w in runs:
                tokens = passes = 0
                per_seed = []
                for seed in seeds:
                    t0, p0 = tokens, passes
                    for i, p in enumerate(prompts):
                        r = generate(model, p, args.max_new, params, rng=np.random.default_rng(seed), stop_ids=tok.eog_ids,
                                     drafter=build_drafter(kind, model, DraftOptions(tree=w)), draft_n=k)
                        if params.greedy and r.tokens != plain[name][i]:
                            raise SystemExit(f"{kind}/{w} k={k}: output differs from plain greedy decoding")
                        tokens, passes = tokens + len(r.tokens), passes + r.stats["steps"]
                    per_seed.append((tokens - t0) / (passes - p0))
                label = kind if w == 1 and kind != "mtp+lookup" else f"{kind}/{w}"
                out.setdefault(str(k), {}).setdefault(name, {})[label] = tokens / passes
                spread.setdefault(str(k), {}).setdefault(name, {})[label] = [min(per_seed), max(per_seed)]
                print(f"k={k} {name:4s} {label:12s} {tokens / passes:.3f} tokens/pass", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps({"backend": args.backend, "max_new": args.max_new, "temperature": args.temperature,
                          "seeds": len(seeds), "tokens_per_pass": out, "per_seed_range": spread}))
        return 0
    for k, by_set in out.items():
        for name, row in by_set.items():
            best = max(row["mtp"], row["lookup"])
            cells = "  ".join(f"{label} {v:.2f}" + ("" if params.greedy else " [{:.2f}-{:.2f}]".format(*spread[k][name][label]))
                              for label, v in row.items())
            trees = "  ".join(f"{label}/mtp {v / row['mtp']:.2f}x" for label, v in row.items() if label.startswith("mtp/"))
            mixed = "  ".join(f"{label}/best {v / best:.2f}x" for label, v in row.items() if label.startswith("mtp+"))
            print(f"k={k} rows={int(k) + 1} {name}: {cells}\n    {trees}  {mixed}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
