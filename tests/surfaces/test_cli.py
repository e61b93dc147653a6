"""The ``finnlite`` command driven as a user drives it: reading stdout, stderr and the exit code.

The main paths (success, a failed verification, bad arguments, the console script) run in a subprocess; the other
commands and error cases call :func:`finnlite.cli.main` in-process (the same code, without paying for a Python
start-up per case).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from custom_ops.executor import Executor
from finnlite import Model
from finnlite.cli import main
from tests.surfaces.conftest import FINAL_FAILURE, HERE, run_cli


class _Result:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):
    """``cli(args)``: run the command in-process; returns returncode, stdout and stderr like a subprocess."""

    def call(args: list) -> _Result:
        try:
            code = main([str(a) for a in args])
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code
        out, err = capsys.readouterr()
        return _Result(code, out, err)

    return call


def _valid_streamlined(path: Path) -> Model:
    """Checks that ``path`` is a loadable, checker-clean FINN-ONNX model without quantizers, and returns it."""
    onnx.checker.check_model(onnx.load(str(path)))
    model = Model(path)
    ops = model.op_histogram()
    assert "Quant" not in ops and "BipolarQuant" not in ops and ops.get("MultiThreshold", 0) > 0, ops
    return model


def test_streamline_success_prints_the_summary_and_writes_the_model(example_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.onnx"
    res = run_cli(["streamline", example_path, "-o", out])
    assert res.returncode == 0, res.stderr
    _valid_streamlined(out)
    text = res.stdout
    for expected in ("stages: tidy, convert, streamline, lower, restreamline, finalize", "MultiThreshold",
                     "float ops left: none (integer-only)", "datatypes (weights): INT2", "time per stage: tidy",
                     "verification (each; 8 random samples", "input quantizer", "): OK", "float64 agrees on 8/8"):
        assert expected in text, (expected, text)
    # the op table: Quant 8 -> 0, Gemm 4 -> 0, MatMul 0 -> 4
    rows = {line.split()[0]: line.split()[1:] for line in text.splitlines() if line.startswith("  ") and
            len(line.split()) == 3 and line.split()[1].isdigit()}
    assert rows["Quant"] == ["8", "0"] and rows["Gemm"] == ["4", "0"] and rows["MatMul"] == ["0", "4"], rows
    # progress on stderr, stage by stage
    assert "[tidy] 19 nodes ..." in res.stderr and "[finalize] done in" in res.stderr


def test_streamline_json_is_the_only_stdout(example_path: Path, tmp_path: Path, cli) -> None:
    res = cli(["streamline", example_path, "-o", tmp_path / "out.onnx", "--json", "--verify", "each"])
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)  # nothing but JSON on stdout
    assert data["ok"] is True and data["nodes_before"] == 19 and data["ops_after"]["MultiThreshold"] == 4
    v = data["verification"]
    assert v["mode"] == "each" and v["ok"] is True and v["failure"] is None and v["final"]["ok"] is True
    assert len(v["checks"]) > 5 and all(c["ok"] for c in v["checks"])
    assert data["float_ops_left"]["integer_only"] is True
    assert data["cost_after"]["total_macs"] == data["cost_before"]["total_macs"] > 0
    assert set(data["seconds"]["stages"]) == {"tidy", "convert", "streamline", "lower", "restreamline", "finalize"}
    assert {p["name"] for p in data["passes"]} >= {"InferDataTypes", "MaterializeThresholds"}
    assert "[tidy]" in res.stderr  # progress still goes to stderr


def test_streamline_verify_off_and_options(example_path: Path, tmp_path: Path, cli) -> None:
    npz = tmp_path / "x.npz"
    np.savez(npz, x=np.random.default_rng(1).uniform(0, 1, (3, 1, 1, 28, 28)).astype(np.float32))
    res = cli(["streamline", example_path, "-o", tmp_path / "a.onnx", "--inputs", npz, "-q"])
    assert res.returncode == 0, res.stderr
    assert f"3 samples from {npz}" in res.stdout and res.stderr == ""
    res = cli(["streamline", example_path, "-o", tmp_path / "b.onnx", "--input-range", "0", "0.5",
                   "--samples", "2", "--seed", "7", "--stages", "tidy", "convert"])
    assert res.returncode == 0, res.stderr
    assert "2 random samples (seed 7), x in [0, 0.5] (given)" in res.stdout
    assert "stages: tidy, convert\n" in res.stdout
    res = cli(["streamline", example_path, "-o", tmp_path / "c.onnx", "--verify", "off"])
    assert res.returncode == 0 and "verification: off" in res.stdout


def _one_bad_rule(tmp_path: Path, rule: str = "ShiftOneThreshold", stage: str = "finalize") -> Path:
    shutil.copy(HERE / "bad_rules.py", tmp_path / "bad_rules.py")
    cfg = tmp_path / "one_bad.yaml"
    cfg.write_text(f"passes:\n  - pass: bad_rules:{rule}\n    stage: {stage}\n", encoding="utf-8")
    return cfg


@pytest.mark.declines
def test_a_rewrite_that_breaks_one_node_is_declined(example_path: Path, tmp_path: Path, cli) -> None:
    """A rule that is wrong at one node of four: the run heals (that rewrite is undone and declined, the three others
    stay), writes a verified model and exits 0, listing the declined rewrite with its failing tensor; ``--strict``
    exits 1 naming it, and still writes the (correct) model."""
    cfg = _one_bad_rule(tmp_path)
    out = tmp_path / "out.onnx"
    res = cli(["streamline", example_path, "-o", out, "--config", cfg, "--json", "-q"])
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    v = data["verification"]
    assert data["ok"] is True and v["status"] == "verified" and v["final"]["ok"] is True
    assert len(v["declined_rewrites"]) == 1, v["declined_rewrites"]
    d = v["declined_rewrites"][0]
    assert d["pass_name"] == "ShiftOneThreshold" and d["stage"] == "finalize" and d["tensor"] and d["anchor"] != "*"
    assert data["strict_failures"] and out.is_file()
    model = Model(out)  # the three exact rewrites stayed, the wrong one did not
    assert sum(n.inputs[1].name.startswith("copied") for n in model.graph if n.op_type == "MultiThreshold") == 3
    res = cli(["streamline", example_path, "-o", tmp_path / "strict.onnx", "--config", cfg, "--strict"])
    assert res.returncode == 1, res.stderr
    assert "1 rewrite(s) declined by verification" in res.stdout and "ShiftOneThreshold (stage 'finalize')" in res.stdout
    strict = [line for line in res.stderr.splitlines() if line.startswith("finnlite: strict:")]
    assert len(strict) == 1 and "rewrite declined by verification" in strict[0] and d["anchor"] in strict[0]
    assert "Traceback" not in res.stderr and (tmp_path / "strict.onnx").is_file()


@pytest.mark.declines
def test_a_wrong_rule_everywhere_is_declined_everywhere(example_path: Path, bad_config: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.onnx"
    res = run_cli(["streamline", example_path, "-o", out, "--config", bad_config, "--verify", "each"])
    assert res.returncode == 0, res.stderr
    assert "verification (each;" in res.stdout and "): OK" in res.stdout
    assert res.stdout.count("ShiftThresholds (stage 'finalize')") == 4  # every MultiThreshold of the example
    assert "Traceback" not in res.stderr and out.is_file()


def test_final_check_failure_exits_1_and_points_to_bisect(example_path: Path, bad_config: Path,
                                                          tmp_path: Path, cli) -> None:
    out = tmp_path / "out.onnx"
    res = cli(["streamline", example_path, "-o", out, "--config", bad_config, "--json", "--verify", "final"])
    assert res.returncode == 1
    data = json.loads(res.stdout)
    assert data["ok"] is False and data["verification"]["failure"]["during"] == "final"
    assert data["verification"]["final"]["outputs"][0]["error_samples"]
    assert re.search(FINAL_FAILURE, res.stderr) and "finnlite bisect" in res.stderr
    assert not out.exists() and (tmp_path / "out.unverified.onnx").is_file()


def test_bisect_names_the_pass_and_the_rewrite(example_path: Path, bad_config: Path, cli) -> None:
    res = cli(["bisect", example_path, "--config", bad_config])
    assert res.returncode == 1, res.stderr
    assert "first failing pass: ShiftThresholds (stage 'finalize')" in res.stdout
    assert "first failing rewrite: #1 of" in res.stdout
    res = cli(["bisect", example_path, "--json", "-q"])
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["ok"] is True and res.stderr == ""


@pytest.mark.parametrize("args, message", [
    ([], "the following arguments are required: command"),
    (["streamline"], "the following arguments are required: input, -o/--output"),
    (["streamline", "x.onnx", "-o", "y.onnx", "--verify", "sometimes"], "argument --verify: invalid choice"),
    (["streamline", "x.onnx", "-o", "y.onnx", "--samples", "0"], "argument --samples: must be at least 1"),
    (["streamline", "x.onnx", "-o", "y.onnx", "--input-range", "0"], "argument --input-range: expected 2"),
    (["streamline", "x.onnx", "-o", "y.onnx", "--input-range", "0", "nan"], "not a finite number"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["exec", "model.onnx"], "the following arguments are required: inputs"),
])
def test_bad_arguments_print_usage_and_exit_2(args: list[str], message: str, cli) -> None:
    res = cli(args)
    assert res.returncode == 2
    assert res.stderr.startswith("usage: finnlite") and message in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and res.stdout == ""


@pytest.mark.parametrize("args", [[], ["streamline", "x.onnx", "-o", "y.onnx", "--verify", "sometimes"]])
def test_bad_arguments_in_a_subprocess(args: list[str]) -> None:
    res = run_cli(args)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert lines[0].startswith("usage: finnlite") and lines[-1].startswith("finnlite") and "error:" in lines[-1]
    assert "Traceback" not in res.stderr and res.stdout == ""


def test_bad_inputs_are_one_line_errors(example_path: Path, tmp_path: Path, cli) -> None:
    cases = [
        (["streamline", tmp_path / "missing.onnx", "-o", tmp_path / "o.onnx"], "missing.onnx"),
        (["streamline", example_path, "-o", tmp_path / "no" / "o.onnx"], "the output folder does not exist"),
        (["streamline", example_path, "-o", tmp_path / "o.onnx", "--report", tmp_path / "no" / "r.html"],
         "the report folder does not exist"),
        (["streamline", example_path, "-o", tmp_path / "o.onnx", "--config", tmp_path / "none.yaml"],
         "configuration file not found"),
        (["streamline", example_path, "-o", tmp_path / "o.onnx", "--stages", "tidy", "polish"], "unknown stage"),
        (["streamline", example_path, "-o", tmp_path / "o.onnx", "--inputs", tmp_path / "none.npz"],
         "input file not found"),
        (["exec", example_path, tmp_path / "none.npz"], "input file not found"),
    ]
    for args, message in cases:
        res = cli(args)
        assert res.returncode == 2, (args, res.stderr)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("finnlite: error:") and message in lines[0], res.stderr


def test_config_error_exits_2_naming_file_and_key(example_path: Path, tmp_path: Path, cli) -> None:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("verification:\n  mode: final\n  tolerence: {rtol: 1.0e-5}\n", encoding="utf-8")
    res = cli(["streamline", example_path, "-o", tmp_path / "o.onnx", "--config", cfg])
    assert res.returncode == 2
    assert res.stderr.strip() == (f"finnlite: error: file '{cfg}': key 'verification.tolerence': unknown key "
                                  "(allowed in verification: mode, samples, seed, input_range, inputs, tolerance, "
                                  "near_ties, near_tie_rtol, float_rtol, save_dir, boundary)")


def test_info_prints_histogram_datatypes_and_cost(example_path: Path, tmp_path: Path, cli) -> None:
    res = cli(["info", example_path])
    assert res.returncode == 0, res.stderr
    assert "19 nodes" in res.stdout and "Quant" in res.stdout and "inference cost: MACs 6.24 k" in res.stdout
    assert "SCALEDINT<8> x SCALEDINT<2>: 4.47 k MACs" in res.stdout
    out = tmp_path / "s.onnx"
    assert cli(["streamline", example_path, "-o", out, "--verify", "off", "-q"]).returncode == 0
    res = cli(["info", out, "--json"])
    data = json.loads(res.stdout)
    assert data["ops"]["MultiThreshold"] == 4 and data["datatypes"]["weights"]["INT2"] == 4
    assert data["cost"]["op_mac_UINT8_INT2"] > 0 and data["cost"]["total_macs"] == 6236
    assert data["cost"]["total_bops"] == sum(layer["bops"] for layer in data["layers"])


def test_passes_lists_stages_and_passes(bad_config: Path, cli) -> None:
    res = cli(["passes"])
    assert res.returncode == 0
    lines = res.stdout.splitlines()
    assert lines[0].startswith("stage tidy: ") and any(line.startswith("stage streamline (fixpoint): ")
                                                       for line in lines)
    assert any("InferDataTypes" in line and "finalize" not in line.split()[0] for line in lines[7:])
    assert "  MoveScalarMulPastConv -> MoveMulPastLinear" in lines and "  ConvertSubToAdd -> SubToAdd" in lines
    res = cli(["passes", "--config", bad_config])
    assert [line for line in res.stdout.splitlines() if line.startswith("stage finalize")][0].endswith(
        "ShiftThresholds")


def test_exec_runs_the_oracle(example_path: Path, tmp_path: Path, cli) -> None:
    x = np.random.default_rng(0).uniform(0, 1, (2, 1, 28, 28)).astype(np.float32)
    npz = tmp_path / "x.npz"
    np.savez(npz, x)  # one input: the unnamed array (arr_0) is taken for it
    out = tmp_path / "y.npz"
    res = cli(["exec", example_path, npz, "-o", out])
    assert res.returncode == 0, res.stderr
    expected = Executor(str(example_path)).run({"x": x})
    with np.load(out) as got:
        name = next(iter(expected))
        np.testing.assert_array_equal(got[name], expected[name])
    assert f"output '{name}': shape (2, 10), float32" in res.stdout and "argmax" in res.stdout
    res = cli(["exec", example_path, npz, "-o", tmp_path / "z"])  # the suffix np.savez adds to a bare name
    assert res.returncode == 0 and "outputs saved to" in res.stdout and (tmp_path / "z.npz").is_file()
    res = cli(["exec", example_path, npz, "--json"])
    assert np.allclose(json.loads(res.stdout)["outputs"][name]["values"], expected[name])
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=np.zeros((2, 3), np.float32))
    res = cli(["exec", example_path, bad])
    assert res.returncode == 2 and res.stderr.startswith("finnlite: error:") and "x" in res.stderr


def test_verify_compares_two_models(example_path: Path, tmp_path: Path, bad_config: Path, cli) -> None:
    good, bad = tmp_path / "good.onnx", tmp_path / "bad.onnx"
    assert cli(["streamline", example_path, "-o", good, "--verify", "off", "-q"]).returncode == 0
    assert cli(["streamline", example_path, "-o", bad, "--verify", "off", "-q", "--config",
                    bad_config]).returncode == 0
    res = cli(["verify", example_path, good])
    assert res.returncode == 0, res.stderr
    assert "float64 agrees on 8/8" in res.stdout
    res = cli(["verify", example_path, bad, "--json", "--samples", "3"])
    assert res.returncode == 1
    data = json.loads(res.stdout)
    assert data["ok"] is False and data["samples"] == 3 and data["final"]["outputs"][0]["error_samples"]
    assert re.search(FINAL_FAILURE, res.stderr)


def test_console_script(example_path: Path, tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "finnlite"
    found = str(script) if script.is_file() else shutil.which("finnlite")
    if found is None:
        pytest.skip("the finnlite console script is not installed (pip install -e . installs it)")
    res = run_cli(["streamline", example_path, "-o", tmp_path / "o.onnx", "-q"], script=[found])
    assert res.returncode == 0, res.stderr
    assert "verification (each" in res.stdout and "): OK" in res.stdout
    res = run_cli(["--nonsense"], script=[found])
    assert res.returncode == 2 and res.stderr.startswith("usage: finnlite")


def test_the_core_does_not_import_the_faces() -> None:
    code = ("import sys, finnlite, streamline.pipeline, verify, custom_ops.executor\n"
            "faces = [m for m in ('finnlite.cli', 'finnlite.build', 'finnlite.report', 'finnlite.config', "
            "'finnlite.cost') if m in sys.modules]\n"
            "assert not faces, faces\n")
    res = run_cli(["-c", code], script=[sys.executable])
    assert res.returncode == 0, res.stderr
