"""The feed-forward half of a layer, with its norm and residual: x + FFN(rms_norm(x, post_attention_norm)).

    FFN(u) = ffn_down (silu(ffn_gate u) * ffn_up u)       a dense layer (ops.swiglu)
           = the routed experts and the shared expert     a qwen35moe layer (moe.py; it has a router)

Every function it computes with comes from the Kernels it is handed (kern): model.py calls kern.ffn_residual, the
oracle's being the one below, and a backend may compute the whole block in one call (fast/numba_steps.py).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from .moe import moe_ffn


def ffn(x: np.ndarray, w: Mapping[str, np.ndarray], kern, n_used: int = 0) -> np.ndarray:
    """[T, D] -> [T, D]: the SwiGLU FFN, or on a qwen35moe layer (it has a router) the experts' (moe.py; n_used:
    experts per token)."""
    if "ffn_gate_inp.weight" in w:
        return moe_ffn(x, w, n_used, kern)
    return kern.swiglu(x, w["ffn_gate.weight"], w["ffn_up.weight"], w["ffn_down.weight"], kern)  # ops.swiglu


def ffn_residual(x: np.ndarray, w: Mapping[str, np.ndarray], cfg, kern) -> np.ndarray:  # [T, D] -> [T, D]
    """x + ffn(rms_norm(x, post_attention_norm)): the second half of every layer (and of the MTP block)."""
    return x + ffn(kern.rms_norm(x, w["post_attention_norm.weight"], cfg.rms_eps), w, kern, cfg.n_expert_used)
