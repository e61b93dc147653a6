"""The ``finnlite`` command.

* ``finnlite streamline IN.onnx -o OUT.onnx [--config cfg.yaml] [--verify off|final|each] [--inputs x.npz]
  [--input-range LO HI] [--input-datatype UINT8 --input-scale 1/255 --mean M.. --std S..] [--report report.html]
  [--json] [--strict]`` runs the default pipeline (as configured), verifies the
  result (default: every pass, then the final check against the original), writes the model and prints a summary;
  with ``--strict`` it exits 1 when the result is not integer-only, the model has no quantizers or verification
  declined a rewrite (the reasons are :meth:`finnlite.report.StreamlineReport.strict_failures`; the verified model
  is still written); a rewrite that fails its check is undone and declined, and listed;
* ``finnlite info MODEL`` prints the op histogram, datatypes, the per-layer widths FINN sizes each MAC layer with
  (weight, input, accumulator, output) and the inference cost;
* ``finnlite passes`` lists the default stages and the registered passes;
* ``finnlite exec MODEL inputs.npz`` runs the executor (the oracle) and prints or saves the outputs;
* ``finnlite verify A.onnx B.onnx`` compares model B with model A on reference data;
* ``finnlite bisect IN.onnx`` finds the first pass (and rewrite) that breaks equivalence.

Progress goes to stderr; with ``--json`` stdout holds only the JSON; ``-v`` logs every pass run (changed or not,
rewrites, nodes). What can be checked before the work is: the output and report locations are writable, the
``--inputs`` file's arrays are named after the model's inputs, the random reference data fit in memory. Exit codes:
0 success, 1 failed verification (the message names the pass or tensor) or a failed ``--strict``, 2 bad input or
usage (one line, no traceback), 3 an internal error; a closed stdout (``finnlite ... --json | head``) ends the
command quietly with 141, as SIGPIPE would.

The module imports only what every command needs; each command imports the rest when it runs, so that
``finnlite --help``, ``--version`` and ``passes`` stay quick.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from finnlite.core.errors import ConfigError, FinnliteError

log = logging.getLogger("finnlite")
#: exit code for an unexpected exception (a bug), distinct from 2 (bad input or usage) and 1 (failed verification)
INTERNAL_ERROR = 3
#: exit code when stdout was closed before the command finished writing (as a shell reports SIGPIPE)
SIGPIPE_EXIT = 141


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush does not fail on the closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real stdout (captured in a test): nothing left to flush
        pass


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # usage errors: one line and exit code 2
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def _progress(enabled: bool) -> Any:
    """A progress callback printing on stderr (None when disabled)."""
    if not enabled:
        return None
    return lambda line: print(f"  {line}", file=sys.stderr, flush=True)


def _config(args: argparse.Namespace) -> Any:
    from finnlite.config import Config, load_config

    return load_config(args.config) if getattr(args, "config", None) else Config()


def _emit_json(data: Any) -> None:
    from finnlite.report import json_default

    print(json.dumps(data, indent=2, default=json_default))


def cmd_streamline(args: argparse.Namespace) -> int:
    from finnlite.build import streamline
    from finnlite.core.io import check_input_names, check_output_path
    from finnlite.core.model import Model

    inp, out = Path(args.input), Path(args.output)
    check_output_path(out, source=inp)
    report_path = Path(args.report) if args.report else None
    if report_path is not None:
        try:
            check_output_path(report_path, source=inp, what="report")
        except FinnliteError as exc:
            raise ConfigError(exc.message, file=exc.file) from None
    config = _config(args)
    t0 = time.perf_counter()
    model = Model(inp)
    t_load = time.perf_counter() - t0
    if args.inputs is not None:
        check_input_names(args.inputs, model.input_names)
    report = streamline(model, config, verify=args.verify, inputs=args.inputs, input_range=args.input_range,
                        samples=args.samples, seed=args.seed, stages=args.stages, progress=_progress(not args.quiet),
                        preprocessing=_preprocessing(args))
    report.seconds = {"load": t_load, **report.seconds}
    written = None
    if report.ok:
        t1 = time.perf_counter()
        model.save(out)
        report.seconds["save"] = time.perf_counter() - t1
        written = out
    elif report.completed:  # the final check failed: keep the result for inspection, not under the asked name
        written = out.with_name(f"{out.stem}.unverified{out.suffix or '.onnx'}")
        model.save(written)
    report.output = str(written) if written else None
    if report_path is not None:
        report.save_html(report_path)
        if not args.quiet:
            print(f"  report written to {report_path}", file=sys.stderr)
    strict = report.strict_failures() if args.strict else []
    if args.json:
        _emit_json({**report.to_dict(), "report": report.report_path,
                    "strict": None if not args.strict else {"ok": not strict, "failures": strict}})
    else:
        print(f"finnlite streamline: {inp} -> {written if written else '(nothing written)'}")
        print(report.text())
    if report.ok:
        for reason in strict:
            print(f"finnlite: strict: {reason}", file=sys.stderr)
        return 1 if strict else 0
    print(f"finnlite: error: {report.error}", file=sys.stderr)
    if report.completed:
        again = f" --config {args.config}" if args.config else ""
        print(f"finnlite: the unverified result is in {written}; to find the pass that breaks it, run: "
              f"finnlite bisect {inp}{again}", file=sys.stderr)
    return 1


def cmd_info(args: argparse.Namespace) -> int:
    from finnlite.core.model import Model
    from finnlite.cost import datatype_histogram, inference_cost

    model = Model(args.model)
    hist = model.op_histogram()
    dts = datatype_histogram(model)
    cost = inference_cost(model)
    if args.json:
        _emit_json({"model": args.model, "nodes": len(model), "inputs": model.input_names,
                    "outputs": model.output_names, "ops": hist, "datatypes": dts, "cost": cost.to_dict(),
                    "layers": [{**vars(c), "bops": c.bops} for c in cost.layers]})
        return 0
    print(f"{args.model}: {len(model)} nodes, inputs {model.input_names}, outputs {model.output_names}")
    print("ops:")
    for op, n in hist.items():
        print(f"  {op:<24} {n:>5}")
    for kind in ("weights", "activations"):
        if dts[kind]:
            print(f"datatypes ({kind}): " + ", ".join(f"{k} x{v}" for k, v in dts[kind].items()))
    if not dts["weights"] and not dts["activations"]:
        print("datatypes: no annotations")
    if cost.layers:
        print("layers (the widths FINN sizes them with):")
        for line in cost.layer_table():
            print("  " + line)
    print("inference cost: " + cost.text())
    return 0


def cmd_passes(args: argparse.Namespace) -> int:
    from finnlite import list_aliases, list_passes

    for stage in _config(args).build_stages():
        names = [p if isinstance(p, str) else p.name for p in stage.passes]
        print(f"stage {stage.name}{' (fixpoint)' if stage.fixpoint else ''}: {', '.join(names)}")
    print()
    for p in list_passes():
        print(f"  {p.group:<10} {p.name:<40} {p.summary()}")
    aliases = list_aliases()
    if aliases:
        print()
        print("FINN/qonnx names (aliases):")
        for alias, name in aliases.items():
            print(f"  {alias} -> {name}")
    return 0


def _load_arrays(path: str, input_names: list[str]) -> dict[str, Any]:
    """Inputs from a .npy file (single-input models) or a .npz file keyed by input name (any key for one input)."""
    import numpy as np

    if not Path(path).is_file():
        raise ConfigError("input file not found", file=path)
    try:
        loaded = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise ConfigError(f"cannot read the inputs: {' '.join(str(exc).split())}", file=path) from None
    if isinstance(loaded, np.ndarray):
        arrays = {"": loaded}
    else:
        with loaded:
            arrays = {k: loaded[k] for k in loaded.files}
    if len(input_names) == 1 and len(arrays) == 1 and input_names[0] not in arrays:
        return {input_names[0]: next(iter(arrays.values()))}
    if "" in arrays:
        raise ConfigError(f"the model has inputs {input_names}; give a .npz file keyed by input name", file=path)
    return arrays


def cmd_exec(args: argparse.Namespace) -> int:
    import numpy as np

    from custom_ops.executor import Executor
    from finnlite.core.io import check_input_names, check_output_path, write_atomic
    from finnlite.core.model import Model

    model = Model(args.model)
    check_input_names(args.inputs, model.input_names)
    if args.output and not str(args.output).endswith(".npz"):
        args.output = f"{args.output}.npz"  # the name np.savez gives a path without the suffix
    if args.output:
        check_output_path(args.output, source=args.model, what="outputs")
    inputs = _load_arrays(args.inputs, model.input_names)
    t0 = time.perf_counter()
    outputs = Executor(model.to_proto()).run(inputs)
    seconds = time.perf_counter() - t0
    if args.output:
        write_atomic(args.output, lambda fh: np.savez(fh, **outputs))
    if args.json:
        _emit_json({"seconds": seconds, "outputs": {k: {"shape": list(v.shape), "dtype": str(v.dtype),
                                                         "values": v.tolist()} for k, v in outputs.items()}})
        return 0
    print(f"{args.model}: ran in {seconds:.3f} s")
    for name, value in outputs.items():
        print(f"output '{name}': shape {tuple(value.shape)}, {value.dtype}")
        if value.size and value.dtype.kind in "fiub":
            print(f"  min {value.min():.6g}, max {value.max():.6g}, mean {value.mean():.6g}")
            if value.ndim >= 2 and value.shape[-1] > 1:
                print(f"  argmax over the last axis: {np.argmax(value, axis=-1).reshape(-1)[:16].tolist()}")
        print("  " + np.array2string(value, threshold=20, edgeitems=4, precision=6).replace("\n", "\n  "))
    if args.output:
        print(f"outputs saved to {args.output}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from finnlite.build import make_reference
    from finnlite.config import Config
    from finnlite.core.model import Model
    from verify import final_check

    original, candidate = Model(args.reference), Model(args.model)
    reference, described = make_reference(original, Config(), inputs=args.inputs, input_range=args.input_range,
                                          samples=args.samples, seed=args.seed, boundary=args.boundary)
    plan = getattr(reference, "boundary_plan", None)
    if plan is not None:
        from verify.boundary import boundary_check

        result = boundary_check(reference, candidate, plan, float_rtol=args.float_rtol)
    else:
        result = final_check(reference, candidate, float_rtol=args.float_rtol)
    from finnlite.report import VerificationResult

    verdict = VerificationResult("final", described, reference.num_samples, final=result,
                                 assumed=dict(getattr(reference, "assumed", None) or {}))
    if args.json:
        _emit_json({"reference_model": args.reference, "model": args.model, **verdict.to_dict()})
    else:
        print(f"finnlite verify: {args.model} against {args.reference}; reference data: {described}")
        print(result.summary())
        if verdict.ok and verdict.assumed:
            print(f"{verdict.status}; WARNING: {verdict.assumed_hint()}")
        print("OK" if result.ok else "FAILED")  # the verdict, one word on the last line
    if result.ok:
        return 0
    try:
        result.raise_for_errors()
    except FinnliteError as exc:
        print(f"finnlite: error: {exc}", file=sys.stderr)
    return 1


def cmd_bisect(args: argparse.Namespace) -> int:
    from finnlite.build import bisect
    from finnlite.core.model import Model

    if not args.quiet:
        print("  running the pipeline with per-pass verification ...", file=sys.stderr, flush=True)
    result = bisect(Model(args.input), _config(args), inputs=args.inputs, input_range=args.input_range,
                    samples=args.samples, seed=args.seed, stages=args.stages)
    described = result.reference
    if args.json:
        fields = ("ok", "stage", "pass_name", "iteration", "rewrite", "rewrites", "match", "message", "node", "tensor")
        _emit_json({"input": args.input, "reference": described, **{k: getattr(result, k) for k in fields}})
    else:
        print(f"finnlite bisect: {args.input}; reference data: {described}")
        print(result.text())
    return 0 if result.ok else 1


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _finite_float(text: str) -> float:
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: '{text}'") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite number: '{text}'")
    return value


def _preprocessing(args: argparse.Namespace) -> Any:
    """The input preprocessing the options ask for (``--input-datatype``, ``--input-scale``, ``--mean``,
    ``--std``), or None when none is given."""
    given = [args.input_datatype, args.input_scale, args.mean, args.std]
    if all(v is None for v in given):
        return None
    from streamline.preprocess import Preprocessing, parse_number

    numbers = lambda values, what: None if values is None else tuple(parse_number(v, what) for v in values)  # noqa
    return Preprocessing(args.input_datatype or "UINT8",
                         1.0 if args.input_scale is None else parse_number(args.input_scale, "--input-scale"),
                         numbers(args.mean, "--mean"), numbers(args.std, "--std"))


def _preprocessing_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("input preprocessing (a first layer that reads the float input)")
    g.add_argument("--input-datatype", metavar="TYPE", help="the input becomes integers of this datatype (UINT8)")
    g.add_argument("--input-scale", metavar="S", help="x*S first (a number or a fraction such as 1/255)")
    g.add_argument("--mean", nargs="+", metavar="M", help="then minus the mean, one value or one per channel")
    g.add_argument("--std", nargs="+", metavar="S", help="then divided by std, one value or one per channel")


def _reference_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--inputs", metavar="X.npz", help="reference inputs: .npy, or .npz keyed by input name "
                                                     "(default: random samples)")
    p.add_argument("--input-range", nargs=2, type=_finite_float, metavar=("LO", "HI"),
                   help="range of the random reference inputs (default: the model's input quantizer range)")
    p.add_argument("--samples", type=_positive_int, metavar="N",
                   help="number of random reference samples (default: 8)")
    p.add_argument("--seed", type=int, help="seed of the random reference inputs (default 0)")


def _verbose_option(p: argparse.ArgumentParser) -> None:
    # SUPPRESS: when not given after the command, the top-level -v stays (argparse would reset it to False)
    p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                   help="log every pass run: changed or not, rewrites, nodes before and after")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``finnlite`` command."""
    from finnlite import __version__
    from finnlite.core.modes import VERIFY_MODES

    parser = _ArgumentParser(prog="finnlite", description="FINN-style streamlining of QONNX models.")
    parser.add_argument("--version", action="version", version=f"finnlite {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log every pass run: changed or not, rewrites, nodes before and after")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_ArgumentParser)

    p = sub.add_parser("streamline", help="run the default pipeline on a QONNX model",
                       description="Streamline a QONNX model into FINN-ONNX, verify it and print a summary.")
    p.add_argument("input", help="the QONNX model (.onnx)")
    p.add_argument("-o", "--output", required=True, help="where to write the streamlined model")
    p.add_argument("--config", metavar="CFG.yaml", help="configuration: stages, user passes, verification")
    p.add_argument("--verify", choices=VERIFY_MODES,
                   help="off; final: compare the result with the original; each (default): verify every pass too")
    _reference_options(p)
    _preprocessing_options(p)
    p.add_argument("--stages", nargs="+", metavar="STAGE", help="run only these stages (in pipeline order)")
    p.add_argument("--report", metavar="REPORT.html", help="write an HTML report (histograms, graphs, timings)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON (only JSON on stdout)")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 when the result is not all it should be (the reasons are listed): not integer-only "
                        "(a float op left, a first layer on the float input), no quantizers in the model, or a "
                        "rewrite declined by verification")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    _verbose_option(p)
    p.set_defaults(func=cmd_streamline)

    p = sub.add_parser("info", help="op histogram, datatypes, per-layer widths and inference cost of a model")
    p.add_argument("model")
    p.add_argument("--json", action="store_true", help="print as JSON")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("passes", help="list the registered passes and the default stages")
    p.add_argument("--config", metavar="CFG.yaml", help="show the stages with this configuration's passes")
    p.set_defaults(func=cmd_passes)

    p = sub.add_parser("exec", help="run a model on inputs with the executor (the oracle)")
    p.add_argument("model")
    p.add_argument("inputs", help="the inputs: .npy, or .npz keyed by input name")
    p.add_argument("-o", "--output", metavar="OUT.npz", help="save the outputs to this .npz file")
    p.add_argument("--json", action="store_true", help="print the outputs as JSON")
    p.set_defaults(func=cmd_exec)

    p = sub.add_parser("verify", help="compare a model with a reference model on reference data",
                       description="Check that MODEL (e.g. streamlined) computes what REFERENCE (e.g. the original "
                                   "QONNX model) computes, as the final check of 'streamline' does.")
    p.add_argument("reference", help="the reference model (A)")
    p.add_argument("model", help="the model to check (B)")
    _reference_options(p)
    p.add_argument("--boundary", action="store_true",
                   help="boundary-seeking samples: first-layer pre-activations on and next to its thresholds")
    p.add_argument("--float-rtol", type=_finite_float, default=1e-5,
                   help="tolerance of float outputs, relative to their magnitude (default 1e-5)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("bisect", help="find the first pass and rewrite that break equivalence",
                       description="Run the pipeline with per-pass verification and, at the first failing pass, "
                                   "find the first failing rewrite.")
    p.add_argument("input", help="the QONNX model (.onnx)")
    p.add_argument("--config", metavar="CFG.yaml", help="configuration: stages, user passes, verification")
    _reference_options(p)
    p.add_argument("--stages", nargs="+", metavar="STAGE", help="run only these stages (in pipeline order)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    _verbose_option(p)
    p.set_defaults(func=cmd_bisect)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``finnlite`` console script."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s: %(message)s")
    logging.getLogger("onnx_ir").setLevel(logging.ERROR)
    try:
        return args.func(args)
    except BrokenPipeError:  # stdout closed early (| head): not an error of the command; say nothing more
        _silence_stdout()
        return SIGPIPE_EXIT
    except FinnliteError as exc:
        print(f"finnlite: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("finnlite: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - a bug in finnlite: one line, its own exit code, no traceback
        text = " ".join(str(exc).split()) or "(no message)"
        print(f"finnlite: internal error: {type(exc).__name__}: {text} (a bug in finnlite; rerun with "
              f"FINNLITE_TRACEBACK=1 for the traceback)", file=sys.stderr)
        if os.environ.get("FINNLITE_TRACEBACK"):
            raise
        return INTERNAL_ERROR


if __name__ == "__main__":
    sys.exit(main())
