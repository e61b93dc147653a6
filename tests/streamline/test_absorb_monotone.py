"""Monotone activations before a MultiThreshold (streamline/absorb_monotone.py), checked with the oracle."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from finnlite import Model
from finnlite.core.compat import QONNX_DOMAIN
from streamline.absorb import ABSORB_PASSES, MaterializeThresholds
from streamline.absorb_monotone import AbsorbMonotoneIntoMultiThreshold
from streamline.collapse import COLLAPSE_PASSES
from streamline.datatypes import InferDataTypes
from streamline.real_thresholds import quant_real_thresholds, set_real_thresholds
from tests.streamline.rulecheck import apply, compare, graph_model

RNG = np.random.default_rng(0)
ALL = [InferDataTypes, *COLLAPSE_PASSES, *ABSORB_PASSES, AbsorbMonotoneIntoMultiThreshold, InferDataTypes,
       MaterializeThresholds]
C = 4


def _model(op: str, attrs: dict, quant_scale: float, signed: bool, slope: np.ndarray | None = None):
    """x (INT8) → Mul(per-channel) → Add → op → MultiThreshold of a 4-bit quantizer."""
    ins = ["xb"] + (["slope"] if slope is not None else [])
    nodes = [helper.make_node("Mul", ["x", "a"], ["xa"], name="scale"),
             helper.make_node("Add", ["xa", "b"], ["xb"], name="bias"),
             helper.make_node(op, ins, ["f"], name="act", **attrs),
             helper.make_node("MultiThreshold", ["f", "thr"], ["y"], domain=QONNX_DOMAIN,
                              out_dtype="INT4" if signed else "UINT4", out_bias=-8.0 if signed else 0.0, name="mt")]
    a = RNG.uniform(0.01, 0.05, size=(1, C)).astype(np.float32)
    rt = quant_real_thresholds(np.float32(quant_scale), 0.0, 4, signed, False)
    inits = {"a": a, "b": RNG.normal(size=(1, C)).astype(np.float32), "thr": rt.float_thresholds()}
    if slope is not None:
        inits["slope"] = slope
    proto = graph_model(nodes, {"x": [64, C]}, {"y": [64, C]}, inits)
    return proto, rt


def _absorbed_exactly(proto, rt) -> None:
    """With the MultiThreshold's real thresholds ``rt`` attached, the pipeline's rules leave one MultiThreshold,
    equal to the original on INT8 inputs."""
    model = Model(proto)
    set_real_thresholds(model.get_nodes_by_op_type("MultiThreshold")[0], rt)
    m = apply(model.to_proto(), ALL, annotate={"x": "INT8"})
    assert [n.op_type for n in m.graph] == ["MultiThreshold"], [n.op_type for n in m.graph]
    for _ in range(3):
        compare(proto, m, {"x": RNG.integers(-128, 128, size=(64, C)).astype(np.float64)})


@pytest.mark.parametrize("op,attrs,scale,signed,slope", [
    ("Tanh", {}, 0.15, True, None),            # thresholds beyond ±1: never / always passed
    ("Sigmoid", {}, 0.07, False, None),        # thresholds beyond 1: never passed
    ("LeakyRelu", {"alpha": 0.125}, 0.2, True, None),
    ("LeakyRelu", {}, 0.05, True, None),       # default alpha 0.01: 1/alpha not a power of two
    ("PRelu", {}, 0.1, True, np.array([0.25, 0.1, 0.5, 0.3], np.float32)),  # per channel
    ("PRelu", {}, 0.1, True, np.array([0.25], np.float32)),
    ("HardSigmoid", {"alpha": 1 / 6, "beta": 0.5}, 0.075, False, None),  # saturates at 1 within the range
])
def test_monotone_activation_into_thresholds(op, attrs, scale, signed, slope):
    proto, rt = _model(op, attrs, scale, signed, slope)
    _absorbed_exactly(proto, rt)


def test_decreasing_activation_is_left_alone():
    """LeakyRelu with a negative slope is not monotone: the rule says so and leaves it."""
    proto, rt = _model("LeakyRelu", {"alpha": -0.5}, 0.2, True)
    model = Model(proto)
    set_real_thresholds(model.get_nodes_by_op_type("MultiThreshold")[0], rt)
    rule = AbsorbMonotoneIntoMultiThreshold()
    result = rule.run(model)
    assert not result.changed
    assert [x.reason for x in result.misses] == ["LeakyRelu with a non-positive slope is not increasing"]


@pytest.mark.parametrize("lo,hi", [(0.0, 6.0), (-1.0, 1.0), (None, 0.5)])
def test_clip_into_thresholds(lo, hi):
    """A ReLU6 (Clip 0..6) or hard tanh between the scales and a quantizer whose range reaches past the bounds:
    thresholds below lo are always passed, those above hi never; the Mul and Add before it are absorbed too."""
    clip = helper.make_node("Clip", ["xb", "lo" if lo is not None else "", "hi"], ["f"], name="act")
    nodes = [helper.make_node("Mul", ["x", "a"], ["xa"], name="scale"),
             helper.make_node("Add", ["xa", "b"], ["xb"], name="bias"), clip,
             helper.make_node("MultiThreshold", ["f", "thr"], ["y"], domain=QONNX_DOMAIN, out_dtype="INT4",
                              out_bias=-8.0, name="mt")]
    rt = quant_real_thresholds(np.float32(0.45), 0.0, 4, True, False)  # levels -3.6 .. 3.15
    inits = {"a": RNG.uniform(0.01, 0.05, size=(1, C)).astype(np.float32),
             "b": RNG.normal(size=(1, C)).astype(np.float32), "thr": rt.float_thresholds(), "hi": np.float32(hi)}
    if lo is not None:
        inits["lo"] = np.float32(lo)
    proto = graph_model(nodes, {"x": [64, C]}, {"y": [64, C]}, inits)
    _absorbed_exactly(proto, rt)
