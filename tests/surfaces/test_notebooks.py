"""The notebooks in ``notebooks/``: committed executed (outputs stored, pictures included, so that they read where
they are shown without running), and they run top to bottom now (a broken notebook fails the suite).

They run with ``notebooks/execute.py`` (what ``make notebooks`` runs): a kernel of the interpreter running the
tests (a kernelspec in a temporary folder pointing at ``sys.executable``), the repository on its ``PYTHONPATH``, a
temporary working folder. With the zoo (``FINNLITE_ZOO``) the first notebook streamlines its CNV; without, the
bundled example: a fresh clone runs them too.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="notebook tests need nbformat (the dev extra)")
pytest.importorskip("nbclient", reason="notebook tests need nbclient (the dev extra)")
pytest.importorskip("ipykernel", reason="notebook tests need ipykernel (the dev extra)")

from tests.zoo import zoo_available, zoo_dir  # noqa: E402 - after the skips

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def _runner():
    spec = importlib.util.spec_from_file_location("notebooks_execute", REPO / "notebooks" / "execute.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _outputs(nb) -> list[dict]:
    return [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]


def test_there_are_three_notebooks() -> None:
    assert [p.name for p in NOTEBOOKS] == ["01_quickstart.ipynb", "02_write_a_rule.ipynb", "03_bisection.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_committed_executed(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    counts = [cell.get("execution_count") for cell in code]
    assert all(counts) and counts == sorted(counts), f"{path.name}: run it with 'make notebooks' ({counts})"
    assert not [o for o in _outputs(nb) if o.get("output_type") == "error"]
    if path.stem == "01_quickstart":  # the pictures: op histogram, bit widths before and after, the staircase
        svgs = [o for o in _outputs(nb) if "image/svg+xml" in o.get("data", {})]
        assert len(svgs) >= 4
        assert any("MultiThreshold" in o["data"]["image/svg+xml"] and "fl-points" in o["data"]["image/svg+xml"]
                   for o in svgs)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path: Path) -> None:
    env = {"FINNLITE_ZOO": str(zoo_dir())} if zoo_available() else {"FINNLITE_ZOO": str(REPO / "no-zoo")}
    nb = _runner().execute(path, env, timeout=300)  # raises CellExecutionError naming the cell on any error
    assert not [o for o in _outputs(nb) if o.get("output_type") == "error"]
    if path.stem != "02_write_a_rule":  # the last cell shows the report, with both graphs
        last = nb.cells[-1].outputs
        assert any("text/html" in o.get("data", {}) and o["data"]["text/html"].count('class="fl-graph"') == 2
                   for o in last)
    if path.stem == "01_quickstart":
        text = "".join(o.get("text", "") for o in _outputs(nb))
        assert ("cnv_2w2a from the model zoo" if zoo_available() else "the bundled TFC example") in text


def test_quickstart_runs_without_the_zoo() -> None:
    """A fresh clone has no zoo: the quickstart then streamlines the bundled example (with the zoo present, the
    test above ran it on the zoo's CNV)."""
    if not zoo_available():
        pytest.skip("without the zoo, test_notebook_runs already ran the quickstart on the bundled example")
    nb = _runner().execute(REPO / "notebooks" / "01_quickstart.ipynb", {"FINNLITE_ZOO": str(REPO / "no-zoo")},
                           timeout=300)
    assert "the bundled TFC example" in "".join(o.get("text", "") for o in _outputs(nb))
