"""backends: the one place that picks how a model's weights are stored and multiplied.

    numpy   the oracle. Every weight is dequantized to float32 at load; linear() is one NumPy matvec per row.
    cpu     NumPy + Numba. Matmul weights of the types numba_ops.SUPPORTED lists (floats, Q4_0..Q8_0, Q2_K..Q6_K,
            every I-quant, MXFP4, NVFP4; only the ternary TQ types are expanded to float32 at load) stay in their
            GGUF bytes (memory-mapped) and are multiplied by the fused dequant-matmul kernels of
            tinyspec/fast/numba_ops.py (Q2_K..Q6_K and IQ4_XS weights in integer dot products with the
            activations rounded to Q8_K, Q8_0 / Q4_0 / Q5_0 / IQ4_NL weights with them rounded to Q8_0, as llama.cpp's
            CPU backend does: the oracle of that is ops.quant_linear_q8, not ops.quant_linear); the small
            tensors (norms, conv, ssm_a, biases) are float32 as in the oracle; the delta-rule scan and the
            short convolution are tinyspec/fast/numba_gdn.py's (bitwise the oracle's), attention
            fast/numba_attention.py's; a batch's sequences go through each of the three in one call (the
            ragged kernels). The row functions are fast/numba_rows.py's, and a layer's steps of small matmuls
            and row functions (the FFN block, a GDN layer's projections, recurrence and output, attention's
            projections, q/k norm and rope, output) one compiled call each (fast/numba_steps.py, the same bits
            as the separate calls). A model whose matmul weights are under fast/threads.py THREADS_FROM_BYTES
            multiplies every matrix on the calling thread (numba_ops.OneThread). The default on a machine
            without a GPU.
    cuda    CuPy + RawKernels (tinyspec/fast/cuda_ops.py) on a GPU, device-resident: the matmul weights in
            their GGUF bytes (K-quants and Q8_0 multiplied on tensor cores), every other tensor, the
            activations, the per-sequence state (GDN memory, KV caches) and the snapshot ring live on the
            device. The model code is the oracle's own: its NumPy calls dispatch to CuPy on CuPy arrays
            (NEP 18), the placement's xp (CuPy) allocates the state. The token ids go up (checked on the host,
            the embedding rows gathered on the device); a greedy step's logits and hidden rows stay on the
            device (Model.forward(to_host=False)), where the greedy rule runs and brings back two ints
            (fast/cuda_accept.py; tests/test_cuda_syncs.py counts the syncs per step). The
            delta-rule scan is cuda_ops.gdn_scan (writes the ring from registers); rollback is a
            device-to-device copy. The row functions (norms, gates) take one launch each
            (fast/cuda_rows.py), attention one launch per layer, every sequence of a pool together, its
            lengths and block tables read from device memory (fast/cuda_attention.py), and every weight is
            bound once (cuda_ops.bind): at decode sizes a launch costs Python time, not GPU time. A MoE
            layer routes and groups its rows on the device (fast/cuda_moe.py, Kernels.route_experts: no
            sync per layer) and multiplies every chosen expert of a projection in one grouped launch reading
            the device offsets (cuda_ops.bind_experts); an expert tensor of a type the kernels do not read
            is a PackedExperts over its float32 bytes. A forward pass (the trunk's, the MTP head's) is a
            device pass (fast/cuda_pass.py, Placement.device_pass): one row map uploaded, the KV rows claimed
            on the host, the layer loop replayed from a CUDA graph per shape and state.

A backend is three things, all built here and handed to the Model at construction (nothing is patched
into a model or a module afterwards):
    the weights   a matmul weight is either a float32 array (oracle) or a `PackedWeight`, which has
                  `.shape`, `.linear(x)` (ops.linear calls it) and `[ids]` (embedding rows);
    the kernels   a tinyspec.kernels.Kernels naming the functions the model computes with (cpu_kernels,
                  cuda_kernels below; the oracle's is kernels.NUMPY);
    the placement a tinyspec.placement.Placement saying where the numbers live: the array module, the
                  host/device copies, the device pass, the greedy rule, the rollback ring and the CUDA
                  graphs' counts (cpu_placement, cuda_placement below; the oracle's is placement.HOST).
Every backend keeps the engine's guarantee: the rows of a T-token pass are bitwise those of T one-token
passes (each kernel is batch-invariant on its own backend, tests/test_backends.py checks the whole model).

Pick one with `load_model(path, backend=...)`, `--backend` on the command line, or the TINYSPEC_BACKEND
environment variable (tests use it to run the same suite on another backend).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Callable

import numpy as np

from . import attention, ops
from .config import ModelConfig
from .gdn import gdn_scan_ragged
from .gguf import GGUFFile, read_gguf
from .kernels import Kernels
from .model import Model, load_tensors
from .placement import Placement
from .quants import GGMLType, dequantize

BACKENDS = ("numpy", "cpu", "cuda")
# matmul weights: what ops.linear multiplies (and token_embd, which is also gathered and may be the tied output)
LINEAR_SUFFIXES = ("attn_qkv.weight", "attn_gate.weight", "ssm_alpha.weight", "ssm_beta.weight", "ssm_out.weight",
                   "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "ffn_gate.weight",
                   "ffn_up.weight", "ffn_down.weight", "nextn.eh_proj.weight", "nextn.embed_tokens.weight",
                   "nextn.shared_head_head.weight", "ffn_gate_inp.weight", "ffn_gate_shexp.weight", "ffn_up_shexp.weight",
                   "ffn_down_shexp.weight")
PACKED_NAMES = ("token_embd.weight", "output.weight")
EXPERT_SUFFIXES = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")  # qwen35moe, 3-D


class BackendError(RuntimeError):
    pass


def cuda_available() -> bool:
    if importlib.util.find_spec("cupy") is None:
        return False
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no driver, no device: CuPy raises its own runtime errors
        return False


def numba_available() -> bool:
    return importlib.util.find_spec("numba") is not None


def default_backend() -> str:
    """TINYSPEC_BACKEND if set, else cuda with a GPU, else cpu with Numba, else numpy."""
    if env := os.environ.get("TINYSPEC_BACKEND"):
        return check(env)
    return "cuda" if cuda_available() else "cpu" if numba_available() else "numpy"


def first_run_compiles(backend: str) -> bool:
    """True when `backend` will compile its kernels on first use here (the cpu backend on a cold Numba cache:
    once, then cached on disk; docs/performance-log.md old 34 timed the pause), so a caller can say so before
    the wait."""
    if check(backend) != "cpu":
        return False
    from .fast import kernel_cache, numba_ops

    return kernel_cache.is_cold(numba_ops._quant_linear_q8_parallel)


def check(name: str) -> str:
    if name not in BACKENDS:
        raise BackendError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    if name == "cpu" and not numba_available():
        raise BackendError("the cpu backend needs numba (pip install numba)")
    if name == "cuda" and not cuda_available():
        raise BackendError("the cuda backend needs cupy and a CUDA GPU (pip install -e \".[cuda]\"); none found")
    return name


class PackedWeight:
    """An [out, in] weight kept as its GGUF bytes; a backend's weight kernels multiply it without expanding it.

    kernels: the weight kernels (numba_ops, CudaWeightKernels), anything with SUPPORTED (the ggml types it
    reads), bind(raw, type, shape, q8) -> linear(x) [T, in] -> [T, out] (the weight checked and planned
    once) and get_rows(raw, type, shape, ids) -> [n, in] float32 where the kernels compute (the host for
    numba_ops, the device for CUDA). ids: host ints, or on CUDA device ids that model.embed_rows vouches for
    (a drafter's argmax: in range by construction), gathered where they are, unchecked (no sync).
    """

    def __init__(self, raw: np.ndarray, ggml_type: GGMLType, shape: tuple[int, int], kernels):
        self.raw, self.ggml_type, self.shape, self.kernels = raw, GGMLType(ggml_type), tuple(shape), kernels
        self.nbytes = raw.nbytes
        # linear(x): [T, in] -> [T, out], the bound kernel itself (no method in between: a decode step makes
        # dozens of these calls). q8=True: K-quant weights multiply x rounded to Q8_K in integers, as llama.cpp's
        # CPU does (cpu only)
        self.linear = kernels.bind(raw, ggml_type, shape, q8=True)

    def __getitem__(self, ids) -> np.ndarray:  # embedding lookup: [n] host or device ids -> [n, in]
        return self.kernels.get_rows(self.raw, self.ggml_type, self.shape, ids)

    def dequantize(self) -> np.ndarray:
        return dequantize(self.raw, self.ggml_type, self.shape)

    def __repr__(self) -> str:
        return f"PackedWeight({self.ggml_type.name}, {self.shape})"


class PackedExperts:
    """A qwen35moe expert tensor [E, out, in] kept as its GGUF bytes (each expert's rows are whole blocks, stored
    one expert after the other). experts_linear(x, experts, offsets) multiplies rows grouped by expert, each
    expert's weights read once (moe.experts_linear is its oracle; offsets are host ints, or on the cuda backend
    a device [E + 1] from Kernels.route_experts, never read on the host); experts[e] is expert e's [out, in] weight as a
    PackedWeight over its slice of the bytes, bound when first used."""

    def __init__(self, raw: np.ndarray, ggml_type: GGMLType, shape: tuple[int, int, int], kernels):
        self.raw, self.ggml_type, self.shape, self.kernels = raw, GGMLType(ggml_type), tuple(shape), kernels
        self.nbytes, self._bound = raw.nbytes, {}
        self._grouped = kernels.bind_experts(raw, ggml_type, shape, q8=True)

    def experts_linear(self, x, experts: np.ndarray, offsets: np.ndarray):  # [P, in] grouped by expert -> [P, out]
        return self._grouped(x, experts, offsets)

    def __getitem__(self, e) -> PackedWeight:
        e = int(e)
        if e not in self._bound:
            per = self.raw.size // self.shape[0]  # bytes of one expert
            self._bound[e] = PackedWeight(self.raw[e * per : (e + 1) * per], self.ggml_type, self.shape[1:], self.kernels)
        return self._bound[e]

    def __repr__(self) -> str:
        return f"PackedExperts({self.ggml_type.name}, {self.shape})"


def bind_each_expert(bind: Callable, raw, ggml_type, shape: tuple[int, int, int], q8: bool, xp) -> Callable:
    """experts_linear (PackedExperts' contract) from weight kernels that bind one [out, in] weight at a time:
    each expert bound when first chosen, over its slice of the bytes, and run on its own rows (host groups;
    the oracles of tests/test_backends.py; the cpu backend's numba_ops.bind_experts runs every chosen expert in
    one kernel call, the cuda backend's cuda_ops.bind_experts in one launch)."""
    per, bound = raw.size // shape[0], {}

    def experts_linear(x, experts, offsets):  # x [P, in] where the kernels compute; experts, offsets host ints
        y = xp.empty((x.shape[0], shape[1]), dtype=np.float32)
        for i, e in enumerate(int(e) for e in experts):
            if e not in bound:
                bound[e] = bind(raw[e * per : (e + 1) * per], ggml_type, tuple(shape[1:]), q8)
            y[offsets[i] : offsets[i + 1]] = bound[e](x[offsets[i] : offsets[i + 1]])
        return y

    return experts_linear


def packed_tensors(g: GGUFFile, kernels, upload: Callable = lambda raw: raw,
                   progress: Callable[[int, int], None] | None = None) -> dict:
    """Matmul weights of a type `kernels` read -> PackedWeight over upload(bytes); every other tensor float32."""
    out = {}
    for i, (name, t) in enumerate(g.tensors.items()):
        packable = (name in PACKED_NAMES or name.endswith(LINEAR_SUFFIXES)) and len(t.shape) == 2
        if packable and t.ggml_type in kernels.SUPPORTED:
            out[name] = PackedWeight(upload(g.raw(name)), t.ggml_type, t.shape, kernels)
        elif name.endswith(EXPERT_SUFFIXES) and len(t.shape) == 3 and t.ggml_type in kernels.SUPPORTED:
            out[name] = PackedExperts(upload(g.raw(name)), t.ggml_type, t.shape, kernels)
        else:
            out[name] = dequantize(g.raw(name), t.ggml_type, t.shape)
        if progress:
            progress(i + 1, len(g.tensors))
    return out


def cpu_tensors(g: GGUFFile, progress: Callable[[int, int], None] | None = None) -> dict:
    """Packed weights are views of the memory map, multiplied by the Numba kernels: threaded above a size, or all on
    the calling thread for a model whose matmul weights are below threads.THREADS_FROM_BYTES (fast/threads.py)."""
    from .fast import numba_ops, threads

    threads.yield_when_idle()  # before the first parallel kernel: idle workers sleep, not spin (fast/threads.py)
    matmul_bytes = sum(t.nbytes for name, t in g.tensors.items()
                       if name in PACKED_NAMES or name.endswith(LINEAR_SUFFIXES + EXPERT_SUFFIXES))
    kernels = numba_ops if matmul_bytes >= threads.THREADS_FROM_BYTES else numba_ops.OneThread
    return packed_tensors(g, kernels, progress=progress)


class CudaWeightKernels:
    """bind / get_rows of tinyspec/fast/cuda_ops.py for PackedWeight; the weights live on the GPU (uploaded
    once). A bound linear answers where it was asked: a CuPy x stays on the device, a NumPy x (the
    draft-vocabulary scoring of a hidden row the engine holds) goes up and its result comes back. get_rows
    takes host ids (checked on the host and uploaded: no sync) and returns device rows, which the model
    computes with where they are; device ids (a greedy draft's argmax, model.embed_rows) are gathered where they
    are, unchecked: a check would be a sync, and an argmax over the rows' count is in range by construction."""

    def __init__(self):
        import cupy

        from .fast import cuda_ops

        self.cp, self.ops, self.SUPPORTED = cupy, cuda_ops, cuda_ops.SUPPORTED

    def bind(self, raw, ggml_type, shape, q8: bool = False):
        """quant_linear for one weight, validated and planned once (q8 is the cpu backend's; CUDA keeps float x)."""
        lin, cp = self.ops.bind(raw, ggml_type, shape), self.cp

        def linear(x):
            if isinstance(x, cp.ndarray):
                return lin(x)
            return cp.asnumpy(lin(cp.asarray(np.ascontiguousarray(x, dtype=np.float32))))

        return linear

    def bind_experts(self, raw, ggml_type, shape, q8: bool = False):
        """cuda_ops.bind_experts: every expert's rows in one grouped launch, offsets read on the device."""
        return self.ops.bind_experts(raw, ggml_type, shape)

    def get_rows(self, raw, ggml_type, shape, ids):
        if isinstance(ids, self.cp.ndarray):
            return self.ops.get_rows(raw, ggml_type, shape, ids, checked=False)
        return self.ops.get_rows(raw, ggml_type, shape, np.asarray(ids, dtype=np.int64))


def cuda_tensors(g: GGUFFile, progress: Callable[[int, int], None] | None = None) -> dict:
    """Every tensor on the GPU: packed weights in their GGUF bytes (multiplied by the CuPy kernels); a matmul
    weight of a type the kernels do not read (Q4_0, Q5_0, Q2_K, Q3_K, the I-quants, MXFP4) dequantized and
    packed as F32 (a PackedWeight, or for a 3-D expert tensor a PackedExperts: so ops.linear and
    moe.experts_linear still find the method they call); every other tensor as a float32 device array."""
    kernels = CudaWeightKernels()
    cp = kernels.cp
    out = packed_tensors(g, kernels, cp.asarray, progress)
    for name, t in out.items():
        if isinstance(t, (PackedWeight, PackedExperts)):
            continue
        packable = (name in PACKED_NAMES or name.endswith(LINEAR_SUFFIXES)) and t.ndim == 2
        experts = name.endswith(EXPERT_SUFFIXES) and t.ndim == 3
        if packable or experts:
            f32 = np.ascontiguousarray(t, dtype=np.float32)
            packed = PackedExperts if experts else PackedWeight
            out[name] = packed(cp.asarray(f32.view(np.uint8).reshape(-1)), GGMLType.F32, f32.shape, kernels)
        else:
            out[name] = cp.asarray(t)
    return out


def cuda_gdn_scan(q, k, v, log_decay, beta, state, states_out=None, out=None):
    """tinyspec.gdn.gdn_scan's contract on the device (cuda_ops.gdn_scan names its in-place output out_state)."""
    from .fast import cuda_ops

    return cuda_ops.gdn_scan(q, k, v, log_decay, beta, state, states_out=states_out, out_state=out)


def cuda_gdn_scan_ragged(q, k, v, log_decay, beta, bounds, states, states_outs=None, outs=None):
    """tinyspec.gdn.gdn_scan_ragged's contract on the device: the oracle's loop, one device scan per sequence."""
    return gdn_scan_ragged(q, k, v, log_decay, beta, bounds, states, states_outs, outs, scan=cuda_gdn_scan)


def cpu_kernels() -> Kernels:
    """The oracle's functions with Numba's attention, scan, conv, row functions and fused layer steps."""
    from .fast import numba_attention, numba_gdn, numba_rows, numba_steps, threads

    threads.yield_when_idle()

    return Kernels(
        name="cpu",
        attend=numba_attention.attend,  # batch-invariant like the oracle's, to float32 rounding of it
        attend_paged=numba_attention.attend_paged,  # the same kernel reading the pool through a block table
        gdn_scan=numba_gdn.gdn_scan,  # bitwise the oracle's scan, without its temporaries
        causal_conv=numba_gdn.causal_conv,  # bitwise the oracle's conv
        # every sequence of a batch in one call each (threads over (sequence, head) pairs), the same bits
        gdn_scan_ragged=numba_gdn.gdn_scan_ragged,
        causal_conv_ragged=numba_gdn.causal_conv_ragged,
        attend_paged_ragged=numba_attention.attend_paged_ragged,
        # one compiled call each instead of three to six NumPy operations (the same functions to float rounding)
        rms_norm=numba_rows.rms_norm, l2_norm=numba_rows.l2_norm, sigmoid=numba_rows.sigmoid, silu=numba_rows.silu,
        softplus=numba_rows.softplus,
        # a layer's steps of small matmuls and row functions in one compiled call each (the same bits as the
        # separate calls; a step with a matrix large enough for threads keeps them)
        ffn_residual=numba_steps.ffn_residual, gdn_project=numba_steps.gdn_project, gdn_output=numba_steps.gdn_output,
        gdn_recurrent=numba_steps.gdn_recurrent,
        gdn_recurrent_tree=numba_steps.gdn_recurrent_tree,
        attention_project=numba_steps.attention_project, attention_output=numba_steps.attention_output,
        norm_rope=numba_steps.norm_rope,
    )


def cpu_placement() -> Placement:
    """The host's numbers, as the oracle's, with the replay ring: no 72 MB of snapshots per 0.8B verify pass
    (state.ReplayRing, LESSONS 15)."""
    return Placement(rollback="replay")


def device_rows(fused, oracle: Callable, device_array: type) -> Callable:
    """oracle's contract, computed by `fused` (a fast/cuda_rows.py function, or fast/cuda_attention.py's with q
    first) on a device array. A fused function may decline (return None: a broadcast its kernel does not do, a
    head too wide for the attention kernel), and a host array never reaches it: the oracle computes both (it is
    the same function; NumPy runs it where the array lives)."""

    def row(x, *args):
        if isinstance(x, device_array) and (y := fused(x, *args)) is not None:
            return y
        return oracle(x, *args)

    row.__name__ = row.__qualname__ = oracle.__name__
    return row


def cuda_kernels() -> Kernels:
    """The device scan, one-launch row functions (fast/cuda_rows.py: one launch per norm or gate instead of four
    to six), attention as one kernel launch per layer (fast/cuda_attention.py: contiguous, paged, every sequence
    of a pool at once, and from a device pass's row map) and a MoE layer's routing and grouping on the device
    (fast/cuda_moe.py: no sync per layer). Each computes on a device array; a host array goes to the oracle's."""
    import cupy

    from .fast import cuda_attention, cuda_moe, cuda_rows

    dev, attn = cupy.ndarray, cuda_attention.DeviceAttention(cupy)
    return Kernels(
        name="cuda", gdn_scan=cuda_gdn_scan, gdn_scan_ragged=cuda_gdn_scan_ragged,
        rms_norm=device_rows(cuda_rows.rms_norm, ops.rms_norm, dev),
        l2_norm=device_rows(cuda_rows.l2_norm, ops.l2_norm, dev),
        sigmoid=device_rows(cuda_rows.sigmoid, ops.sigmoid, dev),
        silu=device_rows(cuda_rows.silu, ops.silu, dev),
        softplus=device_rows(cuda_rows.softplus, ops.softplus, dev),
        attend=device_rows(attn.attend, attention.attend, dev),  # q first: a host q goes to the oracle
        attend_paged=device_rows(attn.attend_paged, attention.attend_paged, dev),
        attend_paged_ragged=device_rows(attn.attend_paged_ragged, attention.attend_paged_ragged, dev),
        attend_rows=attn.attend_rows,  # a device pass's rows only (Placement.device_pass)
        route_experts=cuda_moe.route_experts,  # the same bits as moe.route_experts, all E groups, device offsets
    )


def cuda_placement(graphs: bool = True, check_graphs: Callable | None = None) -> Placement:
    """CuPy arrays for activations, state, caches and the snapshot ring; a forward pass as a device pass
    (fast/cuda_pass.py: one row map uploaded, the layer loop replayed from a CUDA graph per key with
    graphs=True); the greedy rule on the device (fast/cuda_accept.py: two ints back per step, replayed from a
    CUDA graph per verify length with graphs=True); graph_counts says what both captured (fast/cuda_graphs.py);
    with graphs, a drafter's passes padded to few shapes (Placement.pad_rows).
    check_graphs: each replay's check (tests: fake_cupy.check_replay; None on a GPU)."""
    import cupy

    from .fast import cuda_accept, cuda_pass
    from .fast.cuda_graphs import merged_counts

    rule = cuda_accept.DeviceGreedyRule(cupy, cupy.asnumpy, graphs, check_graphs)  # two ints back per step
    passes = cuda_pass.DevicePasses(cupy, graphs, check_graphs)  # one map upload a pass, a graph per key
    return Placement(xp=cupy, to_device=cupy.asarray, to_host=cupy.asnumpy, device_pass=passes, accept_greedy=rule,
                     graph_counts=lambda: merged_counts(rule=rule.graphs, forward=passes.graphs), pad_rows=graphs)


def load_model(path: str | os.PathLike, backend: str | None = None,
               progress: Callable[[int, int], None] | None = None) -> Model:
    """A Model whose weights live where `backend` (default: default_backend()) computes with them."""
    backend = check(backend) if backend else default_backend()
    if backend == "numpy":
        return Model.from_gguf(path, progress)  # the oracle's kernels and placement
    g = read_gguf(path)  # stays open: the packed weights are views of its memory map
    embd = g.tensors.get("token_embd.weight")
    cfg = ModelConfig.from_gguf(g.metadata, n_vocab=embd.shape[0] if embd is not None else None)
    if backend == "cpu":
        tensors, kernels, placement = cpu_tensors(g, progress), cpu_kernels(), cpu_placement()
    else:  # cuda: activations and state on the device; the engine keeps host tokens and logits
        tensors, kernels, placement = cuda_tensors(g, progress), cuda_kernels(), cuda_placement()
    return Model(cfg, tensors, g.metadata, kernels, placement, source=g, path=path)


__all__ = ["BACKENDS", "BackendError", "PackedWeight", "cpu_kernels", "cpu_placement", "cuda_kernels", "cuda_placement",
           "default_backend", "load_model", "load_tensors"]
