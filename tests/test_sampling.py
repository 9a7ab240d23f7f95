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
