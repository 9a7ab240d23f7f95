"""fast/numba_steps.py: each fused step is bitwise the oracle's step of the same name composed of the cpu
backend's separate calls (the same kernels in the same order), batch-invariant, and the unfused step where it
does not apply (weights the kernels do not hold, a matrix large enough for threads)."""

import dataclasses

import numpy as np
import pytest

pytest.importorskip("numba")

from tinyspec import attention, ffn, gdn  # noqa: E402
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
    qg = rng.standard_normal((T, H, 2 * d)).astype(np.float32)  # q a view of it, as attention.project returns
    kk = rng.standard_normal((T, cfg.n_head_kv, d)).astype(np.float32)
    positions = np.arange(30, 30 + T)
    return [(lambda r: numba_steps.attention_project(x[r], w, cfg, kern), lambda r: attention.project(x[r], w, cfg, kern)),
            (lambda r: numba_steps.norm_rope(qg[r, :, :d], kk[r], positions[r], w, cfg, kern),
             lambda r: attention.norm_rope(qg[r, :, :d], kk[r], positions[r], w, cfg, kern)),
            (lambda r: numba_steps.attention_output(o[r], gate[r], w, kern),
             lambda r: attention.output(o[r], gate[r], w, kern))]


def ffn_step(model, layer: int, T: int):
    cfg, kern, w = model.cfg, model.kernels, model.layers[layer]
    x = np.random.default_rng(T).standard_normal((T, cfg.n_embd)).astype(np.float32)
    return (lambda r: numba_steps.ffn_residual(x[r], w, cfg, kern), lambda r: ffn.ffn_residual(x[r], w, cfg, kern))


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
        model.kernels, ffn_residual=ffn.ffn_residual, gdn_project=gdn.gdn_project, gdn_output=gdn.gdn_output,
        gdn_recurrent=gdn.gdn_recurrent, attention_project=attention.project, norm_rope=attention.norm_rope,
        attention_output=attention.output))
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


def test_the_recurrent_step_is_bitwise_the_composed_one_for_many_sequences(model):
    """gdn_recurrent on three sequences of 1, 3 and 0 new rows (a ragged decode and prefill, no ring): the output
    rows and every window and memory after it bitwise those of gdn.gdn_recurrent with the cpu backend's calls,
    and each sequence's rows those it computes alone."""
    cfg, kern, w = model.cfg, model.kernels, model.layers[0]
    rng = np.random.default_rng(5)
    C = w["ssm_conv1d.weight"].shape[0]
    bounds = np.array([0, 1, 4, 4])
    mixed = rng.standard_normal((4, C)).astype(np.float32)
    beta = rng.random((4, cfg.ssm_n_v_heads)).astype(np.float32)
    log_decay = -rng.random((4, cfg.ssm_n_v_heads)).astype(np.float32)

    def fresh():  # three sequences' layer-0 states, each after a prompt of its own
        states = []
        for n in (3, 5, 2):
            s = model.new_state()
            model.forward(list(range(1, n + 1)), s)
            states.append(s.layers[0])
        return states

    runs = []
    for step in (numba_steps.gdn_recurrent, gdn.gdn_recurrent):
        states = fresh()
        o = step(mixed, log_decay, beta, bounds, w, states, cfg, kern)
        runs.append((o, [s.conv.copy() for s in states], [s.ssm.copy() for s in states]))
    (o, convs, ssms), (o_ref, convs_ref, ssms_ref) = runs
    np.testing.assert_array_equal(o, o_ref)
    for a, b in zip(convs + ssms, convs_ref + ssms_ref, strict=True):
        np.testing.assert_array_equal(a, b)
    alone = fresh()[1:2]
    np.testing.assert_array_equal(numba_steps.gdn_recurrent(mixed[1:4], log_decay[1:4], beta[1:4], np.array([0, 3]),
                                                            w, alone, cfg, kern), o[1:4])


