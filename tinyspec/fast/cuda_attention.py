"""Causal attention over the KV cache as one CUDA kernel: tinyspec.attention's attend, attend_paged and
attend_paged_ragged on CuPy arrays, with every length read from device memory.

    attend(q [T, H_kv, G, d], keys [>= n_past + T, H_kv, d], values [same], n_past, scale) -> o [T, H_kv, G, d]
    attend_paged(q, k_pool [n_blocks, block_size, H_kv, d], v_pool [same], table, n_past, scale) -> o
    attend_paged_ragged(q [R, H_kv, G, d], k_pool, v_pool, tables, n_pasts, bounds [B+1], scale) -> o
    attend_rows(q, k_pool, v_pool, seq, row0, n_past, tab0, tables, scale, out=None) -> o   (the device form)

Row r of sequence b = seq[r] sees the n = n_past[b] + (r - row0[b]) + 1 positions up to its own (causal, its
own sequence's only); position j lives in pool row tables[tab0[b] + j // block_size] * block_size + j % block_size.
Per query head g of kv head h (one thread block per (row, kv head), 128 threads, keys in tiles of 32):

    s_j = scale * (q_g . k_j)     lane l of a warp sums c = l, l + 32, .. in order (fmaf), then a fixed xor
                                  tree over the 32 lanes; warp w takes keys w, w + 4, .. of the tile
    online softmax, per tile of keys j0 .. j0 + 31, one thread per query head, keys in order:
        m' = max(m, max_j s_j)    a = exp(m - m')    e_j = exp(s_j - m')    l' = a l + sum_j e_j
        acc[c] = a acc[c] + sum_j e_j v_j[c]          thread t owns columns c = t, t + 128, .. (fmaf, j in order)
    o_g = acc / l                 (the oracle: p = e / sum e, then p V; the same value, other roundings)

The row map is device memory: seq [R], row0, n_past, tab0 [B] and the flat tables, all int32. The host-int
forms (the oracle's signatures) build it on the host (row_map: validated, one int32 array) and upload it in ONE
copy per call (attend: T + 4 ints; a ragged call: R + 3B + the used block ids), then launch attend_rows once: a
ragged call is every sequence's rows in one launch. attend_rows itself reads no host value but shapes, so a CUDA
graph captured around it replays with whatever lengths and tables are in those arrays then (item 5 of issue 35:
the caller copies the new map into the graph's buffers; only R, the pool and the map's size are baked in).
attend is the case of one sequence whose cache is one block (table [0], block size = the cache's capacity).

Batch invariance, by construction: a row's arithmetic is fixed by its own n, its q and its sequence's keys:
the tiles start at key 0 and are 32 wide whatever R, T or B are; the dot product's lane order and tree, the
statistics loop and the value sums run in key order; the grid only says which block computes a row, and the
block's shape is fixed. So a row is bitwise the same alone, in a T-row pass, or in a ragged call beside other
sequences, and attend_paged is bitwise attend over the gathered keys (which row is read is integer arithmetic).
Against the oracle (BLAS dots, a max-shifted softmax divided before the sum) it agrees to float32 rounding, not
bitwise: within 1e-5 absolute on unit-scale q, k, v at the tested n <= 340 (the cpu kernel, numba_attention,
states 2e-6; this one rescales its running sums once per tile and divides once at the end). CuPy compiles with
-ftz: an exponential below 2^-126 (a score 87 below the row's max) counts as 0.

NOT YET RUN ON A GPU: written on a machine without one. The kernel compiles for sm_70..sm_120
(tools/check_cuda_kernels.py, tests/test_cuda_compile.py), its Python side runs through the fake CuPy
(tests/fake_cupy.py, tests/test_cuda_attention.py), and its CUDA source, compiled for the CPU by the emulation of
tests/cuda_on_cpu.h, matches the oracle (tests/test_kernels_on_cpu.py: T not a multiple of the tile, head dims 7 to
256, 1,100 positions, within 1e-5, batch-invariant bitwise; and tests/test_cuda_ops.py section 6 whole, through
tests/test_cuda_ops_on_cpu.py). What only a GPU can say: CUDA's own expf bits, and the speed.

Official implementation: llama.cpp ggml-cuda fattn-vec (flash attention for few query rows, online softmax);
vLLM csrc/attention/paged_attention_v1 (block tables); the online normalizer is Milakov & Gimelshein 2018.
Does NOT include: splitting a row's keys over blocks (flash-decoding: at decode sizes R * H_kv blocks leave
most of a GPU idle; a split that depended on n only would keep invariance), tensor cores, fp16/quantized KV,
G * d beyond MAX_GD or 48 KB of shared memory (the host forms decline: the oracle's NumPy-on-CuPy computes those).
"""

from __future__ import annotations

import numpy as np

from .rowmap import row_map, split  # the host side of the map (fast/rowmap.py): built, checked, viewed

THREADS, TILE = 128, 32  # block shape and key tile: fixed, so a row's reduction order never depends on the call
MAX_SHARED = 48 * 1024  # bytes of shared memory a block may take without opting in
MAX_GD = 4096  # G * d a block holds (q and the running sums of its G heads): 16 heads of 256
OPTIONS = ("--fmad=false",)  # the explicit fmaf are FMAs; nothing else is fused

