"""The FINN build step in a minimal ``build_dataflow``-style loop (FINN itself is not a dependency).

The loop below does what FINN's ``build_dataflow_cfg`` does with ``cfg.steps``: a string names a built-in step, a
callable is called as ``step(model, cfg)`` and must return a ModelWrapper; after each step the model is saved to
``<output_dir>/intermediate_models/<step name>.onnx``; an exception fails the build.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import pytest
from qonnx.core.modelwrapper import ModelWrapper

from finnlite import VerificationError
from finnlite.build import make_step_streamline, step_streamline
from finnlite.examples import build_tfc
from tests.qonnx_ref import qonnx_execute
from tests.surfaces.conftest import FINAL_FAILURE, HERE


@dataclass
class BuildConfig:
    """The fields of FINN's DataflowBuildConfig that a streamlining step can read."""

    output_dir: str
    steps: list = field(default_factory=list)
    verify_steps: Optional[list] = None
    verify_input_npy: Optional[str] = "input.npy"
    verify_expected_output_npy: Optional[str] = "expected_output.npy"
    save_intermediate_models: Optional[bool] = True


def step_tidy_up(model: ModelWrapper, cfg: BuildConfig) -> ModelWrapper:
    """A built-in step standing for FINN's (gives unique node names, as FINN's tidy-up does)."""
    from qonnx.transformation.general import GiveUniqueNodeNames

    return model.transform(GiveUniqueNodeNames())


BUILTIN_STEPS: dict[str, Callable] = {"step_tidy_up": step_tidy_up}


def build_dataflow_cfg(model: ModelWrapper, cfg: BuildConfig) -> tuple[int, ModelWrapper]:
    """The step loop of FINN's ``build_dataflow_cfg``: 0 and the final model, or -1 if a step failed."""
    steps = [BUILTIN_STEPS[s] if isinstance(s, str) else s for s in cfg.steps]
    for step in steps:
        try:
            model = step(model, cfg)
        except Exception:  # noqa: BLE001 - FINN prints the traceback and reports "Build failed"
            return -1, model
        assert isinstance(model, ModelWrapper), f"{step.__name__} did not return a ModelWrapper"
        if cfg.save_intermediate_models:
            folder = Path(cfg.output_dir) / "intermediate_models"
            folder.mkdir(parents=True, exist_ok=True)
            model.save(str(folder / f"{step.__name__}.onnx"))
    return 0, model


def _qonnx_model() -> ModelWrapper:
    return ModelWrapper(build_tfc())


def _run(model: ModelWrapper | Any, x: np.ndarray) -> np.ndarray:
    graph = model.graph
    return qonnx_execute(model, {graph.input[0].name: x})[graph.output[0].name]


def test_step_in_a_build_loop(tmp_path: Path) -> None:
    original = _qonnx_model()
    x = np.random.default_rng(0).uniform(0, 1, (1, 1, 28, 28)).astype(np.float32)
    np.save(tmp_path / "input.npy", x)
    cfg = BuildConfig(output_dir=str(tmp_path / "out"), steps=[step_streamline, "step_tidy_up"],
                      verify_steps=["streamlined_python"], verify_input_npy=str(tmp_path / "input.npy"))
    code, result = build_dataflow_cfg(_qonnx_model(), cfg)
    assert code == 0
    assert isinstance(result, ModelWrapper)
    ops = [n.op_type for n in result.graph.node]
    assert ops.count("MultiThreshold") == 4 and ops.count("MatMul") == 4 and "Quant" not in ops
    # integer weights with their datatypes, as FINN's later steps read them
    matmul = result.get_nodes_by_op_type("MatMul")[1]
    assert result.get_tensor_datatype(matmul.input[1]).name == "INT2"
    w = result.get_initializer(matmul.input[1])
    assert np.array_equal(w, np.round(w))
    # qonnx executes the result and agrees with the original, as FINN's verify_step would check
    # (the result carries every shape, as execute_onnx requires; the exported original gets them inferred)
    np.testing.assert_allclose(_run(result, x), _run(original.model, x), atol=1e-3)
    saved = tmp_path / "out" / "intermediate_models" / "step_streamline.onnx"
    assert saved.is_file() and ModelWrapper(str(saved)).get_nodes_by_op_type("MultiThreshold")
    report = (tmp_path / "out" / "report" / "finnlite_streamline.html").read_text(encoding="utf-8")
    assert "verified</span>" in report and "1 samples from" in report and report.count("class=\"fl-graph\"") == 2


def test_verification_settings_come_from_the_finn_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # FINN's default verify_input_npy is input.npy in the working folder: absent here
    cfg = BuildConfig(output_dir=str(tmp_path / "a"), verify_steps=["initial_python"])
    step_streamline(_qonnx_model(), cfg)  # verify_steps without streamlined_python: verification off
    assert "not verified</span>" in (tmp_path / "a/report/finnlite_streamline.html").read_text(encoding="utf-8")
    cfg = BuildConfig(output_dir=str(tmp_path / "b"))  # verify_steps unset: finnlite's default, the final check
    step_streamline(_qonnx_model(), cfg)
    html = (tmp_path / "b/report/finnlite_streamline.html").read_text(encoding="utf-8")
    assert "verified</span>" in html and "8 random samples" in html


def test_a_failing_verification_fails_the_build(tmp_path: Path) -> None:
    (tmp_path / "bad_rules.py").write_text((HERE / "bad_rules.py").read_text(encoding="utf-8"), encoding="utf-8")
    cfg_file = tmp_path / "finnlite.yaml"
    cfg_file.write_text("passes:\n  - pass: bad_rules:ShiftThresholds\n    stage: finalize\n"
                        "verification:\n  mode: final\n  samples: 4\n", encoding="utf-8")
    step = make_step_streamline(cfg_file)
    assert step.__name__ == "step_streamline"
    cfg = BuildConfig(output_dir=str(tmp_path / "out"), steps=[step], verify_steps=[])  # the config's mode wins
    code, _ = build_dataflow_cfg(_qonnx_model(), cfg)
    assert code == -1
    with pytest.raises(VerificationError, match=FINAL_FAILURE):
        step(_qonnx_model(), cfg)
    html = (tmp_path / "out" / "report" / "finnlite_streamline.html").read_text(encoding="utf-8")
    assert "verification FAILED" in html


def test_config_errors_show_when_the_step_is_made(tmp_path: Path) -> None:
    from finnlite import ConfigError

    with pytest.raises(ConfigError, match="key 'verification.mode'"):
        make_step_streamline({"verification": {"mode": "sometimes"}})
    with pytest.raises(ConfigError, match="configuration file not found"):
        make_step_streamline(tmp_path / "none.yaml")


def test_model_wrapper_in_and_out_keep_the_input_untouched() -> None:
    wrapper = _qonnx_model()
    before = wrapper.model.SerializeToString()
    out = step_streamline(wrapper, BuildConfig(output_dir="", verify_steps=[]))
    assert wrapper.model.SerializeToString() == before and out is not wrapper
    assert out.get_nodes_by_op_type("MultiThreshold")


