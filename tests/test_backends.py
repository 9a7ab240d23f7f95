"""backends.py: the cpu backend (packed weights + Numba kernels) and the cuda backend (CuPy, device-resident)
run the same model as the NumPy oracle.

    oracle       cpu logits within float tolerance of the oracle on every weight type the kernels read (the
                 oracle with activations rounded to Q8_K for K-quants and IQ4_XS, to Q8_0 for Q8_0 / Q4_0 /
                 Q5_0 / IQ4_NL, as the cpu kernels
                 do: ops.quant_linear_q8);
                 cuda logits within 1e-4 of the float oracle
    invariance   on cpu and cuda, a T-token pass gives bitwise the rows and state of T one-token passes
    lossless     greedy speculative == greedy plain on cpu and cuda for the MTP, lookup and draft-model drafters
    memory       packed weights are views of the file's memory map, never float32 copies; on cuda the state,
                 caches and snapshot ring are device arrays
    dispatch     TINYSPEC_BACKEND, unknown names and missing packages give clear errors
The cuda tests skip without a GPU (they passed on an H100).
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from tinyspec import backends, ops
from tinyspec.backends import BackendError, PackedWeight, load_model
from tinyspec.fast.bench import weight_bytes
from tinyspec.draft import DraftModelDrafter
from tinyspec.config import ModelConfig
from tinyspec.gguf import RawTensor, read_gguf, write_gguf
from tinyspec.lookup import LookupDrafter
from tinyspec.model import Model
from tinyspec.mtp import MTPDrafter, MTPHead
from tinyspec.quants import GGMLType, dequantize, quantize
from tinyspec.generate import generate

from quant_helpers import rounded_x
from tiny_models import tiny_qwen35_tensors

pytest.importorskip("numba")
needs_cuda = pytest.mark.skipif(not backends.cuda_available(), reason="no CUDA device (cupy + a GPU)")
FAST = ["cpu", pytest.param("cuda", marks=needs_cuda)]  # the backends with their own kernels

# every matmul weight of the model gets one of these, by position: each kernel runs inside a real forward
TYPES = [GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.Q5_K, GGMLType.Q8_0, GGMLType.F16, GGMLType.BF16, GGMLType.F32,
         GGMLType.Q4_0]  # (Q2_K has no quantizer here; tests/test_numba_ops.py covers it on random blocks)
SHAPE = dict(D=256, F=256, N=300, H=2, H_kv=1, d=128, n_k=2, n_v=4, K=64, V=64)  # every `in` is a multiple of 256


def write_quantized(path, seed=0, **kw) -> dict:
    """A tiny random qwen35 file whose 2-D matmul weights cycle through TYPES; returns name -> type."""
    meta, tensors = tiny_qwen35_tensors(np.random.default_rng(seed), **(SHAPE | kw))
    types, out = {}, {}
    for i, (name, t) in enumerate(tensors.items()):
        if t.ndim == 2 and name.endswith(backends.LINEAR_SUFFIXES + backends.PACKED_NAMES):
            kind = TYPES[i % len(TYPES)]
            out[name] = RawTensor(kind, t.shape, quantize(t, kind))
            types[name] = kind
        else:
            out[name] = t
    write_gguf(path, meta, out)
    return types


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("backends")
    types = write_quantized(d / "target.gguf", seed=1)
    write_quantized(d / "draft.gguf", seed=2, n_trunk=2, interval=2, mtp=False)
    assert set(types.values()) == set(TYPES)
    return d


def q8_oracle(path, calls: list | None = None) -> Model:
    """The NumPy oracle computing what the cpu backend computes: K-quant, IQ4_XS and Q8_0 weights (numba_ops.Q8_TYPES)
    multiply activations rounded to Q8_K or Q8_0 (ops.quant_linear_q8), every other weight the float32
    activations. calls: receives (x, raw, kind, shape) of every matmul."""
    from tinyspec.fast import numba_ops

    def quant_linear(x, raw, kind, shape):
        if calls is not None:
            calls.append((np.array(x), raw, kind, shape))
        return (ops.quant_linear_q8 if kind in numba_ops.Q8_TYPES else ops.quant_linear)(x, raw, kind, shape)

    def bind(raw, kind, shape, q8):  # PackedWeight's interface to its weight kernels
        return lambda x: quant_linear(x, raw, kind, shape)

    def bind_experts(raw, kind, shape, q8):
        return backends.bind_each_expert(bind, raw, kind, shape, q8, np)

    kernels = SimpleNamespace(SUPPORTED=numba_ops.SUPPORTED, bind=bind, bind_experts=bind_experts, get_rows=ops.get_rows)
    g = read_gguf(path)
    cfg = ModelConfig.from_gguf(g.metadata, n_vocab=g.tensors["token_embd.weight"].shape[0])
    return Model(cfg, backends.packed_tensors(g, kernels), g.metadata)


def close_rows(a: np.ndarray, ref: np.ndarray, tol: float = 1e-2) -> None:
    """Every row of a within tol of ref's scale. Rounding x to Q8_K or Q8_0 is a step
    function: a 1-ulp difference upstream (summation order) can move one activation across a rounding
    boundary, which changes it by d = max / 127 and that row's outputs by ~1e-3 relative; through
    attention every later row sees the changed one (measured on the test file, six token draws: 0 to 22
    of 24 rows moved, 1.5e-2 at worst; the others within 2e-6)."""
    err = np.abs(a - ref).max(axis=-1) / np.abs(ref).max()
    assert err.max() <= tol, err


def test_cpu_matches_the_oracle_on_every_weight_type(files):
    """Every matmul of a forward, on the input the oracle gave it: the cpu kernel within the float32 bound
    of ops.quant_linear_q8 / ops.quant_linear (so each type is wired to its kernel and its rounding of x);
    then the whole forward, where rounding flips spread (close_rows)."""
    from tinyspec.fast import numba_ops

    calls = []
    ref, fast = q8_oracle(files / "target.gguf", calls), load_model(files / "target.gguf", "cpu")
    packed = [t for t in fast.tensors.values() if isinstance(t, PackedWeight)]
    assert {t.ggml_type for t in packed} == set(TYPES)
    tokens = np.random.default_rng(0).integers(0, 300, 24)
    l_ref, h_ref = ref.forward(tokens, ref.new_state())
    assert {kind for _, _, kind, _ in calls} == set(TYPES)
    by_bytes = {id(t.raw): fast.tensors[name] for name, t in ref.tensors.items() if isinstance(t, PackedWeight)}
    for x, raw, kind, shape in calls:
        want = (ops.quant_linear_q8 if kind in numba_ops.Q8_TYPES else ops.quant_linear)(x, raw, kind, shape)
        got = by_bytes[id(raw)].linear(x)
        xr = rounded_x(x, kind) if kind in numba_ops.Q8_TYPES else x  # x as the kernel rounds it
        bound = 1.1 * shape[1] * 2.0**-23 * (np.abs(xr).astype(np.float64) @ np.abs(dequantize(raw, kind, shape)).T)
        assert np.all(np.abs(got - want) <= bound), kind
    l_fast, h_fast = fast.forward(tokens, fast.new_state())
    close_rows(l_fast, l_ref, 3e-2)
    close_rows(h_fast, h_ref, 3e-2)
    head_ref, head_fast = MTPHead(ref), MTPHead(fast)
    m_ref, _ = head_ref.forward(tokens, h_ref, head_ref.new_cache())
    m_fast, _ = head_fast.forward(tokens, h_ref, head_fast.new_cache())  # the same input: its attention
    close_rows(m_fast, m_ref, 3e-2)                                    # spreads a flipped row to later ones


# I-quant types the cpu kernels read: tensor suffix -> (type, fp16 d making weights of size ~1)
IQUANTS = {"ffn_down.weight": (GGMLType.IQ2_XXS, 0.02), "ffn_up.weight": (GGMLType.IQ3_XXS, 0.005),
           "ffn_gate.weight": (GGMLType.IQ4_XS, 0.0005), "attn_gate.weight": (GGMLType.IQ4_NL, 0.01)}


def test_cpu_packs_i_quants_and_matches_the_oracle(tmp_path):
    """A file with I-quant weights (no quantizer here: random blocks with a small finite d) stays packed on
    cpu, the file's bytes and never a float copy; logits as the oracle's (IQ4_XS: on x rounded to Q8_K)."""
    meta, tensors = tiny_qwen35_tensors(np.random.default_rng(3), **SHAPE)
    rng, out = np.random.default_rng(4), {}
    for name, t in tensors.items():
        kind = next((v for k, v in IQUANTS.items() if name.endswith(k)), None)
        if kind is None:
            out[name] = t
            continue
        qtype, d = kind
        raw = rng.integers(0, 256, (t.size // qtype.block_size, qtype.type_size), dtype=np.uint8)
        raw[:, 0:2] = np.full((len(raw), 1), np.float16(d)).view(np.uint8)
        out[name] = RawTensor(qtype, t.shape, raw.reshape(t.shape[0], -1))
    write_gguf(tmp_path / "iq.gguf", meta, out)
    ref, fast = q8_oracle(tmp_path / "iq.gguf"), load_model(tmp_path / "iq.gguf", "cpu")  # IQ4_XS: x to Q8_K
    packed = [t for name, t in fast.tensors.items() if name.endswith(tuple(IQUANTS))]
    assert packed and all(isinstance(t, PackedWeight) for t in packed)
    assert {t.ggml_type for t in packed} == {qtype for qtype, _ in IQUANTS.values()}
    assert all(t.nbytes == t.ggml_type.row_nbytes(t.shape[1]) * t.shape[0] for t in packed)
    tokens = np.random.default_rng(0).integers(0, 300, 12)
    l_ref, _ = ref.forward(tokens, ref.new_state())
    l_fast, _ = fast.forward(tokens, fast.new_state())
    close_rows(l_fast, l_ref)


def test_q8_activations_stay_close_to_the_float_oracle(files):
    """Rounding K-quant activations to Q8_K changes the function, boundedly: on this random model (which
    amplifies every perturbation through 3 layers of nearly flat logits) the cpu logits stay within 30% of
    the logit scale of the float32-activation oracle, as llama.cpp's do (tests/test_llamacpp_runtime.py)."""
    ref, fast = load_model(files / "target.gguf", "numpy"), load_model(files / "target.gguf", "cpu")
    tokens = np.random.default_rng(0).integers(0, 300, 24)
    l_ref, _ = ref.forward(tokens, ref.new_state())
    l_fast, _ = fast.forward(tokens, fast.new_state())
    assert np.abs(l_fast - l_ref).max() <= 0.3 * np.abs(l_ref).max()


