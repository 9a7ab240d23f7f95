"""The qwen35 hybrid trunk on the NumPy oracle: weights by GGUF name, forward(tokens, state).

    x      = token_embd[tokens]                                     [T, D]
    for each trunk layer i (Gated DeltaNet, or full attention every few layers):
        x  = x + Mixer_i(rms_norm(x, attn_norm_i))                  mixer = gdn_layer | attention_layer
        x  = x + FFN_i(rms_norm(x, post_attention_norm_i))          FFN(u) = ffn_down (silu(ffn_gate u) * ffn_up u)
    hidden = rms_norm(x, output_norm)                               [T, D]  (what the MTP head consumes)
    logits = output @ hidden   (token_embd @ hidden when output.weight is absent: tied)   [T, N]

Every norm weight in a GGUF already carries HF's "+1" except ssm_norm (docs/qwen35.md section 7, item 1), so the
code multiplies by stored weights as llama.cpp does. The oracle dequantizes every tensor to float32
once at load (each by its own ggml type); the fast backends (backends.py, fast/) read the quantized
bytes directly. Every function the model computes with comes from the Kernels it is built with
(kernels.py: the oracle's, NUMPY, by default; a backend hands in its own), and only from there; where its
numbers live (the array module, the host/device copies, a device pass) from its Placement (placement.py:
HOST by default).

Glossary: T tokens, D model dim, N vocab, F FFN dim. Official implementation: llama.cpp
`src/models/qwen35.cpp`; HF transformers `Qwen3_5ForCausalLM`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from .attention import attention_layer_ragged
from .config import ModelConfig
from .gdn import gdn_layer_ragged
from .gguf import GGUFFile, read_gguf
from .kernels import NUMPY, Kernels
from .ffn import ffn  # noqa: F401  (mtp.py and tests import it from here)
from .ops import join_rows
from .placement import HOST, Placement
from .quants import dequantize
from .state import ModelState, ReplayRing, SnapshotRing
from .tree import check_parents, depths

GDN_TENSORS = ("attn_qkv.weight", "attn_gate.weight", "ssm_beta.weight", "ssm_alpha.weight", "ssm_conv1d.weight",
               "ssm_dt.bias", "ssm_a", "ssm_norm.weight", "ssm_out.weight")
ATTN_TENSORS = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "attn_q_norm.weight",
                "attn_k_norm.weight")
FFN_TENSORS = ("attn_norm.weight", "post_attention_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")
MOE_TENSORS = ("ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")
SHEXP_TENSORS = ("ffn_gate_inp_shexp.weight", "ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight")


class ModelError(ValueError):
    """The file's tensors do not form a qwen35 model (missing tensor, wrong shape)."""


