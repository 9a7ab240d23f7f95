"""CuPy kernels: quant_linear and get_rows straight from GGUF bytes, and the GDN delta-rule scan, on the GPU.

Same names, arguments and results as the NumPy oracles (tinyspec/ops.py, tinyspec/gdn.py), on cupy arrays:

    quant_linear(x, raw, ggml_type, shape)   y[t, r] = sum_j W[r, j] * x[t, j]        [T, in] -> [T, out]
    bind_experts(raw, ggml_type, shape)      moe.experts_linear: rows grouped by expert   [P, in] -> [P, out]
                                             times W_e, every expert in one launch (device offsets [E + 1])
    get_rows(raw, ggml_type, shape, ids)     W[ids], bit-exact                          [n] -> [n, in]
    delta_rule_step(state, q, k, v, log_decay, beta)          one token, every value head
    gdn_scan(q, k, v, log_decay, beta, state, states_out)     T tokens; states_out = the snapshot ring

W = dequantize(raw, ggml_type, shape) is never built: raw (uint8, [out, row bytes], uploaded once at load)
is decoded block by block in registers. Types: F32, F16, BF16, Q8_0, Q4_K, Q5_K, Q6_K (others raise
ValueError; the cuda backend uploads a weight of another type dequantized, as F32: backends.cuda_tensors).

Byte layouts (names after ggml's block structs; bit-exact decoders and longer tables in tinyspec/quants):

    type  block   bytes  fields in order                         value
    F32   1       4      IEEE binary32                            the bits themselves
    F16   1       2      IEEE binary16                            exact widening
    BF16  1       2      high half of a binary32                  bits << 16
    Q8_0  32      34     d f16 | qs[32] int8                      d * q
    Q4_K  256     144    d f16 | dmin f16 | scales[12] | qs[128]  (d*sc) * q - (dmin*m), q 4-bit, sc/m 6-bit
    Q5_K  256     176    d | dmin | scales[12] | qh[32] | qs[128] same, q = nibble | (bit j of qh[l]) << 4
    Q6_K  256     210    ql[128] | qh[64] | scales[16] int8 | d    (d*sc) * (q - 32), q = 4 low + 2 high bits

    Q4_K/Q5_K sub-block j (32 values): qs byte 32(j/2) + l holds value l in nibble j%2; the 12 scale bytes
    s give sc[j] = s[j] & 63, m[j] = s[j+4] & 63 for j < 4, and for j >= 4
    sc[j] = (s[j+4] & 15) | (s[j-4] >> 6) << 4,  m[j] = (s[j+4] >> 4) | (s[j] >> 6) << 4.
    Q6_K value 128h + 32k + l: low 4 bits in nibble k/2 of ql[64h + 32(k%2) + l], high 2 bits at bit 2k
    of qh[32h + l], scale scales[(128h + 32k + l) / 16].

Every weight is decoded to exactly the oracle's float32 (same f32 operations in the same order, written
with __fmul_rn / __fsub_rn, which the compiler never fuses into an FMA), so get_rows is bit-exact and
quant_linear sums exact weights. Small integer codes become floats by the "magic number" trick
(int bits 0x4B400000 + q is the float 1.5*2^23 + q; subtracting 1.5*2^23 leaves q exactly), which runs
on the full-rate FP32/INT pipes instead of the quarter-rate int->float converter.

Two kernels compute quant_linear; which one depends on the weight's type and shape only, never on T:

    tensor cores (mma_linear_k)  Q4_K, Q5_K, Q6_K, Q8_0 with in % 256 == 0, on sm_80+ (the real files' case)
    float FMAs (quant_linear_k)  F32, F16, BF16, and the others elsewhere (or with use_mma = False)

A MoE expert tensor [E, out, in] takes quant_linear_grouped_k, the float kernel's tile (quant_linear_tile) run per
(expert, tile of up to NT of its rows): bitwise the float kernel on that expert alone, never the tensor cores
(bind_experts' docstring says what that guarantees; a grouped tensor-core kernel is not written).

Tensor-core kernel. Every quantized weight is W = dl * code - ml over a group of 16 or 32 values (dl, ml
the oracle's (d * sc) and (dmin * m); ml = 0 but for Q4_K/Q5_K) with a small integer code, exact in bf16.
Each float32 x splits exactly into three bf16, x = hi + mid + lo (8 significant bits each: hi = x with its
low 16 bits cleared, mid the same of x - hi, lo the rest), so code * piece is exact, and

    y[t, r] = sum_groups  dl * (sum_l code_l x_l)  -  ml * (sum_l x_l)

where the inner sum is three chained bf16 MMAs (m16n8k16: A = codes of 16 rows x 16 values, B = pieces
of 16 values x 8 tokens, float32 accumulators) and the outer one float32 fmaf. A helper kernel
(mma_prep_x) writes x once per call in the MMA's fragment order, with the float32 sum of every 16
values. One warp = 16 rows x 8 tokens; it walks the chunks c = s, s+S, ... (S split warps, from the
shape), holds the next chunk's weight bytes in registers while computing on this one, and loads the
next group's x fragments a group ahead. Tokens come in tiles of 8 (the grid's y): T = 1..8 read the
weights once and cost about the same, where the float kernel's time grows with T (LESSONS 10 measures both).
Batch invariance: a token's column of an MMA depends only on that token's B column and the weights, the
tile of 8 it lands in changes nothing else, and S, the group order and the S-way sum are fixed by the
shape: checked bitwise for T = 1..16 and 37. Accuracy: the products are exact, so only float32 additions
round: 32 values inside the tensor core, then in / 32 scaled group sums, far inside the bound below
(taken over |dl code| + |ml|, since the two terms are summed apart); a Q8_0 row with one code +-1
returns x bit for bit (tests/test_cuda_ops.py).
Speed: tools/bench_cuda.py; LESSONS 10 (docs/performance-log.md old 20) measured it per type and shape on
an H100. It beats the float kernel but stays well short of the read bandwidth: ncu finds it latency-bound,
stalled on global loads (long scoreboard) with only 16 warps per SM (128 registers each), not bandwidth-bound.

Thread mapping of the float kernel quant_linear_k (weight-stationary; W is the memory traffic, x is tiny):

    row of `in` values = chunks of 256 (one K-quant super-block, 8 Q8_0 blocks, 256 floats)
    in a chunk, lane l of a warp owns two quads: values 4l..4l+3 and 128+4l..128+4l+3
    block = 8 warps = G row groups x S split warps  (S in 1, 2, 4, 8 from the shape only, G = 8 / S)
    warp (g, s) handles RPW rows and the chunks c = s, s+S, s+2S, ...; for each chunk it decodes its
        8 values of each of its RPW rows once into registers, then for every t < T loads x[t] quads
        (float4, read-only cache) and adds w * x[t] into acc[row][t] with one fmaf per value
    epilogue: each acc[row][t] is summed over the 32 lanes by a xor butterfly (16, 8, 4, 2, 1), then
        over the S split warps in order s = 0, 1, ..., S-1 through shared memory

S > 1 gives short matrices enough warps (1024 rows alone would fill an eighth of an H100). x is read
through the read-only cache (__ldg float4), not staged in shared memory: each x quad goes into registers
once per chunk and serves the warp's RPW rows, and the G row groups of a block read the same quads at
about the same time, so L1 serves them. All of x would not fit in shared memory (T * in * 4 bytes =
786 KB at 16 x 12288), and tiling it would add a block barrier per tile.

Batch invariance (row t of a T-row call is bitwise equal to a one-row call on x[t]): the arithmetic
that produces y[t, r] is fixed by the lane map (quads), the split S (a function of out and in only),
the per-lane order (chunks ascending, quad 0 then 1, elements 0..3, one fmaf each) and the two fixed
reduction trees. T only selects NT (the template's row capacity, 1/2/4/8/16; T > 16 runs in tiles of
16) and RPW (rows per warp); both change which thread computes a sum, never the sum. Checked bitwise
for T = 1..16 by tests/test_cuda_ops.py (which runs where a GPU is present and skips elsewhere).

Subnormals: CuPy compiles every kernel with -ftz=true (appended after our options), so float32
arithmetic flushes values below 2^-126 to zero. No weight decoded from a block type is subnormal: fp16
fields widen to normal floats, and (d*sc)*q and dmin*m are exact multiples of 2^-24, so every decoded
value is 0 or at least 2^-24 in magnitude. get_rows of plain types only moves bits. So get_rows stays
bit-exact for every input; quant_linear and the GDN scan differ from the oracle only where an F32/BF16
weight, a product or a sum falls below 1.2e-38.

Accuracy against the oracle (a BLAS matvec of the same exact weights, another summation order): both
are within gamma_in * sum_j |W[r, j] x[t, j]| of the exact sum (Higham, Accuracy and Stability, eq. 3.5),
so |y - y_oracle| <= 2 * 1.01 * in * 2^-24 * (|W| @ |x|), the bound the tests check.

Roofline (H100 SXM: ~3.35 TB/s HBM, 33.5 T fp32 FMA/s, 128 lane-ops per clock per SM): decoding costs
~4-5 lane-ops per value (extract, magic convert, multiply, subtract) and then T fmaf per value. At 70% of
HBM, Q4_K delivers 4.2 T values/s, so T = 1 fits, T = 2 is near the issue limit and T >= 4 is compute-
bound: a 4-bit type at T = 8 would need 33 T fmaf/s, the whole chip. Q8_0 stays memory-bound to T ~ 4,
F16/BF16 to T ~ 8, F32 to T = 16. Integer dot products (llama.cpp's dp4a on an 8-bit x) would go
faster but quantize x, which this module does not do: its results stay within float rounding of the
oracle. tools/bench_cuda.py measures the numbers. (This is why K-quants and Q8_0 take the tensor cores.)

GDN (gdn_scan): one thread block per value head, one thread per value column v, the K entries S[:, v]
of its column in registers for the whole call. Per token: decay, predict (sum over K in order), correct,
write, read, exactly the oracle's f32 operations in the oracle's order (NumPy sums axis 1 in order);
the only differences are exp (computed in float64 and rounded once) and the flush of subnormals
described above. K = 128 keeps its column in 255 registers (a few spill to L1). If states_out (the snapshot ring,
[>= T, HV, K, V] on the device) is given, the state after token t is written to slot t from registers:
no copy through the host. A T-token scan is bitwise equal to T one-token steps (same per-token
arithmetic, state kept in float32 registers). Rolling back to "j tokens kept" is
`state[...] = states_out[j - 1]` (a device-to-device copy).

Official implementation: llama.cpp ggml-cuda mmvq.cu / dequantize.cuh (integer dot products) and
gated_delta_net.cu; fla ops/gated_delta_rule/fused_recurrent.py; the exact bf16 split is the idea of
"3xTF32"/bf16x3 emulation (CUTLASS). Does NOT include: other GGML types on tensor cores (F16/BF16 stay on
FMAs), quantized activations, the conv step, multi-sequence batching of the scan.
"""

