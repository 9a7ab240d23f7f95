"""tinyspec's logits equal llama.cpp's own runtime on the same GGUF (not just its file format).

tools/llamacpp_logits.cpp is built against a static CMake build of a llama.cpp tree
($TINYSPEC_LLAMA_CPP = the source tree, $TINYSPEC_LLAMA_BUILD = its build dir with src/libllama.a and
ggml/src/libggml*.a) and decodes a 32-token prompt in one batch with an F32 KV cache, no flash attention,
no repacked/AMX weights and no MTP layers; tinyspec runs `Model.forward` on the same tokens. Trunk logits
of every position are compared. The files come from $TINYSPEC_LLAMACPP_FILES (default .cache/llamacpp,
made by tools/make_llamacpp_fixtures.py). Skipped unless all of that is present (CI has none of it).

Measured (llama_cpp_python 0.3.36's vendored llama.cpp, x86-64 CPU, prompt = 32 ids drawn with seed 0):
    qwen35-tiny-F32.gguf     max|diff| 3.4e-6, logit scale 1.96 (rel 1.7e-6), argmax 32/32
    qwen35-tiny-F16.gguf     max|diff| 3.6e-3 (rel 1.8e-3), argmax 32/32   (F16 weights: ggml rounds
                             the activations to F16 before each matmul)
    qwen35-tiny-Q8_0-py.gguf max|diff| 0.094  (rel 4.7e-2), argmax 30/32   (quantized weights: ggml
    qwen35-tiny-Q4_K_M.gguf  max|diff| 0.131  (rel 6.5e-2), argmax 30/32    quantizes activations to Q8)
The tiny random model's logits are nearly flat (scale ~2 over 248k entries), so top-1 gaps are small
and a few argmax flips under Q8 activations are expected; those files are reported, loosely bounded.

The cpu backend rounds activations to Q8_K (K-quant weights) and Q8_0 (Q8_0 weights) as ggml does and lands
2-10x closer (test_cpu_backend_rounds_activations_like_llamacpp; docs/performance-log.md old 30 has prompt
seeds 0-4 (LESSONS 9)).

F32 tolerance: 1e-4 x max(1, logit scale), ~30x the measured difference and still 1e-4 relative:
with F32 weights and an F32 KV cache the only differences are summation order and libm vs NumPy
transcendental rounding, so anything above that would be a real semantic mismatch.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
FOLDER = Path(os.environ.get("TINYSPEC_LLAMACPP_FILES") or REPO / ".cache" / "llamacpp")
TREE = os.environ.get("TINYSPEC_LLAMA_CPP")
BUILD = os.environ.get("TINYSPEC_LLAMA_BUILD")
F32 = FOLDER / "qwen35-tiny-F32.gguf"
QUANTIZED = ["qwen35-tiny-Q8_0-py.gguf", "qwen35-tiny-Q4_K_M.gguf"]
N_TOKENS = 32

pytestmark = pytest.mark.llamacpp


def _tool():
    spec = importlib.util.spec_from_file_location("compare_llamacpp_logits",
                                                  REPO / "tools" / "compare_llamacpp_logits.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """(the compare tool, the harness executable) built against $TINYSPEC_LLAMA_CPP / $TINYSPEC_LLAMA_BUILD."""
    if not (TREE and BUILD):
        pytest.skip("set TINYSPEC_LLAMA_CPP (llama.cpp tree) and TINYSPEC_LLAMA_BUILD (its static CMake build)")
    tool = _tool()
    try:
        exe = tool.build_harness(TREE, BUILD, tmp_path_factory.mktemp("llamacpp_harness"))
    except (OSError, RuntimeError) as e:
        pytest.skip(f"cannot build the llama.cpp harness: {e}")
    return tool, exe


@pytest.fixture(scope="module")
def harness(llama):
    if not F32.is_file():
        pytest.skip(f"no {F32}: make it with `python tools/make_llamacpp_fixtures.py --llama-cpp DIR`")
    return llama


def _compare(tool, exe, path: Path, backend: str = "numpy") -> dict:
    n_vocab = tool.llamacpp_logits(exe, path, [0]).shape[1]
    tokens = tool.default_tokens(n_vocab, N_TOKENS, seed=0)
    return tool.compare(tool.llamacpp_logits(exe, path, tokens), tool.tinyspec_logits(path, tokens, backend))


def test_f32_logits_match_llamacpp_runtime(harness):
    tool, exe = harness
    r = _compare(tool, exe, F32)
    print(f"\n{F32.name}: max|diff|={r['max_abs_diff']:.3g} scale={r['logit_scale']:.3g} "
          f"argmax {r['argmax_agree']}/{r['tokens']}")
    assert r["tokens"] == N_TOKENS
    assert r["max_abs_diff"] <= 1e-4 * max(1.0, r["logit_scale"]), r["max_abs_diff_per_position"]
    assert r["argmax_mismatch_positions"] == []


@pytest.mark.parametrize("name", QUANTIZED)
def test_quantized_logits_close_to_llamacpp_runtime(harness, name, record_property):
    """Reported, loosely bounded: llama.cpp rounds activations to Q8 for quantized matmuls, tinyspec does not."""
    path = FOLDER / name
    if not path.is_file():
        pytest.skip(f"no {path}")
    tool, exe = harness
    r = _compare(tool, exe, path)
    record_property("max_abs_diff", r["max_abs_diff"])
    record_property("argmax_agree", r["argmax_agree"])
    print(f"\n{name}: max|diff|={r['max_abs_diff']:.3g} scale={r['logit_scale']:.3g} "
          f"argmax {r['argmax_agree']}/{r['tokens']} mismatches {r['argmax_mismatch_positions']}")
    assert np.isfinite(r["max_abs_diff"])
    assert r["rel_diff"] < 0.25              # measured 0.05-0.07: catches a wrong kernel, not Q8 rounding
    assert r["argmax_agree"] >= N_TOKENS // 2  # measured 30/32


@pytest.mark.parametrize("name", ["qwen35-tiny-Q4_K_M.gguf", "qwen35-tiny-Q5_K_M.gguf", "qwen35-tiny-Q6_K.gguf",
                                  "qwen35-tiny-Q8_0-py.gguf", "qwen35-tiny-IQ4_XS.gguf", "qwen35-tiny-Q4_0.gguf",
                                  "qwen35-tiny-Q5_0.gguf", "qwen35-tiny-IQ4_NL.gguf"])
def test_cpu_backend_rounds_activations_like_llamacpp(harness, name):
    """The cpu backend multiplies K-quant and IQ4_XS weights by Q8_K-rounded activations, Q8_0 / Q4_0 / Q5_0 /
    IQ4_NL weights by Q8_0-rounded
    ones, as ggml's CPU backend does, so it lands closer to llama.cpp than the float-activation oracle.
    Measured max|diff| / scale over prompt seeds 0-4, oracle -> cpu: Q4_K_M 0.051-0.070 -> 5e-7..0.024,
    Q5_K_M 0.052-0.063 -> 4e-7..0.023, Q6_K 0.044-0.071 -> 3e-7..0.014, Q8_0 0.032-0.049 -> 0.0055-0.023,
    IQ4_XS 0.043-0.077 -> 3e-7..0.024, Q4_0 0.036-0.060 -> 0.010-0.029, Q5_0 0.031-0.048 -> 0.0085-0.020,
    IQ4_NL 0.024-0.051 -> 2e-7..0.023.
    Two-valued: ~5e-7 (no activation crosses a rounding boundary: llama.cpp's function up to summation
    order) or ~1e-2 (one code moved, and every later row with it). Q8_0 and Q4_0 never reach 5e-7 here,
    IQ4_NL (x in the same Q8_0 blocks) does on 3 of 5 prompts (docs/performance-log.md old 30)."""
    pytest.importorskip("numba")
    path = FOLDER / name
    if not path.is_file():
        pytest.skip(f"no {path}")
    tool, exe = harness
    oracle, cpu = _compare(tool, exe, path), _compare(tool, exe, path, "cpu")
    print(f"\n{name}: rel diff oracle {oracle['rel_diff']:.3g}, cpu {cpu['rel_diff']:.3g}; "
          f"argmax {oracle['argmax_agree']} -> {cpu['argmax_agree']}/{N_TOKENS}")
    assert cpu["rel_diff"] < 0.04 and cpu["rel_diff"] < oracle["rel_diff"] / 2
    assert cpu["argmax_agree"] >= N_TOKENS - 2


@pytest.mark.parametrize("case", ["E4-top2-mtp", "E12-top4-mtp"])
@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_moe_logits_match_llamacpp_runtime(llama, tmp_path, case, backend):
    """qwen35moe: a random HF Qwen3_5MoeForCausalLM (tests/test_moe.py's cases) converted to F32 by tinyspec's
    convert, run by llama.cpp's runtime and by tinyspec. Measured (the 0.3.36 sdist's llama.cpp, x86-64, the Intel
    Xeon VM): relative 1.8e-6 / 2.8e-6 (numpy), 1.8e-6 / 2.5e-6 (cpu), argmax 32/32 on both."""
    import test_moe

    from tinyspec.backends import numba_available
    from tinyspec.convert import convert

    if backend == "cpu" and not numba_available():
        pytest.skip("the cpu backend needs numba")
    tool, exe = llama
    _, hf_dir, _ = test_moe.make_checkpoint(tmp_path, next(c for c in test_moe.CASES if c.name == case))
    convert(hf_dir, tmp_path / "moe.gguf", "f32")
    r = _compare(tool, exe, tmp_path / "moe.gguf", backend)
    assert r["tokens"] == N_TOKENS
    assert r["max_abs_diff"] <= 1e-4 * max(1.0, r["logit_scale"]), r["max_abs_diff_per_position"]
    assert r["argmax_mismatch_positions"] == []

