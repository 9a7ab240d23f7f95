"""The mixture-of-experts FFN of qwen35moe: a router picks k of E expert FFNs per token, plus a shared expert.

For one token x (the input after post_attention_norm; docs/qwen35.md section 8):

    p      = softmax(ffn_gate_inp @ x)                          [E]  the router's probabilities
    S      = the k = expert_used_count experts with the largest p (a tie: the lower index first)
    w_e    = p_e / sum_{j in S} p_j                               renormalised over the chosen
    moe    = sum_{e in S} w_e * down_e(silu(gate_e @ x) * (up_e @ x))    summed in rank order
    shared = sigmoid(ffn_gate_inp_shexp . x) * down_s(silu(gate_s @ x) * (up_s @ x))
    out    = moe + shared

Weights (NumPy shapes of the GGUF tensors): ffn_gate_inp [E, D]; ffn_gate_exps, ffn_up_exps [E, F_e, D];
ffn_down_exps [E, D, F_e]; the shared expert ffn_gate_shexp, ffn_up_shexp [F_s, D], ffn_down_shexp [D, F_s]
and its gate ffn_gate_inp_shexp [D].

Grouped by expert: the T * k (row, rank) pairs of a pass are sorted by the expert they chose, so the pairs of
expert e are one contiguous slice, and experts_linear runs each chosen expert's matrix over its slice: each chosen
expert's weights are read once per pass however many rows chose it (a verify pass of T rows reads the union of
the experts its rows chose: more than one token's k when rows disagree; LESSONS and bench measure it). Each
pair's product is kept apart and the row sums its own k products in its own rank order, so a row's numbers do not
depend on the other rows (batch invariance, as ops.linear's).

    pairs   p = t * k + j  (row t's j-th choice)       order = the pairs sorted by expert (stable)
    groups  experts [U] the distinct chosen experts,  offsets [U + 1]: pairs order[offsets[i]:offsets[i+1]]
            chose experts[i]; U, the pass's expert union, is what its FFN reads (fast/expert_union.py counts it)

Where routing runs: Kernels.route_experts (kernels.py, which imports this module for its default: the layers
here take their `kern` and never import it). The oracle's is route_experts below, route then
group_by_expert on the host. The cuda backend routes and groups on the device (fast/cuda_moe.py: the same
bits, no host sync): its groups list every expert (U = E, empty groups too, host experts = 0..E-1) with device
offsets [E + 1], so no count has to come back, and each projection is one grouped launch over them.

The router's exp is computed in float64 and rounded once to float32 (the correctly rounded value, barring
double rounding, p ~ 2^-29 a value), not NumPy's float32 exp: that one is not correctly rounded (NumPy 2.4.6
here: 39% of 5M inputs in [-30, 0] off by 1 or 2 ulp), so no device kernel could give its bits, and one ulp in p
can flip a near-tie between two experts. With it, the device's routing is meant to be this function's bit for
bit: tests/test_cuda_ops.py section 5 checks it on a GPU (written 2026-11-27 without one: not yet run).

Official implementation: llama.cpp src/models/qwen35moe.cpp (build_moe_ffn with softmax gating and
renormalised weights); HF transformers Qwen3_5MoeSparseMoeBlock (modeling_qwen3_5_moe.py).
Does NOT include: the fused ffn_gate_up_exps layout (refused at load), expert_weights_scale, other gatings.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np


def route(router_logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """[T, E] router logits -> the k chosen experts per row [T, k] (largest first) and their weights [T, k]
    (the router's probabilities renormalised over the chosen). Host NumPy in and out."""
    z = np.asarray(router_logits, dtype=np.float32)
    z = z - z.max(axis=1, keepdims=True)  # [T, E] float32
    e = np.exp(z.astype(np.float64)).astype(np.float32)  # exp rounded once (module docstring: the device's bits)
    p = e / e.sum(axis=1, keepdims=True)  # [T, E] softmax; float32 sums in NumPy's pairwise order
    experts = np.argsort(-p, axis=1, kind="stable")[:, :k]  # stable: a tie goes to the lower index
    chosen = np.take_along_axis(p, experts, axis=1)  # [T, k]
    return experts, (chosen / chosen.sum(axis=1, keepdims=True)).astype(np.float32)


def group_by_expert(experts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[T, k] chosen experts -> (order [T k]: the pairs p = t k + j sorted by expert, stable; the distinct experts
    [U]; offsets [U + 1]: pairs order[offsets[i]:offsets[i + 1]] chose experts[i]). Host NumPy."""
    flat = experts.reshape(-1)
    order = np.argsort(flat, kind="stable")
    distinct, starts = np.unique(flat[order], return_index=True)
    return order, distinct, np.append(starts, flat.size).astype(np.int64)


def route_experts(router_logits: np.ndarray, k: int):
    """Kernels.route_experts of the oracle: [T, E] router logits -> (weights [T, k], order [T k], experts [U],
    offsets [U + 1]): route, then group_by_expert, on the host."""
    experts, weights = route(router_logits, k)
    order, distinct, offsets = group_by_expert(experts)
    return weights, order, distinct, offsets


def experts_linear(x, w, experts: np.ndarray, offsets: np.ndarray, kern):  # [P, in] -> [P, out]
    """Rows grouped by expert times their expert: y[a:b] = x[a:b] @ w[experts[i]].T for a, b = offsets[i],
    offsets[i + 1]. w: [E, out, in] float32 (the oracle: kern.linear per expert), or a backend's packed expert
    tensor, which multiplies itself (backends.PackedExperts: one kernel call for all the experts; on the cuda
    backend offsets are a device array [E + 1], read only by its grouped launch)."""
    if not isinstance(w, np.ndarray):  # as ops.linear: a packed tensor (every expert tensor on the cuda backend)
        return w.experts_linear(x, experts, offsets)
    y = np.empty((x.shape[0], w.shape[1]), np.float32)
    for i, e in enumerate(experts):
        y[offsets[i] : offsets[i + 1]] = kern.linear(x[offsets[i] : offsets[i + 1]], w[e])
    return y


def moe_ffn(x: np.ndarray, w: Mapping[str, np.ndarray], n_used: int, kern) -> np.ndarray:  # [T, D] -> [T, D]
    """The module docstring's FFN for T rows: routed experts grouped by expert, then the shared expert."""
    T, D = x.shape
    weights, order, distinct, offsets = kern.route_experts(kern.linear(x, w["ffn_gate_inp.weight"]), n_used)
    xs = x[order // n_used]  # [T k, D]: each pair's row, in expert order
    h = kern.silu(experts_linear(xs, w["ffn_gate_exps.weight"], distinct, offsets, kern)) * \
        experts_linear(xs, w["ffn_up_exps.weight"], distinct, offsets, kern)  # [T k, F_e]
    y = np.empty_like(x, dtype=np.float32, shape=(T * n_used, D))  # on x's device
    y[order] = experts_linear(h, w["ffn_down_exps.weight"], distinct, offsets, kern)
    y = y.reshape(T, n_used, D)  # y[t, j]: row t's j-th chosen expert's output
    out = y[:, 0] * weights[:, :1]
    for j in range(1, n_used):  # each row's own k products, in its rank order
        out = out + y[:, j] * weights[:, j : j + 1]
    if "ffn_gate_shexp.weight" in w:
        shared = kern.linear(kern.silu(kern.linear(x, w["ffn_gate_shexp.weight"])) * kern.linear(x, w["ffn_up_shexp.weight"]),
                             w["ffn_down_shexp.weight"])  # [T, D]
        gate_s = kern.sigmoid((x * w["ffn_gate_inp_shexp.weight"].reshape(D)).sum(axis=1, keepdims=True))  # [T, 1]
        out = out + gate_s * shared
    return out.astype(np.float32, copy=False)