from __future__ import annotations

import cupy as cp
import numpy as np

from ..quants import GGMLType

SUPPORTED = (GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K)
# Byte alignment each decoder needs of the weight's first byte (widest load: uint4 header, float, ushort).
_ALIGN = {GGMLType.F32: 4, GGMLType.F16: 2, GGMLType.BF16: 2, GGMLType.Q8_0: 2,
          GGMLType.Q4_K: 16, GGMLType.Q5_K: 16, GGMLType.Q6_K: 2}
CHUNK = 256  # values per chunk: 32 lanes x 2 quads x 4
WARPS = 8  # warps per block of quant_linear
NT_RPW = ((1, 1), (2, 2), (4, 4), (8, 4), (16, 4))  # (max rows of x per launch, weight rows per warp)
TARGET_WARPS = 8192  # split a row over more warps until out * S reaches this (a full H100 is ~8448 warps)
MAX_K, MAX_V = 256, 256  # GDN head sizes the scan kernel accepts (K registers per thread, V threads)
MMA_TYPES = (GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.Q8_0)  # tensor-core path (sm_80+, in % 256 == 0)
MMA_RTS = (1,)  # 16-row tiles per warp the kernel is compiled for (RT = 2 was slower on an H100: _mma_plan)
MMA_TARGET_WARPS = 2048  # split rows over more warps until (row tiles) * S reaches this
use_mma = True  # False: every type takes the float-FMA kernel (tools/bench_cuda.py --kernel fma compares)

