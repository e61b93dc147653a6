"""The custom-op registry, owned by the core and keyed by (domain, op_type).

The core (shape inference, constant folding, validation) asks this registry for the op of a node in a custom domain
and uses what every op provides: ``infer_shapes``, ``infer_datatypes``, ``validate_strict`` and ``execute``. The ops
themselves live in :mod:`custom_ops`, which registers each op class here when it is imported (:func:`register`);
the core never imports them. A registered class is built for a node with its ``from_node(node, opset_version)``.

The QONNX/FINN custom ops are accepted in the domains ``qonnx.custom_op.general``, ``finn.custom_op.general`` and
``onnx.brevitas`` (the old Brevitas exporter's domain); each op class registers once and is found under all three.
A class with its own ``domains`` registers there only: FINN's HW layers that the lowering emits where FINN has no
other form (``FMPadding_Pixel`` of a transposed convolution) live in ``finn.custom_op.fpgadataflow``.
"""

from __future__ import annotations

from typing import Any

from finnlite.core.errors import OpError

QONNX_DOMAIN = "qonnx.custom_op.general"
CUSTOM_DOMAINS = ("qonnx.custom_op.general", "finn.custom_op.general", "onnx.brevitas")
#: FINN's HW layers (finn-plus ``finn.custom_op.fpgadataflow``)
HW_DOMAIN = "finn.custom_op.fpgadataflow"
STANDARD_DOMAINS = ("", "ai.onnx")

_REGISTRY: dict[tuple[str, str], Any] = {}
#: builds an executor for a model (``factory(model, **options)``); :mod:`custom_ops` registers its Executor
_EXECUTOR: Any = None


def register_executor(factory: Any) -> None:
    """Make ``factory(model, **options)`` the executor :meth:`finnlite.Model.execute` uses (custom_ops does this
    when imported; the core never imports it)."""
    global _EXECUTOR
    _EXECUTOR = factory


def executor_factory() -> Any:
    """The registered executor factory; an :class:`OpError` if none is (custom_ops was never imported)."""
    if _EXECUTOR is None:
        raise OpError("no executor is registered: import custom_ops (or use finnlite.Model, which does)")
    return _EXECUTOR


def register(cls: Any) -> Any:
    """Class decorator: register ``cls`` under its ``op_type`` in every custom-op domain (or in its ``domains``)."""
    for domain in getattr(cls, "domains", None) or CUSTOM_DOMAINS:
        key = (domain, cls.op_type)
        if key in _REGISTRY and _REGISTRY[key] is not cls:
            raise ValueError(f"custom op {key} registered twice")
        _REGISTRY[key] = cls
    return cls


def register_alias(op_type: str, cls: Any) -> None:
    """Register ``cls`` under a second op_type (``IntQuant`` for ``Quant``)."""
    for domain in CUSTOM_DOMAINS:
        _REGISTRY[(domain, op_type)] = cls


def is_custom_domain(domain: str) -> bool:
    """True for the domains of QONNX/FINN custom ops (FINN's HW layers included)."""
    return domain in CUSTOM_DOMAINS or domain == HW_DOMAIN


def is_standard_domain(domain: str) -> bool:
    """True for the default ONNX domain."""
    return domain in STANDARD_DOMAINS


def lookup(domain: str, op_type: str, node_name: str = "") -> Any:
    """The op class for (domain, op_type); an :class:`OpError` naming the node if there is none."""
    try:
        return _REGISTRY[(domain, op_type)]
    except KeyError:
        if is_custom_domain(domain):
            hint = "" if _REGISTRY else " (no op is registered: import custom_ops to register the QONNX/FINN ops)"
            raise OpError(f"unknown custom op '{op_type}' in domain '{domain}'{hint}", node=node_name) from None
        raise OpError(f"unknown op domain '{domain}' for op '{op_type}'", node=node_name) from None


def make_op(node: Any, opset_version: int | None = None) -> Any:
    """The op instance for an ``onnx.NodeProto`` or ``onnx_ir.Node`` in a custom domain. ``opset_version`` is the
    model's opset import for the node's domain (ops with versioned semantics, such as ``Trunc``, use it)."""
    return lookup(node.domain, node.op_type, node.name).from_node(node, opset_version)


def registered_ops() -> list[tuple[str, str]]:
    """All registered (domain, op_type) keys, sorted."""
    return sorted(_REGISTRY)
