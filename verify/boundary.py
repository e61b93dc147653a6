"""Boundary-seeking reference data: inputs whose first-layer pre-activations land on and next to thresholds.

Random inputs almost never meet a threshold closely: a first-layer threshold that is wrong by a small amount (more
than float rounding, much less than the spread of the values) changes the model only for inputs in a thin band,
which a handful of random samples misses. Boundary mode draws the same random samples, then moves parts of them so
that chosen elements of the *first* quantizer's input ``z`` sit exactly where the original quantizer changes level.

**Where.** The first quantizer (Quant/BipolarQuant) reached from the single graph input, when ``z`` is an affine
function of the input (:func:`find_first_layer`):

* *input quantizer*: the input reaches it through data movement and scalar Mul/Div/Add/Sub (a preprocessing
  ``2·x − 1``): ``z = γ·x + β`` elementwise; the boundaries map back to input values;
* *float first layer*: a Conv (or MatMul/Gemm) with constant weights reads the input (through scalar ops), then
  per-channel affine ops (bias, BatchNorm, Mul/Add), an optional Relu, then the quantizer, as in MobileNet or
  ResNet-18: ``z_e = z_e(x) + α·slope_e`` when the input moves by ``α·d_e`` along the weights ``d_e`` of output
  element ``e`` placed on its receptive field (only that field changes; targets of one sample have disjoint fields,
  so they do not interact). The slope is measured on the original's own prefix (BatchNorm, scales and signs
  included), in float64.

Interior thresholds (after the first layer) see integer accumulators of known range: the exhaustive proofs of the
final check (:mod:`verify.proofs`) already check every integer level there, whatever the samples, so boundary mode
does not aim at them. Nor does it aim at an integer graph input (its first layer is then integer too).

**What.** The quantizer's decision boundaries ``b`` (``s·(k + ½ − zp)`` for rounding modes, ``s·(k − zp)`` for
floor/ceil-like ones, 0 for bipolar; above 0 behind a Relu) and, per sample, targets at offsets from them measured
in ``D = |b| + |z(0)| + Σ|g_k·x_k|`` (the magnitudes the float32 computation of ``z``, and of a stored threshold,
rounds: its error is a few ulps of ``D``, not of ``|b|``):

* *near* targets at ``b ± 2⁻¹⁶·D, ± 2⁻¹²·D, ± 2⁻⁸·D``: outside float32 rounding, so every correct execution
  decides them like float64 execution of the original. Many per sample, cycling over (channel, boundary, offset)
  combinations (a Conv first layer: the boundary asked for, else the nearest reachable one inside the input range);
* *tight* targets, on the boundary in float64 and float32 terms. For an input quantizer: the float32 input nearest
  ``b`` (exactly on it when representable: a rounding tie) and up to two float32 neighbours each side, a quarter of
  the input, kept only where the original's float32 and float64 executions agree (there the streamlined
  MultiThreshold, whose thresholds are exact float32 numbers, must agree too). For a float layer, one per sample (a
  float-layer near-tie per sample is what the final check can attribute), in turn: the closest input the float32
  input can express below ``b`` or at/above it (float64 terms), or ``b ∓ 2⁻²³·D`` (float32 terms).

**Check.** :func:`check_first_layer` compares, on every element of every sample (not only the targets), the
streamlined model's first MultiThreshold with the original quantizer, counted in levels (per channel up to the
constant offset or reversal of their level numbering): an element must agree with float64 execution of the original,
or with its float32 execution (a near-tie of the original), or lie within
:data:`verify.final.FLOAT_LAYER_RTOL` of one of the streamlined thresholds on the streamlined model's float64 run (a
float32 threshold cannot be exact there), else it is an error naming the node, the element and the distance. The
outputs are compared by :func:`verify.final.final_check` on the same samples (:func:`boundary_check` runs both).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import onnx_ir as ir

from custom_ops.executor import Executor
from custom_ops.multithreshold import channel_axis_of
from custom_ops.quant import max_int, min_int
from custom_ops.subgraph import subgraph_model
from finnlite.core.datatypes import is_integer_type
from finnlite.core.errors import VerificationError
from finnlite.core.model import Model, as_model
from finnlite.core.shapes import const_array
from finnlite.core.traverse import ancestors, constant_tensors, node_label, topo_order
from verify.final import FLOAT_LAYER_RTOL, FinalCheck, final_check
from verify.reference import ReferenceData
from verify.ties import is_bipolar, margin_at

log = logging.getLogger(__name__)

__all__ = ["FirstLayer", "Target", "BoundaryPlan", "boundary_reference", "find_first_layer", "FirstLayerIssue",
           "FirstLayerCheck", "check_first_layer", "BoundaryCheck", "boundary_check", "NEAR_OFFSETS", "TIGHT_KINDS"]

_MOVE = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")
_SCALAR = ("Mul", "Div", "Add", "Sub")
_LAYERS = ("Conv", "MatMul", "Gemm")
_ROUNDING = ("ROUND", "HALF_EVEN", "HALF_UP", "HALF_DOWN")
#: near targets: offsets from a boundary in units of D (module docstring), on both sides
NEAR_OFFSETS = (2.0**-16, 2.0**-12, 2.0**-8)
#: the tight target of each sample, in turn
TIGHT_KINDS = ("below64", "above64", "below32", "above32")
#: at most this many targets per sample (a MatMul first layer: every target moves the whole input)
MAX_DENSE_TARGETS = 16


@dataclass
class FirstLayer:
    """The original's first quantizer and the affine prefix computing its input ``z`` from graph input ``input``."""

    kind: str  # "input quantizer" or "float layer"
    input: str
    z: str
    quantizer: ir.Node
    layer: ir.Node | None
    relu: bool
    prefix: list[ir.Node]

    def describe(self) -> str:
        what = f"'{node_label(self.layer)}' ({self.layer.op_type}) then " if self.layer is not None else ""
        return f"{self.kind}: {what}quantizer '{node_label(self.quantizer)}' on '{self.z}'"