_SOURCE = r"""
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;

#define T_F32 0
#define T_F16 1
#define T_Q8_0 8
#define T_Q4_K 12
#define T_Q5_K 13
#define T_Q6_K 14
#define T_BF16 30

// ------------------------------------------------------------------ exact conversions

__device__ __forceinline__ float f16_to_f32(u32 h) {  // IEEE binary16 bits -> float, exact
    const u32 sign = (h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 1023u;
    if (e == 0u) {  // zero or subnormal: m * 2^-24
        const float v = __fmul_rn((float)m, 5.9604644775390625e-08f);
        return sign ? -v : v;
    }
    if (e == 31u) return __uint_as_float(sign | 0x7F800000u | (m << 13));  // inf, nan (payload kept)
    return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));  // rebias the exponent 15 -> 127
}

__device__ __forceinline__ float code_to_f32(int q) {  // exact for |q| < 2^22
    // 0x4B400000 is 1.5 * 2^23, where the float spacing is 1: adding q to its bits adds q to its value.
    return __fsub_rn(__int_as_float(0x4B400000 + q), 12582912.0f);
}

__device__ __forceinline__ int s8(u32 bits) { return (int)((bits & 0xFFu) ^ 0x80u) - 128; }  // low byte as int8

__device__ __forceinline__ u32 ld16(const u8* p) { return *(const u16*)p; }  // p even
__device__ __forceinline__ u32 ld32_a2(const u8* p) { return ld16(p) | (ld16(p + 2) << 16); }  // p even
__device__ __forceinline__ u32 ld32(const u8* p) { return *(const u32*)p; }  // p multiple of 4

// ------------------------------------------------------------------ decoders
// A chunk is values 256c .. 256c + 255 of a row; lane l decodes quad 0 = values 256c + 4l + e and
// quad 1 = values 256c + 128 + 4l + e (e = 0..3) into w[e] and w[4 + e]. Quads at or past n_in are
// not read (w = 0); only the plain types and Q8_0 can have them (K-quant rows are whole chunks).

__device__ __forceinline__ void quad_f32(const u8* row, int p, int n_in, int vec, float* w) {
    const float* r = (const float*)row;
    if (vec && p + 4 <= n_in) {
        const float4 f = *(const float4*)(r + p);
        w[0] = f.x; w[1] = f.y; w[2] = f.z; w[3] = f.w;
    } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) w[e] = p + e < n_in ? r[p + e] : 0.0f;
    }
}

__device__ __forceinline__ void quad_f16(const u8* row, int p, int n_in, int vec, float* w) {
    const u16* r = (const u16*)row;
    if (vec && p + 4 <= n_in) {
        const uint2 u = *(const uint2*)(r + p);  // little-endian: element p in the low half of u.x
        w[0] = f16_to_f32(u.x & 0xFFFFu); w[1] = f16_to_f32(u.x >> 16);
        w[2] = f16_to_f32(u.y & 0xFFFFu); w[3] = f16_to_f32(u.y >> 16);
    } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) w[e] = p + e < n_in ? f16_to_f32(r[p + e]) : 0.0f;
    }
}

__device__ __forceinline__ void quad_bf16(const u8* row, int p, int n_in, int vec, float* w) {
    const u16* r = (const u16*)row;
    if (vec && p + 4 <= n_in) {
        const uint2 u = *(const uint2*)(r + p);
        w[0] = __uint_as_float(u.x << 16); w[1] = __uint_as_float(u.x & 0xFFFF0000u);
        w[2] = __uint_as_float(u.y << 16); w[3] = __uint_as_float(u.y & 0xFFFF0000u);
    } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) w[e] = p + e < n_in ? __uint_as_float((u32)r[p + e] << 16) : 0.0f;
    }
}

__device__ __forceinline__ void quad_q8_0(const u8* row, int p, float* w) {
    // block p / 32 (34 bytes: d f16, qs[32] int8); x = d * q
    const u8* blk = row + 34 * (p >> 5);
    const float d = f16_to_f32(ld16(blk));
    const u32 q = ld32_a2(blk + 2 + (p & 31));  // codes of values p .. p+3
#pragma unroll
    for (int e = 0; e < 4; ++e) w[e] = __fmul_rn(d, code_to_f32(s8(q >> (8 * e))));
}

__device__ __forceinline__ void chunk_q4_k(const u8* row, int c, int lane, float* w) {
    // super-block c (144 bytes: d, dmin, scales[12], qs[128]); x = (d * sc) * q - (dmin * m)
    const u8* blk = row + 144 * c;
    const uint4 hd = *(const uint4*)blk;  // .x = d | dmin << 16, .y = s[0..3], .z = s[4..7], .w = s[8..11]
    const float d = f16_to_f32(hd.x & 0xFFFFu), dmin = f16_to_f32(hd.x >> 16);
    const int i = lane >> 3;  // quad 0 lies in sub-block i (0..3), quad 1 in sub-block 4 + i
    const u32 sy = (hd.y >> (8 * i)) & 0xFFu, sz = (hd.z >> (8 * i)) & 0xFFu, sw = (hd.w >> (8 * i)) & 0xFFu;
    const int sc0 = sy & 63, m0 = sz & 63;  // sub-block i < 4
    const int sc1 = (sw & 15) | ((sy >> 6) << 4), m1 = (sw >> 4) | ((sz >> 6) << 4);  // sub-block 4 + i
    const float dl0 = __fmul_rn(d, code_to_f32(sc0)), ml0 = __fmul_rn(dmin, code_to_f32(m0));
    const float dl1 = __fmul_rn(d, code_to_f32(sc1)), ml1 = __fmul_rn(dmin, code_to_f32(m1));
    // sub-block j, value l is nibble j % 2 of qs[32 (j / 2) + l]; here l = 4 (lane % 8) + e
    const int off = 16 + 32 * (lane >> 4) + 4 * (lane & 7), shift = 4 * (i & 1);
    const u32 q0 = ld32(blk + off) >> shift, q1 = ld32(blk + off + 64) >> shift;  // sub-blocks i, 4 + i
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        w[e] = __fsub_rn(__fmul_rn(dl0, code_to_f32((q0 >> (8 * e)) & 15u)), ml0);
        w[4 + e] = __fsub_rn(__fmul_rn(dl1, code_to_f32((q1 >> (8 * e)) & 15u)), ml1);
    }
}

__device__ __forceinline__ void chunk_q5_k(const u8* row, int c, int lane, float* w) {
    // super-block c (176 bytes: d, dmin, scales[12], qh[32], qs[128]); Q4_K plus a fifth bit
    const u8* blk = row + 176 * c;
    const uint4 hd = *(const uint4*)blk;
    const float d = f16_to_f32(hd.x & 0xFFFFu), dmin = f16_to_f32(hd.x >> 16);
    const int i = lane >> 3;
    const u32 sy = (hd.y >> (8 * i)) & 0xFFu, sz = (hd.z >> (8 * i)) & 0xFFu, sw = (hd.w >> (8 * i)) & 0xFFu;
    const int sc0 = sy & 63, m0 = sz & 63;
    const int sc1 = (sw & 15) | ((sy >> 6) << 4), m1 = (sw >> 4) | ((sz >> 6) << 4);
    const float dl0 = __fmul_rn(d, code_to_f32(sc0)), ml0 = __fmul_rn(dmin, code_to_f32(m0));
    const float dl1 = __fmul_rn(d, code_to_f32(sc1)), ml1 = __fmul_rn(dmin, code_to_f32(m1));
    const int l = 4 * (lane & 7), off = 48 + 32 * (lane >> 4) + l, shift = 4 * (i & 1);
    const u32 q0 = ld32(blk + off) >> shift, q1 = ld32(blk + off + 64) >> shift;
    const u32 h = ld32(blk + 16 + l);  // qh[l .. l+3]: bit j of qh[l] is the fifth bit of value l of sub-block j
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const int c0 = ((q0 >> (8 * e)) & 15u) | (((h >> (8 * e + i)) & 1u) << 4);
        const int c1 = ((q1 >> (8 * e)) & 15u) | (((h >> (8 * e + 4 + i)) & 1u) << 4);
        w[e] = __fsub_rn(__fmul_rn(dl0, code_to_f32(c0)), ml0);
        w[4 + e] = __fsub_rn(__fmul_rn(dl1, code_to_f32(c1)), ml1);
    }
}

__device__ __forceinline__ void chunk_q6_k(const u8* row, int c, int lane, float* w) {
    // super-block c (210 bytes, only 2-aligned: ql[128], qh[64], scales[16] int8, d); x = (d * sc) * (q - 32)
    const u8* blk = row + 210 * c;
    const float d = f16_to_f32(ld16(blk + 208));
    const int k = lane >> 3, l = 4 * (lane & 7);  // quad h (0, 1) holds values 128h + 32k + l + e
    const int sl = 4 * (k >> 1), sh = 2 * k;
    const u32 ql0 = ld32_a2(blk + 32 * (k & 1) + l) >> sl, ql1 = ld32_a2(blk + 64 + 32 * (k & 1) + l) >> sl;
    const u32 qh0 = ld32_a2(blk + 128 + l) >> sh, qh1 = ld32_a2(blk + 160 + l) >> sh;
    // 16-value sub-blocks: (128h + 32k + l) / 16 = 8h + lane / 4
    const float dl0 = __fmul_rn(d, code_to_f32(s8(blk[192 + (lane >> 2)])));
    const float dl1 = __fmul_rn(d, code_to_f32(s8(blk[200 + (lane >> 2)])));
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const int c0 = (int)(((ql0 >> (8 * e)) & 15u) | (((qh0 >> (8 * e)) & 3u) << 4)) - 32;
        const int c1 = (int)(((ql1 >> (8 * e)) & 15u) | (((qh1 >> (8 * e)) & 3u) << 4)) - 32;
        w[e] = __fmul_rn(dl0, code_to_f32(c0));
        w[4 + e] = __fmul_rn(dl1, code_to_f32(c1));
    }
}

template <int TYPE>
__device__ __forceinline__ void decode_chunk(const u8* row, int c, int lane, int n_in, int vec, float* w) {
    if (TYPE == T_Q4_K) chunk_q4_k(row, c, lane, w);
    else if (TYPE == T_Q5_K) chunk_q5_k(row, c, lane, w);
    else if (TYPE == T_Q6_K) chunk_q6_k(row, c, lane, w);
    else {  // 32-value blocks and plain values: two independent quads, either may lie past the row
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int p = 256 * c + 128 * h + 4 * lane;
            float* wq = w + 4 * h;
            if (p >= n_in) wq[0] = wq[1] = wq[2] = wq[3] = 0.0f;
            else if (TYPE == T_Q8_0) quad_q8_0(row, p, wq);
            else if (TYPE == T_F16) quad_f16(row, p, n_in, vec, wq);
            else if (TYPE == T_BF16) quad_bf16(row, p, n_in, vec, wq);
            else quad_f32(row, p, n_in, vec, wq);
        }
    }
}

__device__ __forceinline__ int quad_len(int p, int n_in) {  // values of the quad at p that exist: 0..4
    const int n = n_in - p;
    return n < 0 ? 0 : (n > 4 ? 4 : n);
}

// ------------------------------------------------------------------ quant_linear

template <int TYPE, int NT, int RPW>
__device__ __forceinline__ void quant_linear_tile(  // the block's rows of y = x W^T for one tile of x
    const float* __restrict__ x, long long ldx, int T,      // x [T, ldx] float32, T <= NT
    const u8* __restrict__ raw, long long row_bytes,        // weight [n_out, row_bytes]
    int n_out, int n_in, int vec, int S,                    // S split warps per row (1, 2, 4, 8)
    float* __restrict__ y)                                  // y [T, n_out]
{
    __shared__ float part[8][RPW][NT];  // per-warp lane sums, combined over the S split warps
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int s = warp % S, g = warp / S, G = 8 / S;
    const int row0 = (blockIdx.x * G + g) * RPW;
    const int n_chunks = (n_in + 255) >> 8;

    float acc[RPW][NT];
#pragma unroll
    for (int r = 0; r < RPW; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;

    for (int c = s; c < n_chunks; c += S) {
        const int p0 = 256 * c + 4 * lane, p1 = p0 + 128;
        const int n0 = quad_len(p0, n_in), n1 = quad_len(p1, n_in);
        float w[RPW][8];  // 1. decode this lane's 8 values of each row once
#pragma unroll
        for (int r = 0; r < RPW; ++r) {
            if (row0 + r < n_out) {
                decode_chunk<TYPE>(raw + (long long)(row0 + r) * row_bytes, c, lane, n_in, vec, w[r]);
            } else {
#pragma unroll
                for (int e = 0; e < 8; ++e) w[r][e] = 0.0f;
            }
        }
#pragma unroll
        for (int t = 0; t < NT; ++t) {  // 2. apply them to every row of x
            if (t < T) {
                const float* xt = x + t * ldx;
                const float4 a = n0 > 0 ? __ldg((const float4*)(xt + p0)) : make_float4(0.f, 0.f, 0.f, 0.f);
                const float4 b = n1 > 0 ? __ldg((const float4*)(xt + p1)) : make_float4(0.f, 0.f, 0.f, 0.f);
                const float xa[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
                for (int r = 0; r < RPW; ++r) {
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        if (e < n0) acc[r][t] = __fmaf_rn(w[r][e], xa[e], acc[r][t]);
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        if (e < n1) acc[r][t] = __fmaf_rn(w[r][4 + e], xa[4 + e], acc[r][t]);
                }
            }
        }
    }

    // 3. sum over the 32 lanes: xor butterfly, every lane ends with the same (commutative) sums
#pragma unroll
    for (int r = 0; r < RPW; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            float v = acc[r][t];
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, off));
            acc[r][t] = v;
        }

    if (S == 1) {
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < RPW; ++r)
#pragma unroll
                for (int t = 0; t < NT; ++t)
                    if (t < T && row0 + r < n_out) y[(long long)t * n_out + row0 + r] = acc[r][t];
        }
        return;
    }
    // 4. sum over the S split warps of each row group, in order s = 0 .. S-1
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < RPW; ++r)
#pragma unroll
            for (int t = 0; t < NT; ++t) part[warp][r][t] = acc[r][t];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < G * RPW * NT; i += blockDim.x) {
        const int gg = i / (RPW * NT), r = (i / NT) % RPW, t = i % NT;
        const int row = (blockIdx.x * G + gg) * RPW + r;
        if (t < T && row < n_out) {
            float v = part[gg * S][r][t];
            for (int ss = 1; ss < S; ++ss) v = __fadd_rn(v, part[gg * S + ss][r][t]);
            y[(long long)t * n_out + row] = v;
        }
    }
}

template <int TYPE, int NT, int RPW>
__global__ void __launch_bounds__(256) quant_linear_k(
    const float* __restrict__ x, long long ldx, int T, const u8* __restrict__ raw, long long row_bytes,
    int n_out, int n_in, int vec, int S, float* __restrict__ y)  // quant_linear_tile's arguments
{
    quant_linear_tile<TYPE, NT, RPW>(x, ldx, T, raw, row_bytes, n_out, n_in, vec, S, y);
}

// ------------------------------------------------------------------ quant_linear grouped by expert (MoE)
// x rows grouped by expert: expert e's rows are offsets[e] .. offsets[e+1]-1 of x and y (device offsets, no
// count on the host), its weight the e-th [n_out, row_bytes] slice of raw. Expert e's rows are cut in tiles of
// NT, tiles listed in expert order; blockIdx.y = one tile (the grid's y is a host bound on the count), which the
// block's first warp finds by a scan of the tile counts ceil(count_e / NT) in chunks of 32 experts. Then the
// tile is exactly a quant_linear_k call on those rows and that expert's bytes: a row's bits depend only on its
// x row and its expert's weights (batch invariance), and are those of the float kernel on that expert alone.

template <int TYPE, int NT, int RPW>
__global__ void __launch_bounds__(256) quant_linear_grouped_k(
    const float* __restrict__ x, long long ldx,             // x [P, ldx], rows grouped by expert
    const int* __restrict__ offsets, int E,                 // [E + 1]
    const u8* __restrict__ raw, long long expert_bytes, long long row_bytes,  // [E, n_out, row_bytes]
    int n_out, int n_in, int vec, int S, float* __restrict__ y)               // y [P, n_out]
{
    __shared__ int tile[3];  // expert, first row, rows
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x, g = blockIdx.y;
        int before = 0, found = -1, first = 0;  // tiles of the experts before this chunk
        for (int e0 = 0; e0 < E && found < 0; e0 += 32) {  // found, before: the same in every lane
            const int e = e0 + lane;
            const int n = e < E ? (offsets[e + 1] - offsets[e] + NT - 1) / NT : 0;
            int incl = n;  // inclusive scan of the tile counts over the lanes
#pragma unroll
            for (int off = 1; off < 32; off <<= 1) {
                const int v = __shfl_up_sync(0xffffffffu, incl, off);
                if (lane >= off) incl += v;
            }
            const int excl = before + incl - n;
            const unsigned mine = __ballot_sync(0xffffffffu, g >= excl && g < excl + n);
            if (mine) {
                const int src = __ffs(mine) - 1;
                found = e0 + src;
                first = __shfl_sync(0xffffffffu, excl, src);
            }
            before += __shfl_sync(0xffffffffu, incl, 31);
        }
        if (lane == 0) {
            tile[0] = found;
            if (found >= 0) {
                tile[1] = offsets[found] + (g - first) * NT;
                tile[2] = min(NT, offsets[found + 1] - tile[1]);
            }
        }
    }
    __syncthreads();
    const int e = tile[0];
    if (e < 0) return;  // past the last tile: the whole block leaves
    const long long r0 = tile[1];
    quant_linear_tile<TYPE, NT, RPW>(x + r0 * ldx, ldx, tile[2], raw + (long long)e * expert_bytes, row_bytes,
                                     n_out, n_in, vec, S, y + r0 * n_out);
}

// ------------------------------------------------------------------ quant_linear on tensor cores (sm_80+)
// K-quants and Q8_0, rows of whole 256-value chunks. W = dl * code - ml per group of values (ml = 0 but for
// Q4_K/Q5_K), codes are small integers (exact in bf16), and x = hi + mid + lo splits each float32
// activation exactly into three bf16 (8 significant bits each), so every product code * piece is exact and
// the tensor core only adds: sum_l code_l x_l is three chained bf16 MMAs with float32 accumulation, then
// y += dl * that - ml * sum_l x_l in float32.
// MMA m16n8k16: A = codes [16 weight rows, 16 values], B = x pieces [16 values, 8 tokens], C [16, 8].
// Thread (g = lane / 4, q4 = lane % 4) supplies rows g and g + 8 of A and token g of B for the values
// l = 16 st + 4 q4 + e (e = 0..3) of each 32-value group j: A and B list the values in the same order,
// and which lane holds which k of one MMA changes only where its inputs live, not its sum.
// mma_prep_x writes x once per call in exactly that fragment order (3 pieces x 2 bf16 pairs per lane and
// 16-value step) with the float32 sums of each 16 values; the weight kernel then only loads them.

__device__ __forceinline__ u32 bf16x2_exact(float lo, float hi) {  // two floats with <= 8 significant bits
    return __byte_perm(__float_as_uint(lo), __float_as_uint(hi), 0x7632);
}

__device__ __forceinline__ void split3(float x, float* p) {  // x = p[0] + p[1] + p[2] exactly, each a bf16
    const float h = __uint_as_float(__float_as_uint(x) & 0xFFFF0000u);  // top 8 significant bits
    const float r = __fsub_rn(x, h);                                     // the other 16, exact
    const float m = __uint_as_float(__float_as_uint(r) & 0xFFFF0000u);
    p[0] = h; p[1] = m; p[2] = __fsub_rn(r, m);                         // <= 8 bits left, exact
}

extern "C" __global__ void mma_prep_x(const float* __restrict__ x, long long ldx, int T, int n_steps,
                                      uint2* __restrict__ xb, float* __restrict__ xsum)
{   // thread = (token tile, 16-value step, lane); xb [tiles, n_steps, 32 lanes, 3 pieces] bf16 pairs (hi, mid,
    // lo), xsum [tiles, n_steps, 8 tokens]: a token >= T gives zeros
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const int n_tiles = (T + 7) >> 3;
    if (i >= (long long)n_tiles * n_steps * 32) return;
    const int lane = (int)(i & 31), step = (int)((i >> 5) % n_steps), tile = (int)((i >> 5) / n_steps);
    const int g = lane >> 2, q4 = lane & 3, tok = tile * 8 + g;
    float4 xv = make_float4(0.f, 0.f, 0.f, 0.f);
    if (tok < T) xv = *(const float4*)(x + (long long)tok * ldx + 16 * step + 4 * q4);
    float p0[3], p1[3], p2[3], p3[3];
    split3(xv.x, p0); split3(xv.y, p1); split3(xv.z, p2); split3(xv.w, p3);
#pragma unroll
    for (int pc = 0; pc < 3; ++pc) xb[i * 3 + pc] = make_uint2(bf16x2_exact(p0[pc], p1[pc]), bf16x2_exact(p2[pc], p3[pc]));
    if (lane < 8) {  // lane t: sum of token tile * 8 + t over the step's 16 values, in order
        const int tt = tile * 8 + lane;
        float s = 0.0f;
        if (tt < T)
            for (int l = 0; l < 16; ++l) s = __fadd_rn(s, x[(long long)tt * ldx + 16 * step + l]);
        xsum[((long long)tile * n_steps + step) * 8 + lane] = s;
    }
}

__device__ __forceinline__ void mma_bf16(float* c, const u32* a, u32 b0, u32 b1) {  // c += A B, m16n8k16
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ u32 bf16x2_codes(u32 bytes, u32 sel, u32 offset) {
    // two code bytes (< 128, picked by sel) -> bf16x2 of (128 + code) by bit pattern 0x4300 | code, then
    // one exact packed fma: (128 + code) * 1 + offset, offset = -128 (or -160 for Q6_K's code - 32)
    const u32 biased = __byte_perm(bytes, 0x43434343u, sel);
    u32 out;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(out) : "r"(biased), "r"(0x3F803F80u), "r"(offset));
    return out;
}

template <int TYPE> struct Words;  // the bytes of one weight row's chunk that one thread needs, in registers
// value l = 16 st + 4 q4 + e of 32-value group j; the thread's 4 values of a (j, st) sit in one u32 per field
template <> struct Words<T_Q4_K> {  // 144 bytes: d | dmin, scales[12], qs[128]
    static const int bytes = 144;
    uint4 hd; u32 qs[8];  // qs[2 (j / 2) + st]: qs bytes 32 (j / 2) + 16 st + 4 q4 .. +3 (nibble j % 2)
    __device__ __forceinline__ void load(const u8* b, int q4) {
        hd = *(const uint4*)b;
#pragma unroll
        for (int i = 0; i < 8; ++i) qs[i] = ld32(b + 16 + 32 * (i >> 1) + 16 * (i & 1) + 4 * q4);
    }
};
template <> struct Words<T_Q5_K> {  // 176 bytes: d | dmin, scales[12], qh[32], qs[128]
    static const int bytes = 176;
    uint4 hd; u32 qs[8], qh[2];  // qh[st]: bit j of byte e = fifth bit of value (j, l)
    __device__ __forceinline__ void load(const u8* b, int q4) {
        hd = *(const uint4*)b;
#pragma unroll
        for (int i = 0; i < 8; ++i) qs[i] = ld32(b + 48 + 32 * (i >> 1) + 16 * (i & 1) + 4 * q4);
        qh[0] = ld32(b + 16 + 4 * q4); qh[1] = ld32(b + 32 + 4 * q4);
    }
};
template <> struct Words<T_Q6_K> {  // 210 bytes (2-aligned): ql[128], qh[64], scales[16] int8, d
    static const int bytes = 210;
    u32 ql[8], qh[4], sc[4], d;  // ql[4h + 2(k % 2) + st], qh[2h + st], sc = scales as 4 words
    __device__ __forceinline__ void load(const u8* b, int q4) {
#pragma unroll
        for (int i = 0; i < 8; ++i) ql[i] = ld32_a2(b + 64 * (i >> 2) + 32 * ((i >> 1) & 1) + 16 * (i & 1) + 4 * q4);
#pragma unroll
        for (int i = 0; i < 4; ++i) qh[i] = ld32_a2(b + 128 + 32 * (i >> 1) + 16 * (i & 1) + 4 * q4);
#pragma unroll
        for (int i = 0; i < 4; ++i) sc[i] = ld32_a2(b + 192 + 4 * i);
        d = ld16(b + 208);
    }
};
template <> struct Words<T_Q8_0> {  // 8 blocks of 34 bytes: d f16, qs[32] int8
    static const int bytes = 272;
    u32 q[16], d[8];  // q[2j + st]
    __device__ __forceinline__ void load(const u8* b, int q4) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            d[j] = ld16(b + 34 * j);
            q[2 * j] = ld32_a2(b + 34 * j + 2 + 4 * q4);
            q[2 * j + 1] = ld32_a2(b + 34 * j + 18 + 4 * q4);
        }
    }
};

// codes of the thread's values of (group j, step st) as two bf16 pairs: a[0] = (e0, e1), a[1] = (e2, e3)
template <int TYPE>
__device__ __forceinline__ void group_codes(const Words<TYPE>& w, int j, int st, u32* a) {
    if (TYPE == T_Q8_0) {  // int8 codes need 8 bits: through float
        const u32 q = ((const Words<T_Q8_0>&)w).q[2 * j + st];
        a[0] = bf16x2_exact(code_to_f32(s8(q)), code_to_f32(s8(q >> 8)));
        a[1] = bf16x2_exact(code_to_f32(s8(q >> 16)), code_to_f32(s8(q >> 24)));
        return;
    }
    u32 bytes, offset = 0xC300C300u;  // -128
    if (TYPE == T_Q4_K) {  // nibble j % 2 of qs[32 (j / 2) + l]
        bytes = (((const Words<T_Q4_K>&)w).qs[2 * (j >> 1) + st] >> (4 * (j & 1))) & 0x0F0F0F0Fu;
    } else if (TYPE == T_Q5_K) {  // plus bit j of qh[l] as bit 4
        const Words<T_Q5_K>& v = (const Words<T_Q5_K>&)w;
        bytes = ((v.qs[2 * (j >> 1) + st] >> (4 * (j & 1))) & 0x0F0F0F0Fu) | (((v.qh[st] >> j) & 0x01010101u) << 4);
    } else {  // Q6_K group j = 4 h + k: nibble k / 2 of ql[64h + 32(k % 2) + l], bits 2k of qh[32h + l]; code - 32
        const Words<T_Q6_K>& v = (const Words<T_Q6_K>&)w;
        const int h = j >> 2, k = j & 3;
        bytes = ((v.ql[4 * h + 2 * (k & 1) + st] >> (4 * (k >> 1))) & 0x0F0F0F0Fu)
              | (((v.qh[2 * h + st] >> (2 * k)) & 0x03030303u) << 4);
        offset = 0xC320C320u;  // -160
    }
    a[0] = bf16x2_codes(bytes, 0x4140u, offset);
    a[1] = bf16x2_codes(bytes, 0x4342u, offset);
}

__device__ __forceinline__ float f16_cvt(u32 h) {  // the hardware's binary16 -> binary32 conversion: exact, branch-free
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)(h & 0xFFFFu)));
    return f;
}

__device__ __forceinline__ u32 sbyte(const uint4& hd, int i) {  // scale byte s[i], i = 0..11
    const u32 w = i < 4 ? hd.y : (i < 8 ? hd.z : hd.w);
    return (w >> (8 * (i & 3))) & 0xFFu;
}

template <int TYPE>
__device__ __forceinline__ void group_scale(const Words<TYPE>& w, int j, int st, float& dl, float& ml) {
    // W = dl * code - ml for the values of (group j, step st): the oracle's (d * sc) and (dmin * m)
    if (TYPE == T_Q4_K || TYPE == T_Q5_K) {
        const uint4 hd = TYPE == T_Q4_K ? ((const Words<T_Q4_K>&)w).hd : ((const Words<T_Q5_K>&)w).hd;
        const int sc = j < 4 ? (int)(sbyte(hd, j) & 63u) : (int)((sbyte(hd, j + 4) & 15u) | ((sbyte(hd, j - 4) >> 6) << 4));
        const int m = j < 4 ? (int)(sbyte(hd, j + 4) & 63u) : (int)((sbyte(hd, j + 4) >> 4) | ((sbyte(hd, j) >> 6) << 4));
        dl = __fmul_rn(f16_cvt(hd.x & 0xFFFFu), code_to_f32(sc));
        ml = __fmul_rn(f16_cvt(hd.x >> 16), code_to_f32(m));
    } else if (TYPE == T_Q6_K) {  // 16-value sub-block 2j + st, int8 scale
        const Words<T_Q6_K>& v = (const Words<T_Q6_K>&)w;
        const int i = 2 * j + st;
        dl = __fmul_rn(f16_cvt(v.d), code_to_f32(s8(v.sc[i >> 2] >> (8 * (i & 3)))));
        ml = 0.0f;
    } else {
        dl = f16_cvt(((const Words<T_Q8_0>&)w).d[j]);
        ml = 0.0f;
    }
}

template <int TYPE, int RT>
__global__ void __launch_bounds__(256, 2) mma_linear_k(  // <= 128 registers: two blocks (16 warps) per SM
    const uint2* __restrict__ xb, const float* __restrict__ xsum, int T,  // mma_prep_x's output
    const u8* __restrict__ raw, long long row_bytes,        // weight [n_out, row_bytes], n_in % 256 == 0
    int n_out, int n_in, int S,                             // S split warps per row tile (1, 2, 4, 8)
    float* __restrict__ y)                                  // y [T, n_out]; blockIdx.y = token tile
{
    __shared__ float part[8][RT][4][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q4 = lane & 3;
    const int s = warp % S, gg = warp / S, G = 8 / S;
    const int row0 = (blockIdx.x * G + gg) * 16 * RT;
    const int n_steps = n_in >> 4;
    const bool mins = TYPE == T_Q4_K || TYPE == T_Q5_K;
    const uint2* xbt = xb + (long long)blockIdx.y * n_steps * 96 + lane * 3;
    const float* xst = xsum + (long long)blockIdx.y * n_steps * 8 + 2 * q4;
    // x fragments of tokens >= T are zeros (mma_prep_x wrote them so): lanes that would load only zeros
    // skip the load (decoding, T = 1, reads 1/8 of them). Same values either way, so no effect on the sums.
    const bool live_b = blockIdx.y * 8 + g < T, live_s = blockIdx.y * 8 + 2 * q4 < T;
    const u8* rows[RT][2];  // rows g and g + 8 of each tile (a row past n_out reads the last row, never stored)
#pragma unroll
    for (int rt = 0; rt < RT; ++rt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = row0 + 16 * rt + g + 8 * h;
            rows[rt][h] = raw + (long long)(r < n_out ? r : n_out - 1) * row_bytes;
        }
    float acc[RT][4];
#pragma unroll
    for (int rt = 0; rt < RT; ++rt) acc[rt][0] = acc[rt][1] = acc[rt][2] = acc[rt][3] = 0.0f;

    const int n_chunks = n_in >> 8;
    Words<TYPE> cur[RT][2], nxt[RT][2];  // this chunk's words and the next one's, loaded a chunk ahead
    if (s < n_chunks) {
#pragma unroll
        for (int rt = 0; rt < RT; ++rt)
#pragma unroll
            for (int h = 0; h < 2; ++h) cur[rt][h].load(rows[rt][h] + (long long)s * Words<TYPE>::bytes, q4);
    }
    for (int c = s; c < n_chunks; c += S) {
        if (c + S < n_chunks) {
#pragma unroll
            for (int rt = 0; rt < RT; ++rt)
#pragma unroll
                for (int h = 0; h < 2; ++h) nxt[rt][h].load(rows[rt][h] + (long long)(c + S) * Words<TYPE>::bytes, q4);
        }
        uint2 bx[2][2][3];  // x pieces of groups j (slot j % 2) and j + 1, loaded a group ahead: [slot][st][piece]
        float2 sx[2][2];
#pragma unroll
        for (int st = 0; st < 2; ++st) {
            const int step = 16 * c + st;
#pragma unroll
            for (int p = 0; p < 3; ++p) bx[0][st][p] = live_b ? xbt[step * 96 + p] : make_uint2(0u, 0u);
            sx[0][st] = mins && live_s ? *(const float2*)(xst + step * 8) : make_float2(0.f, 0.f);
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int cs = j & 1, ns = cs ^ 1;
            if (j < 7) {
#pragma unroll
                for (int st = 0; st < 2; ++st) {
                    const int step = 16 * c + 2 * (j + 1) + st;
#pragma unroll
                    for (int p = 0; p < 3; ++p) bx[ns][st][p] = live_b ? xbt[step * 96 + p] : make_uint2(0u, 0u);
                    sx[ns][st] = mins && live_s ? *(const float2*)(xst + step * 8) : make_float2(0.f, 0.f);
                }
            }
            float cq[RT][4], xs[2];  // per step (16 values) for Q6_K, per group (32) otherwise
#pragma unroll
            for (int st = 0; st < 2; ++st) {
                const uint2 bh = bx[cs][st][0], bm = bx[cs][st][1], bl = bx[cs][st][2];
                if (TYPE == T_Q6_K || st == 0) {
#pragma unroll
                    for (int rt = 0; rt < RT; ++rt) cq[rt][0] = cq[rt][1] = cq[rt][2] = cq[rt][3] = 0.0f;
                    xs[0] = sx[cs][st].x; xs[1] = sx[cs][st].y;
                } else {
                    xs[0] = __fadd_rn(xs[0], sx[cs][st].x); xs[1] = __fadd_rn(xs[1], sx[cs][st].y);
                }
#pragma unroll
                for (int rt = 0; rt < RT; ++rt) {
                    u32 c0[2], c1[2];
                    group_codes<TYPE>(cur[rt][0], j, st, c0);
                    group_codes<TYPE>(cur[rt][1], j, st, c1);
                    const u32 a[4] = {c0[0], c1[0], c0[1], c1[1]};
                    mma_bf16(cq[rt], a, bl.x, bl.y);  // smallest piece first
                    mma_bf16(cq[rt], a, bm.x, bm.y);
                    mma_bf16(cq[rt], a, bh.x, bh.y);
                }
                if (TYPE == T_Q6_K || st == 1) {  // scale this step's (Q6_K) or group's sums into acc
#pragma unroll
                    for (int rt = 0; rt < RT; ++rt) {
                        float dl0, ml0, dl1, ml1;
                        group_scale<TYPE>(cur[rt][0], j, st, dl0, ml0);
                        group_scale<TYPE>(cur[rt][1], j, st, dl1, ml1);
                        const float* cc = cq[rt];  // [row g tok 2q4, row g tok 2q4+1, row g+8 .., ..]
                        acc[rt][0] = __fmaf_rn(dl0, cc[0], acc[rt][0]);
                        acc[rt][1] = __fmaf_rn(dl0, cc[1], acc[rt][1]);
                        acc[rt][2] = __fmaf_rn(dl1, cc[2], acc[rt][2]);
                        acc[rt][3] = __fmaf_rn(dl1, cc[3], acc[rt][3]);
                        if (mins) {
                            acc[rt][0] = __fmaf_rn(-ml0, xs[0], acc[rt][0]);
                            acc[rt][1] = __fmaf_rn(-ml0, xs[1], acc[rt][1]);
                            acc[rt][2] = __fmaf_rn(-ml1, xs[0], acc[rt][2]);
                            acc[rt][3] = __fmaf_rn(-ml1, xs[1], acc[rt][3]);
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int rt = 0; rt < RT; ++rt) { cur[rt][0] = nxt[rt][0]; cur[rt][1] = nxt[rt][1]; }
    }

    // sum over the S split warps of each row tile, in order s = 0 .. S-1; store rows < n_out, tokens < T
    const int t_lo = blockIdx.y * 8 + 2 * q4;
    if (S > 1) {
#pragma unroll
        for (int rt = 0; rt < RT; ++rt)
#pragma unroll
            for (int i = 0; i < 4; ++i) part[warp][rt][i][lane] = acc[rt][i];
        __syncthreads();
        if (s != 0) return;
#pragma unroll
        for (int rt = 0; rt < RT; ++rt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                float v = part[warp][rt][i][lane];
                for (int ss = 1; ss < S; ++ss) v = __fadd_rn(v, part[warp + ss][rt][i][lane]);
                acc[rt][i] = v;
            }
    }
#pragma unroll
    for (int rt = 0; rt < RT; ++rt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int r = row0 + 16 * rt + g + 8 * (i >> 1), t = t_lo + (i & 1);
            if (r < n_out && t < T) y[(long long)t * n_out + r] = acc[rt][i];
        }
}

// ------------------------------------------------------------------ get_rows

template <int TYPE>
__global__ void get_rows_k(const u8* __restrict__ raw, long long row_bytes, int n_rows, int n_in, int vec,
                           const long long* __restrict__ ids, float* __restrict__ out)  // out [n_ids, n_in]
{
    // one block per id; warp wid decodes chunks wid, wid + nw, ... with the quant_linear lane map
    long long id = ids[blockIdx.x];
    if (id < 0) id += n_rows;
    float* o = out + (long long)blockIdx.x * n_in;
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int n_chunks = (n_in + 255) >> 8;
    const bool bad = id < 0 || id >= n_rows;  // the host checks ids; never read out of bounds anyway
    const u8* row = raw + (bad ? 0 : id) * row_bytes;
    for (int c = wid; c < n_chunks; c += nw) {
        float w[8];
        if (!bad) decode_chunk<TYPE>(row, c, lane, n_in, vec, w);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int p = 256 * c + 128 * h + 4 * lane, n = quad_len(p, n_in);
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (e < n) o[p + e] = bad ? __int_as_float(0x7FC00000) : w[4 * h + e];
        }
    }
}

// ------------------------------------------------------------------ GDN delta-rule scan

template <int K>
__global__ void __launch_bounds__(256) gdn_scan_k(
    const float* __restrict__ q, const float* __restrict__ k,  // [T, HV, K]
    const float* __restrict__ v,                               // [T, HV, V]
    const float* __restrict__ log_decay, const float* __restrict__ beta,  // [T, HV]
    const float* state_in, float* state_out,                   // [HV, K, V]; may be the same buffer
    float* __restrict__ o,                                     // [T, HV, V]
    float* ring, int has_ring,                                 // [>= T, HV, K, V] snapshot entries
    int T, int HV, int V)
{
    __shared__ float qs[K], ks[K], gb[2];
    const int h = blockIdx.x, j = threadIdx.x;  // head, value column
    const bool active = j < V;
    float S[K];  // S[:, j] of head h, in registers for the whole scan
    const long long base = (long long)h * K * V + j;  // S[i, j] of head h is at base + i * V (i * V < 2^16)
#pragma unroll
    for (int i = 0; i < K; ++i) S[i] = active ? state_in[base + i * V] : 0.0f;

    for (int t = 0; t < T; ++t) {
        const long long th = (long long)t * HV + h;
        __syncthreads();  // everyone is done with the previous token's q and k
        for (int i = threadIdx.x; i < K; i += blockDim.x) { qs[i] = q[th * K + i]; ks[i] = k[th * K + i]; }
        if (threadIdx.x == 0) {
            gb[0] = (float)exp((double)log_decay[th]);  // exp(log decay): computed in double, rounded once
            gb[1] = beta[th];
        }
        __syncthreads();
        if (active) {
            const float g = gb[0], b = gb[1];
#pragma unroll
            for (int i = 0; i < K; ++i) S[i] = __fmul_rn(g, S[i]);  // 1. decay
            float pred = __fmul_rn(S[0], ks[0]);  // 2. predict: (S^T k)[j], summed over K in order
#pragma unroll
            for (int i = 1; i < K; ++i) pred = __fadd_rn(pred, __fmul_rn(S[i], ks[i]));
            const float delta = __fmul_rn(b, __fsub_rn(v[th * V + j], pred));  // 3. correct
#pragma unroll
            for (int i = 0; i < K; ++i) S[i] = __fadd_rn(S[i], __fmul_rn(ks[i], delta));  // 4. write
            float out = __fmul_rn(S[0], qs[0]);  // 5. read: (S^T q)[j]
#pragma unroll
            for (int i = 1; i < K; ++i) out = __fadd_rn(out, __fmul_rn(S[i], qs[i]));
            o[th * V + j] = out;
            if (has_ring) {
                float* slot = ring + (long long)t * HV * K * V + base;
#pragma unroll
                for (int i = 0; i < K; ++i) slot[i * V] = S[i];
            }
        }
    }
    if (active) {
#pragma unroll
        for (int i = 0; i < K; ++i) state_out[base + i * V] = S[i];
    }
}
"""

