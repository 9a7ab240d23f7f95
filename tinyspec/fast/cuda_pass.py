"""The whole forward pass on the GPU from one row map, replayed from a CUDA graph: the cuda backend's
Placement.device_pass.

A forward pass is hundreds of launches (the tests' 4-layer model: 161 a decode step, counted through the fake by
tools/count_cuda_steps.py; the 0.8B shape has 24 layers of projections, norms, the conv, the scan, attention and
the FFN), and each attention layer would otherwise upload its own positions, rope angles and row map. At decode
sizes the host's Python and driver time per launch, not the GPU, sets the pace. So a pass is split in two, the
host's part first:

    host    the host ids come checked (model.checked_ids); claim the KV rows the pass writes (rowmap.claim: room
            made, blocks reserved, each cache's n advanced) and build the pass's row map (rowmap.pack: ids, KV
            rows, attention's map, rope's angles), both rowmap.plan; upload it in ONE copy into a buffer kept per
            map size; copy a drafter's device ids in, device to device
    device  Model.layers_pass(embedding rows of rows.ids, ..., rows): every layer reads the map, writes the
            states in place (the scan's memory, the conv window, the KV rows at rows.dest, the ring's per-token
            states) and changes nothing on the host

The device part is then a function of device memory only, so it is captured once per key and replayed with one
launch (cuda_graphs.GraphedCall.run). The key holds everything a graph bakes in:

    the map's sizes         R rows, B sequences, the rope width, the table room (a power of two: rowmap.room_for)
    the bounds              where each sequence's rows start (host slices inside the layers)
    logits                  whether the output projection runs
    the arrays' identities  every state array the pass reads or writes (GDN windows and memories, KV caches or
                            pool arrays, the rings' snapshot buffers): a cache that grows gets new arrays, so a
                            new key (the "cache-length bucket": a contiguous cache doubles); the graph holds
                            them (keep), so no identity is reused while it lives

A new state's pass of a shape already run is captured at its first call (the shape, the key without the arrays,
warms every key under it: the kernels are compiled), a pass of more than MAX_GRAPH_ROWS rows (a prefill) is never
captured, and graphs are kept for the last MAX_GRAPHS keys. What keeps the keys few in a server: a slot's state
is made once and reset in place for each sequence it holds (scheduler.Scheduler._fresh_state, ModelState.reset),
so its arrays, and the graphs keyed by them, outlive its sequences; and the MTP head pads the one pass whose rows
vary step to step (a drafting's first: the kept tokens and the pending one) to k + 2 rows (Placement.pad_rows,
mtp.HeadPass.filler). `python tools/count_cuda_steps.py --serving` counts what a stream of requests captures.

One upload a drafting: the MTP head's passes 2..k of a greedy drafting feed one device id per sequence at positions
known before the first, so the first pass is told (`ahead`: per sequence its own rows and how many passes follow)
and their maps are packed with its own (rowmap.plan_ahead, their blocks reserved then) and uploaded together into
a staging buffer; each is copied, device to device, into its size's buffer when its pass comes (_announced: the
same caches, holding the positions and blocks it was made for; anything else, a drafting that stopped early, and
the pass plans and uploads its own map as before).
A pass whose rings replay (state.ReplayRing swaps its buffers each pass) runs the same device code without a
graph. Outputs (logits, hidden) are copied out of the graph's buffers, so a caller may keep them past the next
replay (the MTP drafter keeps hidden rows).

The MTP head's passes are device passes too (MTPHead.forward_batch hands its block and its one cache; the
hidden rows it reads are an input, copied into the graph's own buffer). What is not a device pass
(Placement.device_pass returns None, and the layers run the host path): a chunked prefill; several sequences each
with a cache of its own; another model's several layers in a pool (paged.ViewTable: ids per layer, a draft model
in the batch engine); a head too wide for the attention kernel (cuda_attention.MAX_GD).

NOT YET RUN ON A GPU: written on a machine without one. tests/test_cuda_pass.py runs it through the fake CuPy
(tests/fake_cupy.py), whose capture emulation replays the recorded work and, with check_replay, refuses a host
scalar that changed since the capture; tests/test_kernels_on_cpu.py runs the shipped model's greedy MTP speculation
through it with every kernel's CUDA source compiled for the CPU, graphs on: the oracle's tokens. On a GPU,
tools/gpu_check.py and tests/test_backends.py say whether it captures and what it saves.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import rowmap
from ..state import GDNState, KVCache, SnapshotRing
from .cuda_attention import MAX_GD, MAX_SHARED, shared_bytes
from .cuda_graphs import GraphedCall

MAX_GRAPHS = 64  # forward-pass graphs kept (the least recently replayed is dropped first)
MAX_GRAPH_ROWS = 64  # a pass of more rows (a prefill, a prefill chunk) runs plainly: its launches are a small part
# of its time, and a graph would keep its [R, N] logits and every intermediate in a pool of its own


def state_arrays(layers: list, rings: list) -> list:
    """Every device array a pass over these sequences' layer states reads or writes in place (what its graph bakes
    in): GDN windows and memories, KV caches or pool arrays, the rings' per-token buffers."""
    out = []
    for seq in layers:
        for layer in seq:
            if isinstance(layer, GDNState):
                out += [layer.conv, layer.ssm]
            elif isinstance(layer, KVCache):
                out += [layer.k, layer.v]
            else:  # a PagedKVCache: its layer's pool arrays
                out += list(layer.pools())
    for ring in rings:
        if ring is not None:
            out += [a for a in ring.conv + ring.ssm if a is not None]
    return out


