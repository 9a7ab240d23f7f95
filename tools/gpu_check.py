"""The device check: what the fake CuPy (tests/fake_cupy.py) cannot tell, in one command for a GPU's first minutes.

    python tools/gpu_check.py OUTDIR                 # all of it, held to 7 minutes (--budget 420; not yet timed on a GPU)
    python tools/gpu_check.py OUTDIR --steps rule,parity --quick --max-new 12    # a part (the CPU dry run's)

Writes OUTDIR/gpu_check.json (every step's result, rewritten after each step) and OUTDIR/gpu_check.log (the
progress lines, each command line run, the tail of every subprocess's output), and bench-0.8b.json /
bench-9b.json beside them. Steps, in order (each with a time limit, cut to what is left of --budget; a failed,
timed-out or skipped step is recorded and the next one still runs):
  versions   CuPy, NumPy, the CUDA runtime and driver, the card and its compute capability
  capture    a raw capture test: argmax, compare, cumprod, sum, take and concatenate captured on a non-blocking
             stream with a private pool (fast/cuda_graphs.GraphedCall), replayed with changed inputs, each replay
             checked against NumPy
  ties       cupy.argmax on a 248,320-wide row with tied maxima: the first index, as NumPy's
  rule       the greedy rule on the device (fast/cuda_accept.DeviceGreedyRule), graphs on and off, against the
             oracle's (placement.accept_greedy) for k = 0..8 on 248,320-wide rows whose maxima are tied, drafts
             given as host ints and as device ids, a rejected draft being a LATER copy of the row's maximum (so
             only the first-index rule accepts the oracle's prefix); and four sequences' rows in one call
  parity     greedy output of the shipped models on cuda equals the oracle's plain greedy output, token for
             token, for plain decoding and every drafter (drafters.py), graphs on and off, one sequence and a
             batch of 4 (batch.batch_generate, 4 slots); the greedy rule's graph counts (captured, failed)
  tests      `pytest -k cuda` on tests/test_cuda_ops.py and tests/test_backends.py: the kernels against the oracles
             (one process, pyproject's xdist options dropped: the GPU machine may have no pytest-xdist)
  bench      `bench --backend cuda` on a random-weight 0.8B Q4_K_M file (synth, made on the CPU in the background
             from the start): decode, verify T = 1..9, MTP at --synth-len 2.95, --slots 1,4,8; its "graphs" counts
  bench_off  the 0.8B file again with `--graphs off` (decode and verify T = 1..9, every launch plain): beside
             bench's figures, what the CUDA graphs (the greedy rule's and the forward passes') save
  serving    `bench --serving --backend cuda --spec mtp` on the shipped tiny target (a small scenario: SERVING_FLAGS):
             every configuration's tokens equal, and what its CUDA graphs did (captured, evicted, failed, replayed,
             plain): a card's captures of a batch engine's passes, with slots reused and the MTP head padded
  bench_9b   the same at the 9B shape, if its file was made and time remains (skipped otherwise, as is a bench
             step whose file the CPU did not finish writing within the step's limit)
  speed      (not in the default list) decode tokens/s of the shipped target, graphs on and off
With no GPU it says so and exits 2; it exits 1 if a step failed, erred or ran out of time, else 0 (a step skipped
for lack of time is not a failure). tests/test_gpu_check.py dry-runs rule and parity through the fake CuPy.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ASSETS = REPO / "tinyspec" / "assets"
PROMPTS = ["def fib(n):", "import os\nimport sys\n\n\ndef main():\n", "class Stack:\n    def __init__(self):\n",
           "for i in range(10):\n    print("]
DRAFTERS = ("none", "mtp", "lookup", "draft")
WIDE_VOCAB = 248320  # Qwen3.5's vocabulary: the width of a real verify row
STEPS = ("versions", "capture", "ties", "rule", "parity", "tests", "bench", "bench_off", "serving", "bench_9b", "speed")
DEFAULT_STEPS = STEPS[:-1]
LIMIT_S = {"versions": 30, "capture": 60, "ties": 30, "rule": 60, "parity": 120, "tests": 180, "bench": 170,
           "bench_off": 60, "serving": 60, "bench_9b": 300, "speed": 120}  # each step's own cap; the budget left
# cuts it further
MIN_S = {"bench": 45, "bench_off": 30, "serving": 20, "bench_9b": 90}  # a bench step with less time than this left is skipped, not started
BENCH_FLAGS = ["--drafters", "", "--verify-sizes", "1..9", "--synth-len", "2.95", "--slots", "1,4,8",
               "--decode-n", "16", "--repeats", "3", "--spec-repeats", "2", "--max-new", "64", "--json"]
BENCH_OFF_FLAGS = ["--graphs", "off", "--drafters", "", "--verify-sizes", "1..9", "--decode-n", "16", "--repeats",
                   "3", "--max-new", "16", "--json"]  # the same file, every launch plain: what the graphs save
SERVING_FLAGS = ["--serving", "--spec", "mtp", "--requests", "8", "--prefix", "64", "--own", "8", "--max-new", "24",
                 "--gap", "2", "--slots", "4", "--chunk", "32", "--block-size", "16", "--json"]
BENCH_9B_FLAGS = ["--drafters", "", "--verify-sizes", "1..9", "--synth-len", "2.95", "--slots", "1,4",
                  "--decode-n", "8", "--repeats", "2", "--spec-repeats", "1", "--max-new", "32", "--json"]


class Log:
    """Progress lines to stderr and to OUTDIR/gpu_check.log (opened by main)."""

    def __init__(self, path: Path | None = None):
        self.file = open(path, "w", encoding="utf-8") if path else None

    def __call__(self, msg: str) -> None:
        line = f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}"
        print(line, file=sys.stderr, flush=True)
        if self.file:
            self.file.write(line + "\n")
            self.file.flush()

    def close(self) -> None:
        if self.file:
            self.file.close()
            self.file = None

    def block(self, title: str, text: str) -> None:
        """A subprocess's output, into the log file only (stderr gets the one-line summary)."""
        if self.file:
            self.file.write(f"--- {title}\n{text.rstrip()}\n--- end of {title}\n")
            self.file.flush()


