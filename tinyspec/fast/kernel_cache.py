"""Drop cached Numba kernels when code they were compiled from has changed.

Numba's `cache=True` keys a cached kernel by its own source file's timestamp and size. Our kernels
inline the LLVM intrinsics of `simd.py` and helpers from their sibling modules, so after an edit there
(or a `git pull` that touches only `simd.py`) Numba would keep loading the old machine code, silently.
The same holds for tables a kernel freezes as constants when it compiles (quants/iq_grids.py's grids).
So the kernel modules call `sync(dispatcher)` once at import, before anything is compiled or loaded:
it hashes the sources kernels depend on (source_files: fast/'s kernel modules, quants/, ops.py) and compares the digest
with the one stored in the cache directory; on a mismatch it deletes the cached kernels there (`*.nbi`
index and `*.nbc` data files) and stores the new digest. The cost is one sha1 over those sources per
process, negligible beside loading a kernel (docs/performance-log.md old 34).

The cache directory is the one Numba uses for these modules (`__pycache__` beside them, or under
NUMBA_CACHE_DIR); it holds only this package's kernels. If it cannot be written, nothing is deleted
and Numba behaves as before.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

DIGEST_FILE = "tinyspec-kernel-sources.sha1"
PACKAGE = Path(__file__).resolve().parent.parent  # tinyspec/


def source_files() -> list[Path]:
    """What compiled kernels depend on: the Numba kernel modules and simd.py (the wing's other modules, adaptive.py,
    bench.py..., compile nothing), and the modules whose tables and constants they freeze at compile time (quants/:
    the I-quant grids, fp4's E8M0 table; ops.py: X_Q8_0)."""
    fast = PACKAGE / "fast"
    return sorted([*fast.glob("numba_*.py"), fast / "simd.py", fast / "kernel_cache.py", fast / "__init__.py",
                   *PACKAGE.joinpath("quants").glob("*.py"), PACKAGE / "ops.py"])


def source_digest() -> str:
    """sha1 over the names and bytes of source_files(), in order, and TINYSPEC_SIMD (which selects the
    instructions simd.py emits)."""
    h = hashlib.sha1(os.environ.get("TINYSPEC_SIMD", "").encode())
    for path in source_files():
        h.update(path.relative_to(PACKAGE).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def sync(dispatcher) -> bool:
    """Make the cache directory of `dispatcher` (a Numba function with cache=True) match the current
    sources; returns True when stale kernels were deleted."""
    try:
        cache_dir = Path(dispatcher.stats.cache_path)
    except AttributeError:  # not a caching dispatcher
        return False
    stamp = cache_dir / DIGEST_FILE
    digest = source_digest()
    try:
        if stamp.read_text() == digest:
            return False
    except OSError:  # no digest yet: a fresh cache, or one written before this check existed
        pass
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        stale = [p for pattern in ("*.nbi", "*.nbc") for p in cache_dir.glob(pattern)]
        for p in stale:
            p.unlink(missing_ok=True)
        stamp.write_text(digest)
    except OSError:  # a read-only install: leave the cache to Numba
        return False
    return bool(stale)


def is_cold(dispatcher) -> bool:
    """No kernel of `dispatcher`'s module is cached yet: its first calls will compile (seconds each)."""
    try:
        return not any(Path(dispatcher.stats.cache_path).glob("*.nbi"))
    except (AttributeError, OSError):
        return False
