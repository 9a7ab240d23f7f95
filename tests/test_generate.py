"""Plain generation: greedy is the argmax chain of full-sequence forwards; seeds reproduce; stops stop."""

import numpy as np
import pytest
from tiny_models import write_tiny_qwen35

from tinyspec.generate import generate
from tinyspec.model import Model
from tinyspec.sampling import SamplingParams


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("g") / "tiny.gguf"
    write_tiny_qwen35(path, seed=2, mtp=False)
    return Model.from_gguf(path)


def test_greedy_equals_argmax_of_full_recompute(model):
    prompt = [10, 20, 30, 40]
    out = generate(model, prompt, 8).tokens
    seq = list(prompt)
    for _ in range(8):  # recompute the whole sequence every step: no state carried
        logits, _ = model.forward(np.array(seq), model.new_state())
        seq.append(int(np.argmax(logits[-1])))
    assert out == seq[len(prompt):]


def test_sampling_is_seeded(model):
    params = SamplingParams(temperature=1.0, top_k=50)
    a = generate(model, [1, 2, 3], 10, params, np.random.default_rng(7)).tokens
    b = generate(model, [1, 2, 3], 10, params, np.random.default_rng(7)).tokens
    c = generate(model, [1, 2, 3], 10, params, np.random.default_rng(8)).tokens
    assert a == b and a != c


def test_stop_token_ends_generation(model):
    first = generate(model, [5, 6], 1).tokens[0]
    assert generate(model, [5, 6], 10, stop_ids=(first,)).tokens == [first]


def test_bad_arguments(model):
    with pytest.raises(ValueError, match="prompt is empty"):
        generate(model, [], 4)
    with pytest.raises(ValueError, match="max_new"):
        generate(model, [1], -1)
    assert generate(model, [1], 0).tokens == []


class _ByteTokens:
    """A stand-in tokenizer: token i is the character chr(i)."""

    def decode(self, ids):
        return "".join(map(chr, ids))


def test_render_marked_marks_runs_not_tokens():
    from tinyspec.report import marks_legend, render_marked

    text, marks = "ab cd\nef", ["target", "accepted", "accepted", "accepted", "correction", "accepted", "accepted", "bonus"]
    ids = [ord(c) for c in text]
    assert render_marked(_ByteTokens(), ids, marks) == "a[b c]{d}[\ne]<f>"  # runs of the same mark, one bracket each
    coloured = render_marked(_ByteTokens(), ids, marks, colour=True)
    assert coloured.replace("\x1b[32m", "").replace("\x1b[33m", "").replace("\x1b[36m", "").replace("\x1b[0m", "") == text
    assert "\x1b[0m\n\x1b[32m" in coloured  # colour ends before a line break, so a margin stays plain
    assert render_marked(_ByteTokens(), [], []) == ""
    assert "[...]" in marks_legend() and "\x1b[" in marks_legend(colour=True)
    assert render_marked(_ByteTokens(), ids, marks, "unicode") == "a\u27e6b c\u27e7\u2983d\u2984\u27e6\ne\u27e7\u27eaf\u27eb"
    assert "\u27e6...\u27e7" in marks_legend("unicode") and marks_legend("brackets") == marks_legend()
    assert render_marked(_ByteTokens(), ids, marks, "colour") == coloured


def test_marks_in_a_pipe_are_not_code_brackets(monkeypatch):
    """issue 49 item 4: in a pipe, --show's [accepted] {correction} <bonus> read as the code's own brackets; a stream
    that holds them gets marks code never has (a UTF-8 pipe or file), an ASCII one the brackets, a terminal colour
    (NO_COLOR: marks again)."""
    import io

    from tinyspec.report import mark_style

    class Terminal(io.StringIO):
        encoding = "utf-8"

        def isatty(self):
            return True

    utf8, ascii_pipe = io.TextIOWrapper(io.BytesIO(), encoding="utf-8"), io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert (mark_style(utf8), mark_style(ascii_pipe), mark_style(Terminal())) == ("unicode", "brackets", "colour")
    monkeypatch.setenv("NO_COLOR", "1")
    assert mark_style(Terminal()) == "unicode"
    with pytest.raises(ValueError, match="marks style"):
        from tinyspec.report import render_marked

        render_marked(_ByteTokens(), [1], ["target"], "bold")


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_a_tiny_temperature_generates_the_greedy_tokens_on_the_shipped_model(backend):
    """The bug: temperature 1e-308 divided the logits into +-inf, the law came out NaN, and generation emitted
    <|endoftext|> at once. Any positive temperature is a proper law now (sampling.probs_from_logits), and so small
    a one is one-hot on the argmax: the shipped model's tokens equal greedy's, plain and with its MTP drafter
    (whose laws go through the same function), on the numpy oracle and the cpu backend."""
    from pathlib import Path

    import tinyspec
    from tinyspec.backends import load_model
    from tinyspec.mtp import MTPDrafter
    from tinyspec.tokenizer import Tokenizer

    model = load_model(Path(tinyspec.__file__).resolve().parent / "assets" / "tiny-target.gguf", backend)
    tok = Tokenizer.from_gguf(model.metadata)
    prompt = tok.encode("def fibonacci(n):\n")
    greedy = generate(model, prompt, 24, stop_ids=tok.eog_ids).tokens
    for drafter in (None, MTPDrafter(model)):
        tiny = generate(model, prompt, 24, SamplingParams(1e-308), np.random.default_rng(0), stop_ids=tok.eog_ids,
                        drafter=drafter, draft_n=3 if drafter else None).tokens
        assert tiny == greedy and tok.eos_id not in tiny


@pytest.mark.parametrize("kind", ["mtp", "lookup"])
@pytest.mark.parametrize("pooled", [False, True])
def test_a_warm_up_leaves_the_model_and_the_drafter_as_they_were(kind, pooled):
    """generate.warm_up runs a throwaway generation (a fresh drafter from drafter.another(), fresh state): a
    generation after it, with the caller's drafter, gives the tokens and the stats it gives without one."""
    from tinyspec.assets import TARGET
    from tinyspec.backends import load_model
    from tinyspec.drafters import build_drafter
    from tinyspec.generate import warm_up

    model = load_model(TARGET)
    runs = []
    for warm in (False, True):
        drafter = build_drafter(kind, model)
        if warm:
            assert warm_up(model, drafter, pooled=pooled) > 0
        res = generate(model, [5, 6, 7, 5, 6, 7, 8], 12, drafter=drafter, draft_n=3)
        runs.append((res.tokens, res.marks, {k: res.stats[k] for k in ("steps", "drafted", "accepted")}))
    assert runs[0] == runs[1]
