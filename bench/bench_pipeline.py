"""The whole pipeline: per zoo model times, memory and node counts; per-pass verification cost; scaling.

Each zoo model runs in its own subprocess so that its peak memory (RSS) is its own. Printed per model: load,
convert (tidy + convert), streamline (the remaining stages), final verification (against the original on 8
random inputs from the manifest's range), save, total, the file size, the peak RSS of the process and the peak
above the RSS after importing every module (the model's own cost, also over the file size), node counts. Then,
per zoo model (and ProxylessNAS mobile14 at 4 bits when the corpus cache holds its export), the `finnlite
streamline` command's time with --verify each over --verify off and the peak RSS of both (that table alone:
``python -m bench.bench_pipeline --commands``), the per-pass checks' cost inside the pipeline, and the streamline
time per node of Brevitas-style MLPs with 3 to 48 hidden layers and of a ResNet-style graph of about 1,000 nodes
built in code. FINN's time per model is measured in the same run when the finn-plus side environment is present
(``$FINNLITE_FINN_PYTHON``, ``bench/finn_flow.py``); the zoo table's FINN column and the scaling table's FINN
figures are quoted (finn-plus 1.6.1 default flow on the same kind of machine, same files).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
ZOO = Path(os.environ.get("FINNLITE_ZOO", REPO.parent / "shared" / "zoo"))
FINN_STREAMLINE_S = {"tfc_2w2a": 1.0, "cnv_2w2a": 3.6, "mobilenet_v1_4b": 100.0, "resnet18_4w4a_ts": 70.0}
FINN_MLP_S = {3: 1.3, 12: 14.0, 24: 61.0}


def _import_everything() -> int:
    """Import every module the pipeline imports (some only on first use: onnxruntime, the executor, the convert
    and lower stages), then warm the libraries up on a tiny model built in code (a 1-layer MLP of 8 units: loaded,
    run by the executor, streamlined), and return the peak RSS so far in bytes: the fixed cost of the interpreter
    and libraries (about 140 MB, of which about 18 MB is the libraries' one-time initialisation on first use: the
    first onnxruntime session, lazily imported modules), which no change to the pipeline removes. The model's own
    cost is the peak above it."""
    import onnxruntime  # noqa: F401 - imported by the executor on first use

    import custom_ops.executor  # noqa: F401
    import finnlite.core.cleanup  # noqa: F401
    from custom_ops.executor import Executor
    from finnlite import Model
    from finnlite.examples import build_mlp
    from streamline.pipeline import default_stages, streamline_model

    default_stages()  # imports the convert, lower and finalize passes
    np.random.default_rng(0)
    tiny = Model(build_mlp(1, 8))
    x = {n: np.zeros(tiny.get_tensor_shape(n), np.float32) for n in tiny.input_names}
    Executor(tiny.to_proto()).run(x)
    streamline_model(tiny)
    return _peak_rss()


def _peak_rss() -> int:
    """The process's peak resident set size so far, in bytes: VmHWM on Linux (ru_maxrss there survives exec, so a
    subprocess of a large bench process would report its parent's peak), else ru_maxrss (bytes on macOS)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def one_model(name: str) -> dict:
    """Measure one zoo model in this process (run as a subprocess by :func:`main`). ``rss`` is the peak RSS of
    the whole process, ``rss_base`` the peak after importing everything (before loading the model) and
    ``rss_incr`` the difference: what loading, converting, streamlining, verifying and saving the model cost."""
    from finnlite import Model
    from finnlite.core.passes import PassManager
    from streamline.pipeline import default_stages
    from verify import ReferenceData, final_check

    rss_base = _import_everything()
    entry = json.loads((ZOO / "manifest.json").read_text())[name]
    path = ZOO / entry["file"]
    t = {}
    t0 = time.perf_counter()
    model = Model(path)
    t["load"] = time.perf_counter() - t0
    lo, hi = entry["input_range"]
    ref = ReferenceData.random(model, n=8, seed=0, low=lo, high=hi)
    t0 = time.perf_counter()
    ref.outputs()  # the original's outputs now (the final check's reference)
    t_reference = time.perf_counter() - t0
    nodes_before = len(model)
    stages = default_stages()
    t0 = time.perf_counter()
    PassManager(stages[:2]).run(model)
    t["convert"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    PassManager(stages[2:]).run(model)
    t["streamline"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    ok = final_check(ref, model).ok
    t["verify"] = time.perf_counter() - t0 + t_reference
    del ref  # as in `finnlite streamline`: the reference data and its executors are gone before the model is saved
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        model.save(Path(tmp) / "out.onnx")
        t["save"] = time.perf_counter() - t0
    rss = _peak_rss()
    size = path.stat().st_size
    return {"name": name, "times": t, "rss": rss, "rss_base": rss_base, "rss_incr": rss - rss_base,
            "incr_per_file": (rss - rss_base) / size, "file": size, "nodes_before": nodes_before,
            "nodes_after": len(model), "ok": ok, "hist": model.op_histogram()}


def _subprocess(name: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "bench.bench_pipeline", "--one", name], capture_output=True,
                         text=True, cwd=REPO, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def zoo_table() -> None:
    print("== pipeline on the zoo (each model in its own process; verify = final check on 8 inputs)")
    print(f"  {'model':<18} {'load':>5} {'conv':>5} {'strm':>5} {'verif':>5} {'save':>5} {'total':>6}  "
          f"{'file MB':>7} {'RSS MB':>6} {'+MB':>5} {'+/file':>6} {'nodes':>9}  {'FINN streamline':>15}")
    names = [n for n in json.loads((ZOO / "manifest.json").read_text())]
    for name in names:
        r = _subprocess(name)
        t = r["times"]
        total = sum(t.values())
        finn = FINN_STREAMLINE_S.get(name)
        finn_text = f"{finn:.0f} s ({finn / (t['convert'] + t['streamline']):.0f}x)" if finn else ""
        print(f"  {name:<18} {t['load']:5.2f} {t['convert']:5.2f} {t['streamline']:5.2f} {t['verify']:5.2f} "
              f"{t['save']:5.2f} {total:6.2f}  {r['file'] / 1e6:7.1f} {r['rss'] / 1e6:6.0f} {r['rss_incr'] / 1e6:5.0f} "
              f"{r['incr_per_file']:5.1f}x {r['nodes_before']:>4}->{r['nodes_after']:<4}"
              f"  {finn_text:>15}{'' if r['ok'] else '  VERIFICATION FAILED'}")
    print("  targets: mobilenet_v1_4b and resnet18_4w4a_ts end to end < 5 s, cnv_2w2a < 1 s; peak memory < 3x the file")
    print("  (RSS MB: peak RSS of the process; +MB: the peak above the RSS after importing everything and warming the")
    print("  libraries up on a tiny MLP, before loading the model, i.e. without the interpreter and libraries (about")
    print("  140 MB); +/file: +MB over the file size)")


def _command(path: Path, verify: str) -> dict:
    """One ``finnlite streamline --verify VERIFY`` command on a model file, started from a small launcher process
    (``--command``): a child of this grown process would inherit its peak RSS (``ru_maxrss`` survives fork and
    exec), a child of the launcher does not."""
    out = subprocess.run([sys.executable, "-m", "bench.bench_pipeline", "--command", str(path), verify],
                         capture_output=True, text=True, cwd=REPO, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def launch(path: str, verify: str) -> dict:
    """In the launcher: run the command as a user runs it (defaults otherwise); its wall time (interpreter start-up
    included) and its peak RSS (``ru_maxrss`` of the child, from ``os.wait4``)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "finnlite.cli", "streamline", path, "-o",
               str(Path(tmp) / "out.onnx"), "--verify", verify, "-q"]
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t0
    rss = usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    return {"seconds": seconds, "rss": rss, "ok": os.waitstatus_to_exitcode(status) == 0}


#: the ProxylessNAS export of issue 24 (``tests/corpus/export.py``), in the corpus cache when it was exported there
PROXYLESSNAS = "quant_proxylessnas_mobile14_4b"
#: the reproducers' folder; its ``proxylessnas_4b.onnx`` is the same network (random weights, its README says how)
REPRO = Path(os.environ.get("FINNLITE_REPRO", REPO.parent / "shared" / "repro"))


def command_models() -> dict[str, Path]:
    """The models of the command table: the zoo's, and ProxylessNAS mobile14 (4 bits) from the corpus cache, else
    the reproducer of the same network (``$FINNLITE_REPRO``), when one of them is there."""
    from tests.corpus.check import cache_dir

    models = {name: ZOO / e["file"] for name, e in json.loads((ZOO / "manifest.json").read_text()).items()}
    for name, path in (("proxylessnas_mobile14_4b", cache_dir() / f"{PROXYLESSNAS}.onnx"),
                       ("proxylessnas_4b (repro)", REPRO / "proxylessnas_4b.onnx")):
        if path.is_file():
            models[name] = path
            break
    return models


#: FINN's flow is stopped after this many seconds (on ProxylessNAS it ran past 900 s at 14.5 GB)
FINN_TIMEOUT_S = 300


def finn_seconds(path: Path) -> float | None:
    """FINN's own flow on ``path`` (``bench/finn_flow.py`` in the finn-plus side environment named by
    ``$FINNLITE_FINN_PYTHON``), one run; None without that environment, ``inf`` if it did not finish within
    :data:`FINN_TIMEOUT_S`."""
    python = os.environ.get("FINNLITE_FINN_PYTHON")
    if not python or not Path(python).is_file():
        return None
    try:
        out = subprocess.run([python, str(REPO / "bench" / "finn_flow.py"), str(path)], capture_output=True,
                             text=True, cwd=REPO, check=True, timeout=FINN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return float("inf")
    return json.loads(out.stdout.strip().splitlines()[-1])["seconds"]


def cli_table(repeats: int = 3) -> None:
    """Command-level cost: ``finnlite streamline`` with its default verification (``--verify each``) against
    ``--verify off`` (medians of ``repeats`` runs, alternating) and the peak RSS of each command; beside them FINN's
    own flow on the same file (one run, when the finn-plus side environment is present) and the ratio of FINN's
    time to finnlite's default."""
    finn = bool(os.environ.get("FINNLITE_FINN_PYTHON"))
    print(f"== `finnlite streamline` as a command (medians of {repeats} runs, alternating; wall time with the "
          "interpreter's start-up;")
    print("   peak RSS of the command) against FINN's step_qonnx_to_finn + step_tidy_up + step_streamline (one run, "
          "load included,")
    print("   FINN's imports not counted)" if finn else "   FINN: not measured (set FINNLITE_FINN_PYTHON to the "
          "finn-plus side environment's python)")
    print("   Targets: default >= 50x FINN on mobilenet_v1_4b and resnet18_4w4a_ts, >= 10x on cnv_2w2a; each/off <= "
          "1.5x;")
    print("   proxylessnas_mobile14_4b under 4 s and 600 MB with the defaults")
    print(f"  {'model':<24} {'FINN s':>7} {'each s':>6} {'FINN/each':>9} {'off s':>6} {'each/off':>8}  "
          f"{'off RSS MB':>10} {'each RSS MB':>11}")
    for name, path in command_models().items():
        finn_s = finn_seconds(path) if finn else None
        runs: dict[str, list[dict]] = {"off": [], "each": []}
        for _ in range(repeats):
            for mode in runs:
                runs[mode].append(_command(path, mode))
        t = {m: statistics.median(r["seconds"] for r in rs) for m, rs in runs.items()}
        rss = {m: statistics.median(r["rss"] for r in rs) for m, rs in runs.items()}
        failed = "" if all(r["ok"] for rs in runs.values() for r in rs) else "  COMMAND FAILED"
        if finn_s is None:
            finn_text = f"{'-':>7} {t['each']:6.2f} {'-':>9}"
        elif finn_s == float("inf"):  # stopped at the timeout: FINN's time and the ratio are at least these
            least = f">{FINN_TIMEOUT_S / t['each']:.0f}"
            finn_text = f"{'>' + str(FINN_TIMEOUT_S):>7} {t['each']:6.2f} {least:>8}x"
        else:
            finn_text = f"{finn_s:7.1f} {t['each']:6.2f} {finn_s / t['each']:8.1f}x"
        print(f"  {name:<24} {finn_text} {t['off']:6.2f} {t['each'] / t['off']:7.2f}x  "
              f"{rss['off'] / 1e6:10.0f} {rss['each'] / 1e6:11.0f}{failed}")


def measure_overhead(model: Any, reference: Any) -> tuple[float, float, int]:
    """The default pipeline on two copies of ``model``: its seconds plain and with a verification hook (the checks
    in this process), and the number of checks."""
    from finnlite import Model
    from finnlite.core.passes import PassManager
    from streamline.pipeline import default_stages
    from verify import VerificationHook

    seconds = []
    hook = VerificationHook(reference)
    for hooks in ([], [hook]):
        copy = Model(model.to_proto(), check=False)
        t0 = time.perf_counter()
        PassManager(default_stages(), hooks).run(copy)
        seconds.append(time.perf_counter() - t0)
    hook.close()
    return seconds[0], seconds[1], len(hook.records)


def overhead_rows(name: str) -> dict:
    """Per-pass verification's cost on one zoo model, in this process (run as a subprocess by
    :func:`verification_overhead`): the pipeline's time without and with the hook (checks in this process) in 5
    rounds, on fresh copies of the model, each round with fresh reference data."""
    from finnlite import Model
    from verify import ReferenceData

    _import_everything()  # the libraries' first use, not paid by the first round
    entry = json.loads((ZOO / "manifest.json").read_text())[name]
    lo, hi = entry["input_range"]
    model = Model(ZOO / entry["file"])
    plain, verified, checks = [], [], 0
    for _ in range(5):
        p, v, checks = measure_overhead(model, ReferenceData.random(model, n=4, seed=0, low=lo, high=hi))
        plain.append(p)
        verified.append(v)
    return {"checks": checks, "plain": plain, "verified": verified}


def verification_overhead() -> None:
    """The cost of per-pass verification on every zoo model: the pipeline with the verification hook against the
    pipeline alone, medians of 5 rounds, each model in its own process."""
    print("== per-pass verification: the pipeline with it against without it (medians of 5 rounds; target < 2x)")
    print(f"  {'model':<18} {'checks':>6} {'pipeline s':>10} {'verified s':>10} {'ratio':>6}  rounds")
    for name in json.loads((ZOO / "manifest.json").read_text()):
        out = subprocess.run([sys.executable, "-m", "bench.bench_pipeline", "--overhead", name],
                             capture_output=True, text=True, cwd=REPO, check=True)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        p, v = statistics.median(row["plain"]), statistics.median(row["verified"])
        rounds = ", ".join(f"{b / a:.2f}" for a, b in zip(row["plain"], row["verified"]))
        print(f"  {name:<18} {row['checks']:>6} {p:10.3f} {v:10.3f} {v / p:5.2f}x  {rounds}")


def _resnet_style(blocks: int) -> "object":
    """A ResNet-style QONNX graph of ``blocks`` residual blocks (about 12 nodes each), built in code."""
    from onnx import TensorProto, helper, numpy_helper

    from finnlite.core.compat import QONNX_DOMAIN, make_model

    rng = np.random.default_rng(0)
    nodes, inits = [], []
    count = [0]

    def const(v):
        count[0] += 1
        name = f"c{count[0]}"
        inits.append(numpy_helper.from_array(np.asarray(v, dtype=np.float32), name))
        return name

    def node(op, ins, domain="", **attrs):
        count[0] += 1
        out = f"t{count[0]}"
        nodes.append(helper.make_node(op, ins, [out], domain=domain, name=f"n{count[0]}", **attrs))
        return out

    def quant(x, scale, bits, signed):
        return node("Quant", [x, const(scale), const(0.0), const(float(bits))], QONNX_DOMAIN, signed=int(signed),
                    narrow=int(signed), rounding_mode="ROUND")

    c = 8
    x = quant("x", 1 / 64, 8, True)
    x = node("Conv", [x, quant(const(rng.normal(size=(c, 3, 3, 3))), 0.1, 4, True)], pads=[1, 1, 1, 1])
    x = quant(node("Relu", [x]), 1 / 15, 4, False)
    for _ in range(blocks):
        y = node("Conv", [x, quant(const(rng.normal(size=(c, c, 3, 3))), 0.05, 4, True)], pads=[1, 1, 1, 1])
        y = node("BatchNormalization", [y, const(rng.uniform(0.5, 1.5, c)), const(rng.normal(0, 0.1, c)),
                                        const(rng.normal(0, 0.1, c)), const(rng.uniform(0.5, 2, c))])
        y = quant(node("Relu", [y]), 1 / 15, 4, False)
        y = node("Conv", [y, quant(const(rng.normal(size=(c, c, 3, 3))), 0.05, 4, True)], pads=[1, 1, 1, 1])
        y = quant(y, 1 / 15, 4, False)
        x = quant(node("Relu", [node("Add", [x, y])]), 1 / 15, 4, False)
    graph = helper.make_graph(nodes, "resnet_style", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                   [1, 3, 8, 8])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, c, 8, 8])], initializer=inits)
    return make_model(graph)