_OPTIONS = ("--fmad=false",)  # belt and braces: every float op that must not fuse is an _rn intrinsic anyway
_modules: dict = {}  # module key -> cupy.RawModule, compiled on first use (CuPy caches the cubin on disk)
_kernels: dict = {}  # (device, name expression) -> kernel; a loaded function belongs to one device
_cc: dict = {}  # device -> compute capability as an int (90 for an H100)


def quant_kernel_names(qtype: GGMLType, cc: int) -> list[str]:
    """The template instances one weight type's module holds on a device of compute capability cc (90 for
    sm_90): the float kernel at every row capacity, get_rows, and on sm_80+ the tensor-core kernel (its bf16
    MMA and fma.rn.bf16x2 do not exist before Ampere: instantiated for a T4 they fail to compile).
    tools/check_cuda_kernels.py compiles these for each architecture with NVRTC, no GPU needed."""
    t = int(qtype)
    names = [f"quant_linear_k<{t}, {nt}, {rpw}>" for nt, rpw in NT_RPW] + [f"get_rows_k<{t}>"]
    names += [f"quant_linear_grouped_k<{t}, {nt}, {rpw}>" for nt, rpw in NT_RPW]
    if qtype in MMA_TYPES and cc >= 80:
        names += [f"mma_linear_k<{t}, {rt}>" for rt in MMA_RTS]  # (mma_prep_x is extern "C": always built)
    return names