@pytest.mark.parametrize("kind", ["replay", "snapshot"])
def test_a_verify_pass_with_a_ring_is_fused_and_bitwise_the_composed_one(model, monkeypatch, kind):
    """A verify pass (each sequence's ring keeps what a rollback needs) in one compiled call: for three sequences of
    4, 1 and 2 rows, the output rows, every window and memory after the pass, every ring entry a snapshot ring
    keeps and every input a replay ring records bitwise those of gdn.gdn_recurrent with the cpu backend's
    separate calls; the compiled call is the one that ran (no fallback to the composed steps)."""
    from tinyspec.state import ReplayRing, SnapshotRing

    cfg, kern, w = model.cfg, model.kernels, model.layers[0]
    rng = np.random.default_rng(7)
    C, HV = w["ssm_conv1d.weight"].shape[0], cfg.ssm_n_v_heads
    bounds = np.array([0, 4, 5, 7])
    mixed = rng.standard_normal((7, C)).astype(np.float32)
    beta = rng.random((7, HV)).astype(np.float32)
    log_decay = -rng.random((7, HV)).astype(np.float32)
    make = (lambda: ReplayRing(cfg, 4, kern.causal_conv, kern.gdn_scan)) if kind == "replay" else \
        (lambda: SnapshotRing(cfg, 4))
    composed, runs = gdn.gdn_recurrent, []
    for fused in (True, False):
        states, rings = [], []
        for n in (3, 5, 2):  # three sequences, each after a prompt of its own
            s = model.new_state()
            model.forward(list(range(1, n + 1)), s)
            states.append(s)
            rings.append(make())
        layers = [s.layers[0] for s in states]
        if fused:
            monkeypatch.setattr(gdn, "gdn_recurrent", lambda *a: pytest.fail("fell back to the composed steps"))
        step = numba_steps.gdn_recurrent if fused else composed
        o = step(mixed, log_decay, beta, bounds, w, layers, cfg, kern, [r.layer(0) for r in rings])
        monkeypatch.undo()
        run = [o] + [a.copy() for g in layers for a in (g.conv, g.ssm)]
        if kind == "snapshot":
            run += [a.copy() for r in rings for a in (r.conv[0], r.ssm[0])]
        else:  # the window and memory before the pass, and the conv's and the scan's inputs, for a replay
            run += [a for r in rings for log in r.log[:1] for a in (log.conv, log.spare, *log.conv_inputs[:1],
                                                                   *log.scan_inputs)]
        runs.append(run)
    assert len(runs[0]) == len(runs[1])
    for got, want in zip(*runs, strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("kind", ["replay", "snapshot"])
def test_a_rollback_after_a_fused_verify_pass_is_bitwise_the_unfused_one(model, kind):
    """The whole model with each ring: a 5-token verify pass, a rollback to each of its rows, and the next pass's
    logits bitwise those of the model with the composed recurrent step."""
    placement = dataclasses.replace(model.placement, rollback=kind)
    fused = model.with_placement(placement)
    unfused = fused.with_kernels(dataclasses.replace(model.kernels, gdn_recurrent=gdn.gdn_recurrent))
    outs = []
    for m in (fused, unfused):
        run = []
        for entry in range(4):
            state, ring = m.new_state(), m.new_ring(5)
            m.forward([1, 2, 3, 4, 5, 6], state)
            logits, _ = m.forward([7, 8, 9, 10, 11], state, ring=ring)
            ring.restore(state, entry)
            after, _ = m.forward([12, 13], state)
            run += [logits, after] + [a for g in state.layers if hasattr(g, "ssm") for a in (g.conv, g.ssm)]
        outs.append(run)
    for got, want in zip(*outs, strict=True):
        np.testing.assert_array_equal(got, want)


def test_the_tree_recurrent_step_is_bitwise_the_composed_one(model, monkeypatch):
    """gdn_recurrent_tree over a draft tree (tree.py) in one compiled call: the output rows, every ring entry (the
    state after each row's path) and the untouched sequence state bitwise those of gdn.gdn_recurrent_tree with the
    cpu backend's separate calls; the compiled call is the one that ran (no fallback to the composed steps)."""
    from tinyspec.state import SnapshotRing

    cfg, kern, w = model.cfg, model.kernels, model.layers[0]
    rng = np.random.default_rng(6)
    parents, T = (0, 0, 1, 1, 3, 2), 7
    C = w["ssm_conv1d.weight"].shape[0]
    mixed = rng.standard_normal((T, C)).astype(np.float32)
    beta = rng.random((T, cfg.ssm_n_v_heads)).astype(np.float32)
    log_decay = -rng.random((T, cfg.ssm_n_v_heads)).astype(np.float32)
    runs = []
    composed = gdn.gdn_recurrent_tree
    for step in (numba_steps.gdn_recurrent_tree, composed):
        s = model.new_state()
        model.forward([3, 1, 4, 1, 5], s)
        ring = SnapshotRing(cfg, T)
        before = s.layers[0].copy()
        monkeypatch.setattr(gdn, "gdn_recurrent_tree", lambda *a: pytest.fail("fell back to the composed steps"))
        o = step(mixed, log_decay, beta, parents, w, s.layers[0], cfg, kern, ring.layer(0)) \
            if step is not composed else composed(mixed, log_decay, beta, parents, w, s.layers[0], cfg, kern,
                                                  ring.layer(0))
        monkeypatch.undo()
        assert s.layers[0].max_abs_diff(before) == 0.0  # the sequence's own state is left as it was
        runs.append((o, ring.conv[0].copy(), ring.ssm[0].copy()))
    for got, want in zip(*runs, strict=True):
        np.testing.assert_array_equal(got, want)
