"""fast/numba_rows.py against the oracle's row functions (tinyspec/ops.py): the same functions to float rounding,
batch-invariant bit for bit, and the oracle's answer for a call the kernels do not cover."""

import numpy as np
import pytest

from tinyspec import ops
from tinyspec.fast import numba_rows

RNG = np.random.default_rng(7)


def rows(*shape, scale=3.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


CASES = [  # (name, args builder): the shapes the model calls them with
    ("rms_norm", lambda x: (x, rows(x.shape[-1]), 1e-6)),
    ("l2_norm", lambda x: (x, 1e-6)),
    ("sigmoid", lambda x: (x,)),
    ("silu", lambda x: (x,)),
    ("softplus", lambda x: (x,)),
]


@pytest.mark.parametrize("name,args", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("shape", [(1, 320), (4, 320), (3, 5, 64), (2, 8, 32), (6, 1)])
def test_same_function_as_the_oracle_to_float_rounding(name, args, shape):
    a = args(rows(*shape))
    got, want = getattr(numba_rows, name)(*a), getattr(ops, name)(*a)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=4e-6, atol=1e-6)


@pytest.mark.parametrize("name,args", CASES, ids=[c[0] for c in CASES])
def test_batch_invariant_bit_for_bit(name, args):
    """Row t of a T-row call is the row a one-row call computes: the rows of a verify pass are those of T decodes."""
    a = args(rows(7, 5, 64))
    fn = getattr(numba_rows, name)
    whole = fn(*a)
    for t in range(7):
        np.testing.assert_array_equal(fn(a[0][t:t + 1], *a[1:])[0], whole[t])


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # the oracle's exp(1e4): inf, then 0 or 1
def test_extreme_values_match_the_oracle():
    x = np.array([[-1e4, -88.0, -20.0, 0.0, -0.0, 20.0, 88.0, 1e4]], np.float32)
    tiny = np.finfo(np.float32).tiny  # numba_rows.exp32 gives 0 below the smallest normal float (softplus(-88))
    for name in ("sigmoid", "silu", "softplus"):
        np.testing.assert_allclose(getattr(numba_rows, name)(x), getattr(ops, name)(x), rtol=4e-6, atol=tiny)


def test_exp32_is_within_one_ulp_of_the_exact_exp():
    """The vectorizable exp the row functions use: within 1 ulp of the float64 exp over the normal range (NumPy's
    float32 exp is within 2.3 here), 0 below it, inf above 88.72."""
    from numba import njit

    @njit
    def run(x):
        y = np.empty_like(x)
        for i in range(x.size):
            y[i] = numba_rows.exp32(x[i])
        return y

    x = np.linspace(-87.3, 88.7, 400_001).astype(np.float32)
    exact = np.exp(x.astype(np.float64))
    ulps = np.abs(run(x) - exact) / np.spacing(exact.astype(np.float32)).astype(np.float64)
    assert ulps.max() <= 1.0, ulps.max()
    edges = run(np.array([-1e4, -88.0, 89.0, 1e4, 0.0], np.float32))
    np.testing.assert_array_equal(edges, [0.0, 0.0, np.inf, np.inf, 1.0])
    z = np.zeros((2, 16), np.float32)  # a zero row: eps keeps the norm finite, as in the oracle
    np.testing.assert_array_equal(numba_rows.rms_norm(z, np.ones(16, np.float32), 1e-6), z)
    np.testing.assert_array_equal(numba_rows.l2_norm(z, 1e-6), z)


def test_views_and_empty_rows():
    x = rows(4, 64)[:, ::2]  # not C-contiguous
    np.testing.assert_allclose(numba_rows.rms_norm(x, np.ones(32, np.float32), 1e-6),
                               ops.rms_norm(x, np.ones(32, np.float32), 1e-6), rtol=4e-6, atol=1e-6)
    assert numba_rows.silu(np.zeros((0, 8), np.float32)).shape == (0, 8)
    assert numba_rows.l2_norm(np.zeros((0, 3, 8), np.float32), 1e-6).shape == (0, 3, 8)


def test_calls_the_kernels_do_not_cover_are_the_oracles():
    x64 = RNG.standard_normal((2, 16))  # float64: the oracle's function computes it
    np.testing.assert_array_equal(numba_rows.silu(x64), ops.silu(x64))
    x = rows(2, 16)
    w = rows(2, 16)  # a weight per element, not per column
    np.testing.assert_array_equal(numba_rows.rms_norm(x, w, 1e-6), ops.rms_norm(x, w, 1e-6))