@dataclass
class Target:
    """One placed element: sample, element of ``z`` (the original's layout), the boundary, where ``z`` ended up
    (float64 execution of the original's prefix) and the kind of offset asked for."""

    sample: int
    index: tuple[int, ...]
    boundary: float
    value: float
    kind: str

    @property
    def offset(self) -> float:
        return self.value - self.boundary


@dataclass
class BoundaryPlan:
    """What boundary mode did: the first layer found (None, with ``reason``, when it fell back to random samples)
    and the targets placed."""

    layer: FirstLayer | None
    targets: list[Target] = field(default_factory=list)
    reason: str = ""
    boundaries: int = 0

    def kinds(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.targets:
            out[t.kind] = out.get(t.kind, 0) + 1
        return out

    def describe(self) -> str:
        if self.layer is None:
            return f"boundary mode: random samples only ({self.reason})"
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(self.kinds().items()))
        return (f"boundary mode: {len(self.targets)} elements of '{self.layer.z}' placed at {self.boundaries} "
                f"decision boundaries of the {self.layer.describe()} ({kinds})")


# -- the first layer -----------------------------------------------------------------------------------------------
def find_first_layer(original: Model) -> tuple[FirstLayer | None, str]:
    """The first quantizer after the single graph input and its affine prefix (module docstring), or None and why
    not."""
    inputs = list(original.graph.inputs)
    if len(inputs) != 1:
        return None, f"the model has {len(inputs)} data inputs (boundary mode handles one)"
    x = inputs[0]
    dt = original.get_tensor_datatype(x.name) if original.has_tensor_datatype(x.name) else None
    if (dt is not None and is_integer_type(dt)) or (x.dtype is not None and x.dtype.numpy().kind in "iu"):
        return None, ("the input is integer: the first layer has integer accumulators, whose thresholds the "
                      "exhaustive proofs check on every level")
    const = constant_tensors(original)
    name, layer, relu = x.name, None, False
    for _ in range(64):
        users = original.find_consumers(name)
        if len(users) != 1:
            return None, f"'{name}' feeds {len(users)} nodes before the first quantizer"
        node = users[0]
        op = node.op_type
        others = [v for v in node.inputs if v is not None and v.name != name]
        if op in ("Quant", "BipolarQuant") and node.inputs[0] is not None and node.inputs[0].name == name:
            if any(v.name not in const for v in others):
                return None, f"quantizer '{node_label(node)}' has computed parameters"
            z = name
            if relu:
                z = original.find_producer(name).inputs[0].name
            prefix = [n for n in topo_order(list(original.graph))
                      if id(n) in ancestors([original.find_producer(z)]) or n is original.find_producer(z)]
            kind = "float layer" if layer is not None else "input quantizer"
            return FirstLayer(kind, x.name, z, node, layer, relu, prefix), ""
        if relu:
            return None, f"the Relu '{node_label(original.find_producer(name))}' is not followed by a quantizer"
        if any(v.name not in const for v in others):
            return None, f"'{node_label(node)}' ({op}) joins another computed tensor"
        if op in _MOVE:
            pass
        elif op == "Transpose" and layer is not None:
            return None, f"the Transpose '{node_label(node)}' between the layer and its quantizer is not handled"
        elif op == "Transpose":
            pass
        elif op in _SCALAR and node.inputs[0] is not None:
            c = const_array(others[0]) if others else None
            if layer is None and (c is None or c.size != 1):
                # per-element constants before a layer are fine (any direction works), before an input
                # quantizer they tie input elements to channels: not handled
                if c is None or op in ("Div",):
                    return None, f"'{node_label(node)}' ({op}) has a non-scalar operand before the quantizer"
                return None, f"'{node_label(node)}' ({op}) has a non-scalar operand before the input quantizer"
        elif op == "BatchNormalization" and layer is not None:
            pass
        elif op in _LAYERS and layer is None and node.inputs[0] is not None and node.inputs[0].name == name:
            if op == "Conv" and str(node.attributes["auto_pad"].value if "auto_pad" in node.attributes
                                    else "NOTSET") not in ("NOTSET", ""):
                return None, f"Conv '{node_label(node)}' uses auto_pad"
            layer = node
        elif op == "Relu" and layer is not None:
            relu = True
        else:
            return None, (f"'{node_label(node)}' ({op}) between the input and the first quantizer is not an affine "
                          "op boundary mode handles")
        name = node.outputs[0].name
    return None, "no quantizer found after the input"


