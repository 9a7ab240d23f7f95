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


def test_help_lists_commands():
    run = subprocess.run([sys.executable, "-m", "tinyspec", "--help"], capture_output=True, text=True)
    assert run.returncode == 0 and "inspect" in run.stdout
