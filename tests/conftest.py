"""Shared test helpers. Tests build every file they need in tmp_path; nothing is downloaded."""

from pathlib import Path

import numpy as np
import pytest


def pytest_sessionstart(session):
    """A run of the suite on a cold Numba cache first compiles every cpu kernel, in one process per core
    (tinyspec.fast.warm), so that pytest-xdist's workers load the kernels from the disk cache instead of each
    compiling the same ones on its first call, one core each (docs/performance-log.md, 2026-11-27 evening).
    In the controlling process only, and only when no test file and no -k selects a part: a targeted run
    compiles just what it uses. A warm cache costs one file read."""
    config = session.config
    if hasattr(config, "workerinput") or config.option.keyword or \
            any(Path(arg.split("::")[0]).is_file() for arg in config.args):
        return
    try:
        from tinyspec.fast import warm
    except ImportError:  # no Numba: the cpu backend's tests skip
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    say = reporter.write_line if reporter is not None else print
    if seconds := warm.warm(say=say):
        say(f"kernels compiled in {seconds:.0f} s")


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
