"""Execute the notebooks and store them with their outputs, figures included, so they read on the web.

    python tools/run_notebooks.py                  # every notebooks/*.ipynb, in place
    python tools/run_notebooks.py 04 07            # the ones whose name starts with these

Each notebook runs top to bottom in a fresh kernel (nbclient; the `nb` extra), with the notebooks/ folder as
its working directory's neighbour (a temporary folder: files a notebook writes do not land in the repository),
and is written back with every cell's output. Cell timing metadata is not recorded, so a re-run changes only
what the code printed. tests/test_notebooks.py re-executes every notebook (its asserts back every measured
sentence) and checks the stored copies carry the outputs of one top-to-bottom run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def run(path: Path, timeout: int = 900) -> float:
    """Execute `path` in a fresh python3 kernel and write it back with its outputs; returns the seconds taken."""
    import nbclient
    import nbformat

    nb = nbformat.read(path, as_version=4)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as cwd:
        client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                                         resources={"metadata": {"path": cwd}})
        client.execute()  # raises CellExecutionError (with the failing cell and traceback) on any error
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    nbformat.write(nb, path)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", help="run only the notebooks whose file name starts with one of these")
    p.add_argument("--timeout", type=int, default=900, help="seconds a cell may take (default 900)")
    args = p.parse_args(argv)
    paths = sorted(NOTEBOOKS.glob("*.ipynb"))
    if args.names:
        paths = [q for q in paths if q.name.startswith(tuple(args.names))]
        if not paths:
            print(f"no notebook in {NOTEBOOKS} starts with {', '.join(args.names)}", file=sys.stderr)
            return 2
    for path in paths:
        print(f"{path.name}: running ...", end=" ", flush=True)
        print(f"stored with outputs ({run(path, args.timeout):.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
