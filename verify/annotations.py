"""Datatype annotations are claims: check them against the values seen and the ranges that can be derived.

FINN sizes hardware from a model's integer datatype annotations (``finn_datatype`` on tensors and weights) and from
a MultiThreshold's ``out_dtype``; an annotation narrower than the values is a silent overflow in hardware even when
the model computes the right outputs in float. :func:`check_annotations` reports every such claim that is false:

* **Observed**: every integer-annotated activation holds, on every reference sample, only values of its datatype
  (finite integers in range; no 0 for BIPOLAR). A MultiThreshold output is not observed: it holds only the node's
  levels, which are checked whole (below) against its annotation and ``out_dtype``.
* **Derived** (what no sample may show but some input can reach): weights and other integer-annotated initializers
  must fit their annotation; a MultiThreshold's levels ``out_bias + out_scale·[0..N]`` must fit its ``out_dtype``
  and its output's annotation; a MatMul/Conv accumulator (constant integer weight) must hold the range its
  operands allow: per output channel, positive weights times the input's upper bound plus negative weights times
  its lower bound and the other way round (zero included for padded inputs); XnorPopcountMatMul ``[0, K]``. The
  input's range is derived the same way (MultiThreshold levels, data movement ops) where it can be, else read off
  its annotation: a claim on the operand is checked where the operand is made. Ops not listed derive nothing (their
  annotation is only checked against the values seen).

This derivation is written apart from the pipeline's own range inference (:mod:`streamline.datatypes`), on
purpose: a checker that shares the code it checks cannot find its mistakes. The one piece both share is the
accumulator arithmetic (:func:`finnlite.core.ranges.accumulator_range`, checked against enumeration in its tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np
import onnx_ir as ir

from custom_ops.subgraph import executor_with_outputs
from finnlite.core.datatypes import BaseDataType, is_integer_type, parse_datatype
from finnlite.core.errors import DataTypeError
from finnlite.core.model import Model
from finnlite.core.ranges import accumulator_range, weight_sums
from finnlite.core.tensors import element_values
from finnlite.core.traverse import node_label, topo_order

__all__ = ["AnnotationIssue", "check_annotations", "observed_ranges", "derived_ranges"]

#: ops whose output holds only values of their (first) input (plus a pad value, see :func:`_move_range`)
_MOVE = ("Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity", "MaxPool", "MaxPoolNHWC",
         "Im2Col", "Slice", "Gather", "Concat", "Pad", "GlobalMaxPool", "Expand", "Tile")


@dataclass(frozen=True)
class AnnotationIssue:
    """A false datatype claim: the tensor, its producer node (None for an initializer or input), the claimed
    datatype, where the claim comes from (``finn_datatype`` or ``out_dtype``) and what contradicts it."""

    tensor: str
    node: str | None
    claim: str
    source: str
    message: str

    def describe(self) -> str:
        where = f"node '{self.node}', " if self.node else ""
        return f"{where}tensor '{self.tensor}': {self.source} {self.claim} is false: {self.message}"


@dataclass
class _Seen:
    lo: float = np.inf
    hi: float = -np.inf
    integer: bool = True
    zero: bool = False
    example: float | None = None

    def add(self, arr: np.ndarray) -> None:
        a = np.asarray(arr)
        if a.size == 0:
            return
        lo, hi = float(np.min(a)), float(np.max(a))
        self.lo, self.hi = min(self.lo, lo), max(self.hi, hi)
        if self.integer and a.dtype.kind == "f":  # NaN and inf fail rint(a) == a, or min/max
            if not (np.isfinite(lo) and np.isfinite(hi)) or not np.array_equal(np.rint(a), a):
                integral = np.isfinite(a) & (np.rint(a) == a)
                if self.example is None:
                    self.example = float(a.reshape(-1)[int(np.argmin(integral.reshape(-1)))])
                self.integer = False
        if not self.zero and lo <= 0 <= hi:
            self.zero = bool((a == 0).any())


def _violation(dt: BaseDataType, lo: float, hi: float, integer: bool, zero: bool) -> str | None:
    """Why values in ``[lo, hi]`` (all integers if ``integer``; 0 among them if ``zero``) do not fit ``dt``."""
    if not integer:
        return "non-integer values"
    if lo < dt.min() or hi > dt.max():
        return f"values in [{lo:g}, {hi:g}] outside [{dt.min():g}, {dt.max():g}]"
    if dt.name == "BIPOLAR" and zero:
        return "the value 0 (BIPOLAR is {-1, +1})"
    return None


def _int_datatype(model: Model, name: str) -> BaseDataType | None:
    if model.value(name) is None or not model.has_tensor_datatype(name):
        return None
    dt = model.get_tensor_datatype(name)
    return dt if is_integer_type(dt) else None


def _out_dtype(node: ir.Node) -> BaseDataType | None:
    attr = node.attributes.get("out_dtype")
    if attr is None:
        return None
    value = attr.value.decode() if isinstance(attr.value, bytes) else str(attr.value)
    try:
        dt = parse_datatype(value)
    except DataTypeError:
        return None
    return dt if is_integer_type(dt) else None


def _mt_levels(node: ir.Node) -> tuple[float, float, bool, bool] | None:
    """``(lo, hi, integer, has_zero)`` of a MultiThreshold's levels ``out_bias + out_scale·[0..N]``."""
    thr = node.inputs[1] if len(node.inputs) > 1 else None
    if thr is None or thr.const_value is None or not thr.const_value.shape:
        return None
    n = int(thr.const_value.shape[-1])
    scale = float(node.attributes["out_scale"].value) if "out_scale" in node.attributes else 1.0
    bias = float(node.attributes["out_bias"].value) if "out_bias" in node.attributes else 0.0
    levels = bias + scale * np.arange(n + 1, dtype=np.float64)
    return float(levels.min()), float(levels.max()), bool(np.all(levels == np.round(levels))), bool((levels == 0).any())


