"""The streamlined integer weights against the original's quantized weights, element by element.

A changed weight element shows on random inputs only where its input is not 0 (and, through a threshold, only
where the change crosses it); a dead input in eight samples hides it. But the weights themselves can be compared:
streamlining scales a layer's weights per output channel (the weight scale, and any sign moved into them, go to the
thresholds or the output dequantization), lowers a convolution to ``Im2Col → MatMul`` (rows ordered ``(kh, kw,
C_in)``) and turns a bipolar layer into ``XnorPopcountMatMul`` with binary weights ``(w + 1) / 2``. So each column
``c`` of the streamlined weight must be ``λ_c`` times the original's quantized weight of output channel ``c`` (for
binary weights, ``2·w − 1`` must be ``±1`` times its sign pattern), with the same zeros.

A streamlined ``MatMul``/``XnorPopcountMatMul`` is matched to the original layer its name comes from (conversion
and lowering name it ``<layer>_MatMul`` or ``<layer>_matmul``); a lowered depthwise convolution (its weight a
:class:`~finnlite.core.tensors.DepthwiseWeight`, the ``[C, kh, kw]`` kernel) is compared kernel to kernel. A layer
whose weight is not a (Bipolar)Quant of a constant, a grouped convolution that is not depthwise, or a shape no
layout above explains, is not compared. The comparison needs no sample: it is a proof, whatever the input range;
``proved`` collects the streamlined nodes whose weights it proved equal (their accumulators are then the
original's up to the layer's input, :mod:`verify.proofs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from finnlite.core.graphutil import channel_order
from finnlite.core.model import Model
from finnlite.core.shapes import const_array
from finnlite.core.tensors import DepthwiseWeight
from finnlite.core.traverse import node_label

__all__ = ["WeightIssue", "compare_weights", "RTOL"]

RTOL = 1e-5
Folded = Callable[[str], "np.ndarray | None"] | None
_SUFFIXES = ("_MatMul", "_matmul")


@dataclass
class WeightIssue:
    """A streamlined weight that is not the original's: the MatMul node, the weight tensor, the original layer."""

    node: str
    tensor: str
    layer: str
    message: str

    def describe(self) -> str:
        return f"node '{self.node}', tensor '{self.tensor}' (original layer '{self.layer}'): {self.message}"


def _quantized_weight(original: Model, layer: Any, folded: Folded = None) -> np.ndarray | None:
    """The original layer's weight as its quantizer computes it (float32, as the model does), or None; ``folded``
    may give it already computed (the reference executor's folded constant)."""
    from custom_ops.registry import make_op

    w = layer.inputs[1] if len(layer.inputs) > 1 else None
    if w is None:
        return None
    direct = const_array(w)
    if direct is not None:
        return np.asarray(direct, np.float32)
    q = w.producer()
    if q is None or q.op_type not in ("Quant", "BipolarQuant"):
        return None
    known = folded(w.name) if folded is not None else None
    if known is not None:
        return np.asarray(known, np.float32)
    args = [const_array(v) if v is not None else None for v in q.inputs]
    if any(a is None for a in args):
        return None
    try:
        return np.asarray(make_op(q).execute([np.asarray(a) for a in args])[0], np.float32)
    except Exception:  # noqa: BLE001 - a quantizer this check does not handle: nothing compared
        return None


def _as_columns(layer: Any, w: np.ndarray, shape: tuple[int, int]) -> np.ndarray | None:
    """The original weight as a ``[K, C]`` matrix in the streamlined row order, or None."""
    attrs = {k: a.value for k, a in layer.attributes.items()}
    if layer.op_type == "Conv":
        group = int(attrs.get("group", 1))
        if w.ndim != 4:
            return None
        if group != 1:  # a depthwise convolution stored dense: block-diagonal rows (kh, kw, C) x C
            c, _, kh, kw = w.shape
            if group != c or w.shape[1] != 1 or shape != (kh * kw * c, c):
                return None
            cols = np.zeros(shape, np.float32)
            idx = np.arange(c)
            for k, kernel in enumerate(w[:, 0].reshape(c, -1).T):  # (kh, kw) positions in order
                cols[k * c + idx, idx] = kernel
            return cols
        cols = w.transpose(2, 3, 1, 0).reshape(-1, w.shape[0])  # (kh, kw, C_in) x C_out
    elif layer.op_type == "Gemm":
        cols = w.T if int(attrs.get("transB", 0)) else w
    elif layer.op_type == "MatMul":
        cols = w
    else:
        return None
    return cols if cols.shape == shape else None


