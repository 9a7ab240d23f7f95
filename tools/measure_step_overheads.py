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
from tinyspec.state import ModelState, SnapshotRing


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


def measure(cfg: ModelConfig, k: int, repeat: int) -> dict:
    state = ModelState(cfg)
    ring = SnapshotRing(cfg, k + 1)
    return {
        "k": k,
        "ring_mb": sum(c.nbytes + s.nbytes for c, s in zip(ring.conv, ring.ssm) if c is not None) / 1e6,
        "ring_alloc_ms": median_ms(lambda: fill(SnapshotRing(cfg, k + 1)), repeat),
        "ring_reuse_ms": median_ms(lambda: fill(ring), repeat),
        "restore_ms": median_ms(lambda: restore_gdn(ring, state, k // 2), repeat),
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
