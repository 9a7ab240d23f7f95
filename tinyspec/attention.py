"""Gated full attention of qwen35 (every `full_attention_interval`-th layer, and the MTP block).

For the T new tokens at positions p .. p+T-1 (x is the input after attn_norm):

    qg   = attn_q @ x          per head h: [q_h (d) | gate_h (d)]  interleaved per head, not split in halves
    k, v = attn_k @ x, attn_v @ x                                   H_kv heads of d
    q_h  = rope(rms_norm(q_h, attn_q_norm)),  k_j = rope(rms_norm(k_j, attn_k_norm))
    o_h  = softmax(scale * K_j[:n] q_h) V_j[:n]     j = h // (H / H_kv)  (grouped GQA), n = pos + 1 (causal)
    out  = attn_output @ (concat_h o_h * sigmoid(concat_h gate_h))

rope rotates only the first n_rot dims of each head (NEOX pairs i, i + n_rot/2); scale = 1/sqrt(d).
The KV cache stores k after norm and rope, and v as projected.

Batch invariance: each query row is computed by its own calls over exactly the n keys it may see,
the same calls a one-token decode at that position makes, so a verify pass of T tokens reproduces the
decode results bit for bit (tests/test_model.py checks it).

Several sequences in one pass (attention_layer_ragged, batch.py): the projections and the output run once
over every sequence's rows packed together; the norm and rope per row at its sequence's position; the cache and
attention per sequence on its own rows and its own cache (contiguous, or paged: attend_paged reads the
sequence's blocks through its table; sequences in one pool attend in one attend_paged_ragged call).
One sequence (attention_layer) is the case of one: the steps are written once.

Official implementation: llama.cpp `src/models/qwen35.cpp` build_layer_attn; HF transformers
`Qwen3_5Attention` (modeling_qwen3_5.py). Does NOT include: sliding windows, M-RoPE for images.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from .config import ModelConfig
from .ops import asarray_like, join_rows, rope_angles, rope_rows, rows_of, softmax
from .paged import PagedKVCache
from .state import KVCache
from .tree import depths, path_to


def attend(q: np.ndarray, keys: np.ndarray, values: np.ndarray, n_past: int, scale: np.float32) -> np.ndarray:
    """Causal grouped attention of T new query rows: q [T, H_kv, G, d]; keys, values [>= n_past + T, H_kv, d]
    (the cache's arrays, the T new rows already in) -> o [T, H_kv, G, d].

    Row t sees the n = n_past + t + 1 keys up to its own position: o = softmax(scale * K[:n] q) V[:n], per kv
    head for its G query heads, with exactly the calls a one-token pass at that position makes.
    """
    T, H_kv, G, d = q.shape
    o = np.empty_like(q)  # float32, on q's device
    for t in range(T):
        n = n_past + t + 1  # keys visible to this row (causal)
        k_t = np.copy(keys[:n].transpose(1, 0, 2), order="C")  # [H_kv, n, d]
        v_t = np.copy(values[:n].transpose(1, 0, 2), order="C")  # [H_kv, n, d]
        scores = np.matmul(q[t], k_t.transpose(0, 2, 1)) * scale  # [H_kv, G, n]
        o[t] = np.matmul(softmax(scores), v_t)  # [H_kv, G, d]
    return o


def attend_paged(q: np.ndarray, k_pool: np.ndarray, v_pool: np.ndarray, table: np.ndarray, n_past: int,
                 scale: np.float32) -> np.ndarray:
    """attend over a paged cache (paged.py): k_pool, v_pool [n_blocks, block_size, H_kv, d] one layer's pool,
    table [>= ceil((n_past + T) / block_size)] the sequence's block ids (position j: block table[j // bs], row
    j % bs). The oracle gathers the sequence's blocks into contiguous keys and calls attend: the same keys in
    the same order, so the same bits as a contiguous cache."""
    bs, n = k_pool.shape[1], n_past + q.shape[0]
    blocks = np.asarray(table[: -(-n // bs)], dtype=np.int64)
    if blocks.size * bs < n:
        raise ValueError(f"a block table of {blocks.size} blocks of {bs} does not hold {n} positions")
    keys = k_pool[blocks].reshape(-1, *k_pool.shape[2:])  # [n_blocks * bs, H_kv, d]
    values = v_pool[blocks].reshape(-1, *v_pool.shape[2:])
    return attend(q, keys, values, n_past, scale)


def attend_paged_ragged(q: np.ndarray, k_pool: np.ndarray, v_pool: np.ndarray, tables: list, n_pasts: list,
                        bounds: np.ndarray, scale: np.float32) -> np.ndarray:
    # [R, H_kv, G, d], pools [n_blocks, block_size, H_kv, d], B tables, B ints, [B+1] -> [R, H_kv, G, d]
    """attend_paged of several sequences whose caches share one pool (paged.py), their query rows packed in one
    q (sequence b: rows bounds[b] .. bounds[b+1]-1, its block table tables[b], n_pasts[b] positions before its
    rows). Each sequence's rows attend over its own keys only. The loop a fast backend fuses into one call
    (fast/numba_attention.py)."""
    return join_rows([attend_paged(q[lo:hi], k_pool, v_pool, table, n_past, scale)
                      for lo, hi, table, n_past in zip(bounds[:-1], bounds[1:], tables, n_pasts)])


def attend_rows(q: np.ndarray, k_pool: np.ndarray, v_pool: np.ndarray, seq, row0, n_past, tab0, tables,
                scale: np.float32, out: np.ndarray | None = None) -> np.ndarray:
    # q [R, H_kv, G, d], pools [n_blocks, bs, H_kv, d], the map's int32 arrays (fast/rowmap.py) -> o [R, H_kv, G, d]
    """attend_paged_ragged with every length and block id read from a pass's row map (fast/rowmap.py) instead of host
    ints: row r of sequence b = seq[r] sees its n = n_past[b] + (r - row0[b]) + 1 positions through
    tables[tab0[b]:]. The oracle of the device kernel (fast/cuda_attention.py), which reads the map where it was
    uploaded; here each row is attend_paged of that row alone (the same bits: the oracle computes every row by
    its own calls). out: where o goes (a kernel's in-place output), else a new array."""
    R, bs = q.shape[0], k_pool.shape[1]
    o = np.empty_like(q) if out is None else out
    for r in range(R):
        b = int(seq[r])
        n = int(n_past[b]) + r - int(row0[b]) + 1
        ids = tables[int(tab0[b]) : int(tab0[b]) + -(-n // bs)]
        o[r] = attend_paged(q[r : r + 1], k_pool, v_pool, ids, n - 1, scale)[0]
    return o


def attention_layer(x: np.ndarray, w: Mapping[str, np.ndarray], cache: KVCache, cfg: ModelConfig,
                    kern) -> np.ndarray:  # [T, D] -> [T, D]
    """Gated attention of one layer on one sequence's T new tokens: attention_layer_ragged with one sequence."""
    return attention_layer_ragged(x, w, [cache], np.array([0, x.shape[0]]), cfg, kern)


def attention_layer_ragged(x: np.ndarray, w: Mapping[str, np.ndarray], caches: list, bounds: np.ndarray,
                           cfg: ModelConfig, kern, rows=None, trees: list | None = None) -> np.ndarray:
    # [R, D] -> [R, D]
    """Gated attention of one layer on several sequences' new tokens, packed in one [R, D] (sequence b: rows
    bounds[b] .. bounds[b+1]-1, like cu_seqlens). Appends each sequence's new keys/values to caches[b]; its
    positions continue from caches[b].n. One sequence is the case bounds = [0, T].

    kern: the functions to compute with (a kernels.Kernels, which this module never imports: it imports this
    one for its defaults; the matmul, the norms, the gate and `attend`, the function above or one with its
    contract, e.g. fast/numba_attention.py's).
    The projections, norms, rope (each row at its own sequence's position) and output run once over all R
    rows, so each weight is read once; each sequence's rows go into its own cache and attend over it (no row
    ever sees another sequence's keys), so each sequence's rows are bitwise those it computes alone.
    rows: a device pass's row map (Placement.device_pass; the views fast/rowmap.py cuts: cos, sin, dest and
    `attention`, the attention kernel's map), or None: the positions' rope angles, where each row's
    key and value go and what each row attends to, read from it (the caches were claimed before the pass: nothing
    here changes on the host), the same numbers as the host path computes.
    trees[b]: sequence b's draft tree (tree.py), or None: a tree's row t sits at position n + depth(t) and attends
    over the prefix and its own path only (attend_tree), what a one-token decode of that path sees.
    """
    q, gate, k, v = kern.attention_project(x, w, cfg, kern)  # 1. projections (project, or a fused one)
    if rows is None:
        trees = trees or [None] * len(caches)
        positions = join_rows([np.arange(c.n, c.n + hi - lo) if t is None else c.n + depths(t)
                               for c, lo, hi, t in zip(caches, bounds[:-1], bounds[1:], trees)])
        q, k = kern.norm_rope(q, k, positions, w, cfg, kern)  # 2. q/k norm and rope (norm_rope, or a fused one)
        o = attend_own(q, k, v, caches, bounds, cfg, kern, trees)  # 3. into each cache, attention over it
    else:
        q, k = norm_rope_rows(q, k, rows, w, cfg, kern)  # 2. q/k norm, rope with the map's angles
        o = attend_rows_own(q, k, v, caches, rows, cfg, kern)  # 3. into the pool at the map's rows, attention
    return kern.attention_output(o, gate, w, kern)  # 4. gate and out projection (output, or a fused one)


def project(x, w, cfg: ModelConfig, kern):  # [T, D] -> q [T, H, d], gate [T, H*d], k, v [T, H_kv, d]
    T, H, H_kv, d = x.shape[0], cfg.n_head, cfg.n_head_kv, cfg.head_dim
    qg = kern.linear(x, w["attn_q.weight"]).reshape(T, H, 2 * d)  # [T, H, 2d]
    q, gate = qg[..., :d], qg[..., d:].reshape(T, H * d)  # [T, H, d], [T, H*d]
    k = kern.linear(x, w["attn_k.weight"]).reshape(T, H_kv, d)  # [T, H_kv, d]
    v = kern.linear(x, w["attn_v.weight"]).reshape(T, H_kv, d)
    return q, gate, k, v


def norm_rope(q, k, positions: np.ndarray, w, cfg: ModelConfig, kern):
    """Per row: q/k RMSNorm, then rope at the row's position ([T] ints). -> q [T, H, d], k [T, H_kv, d]."""
    cos, sin = rope_angles(positions, cfg.n_rot, cfg.rope_base)  # [T, half] each, host: rope_neox's, once for both
    cos, sin = asarray_like(cos, q), asarray_like(sin, q)
    q = rope_rows(kern.rms_norm(q, w["attn_q_norm.weight"], cfg.rms_eps), cos, sin, cfg.n_rot)
    k = rope_rows(kern.rms_norm(k, w["attn_k_norm.weight"], cfg.rms_eps), cos, sin, cfg.n_rot)
    return q, k


def norm_rope_rows(q, k, rows, w, cfg: ModelConfig, kern):
    """norm_rope with the rope angles of a pass's row map (rows.cos, rows.sin [R, half]: ops.rope_angles of the
    same positions, so the same numbers) where the rows are."""
    q = rope_rows(kern.rms_norm(q, w["attn_q_norm.weight"], cfg.rms_eps), rows.cos, rows.sin, cfg.n_rot)
    k = rope_rows(kern.rms_norm(k, w["attn_k_norm.weight"], cfg.rms_eps), rows.cos, rows.sin, cfg.n_rot)
    return q, k


def attend_rows_own(q, k, v, caches: list, rows, cfg: ModelConfig, kern) -> np.ndarray:
    """attend_own through a pass's row map: every row's key and value written at its map row (rows.dest, in the
    pool seen flat) of the one pool every sequence's cache shares (a cache of its own is a pool of one block:
    KVCache.pools), then one kern.attend_rows for all rows -> [R, H*d]. The caches' n were advanced when the
    pass claimed its rows (fast/rowmap.py's claim)."""
    R, H_kv, d = q.shape[0], cfg.n_head_kv, cfg.head_dim
    k_pool, v_pool = caches[0].pools()  # [n_blocks, bs, H_kv, d] each
    k_pool.reshape(-1, H_kv, d)[rows.dest] = k  # scattered by device row ids: no host offset in the write
    v_pool.reshape(-1, H_kv, d)[rows.dest] = v
    q = q.reshape(R, H_kv, cfg.n_head // H_kv, d)  # [R, H_kv, G, d]
    o = kern.attend_rows(q, k_pool, v_pool, *rows.attention, np.float32(cfg.attn_scale))
    return o.reshape(R, cfg.n_head * d)


def attend_own(q, k, v, caches: list, bounds: np.ndarray, cfg: ModelConfig, kern,
               trees: list | None = None) -> np.ndarray:
    """Every sequence's rows (normed, roped; q [R, H, d], k, v [R, H_kv, d]): append its k, v to its own cache,
    attend over it -> [R, H*d]. caches: state.KVCache or paged.PagedKVCache. Caches in one pool (the batch
    engine's) attend in one kern.attend_paged_ragged call, the block tables saying whose keys each row sees;
    any others each by its own kernel (cache.attend picks kern.attend or kern.attend_paged)."""
    R, H_kv, d = q.shape[0], cfg.n_head_kv, cfg.head_dim
    q = q.reshape(R, H_kv, cfg.n_head // H_kv, d)  # [R, H_kv, G, d]
    scale = np.float32(cfg.attn_scale)
    n_pasts = [cache.n for cache in caches]
    for lo, hi, cache in zip(bounds[:-1], bounds[1:], caches):
        cache.append(k[lo:hi], v[lo:hi])
    if trees is not None and any(t is not None for t in trees):  # a tree's rows each attend over their own path
        o = np.empty_like(q)
        chain = [b for b, t in enumerate(trees) if t is None]
        if chain:  # the chains as without trees, in one call
            rows, sizes = rows_of(bounds, chain)
            o[rows] = attend_chains(q[rows], [caches[b] for b in chain], [n_pasts[b] for b in chain], sizes, kern,
                                    scale)
        for b, parents in enumerate(trees):
            if parents is not None:
                lo, hi = int(bounds[b]), int(bounds[b + 1])
                o[lo:hi] = attend_tree(q[lo:hi], caches[b], n_pasts[b], parents, kern, scale)
    else:
        o = attend_chains(q, caches, n_pasts, bounds, kern, scale)
    return o.reshape(R, cfg.n_head * d)  # [R, H_kv, G, d] -> [R, H*d]


def attend_chains(q, caches: list, n_pasts: list, bounds: np.ndarray, kern, scale: np.float32) -> np.ndarray:
    """Every sequence's rows over its own cache (their keys already in): one kern.attend_paged_ragged call when
    the caches share one pool, else each cache by its own kernel. q [R, H_kv, G, d] -> o [R, H_kv, G, d]."""
    if PagedKVCache.one_pool(caches):
        o = kern.attend_paged_ragged(q, caches[0].k_pool, caches[0].v_pool, [c.ids() for c in caches], n_pasts,
                                     bounds, scale)
    else:
        o = join_rows([cache.attend(kern, q[lo:hi], n_past, scale)
                       for lo, hi, cache, n_past in zip(bounds[:-1], bounds[1:], caches, n_pasts)])
    return o


def attend_tree(q, cache, n_past: int, parents, kern, scale: np.float32) -> np.ndarray:
    # q [T, H_kv, G, d] of a tree's T rows, their keys at n_past .. n_past + T - 1 -> o [T, H_kv, G, d]
    """A draft tree's rows (tree.py), each over the n_past positions before the pass and its path's rows: the keys
    of positions 0 .. n_past-1 and n_past + path_to(t), gathered in that order, which are the keys a one-token
    decode of the path sees in the same order, so kern.attend over them gives its bits (a paged cache's kernel is
    bit for bit kern.attend over its gathered keys, numba_attention.py)."""
    o = np.empty_like(q)
    before = np.arange(n_past)
    for t in range(q.shape[0]):
        keys, values = cache.gather(np.concatenate([before, n_past + np.asarray(path_to(parents, t))]))
        o[t : t + 1] = kern.attend(q[t : t + 1], keys, values, keys.shape[0] - 1, scale)
    return o


def output(o, gate, w, kern) -> np.ndarray:  # [T, H*d] x2 -> [T, D]
    return kern.linear(o * kern.sigmoid(gate), w["attn_output.weight"])

