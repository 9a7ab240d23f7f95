"""Threads that yield: how the cpu backend's Numba kernels share a machine with other programs.

A threaded kernel (`prange`) returns when its LAST thread finishes. Numba runs on an OpenMP threading layer here
(libgomp), and libgomp's idle workers spin: after a parallel region they busy-wait for the next one (about
300,000 spins by default) instead of sleeping. On a quiet machine that saves a wake-up per region. On a shared
one it is ruinous: a worker spinning on a core another process needs steals that core's time, and a worker the
scheduler has put aside holds every other thread at the region's end. A decode step runs hundreds of regions,
so each waits for a scheduler slice, and a 2-core laptop with one busy neighbour decoded 20-130x slower than
quiet (LESSONS 18 measured the same effect on BLAS).

So, before the first parallel region loads libgomp:

    OMP_WAIT_POLICY=PASSIVE   an idle worker sleeps at once (a futex wait) and yields its core; waking it costs
                              microseconds per region: on a quiet 2-core VM a 0.8B-shape decode ran 10-20% slower
                              than spinning (8.7 -> 7.0-7.8 tok/s), beside a busy process 2-30x faster
                              (OMP_WAIT_POLICY=ACTIVE gives a dedicated machine the spinning back)

A value the user set in the environment is kept. The thread count is Numba's (NUMBA_NUM_THREADS, default: the
cores); `--threads N` on the command line, or set_threads(N), lowers it for this process. With a neighbour on
every core, fewer threads than cores is often faster still: the region no longer waits for a descheduled worker.
docs/performance-log.md (2026-11-27) has the measurements behind these defaults.
"""

from __future__ import annotations

import os

WAIT_POLICY = "PASSIVE"
# A model whose matmul weights are below this many bytes multiplies every matrix on the calling thread
# (backends.cpu_tensors). Its weights stay in the cache, so a second thread adds little bandwidth, and waking a
# sleeping worker costs ~60 us on a 2-vCPU VM (a halted vCPU woken by the hypervisor): the shipped target's one
# threaded matmul a token (the [8192, 320] output head, 0.16 ms on one thread) made its decode 8-10% slower than
# one thread. Qwen3.5-0.8B's weights (0.5 GB) stream from memory, where two threads read faster: its decode is
# 13% faster threaded. docs/performance-log.md (2026-11-28, issue 46) has both.
THREADS_FROM_BYTES = 64 << 20


def yield_when_idle() -> None:
    """Make OpenMP's idle workers sleep instead of spin, unless the user chose otherwise. Must run before the
    first parallel kernel (when Numba loads its threading layer, and with it libgomp, which reads this once)."""
    os.environ.setdefault("OMP_WAIT_POLICY", WAIT_POLICY)


def set_threads(n: int | None) -> int:
    """Use n threads for the Numba kernels from now on (None: leave Numba's count); returns the count in use.
    n must be in 1..NUMBA_NUM_THREADS (the pool Numba started with: its maximum)."""
    import numba

    if n is not None:
        top = numba.config.NUMBA_NUM_THREADS
        if not isinstance(n, int) or not 1 <= n <= top:
            raise ValueError(f"--threads must be in 1..{top} (NUMBA_NUM_THREADS, the cores by default), got {n}")
        numba.set_num_threads(n)
    return numba.get_num_threads()
