"""``finnlite info``'s per-layer widths are the ones FINN builds with (issue 26), in the side environment.

Each model is streamlined here (the default pipeline), then FINN's ``step_convert_to_hw`` and
``step_minimize_bit_width_initial`` run on it (``widths.py``, ``$FINNLITE_FINN_PYTHON``; skipped without it). For
every MVAU / VVAU FINN makes, in graph order, the input, accumulator and output datatypes FINN settles on equal the
ones :func:`finnlite.cost.inference_cost` reports for the corresponding MAC layer (the layers with an integer
input: FINN leaves a float-input layer in software), and the weight datatype equals finnlite's annotation — which
FINN's MinimizeWeightBitWidth therefore does not narrow — except that FINN widens BIPOLAR weights to INT2. Besides
zoo models, whose weights span their quantizers' ranges, a small model whose 8-bit quantizer holds only [-3, 3].
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from finnlite import Model
from finnlite.cost import inference_cost
from streamline.pipeline import streamline_model
from tests.finn.test_finn_handoff import finn_python
from tests.zoo import zoo_model_path

HERE = Path(__file__).resolve().parent
MODELS = ("tfc_1w1a", "tfc_2w2a", "cnv_2w2a", "mobilenet_v1_4b")

pytestmark = pytest.mark.slow


def loose_weights_model() -> Model:
    """UINT4 input → MatMul with an 8-bit weight quantizer whose integers are all in [-3, 3] (INT3, which FINN's
    MinimizeWeightBitWidth finds if finnlite does not) → UINT4 activation → MatMul with ±1 weights (BIPOLAR)."""
    from onnx import helper

    from tests.streamline.convert_helpers import graph_model, init, quant_node

    rng = np.random.default_rng(0)
    w1 = rng.integers(-3, 4, size=(8, 6)).astype(np.float32)
    w1[0, :2] = (-3, 3)
    w2 = np.where(rng.random((6, 4)) < 0.5, -1.0, 1.0).astype(np.float32)
    nodes = [quant_node(["x", "one", "zero", "four"], "a", signed=0, name="qx"),
             quant_node(["W1", "one", "zero", "eight"], "w1q", name="qw1"),
             helper.make_node("MatMul", ["a", "w1q"], ["m1"], name="mm1"),
             quant_node(["m1", "two", "zero", "four"], "b", signed=0, name="qa"),
             quant_node(["W2", "one", "zero", "two_bits"], "w2q", narrow=1, name="qw2"),
             helper.make_node("MatMul", ["b", "w2q"], ["y"], name="mm2")]
    inits = [init("one", np.float32(1)), init("two", np.float32(2)), init("zero", np.float32(0)),
             init("four", np.float32(4)), init("eight", np.float32(8)), init("two_bits", np.float32(2)),
             init("W1", w1), init("W2", w2)]
    return Model(graph_model(nodes, {"x": [1, 8]}, {"y": [1, 4]}, inits))


def test_info_widths_are_finns(tmp_path: Path) -> None:
    python = finn_python()
    ours, paths = {}, []
    for name in ("loose_weights", *MODELS):
        model = loose_weights_model() if name == "loose_weights" else Model(zoo_model_path(name))
        streamline_model(model)
        path = tmp_path / f"{name}.onnx"
        model.save(path)
        paths.append(path)
        ours[name] = [[c.input_dt, c.weight_dt, c.acc_dt, c.finn_output_dt] for c in inference_cost(model).layers
                      if c.acc_dt != "-"]
    proc = subprocess.run([str(python), str(HERE / "widths.py"), *map(str, paths), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=3600, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-4000:]
    finn = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [r[1] for r in ours["loose_weights"]] == ["INT3", "BIPOLAR"]
    for name in ours:
        theirs = finn[name]
        assert not isinstance(theirs, dict), f"{name}: {theirs}"
        assert ours[name], name
        theirs = [[i, w, a, o] for _, i, w, a, o in theirs]
        ours_finn = [[i, "INT2" if w == "BIPOLAR" else w, a, o] for i, w, a, o in ours[name]]
        assert ours_finn == theirs, name
