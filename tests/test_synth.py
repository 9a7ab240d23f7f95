"""tinyspec.fast.synth: random-weight qwen35 / qwen35moe files at the published shapes, typed as llama-quantize types them.

Small files (a few layers, and a 512-token vocabulary where the real 248320 is not the point) are
read back by tinyspec and gguf-py, loaded by Model.from_gguf and run; one file has the real vocabulary
and is made through the CLI. MoE files keep 8 of the 256 experts (n_expert, tests only). The type rules are pinned to llama.cpp's own snapshot for Qwen3.5-27B and
to what llama-quantize chose for a full-depth 0.8B file (the llamacpp-marked test re-measures that).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tinyspec.__main__ import build_parser, main
from tinyspec.config import ModelConfig
from tinyspec.gguf import read_gguf
from tinyspec.model import Model
from tinyspec.mtp import MTPHead, shift_hidden
from tinyspec.quants import GGMLType, dequantize
from tinyspec.fast.synth import QUANTS, SHAPES, plan, synth_model
from tinyspec.tokenizer import Tokenizer

Q4_K, Q6_K, Q8_0, F32 = GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.Q8_0, GGMLType.F32
SMALL = dict(n_vocab=512)
CASES = {  # name -> (shape, quant, trunk layers): both quants, a tied and an untied shape, the MoE shape
    "0.8b-q8_0": ("0.8b", "q8_0", 4),
    "0.8b-q4_k_m": ("0.8b", "q4_k_m", 4),
    "9b-q4_k_m": ("9b", "q4_k_m", 1),
    "35b-a3b-q4_k_m": ("35b-a3b", "q4_k_m", 4),
}


def small(shape: str) -> dict:
    return SMALL | ({"n_expert": 8} if "num_experts" in SHAPES[shape] else {})

# llama.cpp tests/snapshots/qwen3.6-27b.schema, section [Q4_K_M] ("Qwen3.5-27B", 64 layers, no MTP block):
# the blocks whose attn_qkv / attn_v and ffn_down are Q6_K; everything else but output.weight is Q4_K.
BUMPED_27B = [*range(0, 8), *range(10, 56, 3), *range(56, 64)]
# llama-quantize --dry-run --allow-requantize <synth 0.8b q8_0 file> Q4_K_M (25 blocks with MTP), measured here
BUMPED_08B = [0, 1, 2, 5, 8, 11, 14, 17, 20, 21, 22, 23, 24]
# llama-quantize --dry-run --allow-requantize <synth 35b-a3b q8_0 file, 8 layers + MTP, n_vocab 512> Q4_K_M, measured
# here: Q6_K attn_qkv / attn_v and ffn_down_exps (and ffn_down_shexp) in these blocks; all 169 types equal plan()'s
BUMPED_MOE_8 = [0, 3, 6, 7, 8]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("synth")
    out = {}
    for name, (shape, quant, layers) in CASES.items():
        out[name] = folder / f"{name}.gguf"
        synth_model(out[name], shape, quant, seed=0, n_layers=layers, **small(shape))
    return out


def bumped_blocks(specs, kinds=("attn_qkv.weight", "attn_v.weight", "ffn_down.weight", "ffn_down_exps.weight",
                                 "ffn_down_shexp.weight")) -> dict[str, list[int]]:
    """Q6_K tensors of each kind -> their block numbers."""
    out = {k: [] for k in kinds}
    for s in specs:
        for k in kinds:
            if s.name.startswith("blk.") and s.name.endswith(k) and s.ggml_type == Q6_K:
                out[k].append(int(s.name.split(".")[1]))
    return out


def test_27b_q4_k_m_types_match_llama_cpp_snapshot():
    specs = plan("27b", "q4_k_m")
    bumped = bumped_blocks(specs)
    assert bumped["ffn_down.weight"] == BUMPED_27B + [64]  # + the MTP block: 7 * 65 // 8 = 56 as for 64
    assert sorted(bumped["attn_qkv.weight"] + bumped["attn_v.weight"]) == BUMPED_27B + [64]
    assert bumped["attn_v.weight"] == [i for i in BUMPED_27B + [64] if i % 4 == 3 or i == 64]  # attention blocks
    types = {s.name: s.ggml_type for s in specs}
    assert types["output.weight"] == Q6_K and types["token_embd.weight"] == Q4_K  # untied embedding: base type
    quantized = [s for s in specs if s.ggml_type != F32]
    assert {s.ggml_type for s in quantized} == {Q4_K, Q6_K} and len(quantized) == 2 + 48 * 8 + 16 * 7 + 8
    assert sum(s.ggml_type == Q6_K for s in specs) == 65 + 2  # the snapshot's 65 + MTP attn_v and ffn_down


def test_08b_q4_k_m_types_match_llama_quantize():
    specs = plan("0.8b", "q4_k_m")
    bumped = bumped_blocks(specs)
    assert bumped["ffn_down.weight"] == BUMPED_08B
    assert sorted(bumped["attn_qkv.weight"] + bumped["attn_v.weight"]) == BUMPED_08B
    types = {s.name: s.ggml_type for s in specs}
    assert "output.weight" not in types and types["token_embd.weight"] == Q6_K  # tied: takes the output's type
    assert {s.ggml_type for s in specs} == {F32, Q4_K, Q6_K}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_q8_0_and_f32_rules(shape):
    for s in plan(shape, "q8_0"):
        small = (len(s.shape) == 1 or s.name.endswith("_norm.weight") or "ssm_conv1d" in s.name or s.name.endswith("ssm_a")
                 or "ffn_gate_inp" in s.name)  # the MoE routers: never quantized
        assert s.ggml_type == (F32 if small else Q8_0), s.name
        assert s.ggml_type != F32 or s.init != "weight"


def test_shape_table():
    """The published shapes (sources in synth.py's table): sizes in parameters, with the MTP block."""
    billions = {shape: sum(int(np.prod(s.shape)) for s in plan(shape, "q8_0")) / 1e9 for shape in SHAPES}
    assert 0.7 < billions["0.8b"] < 0.9 and 1.8 < billions["2b"] < 2.4
    assert 8.5 < billions["9b"] < 10 and 26 < billions["27b"] < 28.5
    assert 35 < billions["35b-a3b"] < 36  # 34.7 B + the MTP block's 0.84 B
    active = sum(int(np.prod(s.shape)) * (8 / 256 if "_exps." in s.name else 1) for s in plan("35b-a3b", "q8_0", 40)
                 if s.name.startswith("blk.") and not s.name.startswith("blk.40."))
    assert 2.3 < active / 1e9 < 2.6  # 2.44 B a token in the blocks + output's 0.51 B: "A3B"
    for shape in SHAPES:  # every row length is a multiple of 256: no llama-quantize fallback types
        assert all(s.shape[-1] % 256 == 0 for s in plan(shape, "q4_k_m", 4) if s.init == "weight")
    for shape in SHAPES:  # the CLI's choices are the table's
        for quant in QUANTS:
            args = build_parser().parse_args(["synth", "--shape", shape, "--quant", quant, "-o", "x.gguf"])
            assert (args.shape, args.quant, args.seed, args.layers) == (shape, quant, 0, None)


@pytest.mark.parametrize("case", list(CASES))
def test_file_reads_back(files, case):
    shape, quant, layers = CASES[case]
    specs = plan(shape, quant, layers, **small(shape))
    with read_gguf(files[case]) as g:
        assert [(t.name, t.ggml_type, t.shape) for t in g.tensors.values()] == [(s.name, s.ggml_type, s.shape) for s in specs]
        meta = g.metadata
        cfg = ModelConfig.from_gguf(meta)
    arch = SHAPES[shape].get("gguf_arch", "qwen35")
    assert meta["general.architecture"] == arch and meta["general.file_type"] == QUANTS[quant]
    assert meta[f"{arch}.block_count"] == layers + 1 and meta[f"{arch}.nextn_predict_layers"] == 1
    assert meta[f"{arch}.embedding_length"] == SHAPES[shape]["hidden_size"] and len(meta["tokenizer.ggml.tokens"]) == 512
    assert cfg.n_trunk == layers and cfg.recurrent == tuple((i + 1) % 4 != 0 for i in range(layers))
    assert cfg.n_rot == 64 and cfg.rope_base == 1e7 and cfg.head_dim == 256
    gguf = pytest.importorskip("gguf")
    reader = gguf.GGUFReader(files[case])
    assert [(t.name, int(t.tensor_type), tuple(int(n) for n in reversed(t.shape))) for t in reader.tensors] == \
        [(s.name, int(s.ggml_type), s.shape) for s in specs]
    pre = reader.fields["tokenizer.ggml.pre"]
    assert bytes(pre.parts[pre.data[0]]).decode() == "qwen35"


def test_35b_a3b_q4_k_m_types_match_llama_quantize():
    """The MoE rules (synth.py's docstring): routers F32, experts typed per expert as 2-D weights, ffn_down_exps and
    ffn_down_shexp bumped by block, as llama-quantize chose for an 8-layer file (BUMPED_MOE_8); then the full depth."""
    specs = plan("35b-a3b", "q4_k_m", 8, n_vocab=512)
    bumped = bumped_blocks(specs)
    assert bumped["ffn_down_exps.weight"] == bumped["ffn_down_shexp.weight"] == BUMPED_MOE_8 and not bumped["ffn_down.weight"]
    assert sorted(bumped["attn_qkv.weight"] + bumped["attn_v.weight"]) == BUMPED_MOE_8
    types = {s.name: s.ggml_type for s in specs}
    assert all(types[f"blk.{i}.{n}"] == F32 for i in range(9) for n in ("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight"))
    assert all(types[f"blk.{i}.{n}"] == Q4_K for i in range(9) for n in ("ffn_gate_exps.weight", "ffn_up_exps.weight",
                                                                         "ffn_gate_shexp.weight", "ffn_up_shexp.weight"))
    full = plan("35b-a3b", "q4_k_m")  # 40 layers + MTP: the 27b-style schedule over 41 blocks
    want = [i for i in range(41) if i < 5 or i >= 35 or (i - 5) % 3 == 2]
    assert bumped_blocks(full)["ffn_down_exps.weight"] == want
    assert sum(s.nbytes for s in full) / 1e9 == pytest.approx(21.7, abs=0.05)  # the Q4_K_M files of the real model: ~21-22 GB


@pytest.mark.parametrize("case", ["0.8b-q8_0", "0.8b-q4_k_m", "35b-a3b-q4_k_m"])
def test_model_runs_with_finite_spread_logits(files, case):
    model = Model.from_gguf(files[case])
    tokens = Tokenizer.from_gguf(model.metadata).encode("Hello, world")
    assert tokens == list(b"Hello, world")  # 256 byte tokens, no merges
    logits, hidden = model.forward(np.array(tokens), model.new_state())
    assert logits.shape == (len(tokens), 512) and np.isfinite(logits).all()
    assert 0.5 < logits.std(axis=1).min() and logits.std(axis=1).max() < 2  # weights keep activations O(1)
    assert len(set(logits.argmax(axis=1).tolist())) > 1
    head = MTPHead(model)
    mtp_logits, _ = head.forward(np.array(tokens), shift_hidden(hidden), head.new_cache())
    assert np.isfinite(mtp_logits).all() and 0.5 < mtp_logits.std() < 2


def test_weight_statistics(files):
    """Every quantized weight dequantizes to mean ~0 and rms ~1/sqrt(row length), whatever its type."""
    with read_gguf(files["0.8b-q4_k_m"]) as g:
        for name in ("token_embd.weight", "blk.0.attn_qkv.weight", "blk.0.ffn_down.weight", "blk.2.ffn_down.weight",
                     "blk.3.attn_q.weight"):
            t = g.tensors[name]
            w = dequantize(g.raw(name), t.ggml_type, t.shape) * np.sqrt(t.shape[-1])
            assert abs(w.mean()) < 0.05 and 0.9 < w.std() < 1.1, (name, t.ggml_type.name, w.mean(), w.std())
        a = dequantize(g.raw("blk.0.ssm_a"), F32, g.tensors["blk.0.ssm_a"].shape)
        assert (a < 0).all()  # decays exp(a * softplus(.)) in (0, 1)


def test_deterministic(tmp_path):
    paths = [tmp_path / f"{i}.gguf" for i in range(4)]
    synth_model(paths[0], "0.8b", "q4_k_m", seed=7, n_layers=1, n_vocab=300)
    synth_model(paths[1], "0.8b", "q4_k_m", seed=7, n_layers=1, n_vocab=300)
    synth_model(paths[2], "0.8b", "q4_k_m", seed=8, n_layers=1, n_vocab=300)
    synth_model(paths[3], "0.8b", "q4_k_m", seed=7, n_layers=2, n_vocab=300)
    assert paths[0].read_bytes() == paths[1].read_bytes()
    with read_gguf(paths[0]) as a, read_gguf(paths[2]) as b, read_gguf(paths[3]) as deeper:
        assert not np.array_equal(a.raw("blk.0.ffn_up.weight"), b.raw("blk.0.ffn_up.weight"))
        assert np.array_equal(a.raw("blk.0.ffn_up.weight"), deeper.raw("blk.0.ffn_up.weight"))  # seeded by name


def test_cli_writes_real_vocabulary_file(tmp_path, capsys):
    out = tmp_path / "real.gguf"
    assert main(["synth", "--shape", "0.8b", "--quant", "q4_k_m", "--layers", "1", "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert f"wrote {out}" in captured.out
    assert "[1/31] output_norm.weight" in captured.err and "MB written" in captured.err
    with read_gguf(out) as g:
        assert g.tensors["token_embd.weight"].shape == (248320, 1024)
        assert g.tensors["token_embd.weight"].ggml_type == Q6_K
        tok = Tokenizer.from_gguf(g.metadata)
        cfg = ModelConfig.from_gguf(g.metadata)
    assert cfg.n_vocab == 248320 and tok.n_vocab == 248320
    assert tok.encode("hi<|im_end|>") == [104, 105, 258] and 258 in tok.eog_ids
    assert tok.decode([104, 105, 300]) == "hi"  # [PAD] fillers decode to nothing


def test_cli_errors(tmp_path, capsys, monkeypatch):
    target = tmp_path / "x.gguf"
    for argv, message in [
        (["--layers", "0"], "layer count must be a positive integer"),
        (["--seed", "-1"], "seed must be an integer >= 0"),
        (["-o", str(tmp_path / "missing" / "x.gguf")], "folder"),
    ]:
        assert main(["synth", "--shape", "0.8b", "--quant", "q8_0", "-o", str(target), *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("tinyspec synth: error:") and message in err and err.count("\n") == 1
    monkeypatch.setattr("shutil.disk_usage", lambda path: SimpleNamespace(total=10**12, used=10**12 - 10**9, free=10**9))
    assert main(["synth", "--shape", "27b", "--quant", "q4_k_m", "-o", str(target)]) == 2
    err = capsys.readouterr().err
    assert "not enough disk space" in err and "16.8" in err and err.count("\n") == 1
    assert not target.exists()
    with pytest.raises(SystemExit) as e:
        main(["synth", "--shape", "70b", "--quant", "q8_0", "-o", str(target)])
    assert e.value.code == 2


def test_api_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown shape"):
        synth_model(tmp_path / "x.gguf", "4b", "q8_0")
    with pytest.raises(ValueError, match="unknown quant"):
        synth_model(tmp_path / "x.gguf", "0.8b", "q4_0")
    with pytest.raises(ValueError, match="n_vocab"):
        synth_model(tmp_path / "x.gguf", "0.8b", "q8_0", n_vocab=100)


@pytest.mark.llamacpp
def test_llama_cpp_agrees_and_runs(tmp_path):
    """llama-quantize --dry-run from a synth Q8_0 file (dense, and MoE) picks exactly our Q4_K_M types (its own
    rules, run on our file), and llama-imatrix runs the file (loads it, tokenizes, finite perplexity)."""
    build = os.environ.get("TINYSPEC_LLAMA_BUILD")
    if not build or not (Path(build) / "bin" / "llama-quantize").is_file():
        pytest.skip("set TINYSPEC_LLAMA_BUILD to a llama.cpp build with bin/llama-quantize and bin/llama-imatrix")
    source = tmp_path / "q8.gguf"
    synth_model(source, "0.8b", "q8_0", n_layers=8, n_vocab=512)
    run = subprocess.run([Path(build) / "bin" / "llama-quantize", "--dry-run", "--allow-requantize", source, "Q4_K_M", "2"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    chosen = {}
    for line in (run.stdout + run.stderr).splitlines():
        if m := re.match(r"\[\s*\d+/\s*\d+\]\s+(\S+)\s+- .*type =\s+(\w+),.*?(?:\((\w+)\))?\s*$", line):
            chosen[m[1]] = (m[3] or m[2]).upper()
    assert chosen == {s.name: s.ggml_type.name for s in plan("0.8b", "q4_k_m", 8, n_vocab=512)}
    moe = tmp_path / "moe-q8.gguf"  # 16 experts: llama-quant.cpp has rules of its own for exactly 8
    synth_model(moe, "35b-a3b", "q8_0", n_layers=8, n_vocab=512, n_expert=16)
    run = subprocess.run([Path(build) / "bin" / "llama-quantize", "--dry-run", "--allow-requantize", moe, "Q4_K_M", "2"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    chosen = {m[1]: (m[3] or m[2]).upper() for line in (run.stdout + run.stderr).splitlines()
              if (m := re.match(r"\[\s*\d+/\s*\d+\]\s+(\S+)\s+- .*type =\s+(\w+),.*?(?:\((\w+)\))?\s*$", line))}
    assert chosen == {s.name: s.ggml_type.name for s in plan("35b-a3b", "q4_k_m", 8, n_vocab=512, n_expert=16)}
    text = tmp_path / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 40)
    run = subprocess.run([Path(build) / "bin" / "llama-imatrix", "-m", source, "-f", text, "-o", tmp_path / "im.gguf",
                          "-c", "128", "-b", "128", "--chunks", "2", "-t", "2", "--no-repack"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    ppl = float(re.search(r"Final estimate: PPL = ([0-9.]+)", run.stdout + run.stderr)[1])
    assert np.isfinite(ppl) and ppl > 1
