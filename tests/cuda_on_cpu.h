// CUDA C on the CPU: what tinyspec's RawKernel sources need to compile as C++17 with g++ or clang++ and run,
// one emulated thread block at a time (tests/cuda_on_cpu.py compiles and launches; read its docstring first).
//
// Emulated:
//   threads     each CUDA thread of a block is a fiber (ucontext, its own 256 KiB stack with a guard page) on the
//               one OS thread of the launch; the blocks of the grid run one after the other, x fastest. A fiber runs
//               until it reaches a barrier or a warp collective, or returns.
//   __syncthreads  a barrier: released when every thread of the block has arrived. A thread that has returned
//               while others wait at one (or before one another reaches) is an error, not a hang: CUDA asks that
//               every thread of the block reach each __syncthreads.
//   warps       32 consecutive threads (x fastest). __shfl_sync / _up / _down / _xor, __ballot_sync, __any_sync,
//               __all_sync, __syncwarp and mma.sync are warp collectives: each lane leaves its value, waits until
//               every lane of the mask has arrived at the same collective, and the last to arrive computes all
//               the results. Errors: a mask without the calling lane, a mask naming a lane that has returned or
//               does not exist, lanes of one mask at different collectives, a shuffle reading a lane outside the
//               mask, and a deadlock (every live thread waits and nothing can release them).
//   __shared__  `static`: one block runs at a time, so a function's static is its block's shared memory. extern
//               __shared__ (dynamic) is rewritten by the Python side into a pointer to a per-launch buffer that
//               is filled with NaN bytes (0xFF) before each block, so reading what no thread wrote shows.
//   intrinsics  the _rn float operations (plain C++ operations: no -ffast-math, -ffp-contract=off, so nothing
//               fuses into an FMA unless written fmaf), fmaf and __fmaf_rn (C's fmaf: one rounding, as CUDA's),
//               bit casts, __byte_perm, __popc, __ffs, __ldg, vector types, int min/max; __half and
//               __nv_bfloat16 with their exact widening and round-to-nearest-even narrowing.
//   inline PTX  the asm statements the Python side recognises become calls into namespace ptx below:
//               mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (a warp collective in the PTX fragment layout),
//               fma.rn.bf16x2 and cvt.f32.f16.
//   subnormals  CuPy compiles with -ftz=true: float32 operations flush subnormal inputs and results to zero. On
//               x86 the launch sets MXCSR's FTZ and DAZ bits for its duration (ftz=1, the default), which flush
//               float32 and float64 alike (the GPU's flag touches float32 only; the kernels' float64 is exp's
//               argument and result, far from subnormal). Other CPUs keep subnormals (the docstring says so).
// NOT emulated: any memory model beyond the barriers (no races are detected; one block's threads interleave only
// at barriers and collectives, so a racy kernel may pass here), atomics, bounds checks (an out-of-bounds access
// is undefined here as on a GPU), the GPU's expf/exp (C's, which differ from CUDA's by an ulp at times), the
// tensor core's internal accumulation (here the 16 exact products and c are summed in double and rounded once;
// PTX leaves the order and the intermediate precision unspecified), warp-synchronous code without _sync.
#pragma once

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

// ------------------------------------------------------------------ CUDA keywords and types

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __shared__ static
#define __align__(n) alignas(n)

