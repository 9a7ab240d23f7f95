"""tools/eval_tiny.py --rank-prompts: the prompts a newcomer meets first are ranked by how the shipped model continues
them (issue 49 item 4), not hand-picked: a continuation that loops inside one line ("-zero-zero-zero") counts as a
loop, as one that repeats whole lines does."""

from __future__ import annotations

import pytest

from tinyspec.demo import TARGET


@pytest.mark.skipif(not TARGET.is_file(), reason="the shipped models are not built yet")
def test_rank_prompts_puts_the_good_first_and_measures_loops_inside_a_line(load_tool):
    from tinyspec.backends import load_model
    from tinyspec.tokenizer import Tokenizer

    tool = load_tool("eval_tiny")
    model = load_model(TARGET, "numpy")
    tok = Tokenizer.from_gguf(model.metadata)
    ranked = tool.rank_prompts(model, tok, ["def fib(n):", "def is_prime(n):", "class Point:"], n=24)
    assert sorted(p for p, _ in ranked) == ["class Point:", "def fib(n):", "def is_prime(n):"]
    keys = [(not tool.good(c), c["repeated_trigrams"]) for _, c in ranked]
    assert keys == sorted(keys)
    for _, c in ranked:
        assert set(c) == {"max_line_repeats", "parses", "repeated_trigrams", "text"} and 0 <= c["repeated_trigrams"] < 1
    looping = {"parses": True, "max_line_repeats": 1, "repeated_trigrams": 0.66}  # one line, "-zero-zero-zero..."
    assert not tool.good(looping) and tool.good(looping | {"repeated_trigrams": 0.1})
    assert not tool.good(looping | {"repeated_trigrams": 0.1, "max_line_repeats": 3})
