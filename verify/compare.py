"""Comparing tensors under a policy: exact for integer-annotated tensors, else as the policy says.

:func:`compare_tensor` compares one tensor (one sample) and returns a :class:`TensorDiff` with the elements that
break the policy, the largest error and where it is. :func:`quant_step` finds the quantization step of a tensor in a
model, for tolerances stated in steps and for recognising one-step (near-tie) differences.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from finnlite.core.datatypes import is_integer_type
from finnlite.core.policies import Equality, Policy, Tolerance

__all__ = ["TensorDiff", "compare_tensor", "quant_step", "is_integer_tensor", "fits_datatype"]

#: ops whose output is ``step · level`` with the step given by an input or attribute


@dataclass
class TensorDiff:
    """How ``actual`` differs from ``expected`` for one tensor of one sample.

    ``bad`` holds the flat indices of the elements that break the policy; ``max_abs`` is the largest absolute
    difference over all elements (inf where one side is NaN), at ``worst`` (a multi-index)."""

    name: str
    shape: tuple[int, ...]
    exact: bool
    bad: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    max_abs: float = 0.0
    worst: tuple[int, ...] = ()
    expected_value: float = 0.0
    actual_value: float = 0.0
    shape_error: str | None = None
    #: set by the verifier when the new version holds the tensor in another layout (the permutation applied)
    layout: tuple[int, ...] | None = None

    @property
    def ok(self) -> bool:
        """True if every element satisfies the policy."""
        return self.shape_error is None and self.bad.size == 0

    @property
    def n_total(self) -> int:
        return int(np.prod(self.shape)) if self.shape else 1

    def describe(self) -> str:
        """One line: what differs and by how much."""
        if self.shape_error:
            return f"tensor '{self.name}': {self.shape_error}"
        how = "exactly" if self.exact else "within the policy"
        return (f"tensor '{self.name}': {self.bad.size} of {self.n_total} elements differ (compared {how}); "
                f"max abs error {self.max_abs:.6g} at {self.worst} (expected {self.expected_value:.9g}, got "
                f"{self.actual_value:.9g})")


def is_integer_tensor(model: Any, name: str) -> bool:
    """True if ``model`` (a :class:`finnlite.Model`, or None) annotates tensor ``name`` with an integer datatype."""
    if model is None or model.value(name) is None:
        return False
    return is_integer_type(model.get_tensor_datatype(name))


def fits_datatype(values: np.ndarray, dt: Any) -> np.ndarray:
    """Element-wise: does ``values`` hold values of the integer datatype ``dt`` (finite integers in its range;
    no 0 for BIPOLAR)."""
    v = np.asarray(values, dtype=np.float64)
    ok = np.isfinite(v) & (v == np.round(v)) & (v >= dt.min()) & (v <= dt.max())
    if dt.name == "BIPOLAR":
        ok &= v != 0
    return ok


def compare_tensor(name: str, actual: np.ndarray, expected: np.ndarray, policy: Policy, *, integer: bool = False,
                   step: np.ndarray | float | None = None) -> TensorDiff:
    """Compare ``actual`` with ``expected`` under ``policy`` (exactly if ``integer`` or the policy is
    :class:`Equality`). NaN equals NaN. A shape mismatch is a difference of its own."""
    a, b = np.asarray(actual), np.asarray(expected)
    exact = integer or isinstance(policy, Equality) or not isinstance(policy, Tolerance)
    if a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b):  # the common case, fast
        return TensorDiff(name, tuple(b.shape), exact)
    if a.shape != b.shape:
        return TensorDiff(name, tuple(b.shape), exact, shape_error=f"shape {a.shape}, expected {b.shape}",
                          max_abs=float("inf"))
    if a.size == 0:
        return TensorDiff(name, tuple(b.shape), exact)
    # float32 tensors are compared in float32 (exact for equality: x - y == 0 only if x == y), others in float64
    work = a.dtype if a.dtype == b.dtype and a.dtype in (np.float32, np.float64) else np.dtype(np.float64)
    a64, b64 = a.astype(work, copy=False), b.astype(work, copy=False)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(a64 - b64)
    top = int(np.argmax(err))  # the first NaN if there is one
    if np.isnan(err.reshape(-1)[top]):  # NaN on either side, or inf - inf: sort them out (rare)
        nan_a, nan_b = np.isnan(a64), np.isnan(b64)
        err = np.where(nan_a & nan_b, 0.0, np.where(nan_a | nan_b, np.inf, err))
        err = np.where(np.isnan(err), np.inf, err)  # inf - inf
        unequal = (err != 0) | ((a64 != b64) & ~(nan_a & nan_b))
        top = int(np.argmax(err))
    elif exact:
        unequal = err != 0  # without NaN, a != b exactly where |a - b| != 0 (+0 and -0 are equal)
    if exact:
        bad_mask = unequal
    else:
        assert isinstance(policy, Tolerance)
        steps = _broadcast_step(step, b.shape)
        # the common case: the largest error is below every element's bound (with a margin for the bound's own
        # float32 rounding), decided from reductions without the per-element bounds
        within = err.reshape(-1)[top] < policy.least_bound(b64, steps) * (1 - 2.0 ** -20)
        bad_mask = None if within else err > policy.bound(b64, steps)
    flat = np.flatnonzero(bad_mask) if bad_mask is not None else np.zeros(0, np.intp)
    w = top if flat.size == 0 else int(flat[np.argmax(err.reshape(-1)[flat])])
    worst = tuple(int(i) for i in np.unravel_index(w, b.shape)) if b.ndim else ()
    return TensorDiff(name, tuple(b.shape), exact, flat, float(err.reshape(-1)[w]), worst,
                      float(b64.reshape(-1)[w]), float(a64.reshape(-1)[w]))


def _broadcast_step(step: np.ndarray | float | None, shape: tuple[int, ...]) -> np.ndarray | None:
    if step is None:
        return None
    arr = np.abs(np.asarray(step, dtype=np.float64))
    try:
        return np.broadcast_to(arr, shape)
    except ValueError:  # a per-channel step on another axis than we can tell: use the coarsest
        return np.full(shape, float(arr.max()) if arr.size else 0.0)


def _const(model: Any, value: Any) -> np.ndarray | None:
    if value is None:
        return None
    if value.const_value is not None:
        return value.const_value.numpy()
    return model.get_initializer(value.name)


def quant_step(model: Any, name: str, _depth: int = 0) -> np.ndarray | float | None:
    """The quantization step of tensor ``name`` in ``model``: 1 for an integer-annotated tensor (2 for BIPOLAR, whose
    levels are ±1, as for a BipolarQuant); the scale of a
    Quant/IntQuant/Trunc producing it; twice the scale of a BipolarQuant (levels ±s); ``|out_scale|`` of a
    MultiThreshold; ``|c|·step(x)`` for ``Mul(x, c)`` with a constant ``c``; None when no step is known."""
    if model is None or _depth > 8:
        return None
    v = model.value(name)
    if v is None:
        return None
    if is_integer_tensor(model, name):
        return 2.0 if model.get_tensor_datatype(name).name == "BIPOLAR" else 1.0
    node = v.producer()
    if node is None:
        return None
    op = node.op_type
    if op in ("Quant", "IntQuant", "Trunc"):
        scale = _const(model, node.inputs[1] if len(node.inputs) > 1 else None)
        if scale is None:
            return None
        if op == "Trunc" and len(node.inputs) > 5:  # v2: the output scale is input 5
            out_scale = _const(model, node.inputs[5])
            return None if out_scale is None else np.abs(out_scale)
        return np.abs(scale)
    if op == "BipolarQuant":
        scale = _const(model, node.inputs[1] if len(node.inputs) > 1 else None)
        return None if scale is None else 2 * np.abs(scale)
    if op == "MultiThreshold":
        attr = node.attributes.get("out_scale")
        return abs(float(attr.value)) if attr is not None else 1.0
    if op == "Mul" and len(node.inputs) == 2:
        for x, c in ((node.inputs[0], node.inputs[1]), (node.inputs[1], node.inputs[0])):
            cval = _const(model, c)
            if cval is not None and x is not None:
                inner = quant_step(model, x.name, _depth + 1)
                if inner is not None:
                    return np.abs(cval) * inner
    return None
