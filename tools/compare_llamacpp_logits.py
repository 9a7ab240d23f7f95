"""Compare tinyspec's logits with llama.cpp's own runtime on the same GGUF and the same tokens.

    python tools/compare_llamacpp_logits.py --llama-cpp TREE --build-dir DIR MODEL.gguf [MODEL.gguf ...]
        [--tokens 1,2,3 | --n-tokens 32 --seed 0] [--backend numpy|cpu|cuda] [--json]

TREE is a llama.cpp source tree and DIR a static CMake build of it (src/libllama.a and
ggml/src/libggml*.a; CPU only). tools/llamacpp_logits.cpp is compiled with g++ against them
into a temporary folder, run once per model with the whole
prompt as one batch (F32 KV cache, no flash attention, MTP layers not loaded), and its
logits [T, n_vocab] are compared with `Model.forward` on a fresh state. Only trunk logits are
compared: neither side runs the MTP head here. --backend picks tinyspec's side (default numpy, the
oracle; cpu rounds K-quant activations to Q8_K as ggml's CPU backend does, so it lands closer).

Printed per model: max |diff|, the logit scale (max |logit| from llama.cpp), their ratio, and
how many positions have the same argmax (with the first mismatching positions, if any).

    python tools/compare_llamacpp_logits.py --llama-cpp TREE --build-dir DIR MODEL.gguf --greedy 32 \
        --prompt "def main():" --prompt "class Stack:"

Greedy mode: each prompt is tokenized by tinyspec, then both runtimes decode N tokens greedily (llama.cpp one
llama_decode per token, F32 KV cache); printed: whether the continuations are equal, and where they part.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
HARNESS_SRC = REPO / "tools" / "llamacpp_logits.cpp"
if str(REPO) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO))


def build_harness(tree: str | os.PathLike, build_dir: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Compile tools/llamacpp_logits.cpp (about 1 s) against an existing static llama.cpp build into
    out_dir; returns the binary. Nothing is written into the tree or the build."""
    tree, build_dir = Path(tree), Path(build_dir)
    libs = [build_dir / "src" / "libllama.a"] + [build_dir / "ggml" / "src" / f"libggml{s}.a"
                                                   for s in ("", "-cpu", "-base")]
    missing = [str(p) for p in libs if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"llama.cpp build is missing {', '.join(missing)}")
    if not (tree / "include" / "llama.h").is_file():
        raise FileNotFoundError(f"{tree} has no include/llama.h")
    cxx = os.environ.get("CXX") or shutil.which("g++")
    if not cxx:
        raise FileNotFoundError("no C++ compiler (g++ or $CXX)")
    out = Path(out_dir) / "llamacpp_logits"
    # Static libs: llama before ggml, ggml-cpu before ggml-base; OpenMP because the build enables it
    # (GGML_OPENMP=ON; harmless if not).
    cmd = [cxx, "-O2", "-std=c++17", f"-I{tree / 'include'}", f"-I{tree / 'ggml' / 'include'}",
           str(HARNESS_SRC), "-o", str(out), *map(str, libs), "-fopenmp", "-lpthread", "-ldl", "-lm"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"building the harness failed:\n{' '.join(cmd)}\n{r.stderr[-4000:]}")
    return out


def llamacpp_logits(harness: Path, model: str | os.PathLike, tokens) -> np.ndarray:
    """llama.cpp's logits [T, n_vocab] for `tokens` decoded as one batch."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "logits.f32"
        r = subprocess.run([str(harness), str(model), str(out), *map(str, tokens)],
                           capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"llama.cpp harness failed on {model}:\n{r.stderr[-4000:]}")
        t, n_vocab = map(int, r.stdout.split()[-2:])
        return np.fromfile(out, dtype=np.float32).reshape(t, n_vocab)


def tinyspec_logits(model_path: str | os.PathLike, tokens, backend: str = "numpy") -> np.ndarray:
    from tinyspec.backends import load_model

    model = load_model(model_path, backend)
    logits, _hidden = model.forward(np.asarray(tokens, dtype=np.int64), model.new_state())
    return np.asarray(logits, dtype=np.float64)


def compare(ref: np.ndarray, ours: np.ndarray) -> dict:
    ref = ref.astype(np.float64)
    if ref.shape != ours.shape:
        raise ValueError(f"shape mismatch: llama.cpp {ref.shape} vs tinyspec {ours.shape}")
    diff = np.abs(ref - ours)
    scale = float(np.abs(ref).max())
    a_ref, a_ours = ref.argmax(-1), ours.argmax(-1)
    same = a_ref == a_ours
    return {
        "tokens": int(ref.shape[0]), "n_vocab": int(ref.shape[1]),
        "max_abs_diff": float(diff.max()),
        "max_abs_diff_per_position": [float(d) for d in diff.max(-1)],
        "logit_scale": scale,
        "rel_diff": float(diff.max() / scale) if scale else float("inf"),
        "argmax_agree": int(same.sum()),
        "argmax_mismatch_positions": [int(i) for i in np.flatnonzero(~same)],
    }


def llamacpp_greedy(harness: Path, model: str | os.PathLike, tokens, n: int) -> list[int]:
    """llama.cpp's greedy continuation of `tokens`, n tokens."""
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run([str(harness), str(model), str(Path(tmp) / "logits.f32"), *map(str, tokens)],
                           capture_output=True, text=True, env=os.environ | {"LLAMACPP_GREEDY": str(n)})
        if r.returncode:
            raise RuntimeError(f"llama.cpp harness failed on {model}:\n{r.stderr[-4000:]}")
        return [int(t) for t in r.stdout.splitlines()[-1].split()]


