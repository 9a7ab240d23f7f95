"""Where a decode step's time goes: compiled-kernel calls, parallel regions and Python calls per token, and the
share of the step spent outside the compiled kernels (issue 46).

On the cpu backend a small model's decode step is not arithmetic: it is Python calls, small NumPy operations and
OpenMP parallel regions, each region paying for waking a sleeping worker (fast/threads.py). This module counts
them for the step bench's decode figure times (one `model.forward` of one token after a prompt, the token's
`np.array` included, the argmax after it not), so a change that adds calls or regions shows in the numbers:

    step_profile(model, n_steps=16, prompt=None) -> dict     the decode step bench times
    verify_profile(model, sizes, n_steps, prompt) -> dict      {T: the same figures for a verify pass of T tokens}
    profile_steps(step, n_steps=16, after=None) -> dict       any step (a callable), e.g. one matmul

Each runs `n_steps` rounds of three calls of the step, interleaved (a burst of load on a shared machine hits all
three alike), after two untimed calls (a cold Numba cache compiles on first use):

    plain     timed with perf_counter and nothing else
    profiled  under cProfile: every call counted, and the seconds inside each compiled kernel
    hooked    under a small sys.setprofile hook that asks Numba, at each call of a parallel kernel, how many
              threads it runs with (cProfile cannot say)

The dict (per-token figures are means over the n_steps steps of their pass):

    kernel_calls_per_token     calls into Numba dispatchers made from Python (0 on the numpy backend). cProfile lists
                               such a call under the kernel's Python source (file, first line, name: its key),
                               which is mapped to the dispatcher whose py_func has that code (the dispatchers are
                               found in tinyspec's loaded modules: kernel_codes). A dispatcher found nowhere there
                               (one made inside a function, another package's) would count as Python calls;
                               tests/test_step_profile.py counts compiled calls without the scan to catch that.
                               Calls one kernel makes to another inside compiled code are not calls from Python and
                               are not counted.
    parallel_regions_per_token calls of kernels compiled with parallel=True made while numba.get_num_threads() > 1:
                               each opens an OpenMP parallel region and wakes the pool. Every parallel kernel the
                               shipped model calls compiles to one region (Numba's parallel diagnostics, 2026-11-28:
                               one prange loop each, the inner loops serialized), so this counts regions; a kernel
                               with two top-level parallel loops would open two per call and is counted once.
    one_thread_parallel_calls_per_token
                               calls of parallel=True kernels made while Numba ran ONE thread (--threads 1, or
                               set_threads(1)). Such a call runs on the calling thread and wakes no worker, so it is
                               a kernel call but not a region. (A small matrix needs none: numba_ops.Bound runs its
                               serial twin.) A code object compiled twice, once with parallel=True (numba_ops's
                               *_one_thread twins share their parallel kernel's source), counts as the parallel one:
                               the twins are only called from compiled code, where no profiler sees them.
    python_calls_per_token     calls of Python functions: tinyspec's own, NumPy's Python-level functions (np.mean,
                               np.tile, ...), Numba's (set_num_threads), generator resumptions; not the kernels.
                               A mean: one step in 128 of the shipped model's makes 4 more (892.03 a token)
    builtin_calls_per_token    calls of C functions and methods that cProfile sees (np.array, ndarray.reshape,
                               ufunc.reduce, isinstance, ...); it does not see operators (a + b) or ufunc calls
                               (np.exp(x)), so this is a lower bound on the C-level work
    step_ms                    median seconds of a plain (unprofiled) step, in ms. Each runs right after a hooked
                               step, so it can come out a little above bench's decode_ms, timed back to back
                               (shipped model, cpu, three runs: 0-10% above)
    kernel_ms                  median, over the profiled steps, of the seconds inside the compiled kernels, in ms:
                               from the profiler's entry into the compiled function's wrapper to its return (the
                               compiled code and its arguments' unboxing; Numba's dispatch, matching the arguments to
                               a compiled signature, happens before and counts as outside)
    profiled_step_ms           median seconds of a step under cProfile, in ms
    outside_kernels_share      1 - kernel_ms / step_ms, clipped to [0, 1]: the share of a plain step spent outside
                               the compiled kernels (Python, NumPy, dispatch, allocation). The profiler adds a cost
                               to every Python call (profiled_step_ms is well above step_ms) but a kernel is one call
                               whatever it does, so its seconds under the profiler are close to its plain seconds;
                               subtracting them from the PLAIN step keeps the profiler's cost out of this figure.
                               The two medians come from different steps, so on a noisy machine it moves by their
                               noise. 1.0 on the numpy backend (no compiled kernels).
    outside_kernels_share_profiled
                               1 - kernel_ms / profiled_step_ms: the same share inside the profiled steps, inflated
                               by the profiler's cost per call: above the true share in practice, for comparison
    threads                    Numba's thread count when the steps ran (None where Numba is not loaded)
    by_kernel                  {"module.kernel": {"calls_per_token", "regions_per_token", "ms_per_token" (under
                               cProfile), "parallel"}}, the most called first
    steps                      n_steps

On the cuda backend the kernels are CuPy launches that run asynchronously on the GPU: none of these figures
describes them, and bench does not take this profile there.
"""

