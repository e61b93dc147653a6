"""Benchmark the executor on the model zoo against qonnx's execute_onnx and a plain onnxruntime session.

For each zoo model: the executor's time per inference (after warm-up), qonnx ``execute_onnx``'s, and a plain
onnxruntime session (default options: all graph optimizations, prepacking) over the equivalent standard-op graph
(``Executor.standard_model()``: custom ops lowered, constants folded), the ratios, and whether executor and qonnx
agree bit for bit. Timings are medians over interleaved rounds (executor, plain session and qonnx take turns), so
that a noisy machine slows all three alike.

``--study`` compares onnxruntime session options for the executor's regions instead: for each option set, whether
the executor's outputs are bit-identical to qonnx on each zoo model, as exported and with its activation
quantizers replaced by Identity ("float-exposed": no quantizer absorbs float differences), and the time.

Usage: ``PYTHONPATH=. python bench/bench_executor.py [--models tfc_1w1a ...] [--rounds 5] [--study]``
(the zoo is read from ``$FINNLITE_ZOO``, default ``<repo>/../shared/zoo``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import custom_ops.plan as plan_module  # noqa: E402
from custom_ops.executor import Executor  # noqa: E402
from finnlite.core.compat import fix_ir_version  # noqa: E402
from tests.qonnx_ref import qonnx_execute  # noqa: E402
from tests.zoo import (ZOO_MODELS, float_exposed, manifest, random_input, zoo_available, zoo_dir,  # noqa: E402
                       zoo_model_path)


def timed(fn: Callable[[], Any], calls: int) -> list[float]:
    """Seconds of each of ``calls`` calls of ``fn``."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def plain_session(model: onnx.ModelProto, threads: int | None) -> Any:
    """An onnxruntime session with default options (all graph optimizations, prepacking)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if threads is not None:
        opts.intra_op_num_threads = threads
    return ort.InferenceSession(fix_ir_version(model).SerializeToString(), sess_options=opts,
                                providers=["CPUExecutionProvider"])


def bench(models: list[str], rounds: int, calls: int, threads: int | None) -> None:
    print(f"{'model':<18} {'executor ms':>11} {'qonnx ms':>9} {'plain ort ms':>12} {'qonnx/exec':>10} "
          f"{'exec/ort':>8}  bit-exact  plan steps")
    for name in models:
        model = onnx.load(str(zoo_model_path(name)))
        ex = Executor(model, threads=threads)
        feeds = {ex.input_names[0]: random_input(name, seed=0)}
        ref = qonnx_execute(model, feeds)
        exact = all(np.array_equal(ref[k].view(np.uint32), v.view(np.uint32)) for k, v in ex.run(feeds).items())
        session = plain_session(ex.standard_model(), threads)
        timed(lambda: ex.run(feeds), 3)
        timed(lambda: session.run(None, feeds), 3)
        t_exec: list[float] = []
        t_ort: list[float] = []
        t_qonnx: list[float] = []
        for _ in range(rounds):
            t_exec += timed(lambda: ex.run(feeds), calls)
            t_ort += timed(lambda: session.run(None, feeds), calls)
            t_qonnx += timed(lambda: qonnx_execute(model, feeds), 1)
        e, o, q = (statistics.median(t) for t in (t_exec, t_ort, t_qonnx))
        steps = len(ex.describe().splitlines()) - 1
        print(f"{name:<18} {e * 1e3:11.2f} {q * 1e3:9.1f} {o * 1e3:12.2f} {q / e:10.1f} {e / o:8.2f}  "
              f"{'yes' if exact else 'NO':<9}  {steps}")


def _options(level: str, prepacking: bool) -> Callable[[int | None], Any]:
    import onnxruntime as ort

    def make(threads: int | None = None) -> Any:
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        if not prepacking:
            opts.add_session_config_entry("session.disable_prepacking", "1")
        if threads is not None:
            opts.intra_op_num_threads = threads
        return opts

    return make


def study(models: list[str], calls: int, threads: int | None) -> None:
    variants = [(level, prepack) for level in ("ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED",
                                               "ORT_ENABLE_ALL") for prepack in (False, True)]
    original = plan_module.session_options
    print(f"{'model':<18} {'level':<20} {'prepacking':<10} {'exact':<6} {'float-exposed exact':<20} {'ms':>8}")
    for name in models:
        model = onnx.load(str(zoo_model_path(name)))
        exposed = float_exposed(model)
        in_name = Executor(model).input_names[0]
        inputs = [{in_name: random_input(name, seed=s)} for s in range(2)]
        refs = {id(m): [qonnx_execute(m, x) for x in inputs] for m in (model, exposed)}
        for level, prepack in variants:
            plan_module.session_options = _options(level, prepack)
            try:
                verdicts = []
                for m in (model, exposed):
                    ex = Executor(m, threads=threads)
                    verdicts.append(all(np.array_equal(r[k].view(np.uint32), v.view(np.uint32))
                                        for x, r in zip(inputs, refs[id(m)]) for k, v in ex.run(x).items()))
                ex = Executor(model, threads=threads)
                timed(lambda: ex.run(inputs[0]), 3)
                ms = statistics.median(timed(lambda: ex.run(inputs[0]), calls)) * 1e3
            finally:
                plan_module.session_options = original
            print(f"{name:<18} {level:<20} {'on' if prepack else 'off':<10} {'yes' if verdicts[0] else 'NO':<6} "
                  f"{'yes' if verdicts[1] else 'NO':<20} {ms:8.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=list(ZOO_MODELS), choices=list(ZOO_MODELS))
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (one qonnx run per round)")
    parser.add_argument("--calls", type=int, default=10, help="executor / onnxruntime calls per round")
    parser.add_argument("--threads", type=int, default=None, help="onnxruntime intra-op threads")
    parser.add_argument("--study", action="store_true", help="compare session options for exactness and speed")
    args = parser.parse_args(argv)
    if not zoo_available():
        print(f"model zoo not found at {zoo_dir()} (set FINNLITE_ZOO)", file=sys.stderr)
        return 2
    manifest()
    if args.study:
        study(args.models, args.calls, args.threads)
    else:
        bench(args.models, args.rounds, args.calls, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
