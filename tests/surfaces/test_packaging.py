"""Packaging: metadata a package index shows, and the lower bounds that CI installs exactly."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def test_metadata_is_complete_and_the_license_an_spdx_string() -> None:
    import finnlite

    project = PYPROJECT["project"]
    assert project["license"] == "BSD-3-Clause" and (REPO / "LICENSE").is_file()
    assert not any(c.startswith("License ::") for c in project["classifiers"])  # SPDX: no license classifier
    assert project["authors"] and project["classifiers"] and project["requires-python"] == ">=3.11"
    assert "version" in project["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "finnlite.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", finnlite.__version__)
    build = PYPROJECT["build-system"]["requires"]
    assert any(re.fullmatch(r"setuptools>=(\d+)", r) and int(r.split(">=")[1]) >= 77 for r in build)


def test_the_lower_bounds_are_pinned_for_ci() -> None:
    out = subprocess.run([sys.executable, str(REPO / ".ci" / "lower_bounds.py"), str(REPO / "pyproject.toml")],
                         capture_output=True, text=True, check=True).stdout.split()
    deps = PYPROJECT["project"]["dependencies"]
    assert out == [d.split(",")[0].replace(">=", "==") for d in deps]  # an upper bound is not a pin
    assert all(re.fullmatch(r"[A-Za-z0-9_.\-]+==[0-9][0-9A-Za-z.]*", pin) for pin in out)
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert "make test\n" in ci and "make test-lower-bounds" in ci
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    assert "lower_bounds.py" in makefile and "-c $(LOWER_VENV)/constraints.txt" in makefile