def where_rows_go(cache) -> tuple:
    """What a map's KV rows of this cache were computed from: its block ids (a paged cache), or its arrays' capacity
    (a contiguous one)."""
    return (cache.k.shape[0],) if isinstance(cache, KVCache) else tuple(int(i) for i in cache.ids())


@dataclass
class _Ahead:
    """A one-row pass's map, uploaded with an earlier pass's into a staging buffer (DevicePasses._upload): for these
    caches (ids), each holding exactly `positions` and the blocks `blocks` when it runs."""

    caches: tuple
    positions: list
    blocks: list  # where_rows_go of each cache when the map was made
    layout: rowmap.PassMap
    staged: object  # its map in the staging buffer, copied into its size's buffer when its pass comes


@dataclass
class DevicePass:
    """One pass's device side: its row map in device memory (rows), and the key of its graph (None: no graph)."""

    passes: "DevicePasses"
    rows: rowmap.RowViews
    key: tuple | None
    keep: tuple
    shape: tuple | None = None  # the key without the arrays: a shape run once warms it for every state

    def run(self, fn: Callable, *inputs):
        """fn(rows, *inputs) -> (logits or None, hidden): computed, or replayed from the graph of the key and the
        inputs' shapes (inputs: device arrays, copied into the graph's own buffers; outputs copied out)."""
        if self.key is None:
            return fn(self.rows, *inputs)
        sizes = tuple((a.shape, str(a.dtype)) for a in inputs)
        out = self.passes.graphs.run(self.key + sizes, lambda *static: fn(self.rows, *static), inputs, keep=self.keep,
                                     warm=self.shape + sizes)
        return tuple(None if a is None else a.copy() for a in out)


