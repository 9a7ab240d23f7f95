"""Benchmark the Numba fused dequant-matmul (tinyspec.fast.numba_ops.quant_linear) per type, shape and T.

    python tools/bench_kernels.py [--types Q4_K,Q6_K,...] [--ts 1,2,4,8,16] [--repeat 20] [--threads N]
                                  [--shapes 1024x1024,...] [--q8] [--cold] [--json]

For each GGML type, weight shape [out, in] in (1024x1024, 3584x1024, 1024x3584) (Qwen3.5-0.8B: hidden
1024, ffn 3584) and T input rows: the median wall time over --repeat calls, the effective weight
bandwidth (weight bytes / time, GB/s = 1e9 B/s) and time(T) / time(1), the cost of verifying T tokens
relative to decoding one. --q8 times quant_linear_q8 (x rounded to Q8_K, or Q8_0 for Q8_0 weights, integer
dot products: what the cpu backend runs for the K-quants and Q8_0) instead of the float kernel; --shapes replaces the default shapes
(248320x1024 is the 0.8B output projection). Also measured in the same run: a memory-copy bandwidth (np.copyto of a 256 MB
float32 array; `copy_GBps` counts the 256 MB once, the bus moves it twice: read + write).

Weights are small enough to stay in the last-level cache when one matrix is called repeatedly (warm).
--cold cycles through enough copies of each weight (>= 512 MB) that every call reads it from DRAM, as a
full decode step over all layers does.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numba
import numpy as np

from tinyspec.fast import numba_ops
from tinyspec.quants import GGMLType, quantize

SHAPES = ((1024, 1024), (3584, 1024), (1024, 3584))  # (out, in)
DEFAULT_TYPES = "Q4_K,Q6_K,Q8_0,Q5_K,Q4_0,Q2_K,F16,BF16,F32"


def median_s(fn, repeat: int) -> float:
    times = []
    for i in range(repeat):
        t0 = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# byte offsets of the fp16 scale fields in each block type (tinyspec/quants byte tables)
F16_FIELDS = {GGMLType.Q8_0: (0,), GGMLType.Q4_0: (0,), GGMLType.Q4_1: (0, 2), GGMLType.Q5_0: (0,),
              GGMLType.Q5_1: (0, 2), GGMLType.Q2_K: (80, 82), GGMLType.Q3_K: (108,),
              GGMLType.Q4_K: (0, 2),
              GGMLType.Q5_K: (0, 2), GGMLType.Q6_K: (208,), GGMLType.IQ2_XXS: (0,), GGMLType.IQ3_XXS: (0,),
              GGMLType.IQ4_NL: (0,), GGMLType.IQ4_XS: (0,),
              GGMLType.IQ1_S: (0,), GGMLType.IQ2_XS: (0,), GGMLType.IQ2_S: (0,), GGMLType.IQ3_S: (0,)}


def random_weight(qtype: GGMLType, shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """Raw bytes [out, row_bytes] of a random weight: N(0, 1) values for the plain float types, random
    bytes for the block types with every fp16 scale field set to 2^-10 (finite, never subnormal, so
    the timing sees no NaN or denormal slow paths). Quantizing 3.7M values would take seconds."""
    if qtype in (GGMLType.F32, GGMLType.F16, GGMLType.BF16):
        return quantize(rng.standard_normal(shape, dtype=np.float32), qtype)
    raw = rng.integers(0, 256, (shape[0], qtype.row_nbytes(shape[1])), dtype=np.uint8)
    blocks = raw.reshape(-1, qtype.type_size)
    for o in F16_FIELDS[qtype]:
        blocks[:, o:o + 2] = np.frombuffer(np.float16(2.0**-10).tobytes(), np.uint8)
    return raw


def copy_gbps(repeat: int) -> float:
    src = np.ones(256 * 2**20 // 4, dtype=np.float32)
    dst = np.empty_like(src)
    return src.nbytes / median_s(lambda i: np.copyto(dst, src), repeat) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default=DEFAULT_TYPES, help=f"comma-separated GGML type names (default {DEFAULT_TYPES})")
    ap.add_argument("--ts", default="1,2,4,8,16", help="comma-separated T values (default 1,2,4,8,16)")
    ap.add_argument("--repeat", type=int, default=20, help="calls per measurement; the median is reported")
    ap.add_argument("--shapes", default=",".join(f"{o}x{i}" for o, i in SHAPES),
                    help="comma-separated OUTxIN weight shapes (default: the 0.8B layer shapes)")
    ap.add_argument("--q8", action="store_true", help="time quant_linear_q8 (the cpu backend's K-quant and Q8_0 path)")
    ap.add_argument("--cold", action="store_true", help="read every weight from DRAM (cycle through >= 512 MB)")
    ap.add_argument("--threads", type=int, default=0, help="numba threads (default: all cores)")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = ap.parse_args()
    if args.threads:
        numba.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    ts = [int(t) for t in args.ts.split(",")]
    shapes = [tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",")]
    result = {"copy_GBps": copy_gbps(max(3, args.repeat // 4)), "cold": args.cold,
              "threads": numba.get_num_threads(), "q8": args.q8, "rows": []}
    for name in args.types.split(","):
        qtype = GGMLType[name]
        for shape in shapes:
            raw = random_weight(qtype, shape, rng)
            copies = [raw] + [raw.copy() for _ in range(512 * 2**20 // raw.nbytes)] if args.cold else [raw]
            # bound once, as the model binds its weights: a call then costs the kernel, not the checks
            linears = [numba_ops.bind(c, qtype, shape, q8=args.q8 and qtype in numba_ops.Q8_TYPES) for c in copies]
            base = None
            for T in ts:
                x = rng.standard_normal((T, shape[1]), dtype=np.float32)
                linears[0](x)  # compile / warm up
                s = median_s(lambda i: linears[i % len(linears)](x),
                             max(args.repeat, len(copies)) if args.cold else args.repeat)
                base = s if T == ts[0] else base
                row = {"type": name, "out": shape[0], "in": shape[1], "T": T, "ms": s * 1e3,
                       "weight_GBps": raw.nbytes / s / 1e9, "time_ratio_vs_T1": s / base}
                result["rows"].append(row)
                if not args.json:
                    print(f"{name:5s} {shape[0]:5d}x{shape[1]:<5d} T={T:2d}  {s * 1e3:8.3f} ms  "
                          f"{row['weight_GBps']:7.2f} GB/s  x{row['time_ratio_vs_T1']:.2f}", file=sys.stderr)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"copy (np.copyto 256 MB): {result['copy_GBps']:.2f} GB/s", file=sys.stderr)


if __name__ == "__main__":
    main()
