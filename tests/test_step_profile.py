"""bench's "where the time goes" (issue 46, tinyspec/fast/step_profile.py): kernel calls, parallel regions and Python
calls per decode token, and the share of a step outside the compiled kernels. Counts only: no wall-clock assertion
(a share is checked to lie in [0, 1], nothing more)."""

import json
import sys

import numpy as np
import pytest

from tinyspec.__main__ import main
from tinyspec.assets import TARGET
from tinyspec.backends import load_model
from tinyspec.fast.step_profile import profile_steps, step_profile, verify_profile

FIELDS = {"kernel_calls_per_token", "parallel_regions_per_token", "one_thread_parallel_calls_per_token",
          "python_calls_per_token", "builtin_calls_per_token", "outside_kernels_share",
          "outside_kernels_share_profiled", "step_ms", "kernel_ms", "profiled_step_ms", "threads", "by_kernel", "steps"}


@pytest.fixture(scope="module")
def cpu_model():
    pytest.importorskip("numba")
    return load_model(TARGET, "cpu")


def native_calls(fn) -> int:
    """Calls of compiled code from Python during fn(), counted without knowing any dispatcher: Numba shows a
    profiler each such call as a frame of the kernel's Python source that has no locals, where a Python function's
    frame holds its arguments from the start."""
    count = 0

    def hook(frame, event, arg):
        nonlocal count
        if event == "call" and frame.f_code.co_argcount and not frame.f_locals:
            count += 1

    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count


def test_cpu_counts_on_the_shipped_model_are_consistent(cpu_model):
    import numba

    p = step_profile(cpu_model, n_steps=3)
    assert set(p) == FIELDS and p["steps"] == 3 and p["threads"] == numba.get_num_threads()
    # a layer's mixer and FFN are a kernel call at least each (a fused step multiplies several weights in one), the
    # output head one more
    assert p["kernel_calls_per_token"] >= 2 * len(cpu_model.layers) + 1
    assert p["python_calls_per_token"] > 0 and p["builtin_calls_per_token"] > 0
    parallel = sum(k["calls_per_token"] for k in p["by_kernel"].values() if k["parallel"])
    assert p["parallel_regions_per_token"] + p["one_thread_parallel_calls_per_token"] == parallel
    assert p["parallel_regions_per_token"] <= p["kernel_calls_per_token"]
    if p["threads"] > 1:  # a model this small multiplies on the calling thread (threads.THREADS_FROM_BYTES)
        assert p["parallel_regions_per_token"] == 0 == p["one_thread_parallel_calls_per_token"]
    assert sum(k["calls_per_token"] for k in p["by_kernel"].values()) == p["kernel_calls_per_token"]
    assert 0 <= p["outside_kernels_share"] <= 1 and 0 <= p["outside_kernels_share_profiled"] <= 1


def test_the_dispatcher_mapping_misses_no_kernel_the_step_calls(cpu_model):
    """The profile finds kernels by scanning tinyspec's modules for dispatchers; counted without that scan (frames
    without locals), one decode step makes exactly as many compiled calls."""
    state = cpu_model.new_state()
    cpu_model.forward(np.array([1, 2, 3]), state)
    cpu_model.forward(np.array([4]), state)  # loads every kernel a step calls
    independent = native_calls(lambda: cpu_model.forward(np.array([5]), state))
    p = step_profile(cpu_model, n_steps=2, prompt=[1, 2, 3])
    assert independent == p["kernel_calls_per_token"] > 0


def test_a_small_float_matmul_is_a_kernel_call_but_no_region():
    """numba_ops.bind runs a small matrix's float kernel on the calling thread (its serial twin): one kernel call,
    no parallel region; a large one at more than one thread is a region, and at one thread a one-thread call.
    Checked against the frames-without-locals count as well."""
    numba = pytest.importorskip("numba")
    from tinyspec.fast import numba_ops
    from tinyspec.quants import GGMLType

    rng = np.random.default_rng(0)
    small = rng.standard_normal((16, 64)).astype(np.float32)
    linear = numba_ops.bind(small.view(np.uint8).reshape(-1), GGMLType.F32, small.shape)
    x = np.ones((1, 64), np.float32)
    p = profile_steps(lambda: linear(x), n_steps=2)
    assert p["kernel_calls_per_token"] == 1 == native_calls(lambda: linear(x))
    assert p["parallel_regions_per_token"] == 0 == p["one_thread_parallel_calls_per_token"]
    assert p["python_calls_per_token"] >= 1  # Bound.__call__
    if numba.get_num_threads() < 2:
        return
    big = rng.standard_normal((1024, 1024)).astype(np.float32)  # out * in >= SERIAL_BELOW, out > ROWS: threaded
    linear = numba_ops.bind(big.view(np.uint8).reshape(-1), GGMLType.F32, big.shape)
    x = np.ones((1, 1024), np.float32)
    p = profile_steps(lambda: linear(x), n_steps=2)
    assert p["kernel_calls_per_token"] == 1 == p["parallel_regions_per_token"]
    assert p["one_thread_parallel_calls_per_token"] == 0
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        p = profile_steps(lambda: linear(x), n_steps=2)
    finally:
        numba.set_num_threads(threads)
    assert p["parallel_regions_per_token"] == 0 and p["one_thread_parallel_calls_per_token"] == 1


def test_the_numpy_backend_calls_no_kernel():
    p = step_profile(load_model(TARGET, "numpy"), n_steps=2)
    assert p["kernel_calls_per_token"] == 0 == p["parallel_regions_per_token"] and p["by_kernel"] == {}
    assert p["outside_kernels_share"] == 1.0 and p["python_calls_per_token"] > 0


def test_bench_reports_the_step_profile(cpu_model, capsys):
    base = ["bench", "--backend", "cpu", "--decode-n", "2", "--repeats", "1", "--verify-sizes", "1", "--drafters", ""]
    assert main(base + ["--profile-steps", "2", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert set(r["step_profile"]) == FIELDS and r["step_profile"]["kernel_calls_per_token"] > 0
    assert set(r["verify_profile"]) == {"1", "4", "9"} and all(set(p) == FIELDS for p in r["verify_profile"].values())
    assert main(base + ["--profile-steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "kernel calls" in out and "parallel regions" in out and "outside the kernels" in out
    assert "verify T=4" in out and "verify T=9" in out
    assert main(base + ["--profile-steps", "0", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["step_profile"] is None and report["verify_profile"] is None
    assert main(base + ["--profile-steps", "-1"]) == 2
    assert "--profile-steps must be >= 0" in capsys.readouterr().err


def test_a_verify_pass_makes_the_calls_a_one_token_pass_makes(cpu_model):
    """verify_profile (bench's profile by T): a pass of 4 or 9 tokens with the model's ring makes as many kernel calls
    as a one-token pass with one (the extra rows are paid inside the kernels, not in calls), and every pass is timed
    and profiled."""
    by_T = verify_profile(cpu_model, (1, 4, 9), n_steps=2)
    assert set(by_T) == {1, 4, 9}
    calls = {T: p["kernel_calls_per_token"] for T, p in by_T.items()}
    assert calls[1] > 0 and calls[4] == calls[1] and calls[9] == calls[1], calls
    assert all(p["step_ms"] > 0 and p["by_kernel"] for p in by_T.values())


def test_another_profiler_is_not_replaced():
    sys.setprofile(lambda *a: None)
    try:
        with pytest.raises(RuntimeError, match="another profiler"):
            profile_steps(lambda: None, n_steps=1)
    finally:
        sys.setprofile(None)
