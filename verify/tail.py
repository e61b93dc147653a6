"""The output dequantization as numbers: the streamlined tail's scale and bias against the original's.

A streamlined model ends with an integer tensor ``q`` and an affine tail (constant Mul/Div/Add/Sub and shape ops,
:func:`verify.final.integer_tail`): element by element, ``y = a·q + b``. Comparing levels (within half a step)
lets a scale off by a few per cent or a bias off by 0.45 step through. The original computes the same real
number: its float64 execution is exact up to ~1e-15 relative from its float32 parameters, and the streamlined
tail's constants are float32 roundings of products of those parameters (about 6e-8 relative each). So, on samples
whose levels agree, the original's float64 output must equal ``a·q + b`` within

    ``rtol · (|a|·|q| + |a| + |b|)``, ``rtol`` = :data:`TAIL_RTOL` (1e-6),

that is, ``a`` to 1e-6 relative and ``b`` to 1e-6 of the scale (or of itself, for a bias many steps large).

The original's scale and bias are not read off its last quantizer: a BNN-PYNQ network has no output quantizer (its
tail is the last layer's weight scale, TensorNorm and the xnor encoding ``2·p − K``), and a Quant's ``s·(q − z)``
would have to be composed with everything after it. The original itself, run in float64 on the same samples, gives
them as numbers instead: ``a`` and ``b`` are fitted by least squares over the elements that share the streamlined
tail's ``(a, b)`` (all of them for a per-tensor tail), which names the wrong constant when they differ. This needs
``q`` to take two values across those elements; the element-wise comparison above needs nothing.

A wrong scale can also move the output by more than half a step, so that the levels seem to differ. The samples
where they do are compared too: if the original's output is exactly affine in the streamlined ``q`` there (every
group with three or more distinct levels fits a line to 1e-6 of a step), ``q`` is right and the constants are
wrong (:attr:`TailIssue.explains_levels`), and that is what the final check reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import onnx_ir as ir

from custom_ops.executor import Executor
from custom_ops.subgraph import model_of
from finnlite.core.traverse import constant_tensors, node_label, topo_order

__all__ = ["TailIssue", "check_tail", "TAIL_RTOL", "last_quantizers", "float64_from_levels", "tail_outputs64"]

#: relative tolerance on the tail's scale (and on its bias, relative to the scale or to the bias itself)
TAIL_RTOL = 1e-6


@dataclass
class TailIssue:
    """The tail of output ``output`` disagrees with the original: on ``sample``, by ``max_steps`` steps at most;
    ``node`` is the tail node holding the constant that is off (the scale's or the bias'), ``detail`` the numbers."""

    output: str
    sample: int
    node: str | None
    max_steps: float
    detail: str
    #: the original's output is exactly ``a'·q + b'`` with other constants on samples with three or more levels
    #: (so the levels ``q`` are right, and the output differences come from the constants alone)
    explains_levels: bool = False

    @property
    def message(self) -> str:
        return (f"the output dequantization of '{self.output}' differs from the original by up to "
                f"{self.max_steps:.3g} step(s) on sample {self.sample}: {self.detail}")

    def describe(self) -> str:
        return (f"node '{self.node}': " if self.node else "") + self.message


def tail_affine(runner: Any, q_name: str, out: str, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Element-wise ``(a, b)`` of the tail run by ``runner`` (a float64 executor of the tail) for ``q`` of
    ``shape``: ``b = T(0)``, ``a = T(1) − T(0)``."""
    zero = np.zeros(shape, np.float64)
    b = runner.run({q_name: zero})[out].astype(np.float64)
    a = runner.run({q_name: zero + 1})[out].astype(np.float64) - b
    return a, b


def _fit(q: np.ndarray, y: np.ndarray) -> tuple[float, float] | None:
    """Least-squares ``y ≈ a·q + b`` (None unless ``q`` takes two values)."""
    if q.size < 2 or np.ptp(q) == 0:
        return None
    qm, ym = q.mean(), y.mean()
    a = float(np.sum((q - qm) * (y - ym)) / np.sum((q - qm) ** 2))
    return a, float(ym - a * qm)


