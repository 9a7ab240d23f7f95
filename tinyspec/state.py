"""Per-sequence model state: what each layer remembers between forward calls.

    attention layer  KVCache   keys (after q/k-norm and rope) and values of every past position
    GDN layer        GDNState  conv: the last w-1 raw qkv projections  [C, w-1]  (oldest first)
                               ssm:  the delta-rule memory per value head [n_v, K, V]

The two kinds of state behave differently under rollback, which is the whole difficulty of
speculative decoding on hybrid models: a KV cache is a list, so forgetting the last r tokens is
`truncate(n - r)`; a GDN state is a running sum that has already absorbed those tokens, so it cannot
be truncated, only restored from a copy taken at the right token boundary (the snapshot ring of the
speculative engine) or recomputed.

Two ways to roll back, the same bits (tests/test_speculate.py checks both against a fresh run):

    SnapshotRing  copy  the pass writes the state after every token (k + 1 states), a rollback copies one
    ReplayRing    redo  the pass keeps the state from before it and the tokens' inputs (conv and delta
                        rule), a rollback reruns the kept tokens' steps (the GDN state is a function of them)

SnapshotRing is that set of copies: buffers allocated once per sequence, filled during a T-token
verify pass with the GDN state after every token (by the scan itself, see gdn.gdn_layer), so that
keeping the first j tokens is a copy of entry j-1 back into the state plus a KV truncate: no recompute,
no allocation. Every rollback range is validated (a bad one is a bug: it raises, never writes out of
bounds; peers shipped a CVE for exactly that, docs/peers.md section 5).

ReplayRing trades the copies for recompute. A 4-token verify pass of the 0.8B shape writes 72 MB of
snapshots (18 GDN layers x 4 tokens x 1 MB of memory, plus the conv windows) on every step, whether or
not a draft is rejected, so that a rollback can copy back one entry. A replay reads one state per layer and
reruns the j <= k kept tokens (a base read and a state written per layer: the memory traffic of the copy it
replaces), and only when a draft was rejected. The scan writes its result into the ring's spare buffer and
the two buffers swap (the state's old memory becomes the ring's base), so keeping the pre-pass state costs
no copy either. The cpu backend uses it
(its Placement says rollback="replay", and Model.new_ring follows it; `bench --rollback` picks either); the
oracle and cuda keep SnapshotRing (on a GPU the copies are cheap and a replay would add launches to a
rejection). LESSONS.md 15 measures both rings (docs/performance-log.md, old 25, the history). Both share
RollbackRing: the entry bookkeeping, the range checks, and the one interface a GDN layer writes through
(each ring's per-layer view).

Where the numbers live: every class takes `xp`, the array module that allocates its buffers (NumPy by
default; the cuda backend passes CuPy, so states, caches and rings stay on the GPU and rollback is a
device-to-device copy). Only NumPy functions that dispatch on their arguments (copyto, abs) touch them.

Many sequences keep their KV in one pool of blocks instead (paged.py; ModelState(..., pool=...)).
Does NOT include: quantized KV caches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import ModelConfig
from .paged import PagedKVCache, kv_max_abs_diff


def zeros_aligned(shape, xp=np, align: int = 64):
    """xp.zeros(shape, float32) starting on an `align`-byte boundary. NumPy's large arrays start 16 bytes
    into a page; CuPy's allocations are 256-byte aligned already."""
    if xp is not np:
        return xp.zeros(shape, np.float32)
    n = int(np.prod(shape))
    raw = np.zeros(n + align // 4, np.float32)
    start = (-raw.ctypes.data % align) // 4
    return raw[start : start + n].reshape(shape)


class KVCache:
    """Keys and values of one attention layer, grown in place (capacity doubles; no per-token allocation)."""

    def __init__(self, n_head_kv: int, head_dim: int, capacity: int = 64, xp=np):
        self.xp = xp
        self.k = xp.zeros((capacity, n_head_kv, head_dim), np.float32)  # [capacity, H_kv, d]
        self.v = xp.zeros((capacity, n_head_kv, head_dim), np.float32)
        self.n = 0  # positions filled

    def append(self, k: np.ndarray, v: np.ndarray) -> None:  # [T, H_kv, d] each
        T = k.shape[0]
        self.reserve(self.n + T)
        self.k[self.n : self.n + T] = k
        self.v[self.n : self.n + T] = v
        self.n += T

    def reserve(self, n_positions: int) -> None:
        """Room for n_positions (the capacity doubles, or more: new arrays, the old positions copied over)."""
        if n_positions > self.k.shape[0]:
            capacity = max(2 * self.k.shape[0], n_positions)
            self.k, self.v = self._grown(self.k, capacity), self._grown(self.v, capacity)

    def claim(self, T: int) -> None:
        """Positions n .. n+T-1 will be written by a device pass (fast/rowmap.py claim): room made, n advanced, no
        write."""
        self.reserve(self.n + T)
        self.n += T

    def pools(self) -> tuple[np.ndarray, np.ndarray]:
        """The keys and values as a pool of one block as long as the capacity: [1, capacity, H_kv, d] views."""
        return self.k[None], self.v[None]

    def _grown(self, a: np.ndarray, capacity: int) -> np.ndarray:  # [old capacity, H_kv, d] -> [capacity, H_kv, d]
        """A larger buffer holding a's first n positions (the rest zeros)."""
        grown = self.xp.zeros((capacity,) + a.shape[1:], np.float32)
        grown[: self.n] = a[: self.n]
        return grown

    def truncate(self, n: int) -> None:
        """Forget every position >= n."""
        if not 0 <= n <= self.n:
            raise ValueError(f"KVCache.truncate({n}): cache holds {self.n} positions")
        self.n = n

    rewind = truncate  # (paged.PagedKVCache.rewind keeps its blocks; a contiguous cache keeps its capacity anyway)

    def attend(self, kern, q: np.ndarray, n_past: int, scale: np.float32) -> np.ndarray:
        """kern.attend over this cache (q [T, H_kv, G, d] -> [T, H_kv, G, d]); a paged cache reads its blocks
        instead (paged.PagedKVCache.attend): the cache says how its keys are read."""
        return kern.attend(q, self.k, self.v, n_past, scale)

    def contents(self) -> tuple[np.ndarray, np.ndarray]:
        """The keys and values of positions 0 .. n-1: [n, H_kv, d] each."""
        return self.k[: self.n], self.v[: self.n]

    def gather(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The keys and values of `positions` [m] (< n), in that order: [m, H_kv, d] each (a tree row's view)."""
        return self.k[positions], self.v[positions]

    def move_rows(self, first: int, rows: np.ndarray) -> None:
        """Move positions first + rows[j] to first + j (rows increasing, rows[j] >= j: a tree's kept path moved to
        where a plain decode writes it); the caller then truncates after them (ModelState.truncate_kv)."""
        src = first + np.asarray(rows, np.int64)
        self.k[first : first + len(src)], self.v[first : first + len(src)] = self.k[src], self.v[src]  # copies first

    def copy(self) -> "KVCache":
        out = KVCache(self.k.shape[1], self.k.shape[2], max(1, self.n), self.xp)
        out.append(*self.contents())
        return out

    def max_abs_diff(self, other) -> float:  # another KVCache or a paged.PagedKVCache
        return kv_max_abs_diff(self, other)


@dataclass
class GDNState:
    """Conv window and recurrent memory of one Gated DeltaNet layer (zeros before the first token)."""

    conv: np.ndarray  # [C, w-1]
    ssm: np.ndarray  # [n_v, K, V]

    @classmethod
    def zeros(cls, cfg: ModelConfig, xp=np) -> "GDNState":
        return cls(
            xp.zeros((cfg.ssm_conv_channels, cfg.ssm_conv_kernel - 1), np.float32),
            xp.zeros((cfg.ssm_n_v_heads, cfg.ssm_head_k_dim, cfg.ssm_head_v_dim), np.float32),
        )

    def copy(self) -> "GDNState":
        return GDNState(self.conv.copy(), self.ssm.copy())

    def max_abs_diff(self, other: "GDNState") -> float:
        return float(max(np.abs(self.conv - other.conv).max(), np.abs(self.ssm - other.ssm).max()))


class ModelState:
    """Everything one sequence has seen: a GDNState or KVCache per trunk layer, and the position count.

    pool: None for a sequence of its own (a contiguous KVCache per attention layer), or a paged.BlockPool
    shared by many sequences: the attention layers are then PagedKVCache views of it through one table per
    sequence (self.table: a BlockTable for the model the pool was made for, a ViewTable for another model's,
    a draft model's: BlockPool.table_for), and release() gives the blocks back when the sequence ends."""

    def __init__(self, cfg: ModelConfig, xp=np, pool=None):
        self.table = None if pool is None else pool.table_for(cfg)
        self.layers: list = [
            GDNState.zeros(cfg, xp) if recurrent
            else KVCache(cfg.n_head_kv, cfg.head_dim, xp=xp) if pool is None else PagedKVCache(self.table, i)
            for i, recurrent in enumerate(cfg.recurrent)
        ]
        self.pos = 0  # tokens consumed = position of the next token

    def release(self) -> None:
        """The sequence is over (or preempted): give its KV blocks back to the pool (a contiguous cache has none
        to give; it forgets its positions)."""
        self.truncate_kv(0)

    def reset(self) -> None:
        """Begin again as a fresh state, in the same arrays: every KV block given back (release), every GDN layer's
        window and memory zeroed in place. A slot's next sequence reuses its state this way, so the device arrays a
        CUDA graph baked in stay the slot's (fast/cuda_pass.py: a slot's graphs outlive its sequence)."""
        self.release()
        for layer in self.layers:
            if isinstance(layer, GDNState):
                layer.conv.fill(0)
                layer.ssm.fill(0)

    def gdn_copy(self) -> list[tuple]:
        """A copy of every GDN layer's (conv window [C, w-1], memory [HV, K, V]): what a prefix cache saves."""
        return [(layer.conv.copy(), layer.ssm.copy()) for layer in self.layers if isinstance(layer, GDNState)]

    def start_from(self, blocks: list[int], saved: list[tuple]) -> None:
        """A fresh paged state begins after a cached prefix: its table adopts the prefix's full `blocks` (shared,
        never written), every GDN layer copies the state saved there (gdn_copy's list) into its own buffers."""
        if self.pos:
            raise ValueError("only a fresh state can start from a cached prefix")
        self.table.adopt(blocks)
        n = len(blocks) * self.table.block_size
        saved = iter(saved)
        for layer in self.layers:
            if isinstance(layer, GDNState):
                conv, ssm = next(saved)
                np.copyto(layer.conv, conv)
                np.copyto(layer.ssm, ssm)
            else:
                layer.start_at(n)  # a PagedKVCache: its positions are the adopted blocks'
        self.pos = n

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
            if not isinstance(layer, GDNState):  # a KVCache or a PagedKVCache
                layer.truncate(n)
        self.pos = n

    def max_abs_diff(self, other: "ModelState") -> float:
        """Largest difference over every cached number; inf when the positions differ."""
        if self.pos != other.pos:
            return float("inf")
        return max((a.max_abs_diff(b) for a, b in zip(self.layers, other.layers)), default=0.0)


class RollbackRing:
    """What both rings share: the token count each entry of the last pass leaves, and the checks of a rollback.

    pos[t] = number of tokens the state holds after entry t; filled = entries written by the last pass.
    A verify pass (Model.forward(..., ring=ring)) calls mark_pass, then hands GDN layer i its per-layer view,
    ring.layer(i), which every ring's view answers the same way (gdn.gdn_layer makes one scan call with it):

        conv_states  [>= T, C, w-1] or None    where the conv writes its window after each token
        ssm_states   [>= T, n_v, K, V] or None where the scan writes the memory after each token
        conv_out(state) -> [C, w-1] or None    where the conv writes the new window (None: a fresh array)
        memory_out(state) -> [n_v, K, V]       where the scan writes the new memory
        record(state, conv_inputs, scan_inputs)   called after the scan, while `state` still holds the
                                               pre-pass conv window (unless conv_out returned state.conv)
                                               and memory (unless memory_out returned state.ssm); the
                                               inputs are (mixed [T, C], conv weight) and
                                               (q, k, v, log_decay, beta)
    """

    def __init__(self, entries: int):
        if entries < 1:
            raise ValueError(f"{type(self).__name__} needs at least one entry, got {entries}")
        self.size = entries
        self.pos = np.zeros(entries, np.int64)  # host bookkeeping
        self.filled = 0

    def mark_pass(self, pos_before: int, n_tokens: int) -> None:
        """Record that a forward of n_tokens from pos_before filled entries 0 .. n_tokens-1."""
        if not 1 <= n_tokens <= self.size:
            raise ValueError(f"a pass of {n_tokens} tokens does not fit a ring of {self.size} entries")
        self.pos[:n_tokens] = np.arange(pos_before + 1, pos_before + n_tokens + 1)
        self.filled = n_tokens

    def mark_tree(self, pos_before: int, depths: np.ndarray) -> None:
        """Record that a tree pass from pos_before filled entries 0 .. len(depths)-1: entry t is the state after
        row t's path, which holds pos_before + depths[t] + 1 tokens (tree.py)."""
        self.mark_pass(pos_before, len(depths))
        self.pos[: len(depths)] = pos_before + np.asarray(depths) + 1

    def kept(self, state: ModelState, entry: int) -> int:
        """The token count a rollback to `entry` keeps, after checking the entry and the state (a bad range is
        a bug: it raises before anything is written)."""
        if not 0 <= entry < self.filled:
            raise ValueError(f"rollback to ring entry {entry}: the ring holds entries 0 .. {self.filled - 1}")
        keep = int(self.pos[entry])
        if not 0 <= keep <= state.pos:
            raise ValueError(f"rollback to {keep} tokens: the state holds {state.pos}")
        return keep

    def layer(self, i: int):
        """GDN layer i's entry (the interface above)."""
        raise NotImplementedError

    def restore(self, state: ModelState, entry: int) -> None:
        """Roll `state` back to the tokens entry 0 .. `entry` of the last pass leave."""
        raise NotImplementedError


class SnapshotEntries:
    """One GDN layer's entry in a SnapshotRing: the conv and the scan write the state after every token here."""

    def __init__(self, conv_states: np.ndarray, ssm_states: np.ndarray):
        self.conv_states, self.ssm_states = conv_states, ssm_states  # [entries, C, w-1], [entries, n_v, K, V]

    def conv_out(self, state: GDNState) -> np.ndarray:
        return state.conv  # the new window overwrites the old in place: the entries hold the per-token copies

    def memory_out(self, state: GDNState) -> np.ndarray:
        return state.ssm  # the new memory overwrites the old in place: the entries hold the copies

    def record(self, state: GDNState, conv_inputs: tuple, scan_inputs: tuple) -> None:
        pass  # everything a rollback needs is in the entries already


class SnapshotRing(RollbackRing):
    """Per-token GDN snapshots for passes of up to `entries` tokens; allocated once, reused every step.

    conv[i] [entries, C, w-1], ssm[i] [entries, n_v, K, V] for GDN layer i (None for attention layers).
    """

    def __init__(self, cfg: ModelConfig, entries: int, xp=np):
        super().__init__(entries)
        C, w = cfg.ssm_conv_channels, cfg.ssm_conv_kernel
        shape_ssm = (entries, cfg.ssm_n_v_heads, cfg.ssm_head_k_dim, cfg.ssm_head_v_dim)
        self.conv = [xp.zeros((entries, C, w - 1), np.float32) if r else None for r in cfg.recurrent]
        self.ssm = [zeros_aligned(shape_ssm, xp) if r else None for r in cfg.recurrent]  # 64 B: streaming stores

    def layer(self, i: int) -> SnapshotEntries:
        return SnapshotEntries(self.conv[i], self.ssm[i])

    def save(self, state: ModelState, entry: int) -> None:
        """Copy the state's GDN layers into `entry` (used by drafters that step one token at a time)."""
        if not 0 <= entry < self.size:
            raise ValueError(f"ring entry {entry} is outside the ring's {self.size} entries")
        for layer, conv, ssm in zip(state.layers, self.conv, self.ssm):
            if conv is not None:
                conv[entry] = layer.conv
                ssm[entry] = layer.ssm
        self.pos[entry] = state.pos
        self.filled = max(self.filled, entry + 1)

    def restore(self, state: ModelState, entry: int) -> None:
        """Roll `state` back to entry: GDN layers copied in place, KV caches truncated. No recompute."""
        keep = self.kept(state, entry)
        self._copy_gdn(state, entry)
        state.truncate_kv(keep)

    def restore_path(self, state: ModelState, path: list[int]) -> None:
        """Roll `state` back to a path of the last tree pass (rows [0, r1, .., rm], root first, tree.path_to): every
        GDN layer from the entry of its last row, every KV cache's rows of the path moved to the positions a plain
        decode of those tokens writes (pos_before + j) and the rest forgotten. No recompute."""
        keep = self.kept(state, path[-1])
        first = keep - len(path)  # the tokens held before the pass
        if int(self.pos[0]) != first + 1:
            raise ValueError(f"path {path} does not start at the last pass's root")
        self._copy_gdn(state, path[-1])
        for layer in state.layers:
            if not isinstance(layer, GDNState):  # a KVCache or a PagedKVCache: every layer moves, then all truncate
                layer.move_rows(first, np.asarray(path, np.int64))
        state.truncate_kv(keep)

    def _copy_gdn(self, state: ModelState, entry: int) -> None:
        for layer, conv, ssm in zip(state.layers, self.conv, self.ssm):
            if conv is not None:
                np.copyto(layer.conv, conv[entry])
                np.copyto(layer.ssm, ssm[entry])


class ReplayLog:
    """One GDN layer's entry in a ReplayRing: its state before the last pass and that pass's inputs.

    spare [n_v, K, V]: the memory buffer not in the state. A pass scans state.ssm -> spare and the two
    swap, so after it `spare` holds the memory from before the pass (the base a replay starts from) and
    is overwritten by the next pass. conv: the conv window before the pass (conv_out is None, so the conv
    writes a new array and the old one is simply kept); conv_inputs: (mixed [T, C], the conv weight), what
    the conv consumed; scan_inputs: the pass's q, k, v, log_decay, beta ([T, ...] each). All references:
    recording copies nothing."""

    def __init__(self, shape, xp=np):
        self.conv_states = self.ssm_states = None  # nothing is written per token
        self.spare = zeros_aligned(shape, xp)
        self.conv, self.conv_inputs, self.scan_inputs = None, (), ()

    def conv_out(self, state: GDNState) -> None:
        return None  # the new window goes to a fresh array; state.conv stays the pre-pass window, record() keeps it

    def memory_out(self, state: GDNState) -> np.ndarray:
        return self.spare  # the new memory goes to the spare buffer; state.ssm stays the pre-pass memory

    def record(self, state: GDNState, conv_inputs: tuple, scan_inputs: tuple) -> None:
        """The pass wrote its memory into self.spare and the state is about to take it: keep what it replaces."""
        self.spare, self.conv, self.conv_inputs, self.scan_inputs = state.ssm, state.conv, conv_inputs, scan_inputs


class ReplayRing(RollbackRing):
    """Rollback by recomputation, the same interface and bits as SnapshotRing (mark_pass, layer, restore).

    log[i]: a ReplayLog (None for attention layers); nothing is written per token. restore(state, j)
    reruns each GDN layer's conv and scan over tokens 0..j from the state before the pass with the
    recorded inputs: the same functions, the same inputs, so the same bits as the pass computed after
    token j (neither a conv's window nor a scan's steps depend on how many tokens follow).
    conv, scan: the causal_conv and gdn_scan of the model's kernels (Model.new_ring), so a backend replays
    with the functions its passes ran."""

    def __init__(self, cfg: ModelConfig, entries: int, conv, scan, xp=np):
        super().__init__(entries)
        self.causal_conv, self.gdn_scan = conv, scan  # the functions a replay reruns
        shape_ssm = (cfg.ssm_n_v_heads, cfg.ssm_head_k_dim, cfg.ssm_head_v_dim)
        self.log = [ReplayLog(shape_ssm, xp) if r else None for r in cfg.recurrent]

    def layer(self, i: int) -> ReplayLog:
        return self.log[i]

    def restore(self, state: ModelState, entry: int) -> None:
        """Roll `state` back to entry: conv and scan rerun over tokens 0..entry from the state before the pass,
        KV caches truncated. (The engine never restores the pass's last entry: nothing was rejected.)"""
        keep = self.kept(state, entry)
        n = entry + 1
        for layer, log in zip(state.layers, self.log):
            if log is not None:  # the kept tokens' rows of each input; the outputs are thrown away
                mixed, weight = log.conv_inputs
                # in place: layer.conv is the window the pass made (conv_out was None), never log.conv, the base
                _, layer.conv = self.causal_conv(mixed[:n], log.conv, weight, out=layer.conv)
                _, layer.ssm = self.gdn_scan(*(a[:n] for a in log.scan_inputs), log.spare, out=layer.ssm)
        state.truncate_kv(keep)
