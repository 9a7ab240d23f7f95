"""tools/gpu_check.py, dry-run on the CPU through the fake CuPy (tests/fake_cupy.py), as a session does before it
asks for a GPU: the version report, the raw capture and the argmax tie, the greedy rule against the oracle for k = 0..8 with tied maxima, and greedy parity of every
drafter on the shipped models, one sequence and a batch of 4, graphs on and off (few tokens: the dry run checks
the tool's paths, tests/test_cuda_syncs.py the engine's); its JSON and log are written; with no GPU at all the
tool says so and exits 2."""

from __future__ import annotations

import json

import fake_cupy
import pytest

from tinyspec.demo import DRAFT, TARGET

REPO = TARGET.parents[2]  # the checkout: tinyspec/assets/tiny-target.gguf


@pytest.mark.skipif(not TARGET.is_file() or not DRAFT.is_file(), reason="the shipped models are not built yet")
def test_rule_and_parity_steps_run_through_the_fake(monkeypatch, tmp_path, load_tool):
    fake_cupy.install(monkeypatch)
    tool = load_tool("gpu_check")
    steps = ("versions", "capture", "ties", "rule", "parity")  # the in-process ones; tests and bench are commands
    assert tool.main([str(tmp_path), "--quick", "--steps", ",".join(steps), "--max-new", "6"]) == 0
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["status"] == {name: "ok" for name in steps}, report
    assert report["versions"]["cupy"] == "fake" and report["ties"]["argmax"] == 7
    assert report["capture"]["captured"] == 1 and report["capture"]["replays_wrong"] == 0
    rule = report["rule"]  # 9 k x 2 cases x 2 draft kinds, and a batch of 4, graphs on and off
    assert rule["ok"] and not rule["wrong"] and rule["cases"] == 2 * (9 * 2 * 2 + 1)
    assert rule["graphs"]["captured"] == 9 and rule["graphs"]["failed"] == 0  # one graph per k = 0..8
    parity = report["parity"]  # 4 drafters, one sequence graphs on and off, a batch of 4 graphs on (--quick)
    assert parity["ok"] and parity["runs"] == 8 and parity["batch_runs"] == 4 and not parity["mismatches"], parity
    assert parity["graphs"]["graphs_on"]["captured"] and not parity["graphs"]["graphs_on"]["failed"]
    assert parity["graphs"]["graphs_off"]["captured"] == 0  # graphs off: plain launches only
    log = (tmp_path / "gpu_check.log").read_text()
    assert "rule (ok" in log and "parity (ok" in log


def test_a_tied_case_rejects_a_later_copy_of_the_maximum(load_tool):
    """The rule step's cases: the drafts the oracle keeps are each row's FIRST maximum; the next draft is a later
    copy of the same maximum, which the first-index rule rejects (a last-index argmax would keep it)."""
    import numpy as np

    from tinyspec.placement import accept_greedy

    tool, rng = load_tool("gpu_check"), np.random.default_rng(3)
    for k in range(9):
        logits, drafts = tool.tied_case(rng, k, 50)
        [(n, token, _)] = accept_greedy(logits, np.array([0, k + 1]), [drafts])
        top = logits.max(axis=1)
        assert all(logits[i, drafts[i]] == top[i] for i in range(min(n + 1, k)))  # kept ones and the tied reject
        assert token == int(np.argmax(logits[n]))


def test_out_of_budget_steps_are_skipped_and_an_overrun_is_cut(monkeypatch, tmp_path, load_tool):
    """Each step's limit is cut to what is left of --budget: with none left every step is recorded as skipped
    (not a failure: exit 0), and an in-process step that overruns its limit is stopped (StepTimeout)."""
    import time

    fake_cupy.install(monkeypatch)
    tool = load_tool("gpu_check")
    assert tool.main([str(tmp_path), "--budget", "1", "--steps", "versions,rule,tests"]) == 0
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["status"] == {"versions": "skipped", "rule": "skipped", "tests": "skipped"}
    assert "budget left" in report["rule"]["skipped"]
    with pytest.raises(tool.StepTimeout):
        with tool.time_limit(0.05):
            time.sleep(2)


