"""SyntheticDrafter: on a tiny random target, greedy speculative output equals plain greedy output for any
acceptance rate, and the tokens per verify step average (1 - a^(k+1)) / (1 - a)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_models import write_tiny_qwen35

from tinyspec.fast.synthetic import (
    SyntheticDrafter,
    acceptance_for_mean_length,
    expected_mean_accepted_length,
)
from tinyspec.generate import generate, speculative_generate
from tinyspec.model import Model
from tinyspec.sampling import SamplingParams
from tinyspec.scheduler import EngineOptions

PROMPT = [5, 80, 13, 200, 7]


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Model:
    path = tmp_path_factory.mktemp("synthetic") / "target.gguf"
    write_tiny_qwen35(path, seed=31, n_trunk=4, interval=2)
    return Model.from_gguf(path)


@pytest.fixture(scope="module")
def reference(target) -> list[int]:
    return generate(target, PROMPT, 400).tokens  # plain greedy


def length_law(a: float, k: int) -> np.ndarray:
    """P(tokens per step = 1 + m), m = 0..k: a^m (1 - a) below k, a^k at k."""
    return np.array([a ** m * (1 - a) for m in range(k)] + [a ** k])


def test_expected_length_formula_and_its_inverse():
    assert expected_mean_accepted_length(0.0, 4) == 1.0
    assert expected_mean_accepted_length(1.0, 4) == 5.0
    for a, k in [(0.3, 1), (0.7, 3), (0.9, 8)]:
        law = length_law(a, k)
        assert law.sum() == pytest.approx(1.0)
        assert expected_mean_accepted_length(a, k) == pytest.approx(law @ np.arange(1, k + 2))
        assert acceptance_for_mean_length(expected_mean_accepted_length(a, k), k) == pytest.approx(a, abs=1e-9)
    with pytest.raises(ValueError):
        acceptance_for_mean_length(6.0, 4)


@pytest.mark.parametrize("a, k", [(0.5, 4), (0.8, 3)])
def test_mean_accepted_length_matches_formula(target, reference, a, k):
    """Statistical: mean tokens per step over the steps that drafted all k, within 4 standard errors of
    (1 - a^(k+1)) / (1 - a); the share of fully accepted steps within 4 errors of a^k."""
    drafter = SyntheticDrafter(reference, a, seed=1)
    spec = speculative_generate(target, drafter, PROMPT, len(reference), draft_n=k)
    assert spec.tokens == reference and drafter.diverged_at is None
    lengths = np.array([kept + 1 for drafted, kept in drafter.history if drafted == k])
    assert len(lengths) > 80
    law = length_law(a, k)
    values = np.arange(1, k + 2)
    mean, var = law @ values, law @ (values - law @ values) ** 2
    se = np.sqrt(var / len(lengths))
    assert abs(lengths.mean() - mean) < 4 * se, (lengths.mean(), mean, se)
    full = np.mean(lengths == k + 1)
    assert abs(full - a ** k) < 4 * np.sqrt(a ** k * (1 - a ** k) / len(lengths))
    stats = spec.stats.as_dict()  # the engine's own count agrees (a few short steps at the end)
    assert abs(stats["mean_accepted_length"] - mean) < 5 * se


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(a=st.sampled_from([0.0, 0.3, 0.6, 0.9, 1.0]), k=st.integers(1, 5), seed=st.integers(0, 2**16),
       max_new=st.integers(1, 60))
def test_greedy_output_equals_plain_greedy(target, reference, a, k, seed, max_new):
    """Whatever the rate, the drafter tracks the reference position from commit alone: every kept token
    is on the reference, and after the run it points at the last emitted token."""
    drafter = SyntheticDrafter(reference, a, seed=seed)
    spec = speculative_generate(target, drafter, PROMPT, max_new, draft_n=k)
    assert spec.tokens == reference[:max_new]
    assert drafter.diverged_at is None
    assert drafter.i == len(spec.tokens) - 1  # prompt + emitted tokens but the last were fed
    for drafted, kept in drafter.history:
        assert 0 <= kept <= drafted <= k
    if a == 1.0:
        assert all(kept == drafted for drafted, kept in drafter.history)
    if a == 0.0:
        assert all(kept == 0 for _, kept in drafter.history)


def test_inner_drafter_pays_the_real_cost_and_changes_nothing_else(target, reference):
    """With inner=MTPDrafter the MTP head drafts as many tokens as the synthetic drafter proposes (the cost
    is real), its cache follows the kept tokens, and the output and the accept pattern are those of the
    same seed without it."""
    from tinyspec.mtp import MTPDrafter

    class Counting(MTPDrafter):
        drafted = 0

        def drafting(self, pending, k, params, rng, stop=None, on_device=False):
            Counting.drafted += k
            return super().drafting(pending, k, params, rng, stop, on_device)

    inner = Counting(target)
    with_inner = SyntheticDrafter(reference, 0.7, seed=3, inner=inner)
    alone = SyntheticDrafter(reference, 0.7, seed=3)
    a = speculative_generate(target, with_inner, PROMPT, 40, draft_n=3)
    b = speculative_generate(target, alone, PROMPT, 40, draft_n=3)
    assert a.tokens == b.tokens == reference[:40] and with_inner.history == alone.history
    assert Counting.drafted == a.stats.drafted > 0
    assert inner.cache.n == len(PROMPT) + 39  # the head's cache holds exactly the kept tokens


def test_wrong_drafts_are_certainly_wrong_and_seeded():
    reference = [0, 1, 0, 7, 0, 3, 9, 0, 2, 5]
    drafter = SyntheticDrafter(reference, 0.0, seed=3)
    draft = drafter.propose(reference[0], 9, SamplingParams(), np.random.default_rng(0))
    drafts, q = draft.tokens, draft.q_rows
    assert len(drafts) == 9 and q == [None] * 9
    assert all(d != r and d >= 0 for d, r in zip(drafts, reference[1:]))
    a, b = SyntheticDrafter(reference, 0.5, seed=4), SyntheticDrafter(reference, 0.5, seed=4)
    assert a.propose(0, 9, SamplingParams(), None) == b.propose(0, 9, SamplingParams(), None)
    assert SyntheticDrafter(reference, 1.0).propose(0, 20, SamplingParams(), None).tokens == reference[1:]  # cut at the end


def test_position_follows_commit_after_partial_acceptance():
    reference = list(range(100, 130))
    drafter = SyntheticDrafter(reference, 1.0)
    assert drafter.propose(100, 4, SamplingParams(), None).tokens == [101, 102, 103, 104]
    drafter.commit([100, 101], None)  # the target kept one draft, then corrected to 102
    assert drafter.propose(102, 3, SamplingParams(), None).tokens == [103, 104, 105]
    drafter.commit([102, 103, 104, 105], None)  # all kept, bonus 106 is the next pending token
    assert drafter.propose(106, 2, SamplingParams(), None).tokens == [107, 108]
    assert drafter.history == [(4, 1), (3, 3)] and drafter.diverged_at is None


def test_leaving_the_reference_stops_drafting(target, reference):
    """A reference from another engine (here: wrong from token 10 on) is noticed, not trusted: drafting
    stops at the divergence, and the output is still the target's greedy output."""
    bad = reference[:10] + [(t + 1) % 272 for t in reference[10:]]
    drafter = SyntheticDrafter(bad, 1.0)
    spec = speculative_generate(target, drafter, PROMPT, 40, draft_n=4)
    assert spec.tokens == reference[:40]
    assert drafter.diverged_at == 10
    assert all(drafted == 0 for drafted, _ in drafter.history[-5:])


