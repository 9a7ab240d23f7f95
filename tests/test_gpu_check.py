"""tools/gpu_check.py, dry-run on the CPU through the fake CuPy (tests/fake_cupy.py), as a session does before it
asks for a GPU: the parity step decodes the shipped models on the cuda path, graphs on and off, and writes its
report; with no GPU at all the tool says so and exits 2."""

from __future__ import annotations

import json

import fake_cupy
import pytest

from tinyspec.demo import DRAFT, TARGET


@pytest.mark.skipif(not TARGET.is_file() or not DRAFT.is_file(), reason="the shipped models are not built yet")
def test_parity_step_runs_through_the_fake(monkeypatch, tmp_path, load_tool):
    fake_cupy.install(monkeypatch)
    assert load_tool("gpu_check").main([str(tmp_path), "--quick", "--steps", "parity"]) == 0
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    parity = report["parity"]
    assert parity["ok"] and parity["runs"] == 8 and not parity["mismatches"], parity
    assert parity["graphs"]["graphs_on"]["captured"] and not parity["graphs"]["graphs_on"]["failed"]
    assert not parity["graphs"]["graphs_off"]["captured"]  # graphs off: plain launches only


def test_says_so_without_a_gpu(monkeypatch, tmp_path, capsys, load_tool):
    from tinyspec import backends

    monkeypatch.setattr(backends, "cuda_available", lambda: False)
    assert load_tool("gpu_check").main([str(tmp_path)]) == 2
    assert "no CUDA device" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a wrong step name is an argument error, GPU or not
        load_tool("gpu_check").main([str(tmp_path), "--steps", "nonsense"])