struct uint3 { unsigned x, y, z; };
struct dim3 { unsigned x, y, z; };
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
struct int2 { int x, y; };
struct int4 { int x, y, z, w; };
struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline int2 make_int2(int x, int y) { return {x, y}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

// ------------------------------------------------------------------ arithmetic intrinsics

template <class To, class From> inline To bit_cast_(From v) { To t; memcpy(&t, &v, sizeof t); return t; }
inline float __int_as_float(int v) { return bit_cast_<float>(v); }
inline float __uint_as_float(unsigned v) { return bit_cast_<float>(v); }
inline int __float_as_int(float v) { return bit_cast_<int>(v); }
inline unsigned __float_as_uint(float v) { return bit_cast_<unsigned>(v); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __expf(float a) { return expf(a); }
inline float rsqrtf(float a) { return 1.0f / sqrtf(a); }
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __ffs(int v) { return __builtin_ffs(v); }
inline int __clz(int v) { return v ? __builtin_clz((unsigned)v) : 32; }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned umin(unsigned a, unsigned b) { return a < b ? a : b; }
template <class T> inline T __ldg(const T* p) { return *p; }

inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    // byte i of the result is byte (s >> 4i) & 7 of the 8 bytes y:x (x the low four); bit 3 of the selector
    // replicates that byte's sign bit instead (PTX prmt's default mode)
    const uint64_t v = ((uint64_t)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) {
        const unsigned sel = (s >> (4 * i)) & 15u;
        unsigned b = (unsigned)(v >> (8 * (sel & 7u))) & 0xFFu;
        if (sel & 8u) b = (b & 0x80u) ? 0xFFu : 0u;
        r |= b << (8 * i);
    }
    return r;
}

// ------------------------------------------------------------------ half and bfloat16 (cuda_fp16.h, cuda_bf16.h)

struct __half { unsigned short x; };
struct __nv_bfloat16 { unsigned short x; };

inline float __half2float(__half h) {  // exact
    const unsigned sign = (h.x & 0x8000u) << 16, e = (h.x >> 10) & 31u, m = h.x & 1023u;
    if (e == 0) { const float v = (float)m * 5.9604644775390625e-08f; return sign ? -v : v; }  // m * 2^-24
    if (e == 31) return __uint_as_float(sign | 0x7F800000u | (m << 13));
    return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}

inline __half __float2half_rn(float f) {  // round to nearest even; overflow to inf, NaN stays NaN
    const unsigned u = __float_as_uint(f), sign = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
    if (a >= 0x7F800000u) return {(unsigned short)(sign | (a > 0x7F800000u ? 0x7E00u : 0x7C00u))};
    if (a >= 0x477FF000u) return {(unsigned short)(sign | 0x7C00u)};  // >= 65520 rounds past 65504
    unsigned r, rem, half;
    if (a < 0x38800000u) {  // below 2^-14: a subnormal half, in units of 2^-24
        const int e = (int)(a >> 23);
        if (e < 102) return {(unsigned short)sign};  // below 2^-25: rounds to 0
        const int shift = 126 - e;
        const unsigned m = (a & 0x7FFFFFu) | 0x800000u;
        r = m >> shift; rem = m & ((1u << shift) - 1u); half = 1u << (shift - 1);
    } else {  // rebias the exponent 127 -> 15 and drop 13 bits (a carry rounds into the exponent)
        const unsigned v = a - 0x38000000u;
        r = v >> 13; rem = v & 0x1FFFu; half = 0x1000u;
    }
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return {(unsigned short)(sign | r)};
}

inline float __bfloat162float(__nv_bfloat16 b) { return __uint_as_float((unsigned)b.x << 16); }

inline __nv_bfloat16 __float2bfloat16_rn(float f) {  // round to nearest even, NaN stays NaN
    const unsigned u = __float_as_uint(f);
    if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x7FFFFFu)) return {(unsigned short)((u >> 16) | 0x40u)};
    return {(unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16)};
}

// ------------------------------------------------------------------ the fibers

