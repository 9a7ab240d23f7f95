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
               pool of its own (cupy.cuda.MemoryPool, kept with the graph and never allocated from again;
               PyTorch's graphs keep a private pool for the same reason)
    no host    a sync (int(), asnumpy, a boolean mask) or an upload inside a capture is an error: captured
               work does not run during capture, and a host copy would bake in a staging buffer
How it is used: a key (the inputs' shapes) is first run eagerly once (compiles the kernels, warms the pool),
then captured on a side stream (CUDA cannot capture the legacy default stream), then launched on the
current stream (so it runs in order with the eager work around it) on every later call. A function that
cannot be captured (it syncs, say) raises during capture: the key is marked and runs as plain launches from
then on (the fallback), as does every call with graphs off. A fallback is never silent: it warns once per key
(GraphCaptureWarning, with the reason), and stats() counts what was captured, what failed and how many calls
were replays; the owner passes the counts on (DeviceGreedyRule.graph_counts -> Kernels.graph_counts -> the
"graphs" entry of `bench --json`), so a GPU run whose captures all fail says so instead of only running slower.

What a graph bakes in cannot be seen by comparing tokens, so tests re-run fn at each replay: check (a
constructor argument, None on a GPU) is called with the graph and a function that runs fn again on the
graph's inputs; the fake CuPy's check_replay (tests/fake_cupy.py) runs it and raises if any launch now gets
a host scalar (a length, a position, an offset, an eps) other than the one the capture recorded.

Captured today: the greedy rule of a verify step or a decode step (cuda_accept.greedy_run: argmax per row,
compare, kept prefix, gather; about 10 launches -> 1, plus the copies into its inputs), one graph per
(T, N, k). Not captured yet, and what it needs (the trunk forward, where the launches are):
    attention  the kernel reads every length and block table from device memory (cuda_attention.attend_rows:
               a captured launch replays with the new lengths copied into its row map, and no host scalar it
               baked in changes: tests/test_cuda_attention.py, and on a GPU tests/test_cuda_ops.py). Still
               missing for a whole-pass graph: the layer calls the host forms, which build and upload the row
               map on every call (an upload cannot be captured) -> the pass keeps one device map per key (R, B,
               number of block ids) and copies the step's map in before the launch, for all attention layers at
               once (one table per sequence); the KV append writes at host offsets (state.KVCache slices by a
               Python int, paged.PagedKVCache indexes with host arrays: uploads) -> an append kernel reading
               positions and block rows from that map; rope positions come from the host -> from the same map
    GDN conv   nothing left: the window is now written in place (gdn.causal_conv's out, the ring view's conv_out)
    embedding  host ids are checked on the host and uploaded (a copy a graph cannot hold) -> ids in a static
               device buffer, checked on the host before they are copied in; device ids (a drafter's argmax,
               model.embed_rows) are gathered unchecked already, with no sync
    MoE        the router's choices come to the host (a sync) -> a graph per expert grouping, or none
tests/test_cuda_syncs.py runs graphs on and off through the fake CuPy's capture emulation (tests/fake_cupy.py):
the same tokens, the verify shape captured and none failed, no sync inside a capture, and every replay checked
for a changed host scalar. What it cannot tell: the time saved, and whether a real card captures (on a GPU:
tools/gpu_check.py and tests/test_backends.py::test_cuda_greedy_rule_graphs_are_captured).
"""

from __future__ import annotations

import warnings
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


class GraphedCall:
    """fn(*inputs) -> array(s), replayed from a CUDA graph captured once per the inputs' shapes and dtypes.

    fn must compute on device arrays only, take every length from its inputs' shapes, and never bring a value
    to the host (module docstring). enabled=False: plain launches always (graphs off). The outputs returned
    are the graph's own buffers: read (or copy) them before the next call with the same key.
    check: None, or check(graph, rerun) called before each replay, rerun() running fn on the graph's inputs
    again (tests pass fake_cupy.check_replay: a host scalar that changed since the capture raises)."""

    def __init__(self, fn: Callable, cp, enabled: bool = True, check: Callable | None = None):
        self.fn, self.cp, self.enabled, self.check = fn, cp, enabled, check
        self.graphs: dict[tuple, _Entry] = {}
        self.eager: set[tuple] = set()  # keys that failed to capture, or were seen once: plain launches
        self.failed: dict[tuple, str] = {}  # key -> why it could not be captured (the fallback's reason)
        self.replays = self.plain = 0  # calls answered by a graph launch (the capturing call's included) / by
        # plain launches (warm-ups, fallbacks)

    def stats(self) -> dict:
        """{captured, failed, replays, plain: counts; shapes: the captured keys; reasons: {key: why it failed}}, keys
        as text (((T, N), dtype), ((k,), dtype)): what a report carries."""
        return {"captured": len(self.graphs), "failed": len(self.failed), "replays": self.replays,
                "plain": self.plain, "shapes": [str(k) for k in self.graphs],
                "reasons": {str(k): why for k, why in self.failed.items()}}

    def __call__(self, *inputs):
        if not self.enabled:
            return self.fn(*inputs)
        key = tuple((a.shape, str(a.dtype)) for a in inputs)
        entry = self.graphs.get(key)
        if entry is None:
            if key in self.failed or key not in self.eager:  # first call of a shape: warm up eagerly
                self.eager.add(key)
                self.plain += 1
                return self.fn(*inputs)
            entry = self._capture(key, inputs)
            if entry is None:
                self.plain += 1
                return self.fn(*inputs)
        for static, a in zip(entry.inputs, inputs):  # device-to-device copies into the graph's inputs
            static[...] = a
        if self.check is not None:
            self.check(entry.graph, lambda: self.fn(*entry.inputs))
        entry.graph.launch(self.cp.cuda.get_current_stream())
        self.replays += 1
        return entry.outputs

    def _capture(self, key, inputs) -> _Entry | None:
        cp = self.cp
        pool = cp.cuda.MemoryPool()
        with cp.cuda.using_allocator(pool.malloc):
            static = tuple(cp.empty(a.shape, a.dtype) for a in inputs)
        for s, a in zip(static, inputs):
            s[...] = a
        stream = cp.cuda.Stream(non_blocking=True)
        try:
            with stream, cp.cuda.using_allocator(pool.malloc):
                stream.begin_capture()
                try:
                    outputs = self.fn(*static)
                finally:
                    graph = stream.end_capture()
        except Exception as exc:  # a sync or a host copy inside fn: plain launches for this key from now on
            why = self.failed[key] = f"{type(exc).__name__}: {exc}"
            warnings.warn(f"CUDA graph capture of {self.fn!r} failed for inputs {key}: {why}; that shape runs as plain "
                          "launches from now on", GraphCaptureWarning, stacklevel=3)
            return None
        entry = self.graphs[key] = _Entry(graph, static, outputs, pool)
        return entry
