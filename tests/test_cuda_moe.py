"""qwen35moe on the cuda backend, through the fake CuPy (tests/fake_cupy.py): expert tensors of every type the
writer produces load and run, and agree with the NumPy oracle; the expert tally counts on it; and the device
routing's algorithm (fast/cuda_moe.py), written out on the host, is moe.route's bit for bit. (The routing and grouping on the device, and
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


# --- the device algorithm, written out: what route_k and group_k compute, in float32 scalars on the host.
# This checks the algorithm the kernels implement (NumPy's pairwise summation order, the selection sweeps' tie
# rule, the stable counting sort) against moe.route and group_by_expert; the kernels themselves are checked
# against the same oracle only on a GPU (tests/test_cuda_ops.py section 5).

def pairwise_sum(a) -> np.float32:  # cuda_moe's pairwise_sum: NumPy's order
    n = len(a)
    if n < 8:
        r = np.float32(0)
        for v in a:
            r = np.float32(r + v)
        return r
    if n <= 128:
        r = [np.float32(v) for v in a[:8]]
        i = 8
        while i < n - n % 8:
            r = [np.float32(r[j] + a[i + j]) for j in range(8)]
            i += 8
        res = np.float32(np.float32(np.float32(r[0] + r[1]) + np.float32(r[2] + r[3]))
                         + np.float32(np.float32(r[4] + r[5]) + np.float32(r[6] + r[7])))
        for v in a[i:]:
            res = np.float32(res + v)
        return res
    n2 = n // 2
    n2 -= n2 % 8
    return np.float32(pairwise_sum(a[:n2]) + pairwise_sum(a[n2:]))


def route_k(z, k):  # one row: softmax, k selection sweeps, renormalise
    # (the kernel spreads each sweep over a warp's lanes and reduces them under the same total order, p descending
    # then index ascending: the unique maximum, which this one serial sweep finds too)
    m = max(z)
    p = [np.float32(np.exp(np.float64(np.float32(v - m)))) for v in z]
    s = pairwise_sum(p)
    p = [np.float32(v / s) for v in p]
    chosen, prev, prev_p = [], -1, np.float32(0)
    for _ in range(k):
        best, best_p = -1, np.float32(0)
        for e, pe in enumerate(p):
            after = prev < 0 or pe < prev_p or (pe == prev_p and e > prev)
            if after and (best < 0 or pe > best_p):
                best, best_p = e, pe
        chosen.append(best)
        prev, prev_p = best, best_p
    w = [p[e] for e in chosen]
    sc = pairwise_sum(w)
    return chosen, [np.float32(v / sc) for v in w]


def group_k(chosen_flat, E):  # counts per expert, exclusive scan, each expert's pairs in pair order
    counts = [sum(1 for c in chosen_flat if c == e) for e in range(E)]
    offsets = [0]
    for c in counts:
        offsets.append(offsets[-1] + c)
    order = [p for e in range(E) for p, c in enumerate(chosen_flat) if c == e]
    return order, offsets


@pytest.mark.parametrize("E,k", [(6, 2), (8, 8), (9, 3), (128, 8), (129, 8), (256, 8), (300, 3)])
@pytest.mark.parametrize("logits", ["normal", "ties"])
def test_the_device_routing_algorithm_is_moe_route_bit_for_bit(E, k, logits):
    """route_k and group_k written out give moe.route's weights bit for bit and group_by_expert's order, ties
    included. (The sum matters: a plain left-to-right sum instead of NumPy's pairwise order fails E = 128, 256,
    300 here.)"""
    from tinyspec.moe import group_by_expert, route

    rng = np.random.default_rng(E * 10 + k)
    T = 6
    z = (rng.standard_normal((T, E)) * 3 if logits == "normal" else rng.integers(-2, 3, (T, E))).astype(np.float32)
    if logits == "ties":
        z[0] = 1.0  # a row all equal: the first k experts, in index order
    want_experts, want_weights = route(z, k)
    rows = [route_k(list(row), k) for row in z]
    assert np.array_equal(np.array([c for c, _ in rows]), want_experts)
    assert np.array_equal(np.array([w for _, w in rows], np.float32).view(np.uint32), want_weights.view(np.uint32))
    order, offsets = group_k([c for cs, _ in rows for c in cs], E)
    want_order, distinct, starts = group_by_expert(want_experts)
    counts = np.zeros(E, np.int64)
    counts[distinct] = np.diff(starts)
    assert order == list(want_order) and offsets == [0, *np.cumsum(counts)]
