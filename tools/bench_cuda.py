"""Benchmark the CuPy fused dequant-matmul (tinyspec.fast.cuda_ops.quant_linear) per type, shape and T.

    python tools/bench_cuda.py [--types Q4_K,Q6_K,...] [--ts 1,2,4,8,16] [--shapes 1024x3584,...]
                               [--kernel auto|fma] [--json]

For each GGML type, weight shape OUTxIN (default 1024x3584: Qwen3.5-0.8B ffn_down, 4096x12288: a 9B-class
ffn_down, 248320x1024: the 0.8B LM head) and T input rows:

    us              GPU time per call: CUDA events around a CUDA graph of captured calls, so neither Python
                    nor launch latency between calls is counted (falls back to timing a plain loop, and
                    says so in "graph", if capture fails)
    weight_GBps     weight bytes / time (GB = 1e9 bytes): the bandwidth the kernel draws from HBM
    frac_of_copy    weight_GBps / copy_GBps
    frac_of_read    weight_GBps / read_GBps
    time_vs_T1      time(T) / time(first T): the cost of verifying T tokens relative to decoding one

read_GBps is measured in the same run: a kernel that reads 2 GiB once (16-byte loads, one
word written per block), the ceiling a weight-streaming kernel can reach.
copy_GBps is measured in the same run too: a device-to-device copy of 1 GiB (cudaMemcpyAsync), counted as
2 bytes of HBM traffic per byte copied (read + write), which is what a read-only kernel competes with.
Every call reads its weight from HBM, not from L2: a weight smaller than 4x the L2 size is cycled through
enough copies that consecutive calls never touch the same bytes. Weights are random blocks with every
fp16 scale set to 2^-10 (plain types: normal values); speed does not depend on the values.
"""

from __future__ import annotations

import argparse
import json
import sys

import cupy as cp
import numpy as np

from tinyspec.fast import cuda_ops
from tinyspec.quants import GGMLType

SHAPES = "1024x3584,4096x12288,248320x1024"  # OUTxIN
DEFAULT_TYPES = "Q4_K,Q5_K,Q6_K,Q8_0,F16,BF16,F32"
SCALE_FIELDS = {GGMLType.Q8_0: (0,), GGMLType.Q4_K: (0, 2), GGMLType.Q5_K: (0, 2), GGMLType.Q6_K: (208,)}


def random_weight(qtype: GGMLType, shape: tuple[int, int]):
    """GGUF bytes [out * row bytes] uint8 on the device."""
    n_out, n_in = shape
    if qtype == GGMLType.F32:
        return cp.random.standard_normal(shape, dtype=cp.float32).view(cp.uint8).reshape(-1)
    if qtype == GGMLType.F16:
        return cp.random.standard_normal(shape, dtype=cp.float32).astype(cp.float16).view(cp.uint8).reshape(-1)
    if qtype == GGMLType.BF16:
        bits = cp.random.standard_normal(shape, dtype=cp.float32).view(cp.uint32) >> 16
        return bits.astype(cp.uint16).view(cp.uint8).reshape(-1)
    raw = cp.random.randint(0, 256, n_out * qtype.row_nbytes(n_in), dtype=cp.int32).astype(cp.uint8)
    blocks = raw.reshape(-1, qtype.type_size)
    scale = cp.asarray(np.frombuffer(np.float16(2.0**-10).tobytes(), np.uint8))
    for offset in SCALE_FIELDS[qtype]:
        blocks[:, offset:offset + 2] = scale
    return raw


def time_per_call(fn, n_calls: int, stream, reps: int = 5) -> tuple[float, bool]:
    """Seconds of GPU time per fn(i) call, i = 0 .. n_calls-1; True if a CUDA graph was used."""
    with stream:
        for i in range(min(n_calls, 2)):  # compile and warm up outside the capture
            fn(i)
        stream.synchronize()
        graph = None
        try:
            stream.begin_capture()
            try:
                for i in range(n_calls):
                    fn(i)
            finally:
                captured = stream.end_capture()
            graph = captured
        except Exception as exc:  # e.g. an allocation inside the capture: time the plain loop instead
            print(f"bench_cuda: graph capture failed ({exc}); timing includes launch overhead", file=sys.stderr)
        start, end = cp.cuda.Event(), cp.cuda.Event()
        if graph is not None:
            graph.launch(stream)  # warm (first launch uploads the graph)
            start.record(stream)
            for _ in range(reps):
                graph.launch(stream)
            end.record(stream)
        else:
            start.record(stream)
            for _ in range(reps):
                for i in range(n_calls):
                    fn(i)
            end.record(stream)
        end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) / 1e3 / (reps * n_calls), graph is not None


