"""Execute notebooks in place, storing their outputs (``make notebooks``), so that they read with their pictures
wherever a notebook is shown without being run.

Each notebook runs top to bottom in a kernel of this interpreter (a kernelspec in a temporary folder pointing at
``sys.executable``: no registered Jupyter kernel needed), with the repository importable and a temporary working
folder; an error in any cell stops and nothing is written. ``FINNLITE_ZOO`` defaults to ``../shared/zoo`` beside the
checkout when that exists: the notebooks use the zoo's models where it has them, the bundled example otherwise.

Usage: ``python notebooks/execute.py notebooks/*.ipynb``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KERNEL = "finnlite-notebooks"


def kernel_manager(folder: Path, env: dict[str, str] | None = None):
    """A jupyter KernelManager for a kernel of this interpreter, its spec written under ``folder``; ``env`` is added
    to the kernel's environment (the repository is on its ``PYTHONPATH``)."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    spec_dir = folder / "kernels" / KERNEL
    spec_dir.mkdir(parents=True, exist_ok=True)
    python_path = os.pathsep.join([str(REPO)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "finnlite", "language": "python",
            "env": {"PYTHONPATH": python_path, "MPLBACKEND": "agg", **(env or {})}}
    (spec_dir / "kernel.json").write_text(json.dumps(spec), encoding="utf-8")
    return KernelManager(kernel_name=KERNEL, kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(folder / "kernels")]))


def default_env() -> dict[str, str]:
    """``FINNLITE_ZOO``: as set, else ``../shared/zoo`` beside the checkout if it exists."""
    zoo = os.environ.get("FINNLITE_ZOO") or str(REPO.parent / "shared" / "zoo")
    return {"FINNLITE_ZOO": zoo} if Path(zoo).is_dir() else {}


def execute(path: Path, env: dict[str, str] | None = None, timeout: int = 600):
    """Run the notebook at ``path`` and return it with its outputs (the file is not touched)."""
    import nbclient
    import nbformat

    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "work"
        work.mkdir()
        client = nbclient.NotebookClient(nb, timeout=timeout, km=kernel_manager(Path(tmp), env),
                                         resources={"metadata": {"path": str(work)}})
        client.execute()
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    return nb


def main(argv: list[str]) -> int:
    import nbformat

    env = default_env()
    for name in argv:
        path = Path(name)
        nb = execute(path, env)
        nbformat.write(nb, path)
        print(f"executed {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
