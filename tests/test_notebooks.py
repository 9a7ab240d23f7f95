"""Every notebook in notebooks/ runs top to bottom, headless (nbclient), and is stored with its outputs.

The notebooks teach with the shipped model and models they build themselves, offline; each states its
claim in its first cell and asserts what is structural (bytes, passes, rows, tokens), so a notebook whose claim
stops holding fails here, not only in a reader's browser; timings it reports with whether the run bore them out
(tinyspec.fast.bench.claim), never asserts, so a busy machine cannot fail it. They are committed executed (tools/run_notebooks.py),
figures included, so the repository shows the measurements without running anything.
"""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 7, [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_with_the_outputs_of_one_run(path):
    """Every code cell was executed, in order, in one kernel (execution counts 1, 2, 3, ...), none failed, and
    a notebook that draws shows its figures (tools/run_notebooks.py writes them)."""
    nb = json.loads(path.read_text())
    code = [cell for cell in nb["cells"] if cell["cell_type"] == "code" and "".join(cell["source"]).strip()]
    assert [cell.get("execution_count") for cell in code] == list(range(1, len(code) + 1)), \
        f"{path.name}: run tools/run_notebooks.py {path.stem[:2]}"
    outputs = [out for cell in code for out in cell.get("outputs", [])]
    assert not [out for out in outputs if out.get("output_type") == "error"], f"{path.name} stored an error"
    draws = any("plt." in "".join(cell["source"]) for cell in code)
    figures = [out for out in outputs if "image/png" in out.get("data", {})]
    assert figures or not draws, f"{path.name} draws figures but stores none"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_runs_top_to_bottom(path, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat", reason="the nb extra runs the notebooks")
    nbclient = pytest.importorskip("nbclient", reason="the nb extra runs the notebooks")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    # one timing round where a notebook times several (07, 08: their ROUNDS): the same code and asserts; the
    # rounds only steady the medians a reader sees, and no test reads a timing
    monkeypatch.setenv("TINYSPEC_NOTEBOOK_ROUNDS", "1")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError (with the failing cell and traceback) on any error
