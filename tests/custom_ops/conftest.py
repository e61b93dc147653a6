"""Shared helpers for the custom-op kernel tests, as fixtures: bitwise comparison, and building nodes both for our
ops and for qonnx's reference implementation."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from custom_ops import make_op
from custom_ops.base import CustomOp
from finnlite.core.compat import make_model
from finnlite.core.errors import OpError


def assert_same_bits(actual: Any, expected: Any) -> None:
    """Same dtype, same shape and the same bit patterns (tells -0.0 from 0.0, compares NaNs)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if actual.dtype.kind == "f":
        unsigned = np.dtype(f"u{actual.dtype.itemsize}")
        same = actual.view(unsigned) == expected.view(unsigned)
        if not np.all(same):
            bad = np.flatnonzero(~same.ravel())[:5]
            raise AssertionError(f"{(~same).sum()} elements differ, e.g. at {bad.tolist()}: "
                                 f"{actual.ravel()[bad].tolist()} vs {expected.ravel()[bad].tolist()}")
    else:
        np.testing.assert_array_equal(actual, expected)


def node(op_type: str, n_inputs: int, name: str = "n0", domain: str = "qonnx.custom_op.general",
         **attrs: Any):
    """A one-output NodeProto with inputs in0, in1, ... and output out0."""
    return helper.make_node(op_type, [f"in{i}" for i in range(n_inputs)], ["out0"], name=name, domain=domain,
                            **attrs)


def ours(proto) -> CustomOp:
    return make_op(proto)


def qonnx_op(proto, opset: int | None = None):
    """qonnx's op instance for ``proto`` (opset None: qonnx's newest version)."""
    from qonnx.custom_op.registry import getCustomOp

    return getCustomOp(proto, onnx_opset_version=opset)


def qonnx_run(proto, inputs: list[np.ndarray], out_shape: tuple | None = None, opset: int | None = None,
              datatypes: dict[int, str] | None = None) -> np.ndarray:
    """Execute qonnx's op for ``proto`` on ``inputs`` (a dummy output of ``out_shape`` where qonnx needs one;
    ``datatypes`` annotates input i with a datatype name, for ops that read annotations)."""
    context = {f"in{i}": v for i, v in enumerate(inputs)}
    if out_shape is not None:
        context["out0"] = np.zeros(out_shape, dtype=np.float32)
    graph = None
    if datatypes:
        graph = qonnx_wrapper(proto, inputs, {}, datatypes).graph
    qonnx_op(proto, opset).execute_node(context, graph)
    return context["out0"]


def qonnx_wrapper(proto, inputs: list[np.ndarray | tuple], initializers: dict[int, np.ndarray],
                  datatypes: dict[int, str] | None = None):
    """A qonnx ModelWrapper around the single node ``proto``: input i is an initializer if listed in
    ``initializers``, else a graph input of the given array's (or tuple's) shape."""
    from qonnx.core.datatype import DataType
    from qonnx.core.modelwrapper import ModelWrapper

    graph_inputs, inits = [], []
    for i, value in enumerate(inputs):
        if i in initializers:
            inits.append(numpy_helper.from_array(np.asarray(initializers[i]), f"in{i}"))
        else:
            shape = value if isinstance(value, tuple) else np.shape(value)
            graph_inputs.append(helper.make_tensor_value_info(f"in{i}", TensorProto.FLOAT, shape))
    out = helper.make_tensor_value_info("out0", TensorProto.FLOAT, None)
    graph = helper.make_graph([proto], "g", graph_inputs, [out], initializer=inits)
    model = ModelWrapper(make_model(graph))
    for i, name in (datatypes or {}).items():
        model.set_tensor_datatype(f"in{i}", DataType[name])
    return model


def qonnx_datatype(proto, inputs: list[np.ndarray | tuple], initializers: dict[int, np.ndarray],
                   datatypes: dict[int, str] | None = None) -> str:
    """The output datatype name qonnx infers for ``proto``."""
    model = qonnx_wrapper(proto, inputs, initializers, datatypes)
    qonnx_op(proto).infer_node_datatype(model)
    return model.get_tensor_datatype("out0").name


def raises_naming_node(make: Callable[[], Any], *fragments: str, node_name: str = "n0") -> OpError:
    """``make()`` raises an OpError whose message names the node and contains every fragment."""
    with pytest.raises(OpError) as info:
        make()
    message = str(info.value)
    assert f"'{node_name}'" in message, message
    for fragment in fragments:
        assert fragment in message, message
    return info.value


class Helpers:
    """The helpers above, handed to tests by the ``h`` fixture."""

    same_bits = staticmethod(assert_same_bits)
    node = staticmethod(node)
    ours = staticmethod(ours)
    qonnx_op = staticmethod(qonnx_op)
    qonnx_run = staticmethod(qonnx_run)
    qonnx_wrapper = staticmethod(qonnx_wrapper)
    qonnx_datatype = staticmethod(qonnx_datatype)
    raises_naming_node = staticmethod(raises_naming_node)


@pytest.fixture
def h() -> type[Helpers]:
    return Helpers


@pytest.fixture
def qonnx_ort(monkeypatch: pytest.MonkeyPatch) -> None:
    """qonnx ops that run onnxruntime (MaxPoolNHWC, QuantAvgPool2d) build models with onnx's newest IR version,
    which onnxruntime rejects: make those builders stamp one it accepts."""
    import qonnx.core.onnx_exec as onnx_exec
    import qonnx.custom_op.general.quantavgpool2d as quantavgpool2d

    from finnlite.core.compat import fix_ir_version

    for module in (onnx_exec, quantavgpool2d):
        original = module.qonnx_make_model
        monkeypatch.setattr(module, "qonnx_make_model",
                            lambda graph, _make=original, **kw: fix_ir_version(_make(graph, **kw)))