class StepTimeout(Exception):
    """An in-process step ran past its limit (raised from SIGALRM)."""


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise StepTimeout in this (main) thread after `seconds`: the in-process steps' limit."""
    def expire(signum, frame):
        raise StepTimeout(f"over its limit of {seconds:.0f} s")
    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def child_env() -> dict:
    """The environment of a command this check runs: this checkout first on PYTHONPATH."""
    return os.environ | {"PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}


def run_command(cmd: list[str], limit: float, log: Log, title: str, stdout: Path | None = None) -> dict:
    """cmd in its own process group, killed (the group) after `limit` s; its output tail goes to the log, its
    stdout to `stdout` when given. -> {returncode (None: timed out), seconds, tail}."""
    log(f"{title}: {' '.join(repr(c) if not c or ' ' in c else c for c in cmd)} (limit {limit:.0f} s)")
    t = time.perf_counter()
    out = open(stdout, "w", encoding="utf-8") if stdout else subprocess.PIPE
    p = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.PIPE if stdout else subprocess.STDOUT,
                         text=True, start_new_session=True, env=child_env())
    try:
        text = p.communicate(timeout=limit)[1 if stdout else 0] or ""
        code = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # the process group this call started (pytest workers, if any)
        text = p.communicate()[1 if stdout else 0] or ""
        code = None
    finally:
        if stdout:
            out.close()
    log.block(title, text[-20000:])
    return {"returncode": code, "seconds": round(time.perf_counter() - t, 1), "tail": text[-1500:]}


# --- the steps that need a GPU (or the fake): in this process

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
    counts = call.stats()
    return {"captured": counts["captured"], "failed": counts["reasons"], "replays": counts["replays"],
            "replays_wrong": bad, "ok": counts["captured"] == 1 and counts["replays"] == 5 and not bad}


def ties(cp) -> dict:
    row = np.zeros(WIDE_VOCAB, np.float32)
    row[[7, 1000, WIDE_VOCAB - 1]] = 1.0
    got = int(cp.argmax(cp.asarray(row)))
    return {"argmax": got, "numpy": int(row.argmax()), "ok": got == int(row.argmax())}


