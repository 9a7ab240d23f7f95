"""qwen35moe on the cuda backend, through the fake CuPy (tests/fake_cupy.py): expert tensors of every type the
writer produces load and run, and agree with the NumPy oracle. (The routing and grouping on the device, and
their syncs, are in tests/test_cuda_syncs.py; the kernels' numbers in tests/test_cuda_ops.py, on a GPU.)"""

from __future__ import annotations

import numpy as np
import pytest

import fake_cupy
from tiny_models import tiny_qwen35_tensors
from tinyspec.backends import PackedExperts, load_model
from tinyspec.gguf import RawTensor, write_gguf
from tinyspec.quants import QUANTIZE, GGMLType, quantize

SHAPE = dict(D=256, N=300, H=2, H_kv=1, d=128, n_k=2, n_v=4, K=64, V=64)  # every `in` a multiple of 256
EXPERTS = (6, 2, 256, 32)  # E, k a token, F_e, F_s


@pytest.fixture
def cuda(monkeypatch):
    fake_cupy.install(monkeypatch)


def write_moe(path, expert_type: GGMLType, seed: int = 7) -> None:
    """A tiny qwen35moe file whose three expert tensors of every layer are `expert_type` (3-D, as llama-quantize
    leaves them); every other tensor float32."""
    meta, tensors = tiny_qwen35_tensors(np.random.default_rng(seed), experts=EXPERTS, **SHAPE)
    for name, t in list(tensors.items()):
        if name.endswith("_exps.weight"):
            tensors[name] = RawTensor(expert_type, t.shape, quantize(t.reshape(-1, t.shape[-1]), expert_type))
    write_gguf(path, meta, tensors)


@pytest.mark.parametrize("expert_type", sorted(QUANTIZE, key=int), ids=lambda t: t.name)
def test_experts_of_every_type_run_on_the_cuda_backend(tmp_path, cuda, expert_type):
    """Issue 35 item 1: a 3-D expert tensor of a type the cuda kernels do not read (Q4_0 here; Q5_0, Q2_K, Q3_K,
    the IQ types, MXFP4 in real files) was uploaded as a plain float32 device array, and moe.experts_linear
    handed its experts to ops.linear, which took them for packed weights: AttributeError on the first MoE layer.
    Now it is a PackedExperts over its float32 bytes, as the 2-D fallback is a PackedWeight; every type the
    writer makes loads, and the logits are the oracle's to float32 rounding."""
    write_moe(tmp_path / "moe.gguf", expert_type)
    model = load_model(tmp_path / "moe.gguf", "cuda")
    experts = model.layers[0]["ffn_up_exps.weight"]
    assert isinstance(experts, PackedExperts)
    from tinyspec.fast import cuda_ops  # the fake's stand-in while the fixture is active

    want_type = expert_type if expert_type in cuda_ops.SUPPORTED else GGMLType.F32
    assert experts.ggml_type == want_type and experts.shape == (EXPERTS[0], EXPERTS[2], SHAPE["D"])
    tokens = np.array([5, 9, 13, 40, 41, 42, 5, 9])
    logits, _ = model.forward(tokens, model.new_state())
    oracle = load_model(tmp_path / "moe.gguf", "numpy")
    want, _ = oracle.forward(tokens, oracle.new_state())
    got = fake_cupy.asnumpy(logits)
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


def test_the_expert_tally_counts_the_chosen_experts_on_cuda(tmp_path, cuda):
    """expert_union.tallied on the cuda backend: its groups list every expert (device offsets over all E), and
    the tally counts the non-empty ones, as on the oracle (one sync a call: a measurement, not the model's path)."""
    from tinyspec.fast.expert_union import tallied

    write_moe(tmp_path / "moe.gguf", GGMLType.Q8_0)
    tokens = np.array([5, 9, 13, 40, 41])
    counts = []
    for backend in ("numpy", "cuda"):
        model, tally = tallied(load_model(tmp_path / "moe.gguf", backend))
        model.forward(tokens, model.new_state(), logits=False)
        counts.append(tally.calls)
    assert counts[0] == counts[1] and len(counts[0]) == 4  # one call per trunk MoE layer
