"""Numba CPU kernels for the fused dequant-matmul: quant_linear and get_rows straight from GGUF bytes.

Same names, arguments and results as the oracle in tinyspec/ops.py:

    quant_linear(x, raw, ggml_type, shape)      y[t, r] = sum_j W[r, j] * x[t, j]           [T, in] -> [T, out]
    quant_linear_q8(x, raw, ggml_type, shape)   the same on x rounded to Q8_K (K-quants,    [T, in] -> [T, out]
                                                IQ4_XS) or to Q8_0 (Q8_0, Q4_0, Q5_0, IQ4_NL)
    get_rows(raw, ggml_type, shape, ids)        W[ids]                                       [n] -> [n, in]

where W = dequantize(raw, ggml_type, shape) is never built. A row of raw is a run of blocks (byte tables
in tinyspec/quants: floats.py, legacy.py dequantize_q4_0 .. q8_0, kquants.py dequantize_q2_k .. q6_k,
iquants.py dequantize_iq1_s .. iq4_xs, fp4.py mxfp4 / nvfp4). A type not in SUPPORTED is expanded to float32
at load (backends.py).
The cpu backend (tinyspec/backends.py) calls `bind(raw, type, shape, q8=True)` once per weight: the K-quants
Q2_K..Q6_K, IQ4_XS, Q4_0, Q5_0, IQ4_NL and Q8_0 (Q8_TYPES) take the integer path (quant_linear_q8), every other
type the float path.

Float path, _quant_linear_parallel (weight-stationary: x is small, W is the memory traffic):

    for each task of ROWS output rows, in parallel (prange; one thread below SERIAL_BELOW weights):
        for each row r:
            wrow = decode(row), span by span of LANES = 256 values (one K-quant super-block, 8 legacy
                   blocks)                                    read the bytes once, exact f32 weights
            for t in range(T):                                reuse them for every input row
                acc[l] = 0                                    LANES float32 partial sums, in registers
                for each span s:
                    acc[l] = fma(wrow[256 s + l], x[t, 256 s + l], acc[l])   (simd.fma_spans256)
                y[t, r] = pairwise sum of acc[0..LANES-1]     fixed tree: (l, l + 128), (l, l + 64), ...

(Why the lanes stay in registers: the other loop order - decode a span, then every t's 256 lanes from
memory - gives the same bits but pays a load and a store of every accumulator per span, so each extra
input row costs far more than its fmas: docs/performance-log.md old 30.)

Each block decodes into float32 values bit-identical to the oracle's (the same f32 operations in the
same order, `d * q`, `(d * sc) * q - (dmin * m)`, no fused multiply-add), as explicit vector IR
(tinyspec/fast/simd.py: Numba's own loops stayed scalar, LESSONS 7).

Integer path, _quant_linear_q8_parallel (what ggml's CPU backend does for K-quants): each row of x is
rounded once to Q8_K (256-value blocks of int8 codes and one float scale, tinyspec/quants/q8_k.py, bit
for bit its rule); then per weight super-block one intrinsic (simd.q2_k_block .. q5_k_block) unpacks the
codes and 6-bit scales into vector values and, for each t inside the same IR loop, forms the exact integer
sums (vpdpbusd / vpackssdw / vpdpwssd with AVX512-VNNI, vpmaddubsw / vpmaddwd with AVX-512BW, plain vector
IR elsewhere) and adds `(d dx) * isum + (dmin m) * (-(dx bsum))` into 16 float lanes with two fmas (the
offset term's weight side dmin m formed once per block, its row side -(dx bsum) once per x); the fixed
16-lane tree ends the row. Keeping the block in registers across the rows is what makes extra rows
cheap (a per-row call reloaded it: LESSONS 7). With T > 1 two weight rows go through one call
(simd.*_block2: each t's codes loaded once for both, two accumulator chains in flight instead of one row's
load -> fma -> fma -> store per block; per row the same bits, LESSONS 7). Q4_K on VNNI reads its codes
64 bytes at a time, with x laid out in the order they come (Q4_K_WIDE_X) and the lanes read back through
LANE_SWAP: the same bits as in value order. Q6_K with VNNI (simd.q6_k_signed_block) takes signed codes
against x' = qx + 128, so its offset of 32 becomes a per-block constant and a row needs one fma; without
VNNI it takes simd.q6_k_block like the others (unsigned codes, the offset through the bsums). IQ4_XS
(simd.iq4_xs_block) looks its codes up as signed levels (vpshufb), takes x' the same way and applies its
sub-block scales to the 16 exact i32 lanes in float (its 4-value sums need 32 bits). It computes
ops.quant_linear_q8, a different function from ops.quant_linear (x moves by at most half a Q8_K step), and
the one llama.cpp computes: on llama.cpp-made files the cpu logits equal llama.cpp's to float32 summation
order unless some activation falls on the other side of a rounding boundary (then ~1e-2; the float oracle:
~5e-2; tests/test_llamacpp_runtime.py, LESSONS 9).

Q8_0, Q4_0, Q5_0, IQ4_NL weights, _quant_linear_q8_0_parallel (llama.cpp's vec_dot_*_q8_0; the codes of the
last three unpacked to the signed weights q - 8, q - 16 and KVALUES_IQ4[q] first): x is rounded to Q8_0 blocks of
32 with fp16 scales (legacy.py quantize_q8_0, bit for bit), kept as x' = q + 128 so that vpdpbusd can take
it as its unsigned operand; per pair of weight blocks simd.q8_0_pair loads the 64 codes once, forms
base = -128 * (4-value sums of q_w), and gives every row its exact 4-value sums in one vpdpbusd started
from base, then one fma by d_w d_x. The float path it replaces decoded every weight to float32 and spent
two fmas per 16 values per row, so it was slower at T = 1 and fell further behind with every input row
(docs/performance-log.md old 30 measures both).

Batch invariance (row t of a T-row call is bitwise equal to a 1-row call on x[t]), on both paths: the
operations that produce y[t, r] - the rounding of x[t] alone, which products, added into which lane, in
which order, then the fixed lane tree - depend only on r, on t's own row of x and on the lane count,
never on T or on the other rows of x. Nothing is compiled with fastmath: LLVM may neither reassociate a
sum nor contract a multiply-add; the one multiply-add is an explicit llvm.fma, rounded once in every lane.
Threads split output rows, never a sum. Checked bitwise for T = 1..16 and serial vs threaded by
tests/test_numba_ops.py.

Accuracy against the oracle (BLAS `W @ x[t]`, another summation order of the same exact products):
a float32 sum of n products, in any order, is within gamma_n * S of the exact sum, S = sum_j |W[r, j]
x[t, j]| and gamma_n = n u / (1 - n u), u = 2^-24 (Higham, Accuracy and Stability of Numerical
Algorithms, 2nd ed., section 3.1). Two such sums differ by at most 2 gamma_n S, hence the bound we
test: |y - y_oracle| <= 1.1 * in * 2^-23 * S (an fma-based sum obeys the same bound; for the integer
path S uses the rounded x, and the sums inside a block are exact). Measured errors are far below it:
each lane sums only in / 256 products, so y is within ~2e-8 S of the float64 sum at the Qwen shapes.

Speed: LESSONS 7 measures these choices (the integer path, the block in registers, two rows a call;
docs/performance-log.md old 19, 24, 30, 31 per kernel). tools/bench_kernels.py times the kernels alone,
`python -m tinyspec bench` the whole model.

get_rows runs the float decoders on one thread (a few embedding rows are not worth a parallel region)
and copies the decoded spans out, so it is bit-exact with the oracle.

Official implementation: ggml `ggml-cpu/ggml-cpu.c` ggml_compute_forward_mul_mat and the
`ggml_vec_dot_q4_K_q8_K` family (`ggml-cpu/arch/x86/quants.c`). Does NOT include: the other GGML types
(they raise ValueError and the caller falls back to the oracle), integer paths for Q4_1 / Q5_1 (x in
Q8_1 blocks in ggml) and the grid I-quants IQ1..IQ3 (the float path), repacked weight layouts, AMX.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..ops import X_Q8_0
from ..quants import GGMLType
from ..quants.fp4 import e8m0_half
from ..quants.iq_grids import (IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS,
                               KVALUES_FP4, KVALUES_IQ4NL, UE4M3_HALF)
from . import kernel_cache, simd

LANES = 256  # float32 partial sums per (row, t): value j of a row goes to lane j % LANES; also the span
ROWS = 8  # output rows per parallel task (the task's buffers are allocated once)
SERIAL_BELOW = 1 << 20  # out * in below this: one thread (a parallel region costs more than the work)
AHEAD = 16384  # bytes of weights prefetched ahead of the block being decoded (simd.prefetch; LESSONS 18)

SUPPORTED = (GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1,
             GGMLType.Q8_0,
             GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K,
             GGMLType.IQ1_S, GGMLType.IQ1_M, GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ2_S, GGMLType.IQ3_XXS,
             GGMLType.IQ3_S, GGMLType.IQ4_NL, GGMLType.IQ4_XS, GGMLType.MXFP4, GGMLType.NVFP4)
# quant_linear_q8: integer dot products, the K-quants with x rounded to Q8_K, Q8_0 with x rounded to Q8_0
Q8_TYPES = (GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.IQ4_XS,
            GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.IQ4_NL, GGMLType.Q8_0)
# Plain ints for the kernels (numba reads module globals as compile-time constants).
_F32, _F16, _BF16 = int(GGMLType.F32), int(GGMLType.F16), int(GGMLType.BF16)
_Q4_0, _Q8_0 = int(GGMLType.Q4_0), int(GGMLType.Q8_0)
_Q2_K, _Q4_K, _Q5_K, _Q6_K = int(GGMLType.Q2_K), int(GGMLType.Q4_K), int(GGMLType.Q5_K), int(GGMLType.Q6_K)
_Q3_K = int(GGMLType.Q3_K)
_Q4_1, _Q5_0, _Q5_1 = int(GGMLType.Q4_1), int(GGMLType.Q5_0), int(GGMLType.Q5_1)
_IQ2_XXS, _IQ3_XXS, _IQ4_NL, _IQ4_XS = (int(GGMLType.IQ2_XXS), int(GGMLType.IQ3_XXS), int(GGMLType.IQ4_NL),
                                         int(GGMLType.IQ4_XS))
_IQ1_S, _IQ1_M, _IQ2_XS, _IQ2_S, _IQ3_S = (int(GGMLType.IQ1_S), int(GGMLType.IQ1_M), int(GGMLType.IQ2_XS),
                                            int(GGMLType.IQ2_S), int(GGMLType.IQ3_S))
_IQ2XXS_GRID = IQ2XXS_GRID.astype(np.float32)  # [256, 8] codeword magnitudes (tinyspec/quants/iq_grids.py)
_IQ2XS_GRID, _IQ2S_GRID = IQ2XS_GRID.astype(np.float32), IQ2S_GRID.astype(np.float32)  # [512, 8], [1024, 8]
_IQ3XXS_GRID, _IQ3S_GRID = IQ3XXS_GRID.astype(np.float32), IQ3S_GRID.astype(np.float32)  # [256, 4], [512, 4]
_IQ1S_GRID = IQ1S_GRID.astype(np.float32)  # [2048, 8] of -1, 0, 1
_IQ1_DELTA = np.float32(0.125)
_MXFP4, _NVFP4 = int(GGMLType.MXFP4), int(GGMLType.NVFP4)
_KVALUES_FP4 = KVALUES_FP4.astype(np.float32)  # [16] E2M1 values, doubled (fp4.py)
_E8M0_HALF = e8m0_half(np.arange(256, dtype=np.uint8))  # [256] 2^(e - 128), the halved MXFP4 scale
_UE4M3_HALF = UE4M3_HALF.astype(np.float32)  # [256] the halved NVFP4 scale of each byte
_SIGN_ROWS = np.where((np.arange(256)[:, None] >> np.arange(8)) & 1, -1, 1).astype(np.float32)  # [256, 8]:
# a sign byte (bit k set: value k negative, IQ2_S / IQ3_S) -> its 8 signs
_KSIGN_ROWS = _SIGN_ROWS[KSIGNS]  # [128, 8]: a 7-bit KSIGNS index (IQ2_XXS / IQ2_XS / IQ3_XXS) -> its 8 signs
assert tuple(KVALUES_IQ4NL) == simd.KVALUES_IQ4  # the levels simd.iq4_block32 selects from
LANE_SWAP = np.array(simd.LANE_SWAP, np.int64)  # the wide Q4_K lane order (a module constant: frozen into the kernels)
PAIR_ROWS = True  # the K-quants and IQ4_XS with T > 1: two weight rows a block call (frozen at compile time too)

_POW2 = np.array([2.0 ** (e - 25) for e in range(32)], dtype=np.float32)  # fp16 exponent e -> 2^(e-25)


# ---------------------------------------------------------------------------------------------
# Decoders. `raw` is the whole weight as flat uint8 bytes and r0 the offset of one row. A decoder writes
# the n values of span s of that row, values LANES * s .. LANES * s + n - 1 (n <= LANES, a multiple of
# the block size), into w[0 .. n-1], peeling fields in the order of the byte tables in tinyspec/quants;
# sm is 16 floats of scratch for a block's scales. The K-quant, Q8_0 and Q4_0 decoders are vector
# operations from tinyspec/fast/simd.py; the rarer types keep plain loops.


@njit(cache=True)
def _f16(lo, hi):  # two little-endian bytes -> float32, exact
    """fp16 -> f32 for one scale: (1024 + mantissa) * 2^(e - 25), or mantissa * 2^-24 (subnormal).
    (The kernels use simd.half_to_f32, the hardware conversion; this is its readable twin, tested on
    every bit pattern against NumPy.)"""
    h = np.int32(lo) | (np.int32(hi) << 8)
    e = (h >> 10) & 31
    m = h & 1023
    if e == 0:
        v = np.float32(m) * np.float32(2.0**-24)
    elif e == 31:
        v = np.float32(np.inf) if m == 0 else np.float32(np.nan)
    else:
        v = np.float32(m + 1024) * _POW2[e]
    return -v if h & 0x8000 else v


@njit(cache=True, inline="always", error_model="numpy", boundscheck=False)
def _u32(raw, i):  # the little-endian uint32 at raw[i]
    return np.uint32(raw[i]) | (np.uint32(raw[i + 1]) << 8) | (np.uint32(raw[i + 2]) << 16) \
        | (np.uint32(raw[i + 3]) << 24)


@njit(cache=True, inline="always", error_model="numpy", boundscheck=False)
def _decode_f32(raw, r0, s, n, w):  # 4 bytes a value: the IEEE bits themselves
    v = raw[r0 + 4 * LANES * s:r0 + 4 * (LANES * s + n)].view(np.float32)
    for j in range(n):
        w[j] = v[j]


@njit(cache=True, inline="always", error_model="numpy", boundscheck=False)
def _decode_bf16(raw, r0, s, n, w):  # 2 bytes a value: the high half of the f32 bits
    h, bits = raw[r0 + 2 * LANES * s:r0 + 2 * (LANES * s + n)].view(np.uint16), w.view(np.uint32)
    for j in range(n):
        bits[j] = np.uint32(h[j]) << 16


@njit(cache=True, inline="always", error_model="numpy", boundscheck=False)
def _decode_f16(raw, r0, s, n, w):  # 2 bytes a value
    """fp16 -> f32: 16 values at a time by the hardware conversion (simd.halves16, NaN bits kept), the
    last n % 16 in three vector passes: place exponent and mantissa 13 bits up (an f32 2^112 too small,
    subnormals included), multiply by 2^112 (exact), then OR in the sign and inf/NaN exponent."""
    o = r0 + 2 * LANES * s
    n16 = n // 16 * 16
    for g in range(0, n16, 16):
        simd.halves16(raw, o + 2 * g, w, g)
    h, bits = raw[o + 2 * n16:o + 2 * n].view(np.uint16), w[n16:n].view(np.uint32)
    tail = w[n16:n]
    for j in range(n - n16):
        bits[j] = (np.uint32(h[j]) & 0x7FFF) << 13
    for j in range(n - n16):
        tail[j] = tail[j] * np.float32(2.0**112)
    for j in range(n - n16):
        inf_nan = np.uint32(0x7F800000) if (h[j] & 0x7C00) == 0x7C00 else np.uint32(0)
        bits[j] |= ((np.uint32(h[j]) & 0x8000) << 16) | inf_nan


@njit(cache=True, inline="always", error_model="numpy", boundscheck=False)
def _decode_q4_0(raw, r0, s, n, w):  # 18 bytes: d, qs[16];  x = d * (q - 8)
    for k in range(n // 32):  # byte l holds value l (low nibble) and value 16 + l (high nibble)
        o = r0 + (8 * s + k) * 18
        simd.affine_q4_0(raw, o + 2, simd.half_to_f32(raw, o), w, 32 * k)


@njit(cache=True, inline="always", error_model="numpy", boundscheck=False)
def _decode_q4_1_q5(kind, raw, r0, s, n, w):
    """Q4_1 (20 bytes: d, m, qs), Q5_0 (22: d, qh, qs), Q5_1 (24: d, m, qh, qs), 32 values a block (legacy.py):
    byte l of qs holds value l (low nibble) and l + 16 (high); bit j of the uint32 qh is the fifth bit of
    value j. x = d * q + m with an offset m, else d * (q - 16) (simd.q4_1_block, q5_0_block, q5_1_block)."""
    size = 20 if kind == _Q4_1 else (22 if kind == _Q5_0 else 24)
    for k in range(n // 32):
        o = r0 + (8 * s + k) * size
        if kind == _Q4_1:
            simd.q4_1_block(raw, o, w, 32 * k)
        elif kind == _Q5_0:
            simd.q5_0_block(raw, o, w, 32 * k)
        else:
            simd.q5_1_block(raw, o, w, 32 * k)


@njit(cache=True, inline="always", error_model="numpy", boundscheck=False)
def _decode_q8_0(raw, r0, s, n, w):  # 34 bytes: d, qs[32] int8;  x = d * q
    for k in range(n // 32):
        o = r0 + (8 * s + k) * 34
        simd.scaled_i8_32(raw, o + 2, simd.half_to_f32(raw, o), w, 32 * k)


@njit(cache=True, inline="always", error_model="numpy", boundscheck=False)
def _decode_q2_k(raw, r0, s, n, w):  # 84 bytes: scales[16], qs[64], d, dmin
    """x = (d * sc) * q - (dmin * m). Group 4c + s (values 128c + 32s + l) is bit pair s of qs[32c + l];
    its two 16-value halves use scales[8c + 2s] and scales[8c + 2s + 1] (sc low nibble, m high)."""
    o = r0 + s * 84
    d, dmin = simd.half_to_f32(raw, o + 80), simd.half_to_f32(raw, o + 82)
    for c in range(2):
        for s in range(4):
            j = o + 8 * c + 2 * s
            dl0, ml0 = d * np.float32(raw[j] & 15), dmin * np.float32(raw[j] >> 4)
            dl1, ml1 = d * np.float32(raw[j + 1] & 15), dmin * np.float32(raw[j + 1] >> 4)
            simd.affine_u2(raw, o + 16 + 32 * c, 2 * s, w, 128 * c + 32 * s, dl0, ml0, dl1, ml1)


@njit(cache=True, inline="always", error_model="numpy", boundscheck=False)
def _decode_iq2_xxs(raw, r0, s, n, w):  # 66 bytes: d, then 8 groups of 8 bytes (4 grid indices, a uint32)
    """x = (d * (0.5 + s4) * 0.25) * grid[index][k] * sign[k] (tinyspec/quants/iquants.py dequantize_iq2_xxs,
    its product order; every product is exact in float32). Group g (values 32g .. 32g + 31): bytes 0-3
    index 8 values each, the uint32 of bytes 4-7 holds four 7-bit KSIGNS indices and the scale s4 on top."""
    o = r0 + s * 66
    d = simd.half_to_f32(raw, o)
    for g in range(8):
        q = o + 2 + 8 * g
        aux = _u32(raw, q + 4)
        db = d * (np.float32(0.5) + np.float32(aux >> 28)) * np.float32(0.25)
        for k in range(4):  # 8 values: a codeword times its signs, (db * grid) * sign as the oracle
            simd.grid_signed8(_IQ2XXS_GRID, 8 * np.int64(raw[q + k]), _KSIGN_ROWS, 8 * np.int64((aux >> (7 * k)) & 127),
                              db, w, 32 * g + 8 * k)


@njit(cache=True, inline="always", error_model="numpy", boundscheck=False)
def _decode_q3_k(raw, r0, s, n, w, sm):  # 110 bytes: hmask[32], qs[64], scales[12], d
    """x = (d * (sc - 32)) * q, q = low2 - (0 if the hmask bit is set else 4) (dequantize_q3_k). Sub-block i
    (values 16i ..): sc low 4 bits = nibble i // 8 of scales[i % 8], high 2 = bits 2(i // 4).. of
    scales[8 + i % 4]; value v: low2 = bits 2((v % 128) // 32).. of qs[32(v // 128) + v % 32], its hmask bit
    = bit v // 32 of hmask[v % 32]."""
    o = r0 + s * 110
    d = simd.half_to_f32(raw, o + 108)
    dl = sm  # the 16 sub-block scales d * (sc - 32)
    for i in range(16):
        low, high = (raw[o + 96 + i % 8] >> (4 * (i // 8))) & 15, (raw[o + 104 + i % 4] >> (2 * (i // 4))) & 3
        dl[i] = d * np.float32((np.int32(low) | (np.int32(high) << 4)) - 32)
    for c in range(2):
        for s in range(4):  # values 128c + 32s + l: group 4c + s, sub-blocks 8c + 2s and 8c + 2s + 1
            simd.q3_k_group(raw, o + 32 + 32 * c, o, 2 * s, 4 * c + s, w, 128 * c + 32 * s,
                            dl[8 * c + 2 * s], dl[8 * c + 2 * s + 1])


@njit(cache=True, inline="always", error_model="numpy", boundscheck=False)
def _decode_iq3_xxs(raw, r0, s, n, w):  # 98 bytes: d, qs[64] (a grid index per 4 values), 8 uint32 (signs, s4)
    """As IQ2_XXS with 4-wide codewords (two per 8 values) and db = d * (0.5 + s4) * 0.5
    (dequantize_iq3_xxs); the uint32 of group g sits at byte 66 + 4g."""
    o = r0 + s * 98
    d = simd.half_to_f32(raw, o)
    for g in range(8):
        aux = _u32(raw, o + 66 + 4 * g)
        db = d * (np.float32(0.5) + np.float32(aux >> 28)) * np.float32(0.5)
        for k in range(4):
            q, si, j = o + 2 + 8 * g + 2 * k, 8 * np.int64((aux >> (7 * k)) & 127), 32 * g + 8 * k
            simd.grid_signed4(_IQ3XXS_GRID, 4 * np.int64(raw[q]), _KSIGN_ROWS, si, db, w, j)
            simd.grid_signed4(_IQ3XXS_GRID, 4 * np.int64(raw[q + 1]), _KSIGN_ROWS, si + 4, db, w, j + 4)


@njit(cache=True, inline="always", error_model="numpy", boundscheck=False)
def _decode_iq2_xs(raw, r0, s, n, w):  # 74 bytes: d, 32 uint16 (9-bit index, 7-bit KSIGNS index), scales[8]
    """x = (d * (0.5 + s4) * 0.25) * grid[index][k] * sign[k], s4 per 16 values: nibble k // 2 of scales[g]
    for the k-th 8 values of group g (dequantize_iq2_xs)."""
    o = r0 + s * 74
    d = simd.half_to_f32(raw, o)
    for g in range(8):
        sc = raw[o + 66 + g]
        for k in range(4):
            u = np.int64(raw[o + 2 + 8 * g + 2 * k]) | (np.int64(raw[o + 3 + 8 * g + 2 * k]) << 8)
            db = d * (np.float32(0.5) + np.float32((sc >> (4 * (k // 2))) & 15)) * np.float32(0.25)
            simd.grid_signed8(_IQ2XS_GRID, 8 * (u & 511), _KSIGN_ROWS, 8 * (u >> 9), db, w, 32 * g + 8 * k)


@njit(cache=True, inline="always", error_model="numpy", boundscheck=False)
def _decode_iq2_s(raw, r0, s, n, w):  # 82 bytes: d, qs[32], signs[32], qh[8], scales[8]
    """As IQ2_XS with a 10-bit index (qs byte | 2 bits of qh[g] << 8) and explicit sign bytes (dequantize_iq2_s)."""
    o = r0 + s * 82
    d = simd.half_to_f32(raw, o)
    for g in range(8):
        sc, qh = raw[o + 74 + g], np.int64(raw[o + 66 + g])
        for k in range(4):
            index = np.int64(raw[o + 2 + 4 * g + k]) | (((qh >> (2 * k)) & 3) << 8)
            db = d * (np.float32(0.5) + np.float32((sc >> (4 * (k // 2))) & 15)) * np.float32(0.25)
            simd.grid_signed8(_IQ2S_GRID, 8 * index, _SIGN_ROWS, 8 * np.int64(raw[o + 34 + 4 * g + k]), db, w,
                              32 * g + 8 * k)


@njit(cache=True, inline="always", error_model="numpy", boundscheck=False)
def _decode_iq3_s(raw, r0, s, n, w):  # 110 bytes: d, qs[64], qh[8], signs[32], scales[4]
    """x = (d * (1 + 2 s4)) * grid[index][k] * sign[k]; 9-bit indices (qs byte | bit j of qh[g] << 8), one per 4
    values, s4 per 32 values: nibble g % 2 of scales[g // 2] (dequantize_iq3_s)."""
    o = r0 + s * 110
    d = simd.half_to_f32(raw, o)
    for g in range(8):
        db = d * np.float32(1 + 2 * np.int32((raw[o + 106 + g // 2] >> (4 * (g % 2))) & 15))
        qh = np.int64(raw[o + 66 + g])
        for k in range(4):
            si, j = 8 * np.int64(raw[o + 74 + 4 * g + k]), 32 * g + 8 * k
            for h in range(2):  # two 4-wide codewords per 8 values
                index = np.int64(raw[o + 2 + 8 * g + 2 * k + h]) | (((qh >> (2 * k + h)) & 1) << 8)
                simd.grid_signed4(_IQ3S_GRID, 4 * index, _SIGN_ROWS, si + 4 * h, db, w, j + 4 * h)


@njit(cache=True, inline="always", error_model="numpy", boundscheck=False)
def _decode_iq1_s(raw, r0, s, n, w):  # 50 bytes: d, qs[32], 8 uint16 qh
    """x = (d * (2 s3 + 1)) * (grid[index][k] + delta): 11-bit index (qs byte | 3 bits of qh << 8), s3 = qh bits
    12-14, delta = -1/8 if qh bit 15 else +1/8, per 32 values (dequantize_iq1_s)."""
    o = r0 + s * 50
    d = simd.half_to_f32(raw, o)
    for g in range(8):
        qh = np.int64(raw[o + 34 + 2 * g]) | (np.int64(raw[o + 35 + 2 * g]) << 8)
        dl = d * np.float32(2 * ((qh >> 12) & 7) + 1)
        delta = -_IQ1_DELTA if qh & 0x8000 else _IQ1_DELTA
        for k in range(4):
            index = np.int64(raw[o + 2 + 4 * g + k]) | (((qh >> (3 * k)) & 7) << 8)
            simd.grid_shifted8(_IQ1S_GRID, 8 * index, delta, dl, w, 32 * g + 8 * k)


@njit(cache=True, inline="always", error_model="numpy", boundscheck=False)
def _decode_iq1_m(raw, r0, s, n, w):  # 56 bytes: qs[32], qh[16], 4 uint16 scales (d in their top nibbles)
    """As IQ1_S per 8 values i: index = qs[i] | (nibble i of qh) & 7 << 8, delta by its bit 3; s3 per 16
    values = bits 3j.. of scale word j // 4; the fp16 d = the four top nibbles (dequantize_iq1_m)."""
    o = r0 + s * 56
    bits = np.int64(0)
    for word in range(4):  # bits 12-15 of scale word `word` = nibble `word` of d's fp16 bits
        bits |= (np.int64(raw[o + 49 + 2 * word]) >> 4) << (4 * word)
    d = _f16(np.uint8(bits & 255), np.uint8(bits >> 8))
    for i in range(32):
        nib = np.int64(raw[o + 32 + i // 2] >> (4 * (i % 2))) & 15
        word = raw[o + 48 + 2 * (i // 8)] | (np.int64(raw[o + 49 + 2 * (i // 8)]) << 8)
        dl = d * np.float32(2 * ((word >> (3 * ((i // 2) % 4))) & 7) + 1)
        delta = -_IQ1_DELTA if nib & 8 else _IQ1_DELTA
        simd.grid_shifted8(_IQ1S_GRID, 8 * (np.int64(raw[o + i]) | ((nib & 7) << 8)), delta, dl, w, 8 * i)


@njit(cache=True, inline="always", error_model="numpy", boundscheck=False)
def _decode_fp4(kind, raw, r0, s, n, w):
    """MXFP4 (17 bytes: E8M0 e, qs[16]; 32 values) and NVFP4 (36 bytes: 4 UE4M3 scales, qs[32]; 64 values, 16 a
    scale): x = KVALUES_FP4[code] * scale/2 (fp4.py). MXFP4 byte j: values j (low nibble), j + 16; NVFP4 byte
    8 t + j: values 16 t + j and 16 t + j + 8."""
    if kind == _MXFP4:
        for k in range(n // 32):
            o = r0 + (8 * s + k) * 17
            d = _E8M0_HALF[raw[o]]
            for l in range(16):
                b = raw[o + 1 + l]
                w[32 * k + l] = _KVALUES_FP4[b & 15] * d
                w[32 * k + 16 + l] = _KVALUES_FP4[b >> 4] * d
    else:
        for k in range(n // 64):
            o = r0 + (4 * s + k) * 36
            for t in range(4):
                d = _UE4M3_HALF[raw[o + t]]
                for l in range(8):
                    b = raw[o + 4 + 8 * t + l]
                    w[64 * k + 16 * t + l] = _KVALUES_FP4[b & 15] * d
                    w[64 * k + 16 * t + 8 + l] = _KVALUES_FP4[b >> 4] * d


@njit(cache=True, inline="always", error_model="numpy", boundscheck=False)
def _decode_iq4_nl(raw, r0, s, n, w):  # 18 bytes: d, qs[16];  x = d * KVALUES[code], Q4_0's nibble layout
    for k in range(n // 32):
        o = r0 + (8 * s + k) * 18
        simd.iq4_block32(raw, o + 2, simd.half_to_f32(raw, o), w, 32 * k)


@njit(cache=True, inline="always", error_model="numpy", boundscheck=False)
def _decode_iq4_xs(raw, r0, s, n, w):  # 136 bytes: d, scales_h (u16), scales_l[4], qs[128]
    """x = (d * (scale - 32)) * KVALUES[code] per 32 values, scale = 6 bits: low nibble g of scales_l, high
    bits 2g, 2g + 1 of scales_h (dequantize_iq4_xs); the codes as IQ4_NL's, 16 bytes per 32 values."""
    o = r0 + s * 136
    d = simd.half_to_f32(raw, o)
    scales_h = np.int32(raw[o + 2]) | (np.int32(raw[o + 3]) << 8)
    for g in range(8):
        scale = np.int32((raw[o + 4 + g // 2] >> (4 * (g % 2))) & 15) | (((scales_h >> (2 * g)) & 3) << 4)
        simd.iq4_block32(raw, o + 8 + 16 * g, d * np.float32(scale - 32), w, 32 * g)


@njit(cache=True, inline="always", error_model="numpy", boundscheck=False)
def _decode_q4_k(raw, r0, s, n, w, sm):  # 144 bytes: d, dmin, scales[12], qs[128]
    """x = (d * sc) * q - (dmin * m); qs[32c + l] holds value l of group 2c (low nibble) and 2c + 1."""
    o = r0 + s * 144
    simd.k_scales(raw, o + 4, simd.half_to_f32(raw, o), simd.half_to_f32(raw, o + 2), sm)
    for c in range(4):  # sm[0:8] = d * sc, sm[8:16] = dmin * m
        simd.affine_u4(raw, o + 16 + 32 * c, w, 64 * c, sm[2 * c], sm[8 + 2 * c], sm[2 * c + 1], sm[9 + 2 * c])


@njit(cache=True, inline="always", error_model="numpy", boundscheck=False)
def _decode_q5_k(raw, r0, s, n, w, sm):  # 176 bytes: d, dmin, scales[12], qh[32], qs[128]
    """As Q4_K (qs at offset 48), plus the fifth bit (16) of value l of group j: bit j of qh[l]."""
    o = r0 + s * 176
    simd.k_scales(raw, o + 4, simd.half_to_f32(raw, o), simd.half_to_f32(raw, o + 2), sm)
    for c in range(4):
        simd.affine_u5(raw, o + 48 + 32 * c, o + 16, c, w, 64 * c,
                       sm[2 * c], sm[8 + 2 * c], sm[2 * c + 1], sm[9 + 2 * c])


@njit(cache=True, inline="always", error_model="numpy", boundscheck=False)
def _decode_q6_k(raw, r0, s, n, w, sm):  # 210 bytes: ql[128], qh[64], scales[16] int8, d
    """x = (d * sc) * (q - 32). Values 128h + 32g + l (group 4h + g): low 4 bits are nibble g // 2 of
    ql[64h + 32(g % 2) + l], high 2 bits are bits 2g of qh[32h + l]; scales[8h + 2g] for l < 16, then
    scales[8h + 2g + 1] (simd.q6_k_half decodes one h)."""
    o = r0 + s * 210
    simd.scaled_i8_16(raw, o + 192, simd.half_to_f32(raw, o + 208), sm, 0)  # sm = d * scales
    for h in range(2):
        simd.q6_k_half(raw, o + 64 * h, o + 128 + 32 * h, sm, 8 * h, w, 128 * h)


@njit(cache=True, inline="always", error_model="numpy", boundscheck=False)
def _decode_span(kind, raw, r0, s, n, w, sm):
    """Values LANES * s .. LANES * s + n - 1 of the row at raw[r0] -> w[:n] (n <= LANES)."""
    if kind == _Q4_K:
        _decode_q4_k(raw, r0, s, n, w, sm)
    elif kind == _Q6_K:
        _decode_q6_k(raw, r0, s, n, w, sm)
    elif kind == _Q8_0:
        _decode_q8_0(raw, r0, s, n, w)
    elif kind == _Q5_K:
        _decode_q5_k(raw, r0, s, n, w, sm)
    elif kind == _Q4_0:
        _decode_q4_0(raw, r0, s, n, w)
    elif kind == _Q2_K:
        _decode_q2_k(raw, r0, s, n, w)
    elif kind == _Q3_K:
        _decode_q3_k(raw, r0, s, n, w, sm)
    elif kind == _Q4_1 or kind == _Q5_0 or kind == _Q5_1:
        _decode_q4_1_q5(kind, raw, r0, s, n, w)
    elif kind == _IQ2_XXS:
        _decode_iq2_xxs(raw, r0, s, n, w)
    elif kind == _IQ3_XXS:
        _decode_iq3_xxs(raw, r0, s, n, w)
    elif kind == _MXFP4 or kind == _NVFP4:
        _decode_fp4(kind, raw, r0, s, n, w)
    elif kind == _IQ2_XS:
        _decode_iq2_xs(raw, r0, s, n, w)
    elif kind == _IQ2_S:
        _decode_iq2_s(raw, r0, s, n, w)
    elif kind == _IQ3_S:
        _decode_iq3_s(raw, r0, s, n, w)
    elif kind == _IQ1_S:
        _decode_iq1_s(raw, r0, s, n, w)
    elif kind == _IQ1_M:
        _decode_iq1_m(raw, r0, s, n, w)
    elif kind == _IQ4_XS:
        _decode_iq4_xs(raw, r0, s, n, w)
    elif kind == _IQ4_NL:
        _decode_iq4_nl(raw, r0, s, n, w)
    elif kind == _F16:
        _decode_f16(raw, r0, s, n, w)
    elif kind == _BF16:
        _decode_bf16(raw, r0, s, n, w)
    else:
        _decode_f32(raw, r0, s, n, w)


@njit(cache=True, inline="always")
def _aligned_zeros(n):  # n float32 zeros starting on a 64-byte line: a zmm load never splits two lines
    buf = np.zeros(n + 16, np.float32)
    a = ((64 - buf.ctypes.data % 64) % 64) // 4
    return buf[a:a + n]


# ---------------------------------------------------------------------------------------------
# The kernels. x is [T, in]; acc is [T * LANES].


@njit(cache=True, parallel=True, error_model="numpy", boundscheck=False)
def _quant_linear_parallel(x, raw, row_bytes, kind, n_in, y):
    """y[:, r] for every row, tasks of ROWS rows over the threads: decode the row once, span by span of
    LANES values, into wrow; then for each t the lanes acc[l] = fma(w[l], x[t, v0 + l], acc[l]) over the
    whole spans in registers (simd.fma_spans256), a partial last span 16 lanes at a time (simd.fma16),
    and the fixed lane tree."""
    T, n_out = y.shape
    W = (n_in + LANES - 1) // LANES * LANES
    full = n_in // LANES  # whole spans; a partial one follows when n_in % LANES
    span_bytes = row_bytes * LANES // max(n_in, 1)  # bytes of a whole span (a prefetch hint only)
    xc = _aligned_zeros(T * W)  # x zero-padded to whole spans, rows on 64-byte lines
    for t in range(T):
        xc[W * t:W * t + n_in] = x[t]
    for task in prange((n_out + ROWS - 1) // ROWS):
        scratch = _aligned_zeros(W + 16 + LANES)
        wrow, sm, acc = scratch[:W], scratch[W:W + 16], scratch[W + 16:]
        for r in range(task * ROWS, min(n_out, (task + 1) * ROWS)):
            for s in range((n_in + LANES - 1) // LANES):  # span s: values v0 .. v0 + n - 1
                v0 = LANES * s
                n = min(LANES, n_in - v0)
                for p in range(0, span_bytes, 64):
                    simd.prefetch(raw, r * row_bytes + s * span_bytes + AHEAD + p)
                _decode_span(kind, raw, r * row_bytes, s, n, wrow[v0:], sm)
                n16 = (n + 15) // 16
                if n < 16 * n16:  # a float row ending mid-group: the x padding is 0, make w finite there
                    wrow[v0 + n:v0 + 16 * n16] = np.float32(0)
            for t in range(T):
                simd.fma_spans256(acc, wrow, 0, xc, W * t, full)
                if full * LANES < n_in:
                    v0 = full * LANES
                    for g in range((n_in - v0 + 15) // 16):
                        simd.fma16(acc, 16 * g, wrow, v0 + 16 * g, xc, W * t + v0 + 16 * g)
                y[t, r] = simd.lane_sum256(acc, 0)


@njit(cache=True, error_model="numpy", boundscheck=False)
def _quantize_q8_k(x, n_in, qx, dx, bs):
    """x [T, n_in] -> Q8_K codes qx [T * n_in], scales dx [T * n_in / 256], bsums bs [T * n_in / 16]:
    bit for bit tinyspec/quants/q8_k.py (iscale = -127 / max, round half to even, min 127).
    Written so that LLVM vectorizes each loop (it runs serially before every integer matmul, and the scalar
    form was a visible share of a verify pass: docs/performance-log.md old 25): the block's largest |x| is an
    integer max over the float bits with the sign cleared (for non-negative floats the two orders agree),
    then the first value with those bits."""
    xf = x.reshape(-1)  # the T rows end to end: a row is a whole number of blocks
    xb = xf.view(np.int32)
    for blk in range(xf.size // 256):
        o = 256 * blk
        top = np.int32(0)
        for j in range(o, o + 256):
            top = max(top, xb[j] & np.int32(0x7FFFFFFF))
        if top == 0:
            dx[blk] = np.float32(0)
            for j in range(o, o + 256):
                qx[j] = 0
        else:
            first = o  # the first value of largest magnitude, sign included
            while (xb[first] & np.int32(0x7FFFFFFF)) != top:
                first += 1
            iscale = np.float32(-127) / xf[first]
            for j in range(o, o + 256):
                qx[j] = np.int8(min(np.float32(127), np.rint(iscale * xf[j])))
            dx[blk] = np.float32(1) / iscale
    for g in range(xf.size // 16):
        acc = np.int16(0)
        for j in range(16 * g, 16 * g + 16):
            acc += np.int16(qx[j])
        bs[g] = acc


@njit(cache=True, error_model="numpy", boundscheck=False)
def _quantize_q8_0(x, n_in, W, qxu, dxb):
    """x [T, n_in] -> Q8_0 blocks of 32 as the kernel reads them: x' = q + 128 in qxu [T, W] (uint8; a row
    padded to W with 128, i.e. q = 0) and the fp16-rounded block scales in dxb (padding 0).
    Bit for bit tinyspec/quants/legacy.py quantize_q8_0 (ggml quantize_row_q8_0_ref): d = max|x| / 127,
    q = round(x * (1 / d)) with ties away from zero, d stored as fp16 (a NaN in the block makes d NaN, as
    NumPy's max does). dxb [T, W / 32, 8]: each scale written 8 times, the lanes of its block in the kernels'
    16-lane sums of a pair (simd._q8_0_x loads them as they are)."""
    T = x.shape[0]
    nb2 = W // 32
    bits = x.view(np.int32)  # x's IEEE bits: |x| orders as its bits with the sign cleared, a NaN above inf
    amax_at = np.empty(1, np.int32)
    for t in range(T):
        row = x[t]
        for b in range(n_in // 32):
            top = np.int32(0)
            for j in range(32 * b, 32 * b + 32):  # max |x| as an integer max (vectorized; a NaN in the block wins)
                top = max(top, bits[t, j] & np.int32(0x7FFFFFFF))
            amax_at[0] = top
            amax = amax_at.view(np.float32)[0]
            d = amax / np.float32(127)
            inv = np.float32(1) / d if d != 0 else np.float32(0)
            for j in range(32 * b, 32 * b + 32):
                v = np.float64(row[j] * inv)
                q = np.floor(abs(v) + 0.5)
                qxu[t * W + j] = np.uint8(128 - q if v < 0 else 128 + q)
            d16 = simd.round_f16(d)
            for lane in range(8):
                dxb[8 * (t * nb2 + b) + lane] = d16


@njit(cache=True, parallel=True, error_model="numpy", boundscheck=False)
def _quant_linear_q8_0_parallel(x, raw, row_bytes, kind, n_in, y):
    """y[:, r] for Q8_0, Q4_0, Q5_0 or IQ4_NL rows times x rounded to Q8_0 (llama.cpp's vec_dot_q8_0_q8_0,
    vec_dot_q4_0_q8_0, vec_dot_q5_0_q8_0, vec_dot_iq4_nl_q8_0): per pair of blocks the signed codes, scales and the
    -128 sum w base unpacked once, then one vpdpbusd and one fma per input row; the fixed 16-lane tree. simd.*_rows
    does it for whole weight rows with every sum's lanes in a register: two weight rows against one input row (a
    decode step), or one weight row against the input rows 4, 2 and 1 at a time (a verify pass, a prefill: the row
    read from memory once, then from the L1 cache). The same bits as the block-pair loop with the lanes in memory
    (simd.*_pair, simd.*_single: tests/test_numba_ops.py's reference), which ran a 9-row product 1.2x and a 128-row
    one 2.6x slower."""
    T, n_out = y.shape
    nbk = n_in // 32
    npair = (nbk + 1) // 2
    W = 64 * npair  # a row of x' padded to whole pairs
    qxu = _aligned_zeros(T * W // 4).view(np.uint8)  # [T, W] x' = q + 128, rows on 64-byte lines
    qxu[:] = np.uint8(128)
    dxb = np.zeros(T * 16 * npair, np.float32)  # [T, 2 npair, 8] block scales
    _quantize_q8_0(x, n_in, W, qxu, dxb)
    for task in prange((n_out + ROWS - 1) // ROWS):
        for r in range(task * ROWS, min(n_out, (task + 1) * ROWS)):
            # Each kind's intrinsic is called right here, spelled out: reached through a helper function (inline
            # or not) Numba compiled the same calls 4x slower, the lanes back in memory (LESSONS 30).
            o, nb2 = r * row_bytes, 2 * npair
            if T == 1:  # two weight rows a call, the input loaded once for both (row r + 1 taken with r)
                if (r - task * ROWS) % 2 == 1:
                    continue
                k0, j0, i = 0, 0, r
                if r + 1 < min(n_out, (task + 1) * ROWS):
                    if kind == _Q8_0:
                        simd.q8_0_rows2x1(raw, o, row_bytes, nbk, qxu, k0, W, dxb, j0, nb2, AHEAD, y, i, n_out)
                    elif kind == _Q4_0:
                        simd.q4_0_rows2x1(raw, o, row_bytes, nbk, qxu, k0, W, dxb, j0, nb2, AHEAD, y, i, n_out)
                    elif kind == _Q5_0:
                        simd.q5_0_rows2x1(raw, o, row_bytes, nbk, qxu, k0, W, dxb, j0, nb2, AHEAD, y, i, n_out)
                    else:
                        simd.iq4_nl_rows2x1(raw, o, row_bytes, nbk, qxu, k0, W, dxb, j0, nb2, AHEAD, y, i, n_out)
                else:
                    if kind == _Q8_0:
                        simd.q8_0_rows1x1(raw, o, row_bytes, nbk, qxu, k0, W, dxb, j0, nb2, AHEAD, y, i, n_out)
                    elif kind == _Q4_0:
                        simd.q4_0_rows1x1(raw, o, row_bytes, nbk, qxu, k0, W, dxb, j0, nb2, AHEAD, y, i, n_out)
                    elif kind == _Q5_0:
                        simd.q5_0_rows1x1(raw, o, row_bytes, nbk, qxu, k0, W, dxb, j0, nb2, AHEAD, y, i, n_out)
                    else:
                        simd.iq4_nl_rows1x1(raw, o, row_bytes, nbk, qxu, k0, W, dxb, j0, nb2, AHEAD, y, i, n_out)
                continue
            t = 0
            while t < T:  # the input rows four, two, one at a time
                k0, j0, i = t * W, t * nb2, t * n_out + r
                if T - t >= 4:
                    if kind == _Q8_0:
                        simd.q8_0_rows1x4(raw, o, row_bytes, nbk, qxu, k0, W, dxb, j0, nb2, AHEAD, y, i, n_out)
                    elif kind == _Q4_0:
                        simd.q4_0_rows1x4(raw, o, row_bytes, nbk, qxu, k0, W, dxb, j0, nb2, AHEAD, y, i, n_out)
                    elif kind == _Q5_0:
                        simd.q5_0_rows1x4(raw, o, row_bytes, nbk, qxu, k0, W, dxb, j0, nb2, AHEAD, y, i, n_out)
                    else:
                        simd.iq4_nl_rows1x4(raw, o, row_bytes, nbk, qxu, k0, W, dxb, j0, nb2, AHEAD, y, i, n_out)
                    t += 4
                elif T - t >= 2:
                    if kind == _Q8_0:
                        simd.q8_0_rows1x2(raw, o, row_bytes, nbk, qxu, k0, W, dxb, j0, nb2, AHEAD, y, i, n_out)
                    elif kind == _Q4_0:
                        simd.q4_0_rows1x2(raw, o, row_bytes, nbk, qxu, k0, W, dxb, j0, nb2, AHEAD, y, i, n_out)
                    elif kind == _Q5_0:
                        simd.q5_0_rows1x2(raw, o, row_bytes, nbk, qxu, k0, W, dxb, j0, nb2, AHEAD, y, i, n_out)
                    else:
                        simd.iq4_nl_rows1x2(raw, o, row_bytes, nbk, qxu, k0, W, dxb, j0, nb2, AHEAD, y, i, n_out)
                    t += 2
                else:
                    if kind == _Q8_0:
                        simd.q8_0_rows1x1(raw, o, row_bytes, nbk, qxu, k0, W, dxb, j0, nb2, AHEAD, y, i, n_out)
                    elif kind == _Q4_0:
                        simd.q4_0_rows1x1(raw, o, row_bytes, nbk, qxu, k0, W, dxb, j0, nb2, AHEAD, y, i, n_out)
                    elif kind == _Q5_0:
                        simd.q5_0_rows1x1(raw, o, row_bytes, nbk, qxu, k0, W, dxb, j0, nb2, AHEAD, y, i, n_out)
                    else:
                        simd.iq4_nl_rows1x1(raw, o, row_bytes, nbk, qxu, k0, W, dxb, j0, nb2, AHEAD, y, i, n_out)
                    t += 1


_quant_linear_q8_0_one_thread = njit(error_model="numpy", boundscheck=False)(_quant_linear_q8_0_parallel.py_func)


@njit(cache=True, error_model="numpy", boundscheck=False)
def _quant_linear_q8_0_serial(x, raw, row_bytes, kind, n_in, y):  # the twin on the calling thread (see below)
    _quant_linear_q8_0_one_thread(x, raw, row_bytes, kind, n_in, y)


@njit(cache=True, parallel=True, error_model="numpy", boundscheck=False)
def _quant_linear_q8_parallel(x, raw, row_bytes, kind, n_in, y):
    """y[:, r] for K-quant rows times x rounded to Q8_K: per super-block one simd.*_block call (unpack once,
    then every t into its 16 float lanes); the fixed 16-lane tree. With T > 1 the K-quants and IQ4_XS
    take two weight rows a call (simd.*_block2: each input row's codes loaded once for both, and two
    independent accumulator chains in flight; the same bits per row, tested), because one row's chain
    load -> fma -> fma -> store per block was what a verify pass waited on. At T = 1 one row a call: a decode
    streams the weights from DRAM, and two interleaved row streams read it slower than one
    (docs/performance-log.md old 31)."""
    T, n_out = y.shape
    nb = n_in // 256
    qx = _aligned_zeros(T * n_in // 4).view(np.int8)  # [T, n_in] codes, rows on 64-byte lines
    bs = _aligned_zeros(T * n_in // 32).view(np.int16)  # [T, n_in / 16] bsums
    dx = np.zeros(T * nb, np.float32)  # [T, n_in / 256] scales
    _quantize_q8_k(x, n_in, qx, dx, bs)
    wide = kind == _Q4_K and simd.VNNI_LAYOUT  # Q4_K's codes 64 bytes at a time (simd.Q4_K_WIDE_X, LANE_SWAP)
    if wide:  # x in the order the codes come in: per 128 values, [0:32] [64:96] [32:64] [96:128]
        for c in range(0, T * n_in, 128):
            for j in range(c + 32, c + 64):
                qx[j], qx[j + 32] = qx[j + 32], qx[j]
    signed = kind == _Q6_K and simd.VNNI_LAYOUT  # Q6_K with signed codes, x' = qx + 128 (simd.q6_k_signed_block)
    unsigned_x = signed or kind == _IQ4_XS  # IQ4_XS's codes are signed levels (simd.iq4_xs_block)
    qxu = _aligned_zeros(T * n_in // 4 if unsigned_x else 16).view(np.uint8)
    if unsigned_x:
        for j in range(T * n_in):
            qxu[j] = np.uint8(np.int16(qx[j]) + 128)
    xb = _aligned_zeros(16 if unsigned_x else T * n_in // 16)  # [T, n_in / 16] -(dx * bsum) per group of 16:
    if not unsigned_x:                                          # the offsets' row side (the others have none)
        for g in range(xb.size):  # (wide: a block's 16 groups in the order of its lanes)
            h = g - g % 16 + LANE_SWAP[g % 16] if wide else g
            xb[g] = -(dx[g // 16] * np.float32(bs[h]))
    block_bytes = row_bytes // nb
    for task in prange((n_out + ROWS - 1) // ROWS):
        acc = _aligned_zeros(32 * T)  # [T, 16] float lanes of the row being summed ([T, 2, 16]: of two rows)
        first, end = task * ROWS, min(n_out, (task + 1) * ROWS)
        pairs = (end - first) // 2 if PAIR_ROWS and T > 1 else 0
        for r in range(first, first + 2 * pairs, 2):  # two weight rows a call, x's codes loaded once for both
            acc[:] = np.float32(0)
            for b in range(nb):
                o = r * row_bytes + b * block_bytes
                for p in range(0, block_bytes, 64):
                    simd.prefetch(raw, o + AHEAD + p)
                    simd.prefetch(raw, o + row_bytes + AHEAD + p)
                o2 = o + row_bytes
                if kind == _Q4_K:
                    simd.q4_k_block2(raw, o, o2, qx, 256 * b, n_in, xb, dx, b, nb, acc, T)
                elif kind == _Q5_K:
                    simd.q5_k_block2(raw, o, o2, qx, 256 * b, n_in, xb, dx, b, nb, acc, T)
                elif kind == _Q3_K:
                    simd.q3_k_block2(raw, o, o2, qx, 256 * b, n_in, xb, dx, b, nb, acc, T)
                elif kind == _Q2_K:
                    simd.q2_k_block2(raw, o, o2, qx, 256 * b, n_in, xb, dx, b, nb, acc, T)
                elif kind == _IQ4_XS:
                    simd.iq4_xs_block2(raw, o, o2, qxu, 256 * b, n_in, dx, b, nb, acc, T)
                elif signed:
                    simd.q6_k_signed_block2(raw, o, o2, qxu, 256 * b, n_in, dx, b, nb, acc, T)
                else:
                    simd.q6_k_block2(raw, o, o2, qx, 256 * b, n_in, xb, dx, b, nb, acc, T)
            for t in range(T):
                for n in range(2):
                    if wide:
                        y[t, r + n] = simd.lane_sum16_swapped(acc, 32 * t + 16 * n)
                    else:
                        y[t, r + n] = simd.lane_sum16(acc, 32 * t + 16 * n)
        for r in range(first + 2 * pairs, end):
            acc[:] = np.float32(0)
            for b in range(nb):  # per block: unpack once, every input row inside the same intrinsic
                o = r * row_bytes + b * block_bytes
                for p in range(0, block_bytes, 64):
                    simd.prefetch(raw, o + AHEAD + p)
                if kind == _Q4_K:
                    simd.q4_k_block(raw, o, qx, 256 * b, n_in, xb, dx, b, nb, acc, T)
                elif kind == _Q5_K:
                    simd.q5_k_block(raw, o, qx, 256 * b, n_in, xb, dx, b, nb, acc, T)
                elif kind == _Q3_K:
                    simd.q3_k_block(raw, o, qx, 256 * b, n_in, xb, dx, b, nb, acc, T)
                elif kind == _Q2_K:
                    simd.q2_k_block(raw, o, qx, 256 * b, n_in, xb, dx, b, nb, acc, T)
                elif kind == _IQ4_XS:
                    simd.iq4_xs_block(raw, o, qxu, 256 * b, n_in, dx, b, nb, acc, T)
                elif signed:
                    simd.q6_k_signed_block(raw, o, qxu, 256 * b, n_in, dx, b, nb, acc, T)
                else:
                    simd.q6_k_block(raw, o, qx, 256 * b, n_in, xb, dx, b, nb, acc, T)
            for t in range(T):
                y[t, r] = simd.lane_sum16_swapped(acc, 16 * t) if wide else simd.lane_sum16(acc, 16 * t)


# The same kernel compiled without a parallel region, for small matrices: no numba.set_num_threads round
# trip and no pool wake-up, which cost more than the work at these sizes (docs/performance-log.md old 19),
# same bits. (The float kernel has no such twin: LLVM vectorized its loops worse outside a parfor; old 19.)
# It is cached under its own name through a wrapper: Numba's cache keys an entry by the function's module,
# name, line and signature, not by its flags, so compiling the same py_func twice with cache=True made the
# two twins share one entry, and whichever compiled first was loaded for both (after the tests had compiled
# the serial twin first, every "parallel" matmul ran on one thread).
_quant_linear_q8_one_thread = njit(error_model="numpy", boundscheck=False)(_quant_linear_q8_parallel.py_func)


@njit(cache=True, error_model="numpy", boundscheck=False)
def _quant_linear_q8_serial(x, raw, row_bytes, kind, n_in, y):
    _quant_linear_q8_one_thread(x, raw, row_bytes, kind, n_in, y)


_quant_linear_one_thread = njit(error_model="numpy", boundscheck=False)(_quant_linear_parallel.py_func)


@njit(cache=True, error_model="numpy", boundscheck=False)
def _quant_linear_serial(x, raw, row_bytes, kind, n_in, y):  # the float kernel's one-thread twin, cached
    _quant_linear_one_thread(x, raw, row_bytes, kind, n_in, y)


_FLOAT, _INTEGER, _INTEGER_Q8_0 = 0, 1, 2  # _experts_linear's kernel families (which matmul each expert runs)


@njit(cache=True, parallel=True, error_model="numpy", boundscheck=False)
def _experts_linear(x, raw, expert_bytes, row_bytes, kind, n_in, family, experts, offsets, y):
    """y[a:b] = expert experts[i]'s rows times x[a:b], a, b = offsets[i], offsets[i + 1]: the rows of a pass
    grouped by the expert they chose (moe.py). One thread per expert, each running the one-row-at-a-time
    kernel of its family on its rows, so a row's bits are those of a one-row call (batch invariance) and an
    expert's weights are read once for all its rows. One parallel region per layer and projection instead of
    one per expert: at T = 1 a decode's 8 small matmuls (0.6 MB each) would each pay a pool wake-up.
    It calls the cached one-thread twins (the *_serial wrappers), so a warm cache links their compiled code
    instead of compiling the three families again inside this kernel (fast/warm.py compiles them first)."""
    for i in prange(experts.size):
        a, b = offsets[i], offsets[i + 1]
        w = raw[experts[i] * expert_bytes : (experts[i] + 1) * expert_bytes]
        if family == _INTEGER:
            _quant_linear_q8_serial(x[a:b], w, row_bytes, kind, n_in, y[a:b])
        elif family == _INTEGER_Q8_0:
            _quant_linear_q8_0_serial(x[a:b], w, row_bytes, kind, n_in, y[a:b])
        else:
            _quant_linear_serial(x[a:b], w, row_bytes, kind, n_in, y[a:b])


@njit(cache=True, error_model="numpy", boundscheck=False)
def _get_rows_kernel(raw, row_bytes, kind, n_in, ids, out):  # ids [n] int64 -> out [n, in]
    scratch = _aligned_zeros(LANES + 16)  # one thread: an embedding lookup is a few rows, memory-bound
    w, sm = scratch[:LANES], scratch[LANES:]
    for i in range(ids.size):
        dst = out[i]
        for s in range((n_in + LANES - 1) // LANES):
            v0 = LANES * s
            n = min(LANES, n_in - v0)
            _decode_span(kind, raw, ids[i] * row_bytes, s, n, w, sm)
            for j in range(n):
                dst[v0 + j] = w[j]


# ---------------------------------------------------------------------------------------------
# Public functions: argument checks in NumPy, then one kernel call.


def _weight_blocks(raw: np.ndarray, ggml_type, shape) -> tuple[GGMLType, np.ndarray]:
    """Validate type and sizes; return the type and raw as a C-contiguous [out, row_bytes] view."""
    try:
        qtype = GGMLType(ggml_type)
    except ValueError:
        raise ValueError(f"numba_ops: unknown ggml type id {ggml_type!r}") from None
    if qtype not in SUPPORTED:
        names = ", ".join(t.name for t in SUPPORTED)
        raise ValueError(f"numba_ops: ggml type {qtype.name} is not supported (supported: {names}); "
                         "use tinyspec.ops for it")
    if len(shape) != 2 or min(shape) < 0:
        raise ValueError(f"numba_ops: shape must be (out, in) >= 0, got {tuple(shape)}")
    n_out, n_in = int(shape[0]), int(shape[1])
    if n_in % qtype.block_size:
        raise ValueError(f"numba_ops: {qtype.name} row length {n_in} is not a multiple of the block size "
                         f"{qtype.block_size}")
    raw = np.asarray(raw)
    n_blocks = n_in // qtype.block_size
    if raw.dtype != np.uint8 or raw.size != n_out * n_blocks * qtype.type_size:
        raise ValueError(f"numba_ops: {qtype.name} shape {tuple(shape)} needs {n_out * n_blocks * qtype.type_size}"
                         f" uint8 bytes, got {raw.size} of {raw.dtype}")
    flat = np.ascontiguousarray(raw).reshape(-1)  # a view when raw is contiguous; row r at r * row_bytes
    flat.flags.writeable = False  # read-only always: one compiled kernel for memory maps and arrays alike
    return qtype, flat


FAMILY_Q8_0, FAMILY_Q8_K, FAMILY_FLOAT = 0, 1, 2  # which kernel family a bound weight takes (Bound.family)


class Bound:
    """One weight checked and planned once; call it as linear(x): [T, in] -> [T, out] float32.

    Its plan is public, for the fused steps of fast/numba_steps.py that multiply it inside one compiled call:
    flat (the weight's bytes, read-only uint8), row_bytes, kind (the ggml type id), n_in, n_out, family
    (FAMILY_Q8_0: x rounded to Q8_0 blocks; FAMILY_Q8_K: to Q8_K; FAMILY_FLOAT: float x), serial (True: a
    small matrix, multiplied on the calling thread, since waking the pool costs more than its work and waits for
    a scheduler slice when another process holds a core: LESSONS 18; threads=False: always, see OneThread) and plan, the tuple (flat, row_bytes, kind,
    n_in, family) a compiled step takes."""

    __slots__ = ("flat", "row_bytes", "kind", "n_in", "n_out", "family", "serial", "kernel", "shape", "plan")

    def __init__(self, raw: np.ndarray, ggml_type: GGMLType | int, shape: tuple[int, int], q8: bool = False,
                 threads: bool = True):
        qtype, self.flat = _weight_blocks(raw, ggml_type, shape)
        self.shape = tuple(shape)
        self.n_out, self.n_in = int(shape[0]), int(shape[1])
        self.row_bytes, self.kind = qtype.row_nbytes(self.n_in), int(qtype)
        self.serial = not threads or self.n_out * self.n_in < SERIAL_BELOW or self.n_out <= ROWS
        integer = q8 and qtype in Q8_TYPES
        if integer and qtype in X_Q8_0:  # x in Q8_0 blocks: a kernel of its own
            self.family = FAMILY_Q8_0
            self.kernel = _quant_linear_q8_0_serial if self.serial else _quant_linear_q8_0_parallel
        elif integer:  # x in Q8_K blocks
            self.family = FAMILY_Q8_K
            self.kernel = _quant_linear_q8_serial if self.serial else _quant_linear_q8_parallel
        else:  # the float path
            self.family = FAMILY_FLOAT
            self.kernel = _quant_linear_serial if self.serial else _quant_linear_parallel
        self.plan = (self.flat, self.row_bytes, self.kind, self.n_in, self.family)  # what a compiled step takes

    def __call__(self, x: np.ndarray) -> np.ndarray:
        n_in = self.n_in
        if x.dtype != np.float32 or not x.flags.c_contiguous:
            x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != n_in:
            raise ValueError(f"numba_ops: x must be [T, {n_in}] for weight shape {self.shape}, got {x.shape}")
        y = np.empty((x.shape[0], self.n_out), dtype=np.float32)  # the kernels write every element
        if n_in == 0:
            y[:] = 0
        elif y.size:
            self.kernel(x, self.flat, self.row_bytes, self.kind, n_in, y)
        return y


def bind(raw: np.ndarray, ggml_type: GGMLType | int, shape: tuple[int, int], q8: bool = False) -> Bound:
    """Check the weight once and return `linear(x)`: [T, in] -> [T, out] float32, its quant_linear, or
    with q8=True and a type in Q8_TYPES its quant_linear_q8 (what PackedWeight calls per token). bind checks
    and converts once; quant_linear does it on every call, which added up over a decode step's many matmuls
    (docs/performance-log.md old 19)."""
    return Bound(raw, ggml_type, shape, q8)


class OneThread:
    """This module's weight kernels (PackedWeight's `kernels`) with every matmul on the calling thread, for a model
    small enough to stay in the cache (backends.cpu_tensors; fast/threads.py THREADS_FROM_BYTES says why)."""

    SUPPORTED = SUPPORTED

    @staticmethod
    def bind(raw, ggml_type, shape, q8: bool = False) -> Bound:
        return Bound(raw, ggml_type, shape, q8, threads=False)

    @staticmethod
    def bind_experts(raw, ggml_type, shape, q8: bool = False):
        return bind_experts(raw, ggml_type, shape, q8)

    @staticmethod
    def get_rows(raw, ggml_type, shape, ids):
        return get_rows(raw, ggml_type, shape, ids)


def bind_experts(raw: np.ndarray, ggml_type: GGMLType | int, shape: tuple[int, int, int], q8: bool = False):
    """Check an [E, out, in] expert tensor once and return `experts_linear(x, experts, offsets)`: x [P, in] float32
    rows grouped by expert (rows offsets[i]:offsets[i + 1] chose expert experts[i]) -> [P, out] float32, row p
    bitwise what bind(expert's bytes, ...)(x[p:p + 1]) gives (the oracle: tinyspec.moe.experts_linear)."""
    if len(shape) != 3 or min(shape) < 0:
        raise ValueError(f"numba_ops: expert shape must be (E, out, in) >= 0, got {tuple(shape)}")
    E, n_out, n_in = (int(v) for v in shape)
    qtype, flat = _weight_blocks(raw, ggml_type, (E * n_out, n_in))
    row_bytes, kind = qtype.row_nbytes(n_in), int(qtype)
    family = (_INTEGER_Q8_0 if qtype in X_Q8_0 else _INTEGER) if q8 and qtype in Q8_TYPES else _FLOAT

    def experts_linear(x: np.ndarray, experts: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        experts, offsets = np.asarray(experts, dtype=np.int64), np.asarray(offsets, dtype=np.int64)
        if x.ndim != 2 or x.shape[1] != n_in:
            raise ValueError(f"numba_ops: x must be [P, {n_in}] for expert shape {tuple(shape)}, got {x.shape}")
        if offsets.shape != (experts.size + 1,) or offsets[0] != 0 or offsets[-1] != x.shape[0] or (np.diff(offsets) < 0).any():
            raise ValueError(f"numba_ops: offsets must rise from 0 to {x.shape[0]} in {experts.size + 1} steps")
        if experts.size and (experts.min() < 0 or experts.max() >= E):
            raise IndexError(f"numba_ops: expert ids must be in [0, {E}), got {experts.min()}..{experts.max()}")
        y = np.empty((x.shape[0], n_out), dtype=np.float32)
        if y.size and n_in == 0:
            y[:] = 0
        elif y.size:
            _experts_linear(x, flat, n_out * row_bytes, row_bytes, kind, n_in, family, experts, offsets, y)
        return y

    return experts_linear


def quant_linear(x: np.ndarray, raw: np.ndarray, ggml_type: GGMLType | int, shape: tuple[int, int]) -> np.ndarray:
    """y[t] = dequantize(raw) @ x[t] without the float32 matrix: [T, in] -> [T, out] float32.

    Batch-invariant bit for bit (row t never depends on T); within 1.1 * in * 2^-23 * (|W| @ |x|)
    of tinyspec.ops.quant_linear. Raises ValueError for unsupported types and mismatched shapes.
    """
    return bind(raw, ggml_type, shape)(np.asarray(x))


def quant_linear_q8(x: np.ndarray, raw: np.ndarray, ggml_type: GGMLType | int, shape: tuple[int, int]) -> np.ndarray:
    """y[t] = dequantize(raw) @ (x[t] rounded to Q8_K), in integer dot products: [T, in] -> [T, out] float32.

    For the K-quant types in Q8_TYPES (others raise ValueError). Batch-invariant bit for bit; within
    1.1 * in * 2^-23 * (|W| @ |x_q8|) of tinyspec.ops.quant_linear_q8.
    """
    qtype, _ = _weight_blocks(raw, ggml_type, shape)
    if qtype not in Q8_TYPES:
        raise ValueError(f"numba_ops.quant_linear_q8: ggml type {ggml_type!r} has no integer kernel "
                         f"(Q8_TYPES: {', '.join(t.name for t in Q8_TYPES)})")
    return bind(raw, ggml_type, shape, q8=True)(np.asarray(x))


def get_rows(raw: np.ndarray, ggml_type: GGMLType | int, shape: tuple[int, int], ids: np.ndarray) -> np.ndarray:
    """Rows `ids` of the [n_rows, n_cols] weight in `raw`: [n] -> [n, n_cols] float32, bit-exact with
    tinyspec.ops.get_rows (negative ids count from the end, as in NumPy)."""
    qtype, rows = _weight_blocks(raw, ggml_type, shape)
    n_rows, n_in = int(shape[0]), int(shape[1])
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    if ids.size and (ids.min() < -n_rows or ids.max() >= n_rows):
        raise IndexError(f"numba_ops: row ids must be in [-{n_rows}, {n_rows}), got {ids.min()}..{ids.max()}")
    ids = np.where(ids < 0, ids + n_rows, ids)
    out = np.zeros((ids.size, n_in), dtype=np.float32)
    if out.size:
        _get_rows_kernel(rows, qtype.row_nbytes(n_in), int(qtype), n_in, ids, out)
    return out


kernel_cache.sync(_quant_linear_q8_parallel)  # cached kernels compiled from older sources (simd.py) are dropped
