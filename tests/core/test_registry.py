"""Every pass is registered once its package is imported, whatever is imported first (fresh interpreters)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize("first", ["import finnlite", "import streamline", "import finnlite.core.passes"])
def test_get_pass_after_importing_a_package(first: str) -> None:
    lookup = "import finnlite; print(finnlite.get_pass('LowerConvsToMatMul').__name__, len(finnlite.list_passes()))"
    if first == "import streamline":
        lookup = ("from finnlite.core.registry import get_pass, list_passes; "
                  "print(get_pass('LowerConvsToMatMul').__name__, len(list_passes()))")
    out = _run(f"{first}\n{lookup}")
    name, count = out.split()
    assert name == "LowerConvsToMatMul" and int(count) > 50


def test_import_finnlite_is_cheap_and_loads_the_core_on_use() -> None:
    out = _run("import sys, finnlite; print('onnx_ir' in sys.modules, 'streamline' in sys.modules); "
               "finnlite.Model; print('finnlite.core.model' in sys.modules)")
    assert out.split() == ["False", "False", "True"]


def test_core_names_stay_importable_from_finnlite() -> None:
    import finnlite
    from finnlite.core.model import Model
    from finnlite.core.passes import Rule

    assert finnlite.Model is Model and finnlite.Rule is Rule
    with pytest.raises(AttributeError):
        finnlite.NoSuchName  # noqa: B018


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["streamline", "--help"]])
def test_help_and_version_load_no_numerical_library(argv: list[str]) -> None:
    code = ("import sys\nfrom finnlite.cli import main\ntry:\n    main(" + repr(argv) + ")\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('numpy', 'onnx', 'onnx_ir', 'onnxruntime', 'streamline') if m in sys.modules))")
    assert _run(code).splitlines()[-1] == "[]"
