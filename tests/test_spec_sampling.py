"""Speculative sampling is lossless: the exact law of what one verify step emits equals p_target.

The main tests ENUMERATE a small vocabulary: for every draft d they add up q_draft(d) times what the rule
then emits (accept with probability a(d), else the residual), and compare the result with p_target to
1e-12. These tests use the module's own accept_probability and residual, and a stub-RNG test pins
accept_draft to accept_probability. A Monte-Carlo chi-square test then checks verify_step end to end.
"""

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tinyspec.sampling import SamplingParams, pick, probs_from_logits, sample
from tinyspec.spec_sampling import accept_draft, accept_probability, residual, verify_greedy, verify_step

N = 5  # vocabulary size for the enumerations


def laws(n: int = N):
    """Probability vectors over n tokens with exact zeros and one-hots among them."""
    weight = st.one_of(st.just(0.0), st.just(1.0), st.floats(0.0, 1.0))
    return (st.lists(weight, min_size=n, max_size=n).filter(lambda w: sum(w) > 0)
            .map(lambda w: np.array(w) / np.sum(w)))


def one_hot(i: int, n: int = N) -> np.ndarray:
    e = np.zeros(n)
    e[i] = 1.0
    return e


def emitted_law(p_target: np.ndarray, q_draft: np.ndarray | None, d: int) -> np.ndarray:
    """Law of the emitted token given draft d: a(d) 1{x = d} + (1 - a(d)) residual_d(x)."""
    a = accept_probability(p_target, q_draft, d)
    return a * one_hot(d, p_target.size) + (1 - a) * residual(p_target, q_draft, d)


def one_draft_law(p_target: np.ndarray, q_draft: np.ndarray) -> np.ndarray:
    """sum_d q_draft(d) [a(d) 1{x = d} + (1 - a(d)) residual_d(x)]; d with q_draft(d) = 0 are never drafted."""
    return sum(q_draft[d] * emitted_law(p_target, q_draft, d) for d in range(q_draft.size) if q_draft[d] > 0)


class StubRng:
    """Returns the given uniforms in order; records how many were drawn."""

    def __init__(self, *uniforms):
        self.uniforms, self.drawn = list(uniforms), 0

    def random(self):
        self.drawn += 1
        return self.uniforms.pop(0)


# --------------------------------------------------------------------------------- hand-worked cases


def test_hand_worked_one_draft():
    p_target = np.array([0.5, 0.3, 0.2, 0.0, 0.0])
    q_draft = np.array([0.2, 0.6, 0.0, 0.2, 0.0])
    assert accept_probability(p_target, q_draft, 0) == 1.0  # p >= q
    assert accept_probability(p_target, q_draft, 1) == pytest.approx(0.5)  # 0.3 / 0.6
    assert accept_probability(p_target, q_draft, 3) == 0.0  # the target rules token 3 out
    # max(0, p - q) = [0.3, 0, 0.2, 0, 0], Z = 0.5 (= sum max(0, q - p) = 0.3 + 0.2)
    np.testing.assert_allclose(residual(p_target, q_draft, 1), [0.6, 0, 0.4, 0, 0], rtol=1e-15)
    # q_draft None = one-hot on the token: the residual is p_target without it
    np.testing.assert_allclose(residual(p_target, None, 0), [0, 0.6, 0.4, 0, 0], rtol=1e-15)
    np.testing.assert_allclose(one_draft_law(p_target, q_draft), p_target, atol=1e-15)


def test_residual_when_p_equals_q_returns_p():
    p_target = np.array([0.25, 0.75, 0, 0, 0])
    np.testing.assert_array_equal(residual(p_target, p_target.copy(), 1), p_target)
    np.testing.assert_array_equal(residual(one_hot(2), None, 2), one_hot(2))