def test_sampled_run_leaves_the_reference(target, reference):
    drafter = SyntheticDrafter(reference, 0.9)
    spec = speculative_generate(target, drafter, PROMPT, 30, draft_n=3, params=SamplingParams(temperature=5.0),
                                rng=np.random.default_rng(0))
    assert len(spec.tokens) == 30 and drafter.diverged_at is not None


def test_bad_arguments():
    with pytest.raises(ValueError, match="acceptance"):
        SyntheticDrafter([1, 2], 1.5)
    with pytest.raises(ValueError, match="non-negative"):
        SyntheticDrafter([1, -2], 0.5)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_draws_hold_the_rate_over_few_steps(seed):
    """The Kronecker draws: over 100 steps every position's accept frequency is within 0.03 of a, and the
    joint frequencies of the first j positions within 0.05 of a^j (the law of independent draws, kept from
    the first steps on; 100 independent draws at a = 0.8 stray by 0.08 one time in twenty)."""
    reference = list(range(2000))
    for a in (0.5, 0.8, 0.9):
        drafter = SyntheticDrafter(reference, a, seed=seed)
        u = []
        for s in range(100):
            drafter.step = s
            u.append(drafter.draws(4))
        accept = np.array(u) < a
        assert np.all(np.abs(accept.mean(axis=0) - a) <= 0.03), accept.mean(axis=0)
        for j in range(2, 5):
            assert abs(np.all(accept[:, :j], axis=1).mean() - a ** j) <= 0.05
        assert np.array_equal(drafter.draws(2), drafter.draws(4)[:2])  # u_j does not depend on k
    assert not np.array_equal(SyntheticDrafter(reference, 0.5, seed=0).draws(3),
                              SyntheticDrafter(reference, 0.5, seed=1).draws(3))


