"""Fixtures for the surface tests: the bundled example model on disk, a config with a wrong user pass, and a
helper running the ``finnlite`` command in a subprocess as a user would."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import pytest

from finnlite.examples import build_tfc
from finnlite.core.io import save_proto

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
#: how a failed final check begins: the outputs differ, or a proof names the node whose thresholds are wrong
FINAL_FAILURE = r"final check: (the streamlined model differs|against the original quantizer)"


def run_cli(args: Sequence[str], *, cwd: Path | None = None, script: Sequence[str] | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``python -m finnlite.cli ARGS`` (or ``script ARGS``) with the repository importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.pop("FINNLITE_TRACEBACK", None)
    cmd = list(script) if script is not None else [sys.executable, "-m", "finnlite.cli"]
    return subprocess.run(cmd + [str(a) for a in args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=timeout)


@pytest.fixture(scope="session")
def example_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled example (a TFC MLP, 2-bit weights and activations) written to a file."""
    path = tmp_path_factory.mktemp("example") / "tfc.onnx"
    save_proto(build_tfc(), path)
    return path


@pytest.fixture
def bad_config(tmp_path: Path) -> Path:
    """A config adding the wrong rule ``bad_rules:ShiftThresholds`` at the end of the finalize stage, with its
    module beside it."""
    shutil.copy(HERE / "bad_rules.py", tmp_path / "bad_rules.py")
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("passes:\n  - pass: bad_rules:ShiftThresholds\n    stage: finalize\n", encoding="utf-8")
    return cfg


def float_input_model() -> "onnx.ModelProto":
    """``tests.robustness.badmodels.good_model`` without its input quantizer: the first MatMul reads the float
    input (as MobileNet-v1 and ResNet-18 exports do)."""
    from tests.robustness.badmodels import good_model

    model = good_model()
    keep = [n for n in model.graph.node if n.name != "in_quant"]
    for n in keep:
        for i, name in enumerate(n.input):
            if name == "x_q":
                n.input[i] = "x"
    del model.graph.node[:]
    model.graph.node.extend(keep)
    return model


def unquantized_model() -> "onnx.ModelProto":
    """A float network without any quantizer: ``x[1, 8] → MatMul(W) → Relu → y``."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from finnlite.core.compat import make_model

    w = numpy_helper.from_array(np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
                               helper.make_node("Relu", ["h"], ["y"], name="relu")], "float_net",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], initializer=[w])
    return make_model(graph)
