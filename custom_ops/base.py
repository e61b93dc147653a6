"""The base class of a custom operator: attributes, kernel, shape and datatype inference.

An operator is independent of the graph representation: it is built from the node's name and a dict of its
attributes (plain Python values), and works on numpy arrays, shapes and qonnx ``DataType`` objects. The model class
and the executor turn ``onnx.NodeProto`` or ``onnx_ir.Node`` attributes into that dict with :func:`attrs_of`.
"""

from __future__ import annotations

from typing import Any, ClassVar, Sequence

import numpy as np
import onnx

from finnlite.core.datatypes import BaseDataType
from finnlite.core.errors import OpError

# attribute kinds, as in qonnx's get_nodeattr_types: "i" int, "f" float, "s" string, "ints", "floats", "strings",
# "t" tensor (numpy array)
AttrSpec = tuple[str, bool, Any]


class CustomOp:
    """A custom operator instance for one node.

    Subclasses set ``op_type``, ``attr_spec`` ({name: (kind, required, default)}) and implement :meth:`execute`,
    :meth:`infer_shapes` and :meth:`infer_datatypes`; they may override :meth:`validate` to check attributes and
    constant inputs (raising :class:`OpError` that names the node).
    """

    op_type: ClassVar[str] = ""
    attr_spec: ClassVar[dict[str, AttrSpec]] = {}
    #: how many inputs the op takes, (min, max)
    num_inputs: ClassVar[tuple[int, int]] = (1, 1)
    #: the domains the op is registered in (None: every QONNX/FINN custom-op domain, finnlite.core.ops)
    domains: ClassVar[tuple[str, ...] | None] = None

    def __init__(self, name: str, attrs: dict[str, Any] | None = None) -> None:
        self.name = name or f"<unnamed {self.op_type}>"
        attrs = dict(attrs or {})
        unknown = set(attrs) - set(self.attr_spec)
        if unknown:
            raise OpError(f"{self.op_type} has unknown attribute(s) {sorted(unknown)}", node=self.name)
        self.attrs: dict[str, Any] = {}
        for key, (kind, required, default) in self.attr_spec.items():
            if key in attrs:
                self.attrs[key] = attrs[key]
            elif required:
                raise OpError(f"{self.op_type} is missing required attribute '{key}'", node=self.name)
            else:
                self.attrs[key] = default
        self.validate_attrs()

    @classmethod
    def from_node(cls, node: Any, opset_version: int | None = None) -> "CustomOp":
        """The op for an ``onnx.NodeProto`` or ``onnx_ir.Node`` (``opset_version``: the model's opset import for
        the node's domain, used by ops whose semantics are versioned)."""
        return cls(node.name, attrs_of(node))

    # -- to be provided by subclasses -------------------------------------------------------------------------
    def validate_attrs(self) -> None:
        """Check the attributes; raise :class:`OpError` naming the node and the problem."""

    def validate_inputs(self, inputs: Sequence[np.ndarray | None]) -> None:
        """Check (constant) input values such as scales and bitwidths; ``None`` for a value not known."""

    def validate_strict(self, inputs: Sequence[np.ndarray | None]) -> None:
        """The checks of :meth:`validate_inputs` plus those for a node of a model given as input: what the kernel
        computes all the same but a well-formed QONNX/FINN model never holds (a zero-point outside the integer
        range, unsorted thresholds). Run by the pre-flight validation (:mod:`finnlite.core.validate`), not by the
        executor."""
        self.validate_inputs(inputs)

    def execute(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The reference numpy kernel: the op's outputs for ``inputs``."""
        raise OpError(f"{self.op_type} has no kernel", node=self.name)

    def infer_shapes(self, shapes: Sequence[tuple[int, ...] | None],
                     values: Sequence[np.ndarray | None]) -> list[tuple[int, ...] | None]:
        """Output shapes from input shapes (and constant input values where known)."""
        raise OpError(f"{self.op_type} has no shape inference", node=self.name)

    def infer_datatypes(self, dtypes: Sequence[BaseDataType | None],
                        values: Sequence[np.ndarray | None]) -> list[BaseDataType]:
        """Output datatypes from input datatypes (and constant input values where known)."""
        raise OpError(f"{self.op_type} has no datatype inference", node=self.name)

    # -- helpers ------------------------------------------------------------------------------------------------
    def check_num_inputs(self, n: int) -> None:
        lo, hi = self.num_inputs
        if not lo <= n <= hi:
            want = str(lo) if lo == hi else f"{lo} to {hi}"
            raise OpError(f"{self.op_type} takes {want} inputs, got {n}", node=self.name)

    def fail(self, message: str) -> OpError:
        """An :class:`OpError` naming this node, to raise."""
        return OpError(f"{self.op_type}: {message}", node=self.name)


def _attr_value(attr: onnx.AttributeProto) -> Any:
    value = onnx.helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    if isinstance(value, list) and value and isinstance(value[0], bytes):
        return [v.decode("utf-8") for v in value]
    return value


def attrs_of(node: Any) -> dict[str, Any]:
    """The attributes of an ``onnx.NodeProto`` or an ``onnx_ir.Node`` as a dict of plain Python values
    (ints, floats, strings, lists, numpy arrays for tensors)."""
    if isinstance(node, onnx.NodeProto):
        return {a.name: _attr_value(a) for a in node.attribute}
    out: dict[str, Any] = {}
    for name, attr in node.attributes.items():
        value = attr.value
        if hasattr(value, "numpy"):
            value = value.numpy()
        elif isinstance(value, (list, tuple)):
            value = list(value)
        out[name] = value
    return out
