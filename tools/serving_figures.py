"""The figures of docs/serving.md: prefix cache, chunked prefill and preemption on the shipped tiny model.

    python tools/serving_figures.py [--backend cpu] [--prefix 256] [--prompts 8] [--long 1024] [--figures 123]

1. prefix cache  N prompts = a shared prefix + 8 tokens of their own, 2 slots, blocks of 16: prefill rows, wall
                 time and the memory of the saved GDN states, cache off and on (state_every 0 and 4)
2. chunking      two sequences decode while a long prompt joins: the longest step a running sequence waits
                 through, and the steps until the joining prompt's first token, chunk None / 256 / 64 / 16
3. preemption    8 prompts in 4 slots with a pool of 1.5 longest runs (the MTP heads' KV counted): preemptions,
                 recomputed rows, wall time
Every configuration's tokens are checked against the cache-off / unchunked run (exactness is the tests' job;
this only guards the figures)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

import tinyspec
from tinyspec.backends import load_model
from tinyspec.batch import batch_generate
from tinyspec.mtp import MTPDrafter
from tinyspec.scheduler import EngineOptions, blocks_per_run
from tinyspec.sequence import SeqResult
from tinyspec.speculate import Engine

MODEL = Path(tinyspec.__file__).resolve().parent / "assets" / "tiny-target.gguf"


def timed_run(model, prompts, max_new: int, slots: int, base: list | None, what: str, **options):
    """batch_generate with MTP (k = 2), timed: (its tokens, which become `base` if none yet, its stats, seconds).
    Its tokens must equal base's: `what` (the option under test) changed no output."""
    t0 = time.perf_counter()
    result = batch_generate(model, prompts, max_new, drafter=MTPDrafter(model), draft_n=2,
                            options=EngineOptions(slots=slots, **options))
    wall = time.perf_counter() - t0
    tokens = [s.tokens for s in result.sequences]
    assert base is None or tokens == base, f"{what} changed an output"
    return base or tokens, result.stats, wall


def prefix_cache(model, n_prefix: int, n_prompts: int) -> None:
    rng = np.random.default_rng(0)
    shared = [int(t) for t in rng.integers(10, 8000, n_prefix)]
    prompts = [shared + [int(t) for t in rng.integers(10, 8000, 8)] for _ in range(n_prompts)]
    cfg = model.cfg
    one_state = sum(4 * (cfg.ssm_conv_channels * (cfg.ssm_conv_kernel - 1) +
                         cfg.ssm_n_v_heads * cfg.ssm_head_k_dim * cfg.ssm_head_v_dim) for r in cfg.recurrent if r)
    print(f"1. prefix cache: {n_prompts} prompts of {n_prefix} shared + 8 own tokens, 2 slots, MTP k = 2, "
          f"8 new tokens each; one saved GDN state = {one_state / 1e3:.0f} KB, one KV block of 16 = "
          f"{16 * 2 * sum(not r for r in cfg.recurrent) * cfg.n_head_kv * cfg.head_dim * 4 / 1e3:.0f} KB")
    base = None
    for label, options in (("off", {}), ("on", {"prefix_cache": True}),
                           ("on, every 4 blocks", {"prefix_cache": True, "state_every": 4})):
        base, s, wall = timed_run(model, prompts, 8, 2, base, "the prefix cache", **options)
        print(f"   cache {label:19s} prefill rows {s['prefill_rows']:6d}  wall {wall:6.2f} s  "
              f"states kept {s.get('prefix_states_kept', 0)} ({s.get('prefix_state_bytes', 0) / 1e6:.2f} MB), "
              f"hits {s.get('prefix_hits', 0)}, tokens reused {s.get('prefix_tokens_reused', 0)}")


def chunking(model, n_long: int) -> None:
    print(f"2. chunked prefill: 2 sequences decode (plain) while a {n_long}-token prompt joins at step 3")
    base = None
    for chunk in (None, 256, 64, 16):
        engine = Engine(model, options=EngineOptions(slots=3, n_blocks=4 * -(-(n_long + 64) // 16),
                                                     chunk=chunk))
        seqs = [SeqResult(0, [1, 2, 3]), SeqResult(1, [7, 8, 9]), SeqResult(2, [int(t) for t in
                                                                          np.arange(n_long) % 7000 + 10])]
        engine.add(seqs[0], 40, 0)
        engine.add(seqs[1], 40, 1)
        step_s, pass_rows, first_token_step, step = [], [], None, 0
        while not engine.done():
            if step == 3:
                engine.add(seqs[2], 4, 2)
            t0, rows_before = time.perf_counter(), engine.rows + engine.prefill_rows
            engine.step()
            step_s.append(time.perf_counter() - t0)
            pass_rows.append(engine.rows + engine.prefill_rows - rows_before)
            step += 1
            if first_token_step is None and seqs[2].tokens:
                first_token_step = step - 3
        tokens = [s.tokens for s in seqs]
        base = base or tokens
        assert tokens == base, "chunking changed an output"
        plain = float(np.median(step_s[1:3]))
        print(f"   chunk {str(chunk):5s} largest pass {max(pass_rows):5d} rows, longest step "
              f"{1000 * max(step_s[3:]):7.1f} ms (a plain step "
              f"{1000 * plain:5.1f} ms), the long prompt's first token after {first_token_step} steps, "
              f"{sum(step_s[3:]):.2f} s from its arrival to the end")


def preemption(model) -> None:
    prompts = [[int(t) for t in np.arange(40) * (i + 3) % 7000 + 10] for i in range(8)]
    longest = blocks_per_run(model, MTPDrafter(model), 40 + 48 + 3 + 1, 16)  # its KV and its MTP head's
    print(f"3. preemption: 8 prompts of 40 tokens, 48 new each, 4 slots, MTP k = 2; one run needs {longest} blocks "
          f"({-(-(40 + 48 + 3 + 1) // 16)} for its KV, the rest for its MTP head's)")
    base = None
    for n_blocks, cache in ((4 * longest, False), (longest + longest // 2, False), (longest + longest // 2, True)):
        base, s, wall = timed_run(model, prompts, 48, 4, base, "preemption", n_blocks=n_blocks, prefix_cache=cache)
        print(f"   {n_blocks:3d} blocks, prefix cache {'on ' if cache else 'off'}: {s['preemptions']:3d} preemptions, "
              f"prefill rows {s['prefill_rows']:5d}, wall {wall:6.2f} s, KV peak {s['kv_blocks_peak']} blocks")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="numpy")
    ap.add_argument("--prefix", type=int, default=256)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--long", type=int, default=1024)
    ap.add_argument("--figures", default="123", help="which figures to make (default all three: 123)")
    args = ap.parse_args()
    model = load_model(MODEL, args.backend)
    # warm-up: the cpu backend compiles its kernels on first use (not timed below)
    batch_generate(model, [[1, 2, 3] * 20, [4, 5]], 4, drafter=MTPDrafter(model), draft_n=2,
                   options=EngineOptions(slots=2, prefix_cache=True, chunk=8, block_size=4, n_blocks=40))
    if "1" in args.figures:
        prefix_cache(model, args.prefix, args.prompts)
    if "2" in args.figures:
        chunking(model, args.long)
    if "3" in args.figures:
        preemption(model)


if __name__ == "__main__":
    main()