namespace cuda_on_cpu {

enum Wait { RUNNABLE, AT_BARRIER, AT_WARP, RETURNED };
enum Op { SYNCWARP, SHFL, SHFL_UP, SHFL_DOWN, SHFL_XOR, BALLOT, ANY, ALL, MMA };
static const char* const OP_NAMES[] = {"__syncwarp", "__shfl_sync", "__shfl_up_sync", "__shfl_down_sync",
                                       "__shfl_xor_sync", "__ballot_sync", "__any_sync", "__all_sync", "mma.sync"};

struct Context {
    ucontext_t start;  // where the thread starts: its own stack, thread_main
    jmp_buf resume;    // where it waits (at a barrier or a collective), once started
};

struct Thread {  // (small: a collective and the scheduler walk these; the contexts, 1 KB each, live apart)
    Context* cx;
    bool started;
    char* stack;
    uint3 idx;
    int linear, lane, warp;
    Wait wait;
    // what a lane left at a warp collective, and what it gets back
    Op op;
    unsigned mask;
    uint64_t value;   // the lane's value (a shuffle's bits, a predicate)
    int param, width; // source lane / delta / xor mask, and the shuffle's width
    void* data;       // mma: the lane's fragments (struct MmaLane)
    uint64_t result;
};

struct Launch {
    std::vector<Thread> threads;
    std::vector<Context> contexts;
    ucontext_t start;  // a context to copy for each thread's start (getcontext once per launch)
    jmp_buf scheduler;
    char* stacks = nullptr;
    size_t stack_bytes = 0, map_bytes = 0;
    int n = 0, at_barrier = 0, returned = 0;
    bool failed = false;
    std::string error;
    void (*body)(void*) = nullptr;  // runs the kernel on the launch's arguments
    void* body_arg = nullptr;
    std::vector<unsigned> at_warp, gone;  // per warp: lanes waiting at a collective, lanes that returned
    std::vector<unsigned char> dynamic_shared;
    uint3 block_idx;
    dim3 block_dim, grid_dim;
    Thread* current = nullptr;
};

static thread_local Launch* g_launch __attribute__((tls_model("initial-exec"))) = nullptr;

[[noreturn]] inline void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline void fail(const char* fmt, ...) {
    // the launch is abandoned: its fibers are never resumed, the scheduler returns the message
    char buf[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    Launch& L = *g_launch;
    const uint3 b = L.block_idx;
    char where[120];
    snprintf(where, sizeof where, "block (%u, %u, %u) thread %d: ", b.x, b.y, b.z, L.current ? L.current->linear : -1);
    L.error = std::string(where) + buf;
    L.failed = true;
    _longjmp(L.scheduler, 1);  // never resumed
}

// Switching: a thread's first entry is setcontext onto its stack; every later switch either way is _setjmp /
// _longjmp, which save and restore registers only (swapcontext would also save the signal mask: a system call
// at each switch, and a launch switches millions of times).
inline void yield() {  // back to the scheduler until a barrier or a collective releases this thread
    Launch& L = *g_launch;
    if (!_setjmp(L.current->cx->resume)) _longjmp(L.scheduler, 1);
}

__attribute__((noinline)) inline void resume(Launch& L, Thread& t) {  // run t until it waits or returns
    L.current = &t;
    if (!_setjmp(L.scheduler)) {
        if (t.started) _longjmp(t.cx->resume, 1);
        t.started = true;
        setcontext(&t.cx->start);
    }
}

inline void syncthreads() {
    Launch& L = *g_launch;
    if (L.returned)
        fail("__syncthreads after %d thread(s) of the block returned: the barrier can never complete", L.returned);
    L.current->wait = AT_BARRIER;
    if (++L.at_barrier == L.n) {  // the last to arrive releases everyone, itself included
        for (Thread& t : L.threads) t.wait = RUNNABLE;
        L.at_barrier = 0;
        return;
    }
    yield();
}

struct MmaLane { float* c[4]; unsigned a[4], b[2]; };

inline float bf16_lo(unsigned v) { return __uint_as_float(v << 16); }
inline float bf16_hi(unsigned v) { return __uint_as_float(v & 0xFFFF0000u); }

inline void complete_mma(Thread* lanes) {
    // D = A B + C, m16n8k16, A row-major bf16 [16, 16], B column-major bf16 [16, 8], C and D float32 [16, 8];
    // lane = 4 g + t holds A rows g, g + 8 (a0: row g k 2t..2t+1, a1: row g + 8, a2/a3: the same at k + 8),
    // B column g (b0: k 2t..2t+1, b1: k 2t+8..2t+9) and C/D row g (c0, c1: columns 2t, 2t+1) and g + 8 (c2, c3)
    float A[16][16], B[16][8], C[16][8];
    for (int lane = 0; lane < 32; ++lane) {
        const MmaLane& f = *(const MmaLane*)lanes[lane].data;
        const int g = lane >> 2, t = lane & 3;
        for (int h = 0; h < 2; ++h) {  // h: k offset 0 or 8
            A[g][2 * t + 8 * h] = bf16_lo(f.a[2 * h]);      A[g][2 * t + 8 * h + 1] = bf16_hi(f.a[2 * h]);
            A[g + 8][2 * t + 8 * h] = bf16_lo(f.a[2 * h + 1]); A[g + 8][2 * t + 8 * h + 1] = bf16_hi(f.a[2 * h + 1]);
            B[2 * t + 8 * h][g] = bf16_lo(f.b[h]);           B[2 * t + 8 * h + 1][g] = bf16_hi(f.b[h]);
        }
        C[g][2 * t] = *f.c[0]; C[g][2 * t + 1] = *f.c[1]; C[g + 8][2 * t] = *f.c[2]; C[g + 8][2 * t + 1] = *f.c[3];
    }
    for (int lane = 0; lane < 32; ++lane) {
        const MmaLane& f = *(const MmaLane*)lanes[lane].data;
        const int g = lane >> 2, t = lane & 3;
        for (int i = 0; i < 4; ++i) {
            const int r = g + 8 * (i >> 1), c = 2 * t + (i & 1);
            double s = C[r][c];  // bf16 x bf16 products are exact in double; one rounding to float at the end
            for (int k = 0; k < 16; ++k) s += (double)A[r][k] * (double)B[k][c];
            *f.c[i] = (float)s;
        }
    }
}

// A warp collective: this lane arrives with (op, mask, value, param, width, data); the last lane of the mask to
// arrive computes every lane's result. Returns this lane's result.
inline uint64_t collective(Op op, unsigned mask, uint64_t value, int param = 0, int width = 32, void* data = nullptr) {
    Launch& L = *g_launch;
    Thread& me = *L.current;
    const unsigned bit = 1u << me.lane;
    if (!(mask & bit)) fail("%s with mask 0x%08x, which does not name the calling lane %d", OP_NAMES[op], mask, me.lane);
    if (op == MMA && mask != 0xffffffffu) fail("mma.sync needs the whole warp, got mask 0x%08x", mask);
    if (width < 1 || width > 32 || (width & (width - 1))) fail("%s with width %d", OP_NAMES[op], width);
    me.op = op; me.mask = mask; me.value = value; me.param = param; me.width = width; me.data = data;
    me.wait = AT_WARP;
    Thread* lanes = &L.threads[(size_t)me.warp * 32];
    const int n_lanes = L.n - me.warp * 32 < 32 ? L.n - me.warp * 32 : 32;
    const unsigned exists = n_lanes == 32 ? 0xffffffffu : (1u << n_lanes) - 1u;
    if (mask & ~exists)
        fail("%s with mask 0x%08x names lane %d, which does not exist (%d threads in the block)", OP_NAMES[op], mask,
             __builtin_ctz(mask & ~exists), L.n);
    if (mask & L.gone[me.warp])
        fail("%s with mask 0x%08x waits for lane %d, which has returned", OP_NAMES[op], mask,
             __builtin_ctz(mask & L.gone[me.warp]));
    unsigned& waiting = L.at_warp[me.warp];  // the warp's lanes that wait at a collective
    waiting |= bit;
    if ((waiting & mask) == mask) {  // the last lane of the mask: check all are at this one, then complete it
        for (int l = 0; l < 32; ++l)
            if ((mask >> l & 1u) && (lanes[l].op != op || lanes[l].mask != mask))
                fail("lanes of warp %d meet at different collectives: lane %d at %s mask 0x%08x, lane %d at %s mask "
                     "0x%08x", me.warp, me.lane, OP_NAMES[op], mask, l, OP_NAMES[lanes[l].op], lanes[l].mask);
        waiting &= ~mask;
        if (op == MMA) complete_mma(lanes);
        uint64_t ballot = 0;
        for (int l = 0; l < 32; ++l)
            if ((mask >> l & 1u) && lanes[l].value) ballot |= 1u << l;
        for (int l = 0; l < 32; ++l) {
            if (!(mask >> l & 1u)) continue;
            Thread& t = lanes[l];
            const int w = t.width, base = l & ~(w - 1);
            int src = l;
            switch (op) {
                case SHFL: src = base + (t.param & (w - 1)); break;
                case SHFL_UP: src = (l - base) >= t.param ? l - t.param : l; break;
                case SHFL_DOWN: src = (l - base) + t.param < w ? l + t.param : l; break;
                case SHFL_XOR: src = l ^ t.param; if (src < base || src >= base + w) src = l; break;
                default: break;
            }
            if (src < 0 || src > 31 || !(mask >> src & 1u))
                fail("%s: lane %d reads lane %d, which is not in the mask 0x%08x", OP_NAMES[op], l, src, mask);
            if (op == BALLOT) t.result = ballot;
            else if (op == ANY) t.result = ballot != 0;
            else if (op == ALL) t.result = ballot == (uint64_t)mask;
            else t.result = lanes[src].value;
            t.wait = RUNNABLE;
        }
        return me.result;
    }
    yield();
    return me.result;
}

template <class T> inline uint64_t bits_of(T v) {
    static_assert(sizeof(T) <= 8, "a shuffled value is at most 8 bytes");
    uint64_t b = 0; memcpy(&b, &v, sizeof v); return b;
}
template <class T> inline T of_bits(uint64_t b) { T v; memcpy(&v, &b, sizeof v); return v; }

inline void thread_main() {  // one thread's life: the kernel once per block, the same fiber for every block
    Launch& L = *g_launch;
    for (;;) {
        L.body(L.body_arg);
        Thread& me = *L.current;
        me.wait = RETURNED;
        ++L.returned;
        L.gone[me.warp] |= 1u << me.lane;
        if (L.at_barrier)
            fail("returned while %d thread(s) of the block wait at __syncthreads: the barrier can never complete",
                 L.at_barrier);
        Thread* lanes = &L.threads[(size_t)me.warp * 32];
        for (int l = 0; l < 32 && me.warp * 32 + l < L.n; ++l)
            if (lanes[l].wait == AT_WARP && (lanes[l].mask >> me.lane & 1u))
                fail("returned while lane %d waits for it at %s (mask 0x%08x)", l, OP_NAMES[lanes[l].op], lanes[l].mask);
        if (!_setjmp(me.cx->resume)) _longjmp(L.scheduler, 1);  // resumed here as the same thread of the next block
    }
}

inline std::string describe(const Launch& L) {  // who waits where, for a deadlock's message (first few)
    std::string s;
    int shown = 0;
    for (const Thread& t : L.threads) {
        if (t.wait == RETURNED || shown == 6) continue;
        char buf[120];
        if (t.wait == AT_BARRIER) snprintf(buf, sizeof buf, "; thread %d at __syncthreads", t.linear);
        else snprintf(buf, sizeof buf, "; thread %d at %s mask 0x%08x", t.linear, OP_NAMES[t.op], t.mask);
        s += buf;
        ++shown;
    }
    return s;
}

// Runs one launch: every block of the grid, one at a time. 0 on success, else 1 with the message in err.
inline int run(void (*body)(void*), void* arg, const unsigned* dims, size_t shared_bytes, int ftz, char* err,
               int err_len) {
    Launch L;
    L.body = body; L.body_arg = arg;
    L.grid_dim = {dims[0], dims[1], dims[2]};
    L.block_dim = {dims[3], dims[4], dims[5]};
    L.n = (int)(dims[3] * dims[4] * dims[5]);
    L.dynamic_shared.resize(shared_bytes ? shared_bytes : 1);
    L.threads.resize(L.n);
    L.contexts.resize(L.n);
    const size_t page = 4096;
    L.stack_bytes = 256 * 1024;
    L.map_bytes = (size_t)L.n * (L.stack_bytes + page);
    void* map = mmap(nullptr, L.map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (map == MAP_FAILED) { snprintf(err, err_len, "cuda_on_cpu: mmap of the fiber stacks failed"); return 1; }
    L.stacks = (char*)map;
    for (int i = 0; i < L.n; ++i) mprotect(L.stacks + i * (L.stack_bytes + page), page, PROT_NONE);  // guard pages
#if defined(__x86_64__) || defined(__i386__)
    const unsigned csr = _mm_getcsr();
    if (ftz) _mm_setcsr(csr | 0x8040u);  // FTZ (bit 15) and DAZ (bit 6)
#endif
    getcontext(&L.start);
    Launch* saved = g_launch;
    g_launch = &L;
    for (unsigned bz = 0; bz < L.grid_dim.z && !L.failed; ++bz)
        for (unsigned by = 0; by < L.grid_dim.y && !L.failed; ++by)
            for (unsigned bx = 0; bx < L.grid_dim.x && !L.failed; ++bx) {
                L.block_idx = {bx, by, bz};
                L.at_barrier = L.returned = 0;
                L.at_warp.assign((L.n + 31) / 32, 0u);
                L.gone.assign((L.n + 31) / 32, 0u);
                memset(L.dynamic_shared.data(), 0xFF, L.dynamic_shared.size());
                for (int i = 0; i < L.n; ++i) {
                    Thread& t = L.threads[i];
                    t.wait = RUNNABLE;
                    if (bx || by || bz) continue;  // the fibers of the first block run every later block
                    t.linear = i; t.lane = i & 31; t.warp = i >> 5;
                    t.idx = {i % L.block_dim.x, (i / L.block_dim.x) % L.block_dim.y, i / (L.block_dim.x * L.block_dim.y)};
                    t.stack = L.stacks + i * (L.stack_bytes + page) + page;
                    t.started = false;
                    t.cx = &L.contexts[i];
                    t.cx->start = L.start;
                    t.cx->start.uc_stack.ss_sp = t.stack;
                    t.cx->start.uc_stack.ss_size = L.stack_bytes;
                    t.cx->start.uc_link = nullptr;
                    makecontext(&t.cx->start, thread_main, 0);
                }
                while (!L.failed && L.returned < L.n) {
                    bool ran = false;
                    for (int i = 0; i < L.n && !L.failed; ++i) {
                        Thread& t = L.threads[i];
                        if (t.wait != RUNNABLE) continue;
                        ran = true;
                        resume(L, t);
                    }
                    if (!ran && !L.failed) {
                        char buf[100];
                        snprintf(buf, sizeof buf, "block (%u, %u, %u): deadlock, every live thread waits", bx, by, bz);
                        L.error = std::string(buf) + describe(L);
                        L.failed = true;
                    }
                }
            }
    g_launch = saved;
#if defined(__x86_64__) || defined(__i386__)
    _mm_setcsr(csr);
#endif
    munmap(map, L.map_bytes);
    if (L.failed) { snprintf(err, err_len, "%s", L.error.c_str()); return 1; }
    return 0;
}

// The launcher of one kernel: its arguments arrive as an array of pointers to each argument's value.
template <class... A, size_t... I>
inline void call_with(void (*kernel)(A...), void** args, std::index_sequence<I...>) {
    kernel(*static_cast<std::remove_cv_t<std::remove_reference_t<A>>*>(args[I])...);
}

template <class... A>
inline int launch(void (*kernel)(A...), const unsigned* dims, void** args, size_t shared_bytes, int ftz, char* err,
                  int err_len) {
    struct Call { void (*kernel)(A...); void** args; };
    Call call{kernel, args};
    auto body = [](void* p) {
        Call& c = *(Call*)p;
        call_with(c.kernel, c.args, std::index_sequence_for<A...>{});
    };
    return run(body, &call, dims, shared_bytes, ftz, err, err_len);
}

inline void* dynamic_shared() { return g_launch->dynamic_shared.data(); }

}  // namespace cuda_on_cpu

#define threadIdx (cuda_on_cpu::g_launch->current->idx)
#define blockIdx (cuda_on_cpu::g_launch->block_idx)
#define blockDim (cuda_on_cpu::g_launch->block_dim)
#define gridDim (cuda_on_cpu::g_launch->grid_dim)
#define warpSize 32

inline void __syncthreads() { cuda_on_cpu::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { cuda_on_cpu::collective(cuda_on_cpu::SYNCWARP, mask, 0); }
template <class T> inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    return cuda_on_cpu::of_bits<T>(cuda_on_cpu::collective(cuda_on_cpu::SHFL, mask, cuda_on_cpu::bits_of(v), src, width));
}
template <class T> inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return cuda_on_cpu::of_bits<T>(cuda_on_cpu::collective(cuda_on_cpu::SHFL_UP, mask, cuda_on_cpu::bits_of(v), (int)delta, width));
}
template <class T> inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return cuda_on_cpu::of_bits<T>(cuda_on_cpu::collective(cuda_on_cpu::SHFL_DOWN, mask, cuda_on_cpu::bits_of(v), (int)delta, width));
}
template <class T> inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    return cuda_on_cpu::of_bits<T>(cuda_on_cpu::collective(cuda_on_cpu::SHFL_XOR, mask, cuda_on_cpu::bits_of(v), lane_mask, width));
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
    return (unsigned)cuda_on_cpu::collective(cuda_on_cpu::BALLOT, mask, pred != 0);
}
inline int __any_sync(unsigned mask, int pred) { return (int)cuda_on_cpu::collective(cuda_on_cpu::ANY, mask, pred != 0); }
inline int __all_sync(unsigned mask, int pred) { return (int)cuda_on_cpu::collective(cuda_on_cpu::ALL, mask, pred != 0); }

