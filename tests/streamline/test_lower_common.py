"""Helpers of the lower-stage tests (a small graph builder, exact comparison, structural checks), and the tests of
the shared lowering helpers: permutation algebra and the convolution weight matrix."""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from custom_ops.executor import Executor
from finnlite import Model, PassManager, Stage
from finnlite.core.compat import QONNX_DOMAIN, make_model
from streamline.lower_common import TO_NCHW, TO_NHWC, identity, inverse, permute_layout, then
from streamline.lower_conv import conv_weight_matrix


class GraphBuilder:
    """Builds a small ONNX graph: ``g.node("Conv", ["x", w], pads=[...])`` returns the output name;
    ``g.const(array)`` adds an initializer; ``g.build({"x": shape}, ["y"])`` returns a finnlite Model."""

    def __init__(self) -> None:
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.count = 0

    def _name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def const(self, array: Any, name: str | None = None) -> str:
        name = name or self._name("c")
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def node(self, op_type: str, inputs: Sequence[str], custom: bool = False, outputs: int = 1,
             out: str | None = None, **attrs: Any) -> Any:
        names = [out or self._name(op_type.lower())] + [self._name(op_type.lower()) for _ in range(outputs - 1)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, name=self._name(op_type),
                                           domain=QONNX_DOMAIN if custom else "", **attrs))
        return names[0] if outputs == 1 else names

    def mt(self, x: str, thresholds: np.ndarray, out_dtype: str = "UINT2", **attrs: Any) -> str:
        return self.node("MultiThreshold", [x, self.const(np.asarray(thresholds, np.float32))], custom=True,
                         out_dtype=out_dtype, **attrs)

    def build(self, inputs: dict[str, Sequence[int]], outputs: Iterable[str],
              datatypes: dict[str, str] | None = None) -> Model:
        graph = helper.make_graph(
            self.nodes, "g", [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(s)) for k, s in inputs.items()],
            [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], initializer=self.inits)
        model = Model(make_model(graph))
        for name, dt in (datatypes or {}).items():
            model.set_tensor_datatype(name, dt)
        model.infer_shapes()
        return model


def int_weights(rng: np.random.Generator, shape: Sequence[int], lo: int = -4, hi: int = 3) -> np.ndarray:
    return rng.integers(lo, hi + 1, size=shape).astype(np.float32)


def sorted_thresholds(rng: np.random.Generator, channels: int, steps: int, lo: int, hi: int) -> np.ndarray:
    return np.sort(rng.integers(lo, hi + 1, size=(channels, steps)), axis=1).astype(np.float32)


def run_passes(model: Model, passes: Sequence[Any], inputs: dict[str, np.ndarray]) -> tuple[dict, dict, Any]:
    """Outputs before and after running ``passes`` on ``model`` (in place), and the pass manager's report."""
    before = Executor(model.to_proto()).run(inputs)
    report = PassManager([Stage("lower", list(passes))]).run(model)
    after = Executor(model).run(inputs)
    return before, after, report


def assert_exact(before: dict[str, np.ndarray], after: dict[str, np.ndarray]) -> None:
    assert set(before) == set(after)
    for k in before:
        assert before[k].shape == after[k].shape, k
        np.testing.assert_array_equal(after[k], before[k], err_msg=k)


def op_types(model: Model) -> list[str]:
    return [n.op_type for n in model.graph]


def assert_transposes_only_at_input(model: Model) -> None:
    """At most one Transpose, and it reads a graph input."""
    transposes = model.get_nodes_by_op_type("Transpose")
    assert len(transposes) <= 1, [t.name for t in transposes]
    for t in transposes:
        assert t.inputs[0].is_graph_input()


# -- tests of the helpers ---------------------------------------------------------------------------------------
def test_permutation_algebra():
    x = np.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)
    assert then(TO_NHWC, TO_NCHW) == identity(4)
    assert inverse(TO_NHWC) == TO_NCHW
    p, q = (0, 2, 1, 3), TO_NHWC
    np.testing.assert_array_equal(x.transpose(p).transpose(q), x.transpose(then(p, q)))
    np.testing.assert_array_equal(x.transpose(q).transpose(inverse(q)), x)
    assert permute_layout(list("NCHW"), TO_NHWC) == list("NHWC")


@pytest.mark.parametrize("group", [1, 2, 4])
def test_conv_weight_matrix_rows_follow_im2col_order(group):
    rng = np.random.default_rng(1)
    cout, cin, kh, kw = 4, 4, 2, 3
    w = int_weights(rng, (cout, cin // group, kh, kw))
    mat = conv_weight_matrix(w, group)
    assert mat.shape == (kh * kw * cin, cout)
    og, ig = cout // group, cin // group
    for o in range(cout):
        for c in range(cin):
            for a in range(kh):
                for b in range(kw):
                    same_group = o // og == c // ig
                    expected = w[o, c % ig, a, b] if same_group else 0.0
                    assert mat[(a * kw + b) * cin + c, o] == expected
