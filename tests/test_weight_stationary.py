"""tinyspec.fast.weight_stationary, the teaching kernel: the oracle's quant_linear on Q8_0 weights to float32
rounding, and batch-invariant (row t of a T-row call is bitwise the one-row result)."""

import numpy as np
import pytest

pytest.importorskip("numba")

from tinyspec.fast import weight_stationary  # noqa: E402
from tinyspec.ops import quant_linear  # noqa: E402
from tinyspec.quants import GGMLType, quantize  # noqa: E402


@pytest.mark.parametrize("out, n_in", [(1, 32), (37, 96), (256, 1024)])
def test_matches_the_oracle_and_is_batch_invariant(out, n_in):
    rng = np.random.default_rng(out)
    raw = quantize(rng.standard_normal((out, n_in)).astype(np.float32), GGMLType.Q8_0)
    x = rng.standard_normal((8, n_in)).astype(np.float32)
    y = weight_stationary.quant_linear(x, raw, GGMLType.Q8_0, (out, n_in))
    ref = quant_linear(x, raw, GGMLType.Q8_0, (out, n_in))
    scale = np.abs(ref).max()
    assert np.abs(y - ref).max() <= 1e-5 * max(scale, 1.0) * np.sqrt(n_in), np.abs(y - ref).max()
    for t in range(8):  # the same loop computes row t whatever else is in the call
        one = weight_stationary.quant_linear(x[t : t + 1], raw, GGMLType.Q8_0, (out, n_in))
        assert np.array_equal(one[0], y[t])


def test_refuses_what_it_does_not_read():
    raw = quantize(np.ones((2, 32), np.float32), GGMLType.Q8_0)
    with pytest.raises(ValueError, match="Q8_0 weights only"):
        weight_stationary.quant_linear(np.ones((1, 32), np.float32), raw, GGMLType.Q4_0, (2, 32))
    with pytest.raises(ValueError, match=r"x must be \[T, 32\]"):
        weight_stationary.quant_linear(np.ones((1, 31), np.float32), raw, GGMLType.Q8_0, (2, 32))