class DevicePasses:
    """Placement.device_pass for CuPy (module docstring): (cfg, tokens, layers, bounds, rings, logits) -> a DevicePass,
    or None for the host path. graphs=False: the same device passes, never captured. check: GraphedCall's
    check (tests: fake_cupy.check_replay)."""

    def __init__(self, cp, graphs: bool = True, check: Callable | None = None, max_graphs: int | None = None):
        self.cp = cp
        self.graphs = GraphedCall(None, cp, enabled=graphs, check=check,
                                  max_graphs=MAX_GRAPHS if max_graphs is None else max_graphs)
        self.buffers: OrderedDict[rowmap.PassMap, object] = OrderedDict()  # a map's size -> its device buffer
        self.staging: OrderedDict[int, object] = OrderedDict()  # size -> a buffer several maps are uploaded into
        self.ahead: deque[_Ahead] = deque()  # the maps of the one-row passes announced to follow (uploaded already)

    def __call__(self, cfg, tokens: list, layers: list, bounds: np.ndarray, rings: list, logits: bool,
                 ahead: list | None = None):
        cp = self.cp
        G, d = cfg.n_head // cfg.n_head_kv, cfg.head_dim
        if shared_bytes(G, d) > MAX_SHARED or G * d > MAX_GD:
            return None  # the attention kernel declines this head: the host path's oracle computes it
        on_device = [isinstance(t, cp.ndarray) for t in tokens]
        layout = self._announced(layers, on_device, bounds)  # a pass whose map rode an earlier upload
        if layout is None:
            self.ahead.clear()
            layout = self._upload(cfg, tokens, on_device, layers, bounds, ahead)
            if layout is None:
                return None
        rows = layout.views(self._buffer(layout))
        for t, dev, lo, hi in zip(tokens, on_device, bounds[:-1], bounds[1:]):
            if dev:  # a drafter's argmax ids, where they were made: a device-to-device copy
                rows.ids[lo:hi] = t.reshape(-1)
        if not (self.graphs.enabled and layout.R <= MAX_GRAPH_ROWS
                and all(r is None or isinstance(r, SnapshotRing) for r in rings)):
            return DevicePass(self, rows, None, ())
        arrays = state_arrays(layers, rings)
        shape = (layout, tuple(int(b) for b in bounds), bool(logits))  # what the kernels are compiled for
        return DevicePass(self, rows, shape + (tuple(id(a) for a in arrays),), tuple(arrays), shape)

    def _upload(self, cfg, tokens, on_device, layers, bounds, ahead) -> rowmap.PassMap | None:
        """Claim this pass's KV rows and pack its map into its buffer in ONE upload -> its PassMap (None: no device
        pass). With `ahead`, the maps of the one-row passes that will follow (rowmap.plan_ahead) ride the same
        upload, into a staging buffer; each is copied into its own size's buffer, device to device, when its pass
        comes (_announced), so that every graph of a size still reads that size's one buffer."""
        cp = self.cp
        host_ids = np.concatenate([np.zeros(len(t), np.int64) if dev else t for t, dev in zip(tokens, on_device)])
        planned = rowmap.plan(cfg, host_ids, layers, bounds)  # the KV rows claimed on the host, the map packed
        if planned is None:
            return None
        layout, host = planned
        # the upload, on the current stream (CuPy refuses buf[...] = host: a non-scalar fill). Given a stream it is
        # cudaMemcpyAsync, which stages pageable memory at once; the plain cudaMemcpy of older CuPy's
        # set(stream=None) waits for the stream to drain first (CUDA's "API synchronization behavior")
        stream = cp.cuda.get_current_stream()
        if ahead is None or not any(then for _, then in ahead):
            self._buffer(layout).set(host, stream=stream)
            return layout
        caches = [seq[0] for seq in layers]
        # each sequence's next row goes where its own rows end (the rest of this pass's rows are filler)
        starts = [c.n - (hi - lo - own) for c, (own, _), lo, hi in zip(caches, ahead, bounds[:-1], bounds[1:])]
        maps = [(layout, host, [])] + rowmap.plan_ahead(cfg, caches, starts, [then for _, then in ahead])
        offsets = np.cumsum([0] + [m.size for m, _, _ in maps]).tolist()
        staging = self._staging(offsets[-1])
        staging.set(np.concatenate([h for _, h, _ in maps]), stream=stream)  # the drafting's one upload
        self._buffer(layout)[...] = staging[: offsets[1]]
        for j, ((m, _, seqs), lo, hi) in enumerate(zip(maps[1:], offsets[1:-1], offsets[2:]), start=1):
            mine = [caches[b] for b in seqs]
            self.ahead.append(_Ahead(tuple(id(c) for c in mine), [starts[b] + j - 1 for b in seqs],
                                     [where_rows_go(c) for c in mine], m, staging[lo:hi]))
        return layout

    def _announced(self, layers, on_device, bounds) -> rowmap.PassMap | None:
        """The next announced map, if this is its pass: the same caches in the same order, each holding exactly the
        positions and blocks the map was made for, one device id each. Its rows are claimed here (the blocks were
        reserved when it was made) and its map copied into its size's buffer -> its PassMap, or None."""
        if not self.ahead or not all(on_device) or np.any(np.diff(bounds) != 1):
            return None
        nxt = self.ahead[0]
        caches = [seq[0] if len(seq) == 1 else None for seq in layers]
        if tuple(id(c) for c in caches) != nxt.caches or [c.n for c in caches] != nxt.positions \
                or [where_rows_go(c) for c in caches] != nxt.blocks:  # (a block given back and taken again: stale)
            return None
        self.ahead.popleft()
        for c in caches:
            c.claim(1)
        self._buffer(nxt.layout)[...] = nxt.staged  # device to device, in stream order before the pass
        return nxt.layout

    def _buffer(self, layout: rowmap.PassMap):
        """The device buffer of maps of this size (one per size: the passes run in stream order, each copying its
        map in before it runs, so every graph of that size reads the one buffer)."""
        buf = self.buffers.get(layout)
        if buf is None:
            buf = self.buffers[layout] = self.cp.zeros(layout.size, np.int32)
        return buf

    def _staging(self, size: int):
        """A device buffer of `size` int32 that a drafting's maps are uploaded into together (one per size: its
        contents are copied out before the next upload into it, in stream order)."""
        buf = self.staging.get(size)
        if buf is None:
            buf = self.staging[size] = self.cp.zeros(size, np.int32)
        return buf

    def graph_counts(self) -> dict:
        """The forward passes' CUDA graphs (GraphedCall.stats)."""
        return self.graphs.stats()
