"""The cuda backend's Python side on a CPU: device arrays stay on the device, and every path of the engine runs.

tests/fake_cupy.py stands in for CuPy (as strict about host and device as CuPy: an implicit conversion or a
host array in device math is a TypeError) and for the CUDA kernels (the NumPy oracles, taking device arrays
only). With it, `load_model(path, "cuda")` builds exactly the model the real backend builds (weights uploaded,
state, KV caches and rings allocated with CuPy, cuda_rows in its kernels) and every engine path runs on it:
plain and speculative generation with each drafter and ring, the adaptive policy (its confidences, withdrawn
drafts, a draft vocabulary), sampling, chunked prefill, bench. The engine changed a great deal after the last
run on a GPU (LESSONS 10, 20); these tests run in CI and catch a host/device leak before a GPU does. What they
cannot catch: a wrong result from a kernel (tests/test_cuda_ops.py, on a GPU).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import fake_cupy
from test_backends import write_quantized
from tinyspec.backends import PackedWeight, load_model
from tinyspec.draft import DraftModelDrafter
from tinyspec.fast.adaptive import AdaptiveDraftLength
from tinyspec.fast.draft_vocab import DraftVocab
from tinyspec.generate import generate
from tinyspec.lookup import LookupDrafter
from tinyspec.mtp import MTPDrafter
from tinyspec.sampling import SamplingParams
from tinyspec.state import GDNState, SnapshotRing


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("fake_cuda")
    write_quantized(d / "target.gguf", seed=1)
    write_quantized(d / "draft.gguf", seed=2, n_trunk=2, interval=2, mtp=False)
    return d


@pytest.fixture
def cuda(monkeypatch):
    """`import cupy` resolves to the stand-in while a test runs, and the cuda modules to fresh copies run on it."""
    fake_cupy.install(monkeypatch)


def on_device(x) -> bool:
    return isinstance(x, fake_cupy.ndarray)


def test_the_stand_in_refuses_what_cupy_refuses(cuda):
    from tinyspec.fast.cuda_rows import NORM_SOURCE  # the real module, on the fake

    dev, host = fake_cupy.asarray(np.ones(3, np.float32)), np.ones(3, np.float32)
    norm_rows = fake_cupy.RawKernel(NORM_SOURCE, "norm_rows")  # a kernel's pointer is device memory
    for leak in (lambda: np.asarray(dev), lambda: np.ascontiguousarray(dev), lambda: dev + host,
                 lambda: np.concatenate([dev, host]), lambda: norm_rows((1,), (128,), (host, host, dev, np.int32(3),
                                                                                np.float32(1e-6), np.int32(1),
                                                                                np.int32(1)))):
        with pytest.raises(TypeError, match="host/device leak"):
            leak()
    assert on_device(dev * np.float32(2)) and float(np.sum(dev)) == 3.0 and fake_cupy.asnumpy(dev).sum() == 3
    with pytest.raises(ValueError, match="non-scalar numpy.ndarray cannot be used for fill"):
        dev[...] = host  # CuPy fills a basic index: only a scalar may come from the host
    dev[...] = np.float32(2)  # a scalar is a fill
    dev[np.array([0, 2])] = np.array([5, 6], np.float32)  # under an index array CuPy uploads the value
    dev.set(np.arange(3, dtype=np.float32))  # the explicit upload
    assert fake_cupy.asnumpy(dev).tolist() == [0, 1, 2]
    with pytest.raises(TypeError, match="cannot be set"):
        dev.set(np.zeros(3))  # float64: CuPy's set refuses another dtype


def test_model_lives_on_the_device_and_matches_the_oracle(files, cuda):
    ref, model = load_model(files / "target.gguf", "numpy"), load_model(files / "target.gguf", "cuda")
    packed = [t for t in model.tensors.values() if isinstance(t, PackedWeight)]
    assert packed and all(on_device(t.raw) for t in packed)
    assert all(on_device(t) for t in model.tensors.values() if not isinstance(t, PackedWeight))
    state = model.new_state()
    assert all(on_device(a) for layer in state.layers
               for a in ((layer.conv, layer.ssm) if isinstance(layer, GDNState) else (layer.k, layer.v)))
    tokens = np.random.default_rng(0).integers(0, 300, 12)
    logits, hidden = model.forward(tokens, state)
    assert isinstance(logits, np.ndarray) and isinstance(hidden, np.ndarray)  # the engine works on the host
    l_ref, h_ref = ref.forward(tokens, ref.new_state())
    assert np.abs(logits - l_ref).max() <= 1e-5 * np.abs(l_ref).max()
    assert np.abs(hidden - h_ref).max() <= 1e-5 * np.abs(h_ref).max()
    ring = SnapshotRing(model.cfg, 4, model.xp)
    assert all(on_device(a) for a in ring.conv + ring.ssm if a is not None)
    replay = model.new_state()
    model.forward(tokens, replay)
    model.forward([42], replay)
    model.forward([42, 9, 33, 7], state, ring=ring)
    ring.restore(state, 0)
    assert state.max_abs_diff(replay) == 0.0
    l_chunk, _ = model.forward(tokens, model.new_state(), chunked=True)
    assert np.abs(l_chunk - l_ref).max() <= 1e-3 * np.abs(l_ref).max()


@pytest.mark.parametrize("rollback", ["snapshot", "replay"])
@pytest.mark.parametrize("drafter", ["mtp", "lookup", "draft"])
def test_greedy_speculation_on_the_device_equals_plain(files, cuda, drafter, rollback):
    loaded = load_model(files / "target.gguf", "cuda")
    target = loaded.with_placement(replace(loaded.placement, rollback=rollback))
    make = {"mtp": lambda: MTPDrafter(target), "lookup": lambda: LookupDrafter(n_min=1),
            "draft": lambda: DraftModelDrafter(load_model(files / "draft.gguf", "cuda"), target=target)}[drafter]
    prompt = [10, 20, 30, 10, 20, 30, 10, 20]
    plain = generate(target, prompt, 20)
    for adaptive in (False, True):  # a fixed k, and the policy (confidences, withdrawn drafts, probes)
        drafter = make()
        policy = AdaptiveDraftLength.for_drafter(drafter, 3) if adaptive else None
        spec = generate(target, prompt, 20, drafter=drafter, draft_n=None if adaptive else 3, policy=policy)
        assert spec.tokens == plain.tokens and spec.stats["drafted"] > 0


def test_draft_vocabulary_and_sampling_on_the_device(files, cuda):
    target = load_model(files / "target.gguf", "cuda")
    vocab = DraftVocab(np.arange(300)[::-1].copy(), 64, 300)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    plain = generate(target, prompt, 16)
    drafter = MTPDrafter(target, vocab)
    spec = generate(target, prompt, 16, drafter=drafter, policy=AdaptiveDraftLength.for_drafter(drafter, 4))
    assert spec.tokens == plain.tokens
    params, rng = SamplingParams(temperature=0.9, top_p=0.95), np.random.default_rng(0)
    for drafter in (MTPDrafter(target), DraftModelDrafter(load_model(files / "draft.gguf", "cuda"), target=target)):
        out = generate(target, prompt, 16, params, rng, drafter=drafter, draft_n=3)
        assert len(out.tokens) == 16 and all(0 <= t < 300 for t in out.tokens)


def test_bench_runs_on_the_device(files, cuda):
    from tinyspec.fast.bench import bench

    model = load_model(files / "target.gguf", "cuda")
    report = bench(model, [5, 6, 7, 8], decode_n=2, repeats=1, max_new=8, drafters=("mtp", "lookup", "synthetic"),
                   adaptive=True)
    assert report["backend"] == "cuda" and all(s["identical"] for s in report["spec"].values())
    graphs = report["graphs"]  # the greedy rule's CUDA graphs over the run (issue 35, item 2): captured, none failed
    assert graphs["captured"] >= 1 and graphs["failed"] == 0 and graphs["replays"] > 0, graphs


@pytest.mark.parametrize("drafter", ["none", "mtp", "draft"])
def test_many_sequences_on_the_device_equal_each_alone(files, cuda, drafter):
    """batch.py on the device: the KV pool and every slot's state and ring are CuPy arrays, the block tables
    index them from the host, and every sequence gets its solo greedy tokens."""
    from tinyspec.batch import batch_generate
    from tinyspec.scheduler import EngineOptions

    target = load_model(files / "target.gguf", "cuda")
    make = {"none": lambda S: None, "mtp": lambda S: MTPDrafter(target),
            "draft": lambda S: DraftModelDrafter(load_model(files / "draft.gguf", "cuda"), target=target)}
    prompts = [[10, 20, 30, 10, 20], [5, 6, 7], [40, 41, 40, 41, 40, 41, 40]]
    out = batch_generate(target, prompts, 12, drafter=make[drafter](2), draft_n=None if drafter == "none" else 3,
                         options=EngineOptions(slots=2, block_size=4))
    for seq, prompt in zip(out.sequences, prompts):
        assert seq.error is None and seq.tokens == generate(target, prompt, 12).tokens


def test_moe_on_the_device_equals_plain(tmp_path, cuda):
    """qwen35moe on the device: experts as PackedExperts over device bytes, routing brought to the host, every
    drafter's greedy output equal to plain."""
    from test_moe_oracle import write_quantized_moe

    from tinyspec.backends import PackedExperts

    write_quantized_moe(tmp_path / "moe.gguf")
    model = load_model(tmp_path / "moe.gguf", "cuda")
    assert isinstance(model.layers[0]["ffn_gate_exps.weight"], PackedExperts)
    prompt = [5, 9, 13, 40, 41, 42, 5, 9]
    plain = generate(model, prompt, 12)
    for drafter in (MTPDrafter(model), LookupDrafter(n_min=1)):
        assert generate(model, prompt, 12, drafter=drafter, draft_n=3).tokens == plain.tokens
