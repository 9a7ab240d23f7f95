"""Paged KV cache: every sequence's keys and values in one pool of fixed-size blocks, found through a block table.

One sequence keeps its attention keys in a contiguous array (state.KVCache), grown by doubling. Many
sequences at once cannot: each would need room for the longest it might grow (most of it never used), or
a regrow that copies the whole cache. A serving engine (vLLM's PagedAttention, SGLang, llama.cpp's
unified KV) cuts the memory into blocks of `block_size` positions, allocated once for all sequences:

    pool.k[l]   [n_blocks, block_size, H_kv, d]    attention layer l's keys (pool.v[l] its values)
    free list   block ids nobody owns
    block table a sequence's list of block ids, in position order: its position j lives in block
                table[j // block_size] at row j % block_size

    pool     | 0 | 1 | 2 | 3 | 4 | 5 | 6 | 7 |        block_size 4, free list [6, 7]
    seq A    table [3, 0, 5]     n = 10: positions 0-3 in block 3, 4-7 in block 0, 8-9 in block 5 (2 rows spare)
    seq B    table [1, 4, 2]     n = 12: three full blocks

A sequence takes a block from the free list when its next position starts a new block (memory grows with
the tokens actually held, never with the context length), gives back its tail blocks when a rollback
keeps fewer positions (keeping n positions keeps ceil(n / block_size) blocks), and all of them when it
finishes. Nothing is ever copied to grow or shrink, and a finished sequence's blocks serve the next one.
The table is the same for every attention layer of a sequence (all layers hold the same positions), so a
sequence owns one BlockTable and each attention layer reads it (PagedKVCache).

Attention reads a sequence's keys through its table (attention.attend_paged; fast/numba_attention.py
reads the pool in place): the same keys in the same order as a contiguous cache, so the same bits.

Sharing. A block may be listed by several tables (a cached prompt prefix, prefix_cache.py): the pool counts
the tables using each block (refs) and frees it when the last one gives it back, or keeps it idle while a
prefix cache still finds it by its tokens, evicting idle blocks least recently used when it runs out of free
ones. Shared and cached blocks are full and read only: a sequence adopts them before it writes anything and
writes only past them (BlockTable.check_writable raises otherwise), so no copy-on-write is ever needed.

Other models' KV in the same blocks (the MTP head's, a draft model's: the drafters of speculate.Engine). The pool
holds each attention layer's keys as one slab of a block: all of them are one array [S, n_blocks, block_size,
H_kv, d] (S: the attention layers; pool.k[l] is slab a of every block, its own contiguous array), so a block is
S slabs of block_size * H_kv * d floats (keys; values alike). Another model's rows [H', d'] see the same memory as
[S * n_blocks, P, H', d'] with P = block_size * H_kv * d / (H' * d') of its positions a slab (BlockPool.view; slab
a * n_blocks + b is slab a of block b). A model of L attention layers (ViewTable) puts its positions in chunks of
P, chunk c of its layer l in its slab i = c * L + l, which is slab i % S of its block i // S:

    pool, S = 2 slabs    | 0 | 1 | 2 | 3 | ...   block b: slabs (0, b) and (1, b)
    target table [3, 0]  its layer of slab 0 reads slab (0, b), its layer of slab 1 slab (1, b), of blocks 3, 0
    MTP head (L = 1, P = block_size)    table [5]: chunk 0 in slab (0, 5), chunk 1 in slab (1, 5): a block
                                        holds 2 * block_size of its positions, in the bytes of block_size target ones

So the drafters take blocks from the same free list as the target, in the same bytes, and a block is in one
table at a time, whichever model's: admission and preemption count one budget (speculate.Engine). The
attention kernels read a view through its table of slab ids as they read a target layer (attend_paged).

Does NOT include: swapping blocks to the host (a preempted sequence gives its blocks back and is recomputed,
speculate.Engine), sharing a partly filled block, a row shape that does not tile a slab, quantized KV.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from .config import ModelConfig


class PoolExhausted(RuntimeError):
    """No free block is left: the pool is smaller than the sequences admitted need."""


class BlockPool:
    """n_blocks blocks of block_size positions for every attention layer of a model, who uses each, and the free list.

    Every block is in exactly one of three places:
        in use   refs[b] >= 1: the number of block tables that list it (a shared prefix block: several)
        idle     refs[b] == 0 but a prefix cache still finds it by its tokens (cached[b]): kept, in least
                 recently used order, until a take() needs a block and none is free (then evicted: forgotten)
        free     refs[b] == 0, cached by nobody: on the free list
    A block is written only while one table uses it and no cache holds it (writable): a shared or cached block
    holds positions every user has already seen, so it is read, never written."""

    def __init__(self, cfg: ModelConfig, n_blocks: int, block_size: int = 16, xp=np):
        if n_blocks < 1 or block_size < 1:
            raise ValueError(f"a block pool needs n_blocks >= 1 and block_size >= 1, got {n_blocks}, {block_size}")
        self.n_blocks, self.block_size = int(n_blocks), int(block_size)
        attention = [i for i, r in enumerate(cfg.recurrent) if not r]
        # S: a block is one slab of block_size positions per attention layer; a trunk without one (a small test
        # file's) still gets one slab a block, which its drafters' KV takes (view())
        self.slabs = max(len(attention), 1)
        self.layout = (tuple(cfg.recurrent), cfg.n_head_kv, cfg.head_dim)  # the model whose tables are BlockTables
        shape = (self.slabs, self.n_blocks, self.block_size, cfg.n_head_kv, cfg.head_dim)
        self.k_slabs, self.v_slabs = xp.zeros(shape, np.float32), xp.zeros(shape, np.float32)
        # trunk layer i -> its key / value pool [n_blocks, block_size, H_kv, d] (None for GDN layers, which keep no KV)
        self.k = [None if r else self.k_slabs[attention.index(i)] for i, r in enumerate(cfg.recurrent)]
        self.v = [None if r else self.v_slabs[attention.index(i)] for i, r in enumerate(cfg.recurrent)]
        self.views: dict[tuple[int, int], tuple] = {}  # (H', d') -> the memory as slabs of that row (view())
        self.free = list(range(self.n_blocks - 1, -1, -1))  # a stack: pop() hands out block 0 first
        self.refs = np.zeros(self.n_blocks, np.int64)  # block tables using each block
        self.cached: dict[int, object] = {}  # block -> the prefix cache's entry that finds it (prefix_cache.py)
        self.idle: OrderedDict[int, None] = OrderedDict()  # cached blocks nobody uses, least recently used first
        self.peak_used = 0

    @property
    def used(self) -> int:
        return self.n_blocks - len(self.free) - len(self.idle)

    @property
    def available(self) -> int:
        """Blocks a take() can hand out: the free ones and the idle cached ones (evicted when needed)."""
        return len(self.free) + len(self.idle)

    def blocks_for(self, n_positions: int) -> int:
        return -(-int(n_positions) // self.block_size)  # ceil

    def idle_among(self, blocks: list[int]) -> int:
        """How many of `blocks` are idle (cached, used by nobody): a table adopting them takes them out of
        `available` without a take()."""
        return sum(self.refs[block] == 0 for block in blocks)

    def take(self) -> int:
        """A block for one table to write: a free one, else the least recently used idle cached one (evicted)."""
        if self.free:
            block = self.free.pop()
        elif self.idle:
            block, _ = self.idle.popitem(last=False)
            del self.cached[block]  # evicted: the prefix cache no longer finds it (its entry sees this)
        else:
            raise PoolExhausted(f"the KV pool's {self.n_blocks} blocks of {self.block_size} positions are all in use")
        self.refs[block] = 1
        self.peak_used = max(self.peak_used, self.used)
        return block

    def share(self, block: int) -> None:
        """One more table uses `block` (a cached prefix block found again); an idle block is in use again."""
        if self.refs[block] == 0:
            if block not in self.idle:
                raise ValueError(f"block {block} is free: only a block in use or cached can be shared")
            del self.idle[block]
        self.refs[block] += 1
        self.peak_used = max(self.peak_used, self.used)

    def give_back(self, blocks: list[int]) -> None:
        """One table stops using each of `blocks`: a block nobody uses is idle if cached, else free."""
        for block in reversed(blocks):  # the tail first: the most recently freed block is reused first
            if self.refs[block] < 1:
                raise ValueError(f"block {block} given back by a table that does not use it")
            self.refs[block] -= 1
            if self.refs[block] == 0:
                if block in self.cached:
                    self.idle[block] = None
                else:
                    self.free.append(block)

    def writable(self, block: int) -> bool:
        """Whether a table may write `block`: it is the only user, and no cache finds the block by its tokens."""
        return self.refs[block] == 1 and block not in self.cached

    def bytes_per_block(self) -> int:
        return 2 * self.k_slabs[:, 0].nbytes  # keys and values, every attention layer

    def view(self, n_head_kv: int, head_dim: int) -> tuple:
        """The pool's memory as slabs of rows [n_head_kv, head_dim] (another model's KV, the module docstring):
        (keys, values [S * n_blocks, P, n_head_kv, head_dim], P) with P of its positions a slab; slab a * n_blocks
        + b is slab a of block b. One pair of arrays per row shape, so every sequence's view attends in one call."""
        key = (int(n_head_kv), int(head_dim))
        if key not in self.views:
            _, H_kv, d = self.layout
            floats, row = self.block_size * H_kv * d, key[0] * key[1]
            if floats % row:
                raise ValueError(f"rows of {key[0]} x {key[1]} floats do not tile the pool's slabs of {self.block_size}"
                                 f" x {H_kv} x {d} floats ({self.slabs} a block): choose another block_size")
            P = floats // row
            self.views[key] = (self.k_slabs.reshape(-1, P, *key), self.v_slabs.reshape(-1, P, *key), P)
        return self.views[key]

    def table_for(self, cfg: ModelConfig) -> "KVTable":
        """A new sequence's table for a model of `cfg`: a BlockTable for the model the pool was made for (its
        attention layers and row shape), else a ViewTable of the pool's memory (a draft model)."""
        if (tuple(cfg.recurrent), cfg.n_head_kv, cfg.head_dim) == self.layout:
            return BlockTable(self)
        return ViewTable(self, [i for i, r in enumerate(cfg.recurrent) if not r], cfg.n_head_kv, cfg.head_dim)


