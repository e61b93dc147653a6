"""Executors of part of a model: a model of some nodes with given inputs and constants, and an executor of a whole
model with extra outputs that reads its large weights in place.

Large initializers (:func:`handed_over`: a compact depthwise weight, or a tensor of at least
:data:`custom_ops.plan.FEED_ELEMENTS` elements) go to the :class:`~custom_ops.executor.Executor` as arrays, not
serialized into the ModelProto it runs, which it would copy and convert back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper, numpy_helper

from custom_ops.executor import Executor
from custom_ops.plan import FEED_ELEMENTS
from finnlite.core.compat import IR_VERSION
from finnlite.core.io import to_proto_without
from finnlite.core.tensors import DepthwiseWeight

if TYPE_CHECKING:
    from finnlite.core.model import Model

__all__ = ["model_of", "subgraph_model", "handed_over", "as_constant", "executor_with_outputs"]


def _value_info(name: str, arr: np.ndarray) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(arr.dtype), list(arr.shape))


def model_of(protos: Sequence[onnx.NodeProto], inputs: dict[str, np.ndarray], constants: dict[str, np.ndarray],
            opsets: dict[str, int]) -> onnx.ModelProto:
    """A model of the nodes ``protos``: ``inputs`` as graph inputs, ``constants`` as initializers, every output of
    the nodes a graph output, with the opset imports ``opsets``."""
    graph = helper.make_graph(list(protos), "region", [_value_info(n, a) for n, a in inputs.items()],
                              [onnx.ValueInfoProto(name=o) for p in protos for o in p.output if o],
                              initializer=[numpy_helper.from_array(np.asarray(a), n) for n, a in constants.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()],
                              producer_name="finnlite-verify")
    model.ir_version = IR_VERSION
    return model


def subgraph_model(nodes: Sequence[ir.Node], inputs: dict[str, np.ndarray], constants: dict[str, np.ndarray],
                   opsets: dict[str, int]) -> onnx.ModelProto:
    """A model of just ``nodes``: ``inputs`` are graph inputs (typed and shaped like the example arrays given),
    ``constants`` initializers, and every tensor the nodes produce is a graph output."""
    return model_of([ir.serde.serialize_node(n) for n in nodes], inputs, constants, opsets)


def handed_over(tensor: Any) -> bool:
    """True if an initializer goes to an executor as one of its ``constants`` rather than serialized into the model
    it runs: a compact depthwise weight (kept compact, see :mod:`finnlite.core.tensors`) or a large numeric tensor."""
    return isinstance(tensor, DepthwiseWeight) or (tensor.size >= FEED_ELEMENTS
                                                   and tensor.dtype != ir.DataType.STRING)


def as_constant(tensor: Any) -> Any:
    """A handed-over initializer as the executor takes it: a depthwise weight as it is, anything else as an array."""
    return tensor if isinstance(tensor, DepthwiseWeight) else tensor.numpy()


def executor_with_outputs(model: Model, names: list[str], dtype: Any = np.float32) -> Any:
    """An executor of ``model`` with the extra graph outputs ``names``. The large initializers (the weights) are
    handed to it as the model's own arrays instead of being serialized into its ModelProto, which the executor
    would copy and convert back to arrays (float32; a float64 executor converts them, once)."""
    large = {name: v.const_value for name, v in model.graph.initializers.items()
             if v.const_value is not None and handed_over(v.const_value)}
    proto = to_proto_without(model.ir, large, node_metadata=False)
    have = {o.name for o in proto.graph.output}
    proto.graph.output.extend(onnx.ValueInfoProto(name=name) for name in names if name not in have)
    return Executor(proto, dtype=dtype, constants={name: as_constant(t) for name, t in large.items()})