def scaling() -> None:
    from finnlite import Model
    from finnlite.examples import build_mlp
    from streamline.pipeline import streamline_model

    print("== scaling: convert + streamline time per node (should stay flat; after one warm-up run on a 1-layer MLP,")
    print("   which pays the one-time cost of lazy imports and the libraries' first use). Target: the 24-layer MLP and")
    print("   the 96-block ResNet within 1.5x the time per node of the 3-layer MLP and the 8-block ResNet")
    print(f"  {'graph':<22} {'nodes':>6} {'seconds':>8} {'ms/node':>8} {'vs small':>8}  {'FINN (quoted)':>13}")
    streamline_model(Model(build_mlp(1, 8)))
    cases = [(f"MLP {n} layers x 64", build_mlp(n, 64), FINN_MLP_S.get(n), "mlp") for n in (3, 12, 24, 48)]
    cases += [(f"ResNet-style {b} blocks", _resnet_style(b), None, "resnet") for b in (8, 96)]
    small: dict[str, float] = {}
    for label, proto, finn, family in cases:
        model = Model(proto)
        n = len(model)
        t0 = time.perf_counter()
        streamline_model(model)
        per_node = (time.perf_counter() - t0) / n
        small.setdefault(family, per_node)
        print(f"  {label:<22} {n:>6} {per_node * n:8.2f} {1000 * per_node:8.2f} {per_node / small[family]:7.2f}x  "
              f"{f'{finn:.1f} s' if finn else '':>13}")
    print("  FINN on Brevitas MLPs of 64 units: 1.3 s at 3 layers, 14 s at 12, 61 s at 24 (superlinear);")
    print("  FINN did not finish a 317-node ProxylessNAS export in 900 s and peaked at 14.5 GB")


def main() -> None:
    if not (ZOO / "manifest.json").is_file():
        print(f"== pipeline benchmarks need the model zoo (FINNLITE_ZOO, tried {ZOO}); zoo parts skipped")
    else:
        zoo_table()
        cli_table()
        verification_overhead()
    scaling()


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--command":
        print(json.dumps(launch(sys.argv[2], sys.argv[3])))
    elif sys.argv[1:] == ["--commands"]:
        cli_table()
    elif len(sys.argv) == 3 and sys.argv[1] == "--one":
        print(json.dumps(one_model(sys.argv[2])))
    elif len(sys.argv) == 3 and sys.argv[1] == "--overhead":
        print(json.dumps(overhead_rows(sys.argv[2])))
    else:
        main()