from __future__ import annotations

import cProfile
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Kernel:
    """A compiled kernel as the profiler names it: where its Python source is, and whether it runs in parallel."""
    name: str  # "numba_ops._quant_linear_q8_0_serial"
    parallel: bool


def kernel_codes() -> dict[int, tuple[object, Kernel]]:
    """{id(code): (code, Kernel)} of every Numba dispatcher in tinyspec's loaded modules (code: its py_func's code,
    which the dispatcher shows a profiler as the frame of each call). A code shared by a parallel and a serial
    dispatcher maps to the parallel one (see the module docstring). Empty when Numba is not loaded.

    Keyed by id, not by the code object: on CPython 3.11 a code object's hash changed the first time Numba made a
    profiler frame of it (measured: hash(code) before and after one profiled call differ), so a dict keyed by the
    codes themselves stopped finding them."""
    if "numba" not in sys.modules:
        return {}
    from numba.core.dispatcher import Dispatcher

    found: dict[int, tuple[object, Kernel]] = {}
    for mod_name, module in list(sys.modules.items()):
        if module is None or not (mod_name == "tinyspec" or mod_name.startswith("tinyspec.")):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, Dispatcher):
                code = value.py_func.__code__
                parallel = bool(value.targetoptions.get("parallel")) or (id(code) in found and found[id(code)][1].parallel)
                found[id(code)] = code, Kernel(f"{value.py_func.__module__.rsplit('.', 1)[-1]}.{code.co_name}", parallel)
    return found


def profile_key(code) -> tuple[str, int, str]:
    """cProfile's key for a code object (pstats: filename, first line, function name)."""
    return code.co_filename, code.co_firstlineno, code.co_name


def numba_threads() -> int | None:
    if "numba" not in sys.modules:
        return None
    import numba

    return numba.get_num_threads()


def step_profile(model, n_steps: int = 16, prompt: list[int] | None = None) -> dict:
    """Kernel calls, parallel regions and Python calls per decode token, and the share of a step outside the
    compiled kernels (profile_steps on the step decode_times in fast/bench.py times: one model.forward of one
    token, its np.array included, the argmax choosing the next token after it and not profiled). prompt: the
    tokens before the steps (default: 8 ids from a seeded generator); its last tokens are kept if the
    3 * n_steps + 2 steps would not fit the model's context."""
    steps = 3 * n_steps + 2
    if prompt is None:
        prompt = [int(t) for t in np.random.default_rng(0).integers(0, model.cfg.n_vocab, 8)]
    room = model.cfg.n_ctx - steps
    if room < 1:
        raise ValueError(f"step_profile: {steps} steps do not fit the model's context length {model.cfg.n_ctx}")
    state = model.new_state()
    logits, _ = model.forward(np.array(list(prompt)[-room:]), state)
    token, out = int(np.argmax(logits[-1])), [logits]

    def step() -> None:  # what bench's decode figure times
        out[0] = model.forward(np.array([token]), state)[0]

    def after() -> None:
        nonlocal token
        token = int(np.argmax(out[0][-1]))

    return profile_steps(step, n_steps, after)


