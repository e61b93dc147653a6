"""Deferred imports of heavy dependencies that load at start-up but serve only rare paths.

onnx_ir imports sympy (about 0.2 s, as much as the rest of a command's imports together) for arithmetic on
symbolic dimensions, which finnlite's commands never do: its core module imports sympy and its symbolic-shape
module, and only the latter uses sympy at import time. :func:`defer_sympy` puts a finder in front of the import
system that loads both with :class:`importlib.util.LazyLoader`: their first import binds a module object at once,
and the module runs on the first attribute access, wherever that happens. Modules already imported are left as
they are.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from typing import Any

#: the modules :func:`defer_sympy` defers
SYMPY_MODULES = frozenset({"sympy", "onnx_ir._symbolic_shapes"})


class DeferredFinder(importlib.abc.MetaPathFinder):
    """A meta path finder serving ``names`` through :class:`importlib.util.LazyLoader` (the module runs on first
    attribute access); every other name is left to the finders after it."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.names:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = importlib.util.LazyLoader(spec.loader)
        return spec


def defer_sympy() -> None:
    """Defer sympy and onnx_ir's use of it (module docstring); done once per process."""
    if any(isinstance(f, DeferredFinder) for f in sys.meta_path):
        return
    names = frozenset(n for n in SYMPY_MODULES if n not in sys.modules)
    if names:
        sys.meta_path.insert(0, DeferredFinder(names))
