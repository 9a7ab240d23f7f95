"""A short check of the cuda backend on a real GPU: what the fake CuPy (tests/fake_cupy.py) cannot tell.

    python tools/gpu_check.py OUTDIR [--quick]       # writes OUTDIR/gpu_check.json, progress on stderr

Runs in about two minutes on an H100 (the rest of a device lease can go to bench or training):
  versions     CuPy, NumPy, the CUDA runtime and driver, the card and its compute capability
  capture      a raw capture test: argmax, compare, cumprod, sum, take and concatenate captured on a
               non-blocking stream with a private pool (fast/cuda_graphs.GraphedCall), replayed with changed
               inputs, each replay checked against NumPy
  ties         cupy.argmax on a 248,320-wide row with tied maxima: the first index, as NumPy's (greedy parity
               on a real vocabulary depends on it)
  parity       greedy output of the shipped models on cuda equals the numpy oracle's, token for token, for
               plain decoding and every drafter (mtp, lookup, draft model), graphs on and off; the greedy
               rule's graphs captured and failed, by shape
  speed        decode tokens/s of the shipped target on cuda, graphs on and off (median of 3 runs, with spread)
With no GPU it says so and exits 2. Every step is recorded even when one fails (its error in the JSON).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ASSETS = REPO / "tinyspec" / "assets"
PROMPTS = ["def fib(n):", "import os\nimport sys\n\n\ndef main():\n", "class Stack:\n    def __init__(self):\n"]


def say(msg: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def versions(cp) -> dict:
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    return {"cupy": cp.__version__, "numpy": np.__version__, "python": sys.version.split()[0],
            "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(), "cuda_driver": cp.cuda.runtime.driverGetVersion(),
            "device": props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"]),
            "compute_capability": dev.compute_capability, "sms": props["multiProcessorCount"],
            "memory_gib": round(props["totalGlobalMem"] / 2**30, 1)}


def capture(cp) -> dict:
    from tinyspec.fast.cuda_graphs import GraphedCall

    def fn(logits, drafts):  # the shape of the greedy rule's work, in the six operations it uses
        best = cp.argmax(logits, axis=1)  # [T]
        same = (best[:-1] == drafts).astype(cp.int64)
        kept = cp.cumprod(same).sum()
        tok = cp.take(best, kept)
        return cp.concatenate([kept[None], tok[None], best])

    def oracle(logits, drafts):
        best = logits.argmax(axis=1)
        kept = int(np.cumprod(best[:-1] == drafts).sum())
        return np.concatenate([[kept, best[kept]], best])

    call, rng, bad = GraphedCall(fn, cp, enabled=True), np.random.default_rng(0), 0
    for i in range(6):
        logits = rng.standard_normal((5, 4096)).astype(np.float32)
        drafts = logits.argmax(axis=1)[:-1].copy()
        drafts[rng.integers(0, 4):] = -1  # a different accepted prefix each replay
        got = cp.asnumpy(call(cp.asarray(logits), cp.asarray(drafts)))
        bad += int(not np.array_equal(got, oracle(logits, drafts)))
    return {"captured": len(call.graphs), "failed": call.failed, "replays_wrong": bad}


def ties(cp) -> dict:
    row = np.zeros(248320, np.float32)
    row[[7, 1000, 248319]] = 1.0
    got = int(cp.argmax(cp.asarray(row)))
    return {"argmax": got, "numpy": int(row.argmax()), "ok": got == int(row.argmax())}


def run_greedy(model, tok, prompt: str, spec: str, draft_model=None, max_new: int = 48) -> tuple[list[int], dict]:
    from tinyspec.draft import DraftModelDrafter
    from tinyspec.generate import generate
    from tinyspec.lookup import LookupDrafter
    from tinyspec.mtp import MTPDrafter

    drafter = {"none": lambda: None, "mtp": lambda: MTPDrafter(model), "lookup": LookupDrafter,
               "draft": lambda: DraftModelDrafter(draft_model, target=model)}[spec]()
    res = generate(model, tok.encode(prompt), max_new, drafter=drafter, draft_n=None if spec == "none" else 3)
    return res.tokens, res.stats


def cuda_model(path: Path, graphs: bool):
    """The file on the cuda backend, its greedy rule replayed from CUDA graphs or launched plainly."""
    from tinyspec.backends import cuda_kernels, load_model

    return load_model(path, "cuda").with_kernels(cuda_kernels(graphs=graphs))


def parity(quick: bool) -> dict:
    from tinyspec.backends import load_model
    from tinyspec.tokenizer import Tokenizer

    target, draft = ASSETS / "tiny-target.gguf", ASSETS / "tiny-draft.gguf"
    oracle_t, oracle_d = load_model(target, "numpy"), load_model(draft, "numpy")
    tok = Tokenizer.from_gguf(oracle_t.metadata)
    prompts = PROMPTS[:1] if quick else PROMPTS
    out = {"runs": 0, "mismatches": [], "graphs": {}}
    for graphs in (True, False):
        m, d = cuda_model(target, graphs), cuda_model(draft, graphs)
        for spec in ("none", "mtp", "lookup", "draft"):
            for p in prompts:
                want, _ = run_greedy(oracle_t, tok, p, spec, oracle_d)
                got, _ = run_greedy(m, tok, p, spec, d)
                out["runs"] += 1
                if got != want:
                    out["mismatches"].append({"graphs": graphs, "spec": spec, "prompt": p, "want": want, "got": got})
        rule = m.kernels.accept_greedy.graphs
        out["graphs"][f"graphs_{'on' if graphs else 'off'}"] = {
            "captured": [str(k) for k in rule.graphs], "failed": {str(k): v for k, v in rule.failed.items()}}
    out["ok"] = not out["mismatches"]
    return out


def speed() -> dict:
    from tinyspec.tokenizer import Tokenizer

    target = ASSETS / "tiny-target.gguf"
    out = {}
    for graphs in (False, True):
        m = cuda_model(target, graphs)
        tok = Tokenizer.from_gguf(m.metadata)
        run_greedy(m, tok, PROMPTS[0], "none", max_new=16)  # warm: kernels compiled, graphs captured
        rates = {}
        for spec in ("none", "mtp"):
            tps = []
            for _ in range(3):
                t = time.perf_counter()
                tokens, _ = run_greedy(m, tok, PROMPTS[0], spec, max_new=128)
                tps.append(len(tokens) / (time.perf_counter() - t))  # wall clock, prefill included
            rates[spec] = {"median": round(statistics.median(tps), 1), "min": round(min(tps), 1),
                           "max": round(max(tps), 1)}
        out[f"graphs_{'on' if graphs else 'off'}"] = rates
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("outdir", type=Path, help="folder for gpu_check.json")
    ap.add_argument("--quick", action="store_true", help="one prompt per drafter instead of three")
    ap.add_argument("--steps", default="versions,capture,ties,parity,speed",
                    help="comma-separated steps to run (default: all); speed wants the GPU to itself")
    ap.add_argument("--json-name", default="gpu_check.json", help="file name in OUTDIR (gpu_check.json)")
    args = ap.parse_args(argv)
    names = ("versions", "capture", "ties", "parity", "speed")
    chosen = [s for s in args.steps.split(",") if s]
    if unknown := set(chosen) - set(names):
        ap.error(f"--steps: unknown {sorted(unknown)}; choose from {', '.join(names)}")
    from tinyspec import backends

    if not backends.cuda_available():
        print("gpu_check: no CUDA device (cupy and a GPU are needed)", file=sys.stderr)
        return 2
    import cupy as cp

    steps = {"versions": lambda: versions(cp), "capture": lambda: capture(cp), "ties": lambda: ties(cp),
             "parity": lambda: parity(args.quick), "speed": speed}
    args.outdir.mkdir(parents=True, exist_ok=True)
    report, t0 = {}, time.perf_counter()
    for name in chosen:
        step = steps[name]
        t = time.perf_counter()
        try:
            report[name] = step()
        except Exception as exc:  # noqa: BLE001 - a failed step is a finding: record it, run the next one
            report[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
        report[name + "_s"] = round(time.perf_counter() - t, 1)
        say(f"{name}: {json.dumps(report[name])[:400]}")
        (args.outdir / args.json_name).write_text(json.dumps(report, indent=1, default=str))
    say(f"done in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