def verify_profile(model, sizes=(1, 4, 9), n_steps: int = 16, prompt: list[int] | None = None) -> dict:
    """{T: profile_steps' figures for a verify pass of T tokens}: one model.forward_batch with the model's ring from
    the same post-prompt state each time (step_costs.reset_to, outside the timing and the profilers), so a pass of
    T = 4 or 9 reads beside a one-token pass with a ring where its extra rows go: kernel by kernel, and in calls.
    Its "per token" figures are per pass."""
    from .step_costs import reset_to

    if prompt is None:
        prompt = [int(t) for t in np.random.default_rng(0).integers(0, model.cfg.n_vocab, 8)]
    prompt = list(prompt)[-(model.cfg.n_ctx - max(sizes)):]
    base = model.new_state()
    model.forward(np.array(prompt), base)
    window = [int(t) for t in np.random.default_rng(1).integers(0, model.cfg.n_vocab, max(sizes))]
    out = {}
    for T in sizes:
        scratch, ring, tokens = base.copy(), model.new_ring(T), np.array(window[:T])

        def step() -> None:
            model.forward_batch([tokens], [scratch], [ring])

        out[T] = profile_steps(step, n_steps, lambda: reset_to(scratch, base))
    return out


def profile_steps(step: Callable[[], object], n_steps: int = 16,
                  after: Callable[[], object] | None = None) -> dict:
    """The figures of the module docstring for any step: step() run in n_steps interleaved rounds of a plain, a
    profiled and a hooked call, after two untimed calls; after() runs after every call, outside the timing and the
    profilers (bench's decode: choosing the next token). step's own call is not counted, what it calls is.
    Raises RuntimeError if another profiler is active in this thread (it would be replaced)."""
    if n_steps < 1:
        raise ValueError(f"step_profile: n_steps must be >= 1, got {n_steps}")
    if sys.getprofile() is not None:
        raise RuntimeError("step_profile: another profiler is active in this thread")
    after = after or (lambda: None)
    for _ in range(2):  # untimed: a cold Numba cache compiles here, and the kernels' modules are loaded after it
        step()
        after()
    kernels = kernel_codes()
    by_key = {profile_key(code): k for code, k in kernels.values()}
    parallel = {ident: k for ident, (_, k) in kernels.items() if k.parallel}
    own = profile_key(step.__code__) if hasattr(step, "__code__") else None
    threads = numba_threads()
    get_threads = sys.modules["numba"].get_num_threads if "numba" in sys.modules else (lambda: 1)

    plain, profiled, kernel_s = [], [], []
    calls: dict[tuple, int] = {}
    secs: dict[tuple, float] = {}
    regions: dict[str, int] = {}
    one_thread: dict[str, int] = {}

    def hook(frame, event, arg):  # the hooked pass: a parallel kernel's call, with the threads it runs on
        if event == "call" and (k := parallel.get(id(frame.f_code))) is not None:
            counts = regions if get_threads() > 1 else one_thread
            counts[k.name] = counts.get(k.name, 0) + 1

    for _ in range(n_steps):  # interleaved: a burst of load on a shared machine hits the three passes alike
        t0 = time.perf_counter()
        step()
        plain.append(time.perf_counter() - t0)
        after()

        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        step()
        prof.disable()
        profiled.append(time.perf_counter() - t0)
        after()
        prof.create_stats()
        in_kernels = 0.0
        for key, (_, nc, tt, _, _) in prof.stats.items():
            if key == own or "_lsprof.Profiler" in key[2]:  # the step itself; the profiler's own disable()
                continue
            calls[key] = calls.get(key, 0) + nc
            if key in by_key:
                secs[key] = secs.get(key, 0.0) + tt
                in_kernels += tt
        kernel_s.append(in_kernels)

        sys.setprofile(hook)
        try:
            step()
        finally:
            sys.setprofile(None)
        after()

    n = n_steps
    kernel_calls = sum(c for key, c in calls.items() if key in by_key)
    python_calls = sum(c for key, c in calls.items() if key not in by_key and key[0] != "~")
    builtin_calls = sum(c for key, c in calls.items() if key[0] == "~")
    step_s, kern_s, prof_s = statistics.median(plain), statistics.median(kernel_s), statistics.median(profiled)
    by_kernel = {}
    for key in sorted((key for key in calls if key in by_key), key=lambda key: -calls[key]):
        k = by_key[key]
        by_kernel[k.name] = {"calls_per_token": calls[key] / n, "regions_per_token": regions.get(k.name, 0) / n,
                             "ms_per_token": 1e3 * secs.get(key, 0.0) / n, "parallel": k.parallel}
    return {"steps": n, "threads": threads,
            "kernel_calls_per_token": kernel_calls / n,
            "parallel_regions_per_token": sum(regions.values()) / n,
            "one_thread_parallel_calls_per_token": sum(one_thread.values()) / n,
            "python_calls_per_token": python_calls / n,
            "builtin_calls_per_token": builtin_calls / n,
            "step_ms": 1e3 * step_s, "kernel_ms": 1e3 * kern_s, "profiled_step_ms": 1e3 * prof_s,
            "outside_kernels_share": min(1.0, max(0.0, 1.0 - kern_s / step_s)),
            "outside_kernels_share_profiled": min(1.0, max(0.0, 1.0 - kern_s / prof_s)),
            "by_kernel": by_kernel}