def tied_case(rng, k: int, n_vocab: int) -> tuple[np.ndarray, list[int]]:
    """logits [k+1, n_vocab] whose every row has its maximum at 3 places, and k drafts: the first n_right the
    target's own choices (the FIRST of each row's maxima), then a later copy of that row's maximum (the oracle
    rejects it: same value, not the first index), then random ids."""
    logits = rng.standard_normal((k + 1, n_vocab)).astype(np.float32)
    places = np.sort([rng.choice(n_vocab, 3, replace=False) for _ in range(k + 1)], axis=1)  # [k+1, 3]
    for i, where in enumerate(places):
        logits[i, where] = 10.0
    n_right = int(rng.integers(0, k + 1))
    drafts = [int(places[i, 0]) for i in range(n_right)]
    if n_right < k:
        drafts.append(int(places[n_right, 1]))  # tied with the maximum, but not its first index: rejected
    drafts += [int(t) for t in rng.integers(0, n_vocab, k - len(drafts))]
    return logits, drafts


def rule(cp, n_vocab: int = WIDE_VOCAB, trials: int = 3) -> dict:
    from tinyspec.fast.cuda_accept import DeviceGreedyRule
    from tinyspec.placement import accept_greedy

    rng = np.random.default_rng(0)
    out = {"cases": 0, "wrong": [], "graphs": None}
    for graphs in (True, False):
        accept = DeviceGreedyRule(cp, cp.asnumpy, graphs=graphs)
        for k in range(9):
            for _ in range(trials):  # the same (k + 1, N) shape again: a warm-up, a capture, replays
                logits, drafts = tied_case(rng, k, n_vocab)
                bounds = np.array([0, k + 1])
                [want] = accept_greedy(logits, bounds, [drafts])
                dev = cp.asarray(logits)
                for given in (drafts, cp.asarray(np.array(drafts, dtype=np.int64))):
                    [got] = accept(dev, bounds, [given])
                    out["cases"] += 1
                    if got != want:
                        out["wrong"].append({"graphs": graphs, "k": k, "want": want, "got": got})
        # four sequences' verify rows in one call: each its own run, in one transfer
        cases = [tied_case(rng, k, n_vocab) for k in (0, 3, 8, 5)]
        logits = np.concatenate([c[0] for c in cases])
        bounds = np.cumsum([0] + [len(c[0]) for c in cases])
        want = accept_greedy(logits, bounds, [c[1] for c in cases])
        got = accept(cp.asarray(logits), bounds, [c[1] for c in cases])
        out["cases"] += 1
        if got != want:
            out["wrong"].append({"graphs": graphs, "batch": True, "want": want, "got": got})
        if graphs:
            out["graphs"] = accept.graph_counts()
    out["ok"] = not out["wrong"] and out["graphs"]["captured"] == 9 and not out["graphs"]["failed"]
    return out


def cuda_model(path: Path, graphs: bool):
    """The file on the cuda backend, its greedy rule replayed from CUDA graphs or launched plainly."""
    from tinyspec.backends import cuda_placement, load_model

    return load_model(path, "cuda").with_placement(cuda_placement(graphs=graphs))


def parity(quick: bool, max_new: int) -> dict:
    """Every drafter's greedy tokens on cuda against the oracle's PLAIN greedy tokens (greedy speculation emits
    exactly the target's greedy output, so one oracle run per prompt is the reference for all of them)."""
    from tinyspec.backends import load_model
    from tinyspec.batch import batch_generate
    from tinyspec.scheduler import EngineOptions
    from tinyspec.drafters import DraftOptions, build_drafter
    from tinyspec.generate import generate
    from tinyspec.tokenizer import Tokenizer

    target, draft = ASSETS / "tiny-target.gguf", ASSETS / "tiny-draft.gguf"
    oracle = load_model(target, "numpy")
    tok = Tokenizer.from_gguf(oracle.metadata)
    prompts = [tok.encode(p) for p in PROMPTS]
    want = [generate(oracle, p, max_new).tokens for p in prompts]
    solo = range(1) if quick else range(len(prompts))
    out = {"runs": 0, "batch_runs": 0, "mismatches": [], "graphs": {}}
    for graphs in (True, False):
        m, d = cuda_model(target, graphs), cuda_model(draft, graphs)
        options = DraftOptions(draft_model=d)
        for spec in DRAFTERS:
            draft_n = None if spec == "none" else 3
            for i in solo:
                got = generate(m, prompts[i], max_new, drafter=build_drafter(spec, m, options), draft_n=draft_n).tokens
                out["runs"] += 1
                if got != want[i]:
                    out["mismatches"].append({"graphs": graphs, "spec": spec, "prompt": i, "want": want[i], "got": got})
            if quick and not graphs:  # a batch's rule launches plainly with graphs on too (cuda_accept)
                continue
            batch = batch_generate(m, prompts, max_new, drafter=build_drafter(spec, m, options), draft_n=draft_n,
                                   options=EngineOptions(slots=4))
            out["batch_runs"] += 1
            for i, seq in enumerate(batch.sequences):
                if seq.tokens != want[i]:
                    out["mismatches"].append({"graphs": graphs, "spec": spec, "batch": True, "prompt": i,
                                              "want": want[i], "got": seq.tokens, "error": seq.error})
        out["graphs"][f"graphs_{'on' if graphs else 'off'}"] = m.placement.graph_counts()
    on = out["graphs"]["graphs_on"]
    forward = on.get("by_use", {}).get("forward", {})  # the forward passes' graphs (fast/cuda_pass.py)
    out["ok"] = not out["mismatches"] and on["captured"] > 0 and not on["failed"] and forward.get("captured", 0) > 0
    return out


