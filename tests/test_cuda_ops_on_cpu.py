"""tests/test_cuda_ops.py, the GPU tests, run on the CPU: its own test functions, unchanged, with `cupy` the fake
CuPy (tests/fake_cupy.py) launching the real CUDA kernels compiled by tests/cuda_on_cpu.py.

Opt-in: TINYSPEC_GPU_TESTS_ON_CPU=1 (their real shapes, 8200-row weights and T up to 37 in every batch-invariance
loop, take about 7 minutes of one core under the emulation: 116 tests, 6 min 29 s on 2026-11-28 beside other
work, all passing). tests/test_kernels_on_cpu.py runs the same checks at small shapes in every suite run. What a pass here does not show: the GPU's own expf/exp and tensor-core
rounding, races, speed (cuda_on_cpu.h lists what is not emulated).

    TINYSPEC_GPU_TESTS_ON_CPU=1 python -m pytest tests/test_cuda_ops_on_cpu.py -n 2
"""

import importlib.util
import os
from pathlib import Path

import pytest

import cuda_on_cpu
import fake_cupy

if os.environ.get("TINYSPEC_GPU_TESTS_ON_CPU") != "1":
    pytest.skip("the GPU tests on the CPU emulation are opt-in (TINYSPEC_GPU_TESTS_ON_CPU=1: about 7 minutes of "
                "one core); tests/test_kernels_on_cpu.py runs their checks at small shapes", allow_module_level=True)
if cuda_on_cpu.compiler() is None:
    pytest.skip("no C++ compiler ($CXX, g++ or clang++): the CUDA kernels cannot be built for the CPU",
                allow_module_level=True)


def _load_gpu_tests():
    """tests/test_cuda_ops.py imported while the fake is `cupy` (its module-level GPU check then finds one device,
    and its `cuda_ops` is the real module on the fake), as a module of its own name."""
    mp = pytest.MonkeyPatch()
    try:
        fake_cupy.install(mp, kernels="cpu")
        spec = importlib.util.spec_from_file_location("gpu_tests_on_cpu", Path(__file__).with_name("test_cuda_ops.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        mp.undo()
    return module


_gpu = _load_gpu_tests()
globals().update({k: v for k, v in vars(_gpu).items() if k.startswith("test_") or k == "device_attention"})


@pytest.fixture(autouse=True)
def _kernels_on_cpu(monkeypatch):
    """Each test's own imports (cuda_moe, cuda_rows, cuda_attention) find the real modules on the fake too."""
    fake_cupy.install(monkeypatch, kernels="cpu")
