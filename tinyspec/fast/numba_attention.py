"""Numba causal attention over the KV cache: tinyspec.attention.attend's contract, one loop nest, no temporaries.

    attend(q [T, H_kv, G, d], keys [>= n_past + T, H_kv, d], values [same], n_past, scale) -> o [T, H_kv, G, d]
    attend_paged(q, k_pool [n_blocks, block_size, H_kv, d], v_pool [same], table, n_past, scale) -> o   (paged cache)
    attend_paged_ragged(q [R, H_kv, G, d], k_pool, v_pool, tables, n_pasts, bounds [B+1], scale) -> o   (B sequences)

The oracle (tinyspec/attention.py attend) makes, per query row, two transposed copies of the visible
keys and values and five NumPy calls (two matmuls, a softmax of three reductions): ~10 small calls per
row and layer, whose overhead, not the arithmetic, was nearly all of attention's share of a verify pass at
the 0.8B shape (6 attention layers; LESSONS 7, docs/performance-log.md old 28). Here each (row t, kv head h)
is one pass over the n = n_past + t + 1 keys it may see, reading the cache in place, each key row once for
the G query heads that share it. Per query head:

    s_j = scale * (q . k_j)                 d = 256 (every Qwen3.5 size): the 256 products summed by a fixed
                                            tree in registers (simd.dot256); other d: 16 at a time (dot16)
    p_j = exp(s_j - max s) / sum_j exp(s_j - max s)      sums in key order j = 0, 1, ..
    o   = sum_j p_j v_j                     in key order, one fma per element and key (simd.axpy256 / axpy16)

Batch invariance by construction: row t's numbers depend only on q[t] and the first n keys, with the
same operations in the same order whatever T is, so a verify pass's row equals the one-token pass at
that position bit for bit (tests/test_numba_attention.py). Against the oracle (BLAS matmuls, whose
summation order is the library's) it agrees to float32 rounding, not bitwise, like the linear kernels.
No fast-math: LLVM may not reorder the sums, so the vector work is written as simd.py intrinsics.

Threads by size: the (t, h) pairs are independent, each the same operations on any thread. From SERIAL_BELOW
multiply-adds (query rows x kv heads x G x d x the keys each row sees) up they are shared by the threads (prange);
below it, as for a decode token over a short context, one after another on the calling thread: a parallel region
wakes sleeping workers (fast/threads.py), which costs more than that work. Both loops are one compiled kernel
with no other parallel loop (numba_gdn.PRANGE_ONLY); tests/test_numba_serial.py checks they give the same bits.

Paged cache (attend_paged, tinyspec.attention.attend_paged's contract): the keys and values of one layer live
in a pool of fixed-size blocks shared by many sequences, k_pool [n_blocks, block_size, H_kv, d]; a sequence's
block table lists its blocks in position order, so its position j is row j % block_size of block
table[j // block_size]. To this kernel a table is only that address map: the one kernel, _attend, resolves it
once per call to a pool row per position, table[j // block_size] * block_size + j % block_size, and reads key
and value j there, in place (no gather copy); `attend` is the case of one block holding the whole cache
(table [0], block_size = its capacity, row j = j). Which row is read is integer arithmetic; the float
operations (which keys, in which order, summed how) are the same whatever the table, so attend_paged's output
is bit for bit attend's over the gathered keys (k_pool[table[:ceil(n / block_size)]] flattened), and
batch-invariant the same way. The table is checked (length, block ids in range) before the kernel runs, which
itself does no bounds checks.

Many sequences in one pool (attend_paged_ragged, the batch engine's verify pass): their query rows packed in
one q, sequence b's rows bounds[b] .. bounds[b+1]-1, each with its own table and n_past. The one kernel takes
them all: a row finds its sequence, sees that sequence's keys only, and does the arithmetic it does alone, so
each row is bit for bit its one-sequence call's; the threads share (row, kv head) pairs of every sequence, so
one call replaces B calls (each paying its dispatch and its parallel region, for a few rows of work).
attend_paged is the case of one sequence, attend of one sequence in one block. The wrapper checks the tables on
Python ints (each table's used ids as a list) and hands each sequence's n_past and block ids to the kernel as one
int64 array: per call a few microseconds, where NumPy calls on these tiny arrays cost several times the kernel.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from . import kernel_cache, simd
from .numba_gdn import PRANGE_ONLY

# kv heads x G x d x the keys each query row sees, summed over the rows (the multiply-adds of q . k), below this,
# or a single (row, kv head) pair: attention on the calling thread, no parallel region. Measured, kernel only, on
# the 2-core Xeon VM (OMP_WAIT_POLICY=PASSIVE), quiet, calling thread / threaded: a tiny-model token over 40
# positions (12800) 3.6 / 8.9 us, a 4-token verify 12.8 / 18.7 us; about even near 2^17; threads ahead from
# ~2e5 (1 row over 101 positions of 2 x 4 x 256: 24.6 / 21.2 us).
SERIAL_BELOW = 1 << 17


@njit(cache=True, inline="always", error_model="numpy", boundscheck=False)
def _attend_pair(item, qf, kf, vf, of, H_kv, G, d, seq, rows, seqs, bounds, scale):
    # One (row r, kv head h) pair, item = r * H_kv + h: the G query heads of head h over the keys row r sees. It
    # writes only o[r, h], so pairs run in any order, on any thread, with the same bits. qf, kf, vf, of: q,
    # k_pool, v_pool, o flat; seq [R]: each row's sequence; rows [B, n]: pool row of each sequence's position.
    d16 = d - d % 16
    r, h = item // H_kv, item % H_kv
    b = seq[r]
    n = seqs[b, 0] + (r - bounds[b]) + 1  # keys visible to this row (causal, its own sequence's only)
    p = np.empty((G, n), np.float32)  # scores, then exponentials, of the G query heads sharing head h
    q0 = (r * H_kv + h) * G * d  # q[r, h, 0] and o[r, h, 0] in qf, of
    for j in range(n):
        ko = (rows[b, j] * H_kv + h) * d  # key j of kv head h in kf (its value: the same offset in vf)
        for g in range(G):  # the key row is read once for the G query heads (no store in between)
            if d == 256:  # Qwen3.5's head size: the whole row in registers
                s = simd.dot256(qf, q0 + g * d, kf, ko)
            else:  # 16 elements at a time, the chunks summed in order, then the tail
                s = np.float32(0)
                for c in range(0, d16, 16):
                    s += simd.dot16(qf, q0 + g * d + c, kf, ko + c)
                for c in range(d16, d):
                    s += qf[q0 + g * d + c] * kf[ko + c]
            p[g, j] = s * scale
    for g in range(G):
        top = np.float32(-np.inf)
        for j in range(n):
            top = max(top, p[g, j])
        total = np.float32(0)
        for j in range(n):
            e = np.exp(p[g, j] - top)
            p[g, j] = e
            total += e
        qo = q0 + g * d
        of[qo:qo + d] = np.float32(0)
        for j in range(n):
            w = np.float32(p[g, j] / total)
            vo = (rows[b, j] * H_kv + h) * d
            if d == 256:
                simd.axpy256(of, qo, w, vf, vo)
            else:
                for c in range(0, d16, 16):
                    simd.axpy16(of, qo + c, w, vf, vo + c)
                for c in range(d16, d):
                    of[qo + c] = np.float32(w * vf[vo + c] + of[qo + c])


@njit(cache=True, parallel=PRANGE_ONLY, error_model="numpy", boundscheck=False)
def _attend(q, k_pool, v_pool, seqs, bounds, scale, o, threaded):  # see the module docstring; o is written
    # q [R, H_kv, G, d]; sequence b: rows bounds[b] .. bounds[b+1]-1, seqs[b] = (n_past, its block ids...);
    # scale: the float32 scale as a Python float (exact), rounded here as NumPy would. threaded: the (row, kv head)
    # pairs shared by the threads (prange), else one after another on the calling thread (no parallel region)
    R, H_kv, G, d = q.shape
    B = bounds.shape[0] - 1
    bs = k_pool.shape[1]  # block size: position j is row j % bs of block table[j // bs]
    scale = np.float32(scale)
    qf, kf, vf, of = q.reshape(-1), k_pool.reshape(-1), v_pool.reshape(-1), o.reshape(-1)
    seq = np.empty(R, np.int64)  # the sequence of each query row
    n_keys = 0  # the most positions any sequence holds after its rows
    for b in range(B):
        seq[bounds[b]:bounds[b + 1]] = b
        n_keys = max(n_keys, seqs[b, 0] + bounds[b + 1] - bounds[b])
    rows = np.empty((B, n_keys), np.int64)  # the tables resolved once: sequence b's position j is pool row rows[b, j]
    for b in range(B):
        for j in range(seqs[b, 0] + bounds[b + 1] - bounds[b]):
            rows[b, j] = seqs[b, 1 + j // bs] * bs + j % bs
    if threaded:
        for item in prange(R * H_kv):
            _attend_pair(item, qf, kf, vf, of, H_kv, G, d, seq, rows, seqs, bounds, scale)
    else:
        for item in range(R * H_kv):
            _attend_pair(item, qf, kf, vf, of, H_kv, G, d, seq, rows, seqs, bounds, scale)


def _work(T: int, n_past: int) -> int:  # keys seen by T rows after n_past positions: n_past + 1, ..., n_past + T
    return T * n_past + T * (T + 1) // 2


@njit(cache=True, error_model="numpy", boundscheck=False)
def _attend_serial(q, k_pool, v_pool, seqs, bounds, scale, o):
    # _attend's loop on the calling thread, entered through a kernel of its own so that a profiler
    # (fast/step_profile.py) tells a call that opens no parallel region from one that does
    _attend(q, k_pool, v_pool, seqs, bounds, scale, o, False)


def _attend_any(q, k_pool, v_pool, seqs, bounds, scale, o, threaded):
    if threaded:
        _attend(q, k_pool, v_pool, seqs, bounds, scale, o, True)
    else:
        _attend_serial(q, k_pool, v_pool, seqs, bounds, scale, o)


def attend(q, keys, values, n_past, scale):
    """tinyspec.attention.attend on the cpu backend (float32 arrays; keys/values: the cache's, unsliced)."""
    q = np.ascontiguousarray(q, dtype=np.float32)
    T, H_kv, G, d = q.shape
    if keys.shape[0] < n_past + T or keys.shape[1:] != (H_kv, d) or values.shape != keys.shape:
        raise ValueError(f"keys/values {keys.shape}/{values.shape} do not hold {n_past + T} positions of {(H_kv, d)}")
    keys = np.ascontiguousarray(keys, dtype=np.float32)
    values = np.ascontiguousarray(values, dtype=np.float32)
    o = np.empty_like(q)
    # the whole cache as one block: table [0], block size = its capacity, so key j is row j
    _attend_any(q, keys[None], values[None], np.array([[n_past, 0]], np.int64), np.array([0, T], np.int64),
            float(scale), o, T * H_kv > 1 and H_kv * G * d * _work(T, int(n_past)) >= SERIAL_BELOW)
    return o


def attend_paged(q, k_pool, v_pool, table, n_past, scale):
    """tinyspec.attention.attend_paged on the cpu backend: q [T, H_kv, G, d]; k_pool, v_pool [n_blocks, block_size,
    H_kv, d] (one layer's pool, float32); table: this sequence's block ids, at least ceil((n_past + T) / block_size)
    of them (entries past those are not read). Reads the pool in place (a pool that is not C-contiguous float32 is
    copied first); bit for bit attend over the gathered keys. attend_paged_ragged with one sequence."""
    q = np.asarray(q)
    if q.ndim != 4:
        raise ValueError(f"q {q.shape}: expected [T, H_kv, G, d]")
    return attend_paged_ragged(q, k_pool, v_pool, [table], [n_past], np.array([0, q.shape[0]], np.int64), scale)


def attend_paged_ragged(q, k_pool, v_pool, tables, n_pasts, bounds, scale):
    """tinyspec.attention.attend_paged_ragged on the cpu backend: the rows of every sequence (q [R, H_kv, G, d],
    sequence b's rows bounds[b] .. bounds[b+1]-1) over its own blocks of one pool (tables[b], n_pasts[b]
    positions before its rows) in one kernel call, whose threads take (row, kv head) pairs of all sequences
    (below SERIAL_BELOW multiply-adds, a decode over a short context, they run on the calling thread).
    Each row's arithmetic is attend_paged's for its sequence alone, so the same bits.
    The checks run on Python ints (the tables' used ids as lists): this runs once per attention layer and pass,
    and NumPy's per-call cost on these tiny arrays was several times a small model's attention."""
    q = np.ascontiguousarray(q, dtype=np.float32)
    if q.ndim != 4:
        raise ValueError(f"q {q.shape}: expected [R, H_kv, G, d]")
    R, H_kv, G, d = q.shape
    if k_pool.ndim != 4 or k_pool.shape[2:] != (H_kv, d) or v_pool.shape != k_pool.shape:
        raise ValueError(f"k_pool/v_pool {k_pool.shape}/{v_pool.shape}: expected the same "
                         f"[n_blocks, block_size, {H_kv}, {d}]")
    n_blocks, bs = k_pool.shape[:2]
    if bs < 1:
        raise ValueError(f"k_pool {k_pool.shape}: block size must be at least 1")
    B = len(tables)
    bounds = np.ascontiguousarray(bounds, dtype=np.int64)
    cuts = bounds.tolist()
    if len(n_pasts) != B or bounds.shape != (B + 1,) or cuts[0] != 0 or cuts[-1] != R or cuts != sorted(cuts):
        raise ValueError(f"bounds {cuts} and {len(n_pasts)} n_past do not cut {R} rows into {B} sequences")
    for n_past in n_pasts:
        if int(n_past) != n_past or n_past < 0:
            raise ValueError(f"n_past {n_past}: expected an integer >= 0")
    pasts = [int(n) for n in n_pasts]
    used = [-(-(n + hi - lo) // bs) for n, lo, hi in zip(pasts, cuts, cuts[1:])]  # blocks holding each's positions
    width = max(used, default=0)
    seqs = []  # [B, 1 + width], flat: per sequence its n_past, then its used block ids, padded with 0
    for b, table in enumerate(tables):
        table = np.asarray(table)
        if table.ndim != 1 or not (table.dtype.kind in "iu" or table.size == 0):
            raise ValueError(f"table {table.dtype} {table.shape}: expected a 1-D array of integer block ids")
        if table.shape[0] < used[b]:
            raise ValueError(f"table too short: {table.shape[0]} block ids for {pasts[b] + cuts[b + 1] - cuts[b]} "
                             f"positions of block size {bs} (need {used[b]})")
        ids = table[:used[b]].tolist()
        if ids and (min(ids) < 0 or max(ids) >= n_blocks):
            bad = next(i for i in ids if i < 0 or i >= n_blocks)
            raise ValueError(f"table: block id {bad} out of range for a pool of {n_blocks} blocks")
        seqs += [pasts[b], *ids, *[0] * (width - used[b])]
    o = np.empty_like(q)
    work = H_kv * G * d * sum(_work(hi - lo, n) for n, lo, hi in zip(pasts, cuts, cuts[1:]))
    threaded = R * H_kv > 1 and work >= SERIAL_BELOW
    _attend_any(q, np.ascontiguousarray(k_pool, dtype=np.float32), np.ascontiguousarray(v_pool, dtype=np.float32),
            np.array(seqs, np.int64).reshape(B, 1 + width), bounds, float(scale), o, threaded)
    return o


kernel_cache.sync(_attend)  # cached kernels compiled from older sources (simd.py) are dropped