def ffn_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The FFN tensors every layer (and the MTP block) must hold, with their NumPy shapes: dense, or the
    router, the routed experts and the shared expert of qwen35moe."""
    D = cfg.n_embd
    if not cfg.n_expert:
        return {"ffn_gate.weight": (cfg.n_ff, D), "ffn_up.weight": (cfg.n_ff, D), "ffn_down.weight": (D, cfg.n_ff)}
    E, Fe, Fs = cfg.n_expert, cfg.n_ff_exp, cfg.n_ff_shexp
    shapes = {"ffn_gate_inp.weight": (E, D), "ffn_gate_exps.weight": (E, Fe, D), "ffn_up_exps.weight": (E, Fe, D),
              "ffn_down_exps.weight": (E, D, Fe)}
    if Fs:
        shapes |= {"ffn_gate_inp_shexp.weight": (D,), "ffn_gate_shexp.weight": (Fs, D), "ffn_up_shexp.weight": (Fs, D),
                   "ffn_down_shexp.weight": (D, Fs)}
    return shapes


def check_ffn(tensors: Mapping[str, np.ndarray], prefix: str, cfg: ModelConfig) -> None:
    """Raise ModelError naming the first FFN tensor under `prefix` that is missing or has the wrong shape."""
    if cfg.n_expert and prefix + "ffn_gate_up_exps.weight" in tensors:
        raise ModelError(f"tensor {prefix}ffn_gate_up_exps.weight: the fused gate/up expert layout is not supported "
                         "yet (files with separate ffn_gate_exps and ffn_up_exps are)")
    for name, shape in ffn_shapes(cfg).items():
        t = tensors.get(prefix + name)
        if t is None:
            raise ModelError(f"missing tensor {prefix}{name}")
        got = tuple(t.shape)
        if got != shape and not (name == "ffn_gate_inp_shexp.weight" and got == (1,) + shape):
            raise ModelError(f"tensor {prefix}{name} has shape {got}, expected {shape}")


def load_tensors(g: GGUFFile, progress: Callable[[int, int], None] | None = None) -> dict[str, np.ndarray]:
    """Every tensor of the file as float32 in NumPy shape, dequantized by its own ggml type.
    progress(done, total) is called after each tensor (long for real models: every weight is expanded)."""
    out = {}
    for i, (name, t) in enumerate(g.tensors.items()):
        out[name] = dequantize(g.raw(name), t.ggml_type, t.shape)
        if progress:
            progress(i + 1, len(g.tensors))
    return out


def embed_rows(weight, tokens, n_vocab: int, xp=np) -> np.ndarray:  # [T] ids -> [T, D]
    """The embedding rows of `tokens` in `weight` [N, D] (an array, or a backend's PackedWeight).

    tokens are host ids (a list, NumPy ints): checked here, on the host, so a bad id is a ValueError that names
    it, at no cost to the device; or device ids (an array of xp when xp is not NumPy: a greedy drafter's argmax,
    mtp.MTPDrafter, draft.DraftModelDrafter), gathered where they are and not checked: an argmax over the N
    scores is in range by construction, and a check there would be a sync (on the NumPy backends the device is
    the host, so their ids are host ids, checked)."""
    return weight[checked_ids(tokens, n_vocab, xp)]


def checked_ids(tokens, n_vocab: int, xp=np):
    """[T] ids ready to gather (embed_rows' two cases): host ids checked (check_ids), or device ids (an array of xp
    when xp is not NumPy) flattened where they are, unchecked."""
    if xp is not np and isinstance(tokens, xp.ndarray):
        return tokens.reshape(-1)
    return check_ids(tokens, n_vocab)


def check_ids(tokens, n_vocab: int) -> np.ndarray:
    """Host token ids as a [T] int64 array, T >= 1, each in 0 .. n_vocab-1; else a ValueError naming the first
    bad one."""
    tokens = np.asarray(tokens, dtype=np.int64)
    if tokens.ndim != 1 or tokens.size == 0:
        raise ValueError(f"tokens must be a non-empty 1-D sequence, got shape {tokens.shape}")
    bad = tokens[(tokens < 0) | (tokens >= n_vocab)]
    if bad.size:
        raise ValueError(f"token id {int(bad[0])} is outside the vocabulary (0 .. {n_vocab - 1})")
    return tokens


class Model:
    """A qwen35 trunk (and its weights for the MTP head, see mtp.py). Stateless: state is passed in.

    kernels: every function it computes with (kernels.py); placement: where its numbers live, the array module
    its state lives in, the host/device copies, the device pass, the greedy rule and the rollback ring
    (placement.py). A backend builds both (backends.load_model). source: the GGUFFile the weights are views of,
    kept open (None when they were copied out); path: the file it was loaded from.
    """

    def __init__(self, cfg: ModelConfig, tensors: Mapping[str, np.ndarray], metadata: Mapping | None = None,
                 kernels: Kernels = NUMPY, placement: Placement = HOST, source: GGUFFile | None = None,
                 path: str | os.PathLike | None = None):
        self.cfg, self.metadata, self.kernels, self.placement = cfg, dict(metadata or {}), kernels, placement
        self.source, self.path = source, None if path is None else Path(path)
        self.n_forward_tokens = 0  # tokens pushed through the trunk (tests count recomputes with it)
        self.tensors = tensors

        def need(name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
            if name not in tensors:
                if name.startswith("blk.") and any(t.startswith(f"blk.{cfg.n_trunk}.nextn.") for t in tensors) and \
                        not any(t.startswith("blk.0.") for t in tensors):  # convert --mtp only / llama.cpp --mtp
                    raise ModelError(f"missing tensor {name}: this file holds only the MTP block (an MTP sidecar), "
                                     "not a model to run")
                raise ModelError(f"missing tensor {name}")
            if shape is not None and tuple(tensors[name].shape) != shape:
                raise ModelError(f"tensor {name} has shape {tuple(tensors[name].shape)}, expected {shape}")
            return tensors[name]

        D, N = cfg.n_embd, cfg.n_vocab
        self.token_embd = need("token_embd.weight", (N, D))
        self.output_norm = need("output_norm.weight", (D,))
        self.output = tensors.get("output.weight", self.token_embd)  # tied when absent
        if self.output.shape != (N, D):
            raise ModelError(f"tensor output.weight has shape {self.output.shape}, expected {(N, D)}")
        self.layers: list[dict[str, np.ndarray]] = []
        for i, recurrent in enumerate(cfg.recurrent):
            names = FFN_TENSORS[:2] + (GDN_TENSORS if recurrent else ATTN_TENSORS)
            layer = {n: need(f"blk.{i}.{n}") for n in names}
            check_ffn(tensors, f"blk.{i}.", cfg)
            self.layers.append(layer | {n: tensors[f"blk.{i}.{n}"] for n in ffn_shapes(cfg)})

    @classmethod
    def from_gguf(cls, path: str | os.PathLike | GGUFFile, progress: Callable[[int, int], None] | None = None) -> "Model":
        g = path if isinstance(path, GGUFFile) else read_gguf(path)
        try:
            embd = g.tensors.get("token_embd.weight")
            cfg = ModelConfig.from_gguf(g.metadata, n_vocab=embd.shape[0] if embd is not None else None)
            return cls(cfg, load_tensors(g, progress), g.metadata, path=g.path)
        finally:
            if not isinstance(path, GGUFFile):
                g.close()

    def with_kernels(self, kernels: Kernels) -> "Model":
        """The same weights and placement computed with other kernels: a new Model (this one is unchanged)."""
        return Model(self.cfg, self.tensors, self.metadata, kernels, self.placement, self.source, self.path)

    def with_placement(self, placement: Placement) -> "Model":
        """The same weights and kernels with another placement: a new Model (this one is unchanged). E.g. the
        other ring: model.with_placement(dataclasses.replace(model.placement, rollback="replay"))."""
        return Model(self.cfg, self.tensors, self.metadata, self.kernels, placement, self.source, self.path)

    # read-only views of the placement, for the code that allocates state or copies rows (drafters, bench)
    xp = property(lambda self: self.placement.xp)  # the array module of state, caches and rings
    to_device = property(lambda self: self.placement.to_device)  # host rows -> where the model computes
    to_host = property(lambda self: self.placement.to_host)  # model rows -> NumPy
    backend = property(lambda self: self.kernels.name)  # "numpy" | "cpu" | "cuda"

    def new_state(self, pool=None) -> ModelState:
        """A fresh sequence's state; pool: a paged.BlockPool its KV lives in (many sequences), else its own."""
        return ModelState(self.cfg, self.xp, pool)

    def new_ring(self, size: int, tree: bool = False) -> SnapshotRing | ReplayRing:
        """Where a verify pass of up to `size` tokens leaves what a rollback needs (allocated once per sequence).
        tree=True: a SnapshotRing whatever the placement says, for a draft tree's passes, whose rows start from their
        parents' states (tree.py): only the snapshot ring keeps the state after every row."""
        kern = self.kernels
        if self.placement.rollback == "replay" and not tree:  # the replay reruns the conv and the scan the passes run
            return ReplayRing(self.cfg, size, kern.causal_conv, kern.gdn_scan, self.xp)
        return SnapshotRing(self.cfg, size, self.xp)

    def embed(self, tokens) -> np.ndarray:  # [T] host ids (checked) or device ids (a drafter's argmax) -> [T, D]
        return embed_rows(self.token_embd, tokens, self.cfg.n_vocab, self.xp)

    def forward(self, tokens, state: ModelState, chunked: bool = False, ring: SnapshotRing | ReplayRing | None = None,
                logits: bool = True, to_host: bool = True) -> tuple[np.ndarray | None, np.ndarray]:
        """Advance `state` by T tokens. Returns logits [T, N] and post-final-norm hidden [T, D] for every row.
        tokens: [T] host ids, or device ids a greedy drafter made (embed_rows: gathered where they are).
        The one-sequence case of forward_batch (one layer loop for both).

        chunked=True runs GDN layers in the chunked prefill form (faster for long T; equal to the
        sequential scan to ~1e-6, not bitwise), so verify passes always use the default.
        ring: a SnapshotRing that receives every GDN layer's state after each of the T tokens
        (a verify pass), so any prefix can be restored later without recomputing; or a ReplayRing
        that keeps what a rollback needs to rescan the kept prefix (new_ring picks, state.py).
        logits=False skips the output projection (None instead of logits): for callers that score
        only some rows of it (a draft vocabulary, fast/draft_vocab.py) or need only the state.
        to_host=False leaves logits and hidden where the model computes (CuPy arrays on the cuda backend, the
        same NumPy arrays on the others): for a caller that reads them there (the greedy rule,
        Placement.accept_greedy; the MTP head) and brings back only what it needs.
        """
        out, hidden, _ = self.forward_batch([tokens], [state], [ring], logits, to_host, chunked)
        return out, hidden

    def forward_batch(self, tokens: list, states: list[ModelState], rings: list | None = None,
                      logits: bool = True, to_host: bool = True, chunked: bool = False,
                      trees: list | None = None) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
        """One pass over several sequences (ragged): sequence b feeds tokens[b] (>= 1 tokens, host or device ids
        as in forward) from states[b].

        The rows are packed, sequence after sequence, into one [R, D] (R = total tokens; bounds[b] is where
        sequence b's rows start, like cu_seqlens), so every weight is read once for the whole batch; the GDN
        conv and scan and the attention run per sequence on its own rows and state (gdn_layer_ragged,
        attention_layer_ragged). Every row is the row that sequence computes alone (the matmul is
        batch-invariant), which is what makes a batch of speculative sequences exact. rings[b]: sequence b's
        ring for a verify pass, or None. Returns logits [R, N] (None with logits=False), hidden [R, D], bounds [B+1]
        (host ints); to_host=False leaves logits and hidden where the model computes, as in forward.
        trees[b]: sequence b's draft tree (tree.py: the parent row of each of its tokens after the first), or None:
        its rows follow one another. A tree's row t is computed as a one-token decode of its path (the GDN layers
        from its parent's state, the attention over the prefix and its path), every row's GDN state goes to the
        sequence's ring (a SnapshotRing, required), and its KV rows are appended in row order: the caller keeps a
        path afterwards with ring.restore_path, which also sets the GDN state (left as before the pass here).
        """
        cfg, place = self.cfg, self.placement
        if len(tokens) != len(states) or not tokens:
            raise ValueError(f"forward_batch needs one state per sequence, got {len(tokens)} and {len(states)}")
        rings = rings if rings is not None else [None] * len(states)
        trees = trees if trees is not None and any(t is not None for t in trees) else None
        for b, parents in enumerate(trees or []):
            if parents is not None and (len(parents) + 1 != len(tokens[b]) or not isinstance(rings[b], SnapshotRing)):
                raise ValueError(f"sequence {b}'s tree needs one parent per token after the first "
                                 f"({len(tokens[b]) - 1}, got {len(parents)}) and a SnapshotRing")
        # host ids checked here, before anything changes; device ids (a drafter's argmax) are in range already
        tokens = [checked_ids(t, cfg.n_vocab, place.xp) for t in tokens]
        bounds = np.cumsum([0] + [len(t) for t in tokens])  # [B+1]
        for ring, state, t, parents in zip(rings, states, tokens, trees or [None] * len(states)):
            if parents is not None:
                ring.mark_tree(state.pos, depths(check_parents(parents)))
            elif ring is not None:
                ring.mark_pass(state.pos, len(t))
        self.n_forward_tokens += int(bounds[-1])
        # a device pass (the cuda backend's): one row map for every layer, its KV rows claimed now, the layer
        # loop computed or replayed from a CUDA graph (placement.py); None: the host path
        device = None if chunked or trees else place.device_pass(cfg, tokens, [s.layers for s in states], bounds, rings, logits)
        if device is None:
            x = join_rows([place.to_device(self.token_embd[t]) for t in tokens])  # [R, D] where the model computes
            out, hidden = self.layers_pass(x, states, rings, bounds, None, logits, chunked, trees)
        else:
            out, hidden = device.run(lambda rows: self.layers_pass(self.token_embd[rows.ids], states, rings, bounds,
                                                                   rows, logits))
        for state, t in zip(states, tokens):
            state.pos += len(t)
        if to_host:
            out, hidden = (place.to_host(out) if out is not None else None), place.to_host(hidden)
        return out, hidden, bounds

    def layers_pass(self, x, states: list[ModelState], rings: list, bounds: np.ndarray, rows=None,
                    logits: bool = True, chunked: bool = False,
                    trees: list | None = None) -> tuple[np.ndarray | None, np.ndarray]:
        """forward_batch's device work: x [R, D] through every layer, the final norm and the output ->
        (logits [R, N] or None, hidden [R, D]), where the model computes. rows: a device pass's row map
        (fast/rowmap.py's RowViews) for the attention layers, or None (they read the caches' lengths on the
        host). With a row map it changes nothing on the host (the caches were claimed, the states' arrays are
        written in place), so a CUDA graph of it replays right (fast/cuda_pass.py)."""
        cfg, kern = self.cfg, self.kernels
        for i, (w, recurrent) in enumerate(zip(self.layers, cfg.recurrent)):
            u = kern.rms_norm(x, w["attn_norm.weight"], cfg.rms_eps)
            layer_states = [s.layers[i] for s in states]
            if recurrent:
                x = x + gdn_layer_ragged(u, w, layer_states, bounds, cfg, kern,
                                         [r.layer(i) if r is not None else None for r in rings], chunked, trees)
            else:
                x = x + attention_layer_ragged(u, w, layer_states, bounds, cfg, kern, rows, trees)
            x = kern.ffn_residual(x, w, cfg, kern)  # x + ffn(rms_norm(x)): ffn.ffn_residual, or a fused one
        hidden = kern.rms_norm(x, self.output_norm, cfg.rms_eps)  # [R, D]
        out = kern.linear(hidden, self.output) if logits else None  # [R, N]
        return out, hidden
