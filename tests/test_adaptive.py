"""Adaptive draft length: the policy's model (E(k), T(k), argmax), its exploration, and losslessness."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_speculate import (  # noqa: F401
    N_VOCAB,
    RandomDrafter,
    draft_model,
    make_drafter,
    repetitive_prompt,
    target,
    targets,
)

from tinyspec.fast.adaptive import AdaptiveDraftLength
from tinyspec.fast.synthetic import expected_mean_accepted_length
from tinyspec.generate import generate, speculative_generate


def run(policy: AdaptiveDraftLength, steps: int, accept_prob: float, cost, rng) -> None:
    """Drive the policy with a simulated drafter (each draft accepted with accept_prob) and step costs cost(k)."""
    for _ in range(steps):
        k = policy.choose()
        n = 0
        while n < k and rng.random() < accept_prob:
            n += 1
        policy.update(k, n, cost(k))


def test_expected_tokens_is_the_closed_form():
    policy = AdaptiveDraftLength(6, a0=0.7)
    for k in range(7):
        assert policy.expected_tokens(k) == pytest.approx(expected_mean_accepted_length(0.7, k))


def test_step_cost_estimates_between_and_beyond_measured_sizes():
    policy = AdaptiveDraftLength(8)
    assert policy.step_cost(4) == pytest.approx(1 + 0.3 * 4)  # nothing timed: the prior, in plain steps
    assert policy.choose() == 3  # argmax of E(k) / (1 + 0.3 k) at a0 = 0.8
    policy.update(8, 8, 99.0)  # a generation's first step pays its warm-up: outcomes kept, time not
    assert policy.step_s == {} and policy.seen[7] == 1
    policy.update(2, 2, 3.0)  # one size timed: the others from it
    assert policy.step_cost(6) == pytest.approx(3.0 * (1 + 0.3 * 6) / (1 + 0.3 * 2))  # above: as the prior grows
    assert policy.step_cost(0) == pytest.approx(3.0 * (1 + 1 / 3) / 2)  # halfway between flat and proportional
    assert policy.step_cost(1) == pytest.approx(3.0 * (1 + 2 / 3) / 2)
    policy.update(6, 6, 7.0)  # two sizes: the line through them, for every k >= 1
    assert [policy.step_cost(k) for k in (1, 4, 8)] == pytest.approx([2.0, 5.0, 9.0])
    assert policy.as_dict()["step_ms_line"] == pytest.approx([1000.0, 1000.0])  # c0, c1 in ms
    assert policy.step_cost(0) == pytest.approx(2.0)  # a plain step: still from the shortest timed step
    policy.update(4, 4, 50.0)  # one step timed 10x its estimate (a busy machine) counts as 1.5x
    assert policy.step_s[4] == pytest.approx(7.5) and policy.step_cost(4) < 6.0


@pytest.mark.parametrize("accept_prob, cost, best", [
    (0.9, lambda k: 1.0 + 0.1 * k, range(5, 9)),  # cheap verify, good drafts: draft long
    (0.0, lambda k: 1.0 + 0.1 * k, [0]),  # drafts always fail: plain steps
    (0.8, lambda k: 1.0 + 1.0 * k, [0]),  # each draft costs a whole decode: never worth it
    (0.6, lambda k: 1.0 + 0.25 * k, range(1, 4)),  # in between: short drafts
])
def test_policy_settles_on_the_best_k(accept_prob, cost, best):
    policy = AdaptiveDraftLength(8)
    rng = np.random.default_rng(0)
    run(policy, 400, accept_prob, cost, rng)
    late = [policy.choose() for _ in range(20)]
    assert max(set(late), key=late.count) in best, (policy.as_dict(), late)
    # the k it settles on has a modelled rate within 10% of the best true rate
    def true_rate(k):
        return expected_mean_accepted_length(accept_prob, k) / cost(k)
    chosen = max(set(late), key=late.count)
    assert true_rate(chosen) >= 0.9 * max(true_rate(k) for k in range(9))


def test_probes_the_alternative_and_backs_off_while_drafts_fail():
    policy = AdaptiveDraftLength(4, probe_every=5, probe_max=40)
    ks = []
    for _ in range(200):  # drafts always fail; plain steps are cheapest
        ks.append(policy.choose())
        policy.update(ks[-1], 0, 1.0 + 0.5 * ks[-1])
    drafting = [i for i, k in enumerate(ks) if k]
    gaps = np.diff(drafting[-4:])  # after the first steps, probing drafts only, ever further apart
    assert all(k == 1 for k in ks[10:] if k) and list(gaps) == [40, 40, 40], (drafting, ks[:30])
    policy = AdaptiveDraftLength(4, probe_every=5)
    ks = []
    for _ in range(60):  # drafts always kept, cheap: k_max, with one plain step in every 5
        ks.append(policy.choose())
        policy.update(ks[-1], ks[-1], 1.0 + 0.1 * ks[-1])
    assert ks[-20:].count(0) == 4 and ks[-20:].count(4) == 16, ks


def test_bad_k_max():
    with pytest.raises(ValueError):
        AdaptiveDraftLength(0)


@pytest.mark.parametrize("kw", [
    {"edges": (0.5, 0.3), "kept_prior": (0.5, 0.7, 0.9)},  # not increasing
    {"edges": (0.0, 0.5), "kept_prior": (0.5, 0.7, 0.9)},  # an edge outside (0, 1)
    {"kept_prior": (0.5, 0.9)},  # two priors for the five default bins
    {"edges": (0.5,), "kept_prior": (0.0, 0.9)},  # a prior of 0
    {"prior_weight": 0.0},
])
def test_bad_confidence_bins(kw):
    with pytest.raises(ValueError):
        AdaptiveDraftLength(4, **kw)


@pytest.mark.parametrize("kind", ["mtp", "lookup", "draft", "random"])
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**16), draft_n=st.integers(1, 8), max_new=st.integers(1, 24))
def test_greedy_output_is_identical_with_adaptive_k(target, draft_model, kind, seed, draft_n, max_new):  # noqa: F811
    prompt = repetitive_prompt(np.random.default_rng(seed), 8)
    plain = generate(target, prompt, max_new).tokens
    drafter = make_drafter(kind, target, draft_model, plain)
    policy = AdaptiveDraftLength.for_drafter(drafter, draft_n)
    spec = speculative_generate(target, drafter, prompt, max_new, policy=policy)
    assert spec.tokens == plain
    assert sum(policy.chosen.values()) == spec.stats.steps == sum(spec.stats.adaptive["chosen_k"].values())


class PricedByRows(AdaptiveDraftLength):
    """The adaptive policy with the clock replaced by a cost model: a step of R rows costs 10 ms + 3 ms a row,
    whatever the machine is doing. Its choices then follow the acceptance it sees and nothing else, so a loaded
    machine cannot change them (a wall clock can: the measured gap between k = 0 and k = 1 drowns in its noise)."""

    def observe(self, drafts, accepted, draft_s, verify_s, rows):
        super().observe(drafts, accepted, 0.0, 0.010 + 0.003 * rows, rows)


def test_adaptive_switches_off_against_an_adversarial_drafter(target):  # noqa: F811
    """Random drafts are (almost) never accepted. Each row a pass computes costs 3 ms (PricedByRows), so a step's
    cost grows with k, as on a real model; the policy must then run plain steps, drafting only in its probes."""
    policy = PricedByRows(4)
    spec = speculative_generate(target, RandomDrafter(0), [40, 41, 42, 43], 100, policy=policy)
    assert policy.chosen.get(0, 0) >= 0.8 * spec.stats.steps, policy.as_dict()
    assert policy.accept[0] < 0.25  # estimated from the few drafts it made


@pytest.mark.parametrize("slope", [0.3, 0.9])
def test_drafts_failing_from_the_start_cost_one_long_step_and_a_few_short_ones(slope):
    """The priors start at k = 3 (of 4); after it fails, one-draft steps while a_1's upper confidence bound
    says drafting may still pay (three here: the bound falls 0.75, 0.53, 0.40, 0.32 with each rejection), then
    plain steps with a probing draft every 16: a longer k is not tried again just because a_2.. were never
    observed (LESSONS 4)."""
    policy = AdaptiveDraftLength(4)
    ks = []
    for _ in range(40):
        ks.append(policy.choose())
        policy.update(ks[-1], 0, 1.0 + slope * ks[-1])
    assert ks[0] == 3 and max(ks[1:]) == 1 and ks[1:15].count(1) <= 4 and set(ks[8:15]) == {0}, ks
    assert ks[15:].count(1) <= 2, ks  # probes only


@pytest.mark.parametrize("prior_deep, climbs", [(3, True), (1, False)])
def test_one_early_rejection_at_position_2_does_not_lock_a_short_k(prior_deep, climbs):
    """The first step keeps 1 of 3 drafts, every later draft is kept: a_2 fell once, and positions beyond
    the k being run are never observed, so with the prior counting as one outcome there (prior_deep=1)
    the policy stays at one draft for good; counting as three, it climbs back to long drafts."""
    policy = AdaptiveDraftLength(4, prior_deep=prior_deep)
    ks = [policy.choose()]
    policy.update(ks[0], 1, 1.0 + 0.3 * ks[0])
    for _ in range(30):
        ks.append(policy.choose())
        policy.update(ks[-1], ks[-1], 1.0 + 0.3 * ks[-1])
    assert (min(ks[-10:]) >= 2 and max(ks[-10:]) >= 3) if climbs else max(ks[-10:]) <= 1, ks


def run_confident(policy: AdaptiveDraftLength, steps: int, cost, rng) -> tuple[float, float]:
    """A drafter whose drafts are sure (p = 0.95, kept 0.98) or, one in five, unsure (p = 0.2, kept 0.4),
    drafting as far as keep_drafting lets it; returns (tokens, cost) over the steps."""
    assert policy.by_confidence  # a drafter that reports how sure it is: choose() caps, keep_drafting stops
    tokens = seconds = 0.0
    for _ in range(steps):
        k = policy.choose()
        probs, n, alive = [], 0, True
        while len(probs) < k:
            unsure = rng.random() < 0.2
            probs.append(0.2 if unsure else 0.95)
            kept = rng.random() < (0.4 if unsure else 0.98)
            alive = alive and kept
            n += alive
            if not policy.keep_drafting(probs):
                break
        tokens, seconds = tokens + 1 + n, seconds + cost(len(probs))
        policy.update(len(probs), n, cost(len(probs)), probs)
    return tokens, seconds


def test_confidence_ends_a_step_at_an_unsure_draft_and_beats_every_fixed_k():
    """Drafts the drafter is unsure of are mostly rejected: stopping there (and drafting on through sure
    ones) gives more tokens per unit of cost than any fixed k, whose drafts after an unsure one are mostly
    wasted. Fixed k under the same law: E(k) / T(k) with the mean acceptance 0.8 * 0.98 + 0.2 * 0.4."""
    def cost(k):
        return 1.0 + 0.5 * k

    policy = AdaptiveDraftLength(8, by_confidence=True)
    run_confident(policy, 300, cost, np.random.default_rng(1))  # learn costs and calibration
    tokens, seconds = run_confident(policy, 2000, cost, np.random.default_rng(2))
    a = 0.8 * 0.98 + 0.2 * 0.4
    best_fixed = max(expected_mean_accepted_length(a, k) / cost(k) for k in range(9))
    assert tokens / seconds > 1.05 * best_fixed, (tokens / seconds, best_fixed, policy.as_dict())
    calib = policy.as_dict()["kept_by_confidence"]
    assert calib["0.0"] < 0.5 < 0.95 < calib["0.9"]  # learnt from the outcomes (priors 0.5 and 0.99)
    # after a sure draft the step goes on, after an unsure one it stops; the cap is k_max
    assert policy.choose() in (0, 8)
    policy.since_probe = 0
    assert policy.choose() == 8 and policy.keep_drafting([0.95]) and not policy.keep_drafting([0.95, 0.2])


def test_confidence_is_used_only_for_drafters_that_report_it(target):  # noqa: F811
    """for_drafter drafts by confidence exactly when the drafter says it stops by it; the plans then carry
    keep_drafting as their stop rule, and a drafter is never changed by the policy that drives it."""
    for drafter, options, expect in [(RandomDrafter(0), {}, False), (make_drafter("lookup", target, None, []), {}, False),
                                     (make_drafter("mtp", target, None, []), {"by_confidence": False}, False),
                                     (make_drafter("mtp", target, None, []), {}, True)]:
        policy = AdaptiveDraftLength.for_drafter(drafter, 4) if not options else AdaptiveDraftLength(4, **options)
        before = dict(vars(drafter))
        spec = speculative_generate(target, drafter, [40, 41, 42, 43], 12, policy=policy)
        assert policy.by_confidence is expect
        assert ("kept_by_confidence" in spec.stats.adaptive) is expect
        [plan] = policy.plan([4])
        assert (plan.stop.keep_going is not None) is expect and plan.stop.floor == policy.floor
        assert set(vars(drafter)) == set(before)  # nothing lent to the drafter
        assert before.get("p_floor", 0.0) == vars(drafter).get("p_floor", 0.0) == 0.0  # the floor came with the plan


def test_tables_are_expected_tokens_and_step_cost():
    """choose reads E(k) and T(k) for every k from tables() (one pass each): the same values as
    expected_tokens and step_cost, on random estimates and any subset of measured step sizes."""
    import random

    rnd = random.Random(0)
    for _ in range(500):
        policy = AdaptiveDraftLength(rnd.randint(1, 9))
        for k in rnd.sample(range(policy.k_max + 1), rnd.randint(0, policy.k_max + 1)):
            policy.step_s[k] = rnd.random()
        if rnd.random() < 0.5:  # timed drafting steps: the line through them (or none while k barely varies)
            for _ in range(rnd.randint(1, 6)):
                k, t = rnd.randint(1, 9), rnd.random()
                policy.fit = [v + x for v, x in zip(policy.fit, (1.0, k, t, k * k, k * t))]
        policy.accept = [rnd.random() for _ in policy.accept]
        expected, costs = policy.tables()
        for k in range(policy.k_max + 1):
            assert expected[k] == pytest.approx(policy.expected_tokens(k), abs=1e-12)
            assert costs[k] == policy.step_cost(k)


def test_replay_reproduces_fixed_k_runs_and_the_oracle_bounds_every_policy():
    """tools/replay_adaptive.py: one recording of the MTP head's chains on the shipped model replays a fixed-k
    run step for step (the same steps, drafts kept and tokens as speculative_generate), and no policy it
    replays beats its best possible (dynamic programming knowing which drafts are kept)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
    import replay_adaptive as R

    from tinyspec.backends import load_model
    from tinyspec.mtp import MTPDrafter
    from tinyspec.tokenizer import Tokenizer

    model = load_model(R.ASSETS / "tiny-target.gguf", "numpy")
    prompt = Tokenizer.from_gguf(model.metadata).encode("def merge(a, b):\n    out = []\n    i = j = 0\n")
    max_new, depth = 40, 8
    trace = R.record(model, prompt, max_new, depth)
    assert sum(m > 0 for m in trace.kept) > max_new // 2  # the head is right here: the test has steps to compare
    cost = R.Costs(1.0, 1.1, 0.3, {})
    for k in (1, 3, 8):
        spec = speculative_generate(model, MTPDrafter(model), prompt, max_new, k)
        _, steps = R.replay(trace, R.fixed(trace, k), cost, max_new)
        assert spec.tokens == trace.tokens[:max_new]
        assert (len(steps), sum(n for _, n in steps)) == (spec.stats.steps, spec.stats.accepted)
        assert sum(j for j, _ in steps) == spec.stats.drafted
    bound = R.best_possible(trace, cost, max_new)
    draft_kept = R.replay(trace, lambda t, room: trace.kept[t], cost, max_new)[0]  # the drafts that will be kept
    others = [R.fixed(trace, k) for k in range(depth + 1)]
    others += [R.threshold(trace, 0.4, depth), R.adaptive(trace, depth, cost)]
    assert bound <= draft_kept and all(bound <= R.replay(trace, decide, cost, max_new)[0] for decide in others)
    assert bound < min(R.replay(trace, R.fixed(trace, k), cost, max_new)[0] for k in range(depth + 1))
    timed = R.measure_costs(model, [prompt], 16, ks=(0, 1, 2), repeats=1)  # the clock side runs too
    assert set(timed.measured) == {0, 1, 2} and timed.plain > 0 and all(v > 0 for v in timed.measured.values())


