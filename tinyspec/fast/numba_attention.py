"""Numba causal attention over the KV cache: tinyspec.attention.attend's contract, one loop nest, no temporaries.

    attend(q [T, H_kv, G, d], keys [>= n_past + T, H_kv, d], values [same], n_past, scale) -> o [T, H_kv, G, d]
    attend_paged(q, k_pool [n_blocks, block_size, H_kv, d], v_pool [same], table, n_past, scale) -> o   (paged cache)
    attend_paged_ragged(q [R, H_kv, G, d], k_pool, v_pool, tables, n_pasts, bounds [B+1], scale) -> o   (B sequences)

The oracle (tinyspec/attention.py attend) makes, per query row, two transposed copies of the visible
keys and values and five NumPy calls (two matmuls, a softmax of three reductions): ~10 small calls per
row and layer, whose overhead, not the arithmetic, was nearly all of attention's share of a verify pass at
the 0.8B shape (6 attention layers; LESSONS 7, docs/performance-log.md old 28). Here each (row t, kv head h)
is one pass over the n = n_past + t + 1 keys it may see, reading the cache in place, each key row once for
the G query heads that share it; (t, h) pairs run in parallel. Per query head:

    s_j = scale * (q . k_j)                 d = 256 (every Qwen3.5 size): the 256 products summed by a fixed
                                            tree in registers (simd.dot256); other d: 16 at a time (dot16)
    p_j = exp(s_j - max s) / sum_j exp(s_j - max s)      sums in key order j = 0, 1, ..
    o   = sum_j p_j v_j                     in key order, one fma per element and key (simd.axpy256 / axpy16)

Batch invariance by construction: row t's numbers depend only on q[t] and the first n keys, with the
same operations in the same order whatever T is, so a verify pass's row equals the one-token pass at
that position bit for bit (tests/test_numba_attention.py). Against the oracle (BLAS matmuls, whose
summation order is the library's) it agrees to float32 rounding, not bitwise, like the linear kernels.
No fast-math: LLVM may not reorder the sums, so the vector work is written as simd.py intrinsics.

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
attend_paged is the case of one sequence, attend of one sequence in one block.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from . import kernel_cache, simd


@njit(cache=True, parallel=True, error_model="numpy", boundscheck=False)
def _attend(q, k_pool, v_pool, tables, n_pasts, bounds, scale, o):  # see the module docstring; o is written
    # q [R, H_kv, G, d]; sequence b: rows bounds[b] .. bounds[b+1]-1, block ids tables[b, :], n_pasts[b] keys before
    R, H_kv, G, d = q.shape
    B = n_pasts.shape[0]
    bs = k_pool.shape[1]  # block size: position j is row j % bs of block table[j // bs]
    d16 = d - d % 16
    qf, kf, vf, of = q.reshape(-1), k_pool.reshape(-1), v_pool.reshape(-1), o.reshape(-1)
    seq = np.empty(R, np.int64)  # the sequence of each query row
    n_keys = 0  # the most positions any sequence holds after its rows
    for b in range(B):
        seq[bounds[b]:bounds[b + 1]] = b
        n_keys = max(n_keys, n_pasts[b] + bounds[b + 1] - bounds[b])
    rows = np.empty((B, n_keys), np.int64)  # the tables resolved once: sequence b's position j is pool row rows[b, j]
    for b in range(B):
        for j in range(n_pasts[b] + bounds[b + 1] - bounds[b]):
            rows[b, j] = tables[b, j // bs] * bs + j % bs
    for item in prange(R * H_kv):  # (row, kv head) pairs of every sequence; the arithmetic is the same on any thread
        r, h = item // H_kv, item % H_kv
        b = seq[r]
        n = n_pasts[b] + (r - bounds[b]) + 1  # keys visible to this row (causal, its own sequence's only)
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
    _attend(q, keys.reshape(1, *keys.shape), values.reshape(1, *values.shape), _ONE_BLOCK,
            np.array([n_past], np.int64), np.array([0, T], np.int64), np.float32(scale), o)
    return o


_ONE_BLOCK = np.zeros((1, 1), np.int64)


def attend_paged(q, k_pool, v_pool, table, n_past, scale):
    """tinyspec.attention.attend_paged on the cpu backend: q [T, H_kv, G, d]; k_pool, v_pool [n_blocks, block_size,
    H_kv, d] (one layer's pool, float32); table: this sequence's block ids, at least ceil((n_past + T) / block_size)
    of them (entries past those are not read). Reads the pool in place (a pool that is not C-contiguous float32 is
    copied first); bit for bit attend over the gathered keys. attend_paged_ragged with one sequence."""
    q = np.asarray(q)
    if q.ndim != 4:
        raise ValueError(f"q {q.shape}: expected [T, H_kv, G, d]")
    return attend_paged_ragged(q, k_pool, v_pool, [table], [n_past], np.array([0, q.shape[0]]), scale)


def attend_paged_ragged(q, k_pool, v_pool, tables, n_pasts, bounds, scale):
    """tinyspec.attention.attend_paged_ragged on the cpu backend: the rows of every sequence (q [R, H_kv, G, d],
    sequence b's rows bounds[b] .. bounds[b+1]-1) over its own blocks of one pool (tables[b], n_pasts[b]
    positions before its rows) in one kernel call, whose threads take (row, kv head) pairs of all sequences.
    Each row's arithmetic is attend_paged's for its sequence alone, so the same bits."""
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
    bounds = np.asarray(bounds, dtype=np.int64)
    if len(n_pasts) != B or bounds.shape != (B + 1,) or bounds[0] != 0 or bounds[-1] != R \
            or np.any(np.diff(bounds) < 0):
        raise ValueError(f"bounds {bounds.tolist()} and {len(n_pasts)} n_past do not cut {R} rows into {B} sequences")
    for n_past in n_pasts:
        if int(n_past) != n_past or n_past < 0:
            raise ValueError(f"n_past {n_past}: expected an integer >= 0")
    n_pasts = np.array([int(n) for n in n_pasts], np.int64)
    used = -(-(n_pasts + np.diff(bounds)) // bs)  # [B] blocks holding each sequence's positions
    padded = np.zeros((B, max(int(used.max(initial=0)), 1)), np.int64)  # the tables, one row each
    for b, table in enumerate(tables):
        table = np.asarray(table)
        if table.ndim != 1 or not (table.dtype.kind in "iu" or table.size == 0):
            raise ValueError(f"table {table.dtype} {table.shape}: expected a 1-D array of integer block ids")
        if table.shape[0] < used[b]:
            raise ValueError(f"table too short: {table.shape[0]} block ids for {n_pasts[b] + bounds[b + 1] - bounds[b]} "
                             f"positions of block size {bs} (need {used[b]})")
        ids = table[:used[b]]
        if used[b] and (ids.min() < 0 or ids.max() >= n_blocks):
            bad = ids[(ids < 0) | (ids >= n_blocks)][0]
            raise ValueError(f"table: block id {bad} out of range for a pool of {n_blocks} blocks")
        padded[b, :used[b]] = ids
    o = np.empty_like(q)
    _attend(q, np.ascontiguousarray(k_pool, dtype=np.float32), np.ascontiguousarray(v_pool, dtype=np.float32),
            padded, n_pasts, bounds, np.float32(scale), o)
    return o


kernel_cache.sync(_attend)  # cached kernels compiled from older sources (simd.py) are dropped
