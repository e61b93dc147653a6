"""Run every benchmark: ``python -m bench`` (``make bench``).

The project's modules are compiled to bytecode first, as an installed package has them: an editable install under
``PYTHONDONTWRITEBYTECODE`` would otherwise compile about a hundred modules in every command it times (about 0.25 s
of each command's start-up on a 2-core machine)."""

from __future__ import annotations

import compileall
import importlib
import sys
from pathlib import Path

PACKAGES = ("finnlite", "custom_ops", "streamline", "verify")

MODULES = ["bench.bench_startup", "bench.bench_core", "bench.bench_executor", "bench.bench_pipeline"]


def main() -> int:
    repo = Path(__file__).resolve().parents[1]
    if not all(compileall.compile_dir(repo / p, quiet=1) for p in PACKAGES):
        print("== bytecode compilation failed; the timings include compiling the project", flush=True)
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                print(f"== {name}: not present", flush=True)
                continue
            raise
        module.main()
        print(flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
