"""Start-up: the wall time of the commands that should answer at once, and of the imports `finnlite streamline`
needs before it reads the model.

Each command runs as a user runs it (the venv's ``finnlite`` script, a fresh interpreter), medians of 7 runs.
``streamline imports`` is a fresh interpreter importing what the streamline command imports (the CLI, the build
step and through it the pipeline, the verifier and the executor), ``import sympy`` what onnx_ir's import of sympy
would cost on its own (finnlite defers it: :mod:`finnlite.core.lazy`), and ``python -c pass`` the interpreter alone.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FINNLITE = Path(sys.executable).parent / "finnlite"

#: label -> (command, target in seconds or None)
COMMANDS = {
    "python -c pass": ([sys.executable, "-c", "pass"], None),
    "finnlite --help": ([str(FINNLITE), "--help"], 0.15),
    "finnlite --version": ([str(FINNLITE), "--version"], 0.15),
    "finnlite passes": ([str(FINNLITE), "passes"], 0.15),
    "streamline imports": ([sys.executable, "-c", "import finnlite.cli, finnlite.build"], 0.2),
    "import sympy": ([sys.executable, "-c", "import sympy"], None),
}


def _seconds(cmd: list[str]) -> tuple[float, bool]:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    return time.perf_counter() - t0, done.returncode == 0


def main(repeats: int = 7) -> None:
    print(f"== start-up: wall time of fresh commands (medians of {repeats})")
    print(f"  {'command':<22} {'seconds':>8} {'target':>7}")
    for label, (cmd, target) in COMMANDS.items():
        runs = [_seconds(cmd) for _ in range(repeats)]
        median = statistics.median(s for s, _ in runs)
        ok = "" if all(good for _, good in runs) else "  FAILED"
        print(f"  {label:<22} {median:8.3f} {f'{target:.2f}' if target else '':>7}{ok}")


if __name__ == "__main__":
    main()
