"""ModelConfig: every qwen35 hyperparameter, read from GGUF metadata and validated.

Keys and derivations follow llama.cpp (docs/qwen35.md section 1):

    n_layer_all = qwen35.block_count             trunk layers + MTP layers
    n_nextn     = qwen35.nextn_predict_layers     MTP blocks (0 or 1), absent = 0
    n_trunk     = n_layer_all - n_nextn           MTP block index = n_trunk
    layer i is Gated DeltaNet iff attention.recurrent_layers[i], or, without that array,
        iff (i + 1) % full_attention_interval != 0 (default interval 4: layers 3, 7, 11 are attention)

    GDN sizes:  K = ssm.state_size (key head dim), n_k = ssm.group_count (key heads),
                n_v = ssm.time_step_rank (value heads), V = ssm.inner_size / n_v (value head dim),
                conv channels C = 2 * n_k * K + n_v * V, conv width = ssm.conv_kernel
    attention:  H = attention.head_count, H_kv = attention.head_count_kv, d = attention.key_length,
                n_rot = rope.dimension_count (first n_rot dims of each head are rotated)

qwen35moe (the mixture-of-experts sibling, docs/qwen35.md section 8) has the same keys under its own prefix
(feed_forward_length may be absent: every FFN is an MoE) and adds
    E = expert_count, k_e = expert_used_count (experts per token), F_e = expert_feed_forward_length,
    F_s = expert_shared_feed_forward_length (the shared expert; absent or 0: none)

Does NOT include: qwen3next (fused qkvz), rope scaling (YaRN), per-layer head counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

SUPPORTED = ("qwen35", "qwen35moe")
NOT_YET = {
    "qwen3next": "Qwen3-Next (fused qkvz projections, MoE)",
}


class ConfigError(ValueError):
    """The GGUF's metadata does not describe a model tinyspec can run; the message says which key."""


