"""qwen35moe on tinyspec's own terms (tinyspec/moe.py): the routing rule, batch invariance, exact speculation and
batching on an MoE model, and files whose experts do not fit their metadata. (tests/test_moe.py checks the
logits against HF transformers' Qwen3_5MoeForCausalLM through convert.)"""

import numpy as np
import pytest
from tiny_models import tiny_qwen35_tensors, write_tiny_qwen35

from tinyspec.backends import load_model, numba_available
from tinyspec.batch import batch_generate
from tinyspec.scheduler import EngineOptions
from tinyspec.draft import DraftModelDrafter
from tinyspec.generate import generate
from tinyspec.gguf import write_gguf
from tinyspec.kernels import NUMPY
from tinyspec.lookup import LookupDrafter
from tinyspec.model import Model, ffn
from tinyspec.moe import moe_ffn, route
from tinyspec.mtp import MTPDrafter

BACKENDS = ["numpy"] + (["cpu"] if numba_available() else [])
EXPERTS = (8, 2, 16, 24)  # E, k a token, F_e, F_s


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("moe")
    write_tiny_qwen35(d / "moe.gguf", seed=3, experts=EXPERTS)
    write_tiny_qwen35(d / "draft.gguf", seed=4, n_trunk=2, interval=2, mtp=False)
    return d


def test_route_picks_the_top_k_and_renormalises():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((50, 8)).astype(np.float32)
    experts, weights = route(logits, 3)
    for row, chosen, w in zip(logits, experts, weights):
        assert list(chosen) == list(np.argsort(-row, kind="stable")[:3])
        p = np.exp(row - row.max())
        assert np.allclose(w, p[chosen] / p[chosen].sum(), atol=1e-6) and abs(w.sum() - 1) < 1e-6
    tied = np.zeros((1, 4), np.float32)  # a tie goes to the lower index
    assert list(route(tied, 2)[0][0]) == [0, 1]


def test_identical_experts_are_the_dense_ffn():
    """Every expert the same FFN and no shared expert: the renormalised weights sum to 1, so the MoE is that FFN."""
    rng = np.random.default_rng(1)
    D, F, E = 16, 24, 6
    gate, up, down = (rng.standard_normal(s).astype(np.float32) for s in ((F, D), (F, D), (D, F)))
    w = {"ffn_gate_inp.weight": rng.standard_normal((E, D)).astype(np.float32),
         "ffn_gate_exps.weight": np.stack([gate] * E), "ffn_up_exps.weight": np.stack([up] * E),
         "ffn_down_exps.weight": np.stack([down] * E)}
    x = rng.standard_normal((5, D)).astype(np.float32)
    dense = ffn(x, {"ffn_gate.weight": gate, "ffn_up.weight": up, "ffn_down.weight": down}, NUMPY)
    assert np.allclose(moe_ffn(x, w, 3, NUMPY), dense, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_are_batch_invariant(files, backend):
    """A T-token pass gives bitwise the logits of T one-token passes: rows grouped by expert never mix."""
    model = load_model(files / "moe.gguf", backend)
    tokens = [5, 9, 13, 40, 41, 42, 5, 9, 77, 3]
    state = model.new_state()
    model.forward(np.array(tokens[:4]), state)
    one = state.copy()
    together, _ = model.forward(np.array(tokens[4:]), state)
    for i, t in enumerate(tokens[4:]):
        row, _ = model.forward(np.array([t]), one)
        assert np.array_equal(row[0], together[i])
    layer = model.layers[0]
    x = np.random.default_rng(2).standard_normal((7, model.cfg.n_embd)).astype(np.float32)
    all_rows = moe_ffn(x, layer, model.cfg.n_expert_used, model.kernels)
    for t in range(7):
        assert np.array_equal(moe_ffn(x[t : t + 1], layer, model.cfg.n_expert_used, model.kernels)[0], all_rows[t])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["mtp", "lookup", "draft"])
def test_greedy_speculation_and_batches_are_exact_on_moe(files, backend, kind):
    model = load_model(files / "moe.gguf", backend)
    draft = load_model(files / "draft.gguf", backend)
    make = {"mtp": lambda: MTPDrafter(model), "lookup": lambda: LookupDrafter(),
            "draft": lambda: DraftModelDrafter(draft, target=model)}[kind]
    prompts = [[5, 9, 13, 40, 41, 42, 5, 9], [7, 7, 8], [100, 3, 5, 100, 3]]
    plain = [generate(model, p, 16).tokens for p in prompts]
    for p, want in zip(prompts, plain):
        assert generate(model, p, 16, drafter=make(), draft_n=3).tokens == want
    slots = 2
    drafter = make()
    out = batch_generate(model, prompts, 16, drafter=drafter, draft_n=3, options=EngineOptions(slots=slots))
    assert [s.tokens for s in out.sequences] == plain


def moe_file(tmp_path, change):
    meta, tensors = tiny_qwen35_tensors(np.random.default_rng(5), experts=EXPERTS, mtp=False)
    change(meta, tensors)
    write_gguf(tmp_path / "bad.gguf", meta, tensors)
    return tmp_path / "bad.gguf"