def test_packed_weights_are_views_of_the_file(files):
    model = load_model(files / "target.gguf", "cpu")
    packed = [t for t in model.tensors.values() if isinstance(t, PackedWeight)]
    assert packed and all(not t.raw.flags.owndata and not t.raw.flags.writeable for t in packed)
    assert weight_bytes(model) < weight_bytes(load_model(files / "target.gguf", "numpy")) / 2


@pytest.mark.parametrize("backend", FAST)
def test_k_token_pass_equals_one_token_passes_bitwise(files, backend):
    """10 rows: on cuda two token tiles of the tensor-core kernel; the state (on the device there) too."""
    model = load_model(files / "target.gguf", backend)
    prompt, window = [5, 17, 200, 42, 9], [33, 7, 250, 1, 64, 99, 3, 8, 150, 12]
    a, b = model.new_state(), model.new_state()
    model.forward(prompt, a)
    model.forward(prompt, b)
    logits_k, hidden_k = model.forward(window, a)
    rows = [model.forward([t], b) for t in window]
    assert np.array_equal(logits_k, np.concatenate([r[0] for r in rows]))
    assert np.array_equal(hidden_k, np.concatenate([r[1] for r in rows]))
    for la, lb in zip(a.layers, b.layers):
        for x, y in zip(vars(la).values(), vars(lb).values()):
            if hasattr(x, "shape"):  # the layer's arrays (NumPy, or CuPy on cuda)
                assert np.array_equal(model.to_host(x), model.to_host(y))


