"""Compile the cpu backend's Numba kernels ahead of use, on every core at once.

On a cold cache (a fresh install, or after an edit of the kernels' sources: fast/kernel_cache.py) each kernel
compiles on its first call, one after another on one core: the whole path of one decode step took minutes on
this project's 2-core VM. Kernels compile independently, so `warm` compiles them in as many processes as there are cores, each writing Numba's
on-disk cache; every process that later calls a kernel (this one, pytest's workers, a server) loads it from
there in milliseconds.

jobs(): one entry per kernel, biggest first so the pool ends together (the MoE kernel last: it links three others). Each calls its kernel on tiny inputs of
exactly the argument types the backend passes (C-contiguous float32 activations, read-only uint8 weight bytes,
int64 ids), so what it compiles is what a model loads: a kernel's code does not depend on the values (the
weight type is a runtime argument; the GDN kernels take any number of sequences: numba_gdn._f32_at).

    warm()                  # compile what is not compiled yet; returns the seconds spent (0.0 when warm)
    python -m tinyspec.fast.warm [--processes N]

A stamp in the cache directory (the sources' digest, as kernel_cache keeps it) says the work is done, so a warm
cache costs one file read.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path

import numpy as np

STAMP = "tinyspec-warm.txt"


def _matmul(kernel: str, qtype_name: str) -> None:
    from . import numba_ops
    from ..quants import GGMLType

    qtype = GGMLType[qtype_name]
    _, flat = numba_ops._weight_blocks(np.zeros(2 * qtype.row_nbytes(256), np.uint8), qtype, (2, 256))  # as bind()
    row_bytes = qtype.row_nbytes(256)
    x, y = np.zeros((1, 256), np.float32), np.zeros((1, 2), np.float32)
    run = {"integer": numba_ops._quant_linear_q8_parallel, "integer, one thread": numba_ops._quant_linear_q8_serial,
           "float": numba_ops._quant_linear_parallel, "float, one thread": numba_ops._quant_linear_serial,
           "q8_0": numba_ops._quant_linear_q8_0_parallel,
           "q8_0, one thread": numba_ops._quant_linear_q8_0_serial}[kernel]
    run(x, flat, row_bytes, int(qtype), 256, y)


def _experts() -> None:
    from . import numba_ops
    from ..quants import GGMLType

    row_bytes = GGMLType.Q4_K.row_nbytes(256)
    _, flat = numba_ops._weight_blocks(np.zeros(2 * row_bytes, np.uint8), GGMLType.Q4_K, (2, 256))  # as bind_experts()
    x, y = np.zeros((1, 256), np.float32), np.zeros((1, 2), np.float32)
    numba_ops._experts_linear(x, flat, 2 * row_bytes, row_bytes, int(GGMLType.Q4_K), 256, numba_ops._FLOAT,
                              np.zeros(1, np.int64), np.array([0, 1], np.int64), y)


def _get_rows() -> None:
    from . import numba_ops
    from ..quants import GGMLType

    numba_ops.get_rows(np.zeros(GGMLType.Q8_0.row_nbytes(32), np.uint8), GGMLType.Q8_0, (1, 32), [0])


def _gdn() -> None:
    """The ragged scan and conv (one kernel each for any number of sequences: numba_gdn._f32_at)."""
    from . import numba_gdn

    bounds = np.arange(3)  # two sequences of one row: q, k [2, HV = 1, K = 16], v [2, 1, V = 16], decay, beta [2, 1]
    q, g = np.zeros((2, 1, 16), np.float32), np.zeros((2, 1), np.float32)
    numba_gdn.gdn_scan_ragged(q, q, q, g, g, bounds, [np.zeros((1, 16, 16), np.float32)] * 2)
    numba_gdn.causal_conv_ragged(np.zeros((2, 16), np.float32), bounds, [np.zeros((16, 3), np.float32)] * 2,
                                 np.zeros((16, 4), np.float32))


def _attend() -> None:
    from . import numba_attention

    pool = np.zeros((1, 4, 1, 16), np.float32)
    numba_attention.attend_paged_ragged(np.zeros((1, 1, 1, 16), np.float32), pool, pool, [[0]], [0], [0, 1], 0.25)


def _rows_and_steps() -> None:
    """The row functions (fast/numba_rows.py) and the fused layer steps (fast/numba_steps.py) on the shipped
    target's shapes: a decode step and a prefill long enough for the threaded scan and attention."""
    from ..assets import TARGET
    from ..backends import load_model

    model = load_model(TARGET, "cpu")
    state = model.new_state()
    model.forward(list(range(1, 40)), state)  # 39 rows: the threaded scan and attention
    model.forward([5], state)  # one row: every fused step, the calling thread's scan and attention
    model.forward([6, 7], state, ring=model.new_ring(2))  # a verify pass: the recurrent step with a ring