@dataclass(frozen=True)
class ModelConfig:
    n_vocab: int
    n_embd: int  # D
    n_ff: int  # F
    n_layer_all: int
    n_nextn: int
    n_ctx: int
    rms_eps: float
    # full attention
    n_head: int  # H
    n_head_kv: int  # H_kv
    head_dim: int  # d
    n_rot: int
    rope_base: float
    attn_scale: float  # 1/sqrt(d) unless attention.scale is set
    # gated delta net
    ssm_conv_kernel: int
    ssm_head_k_dim: int  # K
    ssm_n_k_heads: int  # n_k
    ssm_n_v_heads: int  # n_v
    ssm_head_v_dim: int  # V
    recurrent: tuple[bool, ...]  # per trunk layer: True = Gated DeltaNet, False = full attention
    # mixture of experts (qwen35moe; 0 for the dense qwen35)
    arch: str = "qwen35"
    n_expert: int = 0  # E
    n_expert_used: int = 0  # experts per token
    n_ff_exp: int = 0  # F_e, one routed expert's FFN width
    n_ff_shexp: int = 0  # F_s, the shared expert's (0: none)

    @property
    def n_trunk(self) -> int:
        return self.n_layer_all - self.n_nextn

    @property
    def ssm_conv_channels(self) -> int:  # C = q + k + v channels of the causal conv
        return 2 * self.ssm_n_k_heads * self.ssm_head_k_dim + self.ssm_n_v_heads * self.ssm_head_v_dim

    @classmethod
    def from_gguf(cls, metadata: Mapping[str, Any], n_vocab: int | None = None) -> "ModelConfig":
        """Build from GGUF metadata. n_vocab defaults to the length of tokenizer.ggml.tokens."""
        arch = metadata.get("general.architecture")
        if arch in NOT_YET:
            raise ConfigError(f"architecture {arch!r} ({NOT_YET[arch]}) is not supported yet; tinyspec runs {SUPPORTED}")
        if arch not in SUPPORTED:
            raise ConfigError(f"architecture {arch!r} is not supported; tinyspec runs {', '.join(SUPPORTED)}")

        def get(key: str, default: Any = None, required: bool = True) -> Any:
            full = f"{arch}.{key}"
            if full not in metadata:
                if required:
                    raise ConfigError(f"missing metadata key {full}")
                return default
            value = metadata[full]
            if isinstance(value, (list, np.ndarray)):
                values = {int(v) for v in np.asarray(value).ravel() if v}
                if len(values) != 1:
                    raise ConfigError(f"{full}: per-layer values {sorted(values)} are not supported")
                value = values.pop()
            return value

        def positive(key: str, default: Any = None, required: bool = True) -> int:
            value = get(key, default, required)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
                raise ConfigError(f"{arch}.{key} must be a positive integer, got {value!r}")
            return int(value)

        if n_vocab is None:
            tokens = metadata.get("tokenizer.ggml.tokens")
            if tokens is None:
                raise ConfigError("missing metadata key tokenizer.ggml.tokens (needed for the vocabulary size)")
            n_vocab = len(tokens)
        n_layer_all = positive("block_count")
        n_nextn = int(get("nextn_predict_layers", 0, required=False))
        if n_nextn not in (0, 1):
            raise ConfigError(f"{arch}.nextn_predict_layers = {n_nextn}: qwen35 has at most one MTP block")
        if n_nextn >= n_layer_all:
            raise ConfigError(f"{arch}.block_count = {n_layer_all} leaves no trunk layers beside {n_nextn} MTP block")
        n_trunk = n_layer_all - n_nextn

        head_dim = positive("attention.key_length")
        value_length = positive("attention.value_length", head_dim, required=False)
        if value_length != head_dim:
            raise ConfigError(f"{arch}.attention.value_length = {value_length} differs from key_length = {head_dim}")
        n_head, n_head_kv = positive("attention.head_count"), positive("attention.head_count_kv")
        if n_head % n_head_kv:
            raise ConfigError(f"{arch}.attention.head_count = {n_head} is not a multiple of head_count_kv = {n_head_kv}")
        n_rot = positive("rope.dimension_count")
        if n_rot > head_dim or n_rot % 2:
            raise ConfigError(f"{arch}.rope.dimension_count = {n_rot} must be even and <= key_length = {head_dim}")
        scale = get("attention.scale", 0.0, required=False)

        n_k, n_v = positive("ssm.group_count"), positive("ssm.time_step_rank")
        inner, k_dim = positive("ssm.inner_size"), positive("ssm.state_size")
        if n_v % n_k:
            raise ConfigError(f"{arch}.ssm.time_step_rank = {n_v} (value heads) is not a multiple of ssm.group_count = {n_k} (key heads)")
        if inner % n_v:
            raise ConfigError(f"{arch}.ssm.inner_size = {inner} does not divide into {n_v} value heads")

        recurrent_key = f"{arch}.attention.recurrent_layers"
        if recurrent_key in metadata:
            flags = [bool(x) for x in metadata[recurrent_key]]
            if len(flags) != n_layer_all:
                raise ConfigError(f"{recurrent_key} has {len(flags)} entries, block_count is {n_layer_all}")
            if any(flags[n_trunk:]):
                raise ConfigError(f"{recurrent_key}: the MTP block must be a full-attention layer")
            recurrent = tuple(flags[:n_trunk])
        else:
            interval = positive("full_attention_interval", 4, required=False)
            recurrent = tuple((i + 1) % interval != 0 for i in range(n_trunk))

        moe = {}
        if arch == "qwen35moe":
            n_expert, n_used = positive("expert_count"), positive("expert_used_count")
            if n_used > n_expert:
                raise ConfigError(f"{arch}.expert_used_count = {n_used} exceeds expert_count = {n_expert}")
            shexp = get("expert_shared_feed_forward_length", 0, required=False)
            if isinstance(shexp, bool) or not isinstance(shexp, (int, np.integer)) or shexp < 0:
                raise ConfigError(f"{arch}.expert_shared_feed_forward_length must be an integer >= 0, got {shexp!r}")
            moe = dict(arch=arch, n_expert=n_expert, n_expert_used=n_used,
                       n_ff_exp=positive("expert_feed_forward_length"), n_ff_shexp=int(shexp))

        return cls(
            n_vocab=int(n_vocab),
            n_embd=positive("embedding_length"),
            n_ff=positive("feed_forward_length") if not moe else int(get("feed_forward_length", 0, required=False)),
            n_layer_all=n_layer_all,
            n_nextn=n_nextn,
            n_ctx=positive("context_length"),
            rms_eps=float(get("attention.layer_norm_rms_epsilon")),
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim=head_dim,
            n_rot=n_rot,
            rope_base=float(get("rope.freq_base", 10000.0, required=False)),
            attn_scale=float(scale) if scale else 1.0 / float(np.sqrt(head_dim)),
            ssm_conv_kernel=positive("ssm.conv_kernel"),
            ssm_head_k_dim=k_dim,
            ssm_n_k_heads=n_k,
            ssm_n_v_heads=n_v,
            ssm_head_v_dim=inner // n_v,
            recurrent=recurrent,
            **moe,
        )
