"""The expert union: how many distinct experts a pass of T tokens reads on a mixture of experts, and what it costs.

On a dense model every row of a verify pass reads the same weights, so a pass of k + 1 rows costs little more
than one row (LESSONS 10, 7). On qwen35moe each row routes to k_e of E experts per layer (moe.py), and the pass
reads every expert some row chose: its union U(T). If rows chose independently and uniformly,

    U(T) = E (1 - (1 - k_e / E)^T)       (an expert is missed by one row with probability 1 - k_e / E)

so at E = 256, k_e = 8: U = 8, 15.8, 30.5, 58.2 for T = 1, 2, 4, 8: almost k_e new experts a row. A trained
router is far from uniform (neighbouring tokens share experts), so a real pass reads fewer; random routers
(synth files) are close to this bound. Bytes a pass reads:

    bytes(T) = B_shared + sum over MoE layers of U_l(T) * b_l      b_l: one expert's gate + up + down bytes
                                                                   B_shared: every other weight, read once

and the expert part of bytes(T) / bytes(1) is what speculation pays per verify row beyond the dense model's
(measured next to the timings by `bench` on a MoE model: distinct experts per MoE layer for T = 1..9).

    uniform_union(E, k_e, T)           the formula
    ExpertTally, tallied(model)        a Model over the same weights whose expert tensors count the distinct
                                       experts each pass multiplies (the routing is the model's own)
    expert_union(model, prompt, sizes) {T: mean distinct experts per MoE layer} of verify passes of T tokens
    step_cost_curve(model, k_max, ...) the adaptive draft length's prior T(k) on this model (adaptive.py:
                                       1 + cost_prior k, plus the extra expert bytes of k + 1 rows over one)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..model import Model
from ..moe import experts_linear

EXPERT_MATRICES = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")


def uniform_union(n_expert: int, n_used: int, T: int) -> float:
    """Expected distinct experts read by T rows that each pick n_used of n_expert uniformly at random."""
    return n_expert * (1.0 - (1.0 - n_used / n_expert) ** T)


@dataclass
class ExpertTally:
    """Distinct experts per MoE layer call: calls[i] = (layer, U) in call order."""

    calls: list[tuple[int, int]] = field(default_factory=list)

    def reset(self) -> None:
        self.calls.clear()

    def mean_distinct(self) -> float:
        return float(np.mean([u for _, u in self.calls])) if self.calls else 0.0


class TalliedExperts:
    """An expert tensor that records, on each grouped matmul, how many distinct experts it multiplies, then
    multiplies them as the tensor it wraps would (moe.experts_linear: packed or float)."""

    def __init__(self, inner, layer: int, tally: ExpertTally, kernels, to_host):
        self.inner, self.layer, self.tally, self.kernels, self.to_host = inner, layer, tally, kernels, to_host
        self.shape, self.nbytes = tuple(inner.shape), inner.nbytes

    def experts_linear(self, x, experts: np.ndarray, offsets: np.ndarray):
        # the non-empty groups: all of them on the host; the cuda backend's list every expert (U = E, device
        # offsets), so its count comes back here, one sync a call: a measurement, not the model's path
        self.tally.calls.append((self.layer, int(np.count_nonzero(np.diff(self.to_host(offsets))))))
        return experts_linear(x, self.inner, experts, offsets, self.kernels)


def tallied(model: Model) -> tuple[Model, ExpertTally]:
    """A new Model over the same weights and kernels whose every layer's ffn_gate_exps (one grouped matmul per MoE
    layer and pass) is a TalliedExperts: its passes compute the same numbers and fill the tally."""
    if not model.cfg.n_expert:
        raise ValueError("tallied: the model has no experts (a dense qwen35)")
    tally = ExpertTally()
    tensors = dict(model.tensors)
    for name, t in model.tensors.items():
        if name.endswith(".ffn_gate_exps.weight"):
            tensors[name] = TalliedExperts(t, int(name.split(".")[1]), tally, model.kernels, model.to_host)
    return Model(model.cfg, tensors, model.metadata, model.kernels, model.placement, model.source, model.path), tally


def expert_union(model: Model, prompt: list[int], sizes=range(1, 10), repeats: int = 3, seed: int = 0) -> dict[int, float]:
    """{T: mean over MoE layers and `repeats` windows of the distinct experts a verify pass of T tokens reads},
    each window T random tokens after the prompt (the bench's verify windows are random ids too)."""
    counted, tally = tallied(model)
    state = counted.new_state()
    counted.forward(np.array(prompt), state, logits=False)
    rng, out = np.random.default_rng(seed), {}
    for T in sizes:
        tally.reset()
        for _ in range(repeats):
            counted.forward(rng.integers(0, model.cfg.n_vocab, T), state.copy(), logits=False)
        out[T] = tally.mean_distinct()
    return out


def expert_bytes(model: Model) -> tuple[int, int]:
    """(bytes of one expert's three matrices summed over the trunk's MoE layers, every other trunk + output byte)."""
    per_expert, shared = 0, model.output.nbytes
    for layer in model.layers:
        for name, t in layer.items():
            if name in EXPERT_MATRICES:
                per_expert += t.nbytes // t.shape[0]
            else:
                shared += t.nbytes
    return per_expert, shared


def step_cost_curve(model: Model, k_max: int, cost_prior: float = 0.3, union: dict[int, float] | None = None
                    ) -> tuple[float, ...]:
    """The prior T(k), k = 0..k_max, in plain steps, for AdaptiveDraftLength(cost_curve=...) on this model: the
    dense prior 1 + cost_prior k plus what k + 1 verify rows read in experts beyond one row's, as a fraction of
    a one-token pass's bytes. union: {T: distinct experts} measured (expert_union); default uniform_union (an
    upper bound: trained routers share experts between neighbouring tokens). A dense model: 1 + cost_prior k."""
    if not model.cfg.n_expert:
        return tuple(1.0 + cost_prior * k for k in range(k_max + 1))
    E, k_e = model.cfg.n_expert, model.cfg.n_expert_used
    per_expert, shared = expert_bytes(model)

    def u(T: int) -> float:
        return union[T] if union is not None and T in union else uniform_union(E, k_e, T)

    one = shared + u(1) * per_expert
    return tuple(1.0 + cost_prior * k + (u(k + 1) - u(1)) * per_expert / one for k in range(k_max + 1))
