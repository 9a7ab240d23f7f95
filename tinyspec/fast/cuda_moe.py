"""A MoE layer's routing and its grouping by expert on the GPU, with no host sync (Kernels.route_experts).

tinyspec.moe.route_experts's contract on the device (moe.py has the math): for router logits z [T, E],

    p[t]      = softmax(z[t])                     exp in float64, rounded once; sum in NumPy's pairwise order
    chosen[t] = the k largest p[t, e], largest first; a tie goes to the lower index (NumPy's stable argsort
                of -p)
    w[t, j]   = p[t, chosen[t, j]] / sum_j p[t, chosen[t, j]]    the k-value sum in NumPy's pairwise order
    order     = the pairs p = t k + j sorted by chosen expert, stably (pairs of one expert in pair order)
    offsets   = [E + 1], expert e's pairs are order[offsets[e]:offsets[e+1]]

Two launches, each small:

    route_k   one warp per row t: the row's softmax (max, exp and divide across the lanes; the pairwise sum on
              lane 0: the float32 operations of moe.route in its order, each an _rn intrinsic so nothing
              fuses), then k selection sweeps, each taking the largest p after the previous pick in the order
              (p descending, index ascending: a total order, so the warp's reduction over its lanes finds the
              same pick whatever lane held it), then the renormalisation on lane 0. Writes probs [T, E]
              (scratch), chosen [T, k] int32, weights [T, k].
    group_k   one block, one thread per expert e (E <= 1024): count the pairs that chose e, an exclusive scan
              of the counts in shared memory (thread 0, in expert order: offsets), then walk the pairs in order
              writing each of e's to order[offsets[e] + its rank among them] (a stable counting sort).

Bits, by construction: the same as moe.route + moe.group_by_expert on the same logits, for every row (exp aside,
where CUDA's float64 exp and the host's could straddle a float32 rounding boundary: p ~ 2^-28 a value). Written
on 2026-11-27 without a GPU: no GPU has run these kernels yet. The host's groups
list only the chosen experts (U of them); these list all E, the empty ones with offsets[e] == offsets[e+1], so
that U, a count, never has to come back: moe.experts_linear's packed path reads offsets on the device
(cuda_ops.bind_experts, one grouped launch per projection). The kernels' numbers are checked against moe.route
and group_by_expert by tests/test_cuda_ops.py on a GPU (ties included); without a GPU their compilation
(tools/check_cuda_kernels.py, tests/test_cuda_compile.py), their Python side through tests/fake_cupy.py, and their
CUDA source compiled for the CPU (tests/cuda_on_cpu.h): bitwise moe.route and group_by_expert, ties and E = 300
included (tests/test_kernels_on_cpu.py).

Speed: a decode step routes one row (a warp: E / 32 exps a lane, k sweeps of E / 32 compares and 5 shuffles,
one serial pairwise sum of E values; not measured: no GPU yet); a prefill of T rows runs T warps,
and group_k's one block walks T k pairs per expert thread, twice (T k = 4096 pairs: some tens of microseconds).
Both are far below the experts' matmuls; they exist to remove the sync, not to be fast.

Official implementation: llama.cpp ggml-cuda argsort.cu / topk-moe.cu (a fused softmax + top-k per row) and
mmid's grouping of rows by expert. Does NOT include: NaN logits (a NaN row's choices are unspecified), E > 1024.
"""

from __future__ import annotations

import cupy as cp
import numpy as np

MAX_E = 1024  # group_k runs one thread per expert in one block

