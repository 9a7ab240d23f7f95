"""bench --serving (tinyspec/fast/bench_serving.py): requests sharing a prefix arrive over time, served four ways.

Structural only: rows, passes, tokens and the report's shape. The scenario's timings are the machine's as much as
the code's, so nothing here asserts a wall-clock ratio (bench.claim's rule); what it checks is exact on any machine:
    prefill    with the prefix cache and chunked prefill the prompts compute <= 1/8 of the rows they compute
               without (a sized scenario: 16 requests, the prefix prefilled once, each request its own token)
    tokens     every configuration emits the baseline's tokens
    waiting    no pass with running slots carries more joining rows than one chunk
    report     its keys, the goals section, checks that flag contradicting figures, the CLI's --json and text
"""

from __future__ import annotations

import json

import pytest
from test_batch import BACKENDS, models, one_numba_thread

from tinyspec.__main__ import main
from tinyspec.fast.bench import WIDE
from tinyspec.fast.bench_serving import CONFIGS, Scenario, checks, run, serving, serving_text

pytestmark = pytest.mark.usefixtures(one_numba_thread.__name__)  # the cpu backend on one thread here too

# 16 requests = 16 shared tokens (4 blocks of 4) + 1 of their own; the first one's prefix is cached after 4 chunks
# of 4, and request i arrives at step 5 i, so every later request finds it
SIZED = Scenario(requests=16, prefix=16, own=1, max_new=2, gap=5, slots=2, chunk=4, block_size=4)
SMALL = Scenario(requests=4, prefix=8, own=2, max_new=2, gap=3, slots=2, chunk=4, block_size=4)


def test_cache_and_chunk_prefill_an_eighth_of_the_rows_for_the_same_tokens():
    """The issue's first goal, exact: 16 x 17 = 272 prompt rows without the cache, 17 + 15 = 32 with it (the first
    request pays for the prefix, every later one feeds its own token): 0.118 <= 1/8; the same tokens; a running
    slot never waits through more than one chunk; each later request's first token follows its arrival's pass."""
    target, _ = models("numpy")
    prompts = SIZED.prompts(target.cfg.n_vocab)
    base = run(target, SIZED, prompts, prefix_cache=False, chunked=False)
    both = run(target, SIZED, prompts, prefix_cache=True, chunked=True)
    assert both.tokens == base.tokens and all(len(t) == SIZED.max_new for t in base.tokens)
    assert base.counts["prefill_rows"] == 16 * 17 and base.counts["full_prefills"] == 16
    assert both.counts["prefill_rows"] == 17 + 15 and both.counts["full_prefills"] == 1
    assert both.counts["prefill_rows"] <= base.counts["prefill_rows"] / 8
    assert both.counts["prefix_hits"] == 15 and both.counts["prefix_tokens_reused"] == 15 * 16
    waited = [p for d, p in zip(both.pass_decode_rows, both.pass_prefill_rows) if d]
    assert max(waited) <= SIZED.chunk and max(both.pass_prefill_rows) <= SIZED.chunk
    assert both.ttft_steps[1:] == [1] * 15 and base.ttft_steps == [1] * 16  # a slot was free at every arrival
    assert both.ttft_rows[0] == base.ttft_rows[0] == 17 and max(both.ttft_rows[1:]) < min(base.ttft_rows[1:])


def test_a_request_admitted_while_the_prefix_is_still_prefilled_prefills_it_again():
    """The prefix cache is looked up when a request is admitted: one arriving while the first is still feeding the
    shared prefix in chunks finds nothing cached and feeds its whole prompt (bench --serving's --gap help says so;
    docs/serving.md section 4 measures it)."""
    target, _ = models("numpy")
    tight = Scenario(requests=3, prefix=16, own=1, max_new=2, gap=1, slots=3, chunk=4, block_size=4)
    both = run(target, tight, tight.prompts(target.cfg.n_vocab), prefix_cache=True, chunked=True)
    assert both.counts["full_prefills"] == 3 and both.counts["prefill_rows"] == 3 * 17


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_report_has_every_configuration_the_goals_and_checks(backend):
    target, _ = models(backend)
    report = serving(target, SMALL, rounds=2)
    assert set(report["configs"]) == set(CONFIGS) and report["setup"]["rounds"] == 2
    for name, c in report["configs"].items():
        assert set(c) >= {"ttft_ms", "ttft_ms_median_range", "ttft_steps", "ttft_rows", "tok_s", "tok_s_range",
                          "prefill_rows", "full_prefills", "wait_rows_max", "running_pass_rows_max", "step_ms",
                          "memory_peak", "kv_blocks_peak", "saved_state_bytes_peak", "graphs"}
        assert c["graphs"] is None  # (numpy and cpu capture no CUDA graph)
        assert set(c["ttft_ms"]) == {"median", "p90", "min", "max"} and c["ttft_ms"]["min"] <= c["ttft_ms"]["p90"]
        assert c["ttft_steps"]["min"] >= 1 and c["tok_s"] > 0
        m = c["memory_peak"]
        assert m["total"] == m["kv"] + m["saved_states"] + m["slot_states"] + m["logits"] > 0
        assert "cache" in name or m["saved_states"] == c["saved_state_bytes_peak"] == 0
        assert c["running_pass_rows_max"] >= c["wait_rows_max"]
    assert report["configs"]["cache+chunk"]["saved_state_bytes_peak"] > 0
    assert report["configs"]["chunk"]["step_ms"]["full_chunk_pass_median"] > 0  # the first prompt's chunks of 4
    assert report["configs"]["baseline"]["step_ms"]["full_chunk_pass_median"] is None
    assert report["configs"]["cache+chunk"]["wait_rows_max"] <= SMALL.chunk
    goals = report["goals"]
    assert set(goals) == {"prefill_rows", "ttft", "running_slot_delay"}
    assert all(isinstance(g["met"], bool) and g["goal"] for g in goals.values())
    assert goals["running_slot_delay"]["met"] and isinstance(report["checks"], list)
    text = serving_text(report)
    assert "goal: prefill rows" in text and "goal: first token" in text and "goal: running slots" in text