def speed() -> dict:
    from tinyspec.generate import generate
    from tinyspec.mtp import MTPDrafter
    from tinyspec.tokenizer import Tokenizer

    target = ASSETS / "tiny-target.gguf"
    out = {}
    for graphs in (False, True):
        m = cuda_model(target, graphs)
        prompt = Tokenizer.from_gguf(m.metadata).encode(PROMPTS[0])
        generate(m, prompt, 16)  # warm: kernels compiled
        generate(m, prompt, 16, drafter=MTPDrafter(m), draft_n=3)  # and the rule's graphs captured
        rates = {}
        for spec in ("none", "mtp"):
            tps = []
            for _ in range(3):
                t = time.perf_counter()
                n = len(generate(m, prompt, 128, drafter=MTPDrafter(m) if spec == "mtp" else None,
                                 draft_n=3 if spec == "mtp" else None).tokens)
                tps.append(n / (time.perf_counter() - t))  # wall clock, prefill included
            rates[spec] = {"median": round(statistics.median(tps), 1), "min": round(min(tps), 1),
                           "max": round(max(tps), 1)}
        out[f"graphs_{'on' if graphs else 'off'}"] = rates
    return out


# --- the steps that run a command: a subprocess each, killed at its limit

def tests_command() -> list[str]:
    """The GPU tests in one process, whatever the machine has installed: `-o addopts=` drops pyproject's
    `-n auto --dist worksteal` (pytest-xdist's flags), which a pytest without xdist refuses (exit 4) before it
    runs a single test."""
    return [sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-p", "no:cacheprovider", "-rfE",
            "tests/test_cuda_ops.py", "tests/test_backends.py", "-k", "cuda"]


def tests(limit: float, log: Log) -> dict:
    res = run_command(tests_command(), limit, log, "tests")
    summary = [line.strip("= ") for line in res["tail"].splitlines() if re.search(r"\bin [0-9.]+s\b", line)]
    summary = summary[-1] if summary else None  # "12 passed, 3 skipped in 40.1s"
    return res | {"summary": summary, "ok": res["returncode"] == 0 and summary is not None and "passed" in summary}


def part_file(path: Path) -> Path:
    return path.with_name(path.stem + ".part.gguf")


def start_synth(shape: str, path: Path, outdir: Path, log: Log) -> subprocess.Popen | None:
    """The random-weight file for a bench step, written on the CPU in the background (to part_file(path), renamed
    when done; its progress to OUTDIR/synth-SHAPE.log); None if the file is there already (seed 0: the same)."""
    if path.is_file():
        log(f"synth {shape}: {path} is there already")
        return None
    cmd = [sys.executable, "-m", "tinyspec", "synth", "--shape", shape, "--quant", "q4_k_m", "-o", str(part_file(path))]
    log(f"synth {shape} in the background: {' '.join(cmd)}")
    with open(outdir / f"synth-{shape}.log", "w", encoding="utf-8") as progress:  # the child keeps its own handle
        return subprocess.Popen(cmd, cwd=REPO, stdout=progress, stderr=subprocess.STDOUT, start_new_session=True,
                                env=child_env())


