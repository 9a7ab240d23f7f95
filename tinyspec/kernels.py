"""Kernels: what a backend swaps, handed to a model as one immutable object.

A Model computes with the functions of the Kernels it was built with (`Model(cfg, tensors, kernels=...)`),
never with module functions a backend patched: the row-by-row matmul, attention over the KV cache, the
delta-rule scan and the short convolution of the GDN layers, the row functions (norms and gates), the array
module its state lives in, and the two copies between the engine (which samples on the host) and the model.
NUMPY, the default, names the oracle's own functions (ops.py, attention.py, gdn.py). A backend
(tinyspec/backends.py) builds another Kernels from its fast functions and passes it to the Model it loads;
nothing writes into a built model or into a module-level table afterwards. So a reader finds the fast path
by following an argument, not by searching for who patched what.

    field         oracle                 contract (shapes: T tokens; see the oracle's docstring)
    name          "numpy"                which backend built it: "numpy" | "cpu" | "cuda"
    linear        ops.linear             (x [T, in], w [out, in] or a PackedWeight) -> [T, out]
    attend        attention.attend       (q [T, H_kv, G, d], keys, values [>= n_past + T, H_kv, d], n_past, scale)
                                         -> o [T, H_kv, G, d]
    attend_paged  attention.attend_paged (q, k_pool, v_pool [n_blocks, block_size, H_kv, d], table [blocks] ids,
                                         n_past, scale) -> o: attend over a paged cache's blocks (paged.py)
    gdn_scan      gdn.gdn_scan           (q, k, v, log_decay, beta, state, states_out=None, out=None) -> (o, state);
                                         states_out [>= T, HV, K, V] receives the state after each token, out
                                         [HV, K, V] the new state (it may be `state` itself: in place)
    causal_conv   gdn.causal_conv        (x [T, C], conv_state [C, w-1], weight [C, w], states_out=None, out=None)
                                         -> (y [T, C], new conv_state); states_out [>= T, C, w-1] as the scan's,
                                         out [C, w-1] the new window (it may be `conv_state` itself: in place)
    the ragged three: B sequences' rows packed in one array, sequence b's rows bounds[b] .. bounds[b+1]-1, each
    computed from its own state as the one-sequence function computes it (the oracle: that loop; a backend
    that swaps a one-sequence function swaps its ragged one too, with the same bits):
    gdn_scan_ragged      gdn.gdn_scan_ragged      (q, k, v, log_decay, beta [R, ...], bounds, states, states_outs,
                                                  outs) -> (o [R, HV, V], new states); lists of B (or None)
    causal_conv_ragged   gdn.causal_conv_ragged   (x [R, C], bounds, conv_states, weight, states_outs, outs)
                                                  -> (y [R, C], new conv_states); lists of B (or None)
    attend_paged_ragged  attention.attend_paged_ragged (q [R, H_kv, G, d], k_pool, v_pool, tables, n_pasts,
                                                  bounds, scale) -> o: B sequences' caches in one pool
    attend_rows   attention.attend_rows  (q [R, H_kv, G, d], k_pool, v_pool, seq, row0, n_past, tab0, tables, scale)
                                         -> o: attend_paged_ragged with every length and block id read from a
                                         pass's row map (rowmap.py), where the model computes
    device_pass   no_device_pass         (cfg, tokens, layers, bounds, rings, logits) -> None (the layers run the host
                                         path, as the oracle and cpu do), or a pass that reads its rows from one map
                                         made and uploaded once, with the KV rows claimed on the host first
                                         (rowmap.claim; layers[b]: sequence b's layer states): its run(fn, *inputs)
                                         returns fn(rows, *inputs) (rows: rowmap.RowViews; inputs: device arrays
                                         the pass reads), computed or replayed (the cuda backend's:
                                         fast/cuda_pass.py, a CUDA graph per shape and buffers). Model.forward_batch
                                         and MTPHead.forward_batch hand it their layers
    rms_norm, l2_norm, sigmoid, silu, softplus    ops': the same functions to float rounding
    route_experts moe.route_experts      (router logits [T, E], k) -> (weights [T, k], order [T k], experts [U] host
                                         ints, offsets [U + 1]): a MoE layer's routing and its pairs grouped by
                                         expert (moe.py); weights, order and offsets where the model computes. The
                                         cuda backend's (fast/cuda_moe.py) runs on the device with no sync: the
                                         same bits, U = E (empty groups too) and device offsets
    xp            numpy                  the array module that allocates state, KV caches and rings (cupy: on a GPU)
    to_device     identity               host arrays (token embeddings, token ids) -> where the model computes
    to_host       identity               logits and hidden rows -> NumPy, for the engine
    accept_greedy accept_greedy          (logits [R, N] where the model computes: B sequences' verify rows,
                 (verify_greedy, here)   bounds [B+1] where each sequence's rows start, drafts: per sequence k_b
                                         host ints or a [k_b] int64 array where the logits are) -> per sequence
                                         (n_accepted, token, drafts as host ints): the greedy rule (the argmax
                                         of each row against the drafts, the kept prefix, the target's own
                                         token); the cuda backend's runs on the device and brings back every
                                         sequence's run, and its drafts when they were there, in one transfer
    rollback      "snapshot"             which ring Model.new_ring makes: "snapshot" (copies) | "replay" (rescans)
    graph_counts  no_graphs              () -> None, or what the backend's CUDA graphs did so far: {captured, failed,
                                         replays, plain, shapes, reasons} (the cuda backend's greedy rule,
                                         fast/cuda_graphs.py); `bench --json` reports it as "graphs"

What every replacement must keep:
  * batch invariance: row t of a T-row call is bitwise the row a one-row call computes (from the state
    before token t, for the scan and the conv), on its own backend. It is what makes the rows of a T-token
    verify pass bitwise those of T one-token decodes, so greedy speculative output equals plain greedy
    output (tests/test_model.py for the oracle, tests/test_backends.py for each backend's whole model).
  * the oracle's function: gdn_scan and causal_conv of the cpu backend, and their ragged forms, are bitwise
    the oracle's (tests/test_numba_gdn.py, tests/test_numba_ragged.py); attend and the cuda row functions agree to float32 rounding, as the matmul
    kernels do (tests/test_numba_attention.py, tests/test_cuda_ops.py).
  * replay needs the same bits twice: a ReplayRing reruns the model's own causal_conv and gdn_scan over the
    kept tokens, which gives the pass's bits because each is deterministic and batch-invariant.
The matmul itself is swapped in the weights, not here: a backend's weight is a PackedWeight whose .linear
multiplies it (backends.py), and ops.linear hands it x. `linear` is a field so a reader sees it among the rest.

This module imports the oracle only, never tinyspec.fast: the core reads and runs without the wing
(tests/test_kernels.py checks it). The import goes one way: the layers (gdn.py, attention.py) are handed
a Kernels by their caller and never import this module, which imports them for its defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Callable

import numpy as np

from . import ops
from .attention import attend, attend_paged, attend_paged_ragged, attend_rows
from .gdn import causal_conv, causal_conv_ragged, gdn_scan, gdn_scan_ragged
from .moe import route_experts
from .spec_sampling import verify_greedy

ROLLBACKS = ("snapshot", "replay")


def accept_greedy(logits: np.ndarray, bounds, drafts: list) -> list[tuple[int, int, list[int]]]:
    """The oracle's Kernels.accept_greedy: per sequence b (its rows bounds[b] .. bounds[b+1]-1 of logits [R, N],
    its k_b drafts), spec_sampling.verify_greedy and the drafts as host ints. The oracle's device is the host,
    so drafts given as an id array (a drafter's argmaxes, left where they were made) are read, not fetched; the
    cuda backend's version (fast/cuda_accept.py) brings every sequence's run back in one transfer."""
    out = []
    for lo, hi, ds in zip(bounds[:-1], bounds[1:], drafts):
        ds = [int(d) for d in ds]
        out.append((*verify_greedy(logits[lo:hi], ds), ds))
    return out


def no_device_pass(cfg, tokens, layers, bounds, rings, logits) -> None:
    """The oracle's Kernels.device_pass: none. Its layers read positions and lengths from the caches on the host."""
    return None


def no_graphs() -> None:
    """The oracle's Kernels.graph_counts: it captures no CUDA graphs, so there is nothing to count."""
    return None


def same(a):
    """The identity: the oracle's host and device are the same memory."""
    return a


@dataclass(frozen=True)
class Kernels:
    """Everything a backend swaps (see the module docstring for each field's contract). Frozen: a backend
    builds one and hands it over; a variant is `dataclasses.replace(kernels, rollback="replay")`."""

    name: str = "numpy"
    linear: Callable = ops.linear
    attend: Callable = attend
    attend_paged: Callable = attend_paged
    gdn_scan: Callable = gdn_scan
    causal_conv: Callable = causal_conv
    gdn_scan_ragged: Callable = gdn_scan_ragged
    causal_conv_ragged: Callable = causal_conv_ragged
    attend_paged_ragged: Callable = attend_paged_ragged
    rms_norm: Callable = ops.rms_norm
    l2_norm: Callable = ops.l2_norm
    sigmoid: Callable = ops.sigmoid
    silu: Callable = ops.silu
    softplus: Callable = ops.softplus
    route_experts: Callable = route_experts
    attend_rows: Callable = attend_rows
    device_pass: Callable = no_device_pass
    xp: ModuleType = np
    to_device: Callable = same
    to_host: Callable = same
    accept_greedy: Callable = accept_greedy
    rollback: str = "snapshot"
    graph_counts: Callable[[], dict | None] = no_graphs

    def __post_init__(self):
        if self.rollback not in ROLLBACKS:
            raise ValueError(f"rollback must be one of {', '.join(ROLLBACKS)}, got {self.rollback!r}")
        # The layers call the ragged forms; the oracle's ragged form loops over the oracle's one-sequence
        # function, not over a replacement. A swapped one-sequence function beside the oracle's ragged form
        # would be silently unused by every pass (only a ReplayRing would call it): refuse it here.
        pairs = (("gdn_scan", self.gdn_scan is not gdn_scan, self.gdn_scan_ragged is gdn_scan_ragged),
                 ("causal_conv", self.causal_conv is not causal_conv, self.causal_conv_ragged is causal_conv_ragged),
                 ("attend_paged", self.attend_paged is not attend_paged, self.attend_paged_ragged is attend_paged_ragged))
        for one, swapped, oracle_ragged in pairs:
            if swapped and oracle_ragged:
                raise ValueError(f"this Kernels swaps {one} but keeps the oracle's {one}_ragged, which the layers "
                                 f"call (and which loops over the oracle's {one}): swap {one}_ragged too")


NUMPY = Kernels()  # the oracle's