def gdn_kernel_names(K: int) -> list[str]:
    return [f"gdn_scan_k<{K}>"]


def _device_cc() -> int:
    dev = cp.cuda.runtime.getDevice()
    if dev not in _cc:
        _cc[dev] = int(cp.cuda.Device(dev).compute_capability)
    return _cc[dev]


def _kernel(module_key, names: list[str], name: str):
    key = (cp.cuda.runtime.getDevice(), name)
    fn = _kernels.get(key)
    if fn is None:
        module_key = (*module_key, _device_cc())  # a module is compiled for one architecture
        if module_key not in _modules:
            _modules[module_key] = cp.RawModule(code=_SOURCE, options=_OPTIONS, name_expressions=names)
        fn = _kernels[key] = _modules[module_key].get_function(name)
    return fn


def _quant_kernel(qtype: GGMLType, name: str):  # one module per type and architecture
    return _kernel(("quant", int(qtype)), quant_kernel_names(qtype, _device_cc()), name)


def _split(n_out: int, n_chunks: int) -> int:
    """Split warps per row, S in 1, 2, 4, 8: from the shape only, never from T (batch invariance)."""
    S = 1
    while S < WARPS and n_out * S < TARGET_WARPS and 2 * S <= n_chunks:
        S *= 2
    return S