def check_tail(output: str, q_name: str, runner: Any, tail_nodes: list[Any], samples: list[tuple[int, np.ndarray,
               np.ndarray]], rtol: float = TAIL_RTOL) -> TailIssue | None:
    """Compare the streamlined tail with the original's float64 outputs on ``samples``: ``(index, q, y64)`` with
    ``q`` the streamlined integer tensor and ``y64`` the original's output (module docstring). None if they agree."""
    if not samples:
        return None
    a, b = tail_affine(runner, q_name, output, samples[0][1].shape)  # in the output's shape
    worst: tuple[float, int] | None = None
    qs, ys = [], []
    for i, q_in, y64 in samples:
        y = runner.run({q_name: q_in.astype(np.float64)})[output].astype(np.float64)
        q = np.round(np.divide(y - b, a, out=np.zeros_like(y), where=a != 0))  # q through the tail's shape ops
        expected = np.asarray(y64, np.float64).reshape(y.shape)
        err = np.abs(y - expected)
        tol = rtol * (np.abs(a) * np.abs(q) + np.abs(a) + np.abs(b))
        if np.any(err > tol):
            steps = float(np.max(err / np.where(a != 0, np.abs(a), np.inf)))
            if worst is None or steps > worst[0]:
                worst = (steps, i)
        qs.append(q)
        ys.append(expected)
    if worst is None:
        return None
    # name the constant: fit the original's scale and bias over the elements sharing the tail's (a, b)
    Q, Y = np.stack(qs), np.stack(ys)
    A, B = np.broadcast_to(a, Q.shape), np.broadcast_to(b, Q.shape)
    keys = np.stack([A.reshape(-1), B.reshape(-1)], 1)
    detail, which, exact, informative = "", None, True, 0
    groups = np.unique(keys, axis=0)
    for ka, kb in groups[:4096]:
        sel = (A == ka) & (B == kb)
        fit = _fit(Q[sel], Y[sel])
        if fit is None:
            continue
        fa, fb = fit
        if np.unique(Q[sel]).size >= 3:  # two points always lie on a line: three tell
            resid = float(np.max(np.abs(Y[sel] - (fa * Q[sel] + fb)))) / max(abs(fa), 1e-300)
            exact &= resid <= 1e-6 * max(float(np.max(np.abs(Q[sel]))), 1.0)
            informative += 1
        scale_off = abs(fa - ka) > rtol * abs(ka)
        bias_off = abs(fb - kb) > rtol * (abs(ka) + abs(kb))
        if scale_off or bias_off:
            which = which or ("scale" if scale_off else "bias")
            detail = detail or (f"its scale {ka:.9g} and bias {kb:.9g}, the original's (fitted on its float64 outputs) "
                      f"{fa:.9g} and {fb:.9g} (scale off by {abs(fa - ka) / abs(ka):.3g} relative, bias by "
                      f"{abs(fb - kb) / abs(ka):.3g} step)" if ka != 0 else f"scale 0, the original's {fa:.9g}")
    if not detail:
        detail = "the tail's a·q + b does not match the original's float64 output beyond rounding"
    ops = ("Mul", "Div") if which == "scale" else ("Add", "Sub") if which == "bias" else ()
    named = [n for n in tail_nodes if n.op_type in ops] or list(tail_nodes)
    node = node_label(named[-1] if which == "bias" else named[0]) if named else None
    explains = exact and informative > 0 and which is not None
    return TailIssue(output, worst[1], node, worst[0], detail, explains_levels=explains)


#: ops that make levels of their data input: the original's tail starts at the last of them on each path
_LEVEL_OPS = ("Quant", "IntQuant", "BipolarQuant", "Trunc", "MultiThreshold")
_NEAREST = ("ROUND", "HALF_EVEN", "HALF_UP", "HALF_DOWN")