def test_accept_draft_is_one_uniform_below_the_threshold():
    p_target = np.array([0.1, 0.3, 0.6, 0, 0])
    q_draft = np.array([0.4, 0.4, 0.2, 0, 0])  # a(1) = 0.75
    assert accept_draft(p_target, q_draft, 1, StubRng(0.7499))
    assert not accept_draft(p_target, q_draft, 1, StubRng(0.75))
    assert accept_draft(p_target, None, 2, StubRng(0.5999))  # deterministic draft: a = p_target(2)
    assert not accept_draft(p_target, None, 2, StubRng(0.6))
    rng = StubRng(0.999999)
    assert accept_draft(p_target, q_draft, 2, rng) and rng.drawn == 1  # a = 1: still one draw


@given(laws(), laws(), st.integers(0, N - 1), st.floats(0.0, 1.0, exclude_max=True))
def test_accept_draft_matches_accept_probability(p_target, q_draft, d, u):
    assert accept_draft(p_target, q_draft, d, StubRng(u)) == (u < accept_probability(p_target, q_draft, d))
    assert accept_draft(p_target, None, d, StubRng(u)) == (u < p_target[d])


@pytest.mark.parametrize("u", [0.0, 0.5, np.nextafter(1.0, 0.0)])
def test_greedy_is_exact_whatever_the_uniforms(u):
    """One-hot p_target: accept iff the draft is the argmax, the correction is the argmax, for any u."""
    p_rows = [one_hot(3), one_hot(1), one_hot(4), one_hot(0)]
    q_soft = np.full(N, 1 / N)
    for q_rows in ([None, None, None], [q_soft, q_soft, q_soft], [one_hot(3), one_hot(1), one_hot(2)]):
        assert accept_draft(p_rows[0], q_rows[0], 3, StubRng(u))
        assert not accept_draft(p_rows[0], q_rows[0], 2, StubRng(u))
        assert verify_step(p_rows, [3, 1, 2], q_rows, StubRng(u, u, u, u)) == (2, 4)  # 2 != 4: corrected to 4
        assert verify_step(p_rows, [3, 1, 4], q_rows, StubRng(u, u, u, u)) == (3, 0)  # all kept: bonus argmax
        assert verify_step(p_rows, [0, 1, 4], q_rows, StubRng(u, u, u, u)) == (0, 3)
    assert verify_step(p_rows[:1], [], [], StubRng(u)) == (0, 3)  # no drafts: a plain step


def test_verify_step_checks_row_counts():
    with pytest.raises(ValueError):
        verify_step([one_hot(0)], [1], [None], np.random.default_rng(0))
    with pytest.raises(ValueError):
        verify_step([one_hot(0), one_hot(1)], [1], [], np.random.default_rng(0))


# --------------------------------------------------------------------------------- exact enumeration


@settings(max_examples=300, deadline=None)
@given(laws(), laws())
@example(np.array([0.2, 0.2, 0.2, 0.2, 0.2]), np.array([0.2, 0.2, 0.2, 0.2, 0.2]))  # p == q: never rejects
@example(one_hot(1), np.array([0.5, 0.5, 0, 0, 0]))  # greedy target, soft draft
@example(np.array([0.5, 0.5, 0, 0, 0]), one_hot(3))  # draft always proposes a token the target rules out
@example(np.array([0, 0, 0.3, 0.7, 0]), np.array([0.6, 0.4, 0, 0, 0]))  # disjoint supports
def test_one_draft_law_is_p_target(p_target, q_draft):
    np.testing.assert_allclose(one_draft_law(p_target, q_draft), p_target, rtol=0, atol=1e-12)


@settings(max_examples=300, deadline=None)
@given(laws(), st.integers(0, N - 1))
@example(one_hot(2), 2)
@example(one_hot(2), 0)
def test_deterministic_draft_law_is_p_target(p_target, d):
    """q_draft None (one-hot on d): law = p(d) 1{x = d} + (1 - p(d)) residual(x) = p."""
    np.testing.assert_allclose(emitted_law(p_target, None, d), p_target, rtol=0, atol=1e-12)


