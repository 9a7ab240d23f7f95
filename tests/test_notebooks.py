"""Every notebook in notebooks/ runs top to bottom, headless (nbclient), and is stored without outputs.

The notebooks teach with the shipped model and models they build themselves, offline; each states its
claim in its first cell and asserts the measurement that supports it, so a notebook whose claim stops
holding fails here, not only in a reader's browser.
"""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 7, [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_without_outputs(path):
    nb = json.loads(path.read_text())
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [] and cell.get("execution_count") is None, f"{path.name} cell {i} has outputs"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_runs_top_to_bottom(path, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat", reason="the nb extra runs the notebooks")
    nbclient = pytest.importorskip("nbclient", reason="the nb extra runs the notebooks")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError (with the failing cell and traceback) on any error