def verify_profile_text(by_T: dict, top: int = 3) -> list[str]:
    """A line per verify size: its step, its calls, and where the time went (the kernels with the most ms)."""
    lines, one = [], by_T.get(min(by_T)) if by_T else None
    for T, p in sorted(by_T.items()):
        kernels = sorted(p["by_kernel"].items(), key=lambda kv: -kv[1]["ms_per_token"])[:top]
        ratio = f" ({p['step_ms'] / one['step_ms']:.2f}x T = {min(by_T)})" if one and T != min(by_T) else ""
        lines.append(f"  verify T={T:<3} {p['step_ms']:.2f} ms{ratio}, {p['kernel_calls_per_token']:.0f} kernel calls, "
                     f"{p['python_calls_per_token']:.0f} Python calls, {100 * p['outside_kernels_share']:.0f}% outside "
                     "the kernels; most: " + ", ".join(f"{name.split('.')[-1]} {k['ms_per_token']:.2f} ms"
                                                       for name, k in kernels))
    return lines


def step_profile_text(p: dict) -> list[str]:
    """The profile as lines for a reader (bench's report, under its decode line)."""
    at = f" ({p['threads']} thread{'s' if p['threads'] != 1 else ''})" if p["threads"] is not None else ""
    one = (f", {p['one_thread_parallel_calls_per_token']:.0f} parallel kernels run on one thread"
           if p["one_thread_parallel_calls_per_token"] else "")
    per_token = (f"  per token     {p['kernel_calls_per_token']:.0f} kernel calls, "
                 f"{p['parallel_regions_per_token']:.0f} parallel regions{at}{one}, "
                 f"{p['python_calls_per_token']:.0f} Python calls, {p['builtin_calls_per_token']:.0f} C calls seen")
    outside = (f"  outside       {100 * p['outside_kernels_share']:.0f}% of a step is outside the kernels: "
               f"{p['step_ms'] - p['kernel_ms']:.2f} of {p['step_ms']:.2f} ms (under cProfile "
               f"{100 * p['outside_kernels_share_profiled']:.0f}% of {p['profiled_step_ms']:.2f} ms, inflated by its "
               "cost per call)")
    return [per_token, outside]