// ------------------------------------------------------------------ inline PTX (the statements tests/cuda_on_cpu.py
// rewrites: outputs first, then inputs, as the asm statement lists them)

namespace ptx {

inline void mma_sync_aligned_m16n8k16_row_col_f32_bf16_bf16_f32(float& d0, float& d1, float& d2, float& d3,
                                                                  unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                                                  unsigned b0, unsigned b1) {
    cuda_on_cpu::MmaLane f{{&d0, &d1, &d2, &d3}, {a0, a1, a2, a3}, {b0, b1}};
    cuda_on_cpu::collective(cuda_on_cpu::MMA, 0xffffffffu, 0, 0, 32, &f);
}

inline unsigned bf16_rn(float f) {  // float -> bf16 bits, round to nearest even (NaN kept quiet)
    const unsigned u = __float_as_uint(f);
    if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x7FFFFFu)) return (u >> 16) | 0x40u;
    return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}

inline void fma_rn_bf16x2(unsigned& d, unsigned a, unsigned b, unsigned c) {
    // per half: bf16(a * b + c). fmaf rounds once to float32, then to bf16: a second rounding that can differ from
    // the hardware's single one only when the float32 result is a bf16 tie (never for the kernel's small integers)
    const unsigned lo = bf16_rn(fmaf(cuda_on_cpu::bf16_lo(a), cuda_on_cpu::bf16_lo(b), cuda_on_cpu::bf16_lo(c)));
    const unsigned hi = bf16_rn(fmaf(cuda_on_cpu::bf16_hi(a), cuda_on_cpu::bf16_hi(b), cuda_on_cpu::bf16_hi(c)));
    d = (hi << 16) | (lo & 0xFFFFu);
}

inline void cvt_f32_f16(float& f, unsigned short h) {  // binary16 -> binary32, exact
    const unsigned sign = (h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 1023u;
    if (e == 0) f = __uint_as_float(sign) + (sign ? -1.0f : 1.0f) * (float)m * 5.9604644775390625e-08f;
    else if (e == 31) f = __uint_as_float(sign | 0x7F800000u | (m << 13));
    else f = __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}

}  // namespace ptx
