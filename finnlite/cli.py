"""The ``finnlite`` command.

``finnlite streamline IN.onnx -o OUT.onnx`` runs the default pipeline and prints a summary; ``finnlite info MODEL``
prints the op histogram and datatypes; ``finnlite passes`` lists the registered passes and stages. A user mistake
(bad file, bad option) prints one line and exits with code 2; a failed verification exits with code 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from finnlite.errors import FinnliteError, ModelLoadError

log = logging.getLogger("finnlite")


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # usage errors: one line and exit code 2
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


class _Progress:
    """A pass-manager hook that reports each stage on stderr as it starts and ends."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.t0 = 0.0

    def before_stage(self, stage: Any, model: Any) -> None:
        self.t0 = time.perf_counter()
        if self.enabled:
            print(f"  [{stage.name}] {len(model)} nodes ...", file=sys.stderr, flush=True)

    def after_stage(self, stage: Any, model: Any) -> None:
        if self.enabled:
            print(f"  [{stage.name}] done in {time.perf_counter() - self.t0:.2f} s, {len(model)} nodes",
                  file=sys.stderr, flush=True)


def _histogram_table(before: dict[str, int], after: dict[str, int]) -> list[str]:
    ops = sorted(set(before) | set(after), key=lambda o: (-after.get(o, 0), -before.get(o, 0), o))
    width = max([len(o) for o in ops] + [7])
    lines = [f"  {'op':<{width}}  before  after"]
    lines += [f"  {o:<{width}}  {before.get(o, 0):>6}  {after.get(o, 0):>5}" for o in ops]
    lines.append(f"  {'total':<{width}}  {sum(before.values()):>6}  {sum(after.values()):>5}")
    return lines


def _check_output_path(inp: Path, out: Path) -> None:
    if out.exists() and out.resolve() == inp.resolve():
        raise ModelLoadError("refusing to overwrite the input model; choose another output path", file=str(out))
    if not (out.parent if str(out.parent) else Path(".")).is_dir():
        raise ModelLoadError("the output folder does not exist", file=str(out))


def cmd_streamline(args: argparse.Namespace) -> int:
    from finnlite.model import Model
    from streamline.pipeline import streamline_model

    inp, out = Path(args.input), Path(args.output)
    _check_output_path(inp, out)
    t0 = time.perf_counter()
    model = Model(inp)
    t_load = time.perf_counter() - t0
    progress = _Progress(enabled=not args.json)
    result = streamline_model(model, hooks=[progress], only=args.stages)
    t1 = time.perf_counter()
    model.save(out)
    t_save = time.perf_counter() - t1
    summary = {
        "input": str(inp), "output": str(out),
        "nodes_before": sum(result.histogram_before.values()), "nodes_after": sum(result.histogram_after.values()),
        "ops_before": result.histogram_before, "ops_after": result.histogram_after,
        "seconds": {"load": t_load, **result.report.stage_seconds, "save": t_save},
        "unapplied": [f"{m.rule} at {m.node}: {m.reason}" for m in result.report.misses],
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"finnlite streamline: {inp} -> {out}")
    print(f"stages: {', '.join(result.stages)}")
    print("\n".join(_histogram_table(result.histogram_before, result.histogram_after)))
    times = ", ".join(f"{k} {v:.2f} s" for k, v in summary["seconds"].items())
    print(f"time: {times} (total {time.perf_counter() - t0:.2f} s)")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from finnlite.model import Model

    model = Model(args.model)
    hist = model.op_histogram()
    print(f"{args.model}: {len(model)} nodes, inputs {model.input_names}, outputs {model.output_names}")
    for op, n in hist.items():
        print(f"  {op:<24} {n:>5}")
    dts: dict[str, int] = {}
    for v in list(model.graph.initializers.values()) + [o for n in model.graph for o in n.outputs]:
        if model.has_tensor_datatype(v.name):
            name = model.get_tensor_datatype(v.name).name
            dts[name] = dts.get(name, 0) + 1
    if dts:
        print("datatype annotations: " + ", ".join(f"{k} x{v}" for k, v in sorted(dts.items())))
    return 0


def cmd_passes(args: argparse.Namespace) -> int:
    from finnlite.passes import list_passes
    from streamline.pipeline import default_stages

    for stage in default_stages():
        names = [p if isinstance(p, str) else p.name for p in stage.passes]
        print(f"stage {stage.name}{' (fixpoint)' if stage.fixpoint else ''}: {', '.join(names)}")
    print()
    for p in list_passes():
        print(f"  {p.group:<10} {p.name:<40} {p.summary()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _ArgumentParser(prog="finnlite", description="FINN-style streamlining of QONNX models.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the passes do")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_ArgumentParser)
    p = sub.add_parser("streamline", help="run the default pipeline on a QONNX model")
    p.add_argument("input", help="the QONNX model (.onnx)")
    p.add_argument("-o", "--output", required=True, help="where to write the streamlined model")
    p.add_argument("--stages", nargs="+", metavar="STAGE", help="run only these stages (in pipeline order)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_streamline)
    p = sub.add_parser("info", help="op histogram and datatypes of a model")
    p.add_argument("model")
    p.set_defaults(func=cmd_info)
    p = sub.add_parser("passes", help="list the registered passes and the default stages")
    p.set_defaults(func=cmd_passes)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``finnlite`` console script."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s: %(message)s")
    logging.getLogger("onnx_ir").setLevel(logging.ERROR)
    try:
        return args.func(args)
    except FinnliteError as exc:
        print(f"finnlite: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("finnlite: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
