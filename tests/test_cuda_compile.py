"""The cuda backend's kernels compile for every GPU generation, checked with NVRTC on a machine without a GPU.

tools/check_cuda_kernels.py compiles each module the runtime builds (cuda_ops.quant_kernel_names per weight
type and architecture, the GDN scan, the row kernels, the attention kernel) to a cubin and reads ptxas' register report. It runs
in a subprocess: without CuPy it stands a bare `cupy` module in for the import, which must not leak into
this test process. Skips where NVRTC is not installed (`pip install nvidia-cuda-nvrtc-cu12`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "check_cuda_kernels.py"


def _run(*args: str, script: str | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", script] if script else [sys.executable, str(TOOL), *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


_probe = _run(script="import sys; sys.path.insert(0, 'tools'); import check_cuda_kernels as c; "
                     "sys.exit(0 if c.load_nvrtc() else 3)")
if _probe.returncode == 3:
    pytest.skip("NVRTC not installed (pip install nvidia-cuda-nvrtc-cu12)", allow_module_level=True)
assert _probe.returncode == 0, _probe.stderr


@pytest.fixture(scope="module")
def report():
    # sm_75 (a T4: no bf16 tensor-core instructions) and sm_90 (an H100); K = 128 is every qwen35 file's
    # head size, 16 the shipped model's
    res = _run("--arch", "75,90", "--gdn-k", "16,128", "--json")
    assert res.returncode == 0, res.stderr + res.stdout[-2000:]
    rows = json.loads(res.stdout)["modules"]
    return {(r["arch"], r["module"]): r for r in rows}


def test_every_module_compiles_on_turing_and_hopper(report):
    modules = {m for _, m in report}
    assert {"quant_Q4_K", "quant_Q6_K", "quant_Q8_0", "quant_BF16", "gdn_K128", "rows_norm", "rows_silu",
            "attention"} <= modules
    assert "attend_rows" in report[(75, "attention")]["kernels"] and "attend_rows" in report[(90, "attention")]["kernels"]
    for (arch, module), row in report.items():
        assert row["ok"] and not row["missing"] and row["cubin_bytes"] > 0, (arch, module, row["errors"])
        assert row["kernels"], (arch, module)  # ptxas reported every kernel it built


def test_tensor_core_kernel_only_where_the_hardware_has_it(report):
    for t in ("Q4_K", "Q5_K", "Q6_K", "Q8_0"):
        assert any(k.startswith("mma_linear_k") for k in report[(90, f"quant_{t}")]["kernels"])
        assert not any(k.startswith("mma_linear_k") for k in report[(75, f"quant_{t}")]["kernels"])
        assert any(k.startswith("quant_linear_k") for k in report[(75, f"quant_{t}")]["kernels"])
    assert not any(k.startswith("mma_linear_k") for k in report[(90, "quant_BF16")]["kernels"])


def test_kernels_keep_their_working_set_in_registers(report):
    """What ptxas says today on an H100 (LESSONS 20; ptxas detail in docs/performance-log.md old 33): the float
    kernels never spill; the tensor-core kernel, capped at 128 registers by __launch_bounds__(256, 2) for 16
    warps an SM, spills at most a few words.
    (On sm_75 ptxas gives Q8_0's 4-row float kernel 64 registers and 28 bytes of spill: slower, still right.)"""
    for (arch, module), row in report.items():
        for name, r in row["kernels"].items():
            if arch >= 80 and name.startswith(("quant_linear_k", "get_rows_k", "norm_rows", "mma_prep_x", "attend_rows")):
                assert r["spill_stores"] == 0, (arch, name, r)
            if name.startswith("mma_linear_k"):
                assert r["registers"] <= 128 and r["spill_stores"] <= 32, (arch, name, r)


def test_moe_kernels_compile_everywhere(report):
    """The MoE device path (issue 35 item 7): route_k and group_k (fast/cuda_moe.py), and the grouped expert
    matmul at every row capacity in each weight type's module. ptxas on sm_90 today: the grouped 16-row tile of
    the plain types spills 24 bytes (the tile lookup's registers on top of the float kernel's 128), route_k ~100
    (its pairwise sum's stack); both small, neither on the decode path's 1-row tile."""
    for arch in (75, 90):
        assert {"route_k", "group_k"} <= set(report[(arch, "moe_route")]["kernels"])
        for t in ("F32", "BF16", "Q8_0", "Q4_K", "Q6_K"):
            grouped = [k for k in report[(arch, f"quant_{t}")]["kernels"] if k.startswith("quant_linear_grouped_k")]
            assert len(grouped) == 5, (arch, t, grouped)
            for name in grouped:
                r = report[(arch, f"quant_{t}")]["kernels"][name]
                assert r["spill_stores"] <= (32 if ", 16, 4>" in name else 0), (arch, name, r)


def test_the_check_fails_on_a_kernel_the_architecture_cannot_build():
    """The check's power: the tensor-core instances the runtime used to request on every GPU do not compile
    for sm_75, and the tool reports that as a failure, not a pass."""
    script = (
        "import sys, json; sys.path.insert(0, 'tools'); import check_cuda_kernels as c\n"
        "from tinyspec.fast import cuda_ops; from tinyspec.quants import GGMLType\n"
        "names = cuda_ops.quant_kernel_names(GGMLType.Q4_K, 80)\n"
        "res = c.compile_cubin(c.load_nvrtc(), cuda_ops._SOURCE, names, ['--gpu-architecture=sm_75'], 'q4k')\n"
        "print(json.dumps({'ok': res['ok'], 'log': res['log'][-400:]}))\n"
    )
    res = _run(script=script)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert not out["ok"] and "requires .target sm_80" in out["log"]