def test_says_so_without_a_gpu(monkeypatch, tmp_path, capsys, load_tool):
    from tinyspec import backends

    monkeypatch.setattr(backends, "cuda_available", lambda: False)
    assert load_tool("gpu_check").main([str(tmp_path)]) == 2
    assert "no CUDA device" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a wrong step name is an argument error, GPU or not
        load_tool("gpu_check").main([str(tmp_path), "--steps", "nonsense"])


def test_the_tests_step_runs_without_pytest_xdist(load_tool):
    """The bug (issue 45, fault 3): pyproject's addopts carry `-n auto --dist worksteal`, pytest-xdist's flags, and
    the tests step ran `pytest -n0 ...`; on a machine without pytest-xdist (the GPU machine need not have it) pytest
    refuses them and exits 4 before a single test runs. Here xdist is switched off as if it were not installed."""
    import subprocess

    cmd = load_tool("gpu_check").tests_command() + ["-p", "no:xdist", "--collect-only"]
    run = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode in (0, 5), run.stdout[-2000:] + run.stderr[-2000:]  # 5: nothing collected (no GPU tests)


def test_a_bench_whose_file_is_not_written_in_time_is_skipped_not_failed(monkeypatch, tmp_path, load_tool):
    """The bug (issue 45, fault 3): bench_9b waits for its synth file, written on the CPU in the background; when the
    step's limit ran out first it reported FAILED, and the whole check exited 1 on a GPU that worked."""
    import subprocess

    tool = load_tool("gpu_check")

    class StillWriting:  # a synth process that has not finished
        returncode = None

        def poll(self):
            return None

        def wait(self, timeout=None):
            raise subprocess.TimeoutExpired("synth", timeout)

    log = tool.Log(tmp_path / "gpu_check.log")
    try:
        out = tool.bench_step("9b", StillWriting(), tmp_path / "synth-9b.gguf", [], tmp_path, 1.0, log)
    finally:
        log.close()
    assert "skipped" in out and "not written" in out["skipped"], out
    fake_cupy.install(monkeypatch)
    monkeypatch.setattr(tool, "bench_step", lambda *a, **kw: {"skipped": "the 9b synth file was not written"})
    monkeypatch.setattr(tool, "start_synth", lambda *a, **kw: None)
    assert tool.main([str(tmp_path), "--steps", "bench_9b"]) == 0
    assert json.loads((tmp_path / "gpu_check.json").read_text())["status"] == {"bench_9b": "skipped"}



def test_the_serving_step_runs_bench_serving_and_reports_its_graphs(monkeypatch, tmp_path, load_tool):
    """The serving step (issue 45 item 4): `bench --serving --backend cuda --spec mtp` on the shipped target, whose flags
    the bench CLI accepts (checked by parsing them), and per configuration its tok/s and graph counts; a failed
    capture fails the step. The command itself needs a GPU: here its output is a report of the same shape."""
    from tinyspec.__main__ import build_parser

    tool = load_tool("gpu_check")
    args = build_parser().parse_args(["bench", "--model", "m.gguf", "--backend", "cuda", *tool.SERVING_FLAGS])
    assert args.serving and args.drafters == "mtp" and args.json
    seen = {}

    def ran(cmd, limit, log, title, stdout=None):
        seen["cmd"] = cmd
        graphs = {"captured": 9, "evicted": 0, "failed": failed, "replays": 80, "plain": 20}
        stdout.write_text(json.dumps({"configs": {name: {"tok_s": 50.0, "graphs": graphs}
                                                  for name in ("baseline", "cache", "chunk", "cache+chunk")}}))
        return {"returncode": 0, "seconds": 1.0, "tail": ""}

    monkeypatch.setattr(tool, "run_command", ran)
    log = tool.Log(tmp_path / "gpu_check.log")
    try:
        failed = 0
        ok = tool.serving_step(tmp_path, 60.0, log)
        failed = 1
        bad = tool.serving_step(tmp_path, 60.0, log)
    finally:
        log.close()
    assert "--serving" in seen["cmd"] and "cuda" in seen["cmd"] and str(tool.ASSETS / "tiny-target.gguf") in seen["cmd"]
    assert ok["ok"] and ok["tok_s"]["cache+chunk"] == 50.0 and ok["graphs"]["baseline"]["replays"] == 80
    assert not bad["ok"]
