"""tinyspec.fast.kernel_cache: cached Numba kernels are dropped when the sources they inline change."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("numba")

from tinyspec.fast import kernel_cache  # noqa: E402

RUN = """
import numpy as np
from tinyspec.fast import numba_gdn
numba_gdn.causal_conv(np.ones((2, 8), np.float32), np.zeros((8, 3), np.float32), np.ones((8, 4), np.float32))
s = numba_gdn._causal_conv_ragged.stats  # the kernel the call dispatches (causal_conv is its one-sequence case)
print(sum(s.cache_hits.values()), sum(s.cache_misses.values()), s.cache_path)
"""


def run(cache_dir) -> tuple[int, int, str]:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache_dir))
    out = subprocess.run([sys.executable, "-c", RUN], env=env, capture_output=True, text=True, check=True).stdout
    hits, misses, path = out.split()
    return int(hits), int(misses), path


def test_a_changed_source_digest_drops_the_cached_kernels(tmp_path):
    hits, misses, path = run(tmp_path)
    assert (hits, misses) == (0, 1)  # a fresh cache: compiled, then saved
    assert run(tmp_path)[:2] == (1, 0)  # loaded from the cache
    stamp = os.path.join(path, kernel_cache.DIGEST_FILE)
    with open(stamp) as f:
        assert f.read() == kernel_cache.source_digest()
    with open(stamp, "w") as f:  # as if simd.py had changed since the kernels were cached
        f.write("0" * 40)
    assert run(tmp_path)[:2] == (0, 1)  # compiled again, not loaded
    with open(stamp) as f:
        assert f.read() == kernel_cache.source_digest()
    assert run(tmp_path)[:2] == (1, 0)


def test_sync_ignores_functions_without_a_cache():
    assert kernel_cache.sync(len) is False


def test_the_digest_covers_the_tables_kernels_freeze():
    """numba_ops compiles the I-quant grids and the FP4 table in as constants: an edit there must drop the
    cached kernels as an edit to simd.py does."""
    names = {p.relative_to(p.parent.parent).as_posix() for p in kernel_cache.source_files()}
    assert {"fast/simd.py", "fast/numba_ops.py", "quants/iq_grids.py", "quants/fp4.py"} <= names
    # every tinyspec module numba_ops imports is covered (asked in a fresh process: this one has imported the
    # wing's other modules, which compile nothing)
    code = ("import sys, tinyspec.fast.numba_ops\n"
            "print('\\n'.join(m.__file__ for n, m in sys.modules.items() if n.startswith('tinyspec.')"
            " and getattr(m, '__file__', None) and n.split('.')[1] in ('fast', 'quants', 'ops')))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    imported = {Path(line).resolve() for line in run.stdout.split()}
    assert any(p.name == "numba_ops.py" for p in imported)
    assert imported <= set(kernel_cache.source_files())


def test_is_cold_until_a_kernel_is_cached(tmp_path):
    from types import SimpleNamespace

    hits, misses, path = run(tmp_path)  # compiles numba_gdn's conv and caches it under tmp_path
    cached = SimpleNamespace(stats=SimpleNamespace(cache_path=path))
    empty = SimpleNamespace(stats=SimpleNamespace(cache_path=str(tmp_path / "nothing-here")))
    assert not kernel_cache.is_cold(cached) and kernel_cache.is_cold(empty)
    assert kernel_cache.is_cold(len) is False  # not a caching dispatcher: nothing to say