_SOURCE = r"""
// NumPy's pairwise sum of n float32 values (numpy/_core/src/umath/loops_utils.h.src, pairwise_sum): n < 8 in
// order from 0; n <= 128 in 8 interleaved partial sums, combined ((0+1)+(2+3))+((4+5)+(6+7)), then the rest
// in order; larger n split at n/2 rounded down to a multiple of 8, each half summed so, then added.
__device__ float pairwise_sum(const float* a, int n, int stride) {
    if (n < 8) {
        float r = 0.0f;  // NumPy starts from the reduction's identity: 0 + a[0] is a[0] exactly
        for (int i = 0; i < n; ++i) r = __fadd_rn(r, a[(long long)i * stride]);
        return r;
    }
    if (n <= 128) {
        float r[8];
        for (int j = 0; j < 8; ++j) r[j] = a[(long long)j * stride];
        int i = 8;
        for (; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; ++j) r[j] = __fadd_rn(r[j], a[(long long)(i + j) * stride]);
        float res = __fadd_rn(__fadd_rn(__fadd_rn(r[0], r[1]), __fadd_rn(r[2], r[3])),
                              __fadd_rn(__fadd_rn(r[4], r[5]), __fadd_rn(r[6], r[7])));
        for (; i < n; ++i) res = __fadd_rn(res, a[(long long)i * stride]);
        return res;
    }
    int n2 = n / 2;
    n2 -= n2 % 8;
    return __fadd_rn(pairwise_sum(a, n2, stride), pairwise_sum(a + (long long)n2 * stride, n - n2, stride));
}

extern "C" __global__ void route_k(const float* __restrict__ logits, int T, int E, int k,
                                   float* __restrict__ probs,     // [T, E] scratch: the softmax
                                   int* __restrict__ chosen,      // [T, k] experts, largest p first
                                   float* __restrict__ weights)   // [T, k] renormalised
{
    const unsigned all = 0xffffffffu;
    const int lane = threadIdx.x & 31, t = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;  // one warp per row
    if (t >= T) return;  // the whole warp: t is the warp's
    const float* z = logits + (long long)t * E;
    float* p = probs + (long long)t * E;
    float m = z[0];
    for (int e = lane; e < E; e += 32) m = fmaxf(m, z[e]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(all, m, off));  // exact in any order
    for (int e = lane; e < E; e += 32) p[e] = (float)exp((double)__fsub_rn(z[e], m));  // rounded once to float32
    __syncwarp();  // (orders the lanes' writes of p before the reads below)
    float s = 0.0f;
    if (lane == 0) s = pairwise_sum(p, E, 1);  // one lane: NumPy's order
    s = __shfl_sync(all, s, 0);
    for (int e = lane; e < E; e += 32) p[e] = __fdiv_rn(p[e], s);
    __syncwarp();
    // top k, stable: pick j is the largest p after pick j-1 in the order (p descending, index ascending), so
    // equal p go to the lower index first, as NumPy's stable argsort of -p does. Each lane finds the best of its
    // experts (ascending: strict > keeps the lower index), then the warp takes the best of the lanes' under the
    // same total order, so the pick does not depend on which lane held what.
    int prev = -1;
    float prev_p = 0.0f;
    int* c = chosen + (long long)t * k;
    float* w = weights + (long long)t * k;
    for (int j = 0; j < k; ++j) {
        int best = -1;
        float best_p = 0.0f;
        for (int e = lane; e < E; e += 32) {
            const float pe = p[e];
            const bool after = prev < 0 || pe < prev_p || (pe == prev_p && e > prev);
            if (after && (best < 0 || pe > best_p)) { best = e; best_p = pe; }
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            const int ob = __shfl_xor_sync(all, best, off);
            const float op = __shfl_xor_sync(all, best_p, off);
            if (ob >= 0 && (best < 0 || op > best_p || (op == best_p && ob < best))) { best = ob; best_p = op; }
        }
        if (lane == 0) { c[j] = best; w[j] = best_p; }
        prev = best; prev_p = best_p;
    }
    if (lane == 0) {
        const float sc = pairwise_sum(w, k, 1);  // chosen.sum(axis=1): the k values in rank order
        for (int j = 0; j < k; ++j) w[j] = __fdiv_rn(w[j], sc);
    }
}

extern "C" __global__ void group_k(const int* __restrict__ chosen, int P, int E,  // chosen [P = T k] flat
                                   int* __restrict__ offsets,        // [E + 1]
                                   long long* __restrict__ order)    // [P] pairs sorted by expert, stable
{
    __shared__ int start[1025];
    const int e = threadIdx.x;
    int count = 0;
    if (e < E)
        for (int p = 0; p < P; ++p) count += chosen[p] == e;
    if (e < E) start[e + 1] = count;
    __syncthreads();
    if (e == 0) {  // exclusive scan in expert order
        start[0] = 0;
        for (int i = 1; i <= E; ++i) start[i] += start[i - 1];
    }
    __syncthreads();
    if (e < E) offsets[e] = start[e];
    if (e == 0) offsets[E] = start[E];  // = P
    if (e < E) {
        int at = start[e];
        for (int p = 0; p < P; ++p)
            if (chosen[p] == e) order[at++] = p;  // pairs of e in pair order: stable
    }
}
"""

_modules: dict = {}  # device -> cupy.RawModule (CuPy caches the cubin on disk)


def kernel_names() -> list[str]:
    """The kernels of _SOURCE (extern "C": their names are their symbols); tools/check_cuda_kernels.py compiles them."""
    return ["route_k", "group_k"]


_functions: dict = {}  # (device, name) -> the loaded kernel: looked up once, not at every launch


def _kernel(name: str):
    dev = cp.cuda.runtime.getDevice()
    fn = _functions.get((dev, name))
    if fn is None:
        if dev not in _modules:
            _modules[dev] = cp.RawModule(code=_SOURCE, options=("--fmad=false",))
        fn = _functions[(dev, name)] = _modules[dev].get_function(name)
    return fn


def route_experts(router_logits, k: int):
    """moe.route_experts's contract on the device: cupy [T, E] logits -> (weights [T, k] float32, order [T k]
    int64, experts = np.arange(E) on the host, offsets [E + 1] int32), all but experts device arrays; no sync."""
    z = cp.ascontiguousarray(cp.asarray(router_logits, dtype=cp.float32))
    if z.ndim != 2:
        raise ValueError(f"cuda_moe: router logits must be [T, E], got {z.shape}")
    T, E = z.shape
    if not (1 <= k <= E <= MAX_E):
        raise ValueError(f"cuda_moe: need 1 <= k <= E <= {MAX_E}, got k={k}, E={E}")
    probs = cp.empty((T, E), cp.float32)
    chosen = cp.empty((T, k), cp.int32)
    weights = cp.empty((T, k), cp.float32)
    offsets = cp.empty(E + 1, cp.int32)
    order = cp.empty(T * k, cp.int64)
    if T == 0:
        offsets.fill(0)
        return weights, order, np.arange(E), offsets
    _kernel("route_k")((-(-T // 4),), (128,), (z, np.int32(T), np.int32(E), np.int32(k), probs, chosen, weights))
    _kernel("group_k")((1,), (-(-E // 32) * 32,), (chosen, np.int32(T * k), np.int32(E), offsets, order))
    return weights, order, np.arange(E), offsets