class KVTable:
    """One sequence's blocks of the pool for one model's attention layers, in position order: what BlockTable
    (the model the pool was made for) and ViewTable (another model's KV in the same memory) share, and all that
    anyone outside a table reads of it (the engine's budget, the prefix cache, the attention kernels).

        blocks                 the pool block ids it owns (or shares, BlockTable.adopt), in order
        block_size             positions one of its ids (ids(layer)) holds
        blocks_for(n)          blocks it owns to hold n positions
        blocks_to_hold(n)      new blocks holding n positions would take from the pool (0 if it holds them)
        reserve(n)             own enough blocks for n positions (takes from the free list at a boundary only)
        check_writable(i, n)   positions i .. n-1 are about to be written: raise if one lies in a shared block
        keep(n)                give back the tail blocks n positions no longer need (a rollback; a finish: 0)
        arrays(layer), ids(layer)   where a layer's keys and values live, and its ids in position order

    A subclass says how positions map to blocks (blocks_for, first_block) and indexes its blocks (_index)."""

    def __init__(self, pool: BlockPool, block_size: int):
        self.pool, self.blocks, self.block_size = pool, [], block_size

    def blocks_for(self, n_positions: int) -> int:
        raise NotImplementedError

    def first_block(self, position: int) -> int:
        """The index in `blocks` of the first block holding `position` (of any layer)."""
        raise NotImplementedError

    def _index(self) -> None:
        """Rebuild the ids the kernels read after `blocks` changed."""
        raise NotImplementedError

    def blocks_to_hold(self, n_positions: int) -> int:
        return max(0, self.blocks_for(n_positions) - len(self.blocks))

    def reserve(self, n_positions: int) -> None:
        n_blocks = self.blocks_for(n_positions)
        if len(self.blocks) < n_blocks:
            while len(self.blocks) < n_blocks:
                self.blocks.append(self.pool.take())
            self._index()

    def check_writable(self, first: int, n_positions: int) -> None:
        """A bug guard: speculation's writes and rollbacks must stay in blocks this sequence alone owns."""
        for block in self.blocks[self.first_block(first) : self.blocks_for(n_positions)]:
            if not self.pool.writable(block):
                raise RuntimeError(f"a write into block {block}, which is shared or cached")

    def keep(self, n_positions: int) -> None:
        n_blocks = self.blocks_for(n_positions)
        if n_blocks < len(self.blocks):
            self.pool.give_back(self.blocks[n_blocks:])
            del self.blocks[n_blocks:]
            self._index()


