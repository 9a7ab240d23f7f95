"""Per-sequence model state: what each layer remembers between forward calls.

    attention layer  KVCache   keys (after q/k-norm and rope) and values of every past position
    GDN layer        GDNState  conv: the last w-1 raw qkv projections  [C, w-1]  (oldest first)
                               ssm:  the delta-rule memory per value head [n_v, K, V]

The two kinds of state behave differently under rollback, which is the whole difficulty of
speculative decoding on hybrid models: a KV cache is a list, so forgetting the last r tokens is
`truncate(n - r)`; a GDN state is a running sum that has already absorbed those tokens, so it cannot
be truncated, only restored from a copy taken at the right token boundary (the snapshot ring of the
speculative engine) or recomputed.

Does NOT include: the snapshot ring (speculative engine), paged or quantized KV caches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import ModelConfig


class KVCache:
    """Keys and values of one attention layer, grown in place (capacity doubles; no per-token allocation)."""

    def __init__(self, n_head_kv: int, head_dim: int, capacity: int = 64):
        self.k = np.zeros((capacity, n_head_kv, head_dim), np.float32)  # [capacity, H_kv, d]
        self.v = np.zeros((capacity, n_head_kv, head_dim), np.float32)
        self.n = 0  # positions filled

    def append(self, k: np.ndarray, v: np.ndarray) -> None:  # [T, H_kv, d] each
        T = k.shape[0]
        if self.n + T > self.k.shape[0]:
            capacity = max(2 * self.k.shape[0], self.n + T)
            for name in ("k", "v"):
                grown = np.zeros((capacity,) + self.k.shape[1:], np.float32)
                grown[: self.n] = getattr(self, name)[: self.n]
                setattr(self, name, grown)
        self.k[self.n : self.n + T] = k
        self.v[self.n : self.n + T] = v
        self.n += T

    def truncate(self, n: int) -> None:
        """Forget every position >= n."""
        if not 0 <= n <= self.n:
            raise ValueError(f"KVCache.truncate({n}): cache holds {self.n} positions")
        self.n = n

    def copy(self) -> "KVCache":
        out = KVCache(self.k.shape[1], self.k.shape[2], max(1, self.n))
        out.append(self.k[: self.n], self.v[: self.n])
        return out

    def max_abs_diff(self, other: "KVCache") -> float:
        if self.n != other.n:
            return float("inf")
        if self.n == 0:
            return 0.0
        return float(max(np.abs(self.k[: self.n] - other.k[: other.n]).max(), np.abs(self.v[: self.n] - other.v[: other.n]).max()))


@dataclass
class GDNState:
    """Conv window and recurrent memory of one Gated DeltaNet layer (zeros before the first token)."""

    conv: np.ndarray  # [C, w-1]
    ssm: np.ndarray  # [n_v, K, V]

    @classmethod
    def zeros(cls, cfg: ModelConfig) -> "GDNState":
        return cls(
            np.zeros((cfg.ssm_conv_channels, cfg.ssm_conv_kernel - 1), np.float32),
            np.zeros((cfg.ssm_n_v_heads, cfg.ssm_head_k_dim, cfg.ssm_head_v_dim), np.float32),
        )

    def copy(self) -> "GDNState":
        return GDNState(self.conv.copy(), self.ssm.copy())

    def max_abs_diff(self, other: "GDNState") -> float:
        return float(max(np.abs(self.conv - other.conv).max(), np.abs(self.ssm - other.ssm).max()))


class ModelState:
    """Everything one sequence has seen: a GDNState or KVCache per trunk layer, and the position count."""

    def __init__(self, cfg: ModelConfig):
        self.layers: list[GDNState | KVCache] = [
            GDNState.zeros(cfg) if recurrent else KVCache(cfg.n_head_kv, cfg.head_dim) for recurrent in cfg.recurrent
        ]
        self.pos = 0  # tokens consumed = position of the next token

    def copy(self) -> "ModelState":
        out = object.__new__(ModelState)
        out.layers = [layer.copy() for layer in self.layers]
        out.pos = self.pos
        return out

    def truncate_kv(self, n: int) -> None:
        """Drop attention positions >= n. GDN states cannot be truncated (see module docstring): the
        caller must restore them from a snapshot taken at token boundary n."""
        if not 0 <= n <= self.pos:
            raise ValueError(f"truncate_kv({n}): state holds {self.pos} positions")
        for layer in self.layers:
            if isinstance(layer, KVCache):
                layer.truncate(n)
        self.pos = n

    def max_abs_diff(self, other: "ModelState") -> float:
        """Largest difference over every cached number; inf when the positions differ."""
        if self.pos != other.pos:
            return float("inf")
        return max((a.max_abs_diff(b) for a, b in zip(self.layers, other.layers)), default=0.0)
