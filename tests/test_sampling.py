"""Sampling: greedy is one-hot, top-k/top-p truncate as documented, draws follow the probabilities."""

import numpy as np
import pytest

from tinyspec.sampling import SamplingParams, probs_from_logits, sample


def test_greedy_is_one_hot_lowest_id_on_ties():
    probs = probs_from_logits(np.array([1.0, 3.0, 3.0, -2.0]), SamplingParams())
    np.testing.assert_array_equal(probs, [0, 1, 0, 0])


def test_temperature_softmax():
    logits = np.log(np.array([0.1, 0.2, 0.7]))
    np.testing.assert_allclose(probs_from_logits(logits, SamplingParams(1.0)), [0.1, 0.2, 0.7], rtol=1e-12)
    sharp = probs_from_logits(logits, SamplingParams(0.5))
    np.testing.assert_allclose(sharp, np.array([0.01, 0.04, 0.49]) / 0.54, rtol=1e-12)


def test_top_k_and_top_p():
    logits = np.log(np.array([0.05, 0.15, 0.3, 0.5]))
    np.testing.assert_allclose(probs_from_logits(logits, SamplingParams(1.0, top_k=2)), [0, 0, 0.375, 0.625])
    # top_p = 0.7: 0.5 (mass before 0) then 0.3 (mass before 0.5 < 0.7) are kept; 0.15 has 0.8 before it
    np.testing.assert_allclose(probs_from_logits(logits, SamplingParams(1.0, top_p=0.7)), [0, 0, 0.375, 0.625])
    np.testing.assert_allclose(probs_from_logits(logits, SamplingParams(1.0, top_p=0.1)), [0, 0, 0, 1])


def test_sample_frequencies_match_probs():
    probs = np.array([0.1, 0.0, 0.6, 0.3])
    rng = np.random.default_rng(0)
    counts = np.bincount([sample(probs, rng) for _ in range(20000)], minlength=4)
    assert counts[1] == 0
    np.testing.assert_allclose(counts / counts.sum(), probs, atol=0.015)


@pytest.mark.parametrize("kw", [{"temperature": -1}, {"temperature": float("nan")}, {"top_k": -1}, {"top_p": 0}, {"top_p": 1.5}])
def test_bad_params(kw):
    with pytest.raises(ValueError):
        SamplingParams(**kw)


def test_draft_probability_is_the_drafters_confidence():
    """Greedy: the softmax probability of the largest logit (in the logits' float32, to a few ulps; no
    overflow at large logits); sampled: q of the drawn token."""
    from tinyspec.sampling import draft_probability

    logits = np.array([1000.0, 999.0, -5.0], np.float32)
    p = np.exp(logits.astype(np.float64) - 1000.0)
    assert abs(draft_probability(logits, 0, None) - p[0] / p.sum()) < 4 * 2.0**-24
    q = np.array([0.1, 0.7, 0.2])
    assert draft_probability(logits, 2, q) == 0.2


@pytest.mark.parametrize("temperature", [1e-308, 1e-300, 5e-324, 1e-30])
def test_a_tiny_temperature_is_a_proper_law_one_hot_on_the_argmax(temperature):
    """The bug: z = logits / temperature overflowed at temperature 1e-308 (every |logit| > 1.8 becomes +-inf),
    z - z.max() was inf - inf = NaN, and the server, drawing from a NaN law, emitted <|endoftext|>. Subtracting the
    max before dividing keeps every z <= 0: a law with no NaN that sums to 1, one-hot on the argmax, uniform over
    tied maxima (the limit as the temperature goes to 0 from above), with top-k and top-p still applied."""
    logits = np.array([2.5, 7.0, -3.0, 6.999, 5.0])
    for params, expected in ((SamplingParams(temperature), [0, 1, 0, 0, 0]),
                             (SamplingParams(temperature, top_k=2), [0, 1, 0, 0, 0]),
                             (SamplingParams(temperature, top_p=0.5), [0, 1, 0, 0, 0])):
        probs = probs_from_logits(logits, params)
        assert not np.isnan(probs).any() and probs.sum() == 1.0
        np.testing.assert_array_equal(probs, expected)
    ties = probs_from_logits(np.array([1.0, 300.0, 300.0, -2.0], np.float32), SamplingParams(temperature))
    np.testing.assert_array_equal(ties, [0, 0.5, 0.5, 0])
    one = probs_from_logits(np.array([1.0, 300.0, 300.0, -2.0]), SamplingParams(temperature, top_p=0.5))
    np.testing.assert_array_equal(one, [0, 1, 0, 0])  # top-p keeps the first of the tied pair (a stable sort)
    np.testing.assert_array_equal(probs_from_logits(np.array([-1e30, 1e30]), SamplingParams(temperature)), [0, 1])