@pytest.mark.parametrize("change, message", [
    (lambda m, t: m.update({"qwen35moe.expert_count": 0}), "expert_count must be a positive integer"),
    (lambda m, t: m.update({"qwen35moe.expert_used_count": 9}), "expert_used_count = 9 exceeds expert_count = 8"),
    (lambda m, t: t.update({"blk.0.ffn_gate_inp.weight": np.zeros((7, 32), np.float32)}),
     r"blk.0.ffn_gate_inp.weight has shape \(7, 32\), expected \(8, 32\)"),
    (lambda m, t: t.update({"blk.1.ffn_up_exps.weight": np.zeros((6, 16, 32), np.float32)}),
     r"blk.1.ffn_up_exps.weight has shape \(6, 16, 32\), expected \(8, 16, 32\)"),
    (lambda m, t: t.pop("blk.2.ffn_down_exps.weight"), "missing tensor blk.2.ffn_down_exps.weight"),
    (lambda m, t: t.update({"blk.0.ffn_gate_up_exps.weight": np.zeros((8, 32, 32), np.float32)}),
     "fused gate/up expert layout is not supported"),
])
def test_experts_that_do_not_fit_their_metadata_are_refused(tmp_path, change, message):
    path = moe_file(tmp_path, change)
    with pytest.raises(ValueError, match=message):
        Model.from_gguf(path)
    with pytest.raises(ValueError, match=message):
        load_model(path, "cpu" if numba_available() else "numpy")


def test_refused_on_the_command_line_with_exit_2(tmp_path, capsys):
    from tinyspec.__main__ import main

    path = moe_file(tmp_path, lambda m, t: m.update({"qwen35moe.expert_used_count": 9}))
    assert main(["generate", "--model", str(path), "--tokens", "1,2", "--backend", "numpy"]) == 2
    assert "expert_used_count = 9 exceeds expert_count = 8" in capsys.readouterr().err


def write_quantized_moe(path) -> None:
    """A tiny qwen35moe file whose routed experts are Q8_0 (3-D tensors, as llama-quantize leaves them)."""
    from tinyspec.gguf import RawTensor
    from tinyspec.quants import GGMLType, quantize

    meta, tensors = tiny_qwen35_tensors(np.random.default_rng(6), experts=(8, 2, 32, 24))
    for name, t in list(tensors.items()):
        if name.endswith("_exps.weight"):
            tensors[name] = RawTensor(GGMLType.Q8_0, t.shape, quantize(t.reshape(-1, t.shape[-1]), GGMLType.Q8_0))
    write_gguf(path, meta, tensors)


@pytest.mark.skipif(not numba_available(), reason="the cpu backend needs numba")
def test_cpu_multiplies_the_experts_from_their_quantized_bytes(tmp_path):
    """On the cpu backend each expert is a PackedWeight over its slice of the file's bytes (never expanded), the
    model agrees with the oracle of the same rounding, rows stay batch-invariant, and speculation stays exact."""
    from test_backends import close_rows, q8_oracle

    from tinyspec.backends import PackedExperts, PackedWeight

    write_quantized_moe(tmp_path / "q.gguf")
    model = load_model(tmp_path / "q.gguf", "cpu")
    experts = model.layers[0]["ffn_up_exps.weight"]
    assert isinstance(experts, PackedExperts) and experts.shape == (8, 32, 32)
    assert isinstance(experts[3], PackedWeight) and np.shares_memory(experts[3].raw, experts.raw)
    tokens = np.array([5, 9, 13, 40, 41, 42, 5, 9])
    logits, _ = model.forward(tokens, model.new_state())
    close_rows(logits, q8_oracle(tmp_path / "q.gguf").forward(tokens, model.new_state())[0])
    state = model.new_state()
    model.forward(tokens[:3], state)
    one = state.copy()
    together, _ = model.forward(tokens[3:], state)
    for i, t in enumerate(tokens[3:]):
        assert np.array_equal(model.forward(np.array([t]), one)[0][0], together[i])
    plain = generate(model, list(tokens), 16).tokens
    assert generate(model, list(tokens), 16, drafter=MTPDrafter(model), draft_n=3).tokens == plain


