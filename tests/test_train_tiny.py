"""tools/train_tiny.py end to end at the `smoke` preset (needs torch, transformers, tokenizers; skipped without them).

One run on tinyspec's own sources as the corpus: the tokenizer, the target with its MTP block and the draft
model train, export through tinyspec.convert, and the GGUFs load and run in tinyspec with the training record in
their metadata. A run interrupted by --stop-after and resumed writes the same tensors as the uninterrupted run
(batches depend on (seed, step) only, the checkpoint holds the optimizer state), so the shipped numbers can be
reproduced and a long run survives a restart.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tinyspec.gguf import read_gguf
from tinyspec.model import Model
from tinyspec.mtp import MTPHead, shift_hidden
from tinyspec.tokenizer import Tokenizer

REPO = Path(__file__).resolve().parents[1]


def run(out: Path, corpus: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(REPO / "tools" / "train_tiny.py"), "all", "--preset", "smoke", "--out", str(out),
           "--corpus", str(corpus), "--threads", "1", "--ckpt-every", "5", *extra]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def tensors(path: Path) -> dict[str, bytes]:
    with read_gguf(path) as g:
        return {name: g.raw(name).tobytes() for name in g.tensors}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    for mod in ("torch", "transformers", "tokenizers", "safetensors"):
        pytest.importorskip(mod)
    corpus = tmp_path_factory.mktemp("tinyspec")  # a snapshot: the sources may change while the tests run
    for path in sorted((REPO / "tinyspec").rglob("*.py")):
        (corpus / path.relative_to(REPO / "tinyspec")).parent.mkdir(parents=True, exist_ok=True)
        (corpus / path.relative_to(REPO / "tinyspec")).write_bytes(path.read_bytes())
    out = tmp_path_factory.mktemp("train")
    run(out, corpus)
    return out, corpus


def test_exports_load_and_carry_the_training_record(trained):
    target, draft = trained[0] / "tiny-target.gguf", trained[0] / "tiny-draft.gguf"
    with read_gguf(target) as g:
        meta = g.metadata
    assert meta["training.steps"] == 20 and meta["training.tokens"] == 20 * 4 * 64
    assert meta["training.corpus"].startswith(trained[1].name + " (") and meta["training.loss.heldout"] > 0
    assert {"training.loss.heldout_mtp1", "training.loss.heldout_mtp2", "training.seconds"} <= set(meta)
    recipe = json.loads(meta["training.recipe"])  # the run as it ran: enough to repeat it
    assert recipe["steps"] == 20 and recipe["batch"] == 4 and recipe["arch"]["mtp"] and recipe["device"] == "cpu"
    ranking = np.asarray(meta["training.token_ranking"])  # every id once, most frequent first
    assert sorted(ranking.tolist()) == list(range(512))
    assert meta["qwen35.nextn_predict_layers"] == 1 and meta["tokenizer.ggml.pre"] == "qwen35"
    assert read_gguf(target).tensors["token_embd.weight"].ggml_type.name == "Q8_0"
    assert read_gguf(target).tensors["blk.0.ssm_a"].ggml_type.name == "F32"  # as llama.cpp keeps it

    model, small = Model.from_gguf(target), Model.from_gguf(draft)
    tok = Tokenizer.from_gguf(model.metadata)
    assert Tokenizer.from_gguf(small.metadata).encode("def f(x):\n    return x") == tok.encode("def f(x):\n    return x")
    ids = tok.encode("import numpy as np\n\ndef main():\n")
    assert tok.decode(ids) == "import numpy as np\n\ndef main():\n"
    assert tok.eog_ids and max(tok.eog_ids) == model.cfg.n_vocab - 1  # <|endoftext|>, the last id
    logits, hidden = model.forward(ids, model.new_state())
    assert np.isfinite(logits).all() and logits.shape == (len(ids), 512)
    head = MTPHead(model)
    mtp_logits, _ = head.forward(ids, shift_hidden(hidden), head.new_cache())
    assert np.isfinite(mtp_logits).all()
    assert small.cfg.n_nextn == 0 and small.cfg.n_embd < model.cfg.n_embd


def test_resume_after_interruption_gives_the_same_weights(trained, tmp_path):
    out, corpus = trained
    stopped = run(tmp_path, corpus, "--stop-after", "7")
    assert "stopped at step 7" in stopped.stderr and not (tmp_path / "tiny-target.gguf").exists()
    resumed = run(tmp_path, corpus)
    assert "resuming at step 7" in resumed.stderr
    for name in ("tiny-target.gguf", "tiny-draft.gguf"):
        assert tensors(tmp_path / name) == tensors(out / name), name


def test_planted_copies_repeat_a_span_at_varying_distances(load_tool):
    """Rows of distinct tokens make copies visible: a planted copy is the only way a token appears twice."""
    train_tiny = load_tool("train_tiny")
    batch = np.arange(64 * 130).reshape(64, 130) + 10_000  # distinct tokens
    train_tiny.plant_copies(batch, np.random.default_rng(0), 1.0)
    distances = set()
    for row in batch:
        seen, pairs = {}, []
        for i, t in enumerate(row.tolist()):
            if t in seen:
                pairs.append((seen[t], i))
            else:
                seen[t] = i
        assert len(pairs) >= 16 - 2, len(pairs)  # at least 16 copied tokens, at most 2 of them edited
        distances |= {j - i for i, j in pairs}
    assert len(distances) > 10  # not one fixed offset: the model must find the copy by content


def test_planted_edits_copy_whole_lines_after_an_edited_first_line(load_tool):
    """Distinct tokens, lines of 10: the planted block ends with a run of whole lines of the original."""
    train_tiny = load_tool("train_tiny")
    batch = np.arange(32 * 130).reshape(32, 130)
    line_end = np.arange(32 * 130) % 10 == 9
    original = batch.copy()
    train_tiny.plant_edits(batch, np.random.default_rng(1), 1.0, line_end)
    for row, orig in zip(batch, original):
        changed = np.flatnonzero(row != orig)
        end = changed[-1]
        p = int(np.flatnonzero(orig == row[end])[0])  # where the block's last token sits in the original
        assert p < changed[0]  # copied from before the block
        m = 0
        while m <= p and row[end - m] == orig[p - m]:
            m += 1
        run = orig[p - m + 1:p + 1]
        assert m >= 10 and line_end[run].any(), (m, run)  # at least a line's worth, spanning a line end


def test_windows_draw_their_share_from_the_head_of_the_stream(load_tool):
    """stdlib_frac: a share of the rows from the stream's first `head` tokens (the standard library), the rest
    from anywhere; the same (seed, step) gives the same batch."""
    train_tiny = load_tool("train_tiny")
    stream = np.arange(100_000)
    rows = train_tiny.windows(stream, 4000, 66, np.random.default_rng(3), head=10_000, head_frac=0.25)
    in_head = rows[:, -1] < 10_000
    # expected share: 0.25 drawn from the head, plus the uniform draws that land there (0.75 * 0.1)
    assert abs(in_head.mean() - (0.25 + 0.75 * 0.1)) < 0.03
    assert (np.diff(rows, axis=1) == 1).all()  # each row is a contiguous window
    again = train_tiny.windows(stream, 4000, 66, np.random.default_rng(3), head=10_000, head_frac=0.25)
    assert np.array_equal(rows, again)
    plain = train_tiny.windows(stream, 4000, 66, np.random.default_rng(3))
    assert abs((plain[:, -1] < 10_000).mean() - 0.1) < 0.03


def test_minutes_scale_the_three_phases_together(load_tool):
    """--minutes: after SIZE_AT timed steps the main, copy and edit phases grow or shrink by one factor, so the
    run fills the time left; the warm-up and everything else in the recipe stay as they are."""
    train_tiny = load_tool("train_tiny")
    r = train_tiny.PRESETS["gpu"]["target"]
    sized = train_tiny.sized(r, seconds_left=300.0, step_s=0.15)
    assert sized.total_steps == pytest.approx(train_tiny.SIZE_AT + 2000, abs=3)
    assert sized.steps / sized.total_steps == pytest.approx(r.steps / r.total_steps, abs=0.01)
    assert sized.copy_steps / sized.edit_steps == pytest.approx(r.copy_steps / r.edit_steps, abs=0.02)
    assert (sized.warmup, sized.lr, sized.arch, sized.stdlib_frac) == (r.warmup, r.lr, r.arch, r.stdlib_frac)
    assert train_tiny.sized(r, seconds_left=0.0, step_s=1.0).steps > train_tiny.SIZE_AT  # never shorter than done


@pytest.mark.parametrize("dedup", [False, True])
def test_dedup_cleans_the_training_texts_and_leaves_the_held_out_ones(tmp_path, load_tool, dedup):
    """--dedup (the gpu preset's default): prepare_corpus passes the training texts through tools/corpus_dedup.py
    and says so in the corpus description (tokens.npz, the GGUF's training.corpus); the held-out files are
    encoded as they are, so the held-out loss measures the same text as before."""
    import argparse

    pytest.importorskip("tokenizers")
    train_tiny = load_tool("train_tiny")
    src = tmp_path / "src"
    src.mkdir()
    header = "# Copyright 2024 Someone. All rights reserved.\n# Licensed under the MIT license.\n\n"
    for i in range(60):
        (src / f"m{i:02d}.py").write_text(header + f"def f{i}(x):\n    return x + {i}\n")
    args = argparse.Namespace(corpus=src, max_files=None, packages="", dedup=dedup)
    train_ids, held_ids, corpus, tok, stdlib_tokens = train_tiny.prepare_corpus(
        args, {"vocab": 260}, tmp_path / "tokenizer", tmp_path / "tokens.npz")
    assert ("deduplicated" in corpus) == dedup and str(np.load(tmp_path / "tokens.npz")["corpus"]) == corpus
    assert stdlib_tokens == train_ids.size  # no packages: the whole stream is the head
    assert ("Copyright" in tok.decode(train_ids.tolist())) != dedup
    assert "Copyright" in tok.decode(held_ids.tolist())


def test_init_from_gguf_inverts_the_conversion(trained, tmp_path, load_tool):
    """--init: the exported HF weights -> tinyspec.convert (F32) -> init_from_gguf into a freshly built model gives
    the weights back (to float32 rounding of 1 + w and -exp(A_log)), the tiled value heads and the MTP block
    included, so a shipped file can be trained further when its float checkpoint is gone."""
    torch = pytest.importorskip("torch")
    from safetensors.numpy import load_file

    from tinyspec.convert import convert

    train_tiny = load_tool("train_tiny")
    hf = trained[0] / "target" / "hf"
    convert(hf, tmp_path / "f32.gguf", "f32")
    torch.manual_seed(123)  # other random weights than the trained ones
    recipe = train_tiny.PRESETS["smoke"]["target"]
    model, mtp = train_tiny.build(torch, recipe.arch, 512, 511)
    n = train_tiny.init_from_gguf(torch, model, mtp, tmp_path / "f32.gguf")
    (path,) = hf.glob("model*.safetensors")
    want = load_file(path)
    got = {k: v.numpy() for k, v in model.state_dict().items()} | {f"mtp.{k}": v.numpy() for k, v in mtp.state_dict().items()}
    assert n == len(want) and any(k.startswith("mtp.") for k in want)
    for k, w in want.items():
        np.testing.assert_allclose(got[k], w, rtol=1e-6, atol=1e-6, err_msg=k)
    draft, _ = train_tiny.build(torch, train_tiny.PRESETS["smoke"]["draft"].arch, 512, 511)
    with pytest.raises(SystemExit, match="not a file of this preset's shape|values"):
        train_tiny.init_from_gguf(torch, draft, None, tmp_path / "f32.gguf")  # the target's file into the draft


def model_weights(model, mtp) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in model.state_dict().items()} | (
        {f"mtp.{k}": v.numpy() for k, v in mtp.state_dict().items()} if mtp is not None else {})


def test_the_residual_file_gives_the_float_weights_back(trained, load_tool):
    """Export writes tiny-NAME.residual.gguf beside the Q8_0 file (tools/gguf_residual.py): r = w - dequant(Q8_0(w))
    for every quantized tensor, itself in Q8_0 (times 2^16, so its fp16 scales stay normal). A Q8_0 block keeps
    each of its 32 values within c d of w, d = max|w| / 127 its scale and c = 1/2 + 127 * 2^-11 (the code's rounding
    plus fp16's rounding of d times the largest code); the residual's blocks are the same 32 values, so with it
    the error is within c max|r| / 127: c / 127 ~ 1/226 of the main file's own largest error, and at most
    c^2 max|w| / 127^2 ~ 2e-5 max|w|. Checked per tensor against the float checkpoint (ckpt.pt), the float32
    rounding of the sum (2^-24 |w|) as slack. On the smoke run: largest error ~4e-4 from the main file alone,
    ~1.5e-6 with the residual. F32 tensors (norms, ssm_a, conv) are exact in the main file and not repeated."""
    torch = pytest.importorskip("torch")
    from tinyspec.convert import gguf_name

    train_tiny, gguf_residual = load_tool("train_tiny"), load_tool("gguf_residual")
    out = trained[0]
    main = out / "tiny-target.gguf"
    state = torch.load(out / "target" / "ckpt.pt", weights_only=False)  # the float weights at the last step
    want = {k: v.numpy() for k, v in state["model"].items()} | {f"mtp.{k}": v.numpy() for k, v in state["mtp"].items()}
    arch = train_tiny.PRESETS["smoke"]["target"].arch

    def loaded(residual):
        torch.manual_seed(123)  # other random weights than the trained ones
        model, mtp = train_tiny.build(torch, arch, 512, 511)
        train_tiny.init_from_gguf(torch, model, mtp, main, residual)
        return model_weights(model, mtp)

    alone, both = loaded(None), loaded(gguf_residual.residual_path(main))
    with read_gguf(main) as g, read_gguf(gguf_residual.residual_path(main)) as res:
        types = {name: t.ggml_type.name for name, t in g.tensors.items()}
        assert set(res.tensors) == {name for name, kind in types.items() if kind != "F32"}
    c = gguf_residual.C
    quantized = 0
    for k, w in want.items():
        if k == "lm_head.weight":
            continue  # tied: the embedding's tensor, checked as token_embd
        w = w.astype(np.float64)
        r, e = w - alone[k], w - both[k]  # the main file's rounding, and what is left of it
        slack = 2.0**-24 * np.abs(w) + 1e-10  # the sum's float32 rounding; a subnormal residual scale's rounding
        if types[gguf_name(k, arch.layers)] == "F32":
            assert np.array_equal(alone[k], both[k]), k
            np.testing.assert_allclose(both[k], w, rtol=1e-6, atol=1e-6, err_msg=k)
            continue
        quantized += 1
        assert np.abs(r).max() <= c * np.abs(w).max() / 127 + slack.max(), k
        assert (np.abs(e) <= c * np.abs(r).max() / 127 + slack).all(), (k, np.abs(e).max(), np.abs(r).max())
        assert (np.abs(e) <= c**2 * np.abs(w).max() / 127**2 + slack).all(), k
    assert quantized >= 20  # the projections, the embedding and the MTP block's


def test_a_residual_of_other_weights_is_refused(trained, load_tool):
    """The residual corrects the main file's exact bytes: its `residual.main_sha256` must be the digest of that
    file's tensors, so the draft's residual (or a model file) cannot be added to the target's weights."""
    torch = pytest.importorskip("torch")
    train_tiny = load_tool("train_tiny")
    out = trained[0]
    model, mtp = train_tiny.build(torch, train_tiny.PRESETS["smoke"]["target"].arch, 512, 511)
    with pytest.raises(SystemExit, match="written for other weights"):
        train_tiny.init_from_gguf(torch, model, mtp, out / "tiny-target.gguf", out / "tiny-draft.residual.gguf")
    with pytest.raises(SystemExit, match="not a residual file"):
        train_tiny.init_from_gguf(torch, model, mtp, out / "tiny-target.gguf", out / "tiny-draft.gguf")


def test_init_takes_the_residual_beside_the_file(trained, tmp_path):
    """`--init tiny-target.gguf` finds tiny-target.residual.gguf beside it, says so, and records it in
    training.recipe; a next run then starts from the float weights (--moment-passes: AdamW's moments rebuilt)."""
    out = trained[0]
    (tmp_path / "tokenizer").mkdir()
    for f in ("tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json", "tokens.npz"):
        (tmp_path / f).write_bytes((out / f).read_bytes())
    cmd = [sys.executable, str(REPO / "tools" / "train_tiny.py"), "target", "--preset", "smoke", "--out", str(tmp_path),
           "--threads", "1", "--steps", "2", "--init", str(out / "tiny-target.gguf"), "--moment-passes", "2"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"+ its residual {out / 'tiny-target.residual.gguf'}" in done.stderr
    assert "AdamW's moments rebuilt from 2 gradient passes at learning rate 0" in done.stderr
    with read_gguf(tmp_path / "tiny-target.gguf") as g:
        recipe = json.loads(g.metadata["training.recipe"])
    assert recipe["init"] == "tiny-target.gguf" and recipe["init_residual"] == "tiny-target.residual.gguf"
    assert recipe["moment_passes"] == 2
    assert (tmp_path / "tiny-target.residual.gguf").is_file()  # and the run leaves its own for the next


def test_moments_are_rebuilt_without_moving_a_weight(trained, tmp_path, load_tool):
    """--init weights come without AdamW's moments; moment_passes gradient passes at learning rate 0 rebuild them
    (AdamW's step count says how many) and leave every weight exactly as loaded: lr 0 is no update and no weight
    decay. The checkpoint then holds the moments, so a resume goes on as any run does."""
    torch = pytest.importorskip("torch")
    train_tiny = load_tool("train_tiny")
    out = trained[0]
    ids = np.load(out / "tokens.npz")
    recipe = train_tiny.PRESETS["smoke"]["target"]
    stopped = train_tiny.train("target", recipe, 512, 511, ids["train"], ids["held"], tmp_path, 0, "cpu", 100,
                               stop_after=0, init=out / "tiny-target.gguf", moment_passes=3)
    assert stopped is None  # stopped before the first step, its checkpoint written
    state = torch.load(tmp_path / "target" / "ckpt.pt", weights_only=False)
    model, mtp = train_tiny.build(torch, recipe.arch, 512, 511)
    train_tiny.init_from_gguf(torch, model, mtp, out / "tiny-target.gguf", out / "tiny-target.residual.gguf")
    want = model_weights(model, mtp)
    got = {k: v.numpy() for k, v in state["model"].items()} | {f"mtp.{k}": v.numpy() for k, v in state["mtp"].items()}
    for k, w in want.items():
        assert np.array_equal(got[k], w), k
    moments = state["opt"]["state"].values()
    assert len(moments) == len(list(model.parameters()) + list(mtp.parameters()))  # every parameter (lm_head is tied)
    assert {float(m["step"]) for m in moments} == {3.0} and state["step"] == 0
    assert all(float(m["exp_avg_sq"].abs().sum()) > 0 for m in moments)


def test_gpu_session_without_a_corpus_says_how_to_make_one(tmp_path):
    """The training call of a lent GPU (tools/gpu_session.sh) stops at once, before any device time is spent on
    imports, when the corpus it trains from was not carried, and names the command that prepares it."""
    env = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out"), "TRAIN_DIR": str(tmp_path / "none"),
           "LOGS": str(tmp_path / "logs"), "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(REPO / "tools" / "gpu_session.sh")], check=False, capture_output=True,
                          text=True, env=env,
                          timeout=60)
    assert done.returncode == 2, done.stderr
    assert "no corpus in" in done.stderr and "--tokenizer-from tinyspec/assets/tiny-target.gguf" in done.stderr


def test_tokenizer_from_gguf_encodes_as_the_shipped_model_does(load_tool, tmp_path):
    """--tokenizer-from: the BPE rebuilt from the shipped GGUF's tokens and merges gives tinyspec's token ids on real
    Python (a slice of the standard library and of tinyspec itself) and decodes back to the text, so a corpus encoded
    with it continues the shipped model; written into an --out folder, it is reused, and another folder's tokenizer
    is refused rather than mixed."""
    pytest.importorskip("tokenizers")
    import sysconfig

    from tinyspec.demo import TARGET

    if not TARGET.is_file():
        pytest.skip("the shipped models are not built yet")
    tool = load_tool("train_tiny")
    tok = tool.tokenizer_from_gguf(TARGET)
    with read_gguf(TARGET) as g:
        ours = Tokenizer.from_gguf(g.metadata)
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:40] + sorted((REPO / "tinyspec").glob("*.py"))
    texts = [p.read_text(encoding="utf-8") for p in files] + ["x = 'Grüße, 世界' + \"\\t\\r\\n\" <|endoftext|>"]
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False).ids
        assert ids == ours.encode(text), text[:80]
        assert tok.decode(ids, skip_special_tokens=False) == text
    pytest.importorskip("torch")
    other = tmp_path / "other"  # a folder whose tokenizer was trained on something else
    tool.train_tokenizer(texts[:5], 300, other / "tokenizer")
    with pytest.raises(SystemExit, match="holds another tokenizer"):
        tool.main(["corpus", "--preset", "smoke", "--out", str(other), "--tokenizer-from", str(TARGET)])
