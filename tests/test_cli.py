"""`python -m tinyspec`: help, inspect (text and --json), and one-line errors with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tinyspec.__main__ import main
from tinyspec.gguf import GGUFValue, GGUFValueType, RawTensor, write_gguf
from tinyspec.quants import GGMLType, quantize


@pytest.fixture
def model_file(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "m.gguf"
    write_gguf(path, {
        "general.architecture": "qwen35",
        "qwen35.block_count": GGUFValue(GGUFValueType.UINT32, 4),
        "tokenizer.ggml.tokens": [f"tok{i}" for i in range(100)],
        "tokenizer.ggml.scores": np.zeros(100, np.float32),
    }, {
        "token_embd.weight": RawTensor(GGMLType.Q8_0, (100, 64), quantize(rng.standard_normal((100, 64)), GGMLType.Q8_0)),
        "output_norm.weight": np.ones(64, np.float32),
    })
    return path


def test_inspect_json(model_file, capsys):
    assert main(["inspect", str(model_file), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["metadata"]["qwen35.block_count"] == 4
    assert out["metadata"]["tokenizer.ggml.tokens"] == [f"tok{i}" for i in range(100)]  # arrays in full
    emb, norm = out["tensors"]
    assert emb["name"] == "token_embd.weight" and emb["type"] == "Q8_0" and emb["shape"] == [100, 64]
    assert emb["nbytes"] == 100 * 2 * 34 and emb["offset"] % 32 == 0
    assert norm == {"name": "output_norm.weight", "type": "F32", "shape": [64],
                    "offset": emb["offset"] + -(-emb["nbytes"] // 32) * 32, "nbytes": 256}  # padded to 32


def test_inspect_text_summarises_long_arrays(model_file, capsys):
    assert main(["inspect", str(model_file)]) == 0
    out = capsys.readouterr().out
    assert "tokenizer.ggml.tokens" in out and "(100 items)" in out and "tok99" not in out
    assert "token_embd.weight" in out and "Q8_0" in out and "100x64" in out
    assert "types: Q8_0 x1, F32 x1" in out


def test_bad_file_is_one_line_on_stderr_exit_2(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (2**62).to_bytes(8, "little") + bytes(8))
    run = subprocess.run([sys.executable, "-m", "tinyspec", "inspect", str(bad)], capture_output=True, text=True)
    assert run.returncode == 2
    assert run.stdout == ""
    assert run.stderr.count("\n") == 1 and "n_tensors = 4611686018427387904 cannot fit" in run.stderr


def test_missing_file_exit_2(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "none.gguf")]) == 2
    assert "cannot open" in capsys.readouterr().err


def test_a_folder_named_tinyspec_in_the_working_directory_is_named_not_a_traceback(tmp_path):
    """cd to the folder that holds a clone named tinyspec: Python imports the clone as an empty namespace package
    before the installed one. One line that says so, exit 2 (it was an ImportError traceback)."""
    (tmp_path / "tinyspec").mkdir()
    run = subprocess.run([sys.executable, "-m", "tinyspec", "--help"], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 2 and run.stdout == "", run
    assert run.stderr.count("\n") == 1 and "is imported as the package tinyspec instead of the installed" in run.stderr


def test_help_lists_commands():
    run = subprocess.run([sys.executable, "-m", "tinyspec", "--help"], capture_output=True, text=True)
    assert run.returncode == 0 and "inspect" in run.stdout


@pytest.fixture
def tiny_model(tmp_path):
    from tiny_models import write_tiny_qwen35

    path = tmp_path / "tiny.gguf"
    write_tiny_qwen35(path, seed=3)
    return path


def test_logits_writes_npz_with_mtp(tiny_model, tmp_path, capsys):
    from tinyspec.model import Model

    out = tmp_path / "out.npz"
    assert main(["logits", "--model", str(tiny_model), "--tokens", "5,6,7,8", "--out", str(out)]) == 0
    data = np.load(out)
    assert data["tokens"].tolist() == [5, 6, 7, 8]
    assert data["logits"].shape == (4, 272) and data["hidden"].shape == (4, 32) and data["mtp_logits"].shape == (4, 272)
    model = Model.from_gguf(tiny_model)
    expect, _ = model.forward(np.array([5, 6, 7, 8]), model.new_state())
    np.testing.assert_array_equal(data["logits"], expect)


def test_logits_from_prompt_text(tiny_model, tmp_path):
    out = tmp_path / "p.npz"
    assert main(["logits", "--model", str(tiny_model), "--prompt", "the cat", "--out", str(out)]) == 0
    assert np.load(out)["tokens"].tolist()[:2] == [ord("t"), 260]  # "t", then the merge "he" (id 260)


def test_generate_json(tiny_model, capsys):
    assert main(["generate", "--model", str(tiny_model), "--prompt", "hi", "--max-new", "5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["prompt_tokens"] == [ord("h"), ord("i")]
    assert 1 <= len(out["tokens"]) <= 5 and set(out["stats"]) >= {"generated", "decode_tok_s"}
    assert isinstance(out["text"], str)


@pytest.mark.parametrize("args, message", [
    (["--tokens", "1,x"], "comma-separated integers"),
    (["--tokens", "1,9999"], "token id 9999 is outside the vocabulary"),
    (["--tokens", "99999999999999999999999"], "ids must be in 0..2^31-1"),
    (["--prompt", ""], "prompt is empty"),
    (["--tokens", "1", "--max-new", "5000"], "exceed the model's context length 4096"),
    (["--tokens", "1", "--max-new", "-1"], "--max-new must be >= 0"),
    (["--tokens", "1", "--seed", "-1"], "--seed must be >= 0"),
    (["--tokens", "1", "--spec", "mtp", "--draft-max", "1000000000"], "--draft-max must be in 1..64"),
    (["--tokens", "1", "--spec", "lookup", "--draft-n", "1000000000"], "--draft-n must be in 0..64"),
])
def test_generate_bad_input_exit_2(tiny_model, capsys, args, message):
    assert main(["generate", "--model", str(tiny_model), *args]) == 2
    assert message in capsys.readouterr().err


def test_other_architecture_is_named(tmp_path, capsys):
    write_gguf(tmp_path / "llama.gguf", {"general.architecture": "qwen3next"}, {"w": np.ones(4, np.float32)})
    assert main(["generate", "--model", str(tmp_path / "llama.gguf"), "--tokens", "1"]) == 2
    assert "qwen3next" in capsys.readouterr().err


@pytest.mark.parametrize("spec", ["mtp", "lookup", "draft"])
def test_generate_spec_equals_plain_and_reports_stats(tiny_model, tmp_path, capsys, spec):
    from tiny_models import write_tiny_qwen35

    draft = tmp_path / "draft.gguf"
    write_tiny_qwen35(draft, seed=4, n_trunk=2, interval=2, D=16, F=24, mtp=False)
    base = ["generate", "--model", str(tiny_model), "--prompt", "the the the", "--max-new", "12", "--json"]
    assert main(base) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(base + ["--spec", spec, "--draft-n", "3", "--draft-model", str(draft)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tokens"] == plain["tokens"]
    assert set(out["stats"]) >= {"steps", "drafted", "accepted", "acceptance_rate", "mean_accepted_length",
                                 "accepted_per_position", "accepted_length_histogram", "phase_ms", "tokens_per_s",
                                 "warmup_ms"}
    assert out["stats"]["warmup_ms"] > 0  # the kernels' first calls ran before the run (generate.warm_up)


def test_a_drafter_registered_alone_runs_from_the_cli(tiny_model, monkeypatch, capsys):
    """A new drafter is its module and one registry entry (drafters.py), nothing else: a toy kind registered
    in-process, a prompt-lookup drafter with a flag of its own, is a --spec choice, its flag is in --help with its
    default and range check, the parsed flag reaches the drafter, and its output is plain decoding's."""
    from dataclasses import dataclass

    from tinyspec import drafters
    from tinyspec.lookup import LookupDrafter

    @dataclass(frozen=True)
    class ToyOptions(drafters.DraftOptions):
        n_max: int = 4

    built = []

    def build(target, options: ToyOptions):
        built.append(options.n_max)
        return LookupDrafter(n_max=options.n_max)

    n_max = drafters.Flag("--toy-n-max", "the longest suffix the toy looks up (default 4)", int, 4, "N",
                          check=lambda n: None if n >= 1 else f"--toy-n-max must be >= 1, got {n}")
    monkeypatch.setitem(drafters.DRAFTERS, "toy", drafters.DrafterKind(
        "toy", "a toy lookup", 5, build, flags=(n_max,),
        options=lambda args, target, tokenizer: ToyOptions(n_max=args.toy_n_max)))
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    shown = " ".join(capsys.readouterr().out.split())  # argparse wraps the help text
    assert "toy (a toy lookup)" in shown and "--toy-n-max N toy: the longest suffix" in shown and "toy 5" in shown
    every_id = ",".join(map(str, range(272)))  # each token seen before: every step's lookup finds a draft
    base = ["generate", "--model", str(tiny_model), "--tokens", every_id, "--max-new", "12", "--json"]
    assert main(base) == 0
    plain = json.loads(capsys.readouterr().out)["tokens"]
    assert main(base + ["--spec", "toy", "--toy-n-max", "2", "--draft-n", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tokens"] == plain and out["stats"]["drafted"] > 0 and built == [2]
    assert main(base + ["--spec", "toy"]) == 0  # adaptive k, up to the kind's k_max; the flag's default
    assert json.loads(capsys.readouterr().out)["tokens"] == plain and built == [2, 4]
    assert main(base + ["--spec", "toy", "--toy-n-max", "0"]) == 2
    assert "--toy-n-max must be >= 1, got 0" in capsys.readouterr().err
    assert main(base + ["--spec", "lookup", "--toy-n-max", "2"]) == 0
    assert "--toy-n-max ignored with --spec lookup" in capsys.readouterr().err


@pytest.mark.parametrize("spec", ["mtp", "lookup"])
def test_generate_defaults_to_adaptive_k_and_takes_a_draft_vocabulary(tiny_model, tmp_path, capsys, spec):
    base = ["generate", "--model", str(tiny_model), "--prompt", "the the the", "--max-new", "12", "--json"]
    assert main(base) == 0
    plain = json.loads(capsys.readouterr().out)["tokens"]
    np.save(tmp_path / "rank.npy", np.arange(272)[::-1])
    assert main(base + ["--spec", spec, "--draft-max", "5", "--draft-vocab", "100", "--ranking",
                        str(tmp_path / "rank.npy")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tokens"] == plain
    chosen = {int(k): n for k, n in out["stats"]["adaptive"]["chosen_k"].items()}
    assert sum(chosen.values()) == out["stats"]["steps"] and max(chosen) <= 5
    assert main(base + ["--spec", spec, "--draft-n", "2"]) == 0
    assert "adaptive" not in json.loads(capsys.readouterr().out)["stats"]  # a fixed k


@pytest.mark.parametrize("flag, bad", [("--draft-max", "0"), ("--draft-vocab", "-1"), ("--draft-p-min", "1.5")])
def test_draft_flags_must_be_in_range(tiny_model, capsys, flag, bad):
    assert main(["generate", "--model", str(tiny_model), "--tokens", "1,2", "--spec", "mtp", flag, bad]) == 2
    assert flag in capsys.readouterr().err


def test_draft_p_min_stops_drafting_and_keeps_the_output(tiny_model, capsys):
    """--draft-p-min 1: every draft is less sure than that, so each step drafts one token; output as plain."""
    base = ["generate", "--model", str(tiny_model), "--prompt", "the the the", "--max-new", "12", "--json"]
    assert main(base) == 0
    plain = json.loads(capsys.readouterr().out)["tokens"]
    assert main(base + ["--spec", "mtp", "--draft-n", "4", "--draft-p-min", "1"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["tokens"] == plain and 0 < stats["stats"]["drafted"] <= stats["stats"]["steps"]  # <= 1 a step
    assert main(base + ["--spec", "lookup", "--draft-p-min", "0.5"]) == 2
    assert "needs --spec mtp" in capsys.readouterr().err


def test_generate_show_marks_tokens(tiny_model, capsys):
    assert main(["generate", "--model", str(tiny_model), "--prompt", "hi", "--max-new", "6", "--spec", "mtp",
                 "--show"]) == 0
    out = capsys.readouterr().out
    _, marked = out.split("\n--- the same output, marked: ")  # the plain text first, then the marked copy
    legend, body = marked.split("\n", 1)
    # captured, not a terminal, UTF-8: the marks code's own brackets never are, no colour
    assert "\u27e6...\u27e7" in legend and "\x1b[" not in out
    assert "\u2983" in body or "\u27ea" in body  # every verify step ends in a correction or a bonus token


def test_spec_draft_needs_draft_model(tiny_model, capsys):
    assert main(["generate", "--model", str(tiny_model), "--tokens", "1,2", "--spec", "draft"]) == 2
    assert "--draft-model" in capsys.readouterr().err


def test_generate_and_logits_run_the_shipped_model_without_model(tmp_path, capsys):
    """As the demo does: no --model is the shipped target, and --spec draft with it the shipped draft model;
    the output equals the library's greedy generation on that model."""
    from tinyspec.backends import load_model
    from tinyspec.demo import TARGET
    from tinyspec.generate import generate

    target = load_model(TARGET, "numpy")
    expected = generate(target, [10, 11, 12], 6).tokens
    for spec in ("none", "mtp", "draft"):
        assert main(["generate", "--tokens", "10,11,12", "--max-new", "6", "--spec", spec, "--backend", "numpy",
                     "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["tokens"] == expected, spec
    assert main(["logits", "--tokens", "10,11", "--out", str(tmp_path / "l.npz")]) == 0
    with np.load(tmp_path / "l.npz") as f:
        assert f["logits"].shape == (2, target.cfg.n_vocab) and "mtp_logits" in f


def test_bench_json_reports_every_field(tiny_model, capsys):
    args = ["bench", "--model", str(tiny_model), "--backend", "numpy", "--decode-n", "3", "--repeats", "2",
            "--max-new", "10", "--json"]
    assert main(args) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["backend"] == "numpy" and r["decode_tok_s"] > 0 and r["copy_gb_s"] > 0 and r["weight_gb_s"] > 0
    assert set(r["verify_cost_ratio"]) == {"1", "2", "4", "8"} and r["verify_cost_ratio"]["1"] == 1.0
    assert set(r["spec"]) == {"mtp", "lookup", "mtp+lookup", "synthetic"}
    for s in r["spec"].values():
        assert s["identical"] and set(s) >= {"tok_s", "speedup", "acceptance_rate", "mean_accepted_length"}
    assert r["spec"]["synthetic"]["acceptance_setting"] == 0.8
    assert r["rollback"] == "snapshot"  # the oracle's ring
    assert "graphs" in r and r["graphs"] is None  # the oracle captures no CUDA graphs (cuda: tests/test_cuda_syncs.py)


def test_bench_on_the_shipped_model_times_the_demos_edit_prompt(capsys):
    """No --model and no prompt: bench times the demo's edit prompt (real text, so its acceptance is the demo's),
    not random ids."""
    from tinyspec.assets import TARGET
    from tinyspec.demo import EDIT_PROMPT
    from tinyspec.tokenizer import Tokenizer
    from tinyspec.gguf import read_gguf

    if not TARGET.is_file():
        pytest.skip("the shipped model is not built")
    args = ["bench", "--backend", "cpu", "--decode-n", "2", "--repeats", "1", "--verify-sizes", "1,2",
            "--drafters", "lookup", "--max-new", "8", "--spec-repeats", "1", "--profile-steps", "0", "--json"]
    assert main(args) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["prompt_tokens"] == len(Tokenizer.from_gguf(read_gguf(TARGET).metadata).encode(EDIT_PROMPT))
    assert r["spec"]["lookup"]["identical"]


def test_bench_rollback_replay_on_the_oracle(tiny_model, capsys):
    """--rollback replay puts the cpu backend's ring under the oracle: the outputs stay identical."""
    args = ["bench", "--model", str(tiny_model), "--backend", "numpy", "--decode-n", "2", "--repeats", "1",
            "--max-new", "12", "--drafters", "mtp,synthetic", "--rollback", "replay", "--verify-sizes", "1..3", "--json"]
    assert main(args) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["rollback"] == "replay" and all(s["identical"] for s in r["spec"].values())
    assert set(r["verify_cost_ratio"]) == {"1", "2", "3"}  # --verify-sizes 1..3: T = 1, 2, 3


def test_bench_tree_times_tree_drafters_and_tree_passes(tiny_model, capsys):
    """--tree W: the MTP head's and lookup's trees beside their chains (the same rows), mtp+lookup at W, and every
    verify pass also timed as a tree; every run identical to plain decoding."""
    args = ["bench", "--model", str(tiny_model), "--backend", "numpy", "--decode-n", "2", "--repeats", "1",
            "--max-new", "12", "--drafters", "mtp,lookup,mtp+lookup", "--tree", "3", "--verify-sizes", "1,4", "--json"]
    assert main(args) == 0
    r = json.loads(capsys.readouterr().out)
    assert set(r["spec"]) == {"mtp", "mtp_tree", "lookup", "lookup_tree", "mtp+lookup"}
    assert all(s["identical"] for s in r["spec"].values())
    assert set(r["verify_tree_ms"]) == set(r["verify_tree_ratio"]) == {"1", "4"}
    assert all(v > 0 for v in r["verify_tree_ratio"].values())
    assert main(args + ["--tree", "9"]) == 2
    assert "--tree must be in 1..8" in capsys.readouterr().err


def test_bench_synth_len_draft_vocab_and_adaptive(tiny_model, capsys):
    args = ["bench", "--model", str(tiny_model), "--backend", "numpy", "--decode-n", "2", "--repeats", "1",
            "--max-new", "12", "--drafters", "", "--synth-len", "2.95", "--draft-vocab", "64", "--adaptive", "--json"]
    assert main(args) == 0
    r = json.loads(capsys.readouterr().out)
    assert set(r["spec"]) == {"mtp", "mtp_vocab", "mtp_synth", "mtp_synth_vocab", "mtp_adaptive", "mtp_adaptive_vocab",
                              "mtp_synth_adaptive", "mtp_synth_adaptive_vocab"}
    for s in r["spec"].values():
        assert s["identical"] and s["tok_s"] > 0 and s["speedup"] > 0
    synth = r["spec"]["mtp_synth"]
    assert synth["synth_len"] == 2.95 and abs(synth["acceptance_setting"] - 0.7996) < 1e-3  # 1 + p + p^2 + p^3 = 2.95
    assert abs(synth["expected_mean_accepted_length"] - 2.95) < 1e-9
    assert synth["phase_ms"]["draft"] > 0  # the MTP head really drafted
    assert r["spec"]["mtp_vocab"]["draft_vocab"] == 64 and r["spec"]["mtp_adaptive"]["chosen_k"]
    assert r["spec"]["mtp_adaptive_vocab"]["draft_vocab"] == 64 and r["spec"]["mtp_adaptive_vocab"]["chosen_k"]
    both = r["spec"]["mtp_synth_adaptive_vocab"]  # the synthetic acceptance, k chosen per step, the draft vocabulary
    assert both["synth_len"] == 2.95 and both["draft_vocab"] == 64 and both["chosen_k"]


@pytest.mark.parametrize("args, message", [
    (["--drafters", "mtp,oracle"], "unknown oracle"),
    (["--synth-len", "5"], "--synth-len must be in 1..4"),
    (["--draft-vocab", "0"], "--draft-vocab must be >= 1"),
    (["--synth-acceptance", "1.5"], "must be in [0, 1]"),
    (["--verify-sizes", "2,4"], "include 1"),
    (["--backend", "cuda"], "cuda backend needs cupy"),
    (["--backend", "numpy", "--graphs", "off"], "only the cuda backend captures CUDA graphs"),
])
def test_bench_bad_input_exit_2(tiny_model, capsys, args, message):
    from tinyspec.backends import cuda_available

    if "cuda" in args and cuda_available():
        pytest.skip("a GPU is present")
    assert main(["bench", "--model", str(tiny_model), *args]) == 2
    assert message in capsys.readouterr().err


def test_checks_that_need_no_model_come_before_loading_it(tmp_path, capsys):
    """A bad flag is reported at once, not after a long load: here the model file does not even exist."""
    missing = str(tmp_path / "absent.gguf")
    for args, message in ((["--tokens", "1", "--spec", "draft"], "--spec draft needs --draft-model"),
                          (["--prompt", ""], "prompt is empty"), (["--tokens", "1", "--seed", "-2"], "--seed")):
        assert main(["generate", "--model", missing, *args]) == 2
        assert message in capsys.readouterr().err
    assert main(["bench", "--model", missing, "--prompt-len", "0"]) == 2
    assert "--prompt-len must be >= 1" in capsys.readouterr().err


def test_ignored_flags_are_named(tiny_model, capsys):
    assert main(["generate", "--model", str(tiny_model), "--tokens", "1,2", "--max-new", "2", "--draft-n", "3"]) == 0
    assert "--draft-n ignored with --spec none" in capsys.readouterr().err


def test_logits_out_names_the_file_it_wrote_and_refuses_a_folder(tiny_model, tmp_path, capsys):
    assert main(["logits", "--model", str(tiny_model), "--tokens", "5,6", "--out", str(tmp_path / "noext")]) == 0
    assert f"wrote {tmp_path / 'noext.npz'}:" in capsys.readouterr().out
    assert np.load(tmp_path / "noext.npz")["tokens"].tolist() == [5, 6]
    assert main(["logits", "--model", str(tiny_model), "--tokens", "5", "--out", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
    missing = tmp_path / "no such folder" / "x.npz"  # said before the model loads, as "cannot write"
    assert main(["logits", "--model", str(tiny_model), "--tokens", "5", "--out", str(missing)]) == 2
    assert f"cannot write {missing}: no folder {missing.parent}" in capsys.readouterr().err


def test_a_batch_prompt_the_pool_could_never_hold_is_skipped_saying_what_it_needs(tmp_path, capsys):
    """--kv-blocks too small for one prompt's run (its prompt, --max-new and k + 1 positions, its drafter's KV too):
    that prompt is reported with the blocks it needs and the others run; all of them: exit 2 (the test above)."""
    path = tmp_path / "p.txt"
    path.write_text("def f():\n" + "x = 1 + 2 + 3 + 4 + 5 + 6\n", encoding="utf-8")
    args = ["batch", "--prompts", str(path), "--backend", "numpy", "--kv-blocks", "6", "--block-size", "4",
            "--max-new", "8", "--spec", "mtp", "--json"]
    assert main(args) == 0
    captured = capsys.readouterr()
    seqs = json.loads(captured.out)["sequences"]
    assert seqs[0]["error"] is None and len(seqs[0]["tokens"]) == 8
    assert seqs[1]["error"].startswith("it needs ") and "KV blocks of 4, --kv-blocks is 6" in seqs[1]["error"]
    assert "[batch] prompt 1: skipped: it needs" in captured.err


def test_version():
    from tinyspec import __version__

    out = subprocess.run([sys.executable, "-m", "tinyspec", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"tinyspec {__version__}"


def test_prompt_file(tiny_model, tmp_path, capsys):
    """--prompt-file reads the prompt (a long one would not fit a command line): same tokens as --prompt."""
    text = "the cat " * 200
    (tmp_path / "p.txt").write_text(text, encoding="utf-8")
    base = ["generate", "--model", str(tiny_model), "--max-new", "2", "--json"]
    assert main(base + ["--prompt-file", str(tmp_path / "p.txt")]) == 0
    from_file = json.loads(capsys.readouterr().out)
    assert main(base + ["--prompt", text]) == 0
    from_flag = json.loads(capsys.readouterr().out)
    assert (from_file["prompt_tokens"], from_file["tokens"]) == (from_flag["prompt_tokens"], from_flag["tokens"])
    assert len(from_file["prompt_tokens"]) > 400
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe")
    assert main(base + ["--prompt-file", str(tmp_path / "bad.txt")]) == 2
    assert "not UTF-8" in capsys.readouterr().err
    assert main(base + ["--prompt-file", str(tmp_path / "absent.txt")]) == 2


def test_a_prompt_too_long_for_the_context_is_refused_before_it_is_encoded(tmp_path, capsys):
    """A megabyte without a space (one pre-token: encoding it was quadratic, minutes of silence) is refused from
    its byte length alone: no token of the shipped vocabulary is longer than max_token_bytes. In a batch that
    prompt is skipped with the same reason and the others run."""
    big = "x" * 1_000_000
    (tmp_path / "big.txt").write_text(big, encoding="utf-8")
    assert main(["generate", "--prompt-file", str(tmp_path / "big.txt"), "--max-new", "2"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after the loading line: the error, one line
    assert last.startswith("tinyspec generate: error: the prompt is 1,000,000 bytes, so at least") and "context" in last
    (tmp_path / "prompts.txt").write_text("import os\n" + big + "\n", encoding="utf-8")
    assert main(["batch", "--prompts", str(tmp_path / "prompts.txt"), "--max-new", "2", "--json"]) == 0
    seqs = json.loads(capsys.readouterr().out)["sequences"]
    assert seqs[0]["error"] is None and "so at least" in seqs[1]["error"]


@pytest.mark.parametrize("spec", ["none", "mtp"])
def test_streamed_output_equals_the_printed_text(tiny_model, capsys, spec):
    """--stream writes tokens as generate decides them (a speculative step's run at once): the same text and,
    with --show, the same marks as the printed result."""
    base = ["generate", "--model", str(tiny_model), "--prompt", "the cat", "--max-new", "12", "--spec", spec]
    base += ["--draft-n", "3"] if spec != "none" else []  # fixed k: the adaptive k (and the marks) follow the clock
    for extra in ([], ["--show"]):
        assert main(base + extra + ["--no-stream"]) == 0
        printed = capsys.readouterr().out
        assert main(base + extra + ["--stream"]) == 0
        assert capsys.readouterr().out == printed


def test_on_emit_sees_every_token_in_order(tiny_model):
    from tinyspec.backends import load_model
    from tinyspec.generate import generate
    from tinyspec.lookup import LookupDrafter

    model = load_model(tiny_model, "numpy")
    for drafter in (None, LookupDrafter(n_min=1)):
        seen, marks = [], []
        res = generate(model, [10, 20, 30, 10, 20, 30, 10, 20], 16, drafter=drafter,
                       on_emit=lambda t, m: (seen.extend(t), marks.extend(m)))
        assert seen == res.tokens and marks == res.marks  # plain: every token the target's own


BATCH_PROMPTS = ["def main():", "class Stack:", "import os"]


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text(f"{BATCH_PROMPTS[0]}\n\n" + json.dumps({"prompt": BATCH_PROMPTS[1]}) + f"\n{BATCH_PROMPTS[2]}\n",
                    encoding="utf-8")  # a blank line (skipped) and a JSON line among plain ones
    return path


@pytest.mark.parametrize("spec", ["none", "mtp", "lookup", "draft"])
def test_batch_json_tokens_equal_generate_alone(prompts_file, capsys, spec):
    """batch --json on the shipped model (no --model; --spec draft: the shipped draft model), 3 prompts in 2 slots
    (the third waits for a free slot): every sequence's tokens are exactly what `generate --json` reports for its
    prompt alone, in input order."""
    assert main(["batch", "--prompts", str(prompts_file), "--slots", "2", "--spec", spec, "--max-new", "12",
                 "--backend", "numpy", "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert "[batch] model" in captured.err and "2 slots, 3 prompts" in captured.err
    assert [s["index"] for s in out["sequences"]] == [0, 1, 2]
    for prompt, seq in zip(BATCH_PROMPTS, out["sequences"]):
        assert main(["generate", "--prompt", prompt, "--spec", spec, "--max-new", "12", "--backend", "numpy",
                     "--json"]) == 0
        alone = json.loads(capsys.readouterr().out)
        assert seq["error"] is None and seq["tokens"] == alone["tokens"] and len(seq["tokens"]) > 0
        assert (seq["prompt_tokens"], seq["text"]) == (alone["prompt_tokens"], alone["text"])
        assert set(seq["stats"]) >= {"steps", "drafted", "accepted", "acceptance_rate", "mean_accepted_length"}
    stats = out["stats"]
    assert set(stats) >= {"tok_s", "decode_tok_s", "steps", "rows_per_pass", "kv_blocks_peak", "kv_bytes_peak",
                          "generated", "failed", "slots"}
    assert stats["slots"] == 2 and stats["failed"] == 0 and stats["spec"] == spec
    assert stats["generated"] == sum(len(s["tokens"]) for s in out["sequences"])
    assert stats["rows_per_pass"] > 1  # two slots shared passes
    assert (stats["draft_n"], stats["k_max"]) == ((0, 0) if spec == "none" else (3, 3))


def test_batch_chunk_prefix_cache_and_a_small_pool_keep_sampled_tokens(tmp_path, capsys):
    """--chunk 2 --prefix-cache --kv-blocks 11 --block-size 4 with four prompts sharing a prefix, sampled with MTP
    drafts: the prompts join two rows a step, a later one starts from a saved state, and the pool of eleven
    4-position blocks (the longest run needs all eleven: seven for its KV, four for its MTP head's) makes the newest
    sequence give its blocks back and resume; every sequence still samples exactly `generate --seed S+i`, and the
    summary says so."""
    prompts = ["def main(): return 1", "def main(): return 1", "def main(): print(2)", "def main(): return 1"]
    (tmp_path / "p.txt").write_text("\n".join(prompts) + "\n", encoding="utf-8")
    common = ["--spec", "mtp", "--draft-n", "2", "--max-new", "14", "--temperature", "0.9", "--backend", "numpy"]
    assert main(["batch", "--prompts", str(tmp_path / "p.txt"), "--slots", "3", "--seed", "5", "--chunk", "2",
                 "--prefix-cache", "--kv-blocks", "11", "--block-size", "4", *common, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    stats = out["stats"]
    assert stats["chunk"] == 2 and stats["prefix_hits"] > 0 and stats["preemptions"] > 0
    for i, (prompt, seq) in enumerate(zip(prompts, out["sequences"])):
        assert main(["generate", "--prompt", prompt, "--seed", str(5 + i), *common, "--json"]) == 0
        assert seq["tokens"] == json.loads(capsys.readouterr().out)["tokens"]


def test_batch_sampled_sequence_i_is_generate_with_seed_s_plus_i(prompts_file, capsys):
    """--seed S: sequence i draws from S + i, so it samples exactly `generate --seed S+i` with the same k."""
    common = ["--spec", "mtp", "--draft-n", "2", "--max-new", "10", "--temperature", "0.9", "--backend", "numpy",
              "--json"]
    assert main(["batch", "--prompts", str(prompts_file), "--slots", "3", "--seed", "5", *common]) == 0
    seqs = json.loads(capsys.readouterr().out)["sequences"]
    for i, prompt in enumerate(BATCH_PROMPTS):
        assert main(["generate", "--prompt", prompt, "--seed", str(5 + i), *common]) == 0
        assert seqs[i]["tokens"] == json.loads(capsys.readouterr().out)["tokens"]


def test_batch_text_output_streams_sequences_then_a_summary(prompts_file, monkeypatch, capsys):
    """Without --json: "[i] text" as each sequence finishes, then the summary on stderr; '-' reads stdin."""
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO(prompts_file.read_text(encoding="utf-8")))
    assert main(["batch", "--prompts", "-", "--slots", "2", "--spec", "mtp", "--max-new", "8",
                 "--backend", "numpy"]) == 0
    out, err = capsys.readouterr()
    assert [line[:3] for line in out.splitlines() if line[:1] == "["] == ["[0]", "[1]", "[2]"]  # input order
    assert "tok/s" in err and "steps" in err and "rows per pass" in err and "KV peak" in err and "MB" in err
    assert all(f"[batch] sequence {i}:" in err for i in range(3)) and "acceptance" in err


def test_status_line_and_errors_read_as_flags_and_files(tiny_model, tmp_path, capsys):
    """Glitches a user met: an empty "k per step ]" after --max-new 0; plain steps and the policy's k read as a
    contradiction; errors in internal names (top_p) or Python's "[Errno 2]"; --draft-vocab over the whole
    vocabulary passing silently."""
    base = ["generate", "--model", str(tiny_model), "--prompt", "a b a b", "--spec", "mtp"]
    assert main(base + ["--max-new", "0"]) == 0
    err = capsys.readouterr().err
    assert "[0 tokens in 0 target passes" in err and "k per step" not in err and "allowed ]" not in err
    assert main(base + ["--max-new", "8"]) == 0
    err = capsys.readouterr().err
    assert "steps by the drafts allowed" in err and "k per step" not in err
    assert main(base + ["--top-p", "2"]) == 2
    assert "--top-p must be in (0, 1]" in capsys.readouterr().err
    assert main(base + ["--temperature", "-1"]) == 2
    assert "--temperature must be" in capsys.readouterr().err
    assert main(["batch", "--prompts", str(tmp_path / "absent.txt"), "--model", str(tiny_model)]) == 2
    err = capsys.readouterr().err
    assert "Errno" not in err and "absent.txt" in err
    assert main(base + ["--max-new", "2", "--draft-vocab", "100000"]) == 0
    assert "covers the whole vocabulary" in capsys.readouterr().err


def test_batch_bad_prompts_are_reported_and_the_others_run(tmp_path, capsys):
    path = tmp_path / "p.txt"
    path.write_text("def f():\n" + "a b " * 3000 + "\n{\"text\": \"no prompt field\"}\n{oops\nimport os\n",
                    encoding="utf-8")  # fine, longer than the context, no "prompt", not JSON, fine
    assert main(["batch", "--prompts", str(path), "--max-new", "4", "--backend", "numpy", "--json"]) == 0
    captured = capsys.readouterr()
    seqs = json.loads(captured.out)["sequences"]
    assert [s["error"] is None for s in seqs] == [True, False, False, False, True]
    assert "context length" in seqs[1]["error"] and '"prompt" field' in seqs[2]["error"]
    assert "line 4: not a JSON object" in seqs[3]["error"]
    assert seqs[1]["tokens"] == [] and len(seqs[4]["tokens"]) == 4
    for i in (1, 2, 3):
        assert f"[batch] prompt {i}: skipped:" in captured.err
    assert json.loads(captured.out)["stats"]["failed"] == 3


@pytest.mark.parametrize("content, args, message", [
    ("\n  \n", [], "no prompts"),
    ("hi\n", ["--slots", "0"], "slots (sequences decoded at once) must be >= 1"),
    ("hi\n", ["--spec", "mtp", "--draft-n", "65"], "--draft-n must be in 0..64"),
    ("hi\n", ["--spec", "mtp", "--draft-n", "-1"], "--draft-n must be in 0..64"),
    ("hi\n", ["--max-new", "-1"], "--max-new must be >= 0"),
    ("hi\nthere\n", ["--max-new", "5000"], "no prompt can run: prompt 0: a prompt of"),
    ('{"prompt": ""}\n', [], "no prompt can run"),
    ("def f():\nimport os\n", ["--kv-blocks", "1", "--block-size", "4", "--max-new", "8"],
     "no prompt can run: prompt 0: it needs 4 KV blocks of 4, --kv-blocks is 1 (and 1 more)"),
])
def test_batch_bad_input_exit_2(tmp_path, capsys, content, args, message):
    path = tmp_path / "p.txt"
    path.write_text(content, encoding="utf-8")
    assert main(["batch", "--prompts", str(path), "--backend", "numpy", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("tinyspec batch: error") == 1
    assert err.strip().splitlines()[-1].startswith("tinyspec batch: error:")
    assert main(["batch", "--prompts", str(tmp_path / "absent.txt")]) == 2


def test_batch_help_explains_every_flag():
    run = subprocess.run([sys.executable, "-m", "tinyspec", "batch", "--help"], capture_output=True, text=True)
    assert run.returncode == 0
    for flag in ("--model", "--prompts", "--slots", "--spec", "--draft-model", "--draft-n", "--max-new",
                 "--temperature", "--seed", "--backend", "--json", "S + i", "--chunk", "--prefix-cache", "--kv-blocks",
                 "--block-size"):
        assert flag in run.stdout, flag


def test_bench_slots_reports_batched_rates(capsys):
    """bench --slots on the shipped model: per B the batched plain and MTP rates, plain passes of exactly B rows
    (no stop ids: every sequence runs --max-new tokens), spec passes of more, outputs identical."""
    from tinyspec.demo import TARGET

    base = ["bench", "--model", str(TARGET), "--backend", "numpy", "--decode-n", "2", "--repeats", "1",
            "--max-new", "10", "--drafters", ""]
    assert main(base + ["--slots", "1,2", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert set(r["slots"]) == {"1", "2"} and r["slots_setup"]["drafter"] == "mtp"
    for B, s in r["slots"].items():
        assert set(s) >= {"plain_tok_s", "spec_tok_s", "rows_per_pass", "spec_rows_per_pass", "speedup", "identical"}
        assert s["identical"] is True and s["plain_tok_s"] > 0 and s["spec_tok_s"] > 0 and s["speedup"] > 0
        assert s["rows_per_pass"] == int(B) and s["spec_rows_per_pass"] > s["rows_per_pass"]
    assert r["slots"]["2"]["rows_per_pass"] > 1
    assert main(base + ["--slots", "2", "--synth-len", "2.5"]) == 0  # text view, synthetic rate, real MTP cost
    out = capsys.readouterr().out
    assert "plain vs mtp_synth (k = 3, set 2.50 tokens/step)" in out and "B = 2" in out and "identical" in out


def test_bench_without_slots_has_no_slots_block(tiny_model, capsys):
    assert main(["bench", "--model", str(tiny_model), "--backend", "numpy", "--decode-n", "2", "--repeats", "1",
                 "--max-new", "4", "--drafters", "", "--json"]) == 0
    assert "slots" not in json.loads(capsys.readouterr().out)
    assert main(["bench", "--model", str(tiny_model), "--slots", "1,0"]) == 2
    assert "--slots: slot counts must be >= 1" in capsys.readouterr().err


def test_batch_adaptive_keeps_each_sequences_greedy_tokens(prompts_file, capsys):
    """batch --adaptive: the batch-aware draft length chooses k per step (fast/batch_draft_length.py); every
    sequence still gets exactly its plain greedy tokens, and the stats carry the policy's choices."""
    assert main(["batch", "--prompts", str(prompts_file), "--slots", "2", "--spec", "mtp", "--adaptive",
                 "--max-new", "12", "--backend", "numpy", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for prompt, seq in zip(BATCH_PROMPTS, out["sequences"]):
        assert main(["generate", "--prompt", prompt, "--max-new", "12", "--backend", "numpy", "--json"]) == 0
        assert seq["tokens"] == json.loads(capsys.readouterr().out)["tokens"]
    assert out["stats"]["policy"]["chosen_k"] and out["stats"]["k_max"] == 3


EOS_PROMPT = "def main():\n    pass\n\n\nif __name__ == '__main__':\n"  # the shipped model ends it at <|endoftext|>


@pytest.mark.parametrize("spec", ["none", "mtp"])
def test_the_end_of_generation_token_is_counted_but_its_text_not_printed(tmp_path, capsys, spec):
    """The bug: generate and batch printed "...\\n<|endoftext|>" when a sequence ended at its end-of-generation id:
    that token's text was decoded into the answer (llama-server and vLLM leave it out). On the shipped model this
    prompt ends at <|endoftext|> after some 50 tokens: the id stays in "tokens" (and the counts), its text is in
    no output, printed, streamed (the same text), marked (--show), batch's or --json's (textstream.text_ids)."""
    from tinyspec.demo import TARGET
    from tinyspec.gguf import read_gguf
    from tinyspec.tokenizer import Tokenizer

    with read_gguf(TARGET) as f:
        tok = Tokenizer.from_gguf(dict(f.metadata))
    base = ["generate", "--prompt", EOS_PROMPT, "--max-new", "80", "--spec", spec, "--backend", "numpy"]
    base += ["--draft-n", "3"] if spec != "none" else []
    assert main(base + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tokens"][-1] in tok.eog_ids and len(out["tokens"]) < 80 and "<|endoftext|>" not in out["text"]
    assert out["text"] == tok.decode(out["tokens"][:-1]) and out["text"].strip()
    assert main(base + ["--no-stream"]) == 0
    assert capsys.readouterr().out == out["text"] + "\n"
    assert main(base + ["--stream"]) == 0
    assert capsys.readouterr().out == out["text"] + "\n"
    if spec != "none":
        for stream in ("--stream", "--no-stream"):
            assert main(base + ["--show", stream]) == 0
            shown = capsys.readouterr().out
            assert shown.startswith(out["text"] + "\n") and "endoftext" not in shown
    (tmp_path / "p.txt").write_text(json.dumps({"prompt": EOS_PROMPT}) + "\n", encoding="utf-8")
    batch = ["batch", "--prompts", str(tmp_path / "p.txt"), "--max-new", "80", "--spec", spec, "--backend", "numpy"]
    assert main(batch) == 0
    assert capsys.readouterr().out == f"[0] {out['text']}\n"
    assert main(batch + ["--json"]) == 0
    seq = json.loads(capsys.readouterr().out)["sequences"][0]
    assert seq["tokens"] == out["tokens"] and seq["text"] == out["text"]
