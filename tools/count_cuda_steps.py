"""Count what a steady-state step of the cuda backend asks of the host, on the CPU: syncs, uploads and launches per
step, graphs off and on, for plain decoding and each drafter, through the fake CuPy (tests/fake_cupy.py).

    python tools/count_cuda_steps.py            # a table
    python tools/count_cuda_steps.py --json     # the same figures as JSON
    python tools/count_cuda_steps.py --serving  # what the forward graphs did over a stream of requests

The model is the tests' random tiny qwen35 (tests/test_backends.py write_quantized: 4 trunk layers, one of them
attention; a 2-layer draft model), the prompt and k = 3 are tests/test_cuda_syncs.py's, and a step is the span
between two emits after the first two (test_cuda_syncs.count_steps). These are counts, not times: what a launch
costs on a card is what tools/gpu_check.py measures there. LESSONS 26 quotes them.

--serving: REQUESTS requests (prompts of 8-11 tokens, MAX_NEW greedy tokens each, MTP k = 3) through one batch
engine of SLOTS slots in a KV pool, on the shipped tiny model, graphs on: how many forward-pass graphs were
captured, evicted (past cuda_pass.MAX_GRAPHS), replayed, and how many passes ran plainly (a key's first call, a
prefill). A server wants the captures bounded by the shapes it runs, not growing with the requests it serves.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

KINDS = ("plain", "lookup", "mtp", "draft")


def count(kinds=KINDS) -> dict:
    import pytest

    import fake_cupy
    from test_backends import write_quantized
    from test_cuda_syncs import DRAFTERS, count_steps
    from tinyspec import backends
    from tinyspec.backends import load_model

    patch = pytest.MonkeyPatch()
    fake_cupy.install(patch)
    try:
        folder = Path(tempfile.mkdtemp(prefix="tinyspec-counts-"))
        write_quantized(folder / "target.gguf", seed=1)
        write_quantized(folder / "draft.gguf", seed=2, n_trunk=2, interval=2, mtp=False)
        loaded = load_model(folder / "target.gguf", "cuda")
        out = {}
        for kind in kinds:
            for graphs in (False, True):
                model = loaded.with_placement(backends.cuda_placement(graphs=graphs))
                drafter = None if kind == "plain" else DRAFTERS[kind](model, folder)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    steps, _ = count_steps(model, drafter)
                n = len(steps)
                out[f"{kind}, graphs {'on' if graphs else 'off'}"] = {
                    "steps": n, "syncs": sum(s.syncs for s in steps) / n,
                    "uploads": sum(s.uploads for s in steps) / n, "launches": sum(s.launches for s in steps) / n}
        return out
    finally:
        patch.undo()


def serving(requests: int = 48, max_new: int = 40, slots: int = 4) -> dict:
    """The forward graphs' counts (GraphedCall.stats, without the keys) over one stream of requests (module docstring)."""
    import pytest

    import fake_cupy
    from tinyspec import backends
    from tinyspec.backends import load_model
    from tinyspec.batch import batch_generate
    from tinyspec.mtp import MTPDrafter
    from tinyspec.scheduler import EngineOptions

    patch = pytest.MonkeyPatch()
    fake_cupy.install(patch)
    try:
        model = load_model(ROOT / "tinyspec" / "assets" / "tiny-target.gguf", "cuda")
        model = model.with_placement(backends.cuda_placement(graphs=True))
        prompts = [list(range(1 + 5 * i, 9 + 5 * i + i % 4)) for i in range(requests)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            batch_generate(model, prompts, max_new, drafter=MTPDrafter(model), draft_n=3,
                           options=EngineOptions(slots=slots, block_size=8))
        counts = model.placement.graph_counts()["by_use"]["forward"]
        return {"requests": requests, "max_new": max_new, "slots": slots} | {
            k: counts[k] for k in ("captured", "evicted", "replays", "plain", "failed", "pools")}
    finally:
        patch.undo()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--serving", action="store_true", help="count the forward graphs over a stream of requests")
    ap.add_argument("--requests", type=int, default=48, help="--serving: requests (default 48)")
    ap.add_argument("--max-new", type=int, default=40, help="--serving: tokens each (default 40)")
    ap.add_argument("--slots", type=int, default=4, help="--serving: slots (default 4)")
    args = ap.parse_args(argv)
    if args.serving:
        out = serving(args.requests, args.max_new, args.slots)
        print(json.dumps(out, indent=1) if args.json else "  ".join(f"{k} {v}" for k, v in out.items()))
        return 0
    out = count()
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"{'per steady-state step':24s} {'syncs':>6s} {'uploads':>8s} {'launches':>9s}")
        for name, c in out.items():
            print(f"{name:24s} {c['syncs']:6.1f} {c['uploads']:8.1f} {c['launches']:9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
