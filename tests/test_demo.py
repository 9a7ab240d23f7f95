"""`python -m tinyspec` with no arguments: the demo on the shipped models (tinyspec/assets).

It must run offline from an installed package, print the comparison table, confirm that every method's
greedy output equals plain decoding, and show one marked generation.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tinyspec.demo import DRAFT, TARGET


@pytest.mark.skipif(not TARGET.is_file() or not DRAFT.is_file(), reason="the shipped models are not built yet")
def test_demo_runs_and_says_outputs_are_identical():
    run = subprocess.run([sys.executable, "-m", "tinyspec"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    out = run.stdout
    for method in ("plain", "mtp", "lookup", "draft", "mtp tree", "mtp+lookup"):
        assert f"\n  {method} " in out
    assert "identical to plain decoding for every method and prompt: yes" in out
    assert "every sequence identical to its plain decoding alone: yes" in out  # the many-sequences section
    shown = out.split("One generation with --spec mtp")[1]
    assert "prompt:" in shown and "answer (plain text" in shown and "the same answer, marked" in shown
    marked = shown.split("the same answer, marked")[1]  # a pipe: marks (report.mark_style: the brackets where the
    assert ("\u27e6" in marked or "[" in marked) and "\x1b[" not in out  # pipe's encoding lacks them), no colour
    assert "drafts the target accepted" in shown  # the legend


@pytest.mark.skipif(not TARGET.is_file() or not DRAFT.is_file(), reason="the shipped models are not built yet")
def test_demo_json_is_one_object_with_the_table_checks_and_costs():
    import json

    run = subprocess.run([sys.executable, "-m", "tinyspec", "demo", "--json", "--max-new", "8"], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout)  # nothing but the object on stdout
    assert report["identical"] is True and report["batch_identical"] is True
    methods = [row["method"] for row in report["table"]]
    assert methods[0] == "plain" and {"mtp", "mtp auto", "lookup auto", "draft auto"} <= set(methods)
    trees = {row["method"]: row for row in report["table"] if row["tree"] > 1}
    assert set(trees) == {"mtp tree", "mtp+lookup"}  # trees beside the chains, timed as they are
    assert all(row["acceptance"] is not None for row in trees.values())
    assert all(row["tok_s"] > 0 and row["tokens_per_step"] >= 1.0 for row in report["table"])
    assert report["table"][0]["speedup"] == 1.0
    assert set(report["step_costs"]) == {"mtp", "lookup", "draft"}
    for costs in report["step_costs"].values():
        assert costs["cost_curve"][0] == 1.0 and costs["cost_curve"] == sorted(costs["cost_curve"])
    assert report["lookup_edit_tokens_per_step"] >= 1.0