@settings(max_examples=100, deadline=None)
@given(laws(), st.lists(laws(), min_size=N, max_size=N), laws(),
       st.lists(st.one_of(st.none(), laws()), min_size=N, max_size=N))
def test_two_draft_joint_law_is_the_target_chain(p1, p2_rows, q1, q2_rows):
    """Two drafts: d1 ~ q1, d2 ~ q2(. | d1), checked against p1 and p2(. | d1).

    J(a, b) = P(first two emitted tokens are a, b). If d1 is accepted (x1 = d1), x2 comes from the same step:
    law L2(b | d1) = sum_d2 q2(d2 | d1) emitted_law(p2(. | d1), q2(. | d1), d2), or the deterministic law
    when q2(. | d1) is None. If d1 is rejected, the step ends with x1 ~ residual and x2 is the next step's
    first token, whose law is p2(. | x1) by the one-draft test above. J must equal p1(a) p2(b | a).
    """
    p2 = np.array(p2_rows)  # [N, N]: row d1 = the target's law after d1

    def second_law(d1):  # L2(. | d1)
        if q2_rows[d1] is None:  # a deterministic drafter: its d2 is some fixed token, here d1 itself
            return emitted_law(p2[d1], None, d1)
        return one_draft_law(p2[d1], q2_rows[d1])

    for d1 in range(N):  # the second token given the first was the accepted draft d1
        np.testing.assert_allclose(second_law(d1), p2[d1], rtol=0, atol=1e-12)
    joint = np.zeros((N, N))
    for d1 in range(N):
        if q1[d1] == 0:
            continue
        a1 = accept_probability(p1, q1, d1)
        joint[d1] += q1[d1] * a1 * second_law(d1)
        joint += q1[d1] * (1 - a1) * residual(p1, q1, d1)[:, None] * p2
    np.testing.assert_allclose(joint.sum(axis=1), p1, rtol=0, atol=1e-12)  # the first token's law
    np.testing.assert_allclose(joint, p1[:, None] * p2, rtol=0, atol=1e-12)


@settings(max_examples=200, deadline=None)
@given(laws(), laws(), st.integers(0, N - 1))
def test_residual_is_a_law_on_where_p_exceeds_q(p_target, q_draft, d):
    r = residual(p_target, q_draft, d)
    assert np.all(r >= 0) and r.sum() == pytest.approx(1.0, abs=1e-12)
    if np.any(p_target > q_draft):
        assert np.all((r > 0) <= (p_target > q_draft))  # never a token the target gives less than the draft


@settings(max_examples=100, deadline=None)
@given(st.lists(laws(), min_size=4, max_size=4), st.lists(st.one_of(st.none(), laws()), min_size=3, max_size=3),
       st.integers(0, 2**32 - 1))
def test_verify_step_never_emits_what_the_target_rules_out(p_rows, q_rows, seed):
    rng = np.random.default_rng(seed)
    drafts = [int(rng.integers(N)) if q is None else int(rng.choice(N, p=q)) for q in q_rows]
    n_accepted, next_token = verify_step(p_rows, drafts, q_rows, rng)
    emitted = drafts[:n_accepted] + [next_token]
    assert all(p_rows[i][t] > 0 for i, t in enumerate(emitted))


# --------------------------------------------------------------------------------- Monte Carlo, end to end

# chi-square critical value for df = N - 1 = 4 at significance 0.001: chi2.ppf(0.999, 4) = 18.467 (standard
# table; scipy is not a dependency). The seeds are fixed, so each test is deterministic; the threshold says the
# fixed draw is an ordinary one for the target law.
CHI2_CRIT_DF4_P001 = 18.467
DRAWS = 20_000


def chi_square(counts: np.ndarray, p_target: np.ndarray) -> float:
    support = p_target > 0
    assert np.all(counts[~support] == 0), "emitted a token the target rules out"
    expected = counts.sum() * p_target[support]
    return float(np.sum((counts[support] - expected) ** 2 / expected))