def test_hopeful_tokens_is_expected_tokens_at_a_1s_upper_bound():
    """choose() decides whether to draft with a_1 at a_1 + optimism * sqrt(a_1 (1 - a_1) / (n + 1)): E(k) with
    that a_1, every deeper estimate as it is; the bound falls back to a_1 as outcomes come in."""
    policy = AdaptiveDraftLength(5)
    for n_rejected, bound in [(1, 0.746), (2, 0.522), (3, 0.400), (4, 0.324)]:
        policy.update(1, 0, 1.0)
        assert policy.seen[0] == n_rejected
        a = policy.accept[0]
        assert a + (a * (1 - a) / (n_rejected + 1)) ** 0.5 == pytest.approx(bound, abs=1e-3)
        hopeful = AdaptiveDraftLength(5)
        hopeful.accept = [bound] + policy.accept[1:]
        expected = [hopeful.expected_tokens(k) for k in range(6)]
        assert policy.hopeful_tokens() == pytest.approx(expected, abs=2e-3)
    policy.optimism = 0.0
    assert policy.hopeful_tokens() == pytest.approx([policy.expected_tokens(k) for k in range(6)])


@pytest.mark.parametrize("floor", [0.04, 1.0])
def test_hopeless_drafts_are_withdrawn_and_count_as_rejections(target, floor):  # noqa: F811
    """The random targets' heads give their drafts p = 0.02-0.08: with the policy's floor at 0.04 about half
    the first drafts are withdrawn (the step becomes a plain pass), at 1.0 all of them. Greedy output is the
    plain output either way; each withdrawn first draft is a rejection at position 1 for the policy, with no
    step time recorded; the drafter gets its own floor back afterwards."""
    from tinyspec.mtp import MTPDrafter

    prompt = repetitive_prompt(np.random.default_rng(3), 12)
    plain = generate(target, prompt, 40).tokens
    drafter = MTPDrafter(target)
    updates = []

    class Recording(AdaptiveDraftLength):  # the policy, recording what each step told it
        def update(self, k, n, s, probs=None, withdrawn=False):
            updates.append((k, withdrawn))
            super().update(k, n, s, probs, withdrawn)

    policy = Recording.for_drafter(drafter, 4, floor=floor, optimism=5.0)  # optimism: keep trying to draft
    spec = speculative_generate(target, drafter, prompt, 40, policy=policy)
    assert spec.tokens == plain and drafter.p_floor == 0.0
    withdrawn = sum(w and not k for k, w in updates)
    assert withdrawn >= 3 and (spec.stats.drafted == 0) == (floor == 1.0), (updates, spec.stats.drafted)
    assert policy.seen[0] == withdrawn + sum(1 for k, w in updates if k)  # every first draft is an outcome
    if floor == 1.0:
        assert set(policy.step_s) <= {0} and policy.fit[0] == 0  # no drafting time from a withdrawn draft


