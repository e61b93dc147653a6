"""FINN's next step on finnlite's outputs (issues 23 and 26), in the side environment of ``setup_env.sh``.

Every zoo model (the two ImageNet ones also with the README's input preprocessing, ``*_pre``), every committed
corpus model and ProxylessNAS from the corpus cache (``$FINNLITE_CORPUS``, made by ``tests/corpus/export_imagenet.py``;
with the preprocessing, skipped when the export is absent) is streamlined here (the default pipeline, final check), then handed to finn-plus 1.6.1 in the side
environment (``$FINNLITE_FINN_PYTHON``; the tests skip, saying so, without it): ``handoff.py`` runs FINN's
``step_convert_to_hw``, ``step_minimize_bit_width_initial`` and ``step_create_dataflow_partition``. A model passes
when FINN's unsupported-layers analysis passes and the accelerator is one partition, with nothing left in software
but layout ops at its borders and at most one final float Mul and one Add, and no float HW layer but those (FINN
maps a final Mul/Add to float ElementwiseMul/ElementwiseAdd layers) and the input side's (a layout op or the
thresholds of the float input). Models that do not pass are in :data:`KNOWN_GAPS` with FINN's reason, as strict
xfails. One more test runs the README's FINN example (``build_dataflow_cfg`` with ``finnlite.build.step_streamline``
as the custom step, up to ``step_create_dataflow_partition``) as it is, on the zoo's TFC models.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.corpus.check import cache_dir, committed_entries, model_path
from tests.zoo import ZOO_MODELS, manifest, random_input, zoo_available, zoo_dir

HERE = Path(__file__).resolve().parent
HANDOFF = HERE / "handoff.py"
LAYOUT = ("Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Shuffle")
#: the README's input preprocessing (ImageNet) for the zoo models that read the float input
PREPROCESSED = ("mobilenet_v1_4b", "resnet18_4w4a_ts")
#: the same for ImageNet exports of the corpus cache (no input quantizer either)
CACHED_PREPROCESSED = ("quant_proxylessnas_mobile14_4b",)

pytestmark = pytest.mark.slow


def finn_python() -> Path:
    """The side environment's python, or skip saying why."""
    value = os.environ.get("FINNLITE_FINN_PYTHON")
    if not value:
        pytest.skip("no finn-plus side environment: set FINNLITE_FINN_PYTHON to its python "
                    "(tests/finn/setup_env.sh makes one)")
    path = Path(value)
    if not path.is_file():
        pytest.skip("FINNLITE_FINN_PYTHON names no existing file (tests/finn/setup_env.sh makes the environment)")
    return path


_FLOAT_CONV = ("{why}: the float {what} stays in software between HW layers: step_create_dataflow_partition: "
               "'Unsupported/unmapped layer(s) found in between FINN operators, starting with node MatMul_0'")

#: model -> why FINN's hand-off does not pass (checked: an entry that passes makes its test fail)
KNOWN_GAPS: dict[str, str] = {
    **{f"perchannel_maxpool_{e}": _FLOAT_CONV.format(
        why="per-channel activation scales into channel-mixing layers, impossible exactly (tests/corpus "
        "KNOWN_GAPS; perchannel_exact is the form that passes)", what="second Conv (Im2Col, MatMul) and classifier "
        "MatMul") for e in ("dyn", "ts")},
    **{m: "the first Conv reads the float input (no input quantizer): its Im2Col and float MatMul stay in software "
          f"before the accelerator (one partition); with the README's preprocessing see {m}_pre"
       for m in PREPROCESSED},
}


