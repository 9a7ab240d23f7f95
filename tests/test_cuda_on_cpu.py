"""The CUDA-on-CPU emulation itself (tests/cuda_on_cpu.py, cuda_on_cpu.h), on small kernels written here:

1. warp collectives give CUDA's results: __shfl_sync / _up / _down / _xor (widths 32 and 8), __ballot_sync,
   __any_sync / __all_sync, against a NumPy model of each lane's read;
2. mma.sync m16n8k16 bf16 in the PTX fragment layout: D = A B + C for random bf16 A, B and float C, against
   NumPy (the products are exact, so only the final rounding of a float64 sum can differ: checked to 1 ulp);
3. __syncthreads orders shared memory between threads (a block reverses an array through __shared__), over a
   grid of several blocks in x and y, and dynamic shared memory starts as NaN bytes;
4. misuse is an error, never a hang: a barrier after a thread returned, a shuffle waiting for a returned lane,
   lanes at different collectives, a mask without the caller, a read of a lane outside the mask, a deadlock;
5. the source rewrites: inline PTX not emulated, or with an unexpected operand template, is refused;
6. the half and bfloat16 conversions: exact widening, round-to-nearest-even narrowing (ties, subnormal halves,
   overflow to inf, NaN) against NumPy's float16 and a float64 nearest-neighbour rule for bfloat16;
7. CuPy's -ftz=true on x86: a float32 product below 2^-126 is flushed to zero during a launch (ftz=True, the
   default), kept with ftz=False, and the caller's own flush bits are back as they were after the launch.
"""

import platform

import numpy as np
import pytest
from numpy.testing import assert_array_equal

import cuda_on_cpu

if cuda_on_cpu.compiler() is None:
    pytest.skip("no C++ compiler ($CXX, g++ or clang++): the CUDA kernels cannot be built for the CPU",
                allow_module_level=True)

SHUFFLES = r"""
extern "C" __global__ void shuffles(const int* __restrict__ v, int* __restrict__ out, int param) {
    const int t = threadIdx.x, lane = t & 31;
    const unsigned all = 0xffffffffu;
    int* o = out + t * 9;
    o[0] = __shfl_sync(all, v[t], param);
    o[1] = __shfl_up_sync(all, v[t], param);
    o[2] = __shfl_down_sync(all, v[t], param);
    o[3] = __shfl_xor_sync(all, v[t], param);
    o[4] = __shfl_sync(all, v[t], param, 8);
    o[5] = __shfl_up_sync(all, v[t], param, 8);
    o[6] = (int)__ballot_sync(all, v[t] & 1);
    o[7] = __any_sync(all, v[t] == param);
    o[8] = __all_sync(all, v[t] >= 0) + 2 * (lane < 16 ? __shfl_xor_sync(0x0000ffffu, v[t], 1) : 0);
}
"""


def shuffle_model(v, param):  # what each lane of each warp reads: [n, 9]
    n = v.size
    out = np.zeros((n, 9), np.int64)
    for t in range(n):
        w, lane = t // 32 * 32, t % 32
        seg = lane // 8 * 8
        out[t, 0] = v[w + param % 32]
        out[t, 1] = v[t - param] if lane >= param else v[t]
        out[t, 2] = v[t + param] if lane + param < 32 else v[t]
        out[t, 3] = v[w + (lane ^ param)] if (lane ^ param) < 32 else v[t]
        out[t, 4] = v[w + seg + param % 8]
        out[t, 5] = v[t - param] if lane - seg >= param else v[t]
        bits = v[w:w + 32] & 1
        out[t, 6] = np.int64(int((bits << np.arange(32)).sum())).astype(np.int32)
        out[t, 7] = int((v[w:w + 32] == param).any())
        out[t, 8] = int((v[w:w + 32] >= 0).all()) + 2 * (v[w + (lane ^ 1)] if lane < 16 else 0)
    return out


@pytest.mark.parametrize("param", [0, 1, 3, 16, 31])
def test_warp_shuffles_and_votes_read_the_lanes_cuda_says(rng, param):
    mod = cuda_on_cpu.compile(SHUFFLES, ["shuffles"])
    v = rng.integers(-3, 50, 64).astype(np.int32)
    out = np.zeros((64, 9), np.int32)
    mod.launch("shuffles", (1,), (64,), (v, out, np.int32(param)))
    assert_array_equal(out, shuffle_model(v, param).astype(np.int32))


