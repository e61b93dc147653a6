"""The command as a new user meets it: honest summaries and ``--strict`` (a float first layer is not integer-only),
one-line errors checked before the work, and the small things (``--version``, ``-v``, where the report went, the
verdict of ``verify``, a warning said once)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from finnlite.cli import main
from finnlite.core.compat import QONNX_DOMAIN, make_model
from finnlite.core.io import save_proto
from tests.surfaces.conftest import REPO, float_input_model, run_cli, unquantized_model
from tests.surfaces.test_cli import _Result

HINT = "--input-datatype UINT8"


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):
    def call(args: list) -> _Result:
        try:
            code = main([str(a) for a in args])
        except SystemExit as exc:
            code = exc.code
        out, err = capsys.readouterr()
        return _Result(code, out, err)

    return call


@pytest.fixture
def float_input_path(tmp_path: Path) -> Path:
    path = tmp_path / "float_input.onnx"
    save_proto(float_input_model(), path)
    return path


# -- 1: integer-only only when it is ------------------------------------------------------------------------------
def test_a_float_first_layer_is_not_called_integer_only(float_input_path: Path, tmp_path: Path, cli) -> None:
    report = tmp_path / "r.html"
    res = cli(["streamline", float_input_path, "-o", tmp_path / "o.onnx", "--report", report])
    assert res.returncode == 0, res.stderr
    assert "integer-only)" not in res.stdout.replace("(not integer-only)", "")
    assert "float ops left: the first layer only (not integer-only)" in res.stdout
    assert "the first layer reads the float input: MatMul 'fc1'" in res.stdout and HINT in res.stdout
    html = report.read_text(encoding="utf-8")
    assert "not integer-only</span>" in html and "the first layer reads the float input" in html and HINT in html
    data = json.loads(cli(["streamline", float_input_path, "-o", tmp_path / "o.onnx", "--json", "-q"]).stdout)
    assert data["integer_only"] is False and data["float_ops_left"]["input_layer"] == ["MatMul 'fc1'"]
    assert data["strict"] is None and data["strict_failures"] and "first layer" in data["strict_failures"][0]


def test_strict_fails_a_float_first_layer_and_passes_with_the_preprocessing(float_input_path: Path,
                                                                            tmp_path: Path, cli) -> None:
    out = tmp_path / "o.onnx"
    res = cli(["streamline", float_input_path, "-o", out, "--strict", "-q"])
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [
        f"finnlite: strict: the first layer reads the float input (MatMul 'fc1'); to make it read integers, give "
        f"the input's datatype and preprocessing: {HINT} --input-scale 1/255 --mean M.. --std S (the "
        "'preprocessing' key of a config file)"]
    assert out.is_file()  # verified: written all the same
    res = cli(["streamline", float_input_path, "-o", out, "--strict", "-q", "--input-datatype", "UINT8",
               "--input-scale", "1/255"])
    assert res.returncode == 0, res.stderr
    assert "float ops left: none (integer-only)" in res.stdout and res.stderr == ""


def test_strict_fails_a_model_without_quantizers(tmp_path: Path, cli) -> None:
    path = tmp_path / "float.onnx"
    save_proto(unquantized_model(), path)
    res = cli(["streamline", path, "-o", tmp_path / "o.onnx", "--strict", "--json", "-q"])
    assert res.returncode == 1
    data = json.loads(res.stdout)
    assert data["has_quantizers"] is False and data["strict"]["ok"] is False
    assert "finnlite: strict: the model has no quantizers: it is not a quantized network" in res.stderr
    assert "finnlite: strict: 1 float op(s) left: Relu 'relu'" in res.stderr
    assert "the model has no quantizers" in cli(["streamline", path, "-o", tmp_path / "o.onnx", "-q"]).stdout


def test_strict_passes_an_integer_only_result(example_path: Path, tmp_path: Path, cli) -> None:
    res = cli(["streamline", example_path, "-o", tmp_path / "o.onnx", "--strict", "--json", "-q"])
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["integer_only"] is True and data["strict"] == {"ok": True, "failures": []}


# -- 5: one-line errors, before the work ----------------------------------------------------------------------------
def _one_line_error(res: _Result, *needles: str) -> None:
    assert res.returncode == 2, (res.returncode, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("finnlite: error:"), res.stderr
    assert all(n in lines[0] for n in needles), (needles, lines[0])
    assert "[tidy]" not in res.stderr and "internal error" not in res.stderr


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc, a folder no file can be created in")
def test_an_unwritable_output_is_refused_before_the_work(example_path: Path, tmp_path: Path, cli) -> None:
    _one_line_error(cli(["streamline", example_path, "-o", "/proc/out.onnx"]),
                    "'/proc/out.onnx'", "cannot write to the output folder")
    _one_line_error(cli(["streamline", example_path, "-o", tmp_path / "o.onnx", "--report", "/proc/r.html"]),
                    "cannot write to the report folder")
    assert not (tmp_path / "o.onnx").exists()


def test_inputs_named_otherwise_than_the_model_inputs_are_refused(example_path: Path, tmp_path: Path, cli) -> None:
    npz = tmp_path / "x.npz"
    np.savez(npz, image=np.zeros((2, 1, 1, 28, 28), np.float32))
    _one_line_error(cli(["streamline", example_path, "-o", tmp_path / "o.onnx", "--inputs", npz]),
                    "array 'image' is not an input of the model", "the model's inputs are 'x'")
    _one_line_error(cli(["exec", example_path, npz]), "'image'", "the model's inputs are 'x'")
    np.savez(npz, np.zeros((2, 1, 1, 28, 28), np.float32))  # one unnamed array, for the one input: fine
    assert cli(["streamline", example_path, "-o", tmp_path / "o.onnx", "--inputs", npz, "-q"]).returncode == 0


def _enormous_model() -> onnx.ModelProto:
    """x[1, 3, 60000, 60000] -> input Quant -> GlobalAveragePool -> y (10.8 G input elements per sample)."""
    from onnx import numpy_helper

    inits = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in
             (("s", 1 / 255), ("z", 0.0), ("b", 8.0))]
    nodes = [helper.make_node("Quant", ["x", "s", "z", "b"], ["xq"], "in_quant", domain=QONNX_DOMAIN, signed=0,
                              narrow=0, rounding_mode="ROUND"),
             helper.make_node("GlobalAveragePool", ["xq"], ["y"], "pool")]
    graph = helper.make_graph(nodes, "huge", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                            [1, 3, 60000, 60000])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 1, 1])], initializer=inits)
    return make_model(graph)


def test_an_enormous_input_is_refused_before_allocating(tmp_path: Path, cli) -> None:
    path = tmp_path / "huge.onnx"
    save_proto(_enormous_model(), path)
    res = cli(["streamline", path, "-o", tmp_path / "o.onnx"])
    _one_line_error(res, "the reference data need about", "GB (8 samples of x 1x3x60000x60000)", "--verify off")


def test_a_closed_stdout_ends_quietly(example_path: Path, tmp_path: Path) -> None:
    """``finnlite streamline ... --json | head -c 10``: the reader goes away before the JSON is written."""
    cmd = [sys.executable, "-m", "finnlite.cli", "streamline", str(example_path), "-o", str(tmp_path / "o.onnx"),
           "--json", "-q", "--verify", "off"]
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp_path)
    proc.stdout.close()  # closed before anything was written
    err = proc.stderr.read().decode()
    proc.wait(timeout=300)
    assert proc.returncode == 141 and err == "", (proc.returncode, err)
    assert (tmp_path / "o.onnx").is_file()


# -- 7: the small things ------------------------------------------------------------------------------------------
def test_version(cli) -> None:
    import finnlite

    res = cli(["--version"])
    assert res.returncode == 0 and res.stdout.strip() == f"finnlite {finnlite.__version__}"


def test_verbose_logs_each_pass_and_its_rewrites(example_path: Path, tmp_path: Path) -> None:
    for args in (["-v", "streamline"], ["streamline", "-v"]):
        res = run_cli([*args, example_path, "-o", tmp_path / "o.onnx", "-q", "--verify", "off"])
        assert res.returncode == 0, res.stderr
        lines = [line for line in res.stderr.splitlines() if line.startswith("INFO: [")]
        assert any(line.startswith("INFO: [tidy] GemmToMatMul: changed, 4 rewrite(s)") for line in lines), lines
        assert any(line.startswith("INFO: [streamline round 1] AbsorbMulIntoMultiThreshold:") for line in lines)
        assert any(": no change," in line for line in lines)
    quiet = run_cli(["streamline", example_path, "-o", tmp_path / "o.onnx", "-q", "--verify", "off"])
    assert "INFO:" not in quiet.stderr


def test_the_summary_says_where_the_report_went(example_path: Path, tmp_path: Path, cli) -> None:
    report = tmp_path / "r.html"
    res = cli(["streamline", example_path, "-o", tmp_path / "o.onnx", "--report", report, "-q"])
    assert res.returncode == 0 and res.stdout.rstrip().splitlines()[-1] == f"report: {report}"
    data = json.loads(cli(["streamline", example_path, "-o", tmp_path / "o.onnx", "--report", report, "-q",
                           "--json"]).stdout)
    assert data["report"] == str(report)


def test_verify_ends_with_a_one_word_verdict(example_path: Path, bad_config: Path, tmp_path: Path, cli) -> None:
    good, bad = tmp_path / "good.onnx", tmp_path / "bad.onnx"
    assert cli(["streamline", example_path, "-o", good, "--verify", "off", "-q"]).returncode == 0
    assert cli(["streamline", example_path, "-o", bad, "--verify", "off", "-q", "--config", bad_config]
               ).returncode == 0
    res = cli(["verify", example_path, good])
    assert res.returncode == 0 and res.stdout.rstrip().splitlines()[-1] == "OK"
    res = cli(["verify", example_path, bad])
    assert res.returncode == 1 and res.stdout.rstrip().splitlines()[-1] == "FAILED"


def test_the_input_range_guess_is_said_once(float_input_path: Path, tmp_path: Path) -> None:
    res = run_cli(["streamline", float_input_path, "-o", tmp_path / "o.onnx"])
    assert res.returncode == 0, res.stderr
    assert (res.stdout + res.stderr).count("WARNING: no input quantizer or datatype gives the range of") == 1
    assert "verified on an assumed input range [-3, 3]" in res.stdout
