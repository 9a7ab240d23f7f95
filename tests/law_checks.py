"""A chi-square check that sampled outcomes follow an exact law, shared by the sampled-speculation tests."""

# the 99.9% quantile of the chi-square distribution with `key` degrees of freedom
CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32, 8: 26.12, 9: 27.88, 10: 29.59,
            11: 31.26, 12: 32.91, 13: 34.53, 14: 36.12, 15: 37.70}


def assert_counts_follow(counts: dict, exact: dict, n_runs: int, min_cells: int = 1) -> None:
    """counts[outcome] over n_runs draws against exact[outcome] probabilities: no outcome the law gives 0, then
    Pearson's chi-square over the cells expecting >= 5 draws (the rare ones pooled into one) below its 99.9%
    quantile; min_cells: the fewest cells a test with some power needs."""
    assert set(counts) <= set(exact), "a token pair the target gives probability 0"
    cells = sorted(exact, key=lambda c: -exact[c])
    big = [c for c in cells if exact[c] * n_runs >= 5]  # pool the rare cells so every expected count is >= 5
    observed = [counts.get(c, 0) for c in big] + [n_runs - sum(counts.get(c, 0) for c in big)]
    expected = [exact[c] * n_runs for c in big] + [n_runs * (1 - sum(exact[c] for c in big))]
    if expected[-1] < 5:
        observed[-2] += observed.pop()
        expected[-2] += expected.pop()
    assert len(expected) >= min_cells
    chi2 = sum((o - e) ** 2 / e for o, e in zip(observed, expected))
    assert chi2 < CHI2_999[len(expected) - 1], (chi2, list(zip(observed, expected)))