def _boundaries(q: ir.Node, shape: tuple[int, ...], relu: bool) -> np.ndarray | None:
    """The decision boundaries of quantizer ``q`` in ``z`` as ``[C, K]`` (channel axis 1 of ``shape``, or one row
    for a per-tensor quantizer), NaN-padded; None for a layout not handled."""
    params = [const_array(v) if v is not None else None for v in q.inputs[1:]]
    if is_bipolar(q):
        return None if relu else np.zeros((1, 1))
    if len(params) < 3 or any(p is None for p in params[:3]):
        return None
    s, zp, bits = (np.asarray(p, np.float64) for p in params[:3])
    attrs = {k: a.value for k, a in q.attributes.items()}
    signed, narrow = bool(attrs.get("signed", 1)), bool(attrs.get("narrow", 0))
    mode = str(attrs.get("rounding_mode", "ROUND")).upper()
    b = int(bits.reshape(-1)[0])
    ks = np.arange(min_int(signed, narrow, b), max_int(signed, narrow, b), dtype=np.float64) + (0.5 if mode in _ROUNDING else 1.0)
    channels = shape[1] if len(shape) > 1 else 1
    try:
        s_c = np.broadcast_to(s, shape).reshape(shape[0], channels, -1)[0, :, 0] if s.size > 1 else s.reshape(1)
        z_c = np.broadcast_to(zp, shape).reshape(shape[0], channels, -1)[0, :, 0] if zp.size > 1 else zp.reshape(1)
    except ValueError:
        return None
    if s.size > 1 and np.broadcast_to(s, shape).reshape(shape[0], channels, -1).std(axis=2).max() > 0:
        return None  # not per channel of axis 1
    rows = max(s_c.size, z_c.size)
    out = np.broadcast_to(s_c, (rows,))[:, None] * (ks[None, :] - np.broadcast_to(z_c, (rows,))[:, None])
    if relu:
        out = np.where(out > 0, out, np.nan)
    return out


# -- placing targets -----------------------------------------------------------------------------------------------
class _Prefix:
    """The original's prefix (input -> z, with every tensor it computes) in float64, and up to the first
    quantizer's output in float32 and float64."""

    def __init__(self, original: Model, layer: FirstLayer, example: np.ndarray) -> None:
        self.ex = _prefix_executor(original, original.find_producer(layer.z), layer.input, example, np.float64)
        self.q = {dt: _prefix_executor(original, layer.quantizer, layer.input, example, dt)
                  for dt in (np.float32, np.float64)}
        self.input, self.z, self.y = layer.input, layer.z, layer.quantizer.outputs[0].name
        self._map: np.ndarray | None = None

    def z_of(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self.ex.run({self.input: x})[self.z], np.float64)

    def all(self, x: np.ndarray) -> dict[str, np.ndarray]:
        return self.ex.run({self.input: x}, return_all=True)

    def parted(self, x: np.ndarray) -> np.ndarray:
        """Flat indices of the quantizer's output where the original's float32 and float64 executions differ."""
        a, b = (np.asarray(self.q[dt].run({self.input: x.astype(dt)})[self.y], np.float64)
                for dt in (np.float32, np.float64))
        return np.flatnonzero(a.reshape(-1) != b.reshape(-1))

    def input_elements(self, shape: tuple[int, ...]) -> np.ndarray:
        """For an elementwise prefix (data movement and scalar ops): the input element of each flat element of
        ``z`` (found by running the prefix on 0, 1, 2, ...)."""
        if self._map is None:
            z0 = self.z_of(np.zeros(shape)).reshape(-1)
            z1 = self.z_of(np.ones(shape)).reshape(-1)
            zi = self.z_of(np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)).reshape(-1)
            self._map = np.rint((zi - z0) / (z1 - z0)).astype(np.int64)
        return self._map


def _conv_fields(layer: ir.Node, w: np.ndarray, x_shape: tuple[int, ...], z_shape: tuple[int, ...]
                 ) -> Any:
    """For a 2-D Conv: a function (c, h, w) -> (slices of x, the weight patch to add there), or None."""
    if w.ndim != 4 or len(x_shape) != 4:
        return None
    a = {k: v.value for k, v in layer.attributes.items()}
    kh, kw = w.shape[2:]
    sh, sw = a.get("strides", [1, 1])
    dh, dw = a.get("dilations", [1, 1])
    pads = a.get("pads", [0, 0, 0, 0])
    group = int(a.get("group", 1))
    per_group = z_shape[1] // group
    cin = w.shape[1]

    def field_of(c: int, h: int, wq: int) -> tuple[tuple[slice, ...], np.ndarray] | None:
        h0, w0 = h * sh - pads[0], wq * sw - pads[1]
        if h0 < 0 or w0 < 0 or h0 + dh * (kh - 1) >= x_shape[2] or w0 + dw * (kw - 1) >= x_shape[3]:
            return None  # the field touches the padding: skipped (its border would not move)
        g = c // per_group
        return (slice(None), slice(g * cin, (g + 1) * cin), slice(h0, h0 + dh * (kh - 1) + 1, dh),
                slice(w0, w0 + dw * (kw - 1) + 1, dw)), w[c][None]

    return field_of, (kh - 1) * dh + 1, (kw - 1) * dw + 1, sh, sw


def _tight_value(x: np.ndarray, k: tuple[int, ...], g: float, z: float, want: float, below: bool,
                 lo: float, hi: float) -> tuple[float, float] | None:
    """Set element ``k`` of float32 ``x`` so that ``z`` (which moves by ``g`` per unit of it) ends just below
    (``below``) or at/above ``want``, as close as the float32 input can express; returns (new x_k, new z)."""
    if g == 0:
        return None
    x0 = float(x[k])
    cand = np.float32(x0 + (want - z) / g)
    best = None
    for step in range(-6, 7):
        v = cand
        for _ in range(abs(step)):
            v = np.nextafter(v, np.float32(np.inf if step > 0 else -np.inf), dtype=np.float32)
        if not lo <= float(v) <= hi:
            continue
        zv = z + g * (float(v) - x0)
        ok = zv < want if below else zv >= want
        if ok and (best is None or abs(zv - want) < abs(best[1] - want)):
            best = (float(v), zv)
    return best


