"""fast/numba_steps.py: each fused step is bitwise the oracle's step of the same name composed of the cpu
backend's separate calls (the same kernels in the same order), batch-invariant, and the unfused step where it
does not apply (weights the kernels do not hold, a matrix large enough for threads)."""

import dataclasses

import numpy as np
import pytest

pytest.importorskip("numba")

from tinyspec import attention, gdn, ops  # noqa: E402
from tinyspec.assets import TARGET  # noqa: E402
from tinyspec.backends import load_model  # noqa: E402
from tinyspec.fast import numba_steps, threads  # noqa: E402


@pytest.fixture(scope="module")
def model():
    return load_model(TARGET, "cpu")


def steps(model, layer: int, T: int):
    """(fused, composed) pairs of calls on the model's layer, each a function of T rows of input."""
    cfg, kern, w = model.cfg, model.kernels, model.layers[layer]
    rng = np.random.default_rng(layer * 10 + T)
    x = rng.standard_normal((T, cfg.n_embd)).astype(np.float32)
    if cfg.recurrent[layer]:
        HV, V = cfg.ssm_n_v_heads, cfg.ssm_head_v_dim
        o = rng.standard_normal((T, HV, V)).astype(np.float32)
        z = rng.standard_normal((T, HV * V)).astype(np.float32)
        return [(lambda r: numba_steps.gdn_project(x[r], w, kern), lambda r: gdn.gdn_project(x[r], w, kern)),
                (lambda r: numba_steps.gdn_output(o[r], z[r], w, cfg, kern),
                 lambda r: gdn.gdn_output(o[r], z[r], w, cfg, kern))]
    H, d = cfg.n_head, cfg.head_dim
    o = rng.standard_normal((T, H * d)).astype(np.float32)
    gate = rng.standard_normal((T, H * d)).astype(np.float32)
    return [(lambda r: numba_steps.attention_project(x[r], w, cfg, kern), lambda r: attention.project(x[r], w, cfg, kern)),
            (lambda r: numba_steps.attention_output(o[r], gate[r], w, kern),
             lambda r: attention.output(o[r], gate[r], w, kern))]


def ffn_step(model, layer: int, T: int):
    kern, w = model.kernels, model.layers[layer]
    x = np.random.default_rng(T).standard_normal((T, model.cfg.n_embd)).astype(np.float32)
    weights = (w["ffn_gate.weight"], w["ffn_up.weight"], w["ffn_down.weight"])
    return (lambda r: numba_steps.swiglu(x[r], *weights, kern), lambda r: ops.swiglu(x[r], *weights, kern))


def as_tuple(a):
    return a if isinstance(a, tuple) else (a,)


@pytest.mark.parametrize("T", [1, 4])
@pytest.mark.parametrize("layer", [0, 2])  # a GDN layer, an attention layer
def test_each_fused_step_is_bitwise_the_composed_step(model, layer, T):
    every = slice(None)
    for fused, composed in steps(model, layer, T) + [ffn_step(model, layer, T)]:
        for got, want in zip(as_tuple(fused(every)), as_tuple(composed(every)), strict=True):
            assert got.dtype == np.float32 and got.shape == want.shape
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("layer", [0, 2])
def test_fused_steps_are_batch_invariant(model, layer):
    """Row t of a 5-row call is bitwise the row a one-row call computes (a verify pass = 5 decodes)."""
    for fused, _ in steps(model, layer, 5) + [ffn_step(model, layer, 5)]:
        whole = as_tuple(fused(slice(None)))
        for t in range(5):
            for a, b in zip(as_tuple(fused(slice(t, t + 1))), whole, strict=True):
                np.testing.assert_array_equal(a[0], b[t])


def test_the_whole_model_is_bitwise_the_unfused_one(model):
    """The fused steps change no bit of a forward pass: logits of a prompt and a 4-token verify pass, fused
    against the same model with the oracle's steps composed of the cpu backend's calls."""
    unfused = model.with_kernels(dataclasses.replace(
        model.kernels, swiglu=ops.swiglu, gdn_project=gdn.gdn_project, gdn_output=gdn.gdn_output,
        attention_project=attention.project, attention_output=attention.output))
    outs = []
    for m in (model, unfused):
        state = m.new_state()
        a, _ = m.forward([1, 2, 3, 4, 5, 6], state)
        b, _ = m.forward([7, 8, 9, 10], state)
        outs.append((a, b))
    for got, want in zip(*outs, strict=True):
        np.testing.assert_array_equal(got, want)


def test_steps_the_kernels_do_not_hold_are_composed(monkeypatch):
    """Float32 weights (the oracle's model) take the oracle's step, bit for bit; so does a matrix large enough for
    threads (numba_ops.Bound.serial False: here the output head of the shipped model loaded as if it were large)."""
    oracle = load_model(TARGET, "numpy")
    cfg, kern, w = oracle.cfg, oracle.kernels, oracle.layers[0]
    x = np.random.default_rng(0).standard_normal((2, cfg.n_embd)).astype(np.float32)
    for got, want in zip(numba_steps.gdn_project(x, w, kern), gdn.gdn_project(x, w, kern), strict=True):
        np.testing.assert_array_equal(got, want)
    assert load_model(TARGET, "cpu").output.linear.serial  # a model below THREADS_FROM_BYTES: all on one thread
    monkeypatch.setattr(threads, "THREADS_FROM_BYTES", 0)
    cpu = load_model(TARGET, "cpu")
    big = cpu.output  # the [8192, 320] output matrix: multiplied by threads, so never fused
    assert not big.linear.serial and numba_steps._plans(big) is None
    assert numba_steps._plans(cpu.layers[0]["ffn_gate.weight"]) is not None