def _requantizes(node: Any) -> bool:
    """Whether ``node`` run in float64 on its own float32 output gives the same level: a BipolarQuant (``±s``), or
    a Quant rounding to nearest (``out32/s + z`` is within ``2^-24·|q − z|`` of the integer ``q``: no half near)."""
    if node.op_type == "BipolarQuant":
        return True
    attr = node.attributes.get("rounding_mode")
    mode = attr.value if attr is not None else "ROUND"
    mode = (mode.decode() if isinstance(mode, bytes) else str(mode)).upper()
    return node.op_type in ("Quant", "IntQuant") and mode in _NEAREST


def last_quantizers(original: Any, targets: Sequence[str] | None = None) -> tuple[list[Any], list[Any]] | None:
    """The nodes of ``original`` from its last activation quantizers before ``targets`` (default: its outputs) to
    them (those quantizers included, with the constant-only nodes they read, such as weight quantizers), and those
    quantizers; a level op :func:`_requantizes` does not hold for (a MultiThreshold, a Trunc, a Quant rounding
    down) is run through, not started at. None if a target depends on a graph input through no such quantizer."""
    const = constant_tensors(original)
    keep: dict[int, Any] = {}
    cuts: dict[int, Any] = {}
    work, seen = list(original.output_names if targets is None else targets), set()
    while work:
        name = work.pop()
        if name in seen or original.is_initializer(name):
            continue
        seen.add(name)
        node = original.find_producer(name)
        if node is None:
            return None  # a graph input, reached through no quantizer
        if id(node) in keep:
            continue
        keep[id(node)] = node
        data = node.inputs[0] if node.inputs else None
        if node.op_type in _LEVEL_OPS and data is not None and data.name not in const and _requantizes(node):
            cuts[id(node)] = node  # levels of an activation: the tail starts here (others are run through)
            work += [v.name for v in node.inputs[1:] if v is not None]
        else:
            work += [v.name for v in node.inputs if v is not None]
    return topo_order(list(keep.values())), list(cuts.values())


def float64_from_levels(reference: Any, targets: Sequence[str], samples: Sequence[int]
                        ) -> dict[int, dict[str, np.ndarray]] | None:
    """The original's tensors ``targets`` in float64 on ``samples``, from the levels of the last activation
    quantizers before them (:func:`last_quantizers`): each such quantizer runs in float64 on its own output of the
    original's float32 run, which gives its level again exactly (:func:`_requantizes`), and everything after it
    runs in float64. Where those quantizers' levels agree with float64 execution (all but float32 near-ties there)
    this is float64 execution; at such a near-tie it follows the float32 levels. A small model instead of a float64
    run of the whole network (ResNet-18's outputs: its classifier instead of 21 layers). None if there is no such
    start before a target."""
    original = reference.original()
    found = last_quantizers(original, targets)
    if found is None or not samples:
        return None
    nodes, cuts = found
    levels = {q.outputs[0].name: f"{q.outputs[0].name}__float32_levels" for q in cuts}
    runs = dict(reference.tensors(list(levels), samples, np.float32))
    protos = []
    for n in nodes:
        proto = ir.serde.serialize_node(n)
        if any(n is q for q in cuts):
            proto.input[0] = levels[n.outputs[0].name]  # its own float32 output: the same level
        protos.append(proto)
    consts = {v.name: original.get_initializer(v.name) for n in nodes for v in n.inputs
              if v is not None and original.is_initializer(v.name)}

    def feeds(i: int) -> dict[str, np.ndarray]:
        return {fed: np.asarray(runs[i][out], np.float64) for out, fed in levels.items()}

    ex = Executor(model_of(protos, feeds(samples[0]), consts, original.graph.opset_imports), dtype=np.float64)
    return {i: {t: v for t, v in ex.run(feeds(i)).items() if t in targets} for i in samples}


def tail_outputs64(reference: Any, samples: Sequence[int]) -> dict[int, dict[str, np.ndarray]] | None:
    """The original's outputs in float64 on ``samples`` from its tail alone (:func:`float64_from_levels`); at a
    float32 near-tie of its last quantizers this gives the levels the streamlined model is compared with."""
    return float64_from_levels(reference, reference.original().output_names, samples)