SOURCE = r"""
#define THREADS 128
#define TILE 32
#define NEG_INF __int_as_float(0xff800000)  // -infinity (NVRTC has no math.h INFINITY)

extern "C" __global__ void __launch_bounds__(THREADS) attend_rows(
        const float* __restrict__ q, const float* __restrict__ k_pool, const float* __restrict__ v_pool,
        const int* __restrict__ seq, const int* __restrict__ row0, const int* __restrict__ n_past,
        const int* __restrict__ tab0, const int* __restrict__ tables, float* __restrict__ o,
        int H_kv, int G, int d, int bs, float scale) {
    extern __shared__ float sh[];
    float* q_s = sh;             // [G, d]    this row's query heads of kv head h
    float* acc = q_s + G * d;    // [G, d]    running sum_j e_j v_j
    float* p = acc + G * d;      // [G, TILE] the tile's scores, then their exponentials
    float* m = p + G * TILE;     // [G]       running max of the scores
    float* l = m + G;            // [G]       running sum of the exponentials
    float* alpha = l + G;        // [G]       this tile's rescale exp(m_old - m_new)
    int* prow = (int*)(alpha + G);  // [TILE] pool row of each key of the tile

    const int r = blockIdx.x / H_kv, h = blockIdx.x % H_kv;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int b = seq[r];                                // lengths from device memory (graph-replayable)
    const int n = n_past[b] + (r - row0[b]) + 1;         // keys row r sees: causal, its own sequence's only
    const int* table = tables + tab0[b];
    const long long q0 = ((long long)r * H_kv + h) * G * d;  // q[r, h, 0, 0] (and o's)

    for (int e = t; e < G * d; e += THREADS) { q_s[e] = q[q0 + e]; acc[e] = 0.0f; }
    for (int g = t; g < G; g += THREADS) { m[g] = NEG_INF; l[g] = 0.0f; }
    __syncthreads();
    for (int j0 = 0; j0 < n; j0 += TILE) {  // tiles start at key 0 whatever the call: the order is the row's own
        const int cnt = min(TILE, n - j0);
        // 1. scores: warp w takes keys w, w + 4, ..; lane l sums c = l, l + 32, .. in order, then a fixed tree
        for (int jj = warp; jj < cnt; jj += THREADS / 32) {
            const int j = j0 + jj;
            const int row = table[j / bs] * bs + j % bs;  // pool row of position j
            const float* kr = k_pool + ((long long)row * H_kv + h) * d;
            for (int g = 0; g < G; ++g) {
                float s = 0.0f;
                for (int c = lane; c < d; c += 32) s = fmaf(q_s[g * d + c], kr[c], s);
                for (int off = 16; off > 0; off >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, off));
                if (lane == 0) p[g * TILE + jj] = __fmul_rn(s, scale);
            }
            if (lane == 0) prow[jj] = row;
        }
        __syncthreads();
        // 2. online softmax statistics: one thread per query head, keys in order
        for (int g = t; g < G; g += THREADS) {
            float mx = m[g];
            for (int jj = 0; jj < cnt; ++jj) mx = fmaxf(mx, p[g * TILE + jj]);
            const float a = m[g] == NEG_INF ? 0.0f : expf(__fsub_rn(m[g], mx));
            float sum = __fmul_rn(l[g], a);
            for (int jj = 0; jj < cnt; ++jj) {
                const float e = expf(__fsub_rn(p[g * TILE + jj], mx));
                p[g * TILE + jj] = e;
                sum = __fadd_rn(sum, e);
            }
            m[g] = mx;
            l[g] = sum;
            alpha[g] = a;
        }
        __syncthreads();
        // 3. values: thread t owns columns c = t, t + 128, .. of every query head; keys in order
        for (int c = t; c < d; c += THREADS) {
            for (int g = 0; g < G; ++g) acc[g * d + c] = __fmul_rn(acc[g * d + c], alpha[g]);
            for (int jj = 0; jj < cnt; ++jj) {
                const float v = v_pool[((long long)prow[jj] * H_kv + h) * d + c];
                for (int g = 0; g < G; ++g) acc[g * d + c] = fmaf(p[g * TILE + jj], v, acc[g * d + c]);
            }
        }
        __syncthreads();
    }
    for (int e = t; e < G * d; e += THREADS) o[q0 + e] = __fdiv_rn(acc[e], l[e / d]);
}
"""


def shared_bytes(G: int, d: int) -> int:
    """Dynamic shared memory of one block: q and acc [G, d], scores [G, TILE], m, l, alpha [G], rows [TILE]."""
    return 4 * (2 * G * d + G * TILE + 3 * G + TILE)


