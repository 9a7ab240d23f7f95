"""What the `serve` tests share (test_serve.py, test_serve_limits.py, test_serve_load.py): the shipped model on the
numpy oracle, the text a response shows for some ids, waiting for an idle server; GET as JSON and the process's RSS
are tools/serve_faults.py's."""

from __future__ import annotations

import functools
import sys
import time
from pathlib import Path

import tinyspec
from tinyspec.backends import load_model
from tinyspec.tokenizer import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from serve_faults import get, rss_mb  # noqa: F401 (re-exported: the measuring tool's GET and RSS, not a copy of them)

ASSETS = Path(tinyspec.__file__).resolve().parent / "assets"
TIMEOUT = 60  # seconds any one client call may take


@functools.cache
def target():
    model = load_model(ASSETS / "tiny-target.gguf", "numpy")
    return model, Tokenizer.from_gguf(model.metadata)


def shown(ids) -> str:
    """The text a response carries for these ids: an end-of-generation token ends it and is not printed."""
    _, tok = target()
    return tok.decode([t for t in ids if t not in tok.eog_ids])


def wait_idle(srv) -> dict:
    """/health once nothing runs or waits (a cancelled job leaves the engine between steps)."""
    t_end = time.monotonic() + TIMEOUT
    while time.monotonic() < t_end:
        health = get(srv, "/health")
        if health["slots_busy"] == 0 and health["waiting"] == 0 and srv.engine.done():
            return health
        time.sleep(0.05)
    raise AssertionError(f"the server did not go idle: {health}")
