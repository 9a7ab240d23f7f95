"""tinyspec's speculative runs against llama.cpp's own example, step by step (tools/compare_llamacpp_mtp.py).

llama-speculative-simple (built from the llama.cpp sources the docs name; $TINYSPEC_LLAMA_BUILD, its build folder
with bin/llama-speculative-simple) runs greedy MTP (draft-mtp) and draft-model (draft-simple) speculation on the
shipped models, its debug log on; tinyspec runs the same through its engine, once as users run it and once from
llama.cpp's starting point. What this pins (docs/llamacpp-speculation.md says why each holds):

  * the first verify windows: llama.cpp drafts the first generated token, tinyspec takes it from the prefill;
  * from llama.cpp's starting point every drafting step is the same (drafts and kept count), until one of the
    explained causes: llama.cpp drafting past its -n budget, the two targets' greedy texts parting at a near
    tie, or the two drafters' near tie; never anything else;
  * llama.cpp emits more than -n tokens when it drafts past its budget;
  * with a draft model llama.cpp reports every draft accepted (its checkpoint path counts the restored tokens'
    second decode), while its drafting steps keep fewer.

Skipped unless the build is there (CI has none).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

BUILD = os.environ.get("TINYSPEC_LLAMA_BUILD")

pytestmark = pytest.mark.llamacpp


@pytest.fixture(scope="module")
def compare(load_tool):
    if not BUILD or not (Path(BUILD) / "bin" / "llama-speculative-simple").is_file():
        pytest.skip("set TINYSPEC_LLAMA_BUILD to a llama.cpp build with bin/llama-speculative-simple")
    tool = load_tool("compare_llamacpp_mtp")
    runs = {}

    def run(spec: str) -> dict:
        if spec not in runs:
            runs[spec] = tool.compare(Path(BUILD), tool.TARGET, spec, tool.DRAFT if spec == "draft" else None,
                                      tool.PROMPTS + [tool.EDIT_PROMPT], 64, 3, "numpy", say=lambda msg: None)
        return runs[spec]

    return run


@pytest.mark.parametrize("spec", ["mtp", "draft"])
def test_from_llamacpps_start_every_step_is_the_same_or_explained(compare, spec):
    report = compare(spec)
    reasons = [p["why"] for p in report["prompts"]]
    assert not [r for r in reasons if r == "unexplained"], reasons
    for p in report["prompts"]:  # and the steps before the first difference are several, not none
        diff = p["first_difference_from_llamacpp_phase"]
        assert diff is None or diff["step"] >= 3, (p["prompt"], diff)


def test_llamacpp_drafts_the_first_token_and_tinyspec_takes_it_from_the_prefill(compare):
    for p in compare("mtp")["prompts"]:
        ours, theirs = p["first_step_windows"]["tinyspec"][0], p["first_step_windows"]["llama.cpp"][0]
        assert ours["drafts"] != theirs["drafts"]  # one position apart: tinyspec's first draft is llama.cpp's second
        assert ours["drafts"][: 2] != theirs["drafts"][1:] or theirs["accepted"] >= 1


def test_llamacpp_drafts_past_its_budget(compare):
    report = compare("mtp")
    past = [p for p in report["prompts"] if p["why"].startswith("llama.cpp drafts past")]
    assert past, [p["why"] for p in report["prompts"]]
    for p in past:  # the same drafting steps, then llama.cpp's extra ones: more drafted than tinyspec from its start
        assert p["drafted_accepted"]["llama.cpp"][0] > p["drafted_accepted"]["tinyspec_as_llamacpp_starts"][0]


def test_llamacpp_reports_every_draft_model_draft_accepted(compare):
    report = compare("draft")
    for p in report["prompts"]:
        reported = p["llamacpp_reports"]
        assert reported["drafted"] == reported["accepted"]  # its checkpoint path's count
    kept = sum(p["drafted_accepted"]["llama.cpp"][1] for p in report["prompts"])
    drafted = sum(p["drafted_accepted"]["llama.cpp"][0] for p in report["prompts"])
    assert kept < drafted  # while its drafting steps, read from the same log, reject drafts