def test_synthetic_batch_keeps_greedy_output_and_the_set_length(target, reference):
    """The synthetic dial over 3 prompts in 2 slots (the third joins when a slot frees; each slot's drafter looks
    up its prompt's reference), paying real batched MTP drafting: every sequence's tokens are its plain greedy
    ones, the inner drafters drafted exactly the tokens proposed, and over a long run the tokens per step
    average (1 - a^(k+1)) / (1 - a) within 4 standard errors."""
    from tinyspec.batch import batch_generate
    from tinyspec.scheduler import EngineOptions
    from tinyspec.mtp import MTPDrafter

    a, k, n = 0.7, 3, 300
    prompts = [PROMPT, [6] + PROMPT[1:], [7] + PROMPT[1:]]
    references = {tuple(PROMPT): reference[:n]} | {tuple(p): generate(target, p, n).tokens for p in prompts[1:]}

    class Counting(MTPDrafter):
        drafted = 0

        def drafting(self, *args):
            draft = yield from super().drafting(*args)
            Counting.drafted += draft.n
            return draft

        def another(self, pool=None):
            return Counting(self.head.model, head=self.head, scores=self.scores, pool=pool)

    class Recorded(SyntheticDrafter):
        history, started = [], 0

        def another(self, pool=None):
            return Recorded(self.references, self.acceptance, self.seed + 1, self.inner.another(pool))

        def start(self, *args):
            Recorded.started += 1
            super().start(*args)

        def commit(self, fed, hidden):
            super().commit(fed, hidden)
            Recorded.history.append(self.history[-1])
            assert self.diverged_at is None

    drafter = Recorded(references, a, seed=1, inner=Counting(target))
    out = batch_generate(target, prompts, n, drafter=drafter, draft_n=k, options=EngineOptions(slots=2))
    plain = batch_generate(target, prompts, n, options=EngineOptions(slots=2))
    for p, seq, base in zip(prompts, out.sequences, plain.sequences):
        assert seq.tokens == base.tokens == references[tuple(p)]
    assert Recorded.started == 3
    assert Counting.drafted == sum(s.stats["drafted"] for s in out.sequences) > 0  # real cost, same drafts
    lengths = np.array([kept + 1 for drafted, kept in Recorded.history if drafted == k])
    assert len(lengths) > 200
    law, values = length_law(a, k), np.arange(1, k + 2)
    mean, var = law @ values, law @ (values - law @ values) ** 2
    assert abs(lengths.mean() - mean) < 4 * np.sqrt(var / len(lengths)), (lengths.mean(), mean)
    assert k + 1 < out.stats["rows_per_pass"] <= 2 * (k + 1)  # two slots drafting k while both are busy


def test_synthetic_batch_needs_a_reference_for_each_prompt(target):
    from tinyspec.batch import batch_generate

    with pytest.raises(ValueError, match="no reference continuation"):
        batch_generate(target, [PROMPT], 4, drafter=SyntheticDrafter({}, 0.5), draft_n=2,
                       options=EngineOptions(slots=1))
    with pytest.raises(ValueError, match="acceptance"):
        SyntheticDrafter({}, 1.5)
