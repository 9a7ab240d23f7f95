"""tools/compare_llamacpp_mtp.py's own logic, without llama.cpp: its reading of llama-speculative-simple's debug
log (a verify step, a restored one and its second decode, the totals), and its play of llama.cpp's checkpoint
path on tinyspec's engine (a step of k = 0 after each partial acceptance, the same output as without it)."""

from __future__ import annotations

import numpy as np

LOG = """\
0.00.080.639 D spec        draft:  - seq_id 0, draft candidate   0, pos   0:    258 (   0.997) '   '
0.00.080.644 D spec        draft:  - seq_id 0, draft candidate   1, pos   0:    198 (   0.001) '
'
0.00.080.953 D spec        draft:  - seq_id 0, draft candidate   0, pos   1:    495 (   0.313) ' import'
0.00.080.955 D spec        draft:  - seq_id 0, draft candidate   1, pos   1:    465 (   0.263) ' from'
import0.00.084.214 D accepted 2/2 draft tokens, the last target token is: (302)
0.00.090.001 D spec        draft:  - seq_id 0, draft candidate   0, pos   0:     11 (   0.710) ','
0.00.090.002 D spec        draft:  - seq_id 0, draft candidate   0, pos   1:   2621 (   0.782) 'x'
0.00.090.003 D partial acceptance: 0 < 2, restoring checkpoint
0.00.090.500 D accepted 1/1 draft tokens, the last target token is: (258)
0.00.128.784 I n_drafted = 3
0.00.128.784 I n_accept  = 3
"""


def test_the_debug_log_reads_as_steps(load_tool):
    tool = load_tool("compare_llamacpp_mtp")
    out = tool.parse_log(LOG)
    first, restored = out["steps"]
    assert first == {"drafts": [258, 495], "accepted": 2, "last": 302,
                     "candidates": [[(258, 0.997), (198, 0.001)], [(495, 0.313), (465, 0.263)]]}
    assert restored["drafts"] == [11, 2621] and restored["accepted"] == 0 and restored["restored"]
    assert restored["reverified"] == [1, 1] and restored["last"] == 258  # its second decode: no drafting of its own
    assert (out["drafted"], out["accepted"]) == (4, 2) and out["reported"] == {"drafted": 3, "accepted": 3}
    assert tool.llamacpp_tokens(out["steps"]) is None  # a restored step hides its correction
    assert tool.llamacpp_tokens(out["steps"][:1]) == [258, 495, 302]


def test_llamacpps_checkpoint_path_played_on_the_engine_changes_no_token(load_tool):
    """A step of k = 0 after each partial acceptance (llama.cpp's second decode of the restored tokens) moves the
    drafting windows, never the greedy output."""
    from tinyspec.backends import load_model
    from tinyspec.tokenizer import Tokenizer

    tool = load_tool("compare_llamacpp_mtp")
    target, draft = load_model(tool.TARGET, "numpy"), load_model(tool.DRAFT, "numpy")
    prompt = Tokenizer.from_gguf(target.metadata).encode(tool.PROMPTS[0])
    plain = tool.tinyspec_run(target, draft, "draft", prompt, 24, 3, (), False)
    played = tool.tinyspec_run(target, draft, "draft", prompt, 24, 3, (), True)
    assert played["tokens"] == plain["tokens"]  # the same greedy text from either start
    assert any(s.get("reverified") for s in played["steps"])  # a partial acceptance happened, and was played
    assert all(s["accepted"] <= len(s["drafts"]) for s in played["steps"])


def test_the_drafters_candidates_are_renormalised_over_its_ten_best(load_tool):
    tool = load_tool("compare_llamacpp_mtp")
    logits = np.concatenate([np.arange(10.0), [-50.0] * 5])  # ten candidates and five far below them
    top = tool.top_candidates(logits)
    assert [t for t, _ in top] == [9, 8, 7]
    assert np.isclose(top[0][1], np.exp(9) / np.exp(np.arange(10.0)).sum())  # as llama.cpp's top-k 10 sampler