@pytest.mark.skipif(not numba_available(), reason="the cpu backend needs numba")
@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0", "F16"])
def test_numba_experts_linear_is_each_experts_own_matmul(qtype):
    """numba_ops.bind_experts (every chosen expert in one kernel call) against the oracle moe.experts_linear
    (one matmul per expert): bitwise each expert's own bound kernel on its rows, and within float32 rounding of
    the oracle of the same activation rounding; bad groupings are refused, not read out of bounds."""
    from tinyspec import ops
    from tinyspec.fast import numba_ops
    from tinyspec.moe import experts_linear, group_by_expert
    from tinyspec.quants import GGMLType, dequantize, quantize

    kind = GGMLType[qtype]
    rng = np.random.default_rng(1)
    E, n_out, n_in, T, k = 6, 40, 512, 5, 3
    raw = quantize(rng.standard_normal((E * n_out, n_in)).astype(np.float32), kind)
    x = rng.standard_normal((T, n_in)).astype(np.float32)
    experts = np.stack([rng.choice(E, k, replace=False) for _ in range(T)])
    order, distinct, offsets = group_by_expert(experts)
    assert list(distinct) == sorted(set(experts.ravel())) and offsets[-1] == T * k
    assert all((experts.ravel()[order[offsets[i]:offsets[i + 1]]] == e).all() for i, e in enumerate(distinct))
    xs = x[order // k]
    got = numba_ops.bind_experts(raw, kind, (E, n_out, n_in), q8=True)(xs, distinct, offsets)
    per = raw.size // E
    for i, e in enumerate(distinct):
        a, b = offsets[i], offsets[i + 1]
        own = numba_ops.bind(raw.reshape(-1)[e * per:(e + 1) * per], kind, (n_out, n_in), q8=True)(xs[a:b])
        assert np.array_equal(got[a:b], own)
        assert np.array_equal(got[a:a + 1], own[:1])  # a row alone: the same bits (batch invariance)
    q8 = kind in numba_ops.Q8_TYPES  # the cpu backend rounds x to Q8_K / Q8_0 for these: their oracle does too
    same_rounding = np.concatenate([(ops.quant_linear_q8 if q8 else ops.quant_linear)(
        xs[offsets[i]:offsets[i + 1]], raw.reshape(-1)[e * per:(e + 1) * per], kind, (n_out, n_in))
        for i, e in enumerate(distinct)])
    scale = np.abs(same_rounding).max()
    assert np.abs(got - same_rounding).max() <= 1e-5 * scale
    w = dequantize(raw, kind, (E * n_out, n_in)).reshape(E, n_out, n_in)
    want = experts_linear(xs, w, distinct, offsets, NUMPY)  # the float oracle: within x's rounding
    assert np.abs(got - want).max() <= (2e-2 if q8 else 1e-5) * scale
    with pytest.raises(ValueError, match="offsets"):
        numba_ops.bind_experts(raw, kind, (E, n_out, n_in))(xs, distinct, offsets[:-1])
    with pytest.raises(IndexError, match="expert ids"):
        numba_ops.bind_experts(raw, kind, (E, n_out, n_in))(xs, distinct + E, offsets)


def test_expert_union_counts_the_routing(files):
    """expert_union.tallied: the same numbers as the model, and the distinct experts each pass reads per MoE layer:
    exactly k for one token (a row's k choices differ), between k and min(E, T k) for T tokens; the bench reports
    them with verify passes of k = 0..8, and the adaptive prior prices the extra experts."""
    from tinyspec.fast.adaptive import AdaptiveDraftLength
    from tinyspec.fast.bench import bench, weight_bytes
    from tinyspec.fast.expert_union import expert_union, step_cost_curve, tallied, uniform_union

    E, k = EXPERTS[:2]
    model = Model.from_gguf(files / "moe.gguf")
    counted, tally = tallied(model)
    tokens = np.array([5, 9, 13, 40, 41])
    assert np.array_equal(counted.forward(tokens, counted.new_state())[0], model.forward(tokens, model.new_state())[0])
    assert [layer for layer, _ in tally.calls] == list(range(model.cfg.n_trunk))  # one grouped call per MoE layer
    union = expert_union(model, [1, 2, 3], sizes=range(1, 6))
    assert union[1] == k and all(k <= union[T] <= min(E, T * k) for T in union) and union[5] > union[1]
    assert uniform_union(256, 8, 1) == pytest.approx(8) and uniform_union(256, 8, 4) == pytest.approx(30.5, abs=0.05)
    curve = step_cost_curve(model, 4)
    assert curve[0] == 1 and all(b > a + 0.3 - 1e-9 for a, b in zip(curve, curve[1:]))  # dearer than the dense prior
    dense = Model.from_gguf(files / "draft.gguf")
    assert step_cost_curve(dense, 4) == pytest.approx([1 + 0.3 * j for j in range(5)])
    policy = AdaptiveDraftLength.for_drafter(MTPDrafter(model), 4, model)
    assert policy.cost_curve == pytest.approx(curve) and policy._xs[1] == pytest.approx(1)
    with pytest.raises(ValueError, match="cost_curve"):
        AdaptiveDraftLength(3, cost_curve=(1.0, 1.0, 2.0, 3.0))
    report = bench(model, [1, 2, 3], decode_n=2, repeats=1, drafters=())
    assert sorted(report["verify_cost_ratio"]) == list(range(1, 10))  # k = 0..8
    assert report["experts"]["distinct_per_layer"][1] == k and report["experts"]["n_expert"] == E
    experts_read = sum(t.nbytes * k // E for layer in model.layers for t in layer.values() if t.ndim == 3)
    rest = model.output.nbytes + sum(t.nbytes for layer in model.layers for t in layer.values() if t.ndim < 3)
    assert weight_bytes(model) == rest + experts_read  # a decode step reads k of the E experts
