"""What the `serve` tests share (test_serve.py, test_serve_limits.py, test_serve_load.py): the shipped model on the
numpy oracle, the text a response shows for some ids, GET as JSON, waiting for an idle server, the process's RSS."""

from __future__ import annotations

import functools
import http.client
import json
import re
import time
from pathlib import Path

import tinyspec
from tinyspec.backends import load_model
from tinyspec.tokenizer import Tokenizer

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


def get(srv, path: str) -> dict:
    conn = http.client.HTTPConnection(srv.host, srv.port, timeout=TIMEOUT)
    try:
        conn.request("GET", path)
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


def wait_idle(srv) -> dict:
    """/health once nothing runs or waits (a cancelled job leaves the engine between steps)."""
    t_end = time.monotonic() + TIMEOUT
    while time.monotonic() < t_end:
        health = get(srv, "/health")
        if health["slots_busy"] == 0 and health["waiting"] == 0 and srv.engine.done():
            return health
        time.sleep(0.05)
    raise AssertionError(f"the server did not go idle: {health}")


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1)) / 1024
