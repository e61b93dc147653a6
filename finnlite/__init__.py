"""finnlite: a FINN-style streamlining frontend for QONNX models.

The package is a tower, every import pointing down: :mod:`finnlite.core` (model, datatypes, errors, passes), then
:mod:`custom_ops`, :mod:`streamline`, :mod:`verify`, and at the top the faces in this package (``finnlite.cli``,
``finnlite.build``, ``finnlite.config``, ``finnlite.report``, ``finnlite.cost``, ``finnlite.examples``).

``import finnlite`` is cheap: the core names below are loaded on first use. :func:`get_pass` and
:func:`list_passes` see every pass of the default pipeline (they import :mod:`streamline` on first call).
"""

from __future__ import annotations

import importlib
from typing import Any

from finnlite.core.lazy import defer_sympy

defer_sympy()  # onnx_ir imports sympy but finnlite never needs it at start-up (finnlite.core.lazy)

__version__ = "0.1.0"

#: public name -> the core module that defines it
_CORE_NAMES = {
    "Model": "model", "DataType": "datatypes", "BaseDataType": "datatypes",
    **{name: "errors" for name in ("FinnliteError", "ModelLoadError", "GraphError", "OpError", "DataTypeError",
                                   "PassError", "FixpointError", "ConfigError", "VerificationError")},
    **{name: "passes" for name in ("Pass", "Transformation", "AnalysisPass", "Rule", "Miss", "PassResult",
                                   "Stage", "PassManager")},
    "register_pass": "registry",
}

__all__ = [*_CORE_NAMES, "get_pass", "list_passes", "list_aliases", "__version__"]


def __getattr__(name: str) -> Any:
    module = _CORE_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'finnlite' has no attribute '{name}'")
    if name == "Model":  # a model reads and runs QONNX/FINN custom ops: register them (cheap, no onnxruntime)
        importlib.import_module("custom_ops")
    value = getattr(importlib.import_module(f"finnlite.core.{module}"), name)
    globals()[name] = value
    return value


def _register_all() -> Any:
    import streamline  # noqa: F401 - imports (and so registers) every pass of the pipeline
    from finnlite.core import registry

    return registry


def get_pass(name: str) -> Any:
    """The registered pass class called ``name`` (or the pass a FINN/qonnx alias stands for)."""
    return _register_all().get_pass(name)


def list_passes(group: str | None = None) -> list:
    """Every registered pass (of one group, if given), sorted by group and name."""
    return _register_all().list_passes(group)


def list_aliases() -> dict[str, str]:
    """Every FINN/qonnx name a pass covers, and the registered pass it stands for."""
    return _register_all().list_aliases()