def bench_step(shape: str, synth: subprocess.Popen | None, path: Path, flags: list[str], outdir: Path,
               limit: float, log: Log, name: str | None = None) -> dict:
    """Wait for the synth file (within the limit), then `bench --backend cuda` on it -> OUTDIR/bench-NAME.json
    (NAME: the shape unless given)."""
    t = time.perf_counter()
    if synth is not None and synth.poll() is None:
        log(f"bench {shape}: waiting for its synth file")
        try:
            synth.wait(timeout=limit)
        except subprocess.TimeoutExpired:  # not this step's failure: the CPU wrote the file too slowly
            return {"skipped": f"the {shape} synth file was not written within {limit:.0f} s"}
    if synth is not None and not path.is_file():
        if synth.returncode != 0:
            return {"error": f"synth {shape} failed (exit {synth.returncode}): see synth-{shape}.log", "ok": False}
        part_file(path).rename(path)
    if not path.is_file():
        return {"error": f"no synth file {path}", "ok": False}
    left = limit - (time.perf_counter() - t)
    json_path = outdir / f"bench-{name or shape}.json"
    res = run_command([sys.executable, "-m", "tinyspec", "bench", "--model", str(path), "--backend", "cuda", *flags],
                      left, log, f"bench {shape}", stdout=json_path)
    out = res | {"json": json_path.name, "ok": res["returncode"] == 0}
    return (out | bench_summary(json.loads(json_path.read_text()))) if out["ok"] else out


def serving_step(outdir: Path, limit: float, log: Log) -> dict:
    """`bench --serving --backend cuda` on the shipped target -> OUTDIR/bench-serving.json, and per configuration its
    tok/s and CUDA graph counts; ok: it ran (bench --serving raises if a configuration changed a token) and no
    capture failed."""
    json_path = outdir / "bench-serving.json"
    res = run_command([sys.executable, "-m", "tinyspec", "bench", "--model", str(ASSETS / "tiny-target.gguf"),
                       "--backend", "cuda", *SERVING_FLAGS], limit, log, "serving", stdout=json_path)
    if res["returncode"] != 0:
        return res | {"ok": False}
    configs = json.loads(json_path.read_text())["configs"]
    graphs = {name: c["graphs"] for name, c in configs.items()}
    return res | {"json": json_path.name, "tok_s": {name: round(c["tok_s"], 1) for name, c in configs.items()},
                  "graphs": graphs, "ok": all(g is not None and g["failed"] == 0 for g in graphs.values())}