def jobs() -> list[tuple[str, tuple, float]]:
    """(label, (function, *args), seconds) for every kernel, biggest first, but the MoE kernel last: it calls the three
    one-thread matmuls, and links their cached code when they have compiled before it starts. seconds: what it took
    on the 2-vCPU AMD EPYC VM (Zen 4), quiet, two processes: the weights of warm's estimate of the time left, which
    scales them by what the finished jobs took here."""
    return [("row functions and fused layer steps", (_rows_and_steps,), 59.0),  # the longest: first
            ("quant_linear_q8 (integer, threaded)", (_matmul, "integer", "Q4_K"), 6.5),
            ("quant_linear_q8 (integer, one thread)", (_matmul, "integer, one thread", "Q4_K"), 3.0),
            ("quant_linear (float, every type)", (_matmul, "float", "Q4_K"), 19.0),
            ("quant_linear (float, one thread)", (_matmul, "float, one thread", "Q4_K"), 0.5),
            ("quant_linear_q8_0 (one thread)", (_matmul, "q8_0, one thread", "Q8_0"), 0.5),
            ("quant_linear_q8_0 (threaded)", (_matmul, "q8_0", "Q8_0"), 5.5),
            ("GDN scan and conv", (_gdn,), 10.0),
            ("get_rows (embeddings)", (_get_rows,), 0.5),
            ("attention", (_attend,), 4.5),
            ("experts_linear (MoE)", (_experts,), 10.5)]


def time_left(done: list[tuple[float, float]], refs: list[float], processes: int, elapsed: float) -> float | None:
    """Seconds the compile should still take here: the whole compile's reference time (every job's jobs() seconds,
    shared by the processes, never less than the longest) scaled by how this machine ran the finished jobs, (seconds
    here, reference seconds) each, less the time already spent; None before any finished job took measurable time."""
    here, ref = sum(d[0] for d in done), sum(d[1] for d in done)
    if ref <= 0 or here <= 0:
        return None
    return max(0.0, here / ref * max(max(refs), sum(refs) / processes) - elapsed)


def _run(job: tuple) -> float:
    t0 = time.perf_counter()
    job[0](*job[1:])
    return time.perf_counter() - t0


def _stamp_path() -> Path | None:
    from . import numba_ops

    try:
        return Path(numba_ops._quant_linear_q8_parallel.stats.cache_path) / STAMP
    except AttributeError:
        return None


def _stamp_text() -> str:
    from . import kernel_cache

    return f"{kernel_cache.source_digest()} {len(jobs())} kernels\n"


def is_warm() -> bool:
    """The cache holds every job's kernel for these sources (a stamp written by a finished `warm`)."""
    path = _stamp_path()
    try:
        return path is not None and path.read_text() == _stamp_text()
    except OSError:
        return False


def warm(processes: int | None = None, say=None) -> float:
    """Compile every kernel of jobs() not yet compiled, in `processes` processes (default: the cores this
    process may use); returns the seconds it took, 0.0 when the cache was already warm. say(line): progress."""
    if is_warm():  # (its import of numba_ops ran kernel_cache.sync: stale kernels are gone before the
        return 0.0          # workers compile, so none of them deletes what another has just written)

    todo = jobs()
    n = max(1, min(processes or len(os.sched_getaffinity(0)), len(todo)))
    if say:
        say(f"compiling the cpu backend's {len(todo)} Numba kernels in {n} processes (once; cached on disk after)")
    t0 = time.perf_counter()
    # spawn, not fork: a fresh interpreter per worker, whatever threads this process has started
    with ProcessPoolExecutor(n, mp_context=get_context("spawn")) as pool:
        running = {pool.submit(_run, job): (label, ref) for label, job, ref in todo}
        finished, refs = [], [ref for _, _, ref in todo]
        for done, future in enumerate(as_completed(running), 1):  # a line as each group is done, not in job order
            seconds, (label, ref) = future.result(), running[future]
            finished.append((seconds, ref))
            elapsed = time.perf_counter() - t0
            eta = time_left(finished, refs, n, elapsed) if done < len(todo) else None
            if say:
                say(f"  [{done}/{len(todo)}, {elapsed:.0f} s] {label}: {seconds:.1f} s"
                    + ("" if eta is None else f"; about {eta:.0f} s left at this machine's pace"))
    if (path := _stamp_path()) is not None:
        try:
            path.write_text(_stamp_text())
        except OSError:  # a read-only install: the kernels compile (in memory) on first use, as without warm
            pass
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tinyspec.fast.warm",
                                description="Compile the cpu backend's Numba kernels now, in parallel, into "
                                            "Numba's on-disk cache (what the first run would otherwise do, "
                                            "one kernel after another).")
    p.add_argument("--processes", type=int, default=None, help="compiling processes (default: the usable cores)")
    args = p.parse_args(argv)
    if args.processes is not None and args.processes < 1:
        p.error("--processes must be at least 1")
    seconds = warm(args.processes, say=lambda line: print(line, file=sys.stderr, flush=True))
    print(f"warm in {seconds:.1f} s" if seconds else "already warm")
    return 0


if __name__ == "__main__":
    sys.exit(main())