def boundary_reference(model: Any, n: int = 8, seed: int = 0, low: float = -1.0, high: float = 1.0, *,
                       ranges: Mapping[str, tuple[float, float]] | None = None,
                       shapes: Mapping[str, Sequence[int]] | None = None) -> tuple[ReferenceData, BoundaryPlan]:
    """``n`` samples drawn like :meth:`ReferenceData.random` (same seed, same range), with elements of the first
    quantizer's input moved onto and next to its decision boundaries (module docstring). Returns the reference data
    (of the model as given: the original) and the plan; a model boundary mode does not handle gets the random
    samples unchanged, the plan saying why."""
    m = as_model(model)
    base = ReferenceData.random(m, n=n, seed=seed, low=low, high=high, ranges=ranges, shapes=shapes)
    layer, reason = find_first_layer(m)
    if layer is None:
        log.info("boundary mode falls back to random samples: %s", reason)
        base.boundary_plan = BoundaryPlan(None, reason=reason)  # type: ignore[attr-defined]
        return base, base.boundary_plan  # type: ignore[attr-defined]
    lo, hi = (ranges or {}).get(layer.input, (low, high))
    spec = base.specs[0]
    b0 = spec.batch0
    data = np.array(base.inputs[layer.input], np.float32, copy=True)
    rng = np.random.default_rng(seed + 7919)
    try:
        prefix = _Prefix(m, layer, data[:b0])
        plan = _place(m, layer, prefix, data, n, b0, float(lo), float(hi), rng)
    except _Unhandled as exc:
        log.info("boundary mode falls back to random samples: %s", exc)
        base.boundary_plan = BoundaryPlan(None, reason=str(exc))  # type: ignore[attr-defined]
        return base, base.boundary_plan  # type: ignore[attr-defined]
    ref = ReferenceData(m, {layer.input: data}, source=f"boundary(n={n}, seed={seed})")
    ref.boundary_plan = plan  # type: ignore[attr-defined]
    return ref, plan


class _Unhandled(Exception):
    pass


def _place(m: Model, layer: FirstLayer, prefix: _Prefix, data: np.ndarray, n: int, b0: int, lo: float, hi: float,
           rng: np.random.Generator) -> BoundaryPlan:
    x0 = data[:b0].astype(np.float64)
    z_shape = prefix.z_of(x0).shape
    bounds = _boundaries(layer.quantizer, z_shape, layer.relu)
    if bounds is None:
        raise _Unhandled(f"the parameters of quantizer '{node_label(layer.quantizer)}' are not per tensor or per "
                         "channel of axis 1")
    pairs = [(c, k) for c in range(bounds.shape[0]) for k in range(bounds.shape[1]) if np.isfinite(bounds[c, k])]
    if not pairs:
        raise _Unhandled("the first quantizer has no decision boundary in reach")
    plan = BoundaryPlan(layer, boundaries=len(pairs))
    zero = prefix.z_of(np.zeros_like(x0))
    near = [(sign * off, f"{'below' if sign < 0 else 'above'} 2^{int(np.log2(off))}")
            for off in NEAR_OFFSETS for sign in (-1.0, 1.0)]
    order = rng.permutation(len(pairs) * len(near))  # (boundary, offset) combinations, shuffled, in turn
    turn = 0
    for i in range(n):
        rows = slice(i * b0, (i + 1) * b0)
        x = data[rows]
        if layer.layer is None:
            placed = _place_elementwise(prefix, x, bounds, pairs, near, order, turn, i, lo, hi, zero)
        elif layer.layer.op_type == "Conv":
            placed = _place_conv(m, layer, prefix, x, bounds, pairs, near, order, turn, i, lo, hi, zero)
        else:
            placed = _place_dense(m, layer, prefix, x, bounds, pairs, near, order, turn, i, lo, hi, zero)
        turn += len(placed)
        data[rows] = x
        if layer.layer is not None:
            z = prefix.z_of(x.astype(np.float64))  # where the targets really are
            for t in placed:
                t.value = float(z[t.index])
        plan.targets.extend(placed)
    return plan


