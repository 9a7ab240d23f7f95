"""Measure why tinyspec's linear() is a loop of matrix-vector products rather than one gemm.

    python tools/measure_batch_invariance.py [--rows 1024] [--cols 1024] [--k 4] [--repeat 20] [--json]

For a random float32 W [rows, cols] and X [k, cols]: the max |difference| between the gemm `X @ W.T`
and k separate `W @ x` (nonzero means a T-token verify pass would not reproduce one-token decode bit
for bit), whether tinyspec.ops.linear is bitwise equal to the per-row products, and the median
time of each (one run, same process).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from tinyspec.ops import linear


def median_s(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--cols", type=int, default=1024)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    W = rng.standard_normal((args.rows, args.cols)).astype(np.float32)
    X = rng.standard_normal((args.k, args.cols)).astype(np.float32)
    per_row = np.stack([W @ x for x in X])
    result = {
        "shape": [args.rows, args.cols], "k": args.k,
        "gemm_vs_per_row_max_abs_diff": float(np.abs(X @ W.T - per_row).max()),
        "linear_bitwise_equal_per_row": bool(np.array_equal(linear(X, W), per_row)),
        "gemm_s": median_s(lambda: X @ W.T, args.repeat),
        "linear_s": median_s(lambda: linear(X, W), args.repeat),
    }
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