def derived_ranges(model: Model) -> dict[str, tuple[float, float, bool, bool]]:
    """``{tensor: (lo, hi, integer, has_zero)}`` for the tensors whose range follows from the graph (module
    docstring); a tensor absent has no derived range."""
    out: dict[str, tuple[float, float, bool, bool]] = {}

    def operand(name: str) -> tuple[float, float, bool, bool] | None:
        if name in out:
            return out[name]
        dt = _int_datatype(model, name)
        if dt is None:
            return None
        return float(dt.min()), float(dt.max()), True, dt.name != "BIPOLAR" and dt.min() <= 0 <= dt.max()

    for node in topo_order(list(model.graph)):
        if not node.outputs or not node.inputs or node.inputs[0] is None:
            continue
        op, first = node.op_type, node.inputs[0].name
        found: tuple[float, float, bool, bool] | None = None
        if op == "MultiThreshold":
            found = _mt_levels(node)
        elif op in _MOVE and op != "Concat":
            src = operand(first)
            pad = None
            if op == "Im2Col" and any(node.attributes["pad_amount"].value if "pad_amount" in node.attributes
                                      else []):
                pad = float(node.attributes["pad_value"].value) if "pad_value" in node.attributes else 0.0
            elif op == "Pad":
                pad = 0.0  # a constant pad value other than 0 derives nothing: see below
                if len(node.inputs) > 2 and node.inputs[2] is not None:
                    src = None
            if src is not None and pad is not None:
                src = (min(src[0], pad), max(src[1], pad), src[2] and pad == round(pad), src[3] or pad == 0)
            found = src
        elif op == "XnorPopcountMatMul" and len(node.inputs) > 1 and node.inputs[1].const_value is not None:
            found = (0.0, float(node.inputs[1].const_value.shape[0]), True, True)
        elif op in ("MatMul", "Conv") and len(node.inputs) > 1 and node.inputs[1] is not None \
                and node.inputs[1].const_value is not None:
            src, sums = operand(first), weight_sums(node.inputs[1].const_value, op)
            if src is not None and sums is not None and src[2] and sums[2]:
                lo_x, hi_x = src[0], src[1]
                if op == "Conv" and (any(node.attributes["pads"].value if "pads" in node.attributes else [])
                                     or ("auto_pad" in node.attributes and node.attributes["auto_pad"].value
                                         not in ("NOTSET", "VALID"))):
                    lo_x, hi_x = min(lo_x, 0.0), max(hi_x, 0.0)
                found = (*accumulator_range(lo_x, hi_x, sums), True, True)
        if found is not None:
            for v in node.outputs:
                out[v.name] = found
    return out


