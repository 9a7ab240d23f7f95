"""bench reports each timed figure with its range, and flags figures that contradict each other or are too noisy
to quote (tinyspec.fast.bench.checks): the contradictions a user met on a busy machine, each caught."""

from tinyspec.fast.bench import WIDE, checks, report_text


def report(**change) -> dict:
    """A consistent report (what a quiet run gives), with `change` applied."""
    base = {"model": "m.gguf", "backend": "cpu", "weight_bytes": 5e8, "decode_tok_s": 20.0, "decode_ms": 50.0,
            "decode_ms_range": [48.0, 53.0], "verify_ms": {1: 50.0, 4: 70.0},
            "verify_ms_range": {1: [49.0, 52.0], 4: [68.0, 73.0]}, "verify_cost_ratio": {1: 1.0, 4: 1.4},
            "weight_gb_s": 10.0, "copy_gb_s": 20.0, "weight_bw_fraction": 0.5, "plain_tok_s": 19.0,
            "plain_tok_s_range": [18.5, 19.5],
            "spec": {"synthetic": {"tok_s": 38.0, "speedup": 2.0, "speedup_range": [1.9, 2.1], "acceptance_rate": 0.7,
                                   "mean_accepted_length": 2.95, "identical": True}}}
    return base | change


def test_a_consistent_quiet_report_passes_every_check():
    assert checks(report()) == []
    assert "no contradiction found" in report_text(report() | {"checks": []})


def test_each_contradiction_a_user_met_is_flagged():
    spec = report()["spec"]
    faster = {"synthetic": spec["synthetic"] | {"speedup": 9.34}}  # 9.34x at 2.95 tokens a step
    assert any("exceeds the 2.95 tokens" in c for c in checks(report(spec=faster)))
    cheap = report(verify_cost_ratio={1: 1.0, 4: 0.6})  # a 4-token pass cheaper than one token
    assert any("cheaper than one token" in c for c in checks(cheap))
    slow_plain = report(plain_tok_s=1.3, decode_tok_s=6.4)  # plain 1.3 tok/s beside decode 6.4 tok/s
    assert any("plain generation ran at 1.30 tok/s" in c for c in checks(slow_plain))


def test_a_wide_spread_is_named():
    noisy = report(decode_ms_range=[40.0, 40.0 * WIDE * 1.1])
    [found] = checks(noisy)
    assert "noisy" in found and "decode_ms" in found
    text = report_text(noisy | {"checks": checks(noisy)})
    assert "CHECK" in text and "decode_ms" in text


def test_a_failed_graph_capture_is_named():
    """Issue 35, item 2: on cuda a shape whose greedy rule could not be captured runs (slower) as plain launches;
    the report's "graphs" counts say so and checks() makes it a CHECK line with the reason."""
    ok = {"captured": 2, "failed": 0, "replays": 40, "plain": 2, "shapes": ["a", "b"], "reasons": {}}
    assert checks(report(graphs=ok)) == []
    assert "2 captured, 0 failed, 40 replays" in report_text(report(graphs=ok) | {"checks": []})
    by_use = ok | {"by_use": {"rule": ok, "forward": ok | {"captured": 5}}}  # each use on its own line
    text = report_text(report(graphs=by_use) | {"checks": []})
    assert "rule    2 captured" in text and "forward 5 captured" in text
    failed = ok | {"failed": 1, "reasons": {"((4, 8), 'float32')": "RuntimeError: a sync"}}
    [found] = checks(report(graphs=failed))
    assert "1 CUDA graph capture(s) failed" in found and "a sync" in found
    assert checks(report(graphs=None)) == []  # numpy and cpu: no graphs, nothing to say
