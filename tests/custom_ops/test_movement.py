"""Element maps of data-movement nodes (custom_ops.movement): the gather of the map is the node's own output."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from custom_ops.movement import element_map

F32 = np.float32

#: (op, data input shapes, constant inputs by index, attributes, pad input)
CASES = [
    ("Transpose", [(2, 3, 4)], {}, dict(perm=[2, 0, 1]), None),
    ("Reshape", [(2, 3, 4)], {1: np.array([4, -1], np.int64)}, {}, None),
    ("Flatten", [(2, 3, 4)], {}, dict(axis=2), None),
    ("DepthToSpace", [(1, 8, 2, 3)], {}, dict(blocksize=2), None),
    ("DepthToSpace", [(1, 8, 2, 3)], {}, dict(blocksize=2, mode="CRD"), None),
    ("SpaceToDepth", [(1, 2, 4, 6)], {}, dict(blocksize=2), None),
    ("Slice", [(3, 5)], {1: np.array([4, 2], np.int64), 2: np.array([0, 0], np.int64),
                         3: np.array([1, 0], np.int64), 4: np.array([-2, -1], np.int64)}, {}, None),
    ("Gather", [(2, 4, 3)], {1: np.array([3, 0, 0, 2], np.int64)}, dict(axis=1), None),
    ("Concat", [(1, 2, 3), (1, 4, 3)], {}, dict(axis=1), None),
    ("Split", [(1, 6, 2)], {1: np.array([2, 4], np.int64)}, dict(axis=1), None),
    ("Pad", [(1, 2, 3, 3)], {1: np.array([0, 0, 1, 2, 0, 0, 2, 0], np.int64), 2: np.array(5.5, F32)}, {}, 2),
    ("Pad", [(1, 2, 3, 3)], {1: np.array([0, 0, 1, 2, 0, 0, 2, 0], np.int64)}, dict(mode="reflect"), None),
    ("Resize", [(1, 2, 3, 4)], {1: None, 2: np.array([1, 1, 2, 2], F32)}, dict(mode="nearest"), None),
    ("Resize", [(1, 2, 3, 4)], {1: None, 2: np.array([1, 1, 1.5, 0.5], F32)},
     dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="ceil"), None),
    ("Expand", [(1, 3, 1)], {1: np.array([2, 3, 4], np.int64)}, {}, None),
    ("Tile", [(2, 3)], {1: np.array([2, 1], np.int64)}, {}, None),
]


def _run(op, shapes, consts, attrs):
    names = [f"x{i}" for i in range(len(shapes))]
    inits = []
    for i in range(len(shapes), len(shapes) + len(consts)):
        c = consts.get(i)
        names.append("" if c is None else f"c{i}")
        if c is not None:
            inits.append(numpy_helper.from_array(c, f"c{i}"))
    n_out = len(consts[1]) if op == "Split" else 1
    node = helper.make_node(op, names, [f"y{k}" for k in range(n_out)], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, list(s))
                                            for i, s in enumerate(shapes)],
                              [helper.make_tensor_value_info(f"y{k}", TensorProto.FLOAT, None) for k in range(n_out)],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(s).astype(F32) for s in shapes]
    outs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {f"x{i}": x for i, x in enumerate(xs)})
    return node, xs, outs


@pytest.mark.parametrize("op,shapes,consts,attrs,pad", CASES, ids=[f"{c[0]}{i}" for i, c in enumerate(CASES)])
def test_gather_of_the_map_is_the_node(op, shapes, consts, attrs, pad):
    node, xs, outs = _run(op, shapes, consts, attrs)
    all_shapes = [list(s) for s in shapes] + [None] * len(consts)
    all_consts = [None] * len(shapes) + [consts.get(i) for i in range(len(shapes), len(shapes) + len(consts))]
    m = element_map(node, list(range(len(shapes))), all_shapes, all_consts, 13, pad_value=pad)
    assert m is not None
    fill = m.fill if m.has_fill else 0
    for k, out in enumerate(outs):
        np.testing.assert_array_equal(m.gather(xs, k, fill=fill).astype(F32), out)
    if pad is not None:
        assert m.has_fill and m.fill == 5.5
    # object arrays (exact constants) move the same way
    fr = [np.vectorize(Fraction, otypes=[object])(np.arange(x.size).reshape(x.shape)) for x in xs]
    got = m.gather(fr, 0, fill=Fraction(-1))
    ints = m.gather([np.arange(x.size).reshape(x.shape) for x in xs], 0, fill=-1)
    assert got.dtype == object and [int(v) for v in got.ravel()] == list(ints.ravel())


def test_non_constant_parameters_and_unknown_shapes_give_no_map():
    node = helper.make_node("Reshape", ["x", "s"], ["y"])
    assert element_map(node, [0], [[2, 3], [2]], [None, None], 13) is None
    assert element_map(node, [0], [None, None], [None, np.array([3, 2], np.int64)], 13) is None
    assert element_map(helper.make_node("Transpose", ["x"], ["y"]), [0], [[1 << 13, 1 << 12]], [None], 13) is None


def test_reads_counts_duplicates():
    node, _, _ = _run("Resize", [(1, 1, 2, 2)], {1: None, 2: np.array([1, 1, 2, 3], F32)}, dict(mode="nearest"))
    m = element_map(node, [0], [[1, 1, 2, 2], None, None], [None, None, np.array([1, 1, 2, 3], F32)], 13)
    assert list(m.reads()) == [6, 6, 6, 6]