def copy_gbps(stream, nbytes: int = 2**30) -> float:
    """HBM traffic of a device-to-device copy (read + write) in GB/s."""
    src = cp.ones(nbytes, dtype=cp.uint8)
    dst = cp.empty_like(src)

    def copy(_i):
        dst.data.copy_from_device_async(src.data, nbytes, stream)

    s, _ = time_per_call(copy, 4, stream)
    return 2 * nbytes / s / 1e9


_READ_SRC = r"""
extern "C" __global__ void read_all(const uint4* __restrict__ p, long long n, unsigned int* out) {
    unsigned int acc = 0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const uint4 v = __ldg(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) out[blockIdx.x] = acc;  // practically never: keeps the loads alive
}
"""


def read_gbps(stream, nbytes: int = 2**31) -> float:
    """Bytes read per second by a kernel that reads a buffer once, in GB/s."""
    src = cp.ones(nbytes // 16 * 4, dtype=cp.uint32)
    out = cp.zeros(132 * 64, dtype=cp.uint32)
    kernel = cp.RawKernel(_READ_SRC, "read_all")
    blocks = cp.cuda.Device().attributes["MultiProcessorCount"] * 8

    def read(_i):
        kernel((blocks,), (512,), (src, np.int64(nbytes // 16), out))

    s, _ = time_per_call(read, 4, stream)
    return nbytes / s / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default=DEFAULT_TYPES, help=f"comma-separated GGML type names (default {DEFAULT_TYPES})")
    ap.add_argument("--ts", default="1,2,4,8,16", help="comma-separated T values (default 1,2,4,8,16)")
    ap.add_argument("--shapes", default=SHAPES, help=f"comma-separated OUTxIN weight shapes (default {SHAPES})")
    ap.add_argument("--calls", type=int, default=20, help="calls per captured graph (at least the number of copies)")
    ap.add_argument("--kernel", choices=("auto", "fma"), default="auto",
                    help="auto: K-quants and Q8_0 on the tensor-core kernel (sm_80+); fma: every type on the float kernel")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = ap.parse_args()
    cuda_ops.use_mma = args.kernel == "auto"
    ts = [int(t) for t in args.ts.split(",")]
    shapes = [tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",")]
    dev = cp.cuda.Device()
    l2 = int(dev.attributes.get("L2CacheSize", 50 * 2**20))
    stream = cp.cuda.Stream(non_blocking=True)
    result = {"device": cp.cuda.runtime.getDeviceProperties(dev.id)["name"].decode(), "l2_bytes": l2,
              "copy_GBps": copy_gbps(stream), "read_GBps": read_gbps(stream),
              "kernel": args.kernel, "rows": []}
    rng = np.random.default_rng(0)
    for name in args.types.split(","):
        qtype = GGMLType[name]
        for shape in shapes:
            first = random_weight(qtype, shape)
            n_copies = max(1, -(-4 * l2 // first.nbytes))
            weights = [first] + [first.copy() for _ in range(n_copies - 1)]
            n_calls = max(args.calls, n_copies)
            base = None
            for T in ts:
                x = cp.asarray(rng.standard_normal((T, shape[1]), dtype=np.float32))
                y = cp.empty((T, shape[0]), dtype=cp.float32)
                s, graphed = time_per_call(
                    lambda i: cuda_ops.quant_linear(x, weights[i % n_copies], qtype, shape, out=y), n_calls, stream)
                base = s if base is None else base
                gbps = first.nbytes / s / 1e9
                row = {"type": name, "out": shape[0], "in": shape[1], "T": T, "us": s * 1e6, "weight_GBps": gbps,
                       "frac_of_copy": gbps / result["copy_GBps"],
                       "frac_of_read": gbps / result["read_GBps"], "time_vs_T1": s / base, "copies": n_copies,
                       "graph": graphed}
                result["rows"].append(row)
                if not args.json:
                    print(f"{name:5s} {shape[0]:6d}x{shape[1]:<6d} T={T:2d}  {s * 1e6:9.1f} us  {gbps:7.1f} GB/s  "
                          f"{row['frac_of_read']:6.1%} of read  x{row['time_vs_T1']:.2f}", file=sys.stderr)
            weights = first = None  # free before the next shape
            cp.get_default_memory_pool().free_all_blocks()
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{result['device']}: device-to-device copy {result['copy_GBps']:.1f} GB/s (read + write), "
              f"read {result['read_GBps']:.1f} GB/s", file=sys.stderr)


if __name__ == "__main__":
    main()