def _place_elementwise(prefix: _Prefix, x: np.ndarray, bounds: np.ndarray, pairs: list, near: list,
                       order: np.ndarray, turn: int, sample: int, lo: float, hi: float, zero: np.ndarray
                       ) -> list[Target]:
    """An input quantizer: ``z = γ·x + β`` elementwise with scalar γ, β (measured); targets are input elements.
    Half of the elements get near targets; a quarter get the float32 inputs nearest each boundary (on it when it is
    representable, and up to two neighbours each side), kept only where the original's float32 and float64
    executions agree on the level (an element where they part is a near-tie of the original: the final check can
    attribute only a few per sample)."""
    if bounds.shape[0] != 1:
        raise _Unhandled("the input quantizer has per-channel parameters")
    beta = float(np.ravel(zero)[0])
    gamma = float(np.ravel(prefix.z_of(np.ones_like(x, np.float64)))[0]) - beta
    if gamma == 0 or not np.all(zero == beta):
        raise _Unhandled("the input quantizer's input is not a scalar affine function of the input")
    flat = x.reshape(-1)
    saved = flat.copy()
    slots = np.random.default_rng(sample).permutation(flat.size)
    out: list[Target] = []
    tight_slots = slots[: flat.size // 4]
    for j, slot in enumerate(slots[: max(1, (3 * flat.size) // 4)]):
        tight = j < tight_slots.size
        pick = (turn + j) if tight else int(order[(turn + j) % len(order)]) // len(near)
        c, k = pairs[pick % len(pairs)]
        b = float(bounds[c, k])
        xb = (b - beta) / gamma
        if tight:
            v = np.float32(xb)
            steps = (sample + j // len(pairs)) % 5 - 2  # -2..2 float32 neighbours, in turn
            for _ in range(abs(steps)):
                v = np.nextafter(v, np.float32(np.inf if steps > 0 else -np.inf), dtype=np.float32)
            side = gamma * (float(v) - xb)
            kind = "on (float32)" if side == 0 else f"{'below' if side < 0 else 'above'} (float32 neighbour)"
        else:
            off, kind = near[int(order[(turn + j) % len(order)]) % len(near)]
            d_scale = abs(b) + abs(beta) + abs(b - beta)
            v = np.float32((b + off * d_scale - beta) / gamma)
        if not lo <= float(v) <= hi:
            continue
        flat[slot] = v
        out.append(Target(sample, tuple(int(i) for i in np.unravel_index(int(slot), x.shape)), b, float("nan"), kind))
    x[...] = flat.reshape(x.shape)
    # drop the targets where the original's float32 and float64 levels differ (restoring the random value there)
    parted = prefix.parted(x)
    if parted.size:
        where = prefix.input_elements(x.shape)[parted]
        flat = x.reshape(-1)
        flat[where] = saved[where]
        x[...] = flat.reshape(x.shape)
        gone = {tuple(int(i) for i in np.unravel_index(int(e), x.shape)) for e in where}
        out = [t for t in out if t.index not in gone]
    # targets are indexed by input element (``z`` is elementwise: the same element after data movement); their
    # values come from the scalar map
    for t in out:
        t.value = gamma * float(x[t.index]) + beta
    return out


def _place_conv(m: Model, layer: FirstLayer, prefix: _Prefix, x: np.ndarray, bounds: np.ndarray, pairs: list,
                near: list, order: np.ndarray, turn: int, sample: int, lo: float, hi: float, zero: np.ndarray
                ) -> list[Target]:
    vals = prefix.all(x.astype(np.float64))
    w = np.asarray(vals[layer.layer.inputs[1].name], np.float64)
    z = np.asarray(vals[layer.z], np.float64)
    fields = _conv_fields(layer.layer, w, x.shape, z.shape)
    if fields is None:
        raise _Unhandled(f"Conv '{node_label(layer.layer)}' is not 2-D")
    field_of, eh, ew, sh, sw = fields
    # output positions whose fields are disjoint: every ceil(extent/stride)-th position
    ph, pw = -(-eh // sh), -(-ew // sw)
    positions = [(h, wq) for h in range(0, z.shape[2], ph) for wq in range(0, z.shape[3], pw)]
    prng = np.random.default_rng(sample)
    positions = [positions[i] for i in prng.permutation(len(positions))]
    # one measurement of every slope: all directions at once (disjoint fields)
    chosen = []
    for j, (h, wq) in enumerate(positions):
        c, k = pairs[(turn + j) % len(pairs)] if j == 0 else pairs[int(order[(turn + j) % len(order)]) // len(near)]
        if bounds.shape[0] == 1:
            c = int(prng.integers(z.shape[1]))
        f = field_of(c, h, wq)
        if f is not None:
            chosen.append((j, c, k, (0, c, h, wq), f))
    probe = x.astype(np.float64)
    for _, _, _, _, (sl, patch) in chosen:
        probe[sl] += patch
    slope_z = prefix.z_of(probe) - z
    out: list[Target] = []
    tight = TIGHT_KINDS[sample % len(TIGHT_KINDS)]
    for j, c, k, idx, (sl, patch) in chosen:
        slope = float(slope_z[idx])
        row = bounds[c if bounds.shape[0] > 1 else 0]
        if slope == 0:
            continue
        if j == 0:
            kind = tight
        else:
            off, kind = near[int(order[(turn + j) % len(order)]) % len(near)]
        # the boundary asked for, else the nearest ones (a far boundary needs an input outside the range)
        finite = np.flatnonzero(np.isfinite(row))
        ks = [k] + [int(i) for i in finite[np.argsort(np.abs(row[finite] - float(z[idx])))][:4] if i != k]
        moved = None
        for k in ks:
            b = float(row[k])
            if not np.isfinite(b):
                continue
            d_scale = abs(b) + abs(float(zero[idx])) + abs(slope) * float(np.sum(np.abs(patch * x[sl]))) / float(
                np.sum(patch * patch))
            if j == 0:
                want = b - 2.0**-23 * d_scale if tight == "below32" else b + 2.0**-23 * d_scale \
                    if tight == "above32" else b
            else:
                want = b + off * d_scale
            moved = x[sl].astype(np.float64) + (want - float(z[idx])) / slope * patch
            if moved.min() >= lo and moved.max() <= hi:
                break
            moved = None
        if moved is None:
            continue
        before = x[sl].copy()
        x[sl] = moved.astype(np.float32)
        if j == 0:  # as close as the float32 input allows: one element of the field, ulp by ulp
            znow = float(prefix.z_of(x.astype(np.float64))[idx])
            kk = np.unravel_index(int(np.argmax(np.abs(patch))), patch.shape)
            xi = tuple(s.start + i * (s.step or 1) if isinstance(s, slice) and s.start is not None else i
                       for s, i in zip(sl, kk))
            g = slope * float(patch[kk]) / float(np.sum(patch * patch))
            below = tight in ("below64", "below32") if want == b else znow < want
            got = _tight_value(x, xi, g, znow, want, below, lo, hi)
            if got is None:
                x[sl] = before
                continue
            x[xi] = np.float32(got[0])
        out.append(Target(sample, idx, b, float("nan"), kind))
    return out


def _place_dense(m: Model, layer: FirstLayer, prefix: _Prefix, x: np.ndarray, bounds: np.ndarray, pairs: list,
                 near: list, order: np.ndarray, turn: int, sample: int, lo: float, hi: float, zero: np.ndarray
                 ) -> list[Target]:
    """A MatMul/Gemm first layer: every output reads every input; a few targets per sample, solved together."""
    z = prefix.z_of(x.astype(np.float64))
    if z.ndim != 2:
        raise _Unhandled(f"{layer.layer.op_type} '{node_label(layer.layer)}' output is not 2-D")
    vals = prefix.all(x.astype(np.float64))
    w = np.asarray(vals[layer.layer.inputs[1].name], np.float64)
    a = {k: v.value for k, v in layer.layer.attributes.items()}
    if layer.layer.op_type == "Gemm" and int(a.get("transB", 0)):
        w = w.T
    if w.ndim != 2 or w.shape[0] != x.size // x.shape[0] or x.shape[0] != 1:
        raise _Unhandled(f"{layer.layer.op_type} '{node_label(layer.layer)}' weight does not match the input")
    count = min(MAX_DENSE_TARGETS, z.shape[1])
    cols = np.random.default_rng(sample).permutation(z.shape[1])[:count]
    dirs = [w[:, c].reshape(x.shape) for c in cols]
    base = x.astype(np.float64)
    effect = np.stack([prefix.z_of(base + d)[0, cols] - z[0, cols] for d in dirs], axis=1)  # [target, direction]
    wants, info = [], []
    tight = TIGHT_KINDS[sample % len(TIGHT_KINDS)]
    for j, c in enumerate(cols):
        row = int(c) if bounds.shape[0] > 1 else 0
        finite = np.flatnonzero(np.isfinite(bounds[row]))
        if finite.size == 0:
            return []
        k = int(finite[np.argmin(np.abs(bounds[row, finite] - z[0, c]))])
        b = float(bounds[row, k])
        d_scale = abs(b) + abs(float(zero[0, c])) + float(np.sum(np.abs(w[:, c] * x.reshape(-1)))) * abs(
            float(effect[j, j])) / float(np.sum(w[:, c] ** 2))
        off, kind = near[int(order[(turn + j) % len(order)]) % len(near)]
        if j == 0:
            kind, off = tight, (-(2.0**-23) if tight == "below32" else 2.0**-23 if tight == "above32" else 0.0)
        wants.append(b + off * d_scale)
        info.append(((0, int(c)), b, kind))
    try:
        alpha = np.linalg.solve(effect, np.asarray(wants) - z[0, cols])
    except np.linalg.LinAlgError:
        return []
    moved = base + sum(al * d for al, d in zip(alpha, dirs))
    if moved.min() < lo or moved.max() > hi:
        return []
    x[...] = moved.astype(np.float32)
    return [Target(sample, idx, b, float("nan"), kind) for idx, b, kind in info]


# -- the first-layer check -----------------------------------------------------------------------------------------
@dataclass
class FirstLayerIssue:
    """An element where the streamlined first MultiThreshold disagrees with the original quantizer beyond a
    near-tie."""

    node: str
    tensor: str
    sample: int
    index: tuple[int, ...]
    message: str

    def describe(self) -> str:
        return f"node '{self.node}', tensor '{self.tensor}' {self.index}, sample {self.sample}: {self.message}"


@dataclass
class FirstLayerCheck:
    """The element-wise comparison of the first layer on every sample."""

    node: str = ""
    elements: int = 0
    original_ties: int = 0
    #: elements whose streamlined float32 run differs but float64 run agrees (float32 accumulation in a float layer)
    accumulation_ties: int = 0
    float_layer_ties: int = 0
    issues: list[FirstLayerIssue] = field(default_factory=list)
    skipped: str = ""
    #: the MultiThreshold reads the input through data movement only: its thresholds must be exact
    exact: bool = False

    @property
    def ok(self) -> bool:
        return not self.issues

    def describe(self) -> str:
        if self.skipped:
            return f"first layer not compared: {self.skipped}"
        text = (f"first layer '{self.node}'{' (exact thresholds on the input)' if self.exact else ''}: "
                f"{self.elements} elements compared with the original quantizer, "
                f"{self.original_ties} follow its float32 execution (near-ties of the original), "
                f"{self.accumulation_ties} agree when the streamlined model runs in float64 (float32 accumulation), "
                f"{self.float_layer_ties} within {FLOAT_LAYER_RTOL:.2g} of a float32 threshold")
        if self.issues:
            text += f"; {len(self.issues)} element(s) differ, first: {self.issues[0].describe()}"
        return text


def _first_multithreshold(model: Model, graph_input: str) -> ir.Node | None:
    from finnlite.core.traverse import descendants

    reached, _ = descendants(model, [graph_input])
    for node in topo_order(list(model.graph)):
        if id(node) in reached and node.op_type == "MultiThreshold":
            return node
    return None


def _moved_only(model: Model, v: Any, graph_input: str) -> bool:
    """True if ``v`` is ``graph_input`` or comes from it through data-movement ops only."""
    for _ in range(64):
        if v is None:
            return False
        if v.name == graph_input:
            return True
        node = v.producer()
        if node is None or node.op_type not in _MOVE + ("Transpose",):
            return False
        v = node.inputs[0]
    return False


def _prefix_executor(model: Model, node: ir.Node, name: str, example: np.ndarray, dtype: Any) -> Executor:
    nodes = [n for n in topo_order(list(model.graph)) if id(n) in ancestors([node]) or n is node]
    consts = {}
    for n in nodes:
        for v in n.inputs:
            if v is not None and v.name != name:
                arr = model.get_initializer(v.name)
                if arr is not None:
                    consts[v.name] = np.asarray(arr)
    return Executor(subgraph_model(nodes, {name: example}, consts, model.graph.opset_imports), dtype=dtype)


def check_first_layer(reference: ReferenceData, model: Any, layer: FirstLayer | None = None) -> FirstLayerCheck:
    """Compare the first MultiThreshold of ``model`` with the original's first quantizer on every element of every
    reference sample (module docstring)."""
    m = as_model(model)
    original = reference.original()
    if layer is None:
        layer, reason = find_first_layer(original)
        if layer is None:
            return FirstLayerCheck(skipped=reason)
    name = layer.input
    if name not in m.input_names:
        return FirstLayerCheck(skipped=f"the model has no input '{name}'")
    mt = _first_multithreshold(m, name)
    if mt is None or mt.inputs[0] is None:
        return FirstLayerCheck(skipped="the model has no MultiThreshold after its input")
    result = FirstLayerCheck(node_label(mt))
    # an input quantizer becomes a MultiThreshold on the input itself: no arithmetic, so its thresholds are exact
    # (the least float32 input of each level) and no element may differ from both executions of the original
    result.exact = layer.layer is None and _moved_only(m, mt.inputs[0], name)
    y = layer.quantizer.outputs[0].name
    q = original.find_producer(y)  # the plan's layer may come from another copy of the original
    if q is None:
        return FirstLayerCheck(skipped=f"the original has no tensor '{y}'")
    b0 = reference.specs[0].batch0
    example = reference.sample(0)[name]
    ex_o = {dt: _prefix_executor(original, q, name, example, dt) for dt in (np.float64, np.float32)}
    ex_s = {dt: _prefix_executor(m, mt, name, example, dt) for dt in (np.float64, np.float32)}
    got32, got64, want64, want32, runs64 = [], [], [], [], []
    for i in range(reference.num_samples):
        x = reference.sample(i)[name]
        want64.append(np.asarray(ex_o[np.float64].run({name: x})[y], np.float64))
        want32.append(np.asarray(ex_o[np.float32].run({name: x})[y], np.float64))
        got32.append(np.asarray(ex_s[np.float32].run({name: x})[mt.outputs[0].name], np.float64))
        run = ex_s[np.float64].run({name: x}, return_all=True)
        got64.append(np.asarray(run[mt.outputs[0].name], np.float64))
        runs64.append(run)
    shape_o, shape_s = want64[0].shape, got32[0].shape
    layout = str(mt.attributes["data_layout"].value) if "data_layout" in mt.attributes else ""
    axis_s = channel_axis_of(layout, len(shape_s))
    perm = _match_layout(shape_o, shape_s, axis_s)
    if perm is None:
        return FirstLayerCheck(result.node, skipped=f"shapes {shape_o} and {shape_s} do not correspond")
    step = _step_of(q, shape_o)
    if step is None:
        return FirstLayerCheck(result.node, skipped=f"the step of quantizer '{node_label(q)}' is not known")
    scale = float(mt.attributes["out_scale"].value) if "out_scale" in mt.attributes else 1.0
    scale = scale if scale else 1.0
    # level counts, all in the streamlined layout: [samples, *shape_s]
    o64 = np.stack([np.transpose(np.floor(a / step + 0.5), perm) for a in want64])
    o32 = np.stack([np.transpose(np.floor(a / step + 0.5), perm) for a in want32])
    s32 = np.floor(np.stack(got32) / scale + 0.5)
    s64 = np.floor(np.stack(got64) / scale + 0.5)
    thr = m.get_initializer(mt.inputs[1].name) if mt.inputs[1] is not None else None
    per_tensor = thr is not None and np.ndim(thr) == 2 and np.shape(thr)[0] == 1
    channels = 1 if per_tensor else shape_s[axis_s]
    ids = np.zeros(shape_s, np.int64) if per_tensor else np.broadcast_to(
        np.arange(channels).reshape([channels if i == axis_s else 1 for i in range(len(shape_s))]), shape_s)
    ids = np.broadcast_to(ids, s32.shape)
    result.elements = int(s32.size)
    sign, offset = _numbering(s32, o64, ids, channels)
    mapped = sign[ids] * o64 + offset[ids]
    mapped32 = sign[ids] * o32 + offset[ids]
    bad = s32 != mapped
    result.original_ties = int(np.sum(bad & (s32 == mapped32)))
    bad &= s32 != mapped32
    result.accumulation_ties = int(np.sum(bad & (s64 == mapped)))
    bad &= s64 != mapped
    _judge_elements(result, m, mt, node_label(q), bad, s32, mapped, mapped32, runs64)
    return result


def _judge_elements(result: FirstLayerCheck, m: Model, mt: ir.Node, quantizer: str, bad: np.ndarray,
                    s32: np.ndarray, mapped: np.ndarray, mapped32: np.ndarray, runs64: list[dict[str, np.ndarray]]
                    ) -> None:
    """The elements that differ from both executions of the original (``bad``, [samples, *shape]): a float-layer
    near-tie when the input is within :data:`FLOAT_LAYER_RTOL` of a threshold on the float64 run (not for exact
    thresholds), else an issue (at most 8)."""
    for f in np.flatnonzero(bad.reshape(-1))[:4096]:
        full = tuple(int(i) for i in np.unravel_index(int(f), bad.shape))
        smp, index = full[0], full[1:]
        vals = runs64[smp]
        lookup = lambda t, vals=vals: vals.get(t, m.get_initializer(t))  # noqa: E731
        margin = margin_at(mt, lookup, index)
        if not result.exact and margin is not None and not margin.exact and margin.relative <= FLOAT_LAYER_RTOL:
            result.float_layer_ties += 1
            continue
        where = "" if margin is None else (f"; its input {margin.value:.9g} is {margin.relative:.3g} (relative) from "
                                           f"the nearest threshold {margin.boundary:.9g} on the float64 run")
        result.issues.append(FirstLayerIssue(
            result.node, mt.outputs[0].name, smp, index,
            f"level {int(s32[full])} where the original quantizer '{quantizer}' gives "
            f"{int(mapped[full])} in float64 and {int(mapped32[full])} in float32{where}"))
        if len(result.issues) >= 8:
            break


def _match_layout(shape_o: tuple[int, ...], shape_s: tuple[int, ...], axis_s: int) -> tuple[int, ...] | None:
    """The permutation taking the original's tensor to the streamlined one's layout (identity or NCHW -> NHWC)."""
    if shape_o == shape_s:
        return tuple(range(len(shape_o)))
    if len(shape_o) == 4 and (shape_o[0], shape_o[2], shape_o[3], shape_o[1]) == shape_s:
        return (0, 2, 3, 1)
    if int(np.prod(shape_o)) == int(np.prod(shape_s)) and len(shape_s) == 2 and shape_o[0] == shape_s[0]:
        return None
    return None


def _step_of(q: ir.Node, shape: tuple[int, ...]) -> np.ndarray | None:
    s = const_array(q.inputs[1]) if len(q.inputs) > 1 else None
    if s is None:
        return None
    step = np.abs(np.asarray(s, np.float64)) * (2.0 if is_bipolar(q) else 1.0)
    try:
        return np.broadcast_to(step, shape)
    except ValueError:
        return None


def _numbering(s: np.ndarray, o: np.ndarray, ids: np.ndarray, channels: int) -> tuple[np.ndarray, np.ndarray]:
    """Per channel (``ids``: the channel of each element), the map ``s = sign·o + offset`` most elements follow
    (level numberings differ by a constant, or are reversed where a negative scale was moved into the weights)."""
    sign, offset = np.ones(channels), np.zeros(channels)
    flat_ids, sf, of = ids.reshape(-1), s.reshape(-1), o.reshape(-1)
    order = np.argsort(flat_ids, kind="stable")
    bounds = np.searchsorted(flat_ids[order], np.arange(channels + 1))
    for c in range(channels):
        sel = order[bounds[c]:bounds[c + 1]]
        sc, oc = sf[sel], of[sel]
        best = (-1, 1.0, 0.0)
        for sg in (1.0, -1.0):
            vals, counts = np.unique(sc - sg * oc, return_counts=True)
            if counts.size and int(counts.max()) > best[0]:
                k = int(np.argmax(counts))
                best = (int(counts[k]), sg, float(vals[k]))
        sign[c], offset[c] = best[1], best[2]
    return sign, offset


# -- the whole check -----------------------------------------------------------------------------------------------
@dataclass
class BoundaryCheck:
    """Boundary mode's result: the plan (what was placed), the first-layer comparison and the final check on the
    same samples."""

    plan: BoundaryPlan
    first_layer: FirstLayerCheck
    final: FinalCheck

    @property
    def ok(self) -> bool:
        return self.first_layer.ok and self.final.ok

    def __getattr__(self, name: str) -> Any:  # the rest is the final check's (samples, outputs, ...)
        if name in ("plan", "first_layer", "final"):
            raise AttributeError(name)
        return getattr(self.final, name)

    def summary(self) -> str:
        return "\n".join([self.plan.describe(), self.first_layer.describe(), self.final.summary()])

    def raise_for_errors(self) -> None:
        """Raise :class:`VerificationError` for the first problem: a first-layer element (naming the node), else
        the final check's."""
        for issue in self.first_layer.issues:
            raise VerificationError(f"boundary check: the first layer differs from the original quantizer: "
                                    f"{issue.describe()}", node=issue.node, tensor=issue.tensor)
        self.final.raise_for_errors()


def boundary_check(reference: ReferenceData, model: Any, plan: BoundaryPlan, **final_kwargs: Any) -> BoundaryCheck:
    """The first-layer comparison and :func:`verify.final.final_check` (``final_kwargs``) of ``model`` on boundary
    samples ``reference`` made by :func:`boundary_reference`."""
    m = as_model(model)
    if plan.layer is not None:
        first = check_first_layer(reference, m, plan.layer)
    else:
        first = FirstLayerCheck(skipped=plan.reason)
    return BoundaryCheck(plan, first, final_check(reference, m, **final_kwargs))
