"""Step costs measured on the machine at hand (fast/step_costs.py) and the adaptive policy started from them:
the curve's shape, the measurement on a real (tiny) model, and a policy that keeps to plain steps when its
measured costs say drafting cannot pay."""

from __future__ import annotations

import numpy as np
import pytest
from test_speculate import targets  # noqa: F401

from tinyspec.fast.adaptive import AdaptiveDraftLength
from tinyspec.fast.step_costs import StepCosts, measure_step_costs
from tinyspec.generate import generate
from tinyspec.mtp import MTPDrafter


def test_curve_is_the_line_through_the_measured_steps_in_plain_steps():
    costs = StepCosts(verify=(1.0, 1.1, 1.2, 1.3, 1.4), draft=0.3, steps={0: 2.0, 1: 3.0, 3: 5.0})
    assert costs.k_max == 4
    assert costs.curve() == pytest.approx((1.0, 1.5, 2.0, 2.5, 3.0))  # S(k) = 2 + k, over S(0) = 2


def test_curve_never_falls_and_a_draft_is_never_free():
    """A noisy deeper step timed below a shorter one is lifted to it, and C(1) > C(0) even if a drafting step
    was timed faster than a plain one (the policy needs a rising curve)."""
    costs = StepCosts(verify=(1.0,) * 4, draft=0.0, steps={0: 2.0, 1: 1.5, 3: 1.0})
    curve = costs.curve()
    assert curve[0] == 1.0 and curve[1] > 1.0
    assert all(b >= a for a, b in zip(curve, curve[1:]))
    AdaptiveDraftLength(3, cost_curve=curve)  # accepted by the policy's own check


def test_measure_step_costs_on_a_model(targets):  # noqa: F811
    model = targets("gdn-attn-x2")
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, model.cfg.n_vocab, 12)]
    costs = measure_step_costs(model, MTPDrafter(model), 4, prompt, repeats=2, tokens=8)
    assert len(costs.verify) == 5 and all(v > 0 for v in costs.verify)
    assert sorted(costs.steps) == [0, 1, 3] and all(v > 0 for v in costs.steps.values())
    assert costs.draft > 0  # the MTP head's pass is work
    assert len(costs.curve()) == 5 and set(costs.as_dict()) == {"verify_ms", "draft_ms", "step_ms", "cost_curve"}
    with pytest.raises(ValueError, match="k_max >= 1"):
        measure_step_costs(model, MTPDrafter(model), 0, prompt)


def test_for_drafter_takes_the_measured_curve_and_checks_its_length(targets):  # noqa: F811
    model = targets("gdn-attn-x2")
    costs = StepCosts(verify=(1.0, 1.2, 1.4, 1.6), draft=0.5, steps={0: 1.0, 1: 2.0, 3: 4.0})
    policy = AdaptiveDraftLength.for_drafter(MTPDrafter(model), 3, model, costs=costs)
    assert policy.cost_curve == pytest.approx(costs.curve())
    with pytest.raises(ValueError, match="measured up to k = 3"):
        AdaptiveDraftLength.for_drafter(MTPDrafter(model), 5, costs=costs)


def test_policy_on_costs_that_cannot_pay_takes_plain_steps_but_probes():
    """Each draft costs a whole plain step (C(k) = 1 + k): even drafts that are always kept only tie a plain
    step (E(k) <= 1 + k), and a tie is not chosen (the margin). Only the probes draft, and since no acceptance
    could make a draft pay at these costs, 1 step in hopeless_gap (a probe only re-times the costs), not in
    probe_every."""
    policy = AdaptiveDraftLength(4, cost_curve=tuple(1.0 + k for k in range(5)), a0=0.95)
    chosen = []
    for _ in range(64):
        k = policy.choose()
        chosen.append(k)
        policy.update(k, k, 1e-3 * (1 + k))  # every draft kept, each a step's time
    assert policy.hopeless_gap > policy.probe_every
    assert sum(k > 0 for k in chosen) <= 64 // policy.hopeless_gap + 1, chosen


def test_a_policy_that_could_pay_with_kept_drafts_probes_every_probe_every_steps():
    """Costs where drafts always kept would pay (C(k) = 1 + 0.3 k) but these drafts always fail: the policy takes
    plain steps and probes at the usual gap, not the hopeless one (a better drafter's start there would pay)."""
    policy = AdaptiveDraftLength(4, cost_curve=tuple(1.0 + 0.3 * k for k in range(5)))
    chosen = []
    for _ in range(64):
        k = policy.choose()
        chosen.append(k)
        policy.update(k, 0, 1e-3 * (1 + 0.3 * k))  # every draft rejected
    probes = sum(k > 0 for k in chosen[16:])
    assert 64 // policy.hopeless_gap < probes <= 48 // policy.probe_every + 2, chosen


def test_curve_is_no_shallower_than_a_draft_and_a_verify_row():
    """Two whole steps timed close together (noise on a busy machine) would make deeper drafts look free: the
    slope is at least one draft plus one verify row, as timed alone (medians of repeated passes)."""
    costs = StepCosts(verify=(1.0, 1.2, 1.4, 1.6, 1.8), draft=0.5, steps={0: 1.0, 1: 2.0, 3: 2.0})
    assert costs.curve() == pytest.approx((1.0, 2.0, 2.7, 3.4, 4.1))  # slope 0.5 + (1.8 - 1.2) / 3 = 0.7


def test_generate_is_lossless_with_a_measured_policy(targets):  # noqa: F811
    model = targets("gdn-attn-x2")
    prompt = [int(t) for t in np.random.default_rng(1).integers(0, model.cfg.n_vocab, 10)]
    costs = measure_step_costs(model, MTPDrafter(model), 3, prompt, repeats=1, tokens=6)
    drafter = MTPDrafter(model)
    spec = generate(model, prompt, 16, drafter=drafter,
                    policy=AdaptiveDraftLength.for_drafter(drafter, 3, costs=costs))
    assert spec.tokens == generate(model, prompt, 16).tokens