class BlockTable(KVTable):
    """The table of the model the pool was made for: its position j of every attention layer l is row
    j % block_size of block blocks[j // block_size] in pool.k[l] / pool.v[l]."""

    def __init__(self, pool: BlockPool):
        super().__init__(pool, pool.block_size)
        self._ids = np.zeros(0, np.int64)  # self.blocks as an array, for the kernels (rebuilt on change only)

    def blocks_for(self, n_positions: int) -> int:
        return self.pool.blocks_for(n_positions)

    def first_block(self, position: int) -> int:
        return position // self.block_size

    def _index(self) -> None:
        self._ids = np.array(self.blocks, np.int64)

    def arrays(self, layer: int) -> tuple:
        """Where layer `layer`'s keys and values live: [n_blocks, block_size, H_kv, d] each."""
        if self.pool.k[layer] is None:
            raise ValueError(f"layer {layer} is a GDN layer: it keeps no KV")
        return self.pool.k[layer], self.pool.v[layer]

    def adopt(self, blocks: list[int]) -> None:
        """Start from full blocks a prefix cache found (a fresh table only): shared, never written."""
        if self.blocks:
            raise ValueError("only an empty block table can adopt a cached prefix")
        for block in blocks:
            self.pool.share(block)
        self.blocks = list(blocks)
        self._index()

    def ids(self, layer: int | None = None) -> np.ndarray:  # [n_blocks] int64, the same for every layer
        return self._ids


