"""Run every benchmark: ``python -m bench`` (``make bench``)."""

from __future__ import annotations

import importlib
import sys

MODULES = ["bench.bench_startup", "bench.bench_core", "bench.bench_executor", "bench.bench_pipeline"]


def main() -> int:
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
