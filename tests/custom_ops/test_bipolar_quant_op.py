"""BipolarQuant against qonnx's binary_quant and BipolarQuant op."""

from __future__ import annotations

import numpy as np
import pytest
from qonnx.custom_op.general.bipolar_quant import binary_quant

from custom_ops.bipolar_quant import bipolar_quant

F32 = np.float32


def test_random_and_edges_match_qonnx(h):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 3, 5)).astype(F32)
    x[0, 0, :] = [0.0, -0.0, np.nan, np.inf, -np.inf]
    x[1, 0, :] = [1e-45, -1e-45, 0.5, -0.5, 3.0]
    for scale in [np.asarray(1.0, F32), np.asarray(0.125, F32), rng.uniform(0.1, 2, (3, 1)).astype(F32),
                  rng.uniform(0.1, 2, (1, 3, 5)).astype(F32)]:
        h.same_bits(bipolar_quant(x, scale), binary_quant(x, scale))
    y = bipolar_quant(x, np.asarray(1.0, F32))
    assert y[0, 0, 1] == 1.0 and y[0, 0, 2] == -1.0  # -0.0 counts as non-negative, NaN as negative


def test_op_matches_qonnx_op(h):
    x = np.random.default_rng(2).standard_normal((4, 6)).astype(F32)
    proto = h.node("BipolarQuant", 2)
    scale = np.full((1, 6), 0.75, F32)
    h.same_bits(h.ours(proto).execute([x, scale])[0], h.qonnx_run(proto, [x, scale]))


@pytest.mark.parametrize("scale,expected", [(1.0, "BIPOLAR"), ([1.0, 1.0], "BIPOLAR"), (0.5, "FLOAT32"),
                                            ([1.0, 2.0], "FLOAT32")])
def test_datatype_matches_qonnx(h, scale, expected):
    proto = h.node("BipolarQuant", 2)
    s = np.asarray(scale, F32)
    assert h.qonnx_datatype(proto, [(3, 2), s], {1: s}) == expected
    assert h.ours(proto).infer_datatypes([None, None], [None, s])[0].name == expected
    assert h.ours(proto).infer_datatypes([None, None], [None, None])[0].name == "FLOAT32"


def test_shapes_and_errors(h):
    op = h.ours(h.node("BipolarQuant", 2, name="bq"))
    assert op.infer_shapes([(1, 8), ()], [None, None]) == [(1, 8)]
    h.raises_naming_node(lambda: op.infer_shapes([(1, 8), (3,)], [None, None]), "broadcast", node_name="bq")
    for bad in (0.0, -1.0, np.nan, np.inf):
        h.raises_naming_node(lambda: op.execute([np.ones(3, F32), np.asarray(bad, F32)]), "scale", node_name="bq")
    h.raises_naming_node(lambda: op.execute([np.ones(3, F32)]), "2 inputs", node_name="bq")
    h.raises_naming_node(lambda: h.ours(h.node("BipolarQuant", 2, name="bq", signed=1)), "unknown attribute",
                         node_name="bq")
