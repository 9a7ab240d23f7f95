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

Does NOT include: swapping blocks to the host (a preempted sequence gives its blocks back and is recomputed,
speculate.Engine), sharing a partly filled block, quantized KV.
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
        shape = (self.n_blocks, self.block_size, cfg.n_head_kv, cfg.head_dim)
        # trunk layer i -> its key / value pool (None for GDN layers, which keep no KV)
        self.k = [None if r else xp.zeros(shape, np.float32) for r in cfg.recurrent]
        self.v = [None if r else xp.zeros(shape, np.float32) for r in cfg.recurrent]
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
        return 2 * sum(k[0].nbytes for k in self.k if k is not None)  # keys and values, every attention layer


class BlockTable:
    """One sequence's block ids in position order, and the count of positions it holds."""

    def __init__(self, pool: BlockPool):
        self.pool, self.blocks = pool, []
        self._ids = np.zeros(0, np.int64)  # self.blocks as an array, for the kernels (rebuilt on change only)

    def adopt(self, blocks: list[int]) -> None:
        """Start from full blocks a prefix cache found (a fresh table only): shared, never written."""
        if self.blocks:
            raise ValueError("only an empty block table can adopt a cached prefix")
        for block in blocks:
            self.pool.share(block)
        self.blocks = list(blocks)
        self._ids = np.array(self.blocks, np.int64)

    def reserve(self, n_positions: int) -> None:
        """Own enough blocks for n_positions (takes from the free list only at a block boundary)."""
        while len(self.blocks) * self.pool.block_size < n_positions:
            self.blocks.append(self.pool.take())
        if len(self._ids) != len(self.blocks):
            self._ids = np.array(self.blocks, np.int64)

    def check_writable(self, first: int, n_positions: int) -> None:
        """Positions first .. n_positions-1 are about to be written: raise if one lies in a shared or cached
        block (a bug: speculation's writes and rollbacks must stay in blocks this sequence alone owns)."""
        bs = self.pool.block_size
        for j in range(first // bs, self.pool.blocks_for(n_positions)):
            if not self.pool.writable(self.blocks[j]):
                raise RuntimeError(f"a write into block {self.blocks[j]}, which is shared or cached")

    def keep(self, n_positions: int) -> None:
        """Give back the tail blocks a sequence of n_positions no longer needs (a rollback, a finish: 0)."""
        n_blocks = self.pool.blocks_for(n_positions)
        if n_blocks < len(self.blocks):
            self.pool.give_back(self.blocks[n_blocks:])
            del self.blocks[n_blocks:]
            self._ids = np.array(self.blocks, np.int64)

    def ids(self) -> np.ndarray:  # [n_blocks] int64
        return self._ids


class PagedKVCache:
    """One attention layer's cache of one sequence, in the pool: state.KVCache's interface (n, append,
    truncate, attend, contents). `table` is shared with the sequence's other attention layers."""

    def __init__(self, pool: BlockPool, layer: int, table: BlockTable):
        if pool.k[layer] is None:
            raise ValueError(f"layer {layer} is a GDN layer: it keeps no KV")
        self.pool, self.layer, self.table = pool, layer, table
        self.n = 0  # positions filled

    def append(self, k: np.ndarray, v: np.ndarray) -> None:  # [T, H_kv, d] each
        T, bs = k.shape[0], self.pool.block_size
        self.table.reserve(self.n + T)
        self.table.check_writable(self.n, self.n + T)
        pos = np.arange(self.n, self.n + T)
        blocks, rows = self.table.ids()[pos // bs], pos % bs
        self.pool.k[self.layer][blocks, rows] = k
        self.pool.v[self.layer][blocks, rows] = v
        self.n += T

    def truncate(self, n: int) -> None:
        """Forget every position >= n; the table gives back the blocks past them (every layer of the
        sequence truncates to the same n, so whichever layer does it first frees the same blocks)."""
        if not 0 <= n <= self.n:
            raise ValueError(f"PagedKVCache.truncate({n}): cache holds {self.n} positions")
        self.n = n
        self.table.keep(n)

    def attend(self, kern, q: np.ndarray, n_past: int, scale: np.float32) -> np.ndarray:
        """kern.attend_paged over this layer's pool through the table (q [T, H_kv, G, d] -> [T, H_kv, G, d])."""
        return kern.attend_paged(q, self.pool.k[self.layer], self.pool.v[self.layer], self.table.ids(), n_past, scale)

    @staticmethod
    def one_pool(caches: list) -> bool:
        """Whether `caches` (one layer's, one per sequence) are all views of the same layer of one pool: then
        they attend in one call (attention.attend_paged_ragged), each through its own table."""
        first = caches[0]
        return all(isinstance(c, PagedKVCache) and c.pool is first.pool and c.layer == first.layer for c in caches)

    def contents(self) -> tuple[np.ndarray, np.ndarray]:
        """The keys and values of positions 0 .. n-1, gathered: [n, H_kv, d] each (tests compare them)."""
        bs, pos = self.pool.block_size, np.arange(self.n)
        blocks, rows = self.table.ids()[pos // bs], pos % bs
        return self.pool.k[self.layer][blocks, rows], self.pool.v[self.layer][blocks, rows]

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