def _mma_plan(n_out: int, n_chunks: int) -> tuple[int, int]:
    """(row tiles per warp RT, split warps S) of the tensor-core kernel, from the shape only (batch invariance).
    RT > 1 would reuse each warp's x fragments for more rows, but its registers cost more warps than it saves
    (slower or no faster at every shape tried on an H100: docs/performance-log.md old 20); S > 1 gives short
    matrices warps."""
    rt = 1
    tiles, S = -(-n_out // (16 * rt)), 1
    while S < WARPS and tiles * S < MMA_TARGET_WARPS and 2 * S <= n_chunks:
        S *= 2
    return rt, S


def _mma_ok(qtype: GGMLType, n_in: int) -> bool:
    """The tensor-core kernel takes this weight: a K-quant or Q8_0 of whole 256-value chunks, on sm_80+."""
    if not (use_mma and qtype in MMA_TYPES and n_in % CHUNK == 0):
        return False
    return _device_cc() >= 80


_scratch_bufs: dict = {}  # device -> (uint32 array, float32 array): mma_prep_x's output, grown on demand
_retired_scratch: list = []  # every smaller pair _scratch replaced: kept, never freed (below)


def _scratch(n_u32: int, n_f32: int):
    """Reused buffers for x in fragment order (no allocation per call, so calls can be graph-captured).
    One per device: calls on one device run in stream order, like every kernel here.

    A CUDA graph captured with a pair writes those addresses at every replay. When a larger call needs larger
    buffers, the old pair is retired, not freed: freed, CuPy's pool could hand its memory to a live array (a
    grown KV cache, a drafter's rows) that a replay of an older graph would then overwrite. The sizes at least
    double, so what is retired stays under what is in use."""
    dev = cp.cuda.runtime.getDevice()
    bufs = _scratch_bufs.get(dev)
    if bufs is None or bufs[0].size < n_u32 or bufs[1].size < n_f32:
        old = bufs or (cp.empty(0, cp.uint32), cp.empty(0, cp.float32))
        if bufs is not None:
            _retired_scratch.append(bufs)
        bufs = _scratch_bufs[dev] = (cp.empty(max(n_u32, 2 * old[0].size), cp.uint32),
                                     cp.empty(max(n_f32, 2 * old[1].size), cp.float32))
    return bufs


def _weight(raw, ggml_type, shape) -> tuple[GGMLType, cp.ndarray, int, int, int, int]:
    """Validate; return (type, raw as flat contiguous uint8 on device, n_out, n_in, row_bytes, vec)."""
    try:
        qtype = GGMLType(ggml_type)
    except ValueError:
        raise ValueError(f"cuda_ops: unknown ggml type id {ggml_type!r}") from None
    if qtype not in SUPPORTED:
        names = ", ".join(t.name for t in SUPPORTED)
        raise ValueError(f"cuda_ops: ggml type {qtype.name} is not supported (supported: {names}); "
                         "use tinyspec.ops for it")
    if len(shape) != 2 or min(int(s) for s in shape) < 0:
        raise ValueError(f"cuda_ops: shape must be (out, in) >= 0, got {shape}")
    n_out, n_in = int(shape[0]), int(shape[1])
    if n_in % qtype.block_size:
        raise ValueError(f"cuda_ops: {qtype.name} row length {n_in} is not a multiple of the block size "
                         f"{qtype.block_size}")
    if max(n_out, n_in) >= 2**31:
        raise ValueError(f"cuda_ops: shape {shape} too large (each side must be < 2^31)")
    row_bytes = n_in // qtype.block_size * qtype.type_size
    raw = cp.asarray(raw)  # no copy for a cupy array; a NumPy one is uploaded (every call: upload once instead)
    if raw.dtype != cp.uint8 or raw.size != n_out * row_bytes:
        raise ValueError(f"cuda_ops: {qtype.name} shape {shape} needs {n_out * row_bytes} uint8 bytes, "
                         f"got {raw.size} of {raw.dtype}")
    raw = cp.ascontiguousarray(raw).reshape(-1)
    if raw.size and raw.data.ptr % _ALIGN[qtype]:
        raise ValueError(f"cuda_ops: {qtype.name} weight bytes must start on a {_ALIGN[qtype]}-byte boundary "
                         f"(cupy allocations do; GGUF aligns tensors to 32)")
    wide = {GGMLType.F32: 16, GGMLType.F16: 8, GGMLType.BF16: 8}.get(qtype, 0)  # vector loads of plain rows
    vec = int(bool(wide) and n_in % 4 == 0 and raw.data.ptr % wide == 0)
    return qtype, raw, n_out, n_in, row_bytes, vec


def quant_linear(x, raw, ggml_type: GGMLType | int, shape: tuple[int, int], out=None):
    """y[t] = dequantize(raw) @ x[t] without the float32 matrix: cupy [T, in] -> cupy float32 [T, out].

    raw: the weight's GGUF bytes as a cupy uint8 array (on the device once, at load). Batch-invariant
    bit for bit; within 2.02 * in * 2^-24 * (|W| @ |x|) of tinyspec.ops.quant_linear. out: an optional
    C-contiguous cupy float32 [T, out] to write into (no allocation when x is contiguous float32 with
    in % 4 == 0, so calls can be captured in a CUDA graph). Raises ValueError for unsupported types and
    mismatched shapes.
    """
    return bind(raw, ggml_type, shape)(x, out)


def bind(raw, ggml_type: GGMLType | int, shape: tuple[int, int]):
    """quant_linear for one weight, checked and planned once: returns linear(x, out=None). The model binds
    each weight at load (backends.py), so a call costs its launches and a shape check, not the validation."""
    qtype, raw, n_out, n_in, row_bytes, vec = _weight(raw, ggml_type, shape)
    ldx = -(-n_in // 4) * 4  # float4 loads of x need rows of a multiple of 4 floats, 16-byte aligned
    mma = _mma_ok(qtype, n_in)
    if mma:  # tokens in tiles of 8 (grid y): every token's arithmetic is the same in any tile
        rt, S = _mma_plan(n_out, n_in // CHUNK)
        n_steps = n_in // 16
        prep = _quant_kernel(qtype, "mma_prep_x")
        kernel = _quant_kernel(qtype, f"mma_linear_k<{int(qtype)}, {rt}>")
        blocks = -(-n_out // (16 * rt * (WARPS // S)))
        args = (np.int32(n_steps), np.int64(row_bytes), np.int32(n_out), np.int32(n_in), np.int32(S))
    else:
        S = _split(n_out, -(-n_in // CHUNK))
        G = WARPS // S

    def linear(x, out=None):
        x = cp.asarray(x, dtype=cp.float32)
        if x.ndim != 2 or x.shape[1] != n_in:
            raise ValueError(f"cuda_ops: x must be [T, {n_in}] for weight shape {tuple(shape)}, got {x.shape}")
        T = x.shape[0]
        if ldx != n_in or not x.flags.c_contiguous or x.data.ptr % 16:
            padded = cp.zeros((T, ldx), dtype=cp.float32)
            padded[:, :n_in] = x
            x = padded
        if out is None:
            y = cp.empty((T, n_out), dtype=cp.float32)
        else:
            y = out
            if (not isinstance(y, cp.ndarray) or y.dtype != cp.float32 or y.shape != (T, n_out)
                    or not y.flags.c_contiguous):
                raise ValueError(f"cuda_ops: out must be a C-contiguous cupy float32 array of shape {(T, n_out)}")
        if T == 0 or n_out == 0:
            return y
        if n_in == 0:
            y.fill(0)
            return y
        if mma:
            tiles = -(-T // 8)
            xb, xsum = _scratch(tiles * n_steps * 32 * 6, tiles * n_steps * 8)
            n_threads = tiles * n_steps * 32
            prep((-(-n_threads // 256),), (256,), (x, np.int64(ldx), np.int32(T), args[0], xb, xsum))
            kernel((blocks, tiles), (32 * WARPS,), (xb, xsum, np.int32(T), raw) + args[1:] + (y,))
            return y
        for t0 in range(0, T, 16):  # tiles of at most 16 rows of x; each row's arithmetic is the same in any tile
            tt = min(16, T - t0)
            nt, rpw = next((nt, rpw) for nt, rpw in NT_RPW if nt >= tt)
            fn = _quant_kernel(qtype, f"quant_linear_k<{int(qtype)}, {nt}, {rpw}>")
            fn((-(-n_out // (G * rpw)),), (32 * WARPS,),
               (x[t0:t0 + tt], np.int64(ldx), np.int32(tt), raw, np.int64(row_bytes),
                np.int32(n_out), np.int32(n_in), np.int32(vec), np.int32(S), y[t0:t0 + tt]))
        return y

    return linear


def bind_experts(raw, ggml_type: GGMLType | int, shape: tuple[int, int, int]):
    """moe.experts_linear for one [E, out, in] expert tensor (its GGUF bytes, each expert's rows whole blocks, one
    expert after the other), checked once: returns experts_linear(x, experts, offsets) [P, in] -> [P, out].

    The rows of x are grouped by expert. offsets: a cupy int32 [E + 1] (cuda_moe.route_experts': experts must
    then be 0..E-1), read only on the device: one launch of quant_linear_grouped_k per call, no sync, blocks of
    empty experts and of tiles past the last leave at once. Host groups (experts [U] ascending, offsets [U + 1],
    moe.group_by_expert's) are spread over all E on the host and uploaded.
    Guaranteed: row p of y is bitwise what the float kernel (quant_linear_k) gives for x[p] alone and expert e's
    bytes, for every P and grouping (batch invariance); that is bind(expert e)'s result where bind takes the
    float kernel (F32, F16, BF16 always; the others before sm_80 or with use_mma = False). On sm_80+ bind puts
    K-quants and Q8_0 on the tensor cores, which round differently: the grouped rows are within the float32
    bound of those, not equal. (A grouped tensor-core kernel is not written.)
    """
    E, n_out, n_in = (int(v) for v in shape)
    qtype, raw, _, _, row_bytes, vec = _weight(raw, ggml_type, (E * n_out, n_in))
    expert_bytes = n_out * row_bytes
    wide = {GGMLType.F32: 16, GGMLType.F16: 8, GGMLType.BF16: 8}.get(qtype, 0)
    vec = int(vec and expert_bytes % wide == 0)  # every expert's first byte as aligned as the tensor's
    ldx = -(-n_in // 4) * 4
    S = _split(n_out, -(-n_in // CHUNK))  # from the expert's shape only, as bind's float kernel
    G = WARPS // S

    def experts_linear(x, experts, offsets, out=None):
        x = cp.asarray(x, dtype=cp.float32)
        if x.ndim != 2 or x.shape[1] != n_in:
            raise ValueError(f"cuda_ops: x must be [P, {n_in}] for expert shape {tuple(shape)}, got {x.shape}")
        P = x.shape[0]
        if isinstance(offsets, cp.ndarray):
            if len(experts) != E or offsets.shape != (E + 1,):
                raise ValueError(f"cuda_ops: device offsets must be [E + 1] = [{E + 1}] over every expert")
            offs = cp.ascontiguousarray(offsets, dtype=cp.int32)
        else:  # host groups: counts of every expert, then offsets over all E, uploaded
            ex, host = np.asarray(experts, dtype=np.int64), np.asarray(offsets, dtype=np.int64)
            if host.shape != (ex.size + 1,) or host[0] != 0 or host[-1] != P or np.any(np.diff(host) < 0):
                raise ValueError(f"cuda_ops: offsets must rise from 0 to P = {P}, one more than the experts")
            if ex.size and (ex.min() < 0 or ex.max() >= E or np.any(np.diff(ex) <= 0)):
                raise IndexError(f"cuda_ops: expert ids must be ascending and in [0, {E})")
            counts = np.zeros(E, np.int64)
            counts[ex] = np.diff(host)
            offs = cp.asarray(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
        if ldx != n_in or not x.flags.c_contiguous or x.data.ptr % 16:
            padded = cp.zeros((P, ldx), dtype=cp.float32)
            padded[:, :n_in] = x
            x = padded
        y = cp.empty((P, n_out), dtype=cp.float32) if out is None else out
        if P == 0 or n_out == 0:
            return y
        if n_in == 0:
            y.fill(0)
            return y
        nt, rpw = next((nt, rpw) for nt, rpw in NT_RPW if nt >= min(P, NT_RPW[-1][0]))  # a group has <= P rows
        tiles = (P + min(E, P) * (nt - 1)) // nt  # >= sum_e ceil(count_e / nt): at most nt - 1 spare per expert
        fn = _quant_kernel(qtype, f"quant_linear_grouped_k<{int(qtype)}, {nt}, {rpw}>")
        fn((-(-n_out // (G * rpw)), tiles), (32 * WARPS,),
           (x, np.int64(ldx), offs, np.int32(E), raw, np.int64(expert_bytes), np.int64(row_bytes),
            np.int32(n_out), np.int32(n_in), np.int32(vec), np.int32(S), y))
        return y

    return experts_linear


def get_rows(raw, ggml_type: GGMLType | int, shape: tuple[int, int], ids, checked: bool = True):
    """Rows `ids` of the [n_rows, n_cols] weight in `raw`: [n] -> cupy float32 [n, n_cols], bit-exact with
    tinyspec.ops.get_rows (negative ids count from the end, as in NumPy; out of range raises IndexError).

    ids: NumPy (checked on the host, then uploaded) or cupy (checked with one small device reduction,
    which synchronizes) integers. checked=False skips the check of cupy ids, and with it the sync: for ids
    the caller knows are in range (an argmax over n_rows scores, tinyspec.model.embed_rows); the kernel never
    reads out of bounds anyway, and an id that is out of range gives a row of NaN.
    """
    qtype, raw, n_rows, n_in, row_bytes, vec = _weight(raw, ggml_type, shape)
    if isinstance(ids, cp.ndarray):
        ids = ids.reshape(-1).astype(cp.int64, copy=False)
        bad = checked and ids.size and bool(((ids < -n_rows) | (ids >= n_rows)).any())
    else:
        ids_host = np.asarray(ids, dtype=np.int64).reshape(-1)
        bad = ids_host.size and bool(((ids_host < -n_rows) | (ids_host >= n_rows)).any())
        ids = cp.asarray(ids_host)
    if bad:
        raise IndexError(f"cuda_ops: row ids must be in [-{n_rows}, {n_rows})")
    ids = cp.ascontiguousarray(ids)
    out = cp.empty((ids.size, n_in), dtype=cp.float32)
    if out.size:
        kernel = _quant_kernel(qtype, f"get_rows_k<{int(qtype)}>")
        kernel((ids.size,), (128,),
               (raw, np.int64(row_bytes), np.int32(n_rows), np.int32(n_in), np.int32(vec), ids, out))
    return out


def _f32(a):
    return cp.ascontiguousarray(cp.asarray(a, dtype=cp.float32))


def gdn_scan(q, k, v, log_decay, beta, state, states_out=None, out_state=None):
    # [T, HV, K] x2, [T, HV, V], [T, HV] x2, [HV, K, V] -> [T, HV, V], [HV, K, V]
    """The delta-rule recurrence over T tokens on the device (tinyspec.gdn.gdn_scan's contract).

    states_out: optional preallocated cupy float32 [>= T, HV, K, V] (the snapshot ring); slot t receives
    the state after token t. out_state: optional cupy float32 [HV, K, V] for the final state; it may be
    `state` itself (updated in place). Returns (o, final state).
    """
    q, k, v, log_decay, beta, state = (_f32(a) for a in (q, k, v, log_decay, beta, state))
    if q.ndim != 3 or v.ndim != 3:
        raise ValueError(f"cuda_ops: q must be [T, HV, K] and v [T, HV, V], got {q.shape}, {v.shape}")
    T, HV, K = q.shape
    V = v.shape[2]
    if k.shape != q.shape or v.shape[:2] != (T, HV) or log_decay.shape != (T, HV) or beta.shape != (T, HV):
        raise ValueError(f"cuda_ops: inconsistent shapes q {q.shape}, k {k.shape}, v {v.shape}, "
                         f"log_decay {log_decay.shape}, beta {beta.shape}")
    if state.shape != (HV, K, V):
        raise ValueError(f"cuda_ops: state must be [HV, K, V] = {(HV, K, V)}, got {state.shape}")
    if not (1 <= K <= MAX_K and 1 <= V <= MAX_V):
        raise ValueError(f"cuda_ops: gdn_scan needs 1 <= K <= {MAX_K} and 1 <= V <= {MAX_V}, got K={K}, V={V}")
    for buf, name, min_shape in ((states_out, "states_out", (T, HV, K, V)), (out_state, "out_state", (HV, K, V))):
        if buf is None:
            continue
        ok = (isinstance(buf, cp.ndarray) and buf.dtype == cp.float32 and buf.flags.c_contiguous
              and buf.ndim == len(min_shape) and buf.shape[-3:] == (HV, K, V) and buf.shape[0] >= min_shape[0])
        if not ok or (name == "out_state" and buf.shape != min_shape):
            raise ValueError(f"cuda_ops: {name} must be a C-contiguous cupy float32 array of shape "
                             f"{'>= ' if name == 'states_out' else ''}{min_shape}")
    o = cp.empty((T, HV, V), dtype=cp.float32)
    final = out_state if out_state is not None else cp.empty_like(state)
    if T == 0 or HV == 0:
        if final is not state:
            final[...] = state
        return o, final
    kernel = _kernel(("gdn", K), gdn_kernel_names(K), f"gdn_scan_k<{K}>")
    ring = states_out if states_out is not None else o  # never written when has_ring = 0
    kernel((HV,), (-(-V // 32) * 32,),
           (q, k, v, log_decay, beta, state, final, o, ring, np.int32(states_out is not None),
            np.int32(T), np.int32(HV), np.int32(V)))
    return o, final


def delta_rule_step(state, q, k, v, log_decay, beta):
    # [HV, K, V], [HV, K], [HV, K], [HV, V], [HV], [HV] -> [HV, V], [HV, K, V]
    """One token of the gated delta rule for every value head (tinyspec.gdn.delta_rule_step's contract)."""
    q, k, v, log_decay, beta = (cp.asarray(a, dtype=cp.float32)[None] for a in (q, k, v, log_decay, beta))
    o, S = gdn_scan(q, k, v, log_decay, beta, state)
    return o[0], S