def observed_ranges(model: Model, reference: Any, names: Iterable[str], samples: int | None = None,
                    executor: Any = None, each: Callable[[int, dict[str, np.ndarray]], None] | None = None
                    ) -> dict[str, _Seen]:
    """Run ``model`` on the reference samples one at a time and keep, for each tensor of ``names``, its range,
    whether it is integer and whether it holds 0 (and a first non-integer value). ``each(i, values)`` is called
    with every tensor of sample ``i`` (for other checks that need them, without running the model again)."""
    seen = {n: _Seen() for n in names}
    if not seen and each is None:
        return seen
    ex = executor if executor is not None else executor_with_outputs(model, [])
    n = reference.num_samples if samples is None else min(samples, reference.num_samples)
    for i in range(n):
        values = ex.run(reference.sample(i), return_all=True, windows=False)
        for name, s in seen.items():
            if name in values:
                s.add(values[name])
        if each is not None:
            each(i, values)
        del values
    return seen


def check_annotations(model: Any, reference: Any = None, *, samples: int | None = None, executor: Any = None,
                      each: Callable[[int, dict[str, np.ndarray]], None] | None = None,
                      derived: dict[str, tuple[float, float, bool, bool]] | None = None) -> list[AnnotationIssue]:
    """Every false integer datatype claim of ``model`` (module docstring). With ``reference`` (a
    :class:`verify.ReferenceData`) the activations are also checked against the values seen on its samples (the
    first ``samples``, all by default; ``executor``: an executor of ``model`` to run them with; ``each``: called
    with every tensor of each sample, see :func:`observed_ranges`; ``derived``: the model's
    :func:`derived_ranges`, if the caller has them)."""
    m = model if isinstance(model, Model) else Model(model, check=False)
    issues: list[AnnotationIssue] = []
    # weights and other constants: their values are their range
    for name, v in m.graph.initializers.items():
        dt = _int_datatype(m, name)
        if dt is None or v.const_value is None:
            continue
        arr = np.asarray(element_values(v.const_value))  # in its own dtype: min, max and rint are exact
        s = _Seen()
        s.add(arr)
        why = _violation(dt, s.lo, s.hi, s.integer, s.zero) if arr.size else None
        if why is not None:
            issues.append(AnnotationIssue(name, None, dt.name, "finn_datatype", f"the initializer holds {why}"))
    derived = derived if derived is not None else derived_ranges(m)
    producers = {v.name: node for node in m.graph for v in node.outputs}
    claims: list[tuple[str, ir.Node | None, BaseDataType, str]] = []
    for name, node in producers.items():
        dt = _int_datatype(m, name)
        if dt is not None:
            claims.append((name, node, dt, "finn_datatype"))
        if node.op_type == "MultiThreshold" and node.outputs and node.outputs[0].name == name:
            odt, levels = _out_dtype(node), _mt_levels(node)
            # with a non-integer out_scale or out_bias qonnx annotates the output FLOAT32 and out_dtype claims
            # nothing about it (it names the levels' type before scaling)
            if odt is not None and (levels is None or levels[2]):
                claims.append((name, node, odt, "out_dtype"))
    for v in m.graph.inputs:
        dt = _int_datatype(m, v.name)
        if dt is not None:
            claims.append((v.name, None, dt, "finn_datatype"))
    for name, node, dt, source in claims:
        if name in derived:
            lo, hi, integer, zero = derived[name]
            why = _violation(dt, lo, hi, integer, zero)
            if why is not None:
                what = "levels" if node is not None and node.op_type == "MultiThreshold" else "derived range"
                issues.append(AnnotationIssue(name, node_label(node) if node is not None else None, dt.name, source,
                                              f"its {what} hold {why}"))
    if reference is not None:
        exact = {name for name, node, _, _ in claims if node is not None and node.op_type == "MultiThreshold"
                 and name in derived}  # its levels are its values: checked above
        seen = observed_ranges(m, reference, [name for name, _, _, _ in claims if name not in exact], samples,
                               executor, each)
        reported = {(i.tensor, i.source) for i in issues}
        for name, node, dt, source in claims:
            s = seen.get(name)
            if s is None or s.lo > s.hi or (name, source) in reported:
                continue
            why = _violation(dt, s.lo, s.hi, s.integer, s.zero)
            if why is not None:
                example = f" (e.g. {s.example:.9g})" if s.example is not None and not s.integer else ""
                issues.append(AnnotationIssue(name, node_label(node) if node is not None else None, dt.name, source,
                                              f"the reference data show {why}{example}"))
    return issues
