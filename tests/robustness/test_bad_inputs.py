"""Bad input never crashes the CLI and never gives a wrong model silently.

Each case writes a broken input into a fresh folder and runs ``python -m finnlite.cli`` as a user would. It must
exit with code 2 (bad input or usage) or 1 (failed verification), print exactly one line on stderr that names the
problem and where it is (file, node or tensor) and no traceback, leave the input files byte-for-byte unchanged
(compared by hash), and write no output (not even a partial or temporary file).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.robustness.badmodels import good_model, multithreshold_model, node, set_attr, set_init

REPO = Path(__file__).resolve().parents[2]
IN, OUT = "in.onnx", "out.onnx"
STREAMLINE = ["streamline", IN, "-o", OUT]


def run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``python -m finnlite.cli ARGS`` in ``cwd`` with the repository importable."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "finnlite.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def write(path: Path, model: onnx.ModelProto) -> None:
    path.write_bytes(model.SerializeToString())


def sha256_tree(folder: Path) -> dict[str, str]:
    """The hash of every file under ``folder`` (relative name → sha256)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@dataclass
class Case:
    """A bad input: ``setup`` writes files into the folder and returns the CLI arguments; the run must exit with
    ``code`` and its one-line message contain every string of ``expect``."""

    id: str
    setup: Callable[[Path], list[str]]
    expect: tuple[str, ...]
    code: int = 2


def with_model(edit: Callable[[onnx.ModelProto], onnx.ModelProto | None] | None = None,
               args: list[str] | None = None) -> Callable[[Path], list[str]]:
    """A setup that writes the good model, edited in place by ``edit`` (or replaced by its result), as in.onnx."""
    def setup(tmp: Path) -> list[str]:
        model = good_model()
        if edit is not None:
            model = edit(model) or model
        write(tmp / IN, model)
        return list(args or STREAMLINE)
    return setup


def with_bytes(data: bytes | Callable[[], bytes]) -> Callable[[Path], list[str]]:
    def setup(tmp: Path) -> list[str]:
        (tmp / IN).write_bytes(data() if callable(data) else data)
        return list(STREAMLINE)
    return setup


# -- model edits -------------------------------------------------------------------------------------------------
def quant_param(node_name: str, which: str, value: object, dtype: type = np.float32) -> Callable:
    """Replace the scale / zeropt / bits initializer of one of good_model's quantizers."""
    prefix = {"in_quant": "in", "w1_quant": "w1q", "act_quant": "act", "w2_quant": "w2q"}[node_name]

    def edit(m: onnx.ModelProto) -> None:
        set_init(m, f"{prefix}_{which}", value, dtype)
    return edit


def attr(node_name: str, key: str, value: object) -> Callable:
    return lambda m: set_attr(m, node_name, key, value)


def drop_attr(node_name: str, key: str) -> Callable:
    def edit(m: onnx.ModelProto) -> None:
        n = node(m, node_name)
        kept = [a for a in n.attribute if a.name != key]
        del n.attribute[:]
        n.attribute.extend(kept)
    return edit


def rewire(node_name: str, index: int, tensor: str) -> Callable:
    def edit(m: onnx.ModelProto) -> None:
        node(m, node_name).input[index] = tensor
    return edit


def retype(node_name: str, op_type: str, domain: str | None = None) -> Callable:
    def edit(m: onnx.ModelProto) -> None:
        n = node(m, node_name)
        n.op_type = op_type
        if domain is not None:
            n.domain = domain
            if domain and domain not in {o.domain for o in m.opset_import}:
                m.opset_import.append(helper.make_opsetid(domain, 1))
    return edit


def duplicate_producer(m: onnx.ModelProto) -> None:
    m.graph.node.insert(4, helper.make_node("Relu", ["h1"], ["r1"], name="relu1_again"))


def drop_third_input(m: onnx.ModelProto) -> None:
    del node(m, "act_quant").input[3]


def declare(tensor: str, shape: list[int], where: str = "value_info") -> Callable:
    def edit(m: onnx.ModelProto) -> None:
        vi = helper.make_tensor_value_info(tensor, onnx.TensorProto.FLOAT, shape)
        if where == "output":
            m.graph.output[0].CopyFrom(vi)
        else:
            m.graph.value_info.append(vi)
    return edit


