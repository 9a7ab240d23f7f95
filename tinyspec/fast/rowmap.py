"""A pass's row map: where every row of one forward pass sits, packed in ONE int32 array (a device pass's host part).

A backend that computes on a device needs each row's position (rope), the cache row its key and value go to (the
KV append) and what each row may attend to (attention's lengths and block tables). Made on the host per layer,
those are uploads in every attention layer; and a CUDA graph cannot hold an upload, and bakes in every host
number a launch was given. So a device pass (Placement.device_pass) builds them ONCE, on the host, here, and
uploads them in one copy into a buffer the whole pass reads: every layer, and every replay of a graph of it
(then only the buffer's contents change from pass to pass; fast/cuda_pass.py).

For B sequences and R rows (sequence b: rows bounds[b] .. bounds[b+1]-1, row r at position
p = n_past[b] + r - bounds[b]), the layout of the array, in this order:

    ids     [R]          the token each row feeds: host ids, checked before the pass (model.checked_ids); a
                         drafter's device ids are copied in by the backend, where they are
    dest    [R]          where row r's key and value go in its layer's pool seen flat [n_blocks * bs, H_kv, d]:
                         tables[tab0[b] + p // bs] * bs + p % bs (bs: the block size; a contiguous cache is one
                         block as long as its capacity)
    seq     [R]          the sequence of each row                       \\
    row0    [B]          where each sequence's rows start (bounds[:-1])   | attention's map: the attention kernel
    n_past  [B]          positions each sequence held before the pass     | (attention.attend_rows) reads each
    tab0    [B]          where each sequence's block ids start in tables  | row's keys through it
    tables  [room]       every sequence's used block ids, then zeros up to `room` (a power of two: the buffer
                         keeps its size while the sequences grow, so a graph keyed by it is captured again only
                         when the room doubles)                        /
    cos     [R, half]    rope's cos and sin at each row's position (ops.rope_angles: the oracle's numbers), as
    sin     [R, half]    float32 bits (half = n_rot / 2); a view of the buffer as float32 reads them back

views(buf) cuts any such buffer (host or device) into these arrays without a copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..ops import rope_angles
from ..paged import BlockTable, PagedKVCache
from ..state import KVCache


def row_map(tables, n_pasts, bounds, block_size: int, n_blocks: int) -> tuple[np.ndarray, int, int]:
    """The ragged call's row map, checked, as ONE host int32 array (one upload):
    [seq (R) | row0 (B) | n_past (B) | tab0 (B) | tables (the used block ids of every sequence, concatenated)].
    Sequence b's rows are bounds[b] .. bounds[b+1]-1; only its first ceil((n_past + T_b) / block_size) ids are
    kept (the kernel reads no others). -> (map, R, B)."""
    B = len(tables)
    bounds = np.asarray(bounds, dtype=np.int64)
    if len(n_pasts) != B or bounds.shape != (B + 1,) or bounds[0] != 0 or np.any(np.diff(bounds) < 0):
        raise ValueError(f"bounds {bounds.tolist()} and {len(n_pasts)} n_past do not cut rows into {B} sequences")
    if n_blocks * block_size >= 2**31:
        raise ValueError(f"a pool of {n_blocks} blocks of {block_size} rows is too large for int32 row ids")
    R, used, ids = int(bounds[-1]), [], []
    for b, (table, n_past) in enumerate(zip(tables, n_pasts)):
        if int(n_past) != n_past or n_past < 0:
            raise ValueError(f"n_past {n_past}: expected an integer >= 0")
        n = int(n_past) + int(bounds[b + 1] - bounds[b])  # positions the sequence holds after its rows
        table = np.asarray(table)
        if table.ndim != 1 or not (table.dtype.kind in "iu" or table.size == 0):
            raise ValueError(f"table {table.dtype} {table.shape}: expected a 1-D array of integer block ids")
        need = -(-n // block_size)
        if table.shape[0] < need:
            raise ValueError(f"table too short: {table.shape[0]} block ids for {n} positions of block size "
                             f"{block_size} (need {need})")
        part = table[:need].astype(np.int64)
        if need and (part.min() < 0 or part.max() >= n_blocks):
            bad = part[(part < 0) | (part >= n_blocks)][0]
            raise ValueError(f"table: block id {bad} out of range for a pool of {n_blocks} blocks")
        used.append(need)
        ids.append(part)
    seq = np.repeat(np.arange(B), np.diff(bounds))  # [R] the sequence of each row
    tab0 = np.concatenate([[0], np.cumsum(used)[:-1]]) if B else np.zeros(0, np.int64)
    parts = [seq, bounds[:-1], np.asarray(n_pasts, np.int64).reshape(B), tab0, *ids]
    return np.concatenate([np.asarray(a, np.int64) for a in parts]).astype(np.int32), R, B


def split(rows, R: int, B: int) -> tuple:
    """A row map (host or device) -> its views (seq, row0, n_past, tab0, tables): no copy."""
    return rows[:R], rows[R:R + B], rows[R + B:R + 2 * B], rows[R + 2 * B:R + 3 * B], rows[R + 3 * B:]


def room_for(n_ids: int) -> int:
    """The table room a pass reserves for n_ids block ids: the next power of two, at least 8."""
    return max(8, 1 << max(0, n_ids - 1).bit_length())


class RowViews(NamedTuple):
    """The arrays of a pass's map (module docstring), views of one buffer wherever it lives."""

    ids: np.ndarray
    dest: np.ndarray
    seq: np.ndarray
    row0: np.ndarray
    n_past: np.ndarray
    tab0: np.ndarray
    tables: np.ndarray
    cos: np.ndarray  # [R, half] float32
    sin: np.ndarray

    @property
    def attention(self) -> tuple:
        """(seq, row0, n_past, tab0, tables): the attention kernel's arguments."""
        return self.seq, self.row0, self.n_past, self.tab0, self.tables


