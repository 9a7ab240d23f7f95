"""Shared test helpers. Tests build every file they need in tmp_path; nothing is downloaded."""

import numpy as np
import pytest


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)