def tinyspec_greedy(model, tokens, n: int) -> list[int]:
    from tinyspec.generate import generate

    return generate(model, tokens, n).tokens  # no stop ids: exactly n tokens


def run_greedy(models, tree, build_dir, prompts: list[str], n: int, backend: str = "numpy") -> dict:
    from tinyspec.backends import load_model
    from tinyspec.tokenizer import Tokenizer

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        harness = build_harness(tree, build_dir, tmp)
        for m in models:
            model = load_model(m, backend)  # loaded once for every prompt
            tok = Tokenizer.from_gguf(model.metadata)
            rows = []
            for text in prompts:
                ids = tok.encode(text)
                ref, ours = llamacpp_greedy(harness, m, ids, n), tinyspec_greedy(model, ids, n)
                split = next((i for i, (a, b) in enumerate(zip(ref, ours)) if a != b), None)
                rows.append({"prompt": text, "prompt_tokens": ids, "llama_cpp": ref, "tinyspec": ours,
                             "equal": ref == ours, "first_difference": split, "text": tok.decode(ours)})
            results[str(m)] = rows
    return results


def default_tokens(n_vocab: int, n: int = 32, seed: int = 0) -> list[int]:
    """A reproducible prompt: `n` ids drawn uniformly from the vocabulary."""
    return [int(t) for t in np.random.default_rng(seed).integers(0, n_vocab, size=n)]


def run(models, tree, build_dir, tokens=None, n_tokens=32, seed=0, backend="numpy") -> dict:
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        harness = build_harness(tree, build_dir, tmp)
        for m in models:
            results[str(m)] = _one(harness, m, tokens, n_tokens, seed, backend)
    return results


def _one(harness, m, tokens, n_tokens, seed, backend="numpy") -> dict:
    toks = tokens
    if toks is None:  # vocabulary size from llama.cpp itself: one throwaway token first
        toks = default_tokens(llamacpp_logits(harness, m, [0]).shape[1], n_tokens, seed)
    res = compare(llamacpp_logits(harness, m, toks), tinyspec_logits(m, toks, backend))
    res["token_ids"] = toks
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", help="GGUF files")
    ap.add_argument("--llama-cpp", required=True, help="llama.cpp source tree")
    ap.add_argument("--build-dir", required=True, help="its static CMake build")
    ap.add_argument("--tokens", help="comma-separated token ids (default: --n-tokens ids from --seed)")
    ap.add_argument("--n-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", default="numpy", choices=("numpy", "cpu", "cuda"),
                    help="tinyspec's backend (default numpy, the oracle)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--greedy", type=int, metavar="N", help="compare greedy continuations of N tokens instead")
    ap.add_argument("--prompt", action="append", default=[], help="prompt text for --greedy (repeatable)")
    a = ap.parse_args(argv)
    if a.greedy:
        if not a.prompt:
            ap.error("--greedy needs at least one --prompt")
        results = run_greedy(a.models, a.llama_cpp, a.build_dir, a.prompt, a.greedy, a.backend)
        if a.json:
            print(json.dumps(results, indent=1))
            return 0
        for m, rows in results.items():
            for r in rows:
                where = "equal" if r["equal"] else f"DIFFER from token {r['first_difference']}"
                print(f"{Path(m).name}: {r['prompt']!r} -> {len(r['tinyspec'])} greedy tokens {where}: {r['text']!r}")
        return 0 if all(r["equal"] for rows in results.values() for r in rows) else 1
    tokens = [int(t) for t in a.tokens.split(",")] if a.tokens else None
    results = run(a.models, a.llama_cpp, a.build_dir, tokens, a.n_tokens, a.seed, a.backend)
    if a.json:
        print(json.dumps(results, indent=1))
        return 0
    for m, r in results.items():
        print(f"{Path(m).name}: T={r['tokens']} n_vocab={r['n_vocab']}  max|diff|={r['max_abs_diff']:.3g}  "
              f"logit scale={r['logit_scale']:.3g}  rel={r['rel_diff']:.3g}  "
              f"argmax agree {r['argmax_agree']}/{r['tokens']}"
              + (f" (mismatch at {r['argmax_mismatch_positions'][:8]})" if r['argmax_mismatch_positions'] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
