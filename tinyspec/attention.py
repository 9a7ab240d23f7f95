"""Gated full attention of qwen35 (every `full_attention_interval`-th layer, and the MTP block).

For the T new tokens at positions p .. p+T-1 (x is the input after attn_norm):

    qg   = attn_q @ x          per head h: [q_h (d) | gate_h (d)]  interleaved per head, not split in halves
    k, v = attn_k @ x, attn_v @ x                                   H_kv heads of d
    q_h  = rope(rms_norm(q_h, attn_q_norm)),  k_j = rope(rms_norm(k_j, attn_k_norm))
    o_h  = softmax(scale * K_j[:n] q_h) V_j[:n]     j = h // (H / H_kv)  (grouped GQA), n = pos + 1 (causal)
    out  = attn_output @ (concat_h o_h * sigmoid(concat_h gate_h))

rope rotates only the first n_rot dims of each head (NEOX pairs i, i + n_rot/2); scale = 1/sqrt(d).
The KV cache stores k after norm and rope, and v as projected.

Batch invariance: each query row is computed by its own calls over exactly the n keys it may see,
the same calls a one-token decode at that position makes, so a verify pass of T tokens reproduces the
decode results bit for bit (tests/test_model.py checks it).

Official implementation: llama.cpp `src/models/qwen35.cpp` build_layer_attn; HF transformers
`Qwen3_5Attention` (modeling_qwen3_5.py). Does NOT include: sliding windows, M-RoPE for images.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

import numpy as np

from .config import ModelConfig
from .ops import rope_neox, softmax
from .state import KVCache

if TYPE_CHECKING:
    from .kernels import Kernels


def attend(q: np.ndarray, keys: np.ndarray, values: np.ndarray, n_past: int, scale: np.float32) -> np.ndarray:
    """Causal grouped attention of T new query rows: q [T, H_kv, G, d]; keys, values [>= n_past + T, H_kv, d]
    (the cache's arrays, the T new rows already in) -> o [T, H_kv, G, d].

    Row t sees the n = n_past + t + 1 keys up to its own position: o = softmax(scale * K[:n] q) V[:n], per kv
    head for its G query heads, with exactly the calls a one-token pass at that position makes.
    """
    T, H_kv, G, d = q.shape
    o = np.empty_like(q)  # float32, on q's device
    for t in range(T):
        n = n_past + t + 1  # keys visible to this row (causal)
        k_t = np.copy(keys[:n].transpose(1, 0, 2), order="C")  # [H_kv, n, d]
        v_t = np.copy(values[:n].transpose(1, 0, 2), order="C")  # [H_kv, n, d]
        scores = np.matmul(q[t], k_t.transpose(0, 2, 1)) * scale  # [H_kv, G, n]
        o[t] = np.matmul(softmax(scores), v_t)  # [H_kv, G, d]
    return o


def attention_layer(x: np.ndarray, w: Mapping[str, np.ndarray], cache: KVCache, cfg: ModelConfig,
                    kern: Kernels | None = None) -> np.ndarray:
    """[T, D] -> [T, D]. Appends the T new keys/values to `cache`; positions continue from cache.n.
    kern: the functions to compute with (kernels.py: the matmul, the norms, the gate and `attend`, the
    function above or one with its contract, e.g. fast/numba_attention.py's); None: the oracle's."""
    if kern is None:
        from .kernels import NUMPY as kern  # imported here: kernels.py imports this module for its defaults
    T = x.shape[0]
    H, H_kv, d = cfg.n_head, cfg.n_head_kv, cfg.head_dim
    G = H // H_kv  # query heads per kv head
    positions = np.arange(cache.n, cache.n + T)

    qg = kern.linear(x, w["attn_q.weight"]).reshape(T, H, 2 * d)  # [T, H, 2d]
    q, gate = qg[..., :d], qg[..., d:].reshape(T, H * d)  # [T, H, d], [T, H*d]
    k = kern.linear(x, w["attn_k.weight"]).reshape(T, H_kv, d)  # [T, H_kv, d]
    v = kern.linear(x, w["attn_v.weight"]).reshape(T, H_kv, d)
    q = rope_neox(kern.rms_norm(q, w["attn_q_norm.weight"], cfg.rms_eps), positions, cfg.n_rot, cfg.rope_base)
    k = rope_neox(kern.rms_norm(k, w["attn_k_norm.weight"], cfg.rms_eps), positions, cfg.n_rot, cfg.rope_base)
    n_past = cache.n
    cache.append(k, v)

    o = kern.attend(q.reshape(T, H_kv, G, d), cache.k, cache.v, n_past, np.float32(cfg.attn_scale))  # [T, H_kv, G, d]
    attn = o.reshape(T, H * d) * kern.sigmoid(gate)  # [T, H*d]
    return kern.linear(attn, w["attn_output.weight"])