@pytest.mark.parametrize("backend", FAST)
@pytest.mark.parametrize("drafter", ["mtp", "lookup", "draft"])
@pytest.mark.parametrize("rollback", ["snapshot", "replay"])
def test_greedy_speculative_equals_plain(files, drafter, backend, rollback):
    """Both rings on every fast backend (cpu replays by default, cuda copies snapshots)."""
    loaded = load_model(files / "target.gguf", backend)
    target = loaded.with_placement(replace(loaded.placement, rollback=rollback))
    make = {"mtp": lambda: MTPDrafter(target), "lookup": lambda: LookupDrafter(n_min=1),
            "draft": lambda: DraftModelDrafter(load_model(files / "draft.gguf", backend), target)}[drafter]
    prompt = [10, 20, 30, 10, 20, 30, 10, 20]
    plain = generate(target, prompt, 24)
    spec = generate(target, prompt, 24, drafter=make(), draft_n=3)
    assert spec.tokens == plain.tokens and spec.stats["drafted"] > 0


def test_dispatch_and_errors(monkeypatch, files):
    monkeypatch.setenv("TINYSPEC_BACKEND", "numpy")
    assert backends.default_backend() == "numpy"
    assert not any(isinstance(t, PackedWeight) for t in load_model(files / "target.gguf").tensors.values())
    monkeypatch.setenv("TINYSPEC_BACKEND", "tpu")
    with pytest.raises(BackendError, match="unknown backend 'tpu'"):
        backends.default_backend()
    monkeypatch.delenv("TINYSPEC_BACKEND")
    assert backends.default_backend() in ("cpu", "cuda")
    if not backends.cuda_available():
        with pytest.raises(BackendError, match="needs cupy and a CUDA GPU"):
            load_model(files / "target.gguf", "cuda")