class ViewTable(KVTable):
    """One sequence's blocks for another model's attention layers (the MTP head, a draft model) in the pool's
    memory (the module docstring): its layer l's position j is row j % P of slab ids(l)[j // P] of the view
    [S * n_blocks, P, H', d'] (BlockPool.view). layers: that model's attention layer indices (L of them).

    It takes whole blocks from the pool's free list (blocks_for: ceil(ceil(n / P) * L / S) for n positions) and
    gives back its tail blocks when it keeps fewer positions; it never shares or adopts one."""

    def __init__(self, pool: BlockPool, layers: list[int], n_head_kv: int, head_dim: int):
        self.k, self.v, P = pool.view(n_head_kv, head_dim)
        super().__init__(pool, P)  # block_size: P, positions an id holds
        self.ordinal = {layer: j for j, layer in enumerate(layers)}  # model layer -> l, its place among the L
        self._ids = [np.zeros(0, np.int64) for _ in layers]  # per l its slab ids in position order

    def blocks_for(self, n_positions: int) -> int:
        slabs = -(-int(n_positions) // self.block_size) * len(self.ordinal)  # chunks of P positions, one slab a layer
        return -(-slabs // self.pool.slabs)

    def first_block(self, position: int) -> int:
        return (position // self.block_size * len(self.ordinal)) // self.pool.slabs

    def arrays(self, layer: int) -> tuple:
        if layer not in self.ordinal:
            raise ValueError(f"layer {layer} keeps no KV in this table (its attention layers: {list(self.ordinal)})")
        return self.k, self.v

    def _index(self) -> None:
        """Each layer's slab ids from the blocks: slab i = c * L + l of chunk c is slab i % S of block i // S."""
        L, S = len(self.ordinal), self.pool.slabs
        i = np.arange(len(self.blocks) * S // L)[:, None] * L + np.arange(L)  # [chunks, L]
        slab = (i % S) * self.pool.n_blocks + np.array(self.blocks, np.int64)[i // S]  # [chunks, L] view slab ids
        self._ids = [np.ascontiguousarray(slab[:, j]) for j in range(L)]

    def ids(self, layer: int) -> np.ndarray:  # [chunks] int64: layer's slab ids in position order
        return self._ids[self.ordinal[layer]]


class PagedKVCache:
    """One attention layer's cache of one sequence, in the pool: state.KVCache's interface (n, append,
    truncate, attend, contents). `table` (a BlockTable, or a ViewTable for another model's layers) is shared with
    the sequence's other attention layers and says where each position lives."""

    def __init__(self, table: KVTable, layer: int):
        self.table, self.layer, self.pool = table, layer, table.pool
        self.k_pool, self.v_pool = table.arrays(layer)  # [ids, block_size, H_kv, d] each, read through ids()
        self.n = 0  # positions filled

    def ids(self) -> np.ndarray:
        return self.table.ids(self.layer)

    def append(self, k: np.ndarray, v: np.ndarray) -> None:  # [T, H_kv, d] each
        T, bs = k.shape[0], self.table.block_size
        self.table.reserve(self.n + T)
        self.table.check_writable(self.n, self.n + T)
        pos = np.arange(self.n, self.n + T)
        ids, rows = self.ids()[pos // bs], pos % bs
        self.k_pool[ids, rows] = k
        self.v_pool[ids, rows] = v
        self.n += T

    def start_at(self, n: int) -> None:
        """A fresh cache begins holding n positions its table adopted (a cached prefix's full blocks)."""
        if self.n or n > len(self.table.blocks) * self.table.block_size:
            raise ValueError(f"only a fresh cache can start at {n} adopted positions")
        self.n = n

    def claim(self, T: int) -> None:
        """Positions n .. n+T-1 will be written by a device pass (fast/rowmap.py claim): blocks reserved and checked
        writable as append does, n advanced, nothing written."""
        self.table.reserve(self.n + T)
        self.table.check_writable(self.n, self.n + T)
        self.n += T

    def rewind(self, n: int) -> None:
        """Forget every position >= n but keep the blocks: a drafting that writes past n again before it ends (the
        MTP head's padded first pass: its filler's positions are the next passes', whose maps were made with these
        blocks, fast/rowmap.py plan_ahead). The drafting's final truncate gives them back."""
        if not 0 <= n <= self.n:
            raise ValueError(f"PagedKVCache.rewind({n}): cache holds {self.n} positions")
        self.n = n

    def pools(self) -> tuple[np.ndarray, np.ndarray]:
        """This layer's pool arrays [n_blocks, block_size, H_kv, d], read through ids()."""
        return self.k_pool, self.v_pool

    def truncate(self, n: int) -> None:
        """Forget every position >= n; the table gives back the blocks past them (every layer of the
        sequence truncates to the same n, so whichever layer does it first frees the same blocks)."""
        if not 0 <= n <= self.n:
            raise ValueError(f"PagedKVCache.truncate({n}): cache holds {self.n} positions")
        self.n = n
        self.table.keep(n)

    def attend(self, kern, q: np.ndarray, n_past: int, scale: np.float32) -> np.ndarray:
        """kern.attend_paged over this layer's pool through the table (q [T, H_kv, G, d] -> [T, H_kv, G, d])."""
        return kern.attend_paged(q, self.k_pool, self.v_pool, self.ids(), n_past, scale)

    @staticmethod
    def one_pool(caches: list) -> bool:
        """Whether `caches` (one layer's, one per sequence) all live in the same arrays of one pool (the same
        target layer, or the same view): then they attend in one call (attention.attend_paged_ragged), each
        through its own ids."""
        first = caches[0]
        return all(isinstance(c, PagedKVCache) and c.k_pool is first.k_pool for c in caches)

    def contents(self) -> tuple[np.ndarray, np.ndarray]:
        """The keys and values of positions 0 .. n-1, gathered: [n, H_kv, d] each (tests compare them)."""
        return self.gather(np.arange(self.n))

    def gather(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The keys and values of `positions` [m] (< n), in that order: [m, H_kv, d] each (a tree row's view)."""
        bs = self.table.block_size
        ids, rows = self.ids()[positions // bs], positions % bs
        return self.k_pool[ids, rows], self.v_pool[ids, rows]

    def move_rows(self, first: int, rows: np.ndarray) -> None:
        """state.KVCache.move_rows in the pool: positions first + rows[j] moved to first + j, in blocks this
        sequence alone writes (the pass wrote them); the caller then truncates (its table gives the tail back)."""
        src = first + np.asarray(rows, np.int64)
        dst = np.arange(first, first + len(src))
        bs, ids = self.table.block_size, self.ids()
        self.table.check_writable(first, first + len(src))
        for pool in (self.k_pool, self.v_pool):
            pool[ids[dst // bs], dst % bs] = pool[ids[src // bs], src % bs]  # the right side is a copy

    def max_abs_diff(self, other) -> float:
        return kv_max_abs_diff(self, other)


def kv_max_abs_diff(a, b) -> float:
    """Largest difference between two caches' keys and values (contiguous or paged); inf when their lengths differ."""
    if a.n != b.n:
        return float("inf")
    if a.n == 0:
        return 0.0
    (k, v), (k2, v2) = a.contents(), b.contents()
    return float(max(np.abs(k - k2).max(), np.abs(v - v2).max()))