MMA = r"""
typedef unsigned int u32;
__device__ __forceinline__ void mma_bf16(float* c, const u32* a, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// A [16, 16] and B [16, 8] as bf16 bits (u16), C [16, 8] float -> D [16, 8], through the fragment layout
extern "C" __global__ void mma_tile(const unsigned short* A, const unsigned short* B, const float* C, float* D) {
    const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    u32 a[4];
    for (int h = 0; h < 2; ++h) {  // a0 = row g, k 2t..2t+1; a1 = row g + 8; a2, a3: k + 8
        a[2 * h] = A[g * 16 + 2 * t + 8 * h] | ((u32)A[g * 16 + 2 * t + 8 * h + 1] << 16);
        a[2 * h + 1] = A[(g + 8) * 16 + 2 * t + 8 * h] | ((u32)A[(g + 8) * 16 + 2 * t + 8 * h + 1] << 16);
    }
    const u32 b0 = B[(2 * t) * 8 + g] | ((u32)B[(2 * t + 1) * 8 + g] << 16);
    const u32 b1 = B[(2 * t + 8) * 8 + g] | ((u32)B[(2 * t + 9) * 8 + g] << 16);
    float c[4] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1], C[(g + 8) * 8 + 2 * t], C[(g + 8) * 8 + 2 * t + 1]};
    mma_bf16(c, a, b0, b1);
    D[g * 8 + 2 * t] = c[0]; D[g * 8 + 2 * t + 1] = c[1];
    D[(g + 8) * 8 + 2 * t] = c[2]; D[(g + 8) * 8 + 2 * t + 1] = c[3];
}
"""