# ---------------------------------------------------------------- the cuda backend (skipped without a GPU)

@needs_cuda
def test_cuda_matches_the_float_oracle(files):
    """The CuPy kernels take float32 activations (no Q8 rounding): logits within float rounding of the oracle."""
    ref, fast = load_model(files / "target.gguf", "numpy"), load_model(files / "target.gguf", "cuda")
    assert {t.ggml_type for t in fast.tensors.values() if isinstance(t, PackedWeight)} == set(TYPES) - {GGMLType.Q4_0}
    tokens = np.random.default_rng(0).integers(0, 300, 24)
    l_ref, h_ref = ref.forward(tokens, ref.new_state())
    l_fast, h_fast = fast.forward(tokens, fast.new_state())
    assert np.abs(l_fast - l_ref).max() <= 1e-4 * np.abs(l_ref).max()
    assert np.abs(h_fast - h_ref).max() <= 1e-4 * np.abs(h_ref).max()


@needs_cuda
def test_cuda_state_and_ring_live_on_the_device(files):
    """Device-resident: the state, the KV caches and the snapshot ring are CuPy arrays; a verify pass fills
    the ring on the device and a rollback restores from it there (same results as a one-token replay)."""
    import cupy

    from tinyspec.state import GDNState, KVCache, SnapshotRing

    model = load_model(files / "target.gguf", "cuda")
    state, replay = model.new_state(), model.new_state()
    assert all(isinstance(a, cupy.ndarray) for layer in state.layers
               for a in ((layer.conv, layer.ssm) if isinstance(layer, GDNState) else (layer.k, layer.v)))
    ring = SnapshotRing(model.cfg, 4, model.xp)
    assert all(isinstance(a, cupy.ndarray) for a in ring.conv + ring.ssm if a is not None)
    model.forward([5, 17, 200], state)
    model.forward([5, 17, 200, 42], replay)
    model.forward([42, 9, 33, 7], state, ring=ring)
    ring.restore(state, 0)  # keep one of the four: the state after token 42
    assert state.pos == replay.pos == 4 and state.max_abs_diff(replay) == 0.0
    assert isinstance(state.layers[-1], (GDNState, KVCache))


@needs_cuda
def test_cuda_greedy_rule_graphs_are_captured(files):
    """Issue 35, item 2: on a GPU the greedy rule's CUDA graph is captured for the verify shape (k = 3: logits
    [4, N], drafts [3]) and no capture fails. A failed capture still gives the right tokens (plain launches), so
    only these counts, and the GraphCaptureWarning made an error here, tell that graphs work on this card."""
    import warnings

    from tinyspec.fast.cuda_graphs import GraphCaptureWarning

    target = load_model(files / "target.gguf", "cuda")  # cuda_placement(graphs=True): the default
    prompt = [10, 20, 30, 10, 20, 30, 10, 20]
    with warnings.catch_warnings():
        warnings.simplefilter("error", GraphCaptureWarning)
        spec = generate(target, prompt, 24, drafter=MTPDrafter(target), draft_n=3)
    assert spec.tokens == generate(target, prompt, 24).tokens
    counts = target.placement.graph_counts()
    assert str((((4, target.cfg.n_vocab), "float32"), ((3,), "int64"))) in counts["shapes"], counts
    assert counts["failed"] == 0 and counts["replays"] > 0, counts
    forward = counts["by_use"]["forward"]  # issue 35, item 5: the forward passes, the verify shape among them
    assert any(s.startswith("(PassMap(R=4, B=1,") for s in forward["shapes"]) and forward["replays"] > 0, forward


@needs_cuda
def test_cuda_chunked_prefill_runs_on_the_device(files):
    """The chunked (WY) prefill form on CuPy arrays: equal to the scan to rounding, as on the host."""
    model = load_model(files / "target.gguf", "cuda")
    tokens = np.random.default_rng(1).integers(0, 300, 40)
    l_scan, _ = model.forward(tokens, model.new_state())
    l_chunk, _ = model.forward(tokens, model.new_state(), chunked=True)
    assert np.abs(l_chunk - l_scan).max() <= 1e-3 * np.abs(l_scan).max()
