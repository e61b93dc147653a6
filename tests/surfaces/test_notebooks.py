"""The notebooks in ``notebooks/`` run top to bottom (a broken notebook fails the suite).

They run with nbclient in a kernel of the interpreter running the tests (a kernelspec written to a temporary
folder, pointing at ``sys.executable``), so that a fresh virtual environment needs no registered Jupyter kernel;
the repository is on the kernel's ``PYTHONPATH`` and the working folder is a temporary one.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="notebook tests need nbformat (the dev extra)")
nbclient = pytest.importorskip("nbclient", reason="notebook tests need nbclient (the dev extra)")
pytest.importorskip("ipykernel", reason="notebook tests need ipykernel (the dev extra)")

from jupyter_client.kernelspec import KernelSpecManager  # noqa: E402 - after the skips
from jupyter_client.manager import KernelManager  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
KERNEL = "finnlite-tests"


def _kernel_manager(folder: Path) -> KernelManager:
    spec_dir = folder / "kernels" / KERNEL
    spec_dir.mkdir(parents=True)
    python_path = os.pathsep.join([str(REPO)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "finnlite tests", "language": "python",
            "env": {"PYTHONPATH": python_path, "MPLBACKEND": "agg"}}
    (spec_dir / "kernel.json").write_text(json.dumps(spec), encoding="utf-8")
    specs = KernelSpecManager(kernel_dirs=[str(folder / "kernels")])
    return KernelManager(kernel_name=KERNEL, kernel_spec_manager=specs)


def test_there_are_three_notebooks() -> None:
    assert [p.name for p in NOTEBOOKS] == ["01_quickstart.ipynb", "02_write_a_rule.ipynb", "03_bisection.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path: Path, tmp_path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    assert all(not cell.get("outputs") for cell in nb.cells if cell.cell_type == "code"), \
        f"{path.name} is committed with outputs; clear them"
    work = tmp_path / "work"
    work.mkdir()
    client = nbclient.NotebookClient(nb, timeout=300, km=_kernel_manager(tmp_path),
                                     resources={"metadata": {"path": str(work)}})
    client.execute()  # raises CellExecutionError naming the cell on any error
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    if path.stem != "02_write_a_rule":  # the last cell shows the report
        last = nb.cells[-1].outputs
        assert any("text/html" in o.get("data", {}) and o["data"]["text/html"].count("<svg") == 2 for o in last)