@dataclass(frozen=True)
class PassMap:
    """The sizes of a pass's map: R rows, B sequences, `half` rope pairs, `room` block ids. Everything else in it
    is contents (what a replay may change)."""

    R: int
    B: int
    half: int
    room: int

    @property
    def size(self) -> int:  # int32 entries
        return 3 * self.R + 3 * self.B + self.room + 2 * self.R * self.half

    def views(self, buf) -> RowViews:
        """buf [size] int32 (host or device) -> its RowViews, no copy."""
        R, B, h = self.R, self.B, self.half
        cuts = np.cumsum([0, R, R, R, B, B, B, self.room, R * h, R * h])
        ids, dest, seq, row0, n_past, tab0, tables, cos, sin = (buf[lo:hi] for lo, hi in zip(cuts[:-1], cuts[1:]))
        return RowViews(ids, dest, seq, row0, n_past, tab0, tables, cos.view(np.float32).reshape(R, h),
                        sin.view(np.float32).reshape(R, h))


def pack(ids: np.ndarray, tables: list, n_pasts: list, bounds: np.ndarray, block_size: int, n_blocks: int,
         n_rot: int, rope_base: float, room: int | None = None) -> tuple[PassMap, np.ndarray]:
    """One pass's map as a host int32 array (module docstring), checked (row_map's checks: every position a row
    may read lies in its table, every block id in the pool). ids [R]: the host ids (0 where the backend copies
    device ids in). room: the table room (default room_for the ids used). -> (PassMap, [size] int32)."""
    attn, R, B = row_map(tables, n_pasts, bounds, block_size, n_blocks)  # [seq | row0 | n_past | tab0 | used ids]
    seq, row0, n_past, tab0, used = split(attn, R, B)
    room = room_for(used.size) if room is None else room
    if used.size > room:
        raise ValueError(f"{used.size} block ids do not fit a table room of {room}")
    r = np.arange(R)
    pos = n_past[seq].astype(np.int64) + r - row0[seq]  # [R] each row's position in its sequence
    dest = used[tab0[seq] + pos // block_size].astype(np.int64) * block_size + pos % block_size  # [R]
    cos, sin = rope_angles(pos, n_rot, rope_base)  # [R, half] each, the oracle's
    layout = PassMap(R, B, n_rot // 2, room)
    buf = np.zeros(layout.size, np.int32)
    v = layout.views(buf)
    v.ids[:] = np.asarray(ids).reshape(R)
    v.dest[:], v.seq[:], v.row0[:], v.n_past[:], v.tab0[:] = dest, seq, row0, n_past, tab0
    v.tables[: used.size] = used
    v.cos[:], v.sin[:] = cos, sin
    return layout, buf


def claim(layers: list, bounds: np.ndarray) -> tuple | None:
    """The KV rows a device pass will write, claimed on the host before it runs. layers[b]: sequence b's layer
    states (ModelState.layers: GDNState, KVCache or PagedKVCache; the MTP head's: its one cache), its rows
    bounds[b] .. bounds[b+1]-1. Every attention cache gets room (KVCache.claim, PagedKVCache.claim: blocks
    reserved and checked writable) and its n advanced, so the pass itself changes nothing on the host.
    -> (tables, n_pasts, block_size, n_blocks) for pack, or None, claiming nothing, when one map cannot say where
    every row goes. It can for one sequence whose caches are its own (one block: the capacity), and for sequences
    whose caches share one pool's arrays layer by layer through one table each: the pool's own model's
    (paged.BlockTable: the same ids for every layer) or another model's one attention layer (a paged.ViewTable
    of one layer: the MTP head's). Not for several sequences each with arrays of its own, nor a view of several
    layers (paged.ViewTable: ids per layer, a draft model's in a pool), nor caches whose lengths disagree."""
    caches = [[c for c in seq if isinstance(c, (KVCache, PagedKVCache))] for seq in layers]  # [B][L_attn]
    if not caches[0] or any(len(seq) != len(caches[0]) for seq in caches):
        return None
    flat = [c for seq in caches for c in seq]
    contiguous = all(type(c) is KVCache for c in flat) and len(layers) == 1
    paged = all(type(c) is PagedKVCache and (type(c.table) is BlockTable or len(c.table.ordinal) == 1)
                for c in flat) and all(PagedKVCache.one_pool(list(per_layer)) for per_layer in zip(*caches))
    n_pasts = [seq[0].n for seq in caches]
    if not (contiguous or paged) or any(c.n != n for seq, n in zip(caches, n_pasts) for c in seq):
        return None
    for seq, T in zip(caches, np.diff(bounds)):
        for c in seq:
            c.claim(int(T))
    tables, block_size, n_blocks = blocks_of([seq[0] for seq in caches])
    return tables, n_pasts, block_size, n_blocks


def blocks_of(caches: list) -> tuple[list, int, int]:
    """Where the rows of these caches (one per sequence, of one pool or one contiguous cache) live, as pack reads it:
    (each one's block ids, the block size, the pool's blocks); a contiguous cache is one block as long as its
    capacity."""
    first = caches[0]
    if type(first) is KVCache:
        return [np.zeros(1, np.int64)], first.k.shape[0], 1
    return [c.ids() for c in caches], first.table.block_size, first.k_pool.shape[0]


def plan_ahead(cfg, caches: list, starts: list[int], depths: list[int]) -> list[tuple[PassMap, np.ndarray, list]]:
    """The maps of the one-row passes that will follow a pass over these caches (an MTP drafting's depths 2..k),
    packed now so that they ride that pass's upload. caches[b]: sequence b's one attention cache, which will be fed
    one row a pass at positions starts[b], starts[b] + 1, ..., for depths[b] passes. The blocks (or the capacity)
    all of them write are reserved now, nothing is claimed: each pass claims its row when it runs, and its map is
    right if the cache then holds exactly the positions before it (fast/cuda_pass.py checks). Its ids are zeros
    (the drafts are device ids, copied in). -> per depth j = 1 .. max(depths): (its PassMap, its host int32 map,
    the sequences in it: those with depths[b] >= j)."""
    for c, start, depth in zip(caches, starts, depths):
        if type(c) is KVCache:
            c.reserve(start + depth)
        else:
            c.table.reserve(start + depth)
    out = []
    for j in range(1, max(depths, default=0) + 1):
        seqs = [b for b, depth in enumerate(depths) if depth >= j]
        tables, block_size, n_blocks = blocks_of([caches[b] for b in seqs])
        layout, host = pack(np.zeros(len(seqs), np.int64), tables, [starts[b] + j - 1 for b in seqs],
                            np.arange(len(seqs) + 1), block_size, n_blocks, cfg.n_rot, cfg.rope_base)
        out.append((layout, host, seqs))
    return out


@dataclass(frozen=True)
class MappedPass:
    """A device pass whose map stays where it was built (host_pass): run(fn, *inputs) is fn(rows, *inputs)."""

    rows: RowViews

    def run(self, fn, *inputs):
        return fn(self.rows, *inputs)


def plan(cfg, ids: np.ndarray, layers: list, bounds: np.ndarray) -> tuple[PassMap, np.ndarray] | None:
    """A device pass's host part: its KV rows claimed (claim) and its map packed (pack) for a model of `cfg` ->
    (PassMap, the host int32 array), or None, claiming nothing, where one map cannot say where every row goes.
    ids [R]: the host ids (0 where a backend copies device ids in)."""
    claimed = claim(layers, bounds)
    if claimed is None:
        return None
    tables, n_pasts, block_size, n_blocks = claimed
    return pack(ids, tables, n_pasts, bounds, block_size, n_blocks, cfg.n_rot, cfg.rope_base)


def host_pass(cfg, tokens: list, layers: list, bounds: np.ndarray, rings: list, logits: bool,
              ahead: list | None = None) -> MappedPass | None:
    """Placement.device_pass with the map built and read on the host: the same claim and map as the cuda backend's
    (fast/cuda_pass.py) without the upload or the graph. Its use: the oracle's layers run the device path's code
    (attention.attend_rows_own, the map's rope angles) and must give the host path's bits (tests/test_rowmap.py).
    tokens: host ids only (the oracle's device is the host). ahead: ignored (a map on the host is never uploaded)."""
    planned = plan(cfg, np.concatenate(tokens), layers, bounds)
    return None if planned is None else MappedPass(planned[0].views(planned[1]))
