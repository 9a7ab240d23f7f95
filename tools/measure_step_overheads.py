"""Measure what a speculative step pays besides the weights: snapshot-ring allocation and rollback copies.

    python tools/measure_step_overheads.py --model FILE.gguf [--k 3] [--repeat 15] [--json]

Only the file's header is read (ModelConfig), so a `synth` file at a real shape works without loading
weights (python -m tinyspec synth --shape 0.8b --quant q4_k_m -o synth-0.8b.gguf). For a verify pass of
k + 1 tokens the scan writes the GDN state after every token into a SnapshotRing of k + 1 slots
(tinyspec/state.py), and a rejection restores one slot. Reported (median milliseconds, one process):

    ring_alloc_ms   allocate a fresh ring and write every slot (what a loop that builds its ring per step pays)
    ring_reuse_ms   write every slot of a ring allocated once (the writes the scan does anyway)
    restore_ms      copy one slot back into the live GDN state (the rollback; KV caches are just truncated)
    ring_mb         bytes of the ring
    replay_restore_ms  [j = 1..k]: a ReplayRing rollback keeping j of the k + 1 tokens (the cpu backend's ring:
                    no slots written during the pass; the conv and the scan rerun over the j kept tokens
                    from the state before the pass, here with random inputs and the Numba kernels)

The difference ring_alloc_ms - ring_reuse_ms is the price of a per-step allocation: fresh pages are
zeroed and faulted in by the kernel on first touch, every step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from tinyspec.config import ModelConfig
from tinyspec.gguf import read_gguf
from tinyspec.state import GDNState, KVCache, ModelState, ReplayRing, SnapshotRing


def median_ms(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def fill(ring: SnapshotRing) -> None:  # what the scan does during a verify pass: every slot written
    for conv, ssm in zip(ring.conv, ring.ssm):
        if conv is not None:
            conv.fill(1.0)
            ssm.fill(1.0)


def restore_gdn(ring: SnapshotRing, state: ModelState, slot: int) -> None:  # SnapshotRing.restore's copies
    for layer, conv, ssm in zip(state.layers, ring.conv, ring.ssm):
        if conv is not None:
            np.copyto(layer.conv, conv[slot])
            np.copyto(layer.ssm, ssm[slot])


def replay_restore_ms(cfg: ModelConfig, k: int, repeat: int) -> list[float]:
    """Median ms of ReplayRing.restore keeping j = 1..k tokens, after a recorded pass of k + 1 random tokens."""
    try:
        from tinyspec.fast.numba_gdn import causal_conv, gdn_scan
    except ImportError:  # no Numba: the oracle's functions (slower)
        from tinyspec.gdn import causal_conv, gdn_scan
    rng = np.random.default_rng(0)
    T, HV, K, V, C = k + 1, cfg.ssm_n_v_heads, cfg.ssm_head_k_dim, cfg.ssm_head_v_dim, cfg.ssm_conv_channels
    f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    state, ring = ModelState(cfg), ReplayRing(cfg, T, causal_conv, gdn_scan)
    for layer, log in zip(state.layers, ring.log):
        if log is None:
            continue
        unit = lambda a: a / np.linalg.norm(a, axis=-1, keepdims=True)  # noqa: E731
        scan_inputs = (unit(f32(T, HV, K)), unit(f32(T, HV, K)), f32(T, HV, V), -np.abs(f32(T, HV)), np.abs(f32(T, HV)))
        ssm, conv = 0.01 * f32(HV, K, V), f32(C, cfg.ssm_conv_kernel - 1)  # the pre-pass memory and window
        before = GDNState(conv, ssm)
        log.record(before, (f32(T, C), f32(C, cfg.ssm_conv_kernel)), scan_inputs)
    ring.mark_pass(0, T)

    def restore(slot: int) -> None:
        for layer in state.layers:  # the state after the pass: T positions (the KV caches hold T rows)
            if isinstance(layer, KVCache):
                layer.n = T
        state.pos = T
        ring.restore(state, slot)

    for layer in state.layers:
        if isinstance(layer, KVCache):
            layer.append(*(np.zeros((T, cfg.n_head_kv, cfg.head_dim), np.float32),) * 2)
    return [median_ms(lambda: restore(j - 1), repeat) for j in range(1, k + 1)]


def measure(cfg: ModelConfig, k: int, repeat: int) -> dict:
    state = ModelState(cfg)
    ring = SnapshotRing(cfg, k + 1)
    return {
        "k": k,
        "ring_mb": sum(c.nbytes + s.nbytes for c, s in zip(ring.conv, ring.ssm) if c is not None) / 1e6,
        "ring_alloc_ms": median_ms(lambda: fill(SnapshotRing(cfg, k + 1)), repeat),
        "ring_reuse_ms": median_ms(lambda: fill(ring), repeat),
        "restore_ms": median_ms(lambda: restore_gdn(ring, state, k // 2), repeat),
        "replay_restore_ms": replay_restore_ms(cfg, k, repeat),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--model", required=True, help="a qwen35 GGUF (only its header is read)")
    ap.add_argument("--k", type=int, default=3, help="drafts per step: the ring has k + 1 slots (3)")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if not 1 <= a.k <= 64:
        ap.error(f"--k must be in 1..64, got {a.k}")
    with read_gguf(a.model) as g:
        embd = g.tensors.get("token_embd.weight")
        cfg = ModelConfig.from_gguf(g.metadata, n_vocab=embd.shape[0] if embd is not None else None)
    r = measure(cfg, a.k, a.repeat)
    if a.json:
        print(json.dumps(r, indent=1))
    else:
        print(f"ring of {a.k + 1} slots, {r['ring_mb']:.1f} MB: allocate + write {r['ring_alloc_ms']:.1f} ms, "
              f"write a reused ring {r['ring_reuse_ms']:.1f} ms, restore one slot {r['restore_ms']:.1f} ms")
        print("ReplayRing rollback keeping j = 1.." + str(a.k) + " tokens: "
              + ", ".join(f"{t:.2f}" for t in r["replay_restore_ms"]) + " ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