def test_the_report_counts_the_cuda_graphs_of_each_configuration(monkeypatch):
    """Issue 45 item 4, through the fake CuPy: bench --serving --backend cuda reports what the forward graphs did in
    each configuration's last round (captured, evicted, failed, replayed, plain); none failed, some replayed, and a
    run's captures stay under the graph store's bound (cuda_pass.MAX_GRAPHS). (Each run is an Engine with new state
    arrays, so the earlier runs' graphs are evicted, least recently replayed first, as later runs capture theirs.)"""
    import fake_cupy

    from tinyspec.backends import load_model
    from tinyspec.fast.cuda_pass import MAX_GRAPHS

    fake_cupy.install(monkeypatch)
    target = load_model(models("numpy")[0].path, "cuda")
    sc = Scenario(requests=4, prefix=8, own=2, max_new=6, gap=2, slots=2, chunk=4, block_size=4, drafter="mtp")
    report = serving(target, sc)
    for name, c in report["configs"].items():
        g = c["graphs"]
        assert set(g) == {"captured", "evicted", "failed", "replays", "plain"}, name
        assert g["failed"] == 0 and g["replays"] > 0 and g["captured"] <= MAX_GRAPHS, (name, g)
    assert "CUDA graphs in cache+chunk's last round" in serving_text(report)


def consistent() -> dict:
    """A serving report whose timings agree with its rows (what a quiet run gives), for checks() alone."""
    config = {"rows": 100, "tok_s": 10.0, "ttft_ms_median_range": [100.0, 105.0], "tok_s_range": [9.8, 10.2]}
    return {"configs": {"baseline": config | {"rows": 400, "tok_s": 4.0, "tok_s_range": [3.9, 4.1]},
                        "cache+chunk": config},
            "goals": {"ttft": {"speedup": 6.0, "rows_speedup": 9.0, "steps_speedup": 1.0, "speedup_range": [5.5, 6.5]}}}


def test_checks_flag_timings_that_contradict_the_rows_or_spread_too_wide():
    assert checks(consistent(), rounds=3) == []
    r = consistent()
    r["goals"]["ttft"] |= {"speedup": 0.7}  # sooner by the rows, later by the clock
    assert any("which bound it" in c for c in checks(r, 3))
    r["goals"]["ttft"] |= {"speedup": 80.7, "rows_speedup": 31.1}  # a first run: the baseline on a busier machine
    assert any("80.70x sooner than the baseline by the clock" in c for c in checks(r, 3))
    r = consistent()
    r["goals"]["ttft"] |= {"speedup_range": [3.5, 6.5]}
    assert any("holds in some rounds only" in c for c in checks(r, 3))
    r = consistent()
    r["configs"]["baseline"] |= {"tok_s": 20.0}  # 4x the rows, yet twice the tok/s
    assert any("baseline computed 4.0x the rows of cache+chunk" in c for c in checks(r, 3))
    r = consistent()
    r["configs"]["cache+chunk"] |= {"ttft_ms_median_range": [100.0, 100.0 * WIDE * 1.1]}
    [found] = checks(r, 3)
    assert "noisy" in found and "cache+chunk.ttft_ms_median_range" in found
    assert checks(r, 1) == []  # one round has no round-to-round spread to judge


def test_cli_bench_serving_json_and_text(capsys):
    flags = ["bench", "--serving", "--backend", "numpy", "--requests", "3", "--prefix", "8", "--own", "2",
             "--max-new", "2", "--gap", "3", "--chunk", "4", "--block-size", "4", "--slots", "2"]
    assert main(flags + ["--json"]) == 0  # no --model: the shipped one
    captured = capsys.readouterr()
    r = json.loads(captured.out)
    assert r["model"].endswith("tiny-target.gguf") and set(r["configs"]) == set(CONFIGS)
    assert r["setup"]["requests"] == 3 and r["setup"]["slots"] == 2 and r["setup"]["drafter"] is None
    assert "[bench] round 1/1: cache+chunk" in captured.err
    assert main(flags + ["--spec", "mtp", "--draft-n", "2"]) == 0
    out = capsys.readouterr().out
    assert "(mtp k = 2)" in out and "goal: running slots" in out and "baseline" in out


@pytest.mark.parametrize("args, message", [
    (["--serving", "--slots", "1,2"], "--slots is the engine's slot count"),
    (["--serving", "--spec", "mtp,lookup"], "one drafter"),
    (["--serving", "--prefix", "-1"], "--prefix must be >= 0"),
    (["--serving", "--prefix", "5000"], "exceeds the model's context length"),
    (["--gap", "3"], "only with --serving"),
])
def test_cli_bench_serving_bad_flags_exit_2(args, message, capsys):
    assert main(["bench", "--backend", "numpy", *args]) == 2
    assert message in capsys.readouterr().err