def annotate(tensor: str, datatype: str) -> Callable:
    def edit(m: onnx.ModelProto) -> None:
        ann = m.graph.quantization_annotation.add()
        ann.tensor_name = tensor
        entry = ann.quant_parameter_tensor_names.add()
        entry.key, entry.value = "finn_datatype", datatype
    return edit


def tensor_proto() -> bytes:
    """A serialized TensorProto: protobuf, but its fields clash with a ModelProto's."""
    return onnx.numpy_helper.from_array(np.arange(6, dtype=np.float32), "t").SerializeToString()


def dimension_proto() -> bytes:
    """A serialized TensorShapeProto.Dimension: its fields parse as a ModelProto's (ir_version, producer_name), so
    protobuf accepts it, but there is no graph."""
    return onnx.TensorShapeProto.Dimension(dim_value=7, dim_param="batch").SerializeToString()


def model_without_graph() -> bytes:
    return onnx.ModelProto(ir_version=10, producer_name="nothing").SerializeToString()


def truncated() -> bytes:
    data = good_model().SerializeToString()
    return data[: len(data) // 2]


def truncated_at_field_boundary() -> bytes:
    """The good model cut just before its opset imports (the last fields): protobuf parses what is left."""
    full = good_model()
    cut = onnx.ModelProto()
    cut.CopyFrom(full)
    del cut.opset_import[:]
    data, prefix = full.SerializeToString(), cut.SerializeToString()
    assert data.startswith(prefix)
    return prefix


# -- external data -----------------------------------------------------------------------------------------------
def external(location: str, *, write_bytes: int | None = None, length: bool = True,
             link_to: str | None = None) -> Callable[[Path], list[str]]:
    """good_model with initializer 'w1' stored externally at ``location`` (relative to in.onnx's folder); the file
    gets the first ``write_bytes`` bytes of the data (all of it when None; nothing is written for a negative), or
    is a symbolic link to ``link_to``."""
    def setup(tmp: Path) -> list[str]:
        model = good_model()
        tensor = next(t for t in model.graph.initializer if t.name == "w1")
        raw = onnx.numpy_helper.to_array(tensor).tobytes()
        tensor.ClearField("float_data")
        tensor.ClearField("raw_data")
        tensor.data_location = onnx.TensorProto.EXTERNAL
        entries = [("location", location), ("offset", "0")] + ([("length", str(len(raw)))] if length else [])
        for key, value in entries:
            e = tensor.external_data.add()
            e.key, e.value = key, value
        if link_to is not None:
            (tmp / location).symlink_to(link_to)
        elif write_bytes is None or write_bytes >= 0:
            target = tmp / location
            if target.resolve().is_relative_to(tmp.resolve()):
                target.write_bytes(raw if write_bytes is None else raw[:write_bytes])
        write(tmp / IN, model)
        return list(STREAMLINE)
    return setup


# -- output paths --------------------------------------------------------------------------------------------------
def output_args(out: str, mkdir: str | None = None, symlink: bool = False) -> Callable[[Path], list[str]]:
    def setup(tmp: Path) -> list[str]:
        write(tmp / IN, good_model())
        if mkdir:
            (tmp / mkdir).mkdir()
        if symlink:
            (tmp / "link.onnx").symlink_to(tmp / IN)
        return ["streamline", IN, "-o", out]
    return setup


def mt_model(thresholds: np.ndarray, channels: int | None = None) -> Callable[[Path], list[str]]:
    def setup(tmp: Path) -> list[str]:
        write(tmp / IN, multithreshold_model(thresholds, channels))
        return list(STREAMLINE)
    return setup


def with_config(text: str | None) -> Callable[[Path], list[str]]:
    """The good model with ``--config cfg.yaml`` holding ``text`` (no file for None)."""
    def setup(tmp: Path) -> list[str]:
        write(tmp / IN, good_model())
        if text is not None:
            (tmp / "cfg.yaml").write_text(text)
        return [*STREAMLINE, "--config", "cfg.yaml"]
    return setup


def with_inputs(arrays: dict[str, np.ndarray] | bytes | None) -> Callable[[Path], list[str]]:
    """The good model with ``--inputs x.npz`` holding ``arrays`` (raw bytes as they are; no file for None)."""
    def setup(tmp: Path) -> list[str]:
        write(tmp / IN, good_model())
        if isinstance(arrays, bytes):
            (tmp / "x.npz").write_bytes(arrays)
        elif arrays is not None:
            np.savez(tmp / "x.npz", **arrays)
        return [*STREAMLINE, "--inputs", "x.npz"]
    return setup


def _dir_as_input(tmp: Path) -> list[str]:
    (tmp / IN).mkdir()
    return list(STREAMLINE)


def _cycle(m: onnx.ModelProto) -> None:
    node(m, "relu1").input[0] = "y"  # relu1 reads fc2's output, which depends on relu1


CASES = [
    # reading the file
    Case("missing-file", lambda tmp: list(STREAMLINE), (f"'{IN}'", "no such file")),
    Case("directory", _dir_as_input, (f"'{IN}'", "is a directory")),
    Case("empty-file", with_bytes(b""), (f"'{IN}'", "empty")),
    Case("truncated-protobuf", with_bytes(truncated), (f"'{IN}'", "cannot parse")),
    Case("truncated-at-field-boundary", with_bytes(truncated_at_field_boundary), (f"'{IN}'", "imports no opset")),
    Case("unknown-opset-version", with_model(lambda m: setattr(m.opset_import[0], "version", 99)),
         (f"'{IN}'", "opset 99")),
    Case("garbage-text", with_bytes(b"this is not a model\n"), (f"'{IN}'", "not an ONNX model", "cannot parse")),
    Case("protobuf-tensor-not-a-model", with_bytes(tensor_proto), (f"'{IN}'", "not an ONNX model")),
    Case("protobuf-other-message", with_bytes(dimension_proto), (f"'{IN}'", "not an ONNX model", "no graph")),
    Case("model-without-graph", with_bytes(model_without_graph), (f"'{IN}'", "not an ONNX model", "no graph")),
    # graph structure
    Case("cycle", with_model(_cycle), (f"'{IN}'", "cycle")),
    Case("duplicate-producer", with_model(duplicate_producer), ("'relu1_again'", "'r1'", "produced more than once")),
    Case("dangling-input", with_model(rewire("fc2", 0, "a1_typo")), ("'fc2'", "'a1_typo'", "not produced")),
    Case("unproduced-output", with_model(lambda m: setattr(m.graph.output[0], "name", "y_typo")),
         ("'y_typo'", "not produced")),
    Case("unknown-domain", with_model(retype("relu1", "Relu", "com.example.ops")),
         ("'relu1'", "unknown op domain 'com.example.ops'", "'Relu'")),
    Case("unknown-custom-op", with_model(retype("act_quant", "FancyQuant", "qonnx.custom_op.general")),
         ("'act_quant'", "unknown custom op 'FancyQuant'")),
    Case("unknown-op-type", with_model(retype("relu1", "Relux")), ("'relu1'", "unknown op type 'Relux'")),
    # Quant parameters
    Case("bitwidth-0", with_model(quant_param("act_quant", "bits", 0.0)), ("'act_quant'", "bitwidth", "at least 1")),
    Case("bitwidth-negative", with_model(quant_param("w1_quant", "bits", -3.0)),
         ("'w1_quant'", "bitwidth", "at least 1")),
    Case("bitwidth-non-integer", with_model(quant_param("act_quant", "bits", 2.5)),
         ("'act_quant'", "bitwidth", "integer", "2.5")),
    Case("bitwidth-nan", with_model(quant_param("in_quant", "bits", np.nan)),
         ("'in_quant'", "bitwidth", "integer", "nan")),
    Case("bitwidth-too-large", with_model(quant_param("in_quant", "bits", 1e6)),
         ("'in_quant'", "bitwidth", "at most 64", "1000000")),
    Case("bitwidth-per-channel", with_model(quant_param("w1_quant", "bits", np.full(6, 3.0))),
         ("'w1_quant'", "bitwidth", "single value")),
    Case("scale-zero", with_model(quant_param("act_quant", "scale", 0.0)), ("'act_quant'", "scale", "> 0")),
    Case("scale-negative", with_model(quant_param("act_quant", "scale", -0.25)), ("'act_quant'", "scale", "> 0")),
    Case("scale-nan", with_model(quant_param("in_quant", "scale", np.nan)), ("'in_quant'", "scale", "finite")),
    Case("scale-inf", with_model(quant_param("w2_quant", "scale", np.inf)), ("'w2_quant'", "scale", "finite")),
    Case("scale-per-channel-one-negative",
         with_model(quant_param("w1_quant", "scale", np.array([0.1, 0.2, -0.1, 0.3, 0.1, 0.1]))),
         ("'w1_quant'", "scale", "> 0")),
    Case("zeropoint-out-of-range", with_model(quant_param("act_quant", "zeropt", 20.0)),
         ("'act_quant'", "zero-point 20", "outside", "[0, 15]")),
    Case("zeropoint-out-of-range-narrow", with_model(quant_param("w2_quant", "zeropt", -8.0)),
         ("'w2_quant'", "zero-point -8", "outside", "[-7, 7]")),
    Case("zeropoint-nan", with_model(quant_param("act_quant", "zeropt", np.nan)), ("'act_quant'", "zero-point",
                                                                                    "finite")),
    Case("scale-wrong-channel-count", with_model(quant_param("w1_quant", "scale", np.full(8, 0.1))),
         ("'w1_quant'", "scale", "(8,)", "does not broadcast", "(8, 6)")),
    Case("scale-wrong-rank", with_model(quant_param("act_quant", "scale", np.full((1, 6, 1), 0.25))),
         ("'act_quant'", "scale", "(1, 6, 1)", "more dimensions")),
    Case("rounding-mode-unknown", with_model(attr("act_quant", "rounding_mode", "STOCHASTIC")),
         ("'act_quant'", "unknown rounding mode 'STOCHASTIC'")),
    Case("signed-not-a-flag", with_model(attr("w1_quant", "signed", 2)), ("'w1_quant'", "'signed'", "0 or 1")),
    Case("quant-missing-attribute", with_model(drop_attr("act_quant", "narrow")),
         ("'act_quant'", "missing required attribute 'narrow'")),
    Case("quant-missing-input", with_model(drop_third_input), ("'act_quant'", "takes 4 inputs, got 3")),
    Case("weights-nan", with_model(lambda m: set_init(m, "w2", np.full((6, 4), np.nan))),
         ("'w2_quant'", "'w2'", "NaN")),
    # MultiThreshold
    Case("thresholds-unsorted", mt_model(np.array([[0.0, 1.0, 2.0], [0.0, 2.0, 1.0]])),
         ("'mt'", "thresholds", "not sorted", "row 1")),
    Case("thresholds-nan", mt_model(np.array([[0.0, 1.0, 2.0], [0.0, np.nan, 2.0]])),
         ("'mt'", "thresholds", "NaN", "row 1")),
    Case("thresholds-wrong-rows", mt_model(np.array([[0.0, 1.0], [0.0, 1.0], [1.0, 2.0]]), channels=2),
         ("'mt'", "3 rows", "2 channels")),
    # shapes
    Case("matmul-shapes-contradict", with_model(lambda m: set_init(m, "w1", np.ones((10, 6)))),
         ("'fc1'", "MatMul", "Incompatible dimensions")),
    Case("declared-output-shape-contradicts", with_model(declare("y", [1, 5], "output")),
         ("'fc2'", "'y'", "declared shape (1, 5) contradicts", "(1, 4)")),
    Case("declared-value-info-contradicts", with_model(declare("h1", [1, 7])),
         ("'fc1'", "'h1'", "declared shape (1, 7) contradicts", "(1, 6)")),
    Case("declared-rank-contradicts", with_model(declare("r1", [1, 6, 1])),
         ("'relu1'", "'r1'", "declared shape (1, 6, 1) contradicts", "(1, 6)")),
    Case("datatype-annotation-unknown", with_model(annotate("a1", "UINT4X")), ("'a1'", "'UINT4X'", "not a datatype")),
    # external data
    Case("external-data-missing", external("w1.bin", write_bytes=-1), ("'w1'", "'w1.bin'", "missing")),
    Case("external-data-truncated", external("w1.bin", write_bytes=100), ("'w1'", "'w1.bin'", "truncated")),
    Case("external-data-outside-folder", external("../../etc/passwd", length=False),
         ("'w1'", "'../../etc/passwd'", "outside the model's folder")),
    Case("external-data-absolute-path", external("/etc/passwd", length=False),
         ("'w1'", "'/etc/passwd'", "outside the model's folder")),
    Case("external-data-symlink-outside", external("w1.bin", link_to="/etc/passwd", length=False),
         ("'w1'", "'w1.bin'", "outside the model's folder")),
    # output paths
    Case("output-folder-missing", output_args("nowhere/out.onnx"), ("'nowhere/out.onnx'", "folder does not exist")),
    Case("output-is-input", output_args(IN), (f"'{IN}'", "overwrite the input")),
    Case("output-is-input-other-spelling", output_args(f"./sub/../{IN}", mkdir="sub"), ("overwrite the input",)),
    Case("output-is-input-via-symlink", output_args("link.onnx", symlink=True), ("overwrite the input",)),
    Case("output-is-directory", output_args("outdir", mkdir="outdir"), ("'outdir'", "is a directory")),
    # options
    Case("unknown-stage", with_model(args=[*STREAMLINE, "--stages", "tidy", "polish"]), ("unknown stage", "polish")),
    # configuration file
    Case("config-unknown-key", with_config("stages: [tidy, convert]\nstagez: [tidy]\n"),
         ("'cfg.yaml'", "stagez")),
    Case("config-unknown-nested-key", with_config("verification:\n  mode: final\n  sample: 4\n"),
         ("'cfg.yaml'", "sample")),
    Case("config-wrong-type", with_config("verification:\n  samples: many\n"), ("'cfg.yaml'", "samples", "many")),
    Case("config-stages-not-a-list", with_config("stages: 7\n"), ("'cfg.yaml'", "stages")),
    Case("config-not-yaml", with_config("stages: [tidy, convert\n"), ("'cfg.yaml'", "YAML")),
    Case("config-not-a-mapping", with_config("- tidy\n- convert\n"), ("'cfg.yaml'",)),
    Case("config-missing", with_config(None), ("'cfg.yaml'",)),
    # reference inputs
    Case("inputs-wrong-shape", with_inputs({"x": np.zeros((3, 5), np.float32)}), ("'x'", "(3, 5)", "(1, 8)")),
    Case("inputs-wrong-dtype", with_inputs({"x": np.full((2, 8), "a")}), ("'x'", "dtype", "<U1")),
    Case("inputs-wrong-name", with_inputs({"x": np.zeros((2, 8), np.float32), "z": np.zeros(3, np.float32)}),
         ("'z'", "not an input")),
    Case("inputs-nan", with_inputs({"x": np.full((2, 8), np.nan, np.float32)}), ("'x'", "NaN")),
    Case("inputs-not-npz", with_inputs(b"PK but not a zip file"), ("'x.npz'", "cannot read")),
    Case("inputs-missing", with_inputs(None), ("'x.npz'", "not found")),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case: Case, tmp_path: Path) -> None:
    args = case.setup(tmp_path)
    before = sha256_tree(tmp_path)
    proc = run_cli(args, tmp_path)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{proc.stderr}"
    message = lines[0]
    assert proc.returncode == case.code, message
    assert message.startswith("finnlite: error: "), message
    for text in case.expect:
        assert text in message, f"{text!r} not in {message!r}"
    assert sha256_tree(tmp_path) == before, "the run changed, created or removed files"


def test_at_least_30_cases() -> None:
    assert len(CASES) >= 30
    assert len({c.id for c in CASES}) == len(CASES)


def test_success_leaves_the_input_alone(tmp_path: Path) -> None:
    """The good model streamlines (exit 0), the input is unchanged and no temporary file is left behind."""
    write(tmp_path / IN, good_model())
    digest = sha256_tree(tmp_path)[IN]
    proc = run_cli([*STREAMLINE, "--quiet"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert sha256_tree(tmp_path)[IN] == digest
    assert sorted(p.name for p in tmp_path.iterdir()) == [IN, OUT]
    onnx.checker.check_model(onnx.load(str(tmp_path / OUT)))


BAD_RULES = """
def double_w2(model):
    \"\"\"A wrong user pass: doubles the weights of the second layer once.\"\"\"
    if model.get_initializer("w2") is None or "doubled" in model.graph.metadata_props:
        return False
    model.set_initializer("w2", model.get_initializer("w2") * 2)
    model.graph.metadata_props["doubled"] = "1"
    return True
"""


@pytest.mark.declines
def test_a_failing_pass_is_declined_and_strict_exits_1(tmp_path: Path) -> None:
    """A (user) pass that changes what the model computes, with per-pass checks (the default): the pass run is
    undone and declined, the model is written and the run exits 0, naming the pass; ``--strict`` exits 1."""
    write(tmp_path / IN, good_model())
    (tmp_path / "bad_rules.py").write_text(BAD_RULES)
    (tmp_path / "cfg.yaml").write_text("passes:\n  - pass: bad_rules:double_w2\n    stage: tidy\n")
    proc = run_cli([*STREAMLINE, "--config", "cfg.yaml", "--quiet"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "double_w2 (stage 'tidy'): the whole pass run declined; failing tensor 'w2_q'" in proc.stdout
    assert proc.stderr == "" and (tmp_path / OUT).is_file()
    proc = run_cli([*STREAMLINE, "--config", "cfg.yaml", "--quiet", "--strict"], tmp_path)
    assert proc.returncode == 1 and "finnlite: strict: rewrite declined by verification: double_w2" in proc.stderr


@pytest.mark.parametrize("mode, says", [("final", "differs from")])
def test_failed_verification_exits_1(mode: str, says: str, tmp_path: Path) -> None:
    """A (user) pass that changes what the model computes, checked by the final check only: exit code 1 and an
    error naming the output; nothing is written under the asked name (the result is kept as
    ``out.unverified.onnx`` for inspection). (With per-pass checks the pass is declined instead, above.)"""
    write(tmp_path / IN, good_model())
    (tmp_path / "bad_rules.py").write_text(BAD_RULES)
    (tmp_path / "cfg.yaml").write_text("passes:\n  - pass: bad_rules:double_w2\n    stage: tidy\n")
    before = sha256_tree(tmp_path)
    proc = run_cli([*STREAMLINE, "--config", "cfg.yaml", "--quiet", "--verify", mode], tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("finnlite: error: ")]
    assert len(errors) == 1, proc.stderr
    assert "'y'" in errors[0] and says in errors[0], errors[0]
    assert not (tmp_path / OUT).exists()
    after = sha256_tree(tmp_path)
    assert {k: v for k, v in after.items() if k in before} == before
    assert "out.unverified.onnx" in after  # a failing final check leaves the complete result for inspection


@pytest.mark.parametrize("args", [["streamline", IN], ["streamline"], ["polish", IN],
                                  [*STREAMLINE, "--verify", "maybe"]],
                         ids=["no-output", "no-input", "unknown-command", "bad-choice"])
def test_usage_errors_exit_2(args: list[str], tmp_path: Path) -> None:
    """Usage mistakes: argparse's usage line and one error line, exit code 2, no traceback."""
    write(tmp_path / IN, good_model())
    proc = run_cli(args, tmp_path)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("usage: ") and lines[-1].startswith("finnlite") and "error: " in lines[-1], proc.stderr


def test_internal_error_is_one_line_with_its_own_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture) -> None:
    """A bug (an unexpected exception) is reported in one line with exit code 3, not as a user mistake."""
    import finnlite.build
    from finnlite.cli import INTERNAL_ERROR, main

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("something\nunexpected")

    write(tmp_path / IN, good_model())
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FINNLITE_TRACEBACK", raising=False)
    monkeypatch.setattr(finnlite.build, "streamline", broken)
    assert main(STREAMLINE) == INTERNAL_ERROR == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("finnlite: internal error: RuntimeError: something unexpected"), err
    assert not (tmp_path / OUT).exists()


def test_failed_save_keeps_the_old_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture) -> None:
    """Outputs are written atomically: when the final rename fails (a full disk, say), an existing output file is
    left as it was, no temporary file remains, and the CLI reports it in one line with exit code 2."""
    import finnlite.core.io
    from finnlite.cli import main

    write(tmp_path / IN, good_model())
    (tmp_path / OUT).write_bytes(b"previous result")

    def no_space(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(finnlite.core.io.os, "replace", no_space)
    assert main([*STREAMLINE, "--quiet", "--verify", "off"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"'{OUT}'" in err[0] and "No space left on device" in err[0], err
    assert (tmp_path / OUT).read_bytes() == b"previous result"
    assert sorted(p.name for p in tmp_path.iterdir()) == [IN, OUT]
