"""Proofs over finite domains: a streamlined MultiThreshold against the original quantizer it replaces.

A fault that changes one threshold by one, or one weight element, shows on a handful of random inputs only when
one of them lands on that very integer; random testing misses it. Where the final check can match a MultiThreshold
``y = MT(a)`` of the streamlined model to a quantizer ``y = Q(z)`` of the original (the same output tensor name:
conversion keeps a quantizer's output name) and ``a`` is an integer tensor of known range ``[lo, hi]`` (its
datatype annotation, or the range derived from the graph: :func:`verify.annotations.derived_ranges`), it checks:

1. **The accumulator is the original's, per channel.** In a correct model ``z = A_c·a + B_c`` exactly (the
   original's weights, scales and BatchNorm are an affine map per channel of the integer accumulator). ``A_c``,
   ``B_c`` are fitted by least squares on the reference samples (``a`` from the streamlined model, ``z`` from the
   original run in float64) and every residual must be below :data:`RESIDUAL` of an accumulator step. A changed
   weight element changes ``a`` by ``δ·x_k`` where the input ``x_k`` is not 0: a residual of about a step (seen
   whenever a channel's accumulator takes three or more values on the samples).
2. **The thresholds are the original's, on every integer input.** With ``A_c``, ``B_c``, the original quantizer
   is run (its own kernel, in float64) on every integer ``a`` in ``[lo, hi]`` of every channel, and the
   streamlined thresholds ``#{k : a ≥ T[c, k]}`` on the same: two monotone step functions of ``a`` are equal up
   to the naming of their levels exactly when they change level at the same inputs, i.e. when the pairs
   (streamlined level, original level) are one-to-one. Inputs where ``A_c·a + B_c`` lies within :data:`TIE_RTOL`
   of a rounding boundary (the fitted map is exact only to ~1e-12) are left out: a tie is not a proof either way.
   A threshold off by one gives a pair that breaks the correspondence, whatever the samples.

Only MultiThresholds whose output name the original quantizer shares are matched (tfc and cnv keep them; where a
pass renames them, e.g. the mobilenet export, nothing is proved and the random comparison stands alone), and the
domain is capped at :data:`MAX_POINTS` channel-level pairs per node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from finnlite.model import Model
from finnlite.shapes import const_array
from verify.annotations import derived_ranges
from verify.compare import is_integer_tensor
from verify.region import node_label

__all__ = ["ProofIssue", "prove_thresholds", "proof_inputs", "RESIDUAL", "TIE_RTOL", "MAX_POINTS"]

RESIDUAL = 1e-3
TIE_RTOL = 1e-9
MAX_POINTS = 1 << 23
_QUANTIZERS = ("Quant", "BipolarQuant")


@dataclass
class ProofIssue:
    """A MultiThreshold (or the accumulator feeding it) that is not the original quantizer's, with the evidence."""

    node: str
    tensor: str
    quantizer: str
    message: str

    def describe(self) -> str:
        return f"node '{self.node}', tensor '{self.tensor}' (original quantizer '{self.quantizer}'): {self.message}"


@dataclass
class _Match:
    mt: Any
    q: Any
    a: str  # the streamlined MultiThreshold's input
    z: str  # the original quantizer's input
    nhwc: bool


def _matches(model: Model, original: Model) -> list[_Match]:
    found = []
    for node in model.graph:
        if node.op_type != "MultiThreshold" or not node.inputs or node.inputs[0] is None:
            continue
        a = node.inputs[0].name
        if not is_integer_tensor(model, a) or model.is_initializer(a):
            continue
        q = original.find_producer(node.outputs[0].name)
        if q is None or q.op_type not in _QUANTIZERS or q.inputs[0] is None:
            continue
        layout = model.get_tensor_layout(a)
        found.append(_Match(node, q, a, q.inputs[0].name, bool(layout) and len(layout) == 4 and layout[-1] == "C"))
    return found


def proof_inputs(model: Model, reference: Any) -> set[str]:
    """The streamlined tensors :func:`prove_thresholds` needs on every sample (the matched MultiThresholds' inputs)."""
    return {mt.a for mt in _matches(model, reference.original())}


def _channels_first(arr: np.ndarray, nhwc: bool) -> np.ndarray:
    """``[samples, C, rest]`` from ``[samples, N, ...]`` (channel axis 1 of each sample, or last if NHWC)."""
    chan = arr.ndim - 1 if nhwc else 2
    moved = np.moveaxis(arr, chan, 1)
    return moved.reshape(moved.shape[0], moved.shape[1], -1)


def _fit(a: np.ndarray, z: np.ndarray) -> tuple[float, float, float] | None:
    """``(A, B, worst residual in steps of A)`` of ``z ≈ A·a + B``; None unless ``a`` takes two values."""
    if np.ptp(a) == 0:
        return None
    am, zm = a.mean(), z.mean()
    big = float(np.sum((a - am) ** 2))
    slope = float(np.sum((a - am) * (z - zm)) / big)
    if slope == 0:
        return None
    b = float(zm - slope * am)
    return slope, b, float(np.max(np.abs(z - (slope * a + b))) / abs(slope))


def _quantize(q: Any, original: Model, x: np.ndarray) -> np.ndarray | None:
    """The original quantizer ``q`` on ``x`` (``[levels, C, 1, ...]``), in float64; None if its parameters do not
    broadcast so (then nothing is proved)."""
    from custom_ops.registry import make_op

    params = [const_array(v) if v is not None else None for v in q.inputs[1:]]
    if any(p is None for p in params):
        return None
    try:
        return np.asarray(make_op(q).execute([x] + [np.asarray(p, np.float64) for p in params])[0], np.float64)
    except Exception:  # noqa: BLE001 - a parameter layout this proof does not handle: nothing proved
        return None


