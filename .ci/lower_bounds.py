"""Print a pip constraints file pinning every dependency of pyproject.toml to its lower bound (``name>=v`` → ``name==v``).

CI installs finnlite with these pins in a virtual environment of its own and runs the quick tests, so the declared
minimum versions are versions that work. A dependency without a ``>=`` bound is an error: every one must have one.
Usage: ``python .ci/lower_bounds.py [pyproject.toml] > constraints.txt``.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path


def lower_bounds(pyproject: Path) -> list[str]:
    """``name==version`` for each dependency of ``[project] dependencies``, in the file's order."""
    deps = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["dependencies"]
    pins = []
    for dep in deps:
        found = re.fullmatch(r"\s*([A-Za-z0-9_.\-]+)\s*>=\s*([0-9][A-Za-z0-9_.]*)\s*(,.*)?", dep)
        if found is None:
            raise SystemExit(f"{pyproject}: dependency '{dep}' has no '>=' lower bound")
        pins.append(f"{found.group(1)}=={found.group(2)}")
    return pins


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "pyproject.toml"
    print("\n".join(lower_bounds(path)))
