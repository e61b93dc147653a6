"""Per-layer widths as FINN sizes them (``finnlite info``'s layer table, issue 26): weight, input, accumulator and
output datatypes, the accumulator checked against enumeration and against the values the executor computes."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from custom_ops.executor import Executor
from finnlite import DataType, Model
from finnlite.core.compat import QONNX_DOMAIN, make_model
from finnlite.cost import inference_cost
from streamline.pipeline import streamline_model
from tests.zoo import random_input, zoo_model_path

W1 = np.array([[3, -2, 1], [-3, 0, 2]], np.float32)  # [K=2, N=3]
W2 = np.array([[1, -1], [1, 1], [-1, 1]], np.float32)  # ±1


def _model() -> Model:
    """x (INT3) → MatMul(W1) → MultiThreshold (UINT2 levels) → MatMul(W2, BIPOLAR) → y: a layer FINN fuses with
    its thresholds, then one without (FINN's output is then its accumulator)."""
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["m1"], name="mm1"),
             helper.make_node("MultiThreshold", ["m1", "T"], ["a"], domain=QONNX_DOMAIN, out_dtype="UINT2",
                              name="mt"),
             helper.make_node("MatMul", ["a", "W2"], ["y"], name="mm2")]
    inits = [numpy_helper.from_array(W1, "W1"), numpy_helper.from_array(W2, "W2"),
             numpy_helper.from_array(np.array([[-4.0, 0.0, 4.0]], np.float32), "T")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])], initializer=inits)
    m = Model(make_model(graph))
    for name, dt in (("x", "INT3"), ("W1", "INT3"), ("W2", "BIPOLAR"), ("m1", "INT6"), ("a", "UINT2"),
                     ("y", "INT4")):
        m.set_tensor_datatype(name, dt)
    return m


def _enumerated(w: np.ndarray, dt: str) -> tuple[float, float]:
    levels = range(int(DataType[dt].min()), int(DataType[dt].max()) + 1)
    xs = np.array(list(itertools.product(levels, repeat=w.shape[0])), np.float64)
    acc = xs @ w
    return float(acc.min()), float(acc.max())


def test_layer_widths_on_a_small_graph() -> None:
    layers = inference_cost(_model()).layers
    rows = [(c.node, c.weight_dt, c.input_dt, c.acc_dt, c.finn_output_dt) for c in layers]
    # the accumulators by enumeration of every input vector: mm1, INT3 inputs [-4, 3] times W1, [-21, 21] -> INT6;
    # mm2, UINT2 inputs [0, 3] times ±1 columns, [-3, 6] -> INT4, which FINN outputs (no thresholds to fuse)
    assert _enumerated(W1, "INT3") == (-21.0, 21.0) and _enumerated(W2, "UINT2") == (-3.0, 6.0)
    assert rows == [("mm1", "INT3", "INT3", "INT6", "UINT2"), ("mm2", "BIPOLAR", "UINT2", "INT4", "INT4")]


def _info(args: list, capsys: pytest.CaptureFixture[str]) -> str:
    from finnlite.cli import main

    assert main(["info", *map(str, args)]) == 0
    return capsys.readouterr().out


def test_info_prints_the_layer_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "m.onnx"
    _model().save(path)
    lines = _info([path], capsys).splitlines()
    header = lines.index("layers (the widths FINN sizes them with):")
    assert lines[header + 1].split() == ["layer", "op", "weight", "input", "accumulator", "output"]
    assert lines[header + 2].split() == ["mm1", "MatMul", "INT3", "INT3", "INT6", "UINT2"]
    assert lines[header + 3].split() == ["mm2", "MatMul", "BIPOLAR", "UINT2", "INT4", "INT4"]
    data = json.loads(_info([path, "--json"], capsys))
    assert [(x["node"], x["acc_dt"], x["finn_output_dt"]) for x in data["layers"]] == [("mm1", "INT6", "UINT2"),
                                                                                      ("mm2", "INT4", "INT4")]


def test_zoo_widths_hold_the_computed_accumulators() -> None:
    """tfc_2w2a, streamlined: every annotation is the tightest that holds (the audit of bench.datatypes_audit),
    and each layer's accumulator datatype holds its accumulator on random inputs (executor) and the range its
    annotation derives from the actual input range (at most as wide: FINN sizes from the input's datatype)."""
    from bench.datatypes_audit import audit

    model = Model(zoo_model_path("tfc_2w2a"))
    streamline_model(model)
    assert [r for r in audit(model) if r[4] != "tight"] == []
    layers = {c.node: c for c in inference_cost(model).layers}
    macs = [n for n in model.graph if n.name in layers]
    values = Executor(model).run({"x": random_input("tfc_2w2a", batch=8)}, return_all=True)
    checked = 0
    for node in macs:
        layer = layers[node.name]
        if layer.acc_dt == "-":
            continue
        acc = DataType[layer.acc_dt]
        out = values[node.outputs[0].name]
        assert acc.min() <= out.min() and out.max() <= acc.max(), node.name
        assert acc.bitwidth() >= model.get_tensor_datatype(node.outputs[0].name).bitwidth(), node.name
        checked += 1
    assert checked == 4