MC_CASES = {
    "soft": (np.array([0.1, 0.2, 0.3, 0.25, 0.15]), np.array([0.3, 0.3, 0.1, 0.1, 0.2])),
    "disjoint-ish": (np.array([0.02, 0.03, 0.35, 0.3, 0.3]), np.array([0.5, 0.4, 0.1, 0, 0])),
    "deterministic": (np.array([0.2, 0.2, 0.2, 0.2, 0.2]), None),  # draft is always token 0
}


@pytest.mark.parametrize("name", MC_CASES)
def test_verify_step_first_token_chi_square(name):
    p_target, q_draft = MC_CASES[name]
    p_bonus = np.array([0.2, 0.2, 0.2, 0.2, 0.2])  # irrelevant to the first token
    rng = np.random.default_rng(1234)
    counts = np.zeros(N)
    for _ in range(DRAWS):
        d = 0 if q_draft is None else int(rng.choice(N, p=q_draft))
        n_accepted, next_token = verify_step([p_target, p_bonus], [d], [q_draft], rng)
        counts[d if n_accepted else next_token] += 1
    dof = int(np.sum(p_target > 0)) - 1
    assert dof == 4
    assert chi_square(counts, p_target) < CHI2_CRIT_DF4_P001, counts / DRAWS


def test_verify_step_two_drafts_chi_square():
    """Two drafts from fixed q rows (a context-free toy): token 1 ~ p_rows[0], token 2 ~ p_rows[1] given token 1 was a draft."""
    p_rows = [np.array([0.1, 0.2, 0.3, 0.25, 0.15]), np.array([0.3, 0.1, 0.1, 0.2, 0.3]), np.full(N, 0.2)]
    q_rows = [np.array([0.3, 0.3, 0.1, 0.1, 0.2]), np.array([0.1, 0.5, 0.2, 0.1, 0.1])]
    rng = np.random.default_rng(99)
    first, second = np.zeros(N), np.zeros(N)
    for _ in range(DRAWS):
        drafts = [int(rng.choice(N, p=q)) for q in q_rows]
        n_accepted, next_token = verify_step(p_rows, drafts, q_rows, rng)
        emitted = drafts[:n_accepted] + [next_token]
        first[emitted[0]] += 1
        if n_accepted >= 1:
            second[emitted[1]] += 1
    assert chi_square(first, p_rows[0]) < CHI2_CRIT_DF4_P001, first / DRAWS
    assert second.sum() > 5000
    assert chi_square(second, p_rows[1]) < CHI2_CRIT_DF4_P001, second / second.sum()


@settings(max_examples=200, deadline=None)
@given(k=st.integers(0, 5), n=st.integers(2, 7), seed=st.integers(0, 2**32 - 1), right=st.integers(0, 5),
       draft_laws=st.booleans())
def test_greedy_shortcut_equals_verify_step(k, n, seed, right, draft_laws):
    """verify_greedy (the engine's temperature-0 path) returns what verify_step returns on the one-hot target
    laws of the same logits, for deterministic drafts and for drafts that came with a full proposal law;
    ties in the logits (small n, few distinct values) take the first maximum, as the one-hot law does."""
    rng = np.random.default_rng(seed)
    logits = rng.integers(0, 3, (k + 1, n)).astype(np.float32)  # many ties
    greedy = SamplingParams()
    top = [int(np.argmax(row)) for row in logits]
    drafts = [top[i] if i < right else int(rng.integers(0, n)) for i in range(k)]
    q_rows = [rng.dirichlet(np.ones(n)) if draft_laws else None for _ in range(k)]
    for i, d in enumerate(drafts):  # a draft law must give its own draft positive mass
        if q_rows[i] is not None:
            q_rows[i][d] += 0.5
            q_rows[i] /= q_rows[i].sum()
    p_rows = [probs_from_logits(row, greedy) for row in logits]
    assert verify_greedy(logits, drafts) == verify_step(p_rows, drafts, q_rows, np.random.default_rng(seed))
    assert pick(logits[0], greedy, None) == sample(p_rows[0], np.random.default_rng(seed))
