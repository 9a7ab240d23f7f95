"""Kernels: the math a layer calls, handed to a model as one immutable object.

A Model computes with the functions of the Kernels it was built with (`Model(cfg, tensors, kernels=...)`),
never with module functions a backend patched: the row-by-row matmul, attention over the KV cache, the
delta-rule scan and the short convolution of the GDN layers, the row functions (norms and gates) and a MoE
layer's routing. Where those numbers live (the array module, the host/device copies, the device pass, the
greedy rule that runs where the logits are, the rollback ring) is the model's other object, its Placement
(placement.py). NUMPY, the default, names the oracle's own functions (ops.py, attention.py, gdn.py, moe.py). A
backend (tinyspec/backends.py) builds another Kernels from its fast functions and passes it to the Model it
loads; nothing writes into a built model or into a module-level table afterwards. So a reader finds the fast
path by following an argument, not by searching for who patched what.

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
                                         device pass's row map (Placement.device_pass), where the model computes
    rms_norm, l2_norm, sigmoid, silu, softplus    ops': the same functions to float rounding
    the steps: a layer's step of several matmuls and row functions, which a backend may compute in one call
    (fast/numba_steps.py: the same bits as the step composed of the backend's own separate calls); each takes
    the caller's Kernels, whose separate functions the oracle's step composes:
    swiglu        ops.swiglu             (x [T, D], gate, up, down, kern) -> [T, D]: a dense layer's FFN
    ffn_residual  ffn.ffn_residual       (x [T, D], w, cfg, kern) -> x + ffn(rms_norm(x)): a layer's second half
    gdn_project   gdn.gdn_project        (x [T, D], w, kern) -> mixed, z, beta, log_decay: a GDN layer's step 1
    gdn_recurrent gdn.gdn_recurrent      (mixed, log_decay, beta, bounds, w, states, cfg, kern, rings, chunked)
                                         -> o [R, HV, V]: its steps 2-4 (conv, q/k/v, the memory), which read and
                                         write each sequence's state (gdn.py says how rings take part)
    gdn_recurrent_tree gdn.gdn_recurrent_tree (mixed, log_decay, beta, parents, w, state, cfg, kern, ring) -> o
                                         [T, HV, V]: steps 2-4 over one sequence's draft tree (tree.py), each row
                                         from its parent's ring entry into its own
    gdn_output    gdn.gdn_output         (o [T, HV, V], z, w, cfg, kern) -> [T, D]: its step 5
    attention_project  attention.project (x [T, D], w, cfg, kern) -> q, gate, k, v: an attention layer's step 1
    norm_rope     attention.norm_rope    (q [T, H, d], k [T, H_kv, d], positions [T], w, cfg, kern) -> q, k: its
                                         step 2, each head's RMSNorm and rope at its row's position
    attention_output   attention.output  (o [T, H*d], gate, w, kern) -> [T, D]: its step 4
    route_experts moe.route_experts      (router logits [T, E], k) -> (weights [T, k], order [T k], experts [U] host
                                         ints, offsets [U + 1]): a MoE layer's routing and its pairs grouped by
                                         expert (moe.py); weights, order and offsets where the model computes. The
                                         cuda backend's (fast/cuda_moe.py) runs on the device with no sync: the
                                         same bits, U = E (empty groups too) and device offsets

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
(tests/test_kernels.py checks it). The import goes one way: the layers (gdn.py, attention.py, moe.py) are
handed a Kernels by their caller and never import this module, not even for an annotation; it imports them for
its defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from . import ops
from . import attention, ffn, gdn
from .attention import attend, attend_paged, attend_paged_ragged, attend_rows
from .gdn import causal_conv, causal_conv_ragged, gdn_scan, gdn_scan_ragged
from .moe import route_experts


@dataclass(frozen=True)
class Kernels:
    """The math a backend swaps (see the module docstring for each field's contract). Frozen: a backend builds
    one and hands it over; a variant is `dataclasses.replace(kernels, gdn_scan_ragged=...)`."""

    name: str = "numpy"
    linear: Callable = ops.linear
    attend: Callable = attend
    attend_paged: Callable = attend_paged
    gdn_scan: Callable = gdn_scan
    causal_conv: Callable = causal_conv
    gdn_scan_ragged: Callable = gdn_scan_ragged
    causal_conv_ragged: Callable = causal_conv_ragged
    attend_paged_ragged: Callable = attend_paged_ragged
    attend_rows: Callable = attend_rows
    rms_norm: Callable = ops.rms_norm
    l2_norm: Callable = ops.l2_norm
    sigmoid: Callable = ops.sigmoid
    silu: Callable = ops.silu
    softplus: Callable = ops.softplus
    route_experts: Callable = route_experts
    swiglu: Callable = ops.swiglu
    ffn_residual: Callable = ffn.ffn_residual
    gdn_project: Callable = gdn.gdn_project
    gdn_recurrent: Callable = gdn.gdn_recurrent
    gdn_recurrent_tree: Callable = gdn.gdn_recurrent_tree
    gdn_output: Callable = gdn.gdn_output
    attention_project: Callable = attention.project
    norm_rope: Callable = attention.norm_rope
    attention_output: Callable = attention.output

    def __post_init__(self):
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
