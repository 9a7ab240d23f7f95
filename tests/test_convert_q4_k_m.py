"""convert(..., "q4_k_m"): llama-quantize Q4_K_M's mix of types, read back by tinyspec and gguf-py alike.

CI part (needs torch + transformers, like tests/test_convert.py, whose checkpoints these are): a tiny checkpoint
whose rows are 256 wide where the hidden state is read (so Q4_K and Q6_K occur) and 64, 96 or 48 wide elsewhere
(so each fallback occurs: Q5_0, Q8_0, F16), converted to f32 and to q4_k_m:
    types      every tensor's type is the one llama-quant.cpp's rules give, written out by hand below
    gguf-py    reads the file, and dequantizes every tensor to tinyspec's float32 values bit for bit
    values     each tensor is the f32 file's, quantized by tinyspec.quants (ggml's reference quantizers)
    logits     tinyspec runs the file; its logits are as far from the f32 file's as those of the f32 model
               with every weight perturbed by Gaussian noise of its type's quantization error (see below)
llama.cpp part (@pytest.mark.llamacpp, needs $TINYSPEC_LLAMA_BUILD): llama.cpp's own llama_model_quantize, run
on the f32 file, writes the same tensors (types and bytes) and the same metadata.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from test_convert import Case, V, make_checkpoint

from tinyspec.convert import convert
from tinyspec.gguf import read_gguf, write_gguf
from tinyspec.quants import GGMLType, dequantize, quantize

Q4_K, Q5_0, Q6_K, Q8_0, F16, F32 = (GGMLType.Q4_K, GGMLType.Q5_0, GGMLType.Q6_K, GGMLType.Q8_0, GGMLType.F16,
                                    GGMLType.F32)
# hidden 256; ffn_down rows 96, ssm_out rows 64 (4 value heads x 16), attn_output rows 48 (3 heads x 16)
CASE = Case("q4_k_m-rows", hidden=256, ffn=96, heads=3, head_dim=16, rotary=0.5)
# Relative RMS error of each type on Gaussian rows (tests/test_quants_kquants.py, test_quants_legacy.py: measured)
TYPE_ERROR = {Q4_K: 0.0715, Q6_K: 0.0178, Q5_0: 0.0428, Q8_0: 0.00537, F16: 2.0**-12, F32: 0.0}


def expected_types(names) -> dict[str, GGMLType]:
    """CASE's types by llama-quant.cpp's Q4_K_M rules, by hand. 5 blocks (3 GDN, 1 attention, the MTP block):
    use_more_bits(i, 5) holds for i = 2 ((i - 0) % 3 == 2) and i = 4 (i >= 35 // 8), so blk.2's attn_qkv, blk.4's
    attn_v and both blocks' ffn_down are Q6_K before the fallbacks: ffn_down rows are 96 wide -> Q8_0 (the others'
    Q4_K -> Q5_0); ssm_out (64) Q4_K -> Q5_0; attn_output (48: no 32-value block fits) -> F16."""
    out = {}
    for name in names:
        kind = name.split(".")[2] if name.startswith("blk.") else name
        block = int(name.split(".")[1]) if name.startswith("blk.") else -1
        if name.endswith("norm.weight") or kind in ("ssm_conv1d", "ssm_a", "ssm_dt"):  # never quantized
            out[name] = F32
        elif name == "output.weight":
            out[name] = Q6_K  # untied: the output rule; token_embd keeps the base type
        elif kind in ("attn_qkv", "attn_v"):
            out[name] = Q6_K if block in (2, 4) else Q4_K
        elif kind == "ffn_down":
            out[name] = Q8_0 if block in (2, 4) else Q5_0
        elif kind == "ssm_out":
            out[name] = Q5_0
        elif kind == "attn_output":
            out[name] = F16
        else:  # token_embd, attn_gate, ssm_alpha, ssm_beta, attn_q, attn_k, ffn_gate, ffn_up, nextn.eh_proj
            out[name] = Q4_K
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("q4_k_m")
    _, hf_dir, _ = make_checkpoint(tmp, CASE)
    out = {t: tmp / f"{t}.gguf" for t in ("f32", "q4_k_m")}
    for outtype, path in out.items():
        convert(hf_dir, path, outtype)
    return out


def test_types_values_and_gguf_py(files):
    gguf = pytest.importorskip("gguf")
    f32, q = read_gguf(files["f32"]), read_gguf(files["q4_k_m"])
    assert q.metadata["general.file_type"] == 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    assert list(q.tensors) == list(f32.tensors)
    assert {n: t.ggml_type for n, t in q.tensors.items()} == expected_types(q.tensors)
    assert {t.ggml_type for t in q.tensors.values()} == {F32, F16, Q4_K, Q5_0, Q6_K, Q8_0}  # every path taken
    reader = gguf.GGUFReader(files["q4_k_m"])
    assert [t.name for t in reader.tensors] == list(q.tensors)
    for t in reader.tensors:
        info = q.tensors[t.name]
        assert t.tensor_type.name == info.ggml_type.name, t.name
        ours = dequantize(q.raw(t.name), info.ggml_type, info.shape)
        theirs = gguf.quants.dequantize(t.data, t.tensor_type).reshape(info.shape)
        assert np.array_equal(ours.view(np.uint32), theirs.astype(np.float32).view(np.uint32)), t.name
        x = dequantize(f32.raw(t.name), F32, info.shape)
        want = x if info.ggml_type == F32 else x.astype(np.float16) if info.ggml_type == F16 else \
            quantize(x, info.ggml_type)
        assert np.array_equal(q.raw(t.name), want.reshape(-1).view(np.uint8)), t.name


def test_logits_are_as_close_as_the_quantization_error_predicts(files, tmp_path):
    """Quantization error acts like noise: with each weight perturbed by Gaussian noise of its type's relative RMS
    error (TYPE_ERROR, times the tensor's RMS), the f32 model's logits move by a relative RMS of 0.585 here (this
    random model amplifies weight errors ~8x: Q8_0 weights move them by 0.056); the q4_k_m file's move by 0.554.
    A wrong layout, scale or tensor would move them by ~1.4 (unrelated logits)."""
    from tinyspec.model import Model

    f32, q = read_gguf(files["f32"]), read_gguf(files["q4_k_m"])
    rng = np.random.default_rng(0)
    noisy = {}
    for name, info in f32.tensors.items():
        x = dequantize(f32.raw(name), F32, info.shape)
        sigma = TYPE_ERROR[q.tensors[name].ggml_type] * np.sqrt(np.mean(x.astype(np.float64) ** 2))
        noisy[name] = (x + sigma * rng.standard_normal(x.shape)).astype(np.float32)
    write_gguf(tmp_path / "noisy.gguf", f32.fields, noisy)
    tokens = np.random.default_rng(1).integers(0, V, 64)

    def logits(path):
        model = Model.from_gguf(path)
        return model.forward(tokens, model.new_state())[0]

    ref = logits(files["f32"])

    def rel_error(path):
        return float(np.sqrt(np.mean((logits(path) - ref) ** 2) / np.mean(ref**2)))

    quantized, noise = rel_error(files["q4_k_m"]), rel_error(tmp_path / "noisy.gguf")
    assert noise / 2 < quantized < 1.5 * noise, f"q4_k_m {quantized:.3f} vs the noise model's {noise:.3f}"


# ---------------------------------------------------------------------------------------------- vs llama.cpp


class QuantizeParams(ctypes.Structure):
    """llama.h's llama_model_quantize_params (llama.cpp as vendored in llama-cpp-python 0.3.36)."""

    _fields_ = [("nthread", ctypes.c_int32), ("ftype", ctypes.c_int), ("output_tensor_type", ctypes.c_int),
                ("token_embedding_type", ctypes.c_int), ("allow_requantize", ctypes.c_bool),
                ("quantize_output_tensor", ctypes.c_bool), ("only_copy", ctypes.c_bool), ("pure", ctypes.c_bool),
                ("keep_split", ctypes.c_bool), ("dry_run", ctypes.c_bool), ("imatrix", ctypes.c_void_p),
                ("kv_overrides", ctypes.c_void_p), ("tt_overrides", ctypes.c_void_p),
                ("prune_layers", ctypes.c_void_p), ("max_buf_size", ctypes.c_size_t)]


def llama_quantize(build: Path, source: Path, target: Path) -> None:
    """llama.cpp's quantizer, Q4_K_M, from any source type (--allow-requantize: a Q8_0 file is dequantized first):
    bin/llama-quantize if the build has it, else libllama's llama_model_quantize."""
    if (build / "bin" / "llama-quantize").is_file():
        subprocess.run([build / "bin" / "llama-quantize", "--allow-requantize", source, target, "Q4_K_M", "1"],
                       check=True, capture_output=True, timeout=300)
        return
    lib = ctypes.CDLL(str(build / "bin" / "libllama.so"))
    lib.llama_model_quantize_default_params.restype = QuantizeParams
    lib.llama_model_quantize.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(QuantizeParams)]
    lib.llama_model_quantize.restype = ctypes.c_uint32
    params = lib.llama_model_quantize_default_params()
    params.ftype, params.nthread, params.allow_requantize = 15, 1, True
    assert lib.llama_model_quantize(str(source).encode(), str(target).encode(), ctypes.byref(params)) == 0