def test_mma_sync_is_a_b_plus_c_in_the_ptx_fragment_layout(rng):
    mod = cuda_on_cpu.compile(MMA, ["mma_tile"])
    bf16 = lambda a: (a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)  # (truncated)
    A, B = bf16(rng.standard_normal((16, 16))), bf16(rng.standard_normal((16, 8)))
    C = rng.standard_normal((16, 8)).astype(np.float32)
    D = np.zeros((16, 8), np.float32)
    mod.launch("mma_tile", (1,), (32,), (A, B, C, D))
    widen = lambda u: (u.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    want = (widen(A) @ widen(B) + C).astype(np.float32)
    assert np.abs(D.view(np.int32).astype(np.int64) - want.view(np.int32)).max() <= 1


BLOCKS = r"""
extern "C" __global__ void reverse(const float* x, float* y, float* first_dynamic) {
    __shared__ float buf[64];
    extern __shared__ float dyn[];
    const int b = blockIdx.y * gridDim.x + blockIdx.x, t = threadIdx.x;
    if (t == 0) first_dynamic[b] = dyn[0];  // never written: NaN bytes
    buf[t] = x[b * 64 + t];
    __syncthreads();
    y[b * 64 + t] = buf[63 - t] + (float)(blockIdx.x * 100 + blockIdx.y * 1000);
}
"""


def test_syncthreads_orders_shared_memory_across_a_grid(rng):
    mod = cuda_on_cpu.compile(BLOCKS, ["reverse"])
    x = rng.standard_normal((6, 64)).astype(np.float32)
    y = np.zeros_like(x)
    first = np.zeros(6, np.float32)
    mod.launch("reverse", (3, 2), (64,), (x, y, first), shared_mem=16)
    offsets = np.array([bx * 100 + by * 1000 for by in range(2) for bx in range(3)], np.float32)
    assert_array_equal(y, x[:, ::-1] + offsets[:, None])
    assert np.isnan(first).all()


MISUSE = r"""
extern "C" __global__ void misuse(int* out, int how) {
    const int t = threadIdx.x;
    if (how == 0) {  // thread 5 leaves, the others wait at a barrier
        if (t == 5) return;
        __syncthreads();
    } else if (how == 1) {  // lane 3 leaves, the others shuffle with it named in the mask
        if (t == 3) return;
        out[t] = __shfl_xor_sync(0xffffffffu, t, 1);
    } else if (how == 2) {  // half the warp at a shuffle, the other half at __syncwarp
        if (t < 16) out[t] = __shfl_sync(0xffffffffu, t, 0); else __syncwarp();
    } else if (how == 3) {  // a mask that leaves out the caller
        out[t] = __shfl_sync(t == 0 ? 0xfffffffeu : 0xffffffffu, t, 0);
    } else if (how == 4) {  // a read of lane 20, outside the mask 0xffff
        if (t < 16) out[t] = __shfl_sync(0x0000ffffu, t, 20);
    } else if (how == 5) {  // warp 0 waits at a barrier, warp 1 at a shuffle with lanes that never come
        if (t < 32) __syncthreads(); else if (t < 48) out[t] = __shfl_sync(0xffffffffu, t, 0); else __syncthreads();
    }
}
"""


@pytest.mark.parametrize("how,message", [
    (0, "barrier can never complete"), (1, "has returned|returned while lane"), (2, "different collectives"),
    (3, "does not name the calling lane"), (4, "not in the mask"), (5, "deadlock")])
def test_misuse_is_an_error_not_a_hang(how, message):
    mod = cuda_on_cpu.compile(MISUSE, ["misuse"])
    out = np.zeros(64, np.int32)
    with pytest.raises(cuda_on_cpu.KernelError, match=message):
        mod.launch("misuse", (2,), (64,), (out, np.int32(how)))
    mod.launch("misuse", (2,), (64,), (out, np.int32(9)))  # the module still launches after a refused launch


def test_unknown_inline_ptx_is_refused():
    with pytest.raises(ValueError, match="not emulated"):
        cuda_on_cpu.translate('__device__ void f(float* a) { asm("ex2.approx.f32 %0, %0;" : "+f"(a[0])); }', [])
    with pytest.raises(ValueError, match="operands"):
        cuda_on_cpu.translate('__device__ void f(float& d, unsigned h) { asm("cvt.f32.f16 %1, %0;" : "=f"(d) : '
                              '"h"(h)); }', [])


FLUSH = r"""
extern "C" __global__ void tiny(const float* a, const float* b, float* out) { out[0] = __fmul_rn(a[0], b[0]); }
"""


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64", "i686"), reason="the flush bits set are x86's MXCSR")
def test_subnormal_results_flush_to_zero_as_with_cupys_ftz():
    mod = cuda_on_cpu.compile(FLUSH, ["tiny"])
    a, b, out = np.array([2.0**-70], np.float32), np.array([2.0**-70], np.float32), np.zeros(1, np.float32)
    mod.launch("tiny", (1,), (1,), (a, b, out))
    assert out[0] == 0.0
    mod.launch("tiny", (1,), (1,), (a, b, out), ftz=False)
    assert out[0] == np.float32(2.0**-140)
    assert a[0] * b[0] == np.float32(2.0**-140)  # NumPy in this process: no flush left behind


CONVERT = r"""
extern "C" __global__ void convert(const float* f, unsigned short* h, float* h_back, unsigned short* b,
                                   float* b_back, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const __half hv = __float2half_rn(f[i]);
        const __nv_bfloat16 bv = __float2bfloat16_rn(f[i]);
        h[i] = hv.x; h_back[i] = __half2float(hv);
        b[i] = bv.x; b_back[i] = __bfloat162float(bv);
    }
}
"""


def bf16_nearest_even(f):  # float32 [n] -> uint16 [n]: the nearer of the two bf16 neighbours, a tie to the even one
    u = f.view(np.uint32)
    lo = (u & 0xFFFF0000).astype(np.uint32)
    hi = lo + np.uint32(0x10000)
    widen = lambda bits: bits.view(np.float32).astype(np.float64)
    d_lo, d_hi = np.abs(f.astype(np.float64) - widen(lo)), np.abs(widen(hi) - f.astype(np.float64))
    up = (d_hi < d_lo) | ((d_hi == d_lo) & ((lo >> 16) & 1 == 1))
    return (np.where(up, hi, lo) >> 16).astype(np.uint16)


def test_half_and_bfloat16_conversions_round_to_nearest_even(rng):
    mod = cuda_on_cpu.compile(CONVERT, ["convert"])
    ties = np.array([1 + 2.0**-11, 1 + 3 * 2.0**-11, 2.0**-25, 3 * 2.0**-25, 65504.0, 65519.0, 65520.0, 1e-8, 0.0,
                     -0.0, np.inf, -np.inf, 2.0**-24, 5e-8, 1 + 2.0**-8, 1 + 3 * 2.0**-8], np.float32)
    spread = (rng.standard_normal(4000) * np.exp2(rng.integers(-30, 20, 4000))).astype(np.float32)
    f = np.concatenate([ties, -ties, spread, [np.nan]]).astype(np.float32)
    n = f.size
    h, b = np.zeros(n, np.uint16), np.zeros(n, np.uint16)
    h_back, b_back = np.zeros(n, np.float32), np.zeros(n, np.float32)
    mod.launch("convert", (1,), (128,), (f, h, h_back, b, b_back, np.int32(n)))
    finite = np.isfinite(f)
    with np.errstate(over="ignore"):
        assert_array_equal(h[:-1], f[:-1].astype(np.float16).view(np.uint16))
    assert_array_equal(h_back[:-1], h[:-1].view(np.float16).astype(np.float32))
    assert_array_equal(b[finite], bf16_nearest_even(f[finite]))
    assert_array_equal(b[~finite][:-1], (f[~finite][:-1].view(np.uint32) >> 16).astype(np.uint16))  # +-inf
    assert_array_equal(b_back.view(np.uint32), b.astype(np.uint32) << 16)
    assert np.isnan(h_back[-1]) and np.isnan(b_back[-1])