def _one_to_one(u: np.ndarray, v: np.ndarray) -> tuple[int, int] | None:
    """Indices ``(i, j)`` with ``u[i] == u[j]`` and ``v[i] != v[j]`` or the other way round; None if the pairs are
    one-to-one."""
    pairs = np.unique(np.stack([u, v], 1), axis=0).shape[0]
    if pairs == np.unique(u).size == np.unique(v).size:
        return None
    for first, second in ((u, v), (v, u)):
        seen: dict[float, int] = {}
        for i, key in enumerate(first.tolist()):
            j = seen.setdefault(key, i)
            if second[j] != second[i]:
                return j, i
    return None


def prove_thresholds(model: Model, reference: Any, samples: Sequence[np.ndarray | dict],
                     sample_ids: Sequence[int]) -> list[ProofIssue]:
    """Check every matched MultiThreshold of ``model`` (module docstring). ``samples``: the streamlined model's
    tensors on the reference samples ``sample_ids`` (dicts holding at least the MultiThreshold inputs)."""
    original = reference.original()
    matches = _matches(model, original)
    if not matches:
        return []
    ranges = derived_ranges(model)
    issues: list[ProofIssue] = []
    values64 = [reference.take_values(i, np.float64) for i in sample_ids]
    for mt in matches:
        if any(mt.a not in s for s in samples) or any(mt.z not in v for v in values64):
            continue
        a = np.stack([np.asarray(s[mt.a], np.float64) for s in samples])
        z = np.stack([np.asarray(v[mt.z], np.float64) for v in values64])
        if mt.nhwc and z.ndim == 5:
            z = np.moveaxis(z, 2, 4)
        if a.shape != z.shape or a.ndim < 3:
            continue
        a3, z3 = _channels_first(a, mt.nhwc), _channels_first(z, mt.nhwc)
        thr = const_array(mt.mt.inputs[1])
        if thr is None or thr.ndim != 2 or thr.shape[0] not in (1, a3.shape[1]):
            continue
        label, qlabel = node_label(mt.mt), node_label(mt.q)
        lohi = ranges.get(mt.a)
        if lohi is None:
            dt = model.get_tensor_datatype(mt.a)
            lohi = (float(dt.min()), float(dt.max()), True, True)
        domain = np.arange(int(np.ceil(lohi[0])), int(np.floor(lohi[1])) + 1, dtype=np.float64)
        channels = a3.shape[1]
        fits: list[tuple[float, float] | None] = []
        for c in range(channels):
            fit = _fit(a3[:, c].reshape(-1), z3[:, c].reshape(-1))
            if fit is not None and fit[2] > RESIDUAL:
                producer = model.find_producer(mt.a)
                issues.append(ProofIssue(node_label(producer) if producer is not None else label, mt.a, qlabel,
                                         f"channel {c} of the accumulator is not an affine function of the "
                                         f"original's '{mt.z}' (residual {fit[2]:.3g} accumulator steps on the "
                                         "reference data): its weights differ from the original's"))
                break
            fits.append(fit[:2] if fit is not None else None)
        else:
            if domain.size * channels > MAX_POINTS or not domain.size:
                continue
            issue = _prove(mt, original, thr, fits, domain, a.ndim - 2, label, qlabel)
            if issue is not None:
                issues.append(issue)
    return issues


def _prove(mt: _Match, original: Model, thr: np.ndarray, fits: list[tuple[float, float] | None],
           domain: np.ndarray, rest: int, label: str, qlabel: str) -> ProofIssue | None:
    """Step 2 of the module docstring for one matched pair, every channel with a fitted map."""
    channels = len(fits)
    slope = np.array([f[0] if f else 1.0 for f in fits])
    bias = np.array([f[1] if f else 0.0 for f in fits])
    x = domain[:, None] * slope[None, :] + bias[None, :]  # [levels, C]
    shape = (domain.size, channels) + (1,) * (rest - 1)
    eps = TIE_RTOL * np.maximum(np.abs(x), 1.0)
    outs = [_quantize(mt.q, original, (x + d * eps).reshape(shape)) for d in (0.0, -1.0, 1.0)]
    if any(o is None for o in outs):
        return None
    q0, qlo, qhi = (o.reshape(domain.size, channels) for o in outs)  # type: ignore[union-attr]
    tie = (qlo != q0) | (qhi != q0)
    t = np.broadcast_to(thr, (channels, thr.shape[1]))
    counts = (domain[:, None, None] >= t[None, :, :]).sum(axis=2)  # [levels, C]
    for c in range(channels):
        if fits[c] is None:
            continue
        keep = ~tie[:, c]
        bad = _one_to_one(counts[keep, c], q0[keep, c])
        if bad is not None:
            lv = domain[keep][list(bad)]
            return ProofIssue(label, mt.mt.inputs[1].name, qlabel,
                              f"channel {c}: on integer inputs {lv[0]:g} and {lv[1]:g} the thresholds give levels "
                              f"{counts[keep, c][bad[0]]} and {counts[keep, c][bad[1]]}, the original quantizer "
                              f"{q0[keep, c][bad[0]]:.6g} and {q0[keep, c][bad[1]]:.6g}: the thresholds differ "
                              "from the original's")
    return None
