"""CUDA graphs: capture a step's launches once per shape, replay them with one launch.

At decode sizes a CuPy launch costs the host 5-20 us of Python and driver time and the GPU about as much
work, so a step of hundreds of small launches runs at the host's pace. A CUDA graph is a recording of the
work a stream was given (kernels, their arguments, device-to-device copies); cudaGraphLaunch replays all of
it with one call, and the GPU runs it back to back. (LightLLM and vLLM capture their decode and verify
steps this way, one graph per batch size; vLLM splits the forward at attention, "piecewise" graphs.)

What a graph captures, and so what must be static for a replay to be right:
    addresses  every kernel argument that is a pointer is baked in: inputs must be copied INTO the graph's
               own input buffers before each launch, outputs read from its own output buffers (GraphedCall
               keeps both per key); an array the code rebinds after capture is not the one the graph reads
    values     every scalar argument is baked in: a length, an offset, a position the host passed at capture
               is the graph's forever. So T = k + 1 (rows of the verify pass) is part of the key, and a
               kernel whose work depends on a cache length must read it from device memory (or the length
               is bucketed into the key and the kernel masks past the real length)
    shapes     a CuPy call sizes its launch from the shapes: the key holds every input's shape and dtype
    memory     intermediates allocated during capture are written by every replay: they must stay the
               graph's. CuPy's pool would hand a freed block to other work, so the capture allocates from a
               pool of its own (cupy.cuda.MemoryPool, kept with the graph and allocated from by no other live
               graph; PyTorch's graphs keep a private pool for the same reason). An evicted graph's pool is
               kept for the next capture rather than freed (freeing it would wait for the whole device)
    no host    a sync (int(), asnumpy, a boolean mask) or an upload inside a capture is an error: captured
               work does not run during capture, and a host copy would bake in a staging buffer
How it is used: a key (the inputs' shapes) is first run eagerly once (compiles the kernels, warms the pool),
then captured on a side stream (CUDA cannot capture the legacy default stream), then launched on the
current stream (so it runs in order with the eager work around it) on every later call. A function that
cannot be captured (it syncs, say) raises during capture: the key is marked and runs as plain launches from
then on (the fallback), as does every call with graphs off. A fallback is never silent: it warns once per key
(GraphCaptureWarning, with the reason), and stats() counts what was captured, what failed and how many calls
were replays; the owner passes the counts on (DeviceGreedyRule.graph_counts -> Placement.graph_counts -> the
"graphs" entry of `bench --json`), so a GPU run whose captures all fail says so instead of only running slower.

What a graph bakes in cannot be seen by comparing tokens, so tests re-run fn at each replay: check (a
constructor argument, None on a GPU) is called with the graph and a function that runs fn again on the
graph's inputs; the fake CuPy's check_replay (tests/fake_cupy.py) runs it and raises if any launch now gets
a host scalar (a length, a position, an offset, an eps) other than the one the capture recorded.

Captured today (two users, each its own GraphedCall; Placement.graph_counts reports both, by_use):
    rule     the greedy rule of a verify step or a decode step (cuda_accept.greedy_run: argmax per row, compare,
             kept prefix, gather; about 10 launches -> 1, plus the copies into its inputs), one graph per (T, N, k)
    forward  the trunk's forward pass (fast/cuda_pass.py, issue 35 item 5): every layer reads positions, rope
             angles, KV rows and attention's lengths and tables from the pass's row map (rowmap.py), uploaded
             once into a buffer kept per map size; the KV rows are claimed on the host first, the conv window,
             the scan's memory and the KV rows are written in place, so the layer loop changes nothing on the
             host and replays right. One graph per (map size, bounds, logits, the states' arrays), the MTP
             head's passes too (a new state's pass of a shape already run is captured at its first call); through the fake, a plain decode step went from 161 launches to 5, a greedy MTP
             step of k = 3 from 315 to 97 (tests/test_cuda_pass.py)
Not captured (each runs as plain launches, correct): a draft model's passes in a pool (its caches are a view of
the pool with block ids per layer, paged.ViewTable; alone, its passes are captured); a pass whose ring replays
(state.ReplayRing swaps its buffers); a chunked prefill; the sampled rule (the laws go to the host).
tests/test_cuda_syncs.py runs graphs on and off through the fake CuPy's capture emulation (tests/fake_cupy.py):
the same tokens, the verify shape captured and none failed, no sync inside a capture, and every replay checked
for a changed host scalar. What it cannot tell: the time saved, and whether a real card captures (on a GPU:
tools/gpu_check.py and tests/test_backends.py::test_cuda_greedy_rule_graphs_are_captured).
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable


class GraphCaptureWarning(RuntimeWarning):
    """A shape whose function could not be captured: it runs as plain launches (correct, slower)."""


@dataclass
class _Entry:
    graph: object  # cupy.cuda.Graph
    inputs: tuple  # the graph's input buffers: each call's inputs are copied into these
    outputs: object  # the graph's output buffers (an array or a tuple of them), overwritten by each launch
    pool: object  # the memory pool its intermediates came from (kept alive with the graph)
    keep: tuple = ()  # the arrays whose addresses the graph baked in (a pass's states): alive while it lives


class GraphedCall:
    """fn(*inputs) -> array(s), replayed from a CUDA graph captured once per the inputs' shapes and dtypes.

    fn must compute on device arrays only, take every length from its inputs' shapes, and never bring a value
    to the host (module docstring). enabled=False: plain launches always (graphs off). The outputs returned
    are the graph's own buffers: read (or copy) them before the next call with the same key.
    check: None, or check(graph, rerun) called before each replay, rerun() running fn on the graph's inputs
    again (tests pass fake_cupy.check_replay: a host scalar that changed since the capture raises).
    run(key, fn, inputs, keep) is the general form: a caller's own key (what fn bakes in beyond the inputs'
    shapes) and function (fast/cuda_pass.py: a forward pass over given states). max_graphs: how many graphs
    are kept (the least recently launched one goes first; None: all)."""

    def __init__(self, fn: Callable | None, cp, enabled: bool = True, check: Callable | None = None,
                 max_graphs: int | None = None):
        self.fn, self.cp, self.enabled, self.check, self.max_graphs = fn, cp, enabled, check, max_graphs
        self.graphs: OrderedDict[tuple, _Entry] = OrderedDict()  # least recently launched first
        self.eager: OrderedDict[tuple, None] = OrderedDict()  # keys seen once (or failed): plain launches; with
        # max_graphs, the newest 4 * max_graphs only (a server's states come and go: each is a key seen once)
        self.failed: dict[tuple, str] = {}  # key -> why it could not be captured (the fallback's reason)
        self.replays = self.plain = 0  # calls answered by a graph launch (the capturing call's included) / by
        # plain launches (warm-ups, fallbacks)
        self.evicted = 0  # graphs dropped to stay within max_graphs
        self.spare_pools: list = []  # the pools of evicted graphs, for the next captures (below)
        self.pools_made = 0
        self.stream = None  # the side stream every capture runs on (made at the first)

    def stats(self) -> dict:
        """{captured, failed, replays, plain, evicted, pools (memory pools made: evicted graphs' are reused): counts;
        shapes: the captured keys; reasons: {key: why it failed}}, keys as text (((T, N), dtype), ((k,), dtype)):
        what a report carries."""
        return {"captured": len(self.graphs) + self.evicted, "failed": len(self.failed), "replays": self.replays,
                "plain": self.plain, "evicted": self.evicted, "pools": self.pools_made,
                "shapes": [str(k) for k in self.graphs],
                "reasons": {str(k): why for k, why in self.failed.items()}}

    def __call__(self, *inputs):
        if not self.enabled:
            return self.fn(*inputs)
        return self.run(tuple((a.shape, str(a.dtype)) for a in inputs), self.fn, inputs)

    def run(self, key: tuple, fn: Callable, inputs: tuple = (), keep: tuple = (), warm: tuple | None = None):
        """fn(*inputs), from the graph of `key` once it is captured (the second call of a key captures it, the first
        runs plainly: it compiles and warms the pool). keep: objects the graph's addresses belong to, held with it.
        warm: a coarser key whose first plain run warms every key under it (the same shapes, so the same kernels:
        fast/cuda_pass.py passes its key without the states' arrays), so a new state's pass is captured at once."""
        if not self.enabled:
            return fn(*inputs)
        entry = self.graphs.get(key)
        if entry is None:
            seen = key in self.eager or (warm is not None and warm in self.eager)
            if key in self.failed or not seen:  # first call of a key: warm up eagerly
                for k in (key,) if warm is None else (key, warm):
                    self.eager[k] = None
                while self.max_graphs is not None and len(self.eager) > 4 * self.max_graphs:
                    self.eager.popitem(last=False)
                self.plain += 1
                return fn(*inputs)
            entry = self._capture(key, fn, inputs, keep)
            if entry is None:
                self.plain += 1
                return fn(*inputs)
        self.graphs.move_to_end(key)
        for static, a in zip(entry.inputs, inputs):  # device-to-device copies into the graph's inputs
            static[...] = a
        if self.check is not None:
            self.check(entry.graph, lambda: fn(*entry.inputs))
        entry.graph.launch(self.cp.cuda.get_current_stream())
        self.replays += 1
        return entry.outputs

    def _pool(self):
        """A memory pool for a new graph: an evicted graph's, else a new one. An evicted graph's pool is not dropped:
        dropping it frees its blocks (cudaFree, which waits for the whole device), and its memory, no graph's any
        more, serves the next capture's intermediates without a cudaMalloc each."""
        if self.spare_pools:
            return self.spare_pools.pop()
        self.pools_made += 1
        return self.cp.cuda.MemoryPool()

    def _capture(self, key, fn, inputs, keep) -> _Entry | None:
        cp = self.cp
        pool = self._pool()
        with cp.cuda.using_allocator(pool.malloc):
            static = tuple(cp.empty(a.shape, a.dtype) for a in inputs)
        for s, a in zip(static, inputs):
            s[...] = a
        if self.stream is None:  # one side stream for every capture (a stream is a driver object: made once)
            self.stream = cp.cuda.Stream(non_blocking=True)
        stream = self.stream
        try:
            with stream, cp.cuda.using_allocator(pool.malloc):
                stream.begin_capture()
                try:
                    outputs = fn(*static)
                finally:
                    graph = stream.end_capture()
        except Exception as exc:  # a sync or a host copy inside fn: plain launches for this key from now on
            self.spare_pools.append(pool)
            why = self.failed[key] = f"{type(exc).__name__}: {exc}"
            warnings.warn(f"CUDA graph capture of {fn!r} failed for {key}: {why}; that key runs as plain "
                          "launches from now on", GraphCaptureWarning, stacklevel=3)
            return None
        entry = self.graphs[key] = _Entry(graph, static, outputs, pool, tuple(keep))
        if self.max_graphs is not None and len(self.graphs) > self.max_graphs:
            _, old = self.graphs.popitem(last=False)  # the least recently launched graph and what it kept
            self.spare_pools.append(old.pool)  # its arrays go back to its pool as they are dropped: the pool stays
            self.evicted += 1
        return entry


def merged_counts(**calls: GraphedCall) -> dict:
    """Several GraphedCalls' stats() as one report: the counts summed, the shapes and reasons joined, and each
    call's own stats under "by_use", by the name it was given (e.g. rule=..., forward=...)."""
    each = {name: call.stats() for name, call in calls.items()}
    out = {k: sum(s[k] for s in each.values()) for k in ("captured", "failed", "replays", "plain", "evicted", "pools")}
    out["shapes"] = [k for s in each.values() for k in s["shapes"]]
    out["reasons"] = {k: v for s in each.values() for k, v in s["reasons"].items()}
    out["by_use"] = each
    return out
