"""llama.cpp's numbers on a GGUF, measured the way `python -m tinyspec bench` measures tinyspec's, for side-by-side rows.

    python tools/bench_llamacpp.py --build BUILD --model FILE [--threads 2] [--synth-len 2.95 --draft-n 3] [--json]

BUILD is a CMake build of llama.cpp (e.g. the tree vendored in the llama-cpp-python 0.3.36 sdist:
`cmake -B build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF && cmake --build build --target llama-bench llama-server`).
Reports, in one run:

    decode_tok_s       llama-bench tg (generation of -n tokens after an empty prompt), mean over -r runs
    verify_cost_ratio  llama-bench pp of T = 1..9 tokens (one batch of T: what a verify pass of k = T - 1 drafts
                       does) as time / the T = 1 time (k = 0..8, tinyspec bench's key)
    spec               llama-server greedy completions of --max-new tokens from a fixed prompt: plain (--spec-type
                       none) and draft-mtp with --spec-synth-len L (synthetic acceptance: the verifier accepts a draft
                       with the per-position rate giving L tokens a step, whatever the target says), tok/s from the
                       server's own timings (predicted_per_second), medians of --repeats, each pair back to back

The comparison is only fair on a quiet machine with the same thread count for both engines (LESSONS 18).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def llama_bench(build: Path, model: str, threads: int, sizes: range, n_gen: int, repeats: int) -> dict:
    cmd = [str(build / "bin" / "llama-bench"), "-m", model, "-t", str(threads), "-p", ",".join(map(str, sizes)),
           "-n", str(n_gen), "-r", str(repeats), "-o", "json"]
    rows = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    pass_s = {r["n_prompt"]: r["n_prompt"] / r["avg_ts"] for r in rows if r["n_prompt"] and not r["n_gen"]}
    tg = next(r for r in rows if r["n_gen"] and not r["n_prompt"])
    return {"decode_tok_s": tg["avg_ts"], "decode_tok_s_stddev": tg["stddev_ts"],
            "verify_ms": {T: 1e3 * s for T, s in sorted(pass_s.items())},
            "verify_cost_ratio": {T: s / pass_s[min(pass_s)] for T, s in sorted(pass_s.items())}}


class Server:
    """llama-server on a local port with the given speculative options, stopped on exit."""

    def __init__(self, build: Path, model: str, threads: int, port: int, extra: list[str]):
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen([str(build / "bin" / "llama-server"), "-m", model, "-t", str(threads), "-c", "4096",
                                      "-np", "1", "--port", str(port), "--no-webui", *extra],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def __enter__(self):
        for _ in range(600):
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited: {self.proc.stderr.read()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        raise RuntimeError("llama-server did not come up in 300 s")

    def complete(self, prompt: list[int], n: int) -> dict:
        body = json.dumps({"prompt": prompt, "n_predict": n, "temperature": 0, "top_k": 1, "cache_prompt": False,
                           "ignore_eos": True}).encode()
        req = urllib.request.Request(self.url + "/completion", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.loads(r.read())

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(timeout=30)


def server_runs(build: Path, model: str, threads: int, prompt: list[int], n: int, draft_n: int, synth_len: float,
                repeats: int) -> dict:
    configs = {"plain": ["--spec-type", "none"],
               "draft_mtp_synth": ["--spec-type", "draft-mtp", "--spec-draft-n-max", str(draft_n),
                                   "--spec-synth-len", str(synth_len)]}
    rates: dict[str, list[float]] = {name: [] for name in configs}
    last = {}
    for r in range(repeats + 1):  # round 0 warms up; one server at a time (2 would share the cores)
        for i, (name, extra) in enumerate(configs.items()):
            with Server(build, model, threads, 18080 + i, extra) as server:
                out = server.complete(prompt, n)
            if r:
                rates[name].append(out["timings"]["predicted_per_second"])
                last[name] = out["timings"]
    report = {"plain": {"tok_s": statistics.median(rates["plain"])}}
    t = last["draft_mtp_synth"]
    report["draft_mtp_synth"] = {
        "tok_s": statistics.median(rates["draft_mtp_synth"]),
        "speedup": statistics.median(s / p for s, p in zip(rates["draft_mtp_synth"], rates["plain"])),
        "synth_len": synth_len, "draft_n": draft_n,
        "draft_n_total": t.get("draft_n"), "draft_n_accepted": t.get("draft_n_accepted")}
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", type=Path, required=True, help="llama.cpp CMake build folder (bin/llama-bench, bin/llama-server)")
    p.add_argument("--model", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-new", type=int, default=128)
    p.add_argument("--draft-n", type=int, default=3)
    p.add_argument("--synth-len", type=float, default=2.95)
    p.add_argument("--no-server", action="store_true", help="llama-bench only")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    for tool in ["llama-bench"] + ([] if args.no_server else ["llama-server"]):
        if not (args.build / "bin" / tool).is_file():
            print(f"bench_llamacpp: error: no {args.build / 'bin' / tool}", file=sys.stderr)
            return 2
    report = {"model": args.model, "threads": args.threads,
              **llama_bench(args.build, args.model, args.threads, range(1, 10), 32, args.repeats)}
    if not args.no_server:
        prompt = list(range(1000, 1032))  # 32 fixed ids
        report["spec"] = server_runs(args.build, args.model, args.threads, prompt, args.max_new, args.draft_n,
                                     args.synth_len, args.repeats)
    if args.json:
        print(json.dumps(report))
    else:
        print(f"decode {report['decode_tok_s']:.2f} tok/s; verify cost " +
              "  ".join(f"T={T}: {r:.2f}x" for T, r in report["verify_cost_ratio"].items()))
        for name, s in report.get("spec", {}).items():
            print(f"{name:<16} {s['tok_s']:8.2f} tok/s" + (f"   speedup {s['speedup']:.2f}x" if "speedup" in s else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
