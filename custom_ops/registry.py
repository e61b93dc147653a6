"""The op registry, keyed by (domain, op_type).

The QONNX/FINN custom ops are accepted in the domains ``qonnx.custom_op.general``, ``finn.custom_op.general`` and
``onnx.brevitas`` (the old Brevitas exporter's domain); each op class registers once with :func:`register` and is
found under all three. Nothing is found by ``eval`` or by import order: :mod:`custom_ops` imports every op module
explicitly.
"""

from __future__ import annotations

from typing import Any

from custom_ops.base import CustomOp, attrs_of
from finnlite.errors import OpError

QONNX_DOMAIN = "qonnx.custom_op.general"
CUSTOM_DOMAINS = ("qonnx.custom_op.general", "finn.custom_op.general", "onnx.brevitas")
STANDARD_DOMAINS = ("", "ai.onnx")

_REGISTRY: dict[tuple[str, str], type[CustomOp]] = {}


def register(cls: type[CustomOp]) -> type[CustomOp]:
    """Class decorator: register ``cls`` under its ``op_type`` in every custom-op domain."""
    for domain in CUSTOM_DOMAINS:
        key = (domain, cls.op_type)
        if key in _REGISTRY and _REGISTRY[key] is not cls:
            raise ValueError(f"custom op {key} registered twice")
        _REGISTRY[key] = cls
    return cls


def register_alias(op_type: str, cls: type[CustomOp]) -> None:
    """Register ``cls`` under a second op_type (``IntQuant`` for ``Quant``)."""
    for domain in CUSTOM_DOMAINS:
        _REGISTRY[(domain, op_type)] = cls


def is_custom_domain(domain: str) -> bool:
    """True for the domains of QONNX/FINN custom ops."""
    return domain in CUSTOM_DOMAINS


def is_standard_domain(domain: str) -> bool:
    """True for the default ONNX domain."""
    return domain in STANDARD_DOMAINS


def lookup(domain: str, op_type: str, node_name: str = "") -> type[CustomOp]:
    """The op class for (domain, op_type); an :class:`OpError` naming the node if there is none."""
    try:
        return _REGISTRY[(domain, op_type)]
    except KeyError:
        if is_custom_domain(domain):
            raise OpError(f"unknown custom op '{op_type}' in domain '{domain}'", node=node_name) from None
        raise OpError(f"unknown op domain '{domain}' for op '{op_type}'", node=node_name) from None


def make_op(node: Any, opset_version: int | None = None) -> CustomOp:
    """The op instance for an ``onnx.NodeProto`` or ``onnx_ir.Node`` in a custom domain.

    ``opset_version`` is the model's opset import for the node's domain; ops with versioned semantics (``Trunc``)
    use it to choose their version as qonnx does."""
    cls = lookup(node.domain, node.op_type, node.name)
    if getattr(cls, "versioned", False):
        return cls(node.name, attrs_of(node), opset_version=opset_version)  # type: ignore[call-arg]
    return cls(node.name, attrs_of(node))


def registered_ops() -> list[tuple[str, str]]:
    """All registered (domain, op_type) keys, sorted."""
    return sorted(_REGISTRY)