@pytest.mark.llamacpp
def test_same_tensors_as_llama_quantize(files, tmp_path):
    """llama.cpp quantizing tinyspec's f32 file to Q4_K_M == tinyspec's q4_k_m file: every tensor's type, shape
    and bytes (llama-quantize writes them sorted by layer; tinyspec keeps the converter's order), every metadata
    value. Measured: equal, for this case, a tied one, and qwen35moe with 4 and with 8 experts (the latter's own
    rules included), but for MoE's [1, D] ffn_gate_inp_shexp, which llama-quantize writes as [D]; and for the
    shipped Q8_0 target requantized (tools/requantize.py, docs/performance-log.md 2026-11-28)."""
    build = os.environ.get("TINYSPEC_LLAMA_BUILD")
    if not build or not any((Path(build) / "bin" / f).is_file() for f in ("llama-quantize", "libllama.so")):
        pytest.skip("set TINYSPEC_LLAMA_BUILD to a llama.cpp build with bin/llama-quantize or bin/libllama.so")
    llama_quantize(Path(build), files["f32"], tmp_path / "llama.gguf")
    ours, ref = read_gguf(files["q4_k_m"]), read_gguf(tmp_path / "llama.gguf")
    assert sorted(ours.tensors) == sorted(ref.tensors)
    for name, t in ref.tensors.items():
        assert (ours.tensors[name].ggml_type, ours.tensors[name].shape) == (t.ggml_type, t.shape), name
        assert np.array_equal(ours.raw(name), ref.raw(name)), f"{name}: {t.ggml_type.name} bytes differ"
    assert set(ours.fields) == set(ref.fields)
    assert all(ours.fields[k] == f for k, f in ref.fields.items())