def test_sampled_drafts_are_never_withdrawn(target):  # noqa: F811
    """Choosing whether to propose a sampled draft from its own q would bias the law the rejection rule assumes,
    so p_floor applies to greedy drafting only."""
    from tinyspec.mtp import MTPDrafter
    from tinyspec.sampling import SamplingParams

    drafter = MTPDrafter(target, p_floor=1.0)
    drafter.start([5, 6, 7], target.forward(np.array([5, 6, 7]), target.new_state())[1], 3)
    draft = drafter.propose(8, 3, SamplingParams(temperature=1.0), np.random.default_rng(0))
    assert len(draft.tokens) == 3 and not draft.withdrawn
    draft = drafter.propose(8, 3, SamplingParams(), None)
    assert draft.tokens == [] and draft.withdrawn


def test_a_tree_counts_its_kept_path_but_calibrates_no_confidence_bin():
    """A tree's draft (Draft.parents) counts k = its nodes and n_accepted = its kept path's length for the a_j, but its
    probabilities, per node in row order, not along the kept path, leave the confidence bins as they were."""
    from tinyspec.drafting import Draft

    policy = AdaptiveDraftLength(4)
    tree = Draft([5, 6, 7, 8], [None] * 4, [0.9, 0.8, 0.3, 0.2], parents=(0, 1, 0, 0))
    bins = list(policy.seen_bin)
    policy.observe([tree], [2], 0.001, 0.002, 5)
    assert list(policy.seen_bin) == bins and policy.seen[:3] == [1, 1, 1]
    chain = Draft([5, 6, 7, 8], [None] * 4, [0.9, 0.8, 0.3, 0.2])
    policy.observe([chain], [2], 0.001, 0.002, 5)
    assert sum(policy.seen_bin) == sum(bins) + 3  # a chain's accepted two and its first rejection