def _models() -> dict[str, dict[str, Any]]:
    """name -> {path, range, pre}: the zoo models (when present) and the committed corpus."""
    models: dict[str, dict[str, Any]] = {}
    if zoo_available():
        for name in ZOO_MODELS:
            entry = manifest()[name]
            path = zoo_dir() / entry["file"]
            models[name] = {"path": path, "range": tuple(entry["input_range"]), "pre": False}
            if name in PREPROCESSED:
                models[f"{name}_pre"] = {"path": path, "range": None, "pre": True}
    for name in CACHED_PREPROCESSED:
        path = cache_dir() / f"{name}.onnx"
        missing = None if path.is_file() else (f"{path} not found: export it with '$SIDE_PYTHON "
                                               "tests/corpus/export_imagenet.py' or set FINNLITE_CORPUS")
        models[f"{name}_pre"] = {"path": path, "range": None, "pre": True, "missing": missing}
    for name, entry in sorted(committed_entries().items()):
        models[name] = {"path": model_path(entry), "range": tuple(entry["input_range"]), "pre": False,
                        "error": entry.get("error")}
    return models


def _streamline(spec: dict[str, Any], out: Path) -> str | None:
    """Streamline ``spec``'s model to ``out`` with the default pipeline and the final check; an error or None."""
    from finnlite import Model
    from finnlite.build import streamline
    from streamline.preprocess import Preprocessing

    pre = Preprocessing("UINT8", 1 / 255, (0.485, 0.456, 0.406), (0.226,)) if spec["pre"] else None
    model = Model(spec["path"])
    report = streamline(model, verify="final", input_range=spec["range"], preprocessing=pre, extras=False)
    if report.error is not None:
        return f"finnlite's verification failed: {report.error}"
    model.save(out)
    return None


def _run_side(python: Path, mode: str, paths: list[Path], out: Path, timeout: float) -> dict[str, Any]:
    proc = subprocess.run([str(python), str(HANDOFF), mode, *map(str, paths), "--out", str(out)],
                          capture_output=True, text=True, timeout=timeout, cwd=str(out))
    assert proc.returncode == 0, f"handoff.py {mode} failed:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def handoff(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every model streamlined here, then FINN's steps on all of them in one run of the side environment."""
    python = finn_python()
    work = tmp_path_factory.mktemp("finn_handoff")
    results: dict[str, Any] = {}
    paths = []
    for name, spec in _models().items():
        if spec.get("error") or spec.get("missing"):
            continue
        out = work / f"{name}.onnx"
        try:
            error = _streamline(spec, out)
        except Exception as exc:  # noqa: BLE001 - recorded for that model's test
            error = f"finnlite crashed: {type(exc).__name__}: {exc}"
        if error:
            results[name] = {"finnlite_error": error}
        else:
            paths.append(out)
    results.update(_run_side(python, "convert", paths, work, timeout=1800))
    return results


def problems(result: dict[str, Any]) -> list[str]:
    """Every requirement of the module docstring that FINN's result misses, one line each."""
    if "finnlite_error" in result:
        return [result["finnlite_error"]]
    if "convert_error" in result:
        return [f"step_convert_to_hw raised {result['convert_error']}"]
    out = []
    if result["step_error"]:
        out.append(f"step_create_dataflow_partition raised {result['step_error']}")
    if result["partitions"] != 1:
        out.append(f"{result['partitions']} partitions ({result['partition_error'] or 'CreateDataflowPartition'})")
    tail: list[str] = []
    for node in result["software"]:
        if node["op_type"] in LAYOUT and node["where"] != "interior":
            continue
        if node["op_type"] in ("Mul", "Add") and node["where"] in ("tail", "alone"):
            tail.append(node["op_type"])
            continue
        out.append(f"{node['op_type']} '{node['name']}' left in software ({node['where']})")
    for node in result["float_hw"]:
        if node["side"] == "input" and (node["op_type"] in LAYOUT or not node["float_out"]):
            continue
        if node["side"] == "output" and node["op_type"] in ("ElementwiseMul", "ElementwiseAdd"):
            tail.append(node["op_type"].replace("Elementwise", ""))
            continue
        if node["side"] == "output" and node["op_type"] in LAYOUT:
            continue
        out.append(f"float HW layer {node['op_type']} '{node['name']}' ({node['side']})")
    if tail.count("Mul") > 1 or tail.count("Add") > 1:
        out.append(f"the final float ops are more than one Mul and one Add: {', '.join(tail)}")
    return out


