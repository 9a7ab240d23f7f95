"""Shared test helpers. Tests build every file they need in tmp_path; nothing is downloaded."""

import numpy as np
import pytest


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


@pytest.fixture(scope="session")
def load_tool():
    """load_tool("train_tiny") -> tools/train_tiny.py as a module (the tools are scripts, not a package); loaded
    once, registered in sys.modules as a plain import would be (dataclasses look their module up there)."""
    import importlib.util
    import sys
    from pathlib import Path

    tools = Path(__file__).resolve().parents[1] / "tools"

    def load(name: str):
        if name not in sys.modules:
            spec = importlib.util.spec_from_file_location(name, tools / f"{name}.py")
            module = sys.modules[name] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        return sys.modules[name]

    return load