def bench_summary(report: dict) -> dict:
    """The figures of a bench report (its full JSON is in its own file) and whether it holds: every speculative
    output identical to plain, the greedy rule's graphs reported (a cuda run) and none failed."""
    graphs = report["graphs"]
    identical = [s["identical"] for s in report["spec"].values()] + [s["identical"]
                                                                      for s in report.get("slots", {}).values()]
    return {"decode_tok_s": report["decode_tok_s"], "verify_cost_ratio": report["verify_cost_ratio"],
            "spec": {k: {"tok_s": v["tok_s"], "speedup": v["speedup"],
                         "mean_accepted_length": v["mean_accepted_length"]} for k, v in report["spec"].items()},
            "slots": {B: {"plain_tok_s": s["plain_tok_s"], "spec_tok_s": s["spec_tok_s"], "speedup": s["speedup"]}
                      for B, s in report.get("slots", {}).items()},
            "graphs": graphs, "checks": report["checks"],
            "ok": all(identical) and graphs is not None and graphs["failed"] == 0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("outdir", type=Path, help="folder for gpu_check.json, gpu_check.log and the bench reports")
    ap.add_argument("--steps", default=",".join(DEFAULT_STEPS),
                    help=f"comma-separated steps to run, in this order: {', '.join(STEPS)} (default: all but speed)")
    ap.add_argument("--budget", type=float, default=420.0,
                    help="seconds for the whole run (420: 7 minutes); each step's limit is cut to what is left")
    ap.add_argument("--quick", action="store_true", help="parity: one prompt per drafter alone instead of four, "
                    "and the batch of 4 with graphs on only (its rule launches plainly either way); rule: two cases "
                    "per k instead of three")
    ap.add_argument("--max-new", type=int, default=48, help="parity: tokens per run (48)")
    ap.add_argument("--synth-dir", type=Path, default=Path("/tmp"),
                    help="where the bench steps' synth files are written or found (/tmp)")
    ap.add_argument("--json-name", default="gpu_check.json", help="file name in OUTDIR (gpu_check.json)")
    args = ap.parse_args(argv)
    chosen = [s for s in args.steps.split(",") if s]
    if unknown := set(chosen) - set(STEPS):
        ap.error(f"--steps: unknown {sorted(unknown)}; choose from {', '.join(STEPS)}")
    from tinyspec import backends

    if not backends.cuda_available():
        print("gpu_check: no CUDA device (cupy and a GPU are needed)", file=sys.stderr)
        return 2
    import cupy as cp

    args.outdir.mkdir(parents=True, exist_ok=True)
    log = Log(args.outdir / Path(args.json_name).with_suffix(".log").name)
    t0 = time.perf_counter()
    files = {shape: args.synth_dir / f"tinyspec-synth-{shape}-q4_k_m.gguf" for shape in ("0.8b", "9b")}
    needs = {"0.8b": {"bench", "bench_off"}, "9b": {"bench_9b"}}  # the bench steps that read each shape's file
    synths = {shape: start_synth(shape, files[shape], args.outdir, log)  # on the CPU, while the GPU steps run
              for shape, steps_ in needs.items() if steps_ & set(chosen)}
    steps = {"versions": lambda limit: versions(cp), "capture": lambda limit: capture(cp),
             "ties": lambda limit: ties(cp), "rule": lambda limit: rule(cp, trials=2 if args.quick else 3),
             "parity": lambda limit: parity(args.quick, args.max_new), "speed": lambda limit: speed(),
             "tests": lambda limit: tests(limit, log), "serving": lambda limit: serving_step(args.outdir, limit, log),
             "bench": lambda limit: bench_step("0.8b", synths.get("0.8b"), files["0.8b"], BENCH_FLAGS, args.outdir,
                                               limit, log),
             "bench_off": lambda limit: bench_step("0.8b", synths.get("0.8b"), files["0.8b"], BENCH_OFF_FLAGS,
                                                   args.outdir, limit, log, name="0.8b-graphs-off"),
             "bench_9b": lambda limit: bench_step("9b", synths.get("9b"), files["9b"], BENCH_9B_FLAGS, args.outdir,
                                                  limit, log)}
    in_process = {"versions", "capture", "ties", "rule", "parity", "speed"}
    report: dict = {"budget_s": args.budget, "status": {}}
    try:
        for name in [s for s in STEPS if s in chosen]:
            left = args.budget - (time.perf_counter() - t0)
            limit = min(LIMIT_S[name], left - 5)
            t = time.perf_counter()
            if limit < MIN_S.get(name, 5):
                report[name], status = {"skipped": f"{left:.0f} s of the budget left"}, "skipped"
            else:
                try:
                    with time_limit(limit) if name in in_process else contextlib.nullcontext():
                        report[name] = steps[name](limit)
                    status = "skipped" if "skipped" in report[name] else \
                        "ok" if report[name].get("ok", True) else "FAILED"
                    if report[name].get("returncode", 0) is None:
                        status = "timeout"
                except StepTimeout as exc:
                    report[name], status = {"error": f"StepTimeout: {exc}"}, "timeout"
                except Exception as exc:  # noqa: BLE001 - a failed step is a finding: record it, run the next one
                    report[name] = {"error": f"{type(exc).__name__}: {exc}",
                                    "traceback": traceback.format_exc()[-3000:]}
                    status = "error"
            report[name + "_s"] = round(time.perf_counter() - t, 1)
            report["status"][name] = status
            log(f"{name} ({status}, {report[name + '_s']} s): {json.dumps(report[name], default=str)[:400]}")
            (args.outdir / args.json_name).write_text(json.dumps(report, indent=1, default=str))
        report["total_s"] = round(time.perf_counter() - t0, 1)
        (args.outdir / args.json_name).write_text(json.dumps(report, indent=1, default=str))
        log(f"done in {report['total_s']} s: {report['status']}")
    finally:
        for p in synths.values():  # a synth still running when the check ends: this run started it, this run ends it
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        log.close()
    return 1 if any(s not in ("ok", "skipped") for s in report["status"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