def _params() -> list:
    params = []
    for name, spec in _models().items():
        marks = [pytest.mark.xfail(strict=True, reason=KNOWN_GAPS[name])] if name in KNOWN_GAPS else []
        if not spec["pre"] and name in ZOO_MODELS or spec["pre"]:
            marks.append(pytest.mark.zoo)
        params.append(pytest.param(name, id=name, marks=marks))
    return params


@pytest.mark.parametrize("name", _params())
def test_finn_takes_the_model(name: str, handoff: dict[str, Any]) -> None:
    spec = _models()[name]
    if spec.get("error"):
        pytest.skip(f"the exporter failed on this model: {spec['error']}")
    if spec.get("missing"):
        pytest.skip(spec["missing"])
    result = handoff[name]
    found = problems(result)
    assert not found, f"{name}: " + "; ".join(found)


def test_known_gaps_name_models() -> None:
    """Every gap names a model of the corpus or the zoo (a renamed model must not hide a stale entry)."""
    from tests.corpus.check import corpus_names

    known = corpus_names() | set(ZOO_MODELS) | {f"{m}_pre" for m in PREPROCESSED + CACHED_PREPROCESSED}
    stale = [name for name in KNOWN_GAPS if name not in known]
    assert not stale, f"KNOWN_GAPS names models that do not exist: {stale}"


@pytest.mark.zoo
@pytest.mark.parametrize("name", ["tfc_1w1a", "tfc_2w2a"])
def test_readme_finn_build(name: str, tmp_path: Path) -> None:
    """The README's FINN example, as it is: build_dataflow_cfg with finnlite's step up to the partitioning."""
    python = finn_python()
    if not zoo_available():
        pytest.skip("model zoo not found (set FINNLITE_ZOO to its directory; the default is ../shared/zoo beside the "
                    "checkout)")
    folder = tmp_path / name
    folder.mkdir()
    shutil.copy(zoo_dir() / manifest()[name]["file"], folder / "model_qonnx.onnx")
    np.save(folder / "input.npy", random_input(name, seed=1, batch=2))
    result = _run_side(python, "build", [folder], tmp_path, timeout=900)[name]
    assert result["status"] == 0, result
    assert "step_create_dataflow_partition.onnx" in result["intermediate_models"], result
    assert not problems({**result, "step_error": None, "partitions": 1}), problems(result)
    assert result["dataflow_software"] == [] and result["dataflow_nodes"] > 0, result
    report = folder / "build" / "report" / "finnlite_streamline.html"
    assert report.is_file() and "verified</span>" in report.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def join_handoff(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The unequal-scale joins of ``tests/streamline/test_join.py`` (negative multipliers, −1 as a Sub, signed and
    unsigned branches, a fork of thresholds) streamlined here, then FINN's steps on them in one side run."""
    from finnlite import Model
    from finnlite.build import streamline
    from tests.streamline.test_join import JOINS, _join_model

    python = finn_python()
    work = tmp_path_factory.mktemp("finn_joins")
    paths = []
    for i, (s1, s2, qa, qb, outs) in enumerate(JOINS):
        model = Model(_join_model(s1, s2, qa, qb, outs, 16))
        report = streamline(model, verify="final", input_range=(-2.0, 2.0), extras=False)
        assert report.error is None, report.error
        model.save(work / f"join{i}.onnx")
        paths.append(work / f"join{i}.onnx")
    return _run_side(python, "convert", paths, work, timeout=900)


@pytest.mark.parametrize("index", range(6))
def test_finn_takes_integer_join_multipliers(index: int, join_handoff: dict[str, Any]) -> None:
    """p·a + q·b as integer Mul (ElementwiseMul) and Add or Sub (a multiplier −1) layers: one partition."""
    from tests.streamline.test_join import JOINS

    assert len(JOINS) == 6, "parametrize over every join of test_join.JOINS"
    result = join_handoff[f"join{index}"]
    found = problems(result)
    if len(JOINS[index][4]) > 1:  # a fork of output quantizers: one dequantization Mul per graph output
        found = [p for p in found if not p.startswith("the final float ops are more than one Mul")]
    assert not found, found
    assert set(result["hw"]) & {"ElementwiseAdd", "ElementwiseSub"}, result["hw"]
