"""Benchmark: how long a GGUF header with a real-size Qwen3.5 vocabulary takes to parse.

    python tools/bench_gguf_read.py [--vocab 248320] [--repeat 5] [--vs-gguf-py] [--json]

Writes a header-only file (random token strings, merges, token types; one small tensor) to a temp
dir, then reports the median read_gguf time, and optionally gguf-py's GGUFReader + decoding the token
list (slow: ~40 s a run here). Medians over --repeat runs in one process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import numpy as np

from tinyspec.gguf import read_gguf, write_gguf


def make_file(path: str, vocab: int) -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(2, 10, vocab)
    tokens = ["".join(chr(97 + c) for c in rng.integers(0, 26, n)) + str(i) for i, n in enumerate(lengths)]
    merges = [f"{a} {b}" for a, b in zip(tokens[:-1], tokens[1:])]
    write_gguf(path, {"general.architecture": "qwen35", "tokenizer.ggml.tokens": tokens,
                      "tokenizer.ggml.merges": merges, "tokenizer.ggml.token_type": np.ones(vocab, np.int32)},
               {"output_norm.weight": np.ones(1024, np.float32)})


def median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=248320, help="number of token strings (Qwen3.5: 248320)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--vs-gguf-py", action="store_true", help="also time gguf-py's reader (needs the test extra)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "vocab.gguf")
        make_file(path, args.vocab)
        result = {"file_mb": os.path.getsize(path) / 1e6, "vocab": args.vocab,
                  "read_gguf_s": median_time(lambda: read_gguf(path).close(), args.repeat)}
        if args.vs_gguf_py:
            import gguf

            def gguf_py():
                gguf.GGUFReader(path).fields["tokenizer.ggml.tokens"].contents()

            result["gguf_py_s"] = median_time(gguf_py, max(1, args.repeat // 2))
    if args.json:
        print(json.dumps(result))
    else:
        print(", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