class DeviceAttention:
    """The three oracle functions and the device form on one array module (cupy; the fake CuPy in tests), the
    kernel compiled on first use. backends.cuda_kernels names its methods in the cuda backend's Kernels."""

    def __init__(self, cp):
        self.cp, self._kernel = cp, None

    def attend(self, q, keys, values, n_past, scale):
        """tinyspec.attention.attend: the cache as one block (table [0], block size its capacity)."""
        if keys.ndim != 3:
            raise ValueError(f"keys {keys.shape}: expected [positions, H_kv, d]")
        cap = keys.shape[0]
        if cap < n_past + q.shape[0] or values.shape != keys.shape:
            raise ValueError(f"keys/values {keys.shape}/{values.shape} do not hold {n_past + q.shape[0]} positions")
        return self.attend_paged_ragged(q, keys.reshape(1, *keys.shape), values.reshape(1, *values.shape),
                                        [np.zeros(1, np.int64)], [n_past], np.array([0, q.shape[0]]), scale)

    def attend_paged(self, q, k_pool, v_pool, table, n_past, scale):
        """tinyspec.attention.attend_paged: attend_paged_ragged with one sequence."""
        if q.ndim != 4:
            raise ValueError(f"q {q.shape}: expected [T, H_kv, G, d]")
        return self.attend_paged_ragged(q, k_pool, v_pool, [table], [n_past], np.array([0, q.shape[0]]), scale)

    def attend_paged_ragged(self, q, k_pool, v_pool, tables, n_pasts, bounds, scale):
        """tinyspec.attention.attend_paged_ragged: the row map built on the host, uploaded in one copy, every
        sequence's rows in one launch. None (declined: the caller's oracle computes it) when G * d is too wide."""
        if q.ndim != 4 or k_pool.ndim != 4:
            raise ValueError(f"q {q.shape}, k_pool {k_pool.shape}: expected [R, H_kv, G, d], [n_blocks, bs, H_kv, d]")
        R, H_kv, G, d = q.shape
        if shared_bytes(G, d) > MAX_SHARED or G * d > MAX_GD:
            return None
        if int(bounds[-1]) != R:
            raise ValueError(f"bounds end at {int(bounds[-1])}, q has {R} rows")
        rows, R, B = row_map(tables, n_pasts, bounds, k_pool.shape[1], k_pool.shape[0])
        dev = self.cp.asarray(rows)  # the one upload of the call
        return self.attend_rows(q, k_pool, v_pool, *split(dev, R, B), scale)

    def attend_rows(self, q, k_pool, v_pool, seq, row0, n_past, tab0, tables, scale, out=None):
        # q [R, H_kv, G, d], pools [n_blocks, bs, H_kv, d], seq [R], row0, n_past, tab0 [B], tables: int32
        # device arrays -> o [R, H_kv, G, d]
        """The kernel: every length and block id from device memory, none checked (a check would be a sync):
        the caller vouches for them (row_map checks the host forms'). out: a C-contiguous float32 [R, H_kv, G, d]
        to write (no allocation: capturable in a CUDA graph with contiguous float32 q and pools)."""
        cp = self.cp
        R, H_kv, G, d = q.shape
        if k_pool.shape[2:] != (H_kv, d) or v_pool.shape != k_pool.shape:
            raise ValueError(f"k_pool/v_pool {k_pool.shape}/{v_pool.shape}: expected [n_blocks, bs, {H_kv}, {d}]")
        if shared_bytes(G, d) > MAX_SHARED or G * d > MAX_GD:
            raise ValueError(f"attend_rows: G * d = {G * d} is beyond this kernel (at most {MAX_GD})")
        for name, a in (("seq", seq), ("row0", row0), ("n_past", n_past), ("tab0", tab0), ("tables", tables)):
            if not isinstance(a, cp.ndarray) or a.dtype != np.int32 or a.ndim != 1:
                raise ValueError(f"attend_rows: {name} must be a 1-D int32 device array")
        if seq.shape[0] != R or not (row0.shape == n_past.shape == tab0.shape):
            raise ValueError(f"attend_rows: seq [{seq.shape[0]}] for {R} rows, row0/n_past/tab0 "
                             f"{row0.shape}/{n_past.shape}/{tab0.shape}")
        q = cp.ascontiguousarray(q, dtype=np.float32)
        k_pool = cp.ascontiguousarray(k_pool, dtype=np.float32)
        v_pool = cp.ascontiguousarray(v_pool, dtype=np.float32)
        if out is None:
            out = cp.empty(q.shape, dtype=np.float32)
        elif (not isinstance(out, cp.ndarray) or out.dtype != np.float32 or out.shape != q.shape
              or not out.flags.c_contiguous):
            raise ValueError(f"attend_rows: out must be a C-contiguous float32 device array of shape {q.shape}")
        if R and H_kv:
            if self._kernel is None:  # compiled at the first launch (CuPy caches the cubin on disk)
                self._kernel = cp.RawKernel(SOURCE, "attend_rows", options=OPTIONS)
            self._kernel((R * H_kv,), (THREADS,),
                         (q, k_pool, v_pool, seq, row0, n_past, tab0, tables, out, np.int32(H_kv), np.int32(G),
                          np.int32(d), np.int32(k_pool.shape[1]), np.float32(scale)),
                         shared_mem=shared_bytes(G, d))
        return out
