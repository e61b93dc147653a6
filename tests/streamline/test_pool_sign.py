"""AbsorbChannelSignIntoMultiThreshold: per-channel scales of mixed sign before a MaxPool, checked by the oracle."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from finnlite import Model, PassManager, Stage
from finnlite.core.compat import QONNX_DOMAIN
from finnlite.core.passes import Miss, PassRecord, RunReport
from streamline.datatypes import InferDataTypes
from streamline.pool_sign import AbsorbChannelSignIntoMultiThreshold
from streamline.real_thresholds import RealThresholds, set_real_thresholds
from streamline.move import MoveMulPastLinear
from tests.streamline.rulecheck import compare, graph_model

C, N = 4, 15
PASSES = [InferDataTypes, AbsorbChannelSignIntoMultiThreshold, MoveMulPastLinear, InferDataTypes]


def _net(rng, a, out_bias: float, rows: int, out_scale: float = 1.0):
    """x (INT4) → Conv(int W, zero padding) → MultiThreshold(rows, out_bias) → Mul(a) → MaxPool(2) → y, with real
    thresholds (random strictness) whose integer materialization is the proto's thresholds."""
    w = rng.integers(-8, 8, (C, C, 3, 3)).astype(np.float32)
    base = np.sort(rng.integers(-120, 120, (rows, N)) + rng.choice([0.0, 0.5], (rows, N)), axis=1)
    rt = RealThresholds(base, rng.random((rows, N)) < 0.5)
    thresholds = rt.integer_thresholds(-10_000.0, 10_000.0)
    nodes = [helper.make_node("Conv", ["x", "W"], ["acc"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("MultiThreshold", ["acc", "T"], ["q"], domain=QONNX_DOMAIN, out_scale=out_scale,
                              out_bias=out_bias, out_dtype="INT4" if out_bias else "UINT4", name="mt"),
             helper.make_node("Mul", ["q", "a"], ["qa"], name="bn_scale"),
             helper.make_node("MaxPool", ["qa"], ["y"], kernel_shape=[2, 2], strides=[2, 2], name="pool")]
    proto = graph_model(nodes, {"x": [2, C, 6, 6]}, {"y": [2, C, 3, 3]},
                        {"W": w, "T": thresholds, "a": np.asarray(a, np.float32).reshape(1, C, 1, 1)})
    m = Model(proto)
    m.set_tensor_datatype("x", "INT4")
    set_real_thresholds(next(n for n in m.graph if n.op_type == "MultiThreshold"), rt)
    m.infer_shapes()
    return proto, m


def _run(m: Model) -> RunReport:
    return PassManager([Stage("s", PASSES, fixpoint=True)]).run(m)


def _rule_run(report: RunReport) -> tuple[PassRecord, list[Miss]]:
    """The last run of AbsorbChannelSignIntoMultiThreshold in ``report``, and its misses."""
    name = AbsorbChannelSignIntoMultiThreshold.name
    return [r for r in report.records if r.name == name][-1], [x for x in report.misses if x.rule == name]


@pytest.mark.parametrize("a", [[0.5, -0.25, 1.5, -2.0],   # mixed signs
                               [-0.5, -0.25, -1.5, -2.0],  # every channel negative
                               [0.0, -0.75, 0.125, 3.0]])  # a zero factor too
@pytest.mark.parametrize("out_bias", [0.0, -8.0])  # unsigned and signed levels
@pytest.mark.parametrize("rows", [C, 1])  # per-channel and shared thresholds
def test_sign_moves_into_weights_and_thresholds(a, out_bias, rows) -> None:
    rng = np.random.default_rng([int(-out_bias), rows, int(100 + 8 * a[1])])
    proto, m = _net(rng, a, out_bias, rows)
    _run(m)
    assert [n.op_type for n in m.graph] == ["Conv", "MultiThreshold", "MaxPool", "Mul"]
    mt = next(n for n in m.graph if n.op_type == "MultiThreshold")
    assert m.get_tensor_datatype(mt.outputs[0].name).is_integer()
    x = rng.integers(-8, 8, (2, C, 6, 6)).astype(np.float64)
    for _ in range(8):
        compare(proto, m, {"x": x})
        x = rng.integers(-8, 8, (2, C, 6, 6)).astype(np.float64)
    x[:] = -8  # the extremes reach the thresholds padded at ±∞
    compare(proto, m, {"x": x})


def test_positive_scales_are_left_to_move_linear_past_maxpool() -> None:
    _, m = _net(np.random.default_rng(0), [0.5, 0.25, 1.0, 2.0], 0.0, C)
    last, _ = _rule_run(_run(m))
    assert last.rewrites == 0 and [n.op_type for n in m.graph] == ["Conv", "MultiThreshold", "MaxPool", "Mul"]


def test_out_scale_other_than_one_is_a_miss() -> None:
    _, m = _net(np.random.default_rng(0), [0.5, -0.25, 1.0, 2.0], 0.0, C, out_scale=2.0)
    _, misses = _rule_run(_run(m))
    assert [n.op_type for n in m.graph] == ["Conv", "MultiThreshold", "Mul", "MaxPool"]
    assert "out_scale 1" in misses[-1].reason