def compare_weights(model: Model, original: Model, proved: set[str] | None = None, folded: Folded = None
                    ) -> list[WeightIssue]:
    """Every matched streamlined weight that is not the original's up to a scale per output channel (module
    docstring); the names of the nodes whose weights were compared and found equal are added to ``proved``.
    ``folded(name)``: the original's quantized weight ``name`` if already computed (else None)."""
    issues: list[WeightIssue] = []
    proved = proved if proved is not None else set()
    for node in model.graph:
        if node.op_type not in ("MatMul", "XnorPopcountMatMul") or len(node.inputs) < 2 or node.inputs[1] is None:
            continue
        t = node.inputs[1].const_value
        if t is None or len(t.shape) != 2:
            continue
        name = next((node.name[:-len(s)] for s in _SUFFIXES if node.name.endswith(s)), None)
        layer = original.get_node_from_name(name) if name else None
        if layer is None or layer.op_type not in ("Conv", "Gemm", "MatMul"):
            continue
        if isinstance(t, DepthwiseWeight):
            compared, issue = _depthwise(node, t, original, layer, folded)
            if issue is not None:
                issues.append(issue)
            elif compared:
                proved.add(node_label(node))
            continue
        data = original.find_producer(layer.inputs[0].name) if layer.inputs and layer.inputs[0] is not None else None
        if data is not None and data.op_type == "Concat":
            continue  # branches of different scales: their rows may carry different integer multipliers
        w_orig = _quantized_weight(original, layer, folded)
        ws = np.asarray(t.numpy(), np.float32)
        wo = _as_columns(layer, w_orig, ws.shape) if w_orig is not None else None
        if wo is None:
            continue
        if node.op_type == "XnorPopcountMatMul":
            ws = 2 * ws - 1  # binary back to bipolar
        problem = _proportional(ws, wo)
        if problem is not None and _rows_permuted(ws, wo):
            continue  # a layout change (NHWC flatten, tokens) reordered the rows: not compared element by element
        if problem is not None:
            issues.append(WeightIssue(node_label(node), node.inputs[1].name, node_label(layer), problem))
        else:
            proved.add(node_label(node))
    return issues


def _depthwise(node: Any, t: DepthwiseWeight, original: Model, layer: Any, folded: Folded
               ) -> tuple[bool, WeightIssue | None]:
    """A lowered depthwise convolution's kernel ``[C, kh, kw]`` against the original's ``[C, 1, kh, kw]`` weight:
    channel ``c`` must be ``λ_c`` times the original's, with the same zeros. Returns whether it was compared (the
    layer is a depthwise convolution of that kernel shape) and the issue, if any."""
    w = _quantized_weight(original, layer, folded)
    c, kh, kw = t.kernel.shape
    group = int(layer.attributes["group"].value) if "group" in layer.attributes else 1
    if w is None or w.shape != (c, 1, kh, kw) or group != c:
        return False, None
    ws = np.asarray(t.kernel, np.float32).reshape(c, -1).T  # [kh·kw, C]: one column per channel
    wo = w.reshape(c, -1).T
    order = channel_order(node)  # channel j is the original's channel order[j] (a channel shuffle moved past it)
    if order is not None:
        wo = wo[:, order]
    problem = _proportional(ws, wo)
    if problem is None:
        return True, None
    return True, WeightIssue(node_label(node), node.inputs[1].name, node_label(layer), f"depthwise kernel: {problem}")


def _proportional(ws: np.ndarray, wo: np.ndarray) -> str | None:
    """Why column ``c`` of ``ws`` is not ``λ_c`` times column ``c`` of ``wo`` (None if every column is)."""
    # λ_c = ±max|ws_c| / max|wo_c|, its sign that of the columns' dot product (column maxima are fast, argmax is not)
    top_s, top_o = np.abs(ws).max(axis=0, initial=0.0), np.abs(wo).max(axis=0, initial=0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        lam = np.where(top_o > 0, np.sign(np.einsum("kc,kc->c", ws, wo)) * top_s / top_o, 0.0)
    err = np.abs(ws - lam[None, :] * wo)
    tol = RTOL * np.maximum(top_s, 1e-30)[None, :]
    bad = ((ws == 0) != (wo == 0)) | (err > tol)
    if not bad.any():
        return None
    k, c = (int(i) for i in np.argwhere(bad)[0])
    return (f"element [{k}, {c}] is {ws[k, c]:g} where the original's quantized weight {wo[k, c]:.9g} times the "
            f"column's scale {lam[c]:.9g} gives {lam[c] * wo[k, c]:.9g} ({int(bad.sum())} element(s) differ)")


def _rows_permuted(ws: np.ndarray, wo: np.ndarray) -> bool:
    """Whether every column of ``ws`` holds the values of ``λ_c`` times the same column of ``wo`` in another row
    order (λ_c = ±max|ws| / max|wo|): the same weights, rows reordered by a layout change."""
    for c in range(ws.shape[1]):
        s, o = np.sort(ws[:, c]), wo[:, c]
        top = np.abs(o).max(initial=0.0)
        if top == 0:
            if s.any():
                return False
            continue
        lam = np.abs(s).max(initial=0.0) / top
        tol = RTOL * max(np.abs(s).max(initial=0.0), 1e-30)
        if not any(np.all(np.abs(s - np.sort(sign * lam * o)) <= tol) for sign in (1.0, -1.0)):
            return False
    return True
