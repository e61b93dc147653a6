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
   whenever a channel's accumulator takes three or more values on the samples). Where the samples do not determine
   the map (a channel's accumulator takes one value on them, as on a narrow input range), ``A_c``, ``B_c`` are those
   the MultiThreshold's real thresholds record (:mod:`verify.derived_map`), if they reproduce every sample.
2. **The thresholds are the original's, on every integer input.** With ``A_c``, ``B_c``, the original quantizer
   (its own kernel, in float64) and the streamlined thresholds ``#{k : a ≥ T[c, k]}`` are two monotone step
   functions of the integer ``a``; they are equal on ``[lo, hi]`` up to the naming of their levels exactly when
   they change by the same number of levels at every integer, which :func:`_prove` checks at the streamlined
   jumps ``ceil(T[c, k])`` and over the whole range (for integer inputs, threshold vectors are equivalent iff their
   ``ceil``, clipped to the range, agree). Points where ``A_c·a + B_c`` lies within :data:`TIE_RTOL` of a rounding
   boundary (the fitted map is exact only to ~1e-12) are left out: a tie is not a proof either way. A threshold
   off by one changes the jump at one integer, whatever the samples.

A MultiThreshold is matched to the original quantizer that produces its output tensor, else to the quantizer its
name comes from (conversion names it ``<quantizer>_MultiThreshold``); a Relu right before the quantizer is part
of the original's function (``z`` is then the Relu's input). A Relu behind data movement or max pooling (a
layerwise-quantized network's ``Relu → MaxPool → quantizer``, which streamlining reorders) makes
``z = max(A_c·a + B_c, 0)``: the map is fitted where ``z > 0`` and checked everywhere through the Relu. Unmatched MultiThresholds are not proved (the random
comparison stands alone). The comparison costs ``O(C·N)`` quantizer evaluations, not one per integer (see
:func:`_prove`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from custom_ops.multithreshold import multithreshold_rows
from finnlite.core.graphutil import channel_order
from finnlite.core.model import Model
from finnlite.core.shapes import const_array
from finnlite.core.traverse import node_label
from verify.annotations import derived_ranges
from verify.compare import is_integer_tensor
from verify.derived_map import DerivedMap, derived_maps
from verify.tail import float64_from_levels
from verify.ties import is_bipolar

log = logging.getLogger(__name__)

__all__ = ["ProofIssue", "prove_thresholds", "prove_levels", "proof_inputs", "proof_samples", "RESIDUAL", "TIE_RTOL"]

RESIDUAL = 1e-3
#: the same against the original's float32 execution (which adds its own rounding, up to about 1e-3 of a step)
RESIDUAL32 = 0.05
TIE_RTOL = 1e-9
#: with ``extrapolate``, a fitted map is trusted to this relative precision at most (16 float32 steps): its samples
#: are float32 numbers whose rounding grows with their magnitude, so the largest ones, which fix the slope, carry the
#: largest errors, and the residuals understate how far the line can be off away from the samples
EXTRAPOLATION_RTOL = 2.0**-20
#: the original quantizers whose levels a proof recomputes
PROOF_QUANTIZERS = ("Quant", "BipolarQuant")


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
    z: str  # the original quantizer's input (before a Relu in front of it)
    nhwc: bool
    relu: bool = False
    #: ``z`` is the quantizer's input, a Relu'd tensor moved by data movement/max pooling (module docstring)
    relu_inside: bool = False
    #: the original's channel of each channel of the streamlined MultiThreshold (reordered: an NHWC flatten's
    #: features, a channel shuffle moved past it), or None
    cols: np.ndarray | None = None

    def ordered(self, zs: list[np.ndarray]) -> list[np.ndarray]:
        """The original's tensors ``zs`` (NCHW or NC) with their channels in the streamlined MultiThreshold's
        order."""
        return zs if self.cols is None else [np.take(np.asarray(z), self.cols, axis=1) for z in zs]


#: ops that may produce a matched quantizer's input: the accumulator is then an affine map of it per channel (a
#: layer, its bias, BatchNorm, scales, layout and pooling ops; a Relu right before the quantizer is handled apart).
#: After any other op (Tanh, Sigmoid, PRelu, HardSigmoid, Clip, ...) no affine map exists and nothing is proven.
_AFFINE_BEFORE = frozenset({"Conv", "MatMul", "Gemm", "Add", "Sub", "Mul", "Div", "BatchNormalization",
                            "Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "MaxPool", "AveragePool",
                            "GlobalAveragePool", "ReduceMean", "Quant", "Trunc", "Concat", "Identity",
                            "QuantAvgPool2d"})


#: ops that move (or max-pool) a Relu'd tensor on its way to a quantizer without changing that it is one
_MOVEMENT = frozenset({"MaxPool", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Concat"})


def _relu_behind_movement(producers: dict[str, Any], z: str, depth: int = 16) -> bool:
    """Whether every path back from ``z`` through data-movement/max-pooling ops ends at a Relu (and at least one
    such op is passed)."""
    node = producers.get(z)
    if node is None or node.op_type not in _MOVEMENT or depth <= 0:
        return False
    computed = [v for v in node.inputs if v is not None and const_array(v) is None]
    if not computed or (node.op_type != "Concat" and len(computed) != 1):
        return False
    for v in computed:
        before = producers.get(v.name)
        if before is None:
            return False
        if before.op_type != "Relu" and not _relu_behind_movement(producers, v.name, depth - 1):
            return False
    return True


def _source_scale(original: Model, v: Any, depth: int = 8) -> bytes | None:
    """The scale of the quantizer a computed tensor comes from (through single-input ops), as bytes; None if none."""
    for _ in range(depth):
        node = v.producer() if v is not None else None
        if node is None:
            return None
        if node.op_type in PROOF_QUANTIZERS:
            scale = const_array(node.inputs[1]) if len(node.inputs) > 1 else None
            return None if scale is None else np.asarray(scale, np.float64).tobytes()
        computed = [u for u in node.inputs if u is not None and const_array(u) is None]
        if len(computed) != 1:
            return None
        v = computed[0]
    return None


def _per_position_bias(model: Model, a: str) -> bool:
    """Whether ``a`` is made by an Add of a constant that varies along a spatial axis (a zero-padded first layer's
    integer border bias, :mod:`streamline.border`)."""
    node = model.find_producer(a)
    if node is None or node.op_type != "Add":
        return False
    consts = [const_array(v) for v in node.inputs if v is not None and const_array(v) is not None]
    return len(consts) == 1 and sum(d > 1 for d in np.shape(consts[0])) > 1


def _after_join(original: Model, z: str, depth: int = 8) -> bool:
    """Whether the original computes ``z`` from a join of differently quantized branches: walking back through
    the layer (constant scales and biases, BatchNorm, the Conv/MatMul's data input) meets an Add of two computed
    tensors or a Concat, whose inputs do not all come from quantizers of one scale, before it meets the layer's
    input quantizer."""
    for _ in range(depth):
        node = original.find_producer(z)
        if node is None or node.op_type in PROOF_QUANTIZERS:
            return False
        computed = [v for v in node.inputs if v is not None and const_array(v) is None]
        if node.op_type == "Concat" or (node.op_type == "Add" and len(computed) == 2):
            scales = {_source_scale(original, v) for v in computed}
            return len(scales) != 1 or None in scales
        if not computed:
            return False
        z = computed[0].name
    return False


def _matches(model: Model, original: Model) -> list[_Match]:
    found = []
    producers = {o.name: n for n in original.graph for o in n.outputs}  # (a name lookup that misses is O(nodes))
    named = {n.name: n for n in original.graph}
    for node in model.graph:
        if node.op_type != "MultiThreshold" or not node.inputs or node.inputs[0] is None:
            continue
        a = node.inputs[0].name
        if not is_integer_tensor(model, a) or model.is_initializer(a):
            continue
        q = producers.get(node.outputs[0].name)
        if (q is None or q.op_type not in PROOF_QUANTIZERS) and node.name.endswith("_MultiThreshold"):
            q = named.get(node.name[:-len("_MultiThreshold")])
        if q is None or q.op_type not in PROOF_QUANTIZERS or q.inputs[0] is None:
            continue
        z, relu = q.inputs[0].name, False
        before = producers.get(z)
        inside = _relu_behind_movement(producers, z)
        if before is not None and before.op_type == "Relu" and before.inputs and before.inputs[0] is not None:
            z, relu = before.inputs[0].name, True
        before = producers.get(z)
        if before is not None and before.op_type not in _AFFINE_BEFORE:
            continue  # a non-linear activation (Tanh, Sigmoid, PRelu, ...) between the layer and the quantizer
        layout = model.get_tensor_layout(a)
        cols = channel_order(node)
        if cols is not None and np.size(const_array(q.inputs[1]) if len(q.inputs) > 1 else None) != 1:
            continue  # per-feature quantizer parameters in another order: the output comparison judges it
        found.append(_Match(node, q, a, z, bool(layout) and len(layout) == 4 and layout[-1] == "C", relu or inside,
                            inside, cols))
    return found


#: inputs of this many values or more per sample (an ImageNet image: 150k) are proved on :data:`FEW_SAMPLES`
#: samples when every matched layer has :data:`MIN_POSITIONS` positions per channel or more (a convolution's 7×7
#: map has 49): the original's float64 tensors cost a full run per sample. A dense layer has one position per
#: channel, and a fit needs three values: it is proved on every sample.
LARGE_INPUT = 16384
FEW_SAMPLES = 1
MIN_POSITIONS = 16


def proof_samples(reference: Any, model: Model | None = None) -> int:
    """On how many samples of ``reference`` to fit the accumulators' maps of ``model``'s matched MultiThresholds
    (see :data:`LARGE_INPUT`; without ``model``, as if every layer had enough positions)."""
    size = sum(int(a.size) for a in reference.sample(0).values())
    if size < LARGE_INPUT or (model is not None and any(
            _positions(model, mt) < MIN_POSITIONS for mt in _matches(model, reference.original()))):
        return reference.num_samples
    return min(FEW_SAMPLES, reference.num_samples)


def _positions(model: Model, mt: _Match) -> int:
    """Values per channel in one sample of the matched MultiThreshold's input (0 if its shape is not known)."""
    shape = model.get_tensor_shape(mt.a)
    if not shape or len(shape) < 2 or any(not isinstance(d, int) or d <= 0 for d in shape):
        return 0
    return int(np.prod(shape[1:])) // (shape[-1] if mt.nhwc else shape[1])


def proof_inputs(model: Model, reference: Any) -> set[str]:
    """The streamlined tensors :func:`prove_thresholds` needs on every sample: the matched MultiThresholds' inputs,
    and the outputs of the MultiThresholds of float tensors (:func:`_float_layer_outputs`)."""
    return {mt.a for mt in _matches(model, reference.original())} | set(_float_layer_outputs(model))


def _float_layer_outputs(model: Model) -> list[str]:
    """The outputs of MultiThresholds whose input is a float tensor (a first layer on a float input): they
    accumulate in float32 and compare with float32 thresholds, so at a near-tie their level can differ from what
    real arithmetic gives, and then so do the accumulators of the layers after them."""
    return [n.outputs[0].name for n in model.graph if n.op_type == "MultiThreshold" and n.inputs
            and n.inputs[0] is not None and not model.is_initializer(n.inputs[0].name)
            and not is_integer_tensor(model, n.inputs[0].name)]


def _clean_samples(model: Model, reference: Any, samples: Sequence[dict], sample_ids: Sequence[int]) -> np.ndarray:
    """Per sample: True unless a MultiThreshold of a float tensor gives another level in float32 (as the model runs)
    than in float64 execution of what the model means (:class:`verify.real64.Real64`): a near-tie of the model's
    own float layer, after which no later accumulator is the original's affine map on that sample (its input
    differs), whatever the weights."""
    names = _float_layer_outputs(model)
    clean = np.ones(len(sample_ids), bool)
    if not names:
        return clean
    from verify.real64 import Real64

    real = Real64(model)
    for j, i in enumerate(sample_ids):
        have = [n for n in names if isinstance(samples[j], dict) and n in samples[j]]
        if not have:
            continue
        try:
            exact = real.values(reference.sample(i), have)
        except Exception as exc:  # noqa: BLE001 - without the float64 run the sample stays in
            log.debug("no float64 run of the float layers: %s", exc)
            continue
        clean[j] = all(n not in exact or np.array_equal(np.asarray(samples[j][n], np.float64), exact[n])
                       for n in have)
    return clean


def _original_z3(z: list[np.ndarray], nhwc: bool) -> np.ndarray:
    """``[samples, C, rest]`` in float64 from the original's per-sample tensors ``z`` (NCHW), in the order of a
    streamlined tensor that is NHWC when ``nhwc``."""
    stacked = np.stack(z).astype(np.float64, copy=False)
    return _channels_first(np.moveaxis(stacked, 2, 4) if nhwc and stacked.ndim == 5 else stacked, nhwc)


def _channels_first(arr: np.ndarray, nhwc: bool) -> np.ndarray:
    """``[samples, C, rest]`` from ``[samples, N, ...]`` (channel axis 1 of each sample, or last if NHWC)."""
    chan = arr.ndim - 1 if nhwc else 2
    moved = np.moveaxis(arr, chan, 1)
    return moved.reshape(moved.shape[0], moved.shape[1], -1)


def quantize_original(q: Any, original: Model, x: np.ndarray) -> np.ndarray | None:
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


@dataclass
class AffineFit:
    """Per channel: the least-squares ``z ≈ slope·a + bias``, the worst residual in steps of ``slope``, whether it
    is fitted (``a`` takes two values or more), and the mean and variance of ``a`` on the data."""

    slope: np.ndarray
    bias: np.ndarray
    resid: np.ndarray
    ok: np.ndarray
    mean: np.ndarray
    var: np.ndarray


def fit_affine(a3: np.ndarray, z3: np.ndarray, relu: bool = False) -> AffineFit:
    """The per-channel fits of ``[samples, C, rest]`` arrays (see :class:`AffineFit`). With ``relu``, ``z`` is
    ``max(slope·a + bias, 0)``: the map is fitted on the points where ``z > 0`` and the residual is that of the
    Relu of the map, on every point."""
    if relu:
        return _fit_relu(a3, z3)
    mean_a, mean_z = a3.mean(axis=(0, 2)), z3.mean(axis=(0, 2))
    ac, zc = a3 - mean_a[:, None], z3 - mean_z[:, None]
    big = np.einsum("scr,scr->c", ac, ac)
    with np.errstate(invalid="ignore", divide="ignore"):
        slope = np.einsum("scr,scr->c", ac, zc) / big
        ac *= slope[:, None]
        zc -= ac  # the residual z − (A·a + B), in place
        resid = np.abs(zc, out=zc).max(axis=(0, 2)) / np.abs(slope)
    ok = (big > 0) & (slope != 0)
    return AffineFit(slope, mean_z - slope * mean_a, resid, ok, mean_a, big / (a3.shape[0] * a3.shape[2]))


def _fit_relu(a3: np.ndarray, z3: np.ndarray) -> AffineFit:
    """:func:`fit_affine` of ``z = max(slope·a + bias, 0)``."""
    w = (z3 > 0).astype(np.float64)
    n = w.sum(axis=(0, 2))
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_a, mean_z = (w * a3).sum(axis=(0, 2)) / n, (w * z3).sum(axis=(0, 2)) / n
        ac, zc = a3 - mean_a[:, None], z3 - mean_z[:, None]
        big = np.einsum("scr,scr->c", w * ac, ac)
        slope = np.einsum("scr,scr->c", w * ac, zc) / big
        bias = mean_z - slope * mean_a
        model = np.maximum(slope[:, None] * a3 + bias[:, None], 0.0)
        resid = np.abs(model - z3).max(axis=(0, 2)) / np.abs(slope)
    ok = (n > 0) & (big > 0) & (slope != 0)
    return AffineFit(np.nan_to_num(slope), np.nan_to_num(bias), resid, ok, np.nan_to_num(mean_a),
                     np.nan_to_num(big / np.maximum(n, 1)))


def prove_thresholds(model: Model, reference: Any, samples: Sequence[np.ndarray | dict],
                     sample_ids: Sequence[int], *, ranges: dict[str, tuple[float, float, bool, bool]] | None = None,
                     outputs64: dict[int, dict[str, np.ndarray]] | None = None,
                     proved_layers: set[str] | None = None) -> list[ProofIssue]:
    """Check every matched MultiThreshold of ``model`` (module docstring). ``samples``: the streamlined model's
    tensors on the reference samples ``sample_ids`` (dicts holding at least the MultiThreshold inputs).
    ``ranges``: the model's :func:`~verify.annotations.derived_ranges` if the caller has them; ``outputs64``
    receives the original's float64 outputs on the samples it ran (for the caller's other checks).
    ``proved_layers``: the streamlined layers whose weights :func:`verify.weights.compare_weights` proved equal to the
    original's; where such a layer's accumulator is not an affine function of the original's, its *input* differs
    on the samples (an earlier float layer's near-tie), not its weights: that is no fault found here (the outputs'
    comparison judges it), and the channel's thresholds are not proved on those samples.

    The original's map is fitted on its float32 execution (fast) and, where that disagrees, on float64 values: first
    those of the disagreeing layers alone, run in float64 from the original's float32 levels before them
    (:func:`verify.tail.float64_from_levels`), and where that does not settle it, the whole original run in float64;
    a fault is reported only when float32 and the whole float64 run both disagree. The two executions of the
    original can part by more than rounding: on mobilenet_v1_4b (channel 711 of ``node__symbolic_53``'s input) they
    differ by a constant 2 accumulator steps, and the streamlined thresholds follow the float32 one, as qonnx's
    execution does."""
    original = reference.original()
    matches = _matches(model, original)
    if not matches:
        return []
    ranges = ranges if ranges is not None else derived_ranges(model)
    wanted = {mt.z for mt in matches}
    outs = set(original.output_names)
    values: dict[str, list[dict[str, np.ndarray]]] = {}
    pending: list[_Pending] = []

    def original_values(dtype: str) -> list[dict[str, np.ndarray]]:
        """The original's quantizer inputs on the samples (only those are kept of its tensors), computed once."""
        if dtype not in values:
            values[dtype] = []
            for i, got in reference.tensors(wanted, sample_ids, np.dtype(dtype)):
                values[dtype].append({z: got[z] for z in wanted if z in got})  # as computed: float64 per match
                if outputs64 is not None and dtype == "float64":
                    outputs64[i] = {o: got[o] for o in outs}
        return values[dtype]

    for mt in matches:
        if any(mt.a not in s for s in samples) or any(mt.z not in v for v in original_values("float32")):
            continue
        a = np.stack([np.asarray(s[mt.a], np.float64) for s in samples])
        z_shape, nhwc = (len(samples),) + np.shape(original_values("float32")[0][mt.z]), mt.nhwc
        moved = z_shape[:2] + z_shape[3:] + z_shape[2:3]  # NCHW -> NHWC
        if len(z_shape) == 5 and (nhwc or (a.shape != z_shape and moved == a.shape)):
            nhwc = True  # the streamlined tensor is NHWC (annotated, or seen by its shape)

        def original_z(dtype: str, mt: _Match = mt, nhwc: bool = nhwc) -> np.ndarray:
            return _original_z3(mt.ordered([v[mt.z] for v in original_values(dtype)]), nhwc)

        if a.shape != (moved if nhwc and len(z_shape) == 5 else z_shape) or a.ndim < 3:
            continue
        a3 = _channels_first(a, nhwc)
        thr = const_array(mt.mt.inputs[1])
        if thr is None or thr.ndim != 2 or thr.shape[0] not in (1, a3.shape[1]):
            continue
        if _after_join(original, mt.z):
            continue  # a join's integer multipliers (IntegerJoinMultipliers) agree with the original on the levels
            # the branches can reach, not on every integer of the range, and are not affine in the original's sum:
            # the rule proved them by enumeration over the branches' box; the output comparison judges the rest
        if _per_position_bias(model, mt.a):
            continue  # AbsorbBorderIntoThresholds: L·a + d[position] crosses the thresholds where the original does at
            # every position, but is not one affine map per channel; the rule checked its thresholds exactly
        lo, hi = _integer_range(model, ranges, mt.a)
        # float32 first (onnxruntime: fast); float64 only where float32 disagrees (after the loop)
        z32 = original_z("float32")
        fit32 = fit_affine(a3, z32, relu=mt.relu_inside)
        bad = [int(c) for c in np.flatnonzero(fit32.ok & (fit32.resid > RESIDUAL32))]
        # where the samples do not determine the map, the one the thresholds record (verify.derived_map)
        maps = _derived(mt, original, a3.shape[1], a.ndim - 2) if not fit32.ok.all() else []
        apply_derived(fit32, maps, a3, z32, mt.relu_inside, RESIDUAL32, lo, hi)
        wrong32 = _prove(mt, original, thr, fit32, lo, hi, a.ndim - 2) if lo <= hi else {}
        if bad or wrong32:
            pending.append(_Pending(mt, nhwc, a3, thr, fit32, bad, wrong32, lo, hi, a.ndim - 2, maps))
    return _settle(pending, model, original, reference, samples, sample_ids, lambda: original_values("float64"),
                   proved_layers) if pending else []


def _integer_range(model: Model, ranges: dict[str, tuple[float, float, bool, bool]], a: str) -> tuple[float, float]:
    """The integers ``[lo, hi]`` tensor ``a`` can take: its derived range, else its datatype's."""
    lohi = ranges.get(a)
    if lohi is None:
        dt = model.get_tensor_datatype(a)
        lohi = (float(dt.min()), float(dt.max()), True, True)
    return float(np.ceil(lohi[0])), float(np.floor(lohi[1]))


def _settle(pending: list["_Pending"], model: Model, original: Model, reference: Any, samples: Sequence[dict],
            sample_ids: Sequence[int], float64: Callable[[], list[dict[str, np.ndarray]]],
            proved_layers: set[str] | None) -> list[ProofIssue]:
    """The issues of the MultiThresholds the float32 proof left ``pending``, decided on float64 values of the
    original's accumulators: first the layers alone in float64 from the original's float32 levels before them (a
    small model); what that does not settle, against the whole original run in float64 (``float64()``, on the
    samples where no float layer of the model met a near-tie). A fault in the accumulator of a layer whose weights
    are proved (``proved_layers``) is its input's on the samples, which the outputs' comparison judges."""
    issues: list[ProofIssue] = []
    local = float64_from_levels(reference, sorted({p.mt.z for p in pending}), list(sample_ids))
    clean: np.ndarray | None = None
    for p in pending:
        issue = None
        if local is not None and all(p.mt.z in local[i] for i in sample_ids):
            issue = _verdict(p, model, original, p.mt.ordered([local[i][p.mt.z] for i in sample_ids]))
        if local is None or issue is not None:
            if clean is None:  # samples on which a float layer of the model met a near-tie are left out
                clean = _clean_samples(model, reference, samples, sample_ids)
            issue = _verdict(p, model, original, p.mt.ordered([v[p.mt.z] for v in float64()]), clean)
        producer = model.find_producer(p.mt.a)
        if issue is not None and issue.tensor == p.mt.a and proved_layers and producer is not None and node_label(
                producer) in proved_layers:
            log.debug("%s; the weights of '%s' are proved equal to the original's: its input differs on the "
                      "samples, which the outputs' comparison judges", issue.describe(), node_label(producer))
            issue = None
        if issue is not None:
            issues.append(issue)
    return issues


@dataclass
class _Pending:
    """A matched MultiThreshold whose float32 fit left channels unexplained (``bad``) or levels unproved
    (``wrong32``): decided on float64 values of the original's accumulator."""

    mt: _Match
    nhwc: bool
    a3: np.ndarray
    thr: np.ndarray
    fit32: AffineFit
    bad: list[int]
    wrong32: dict[int, str]
    lo: float
    hi: float
    rest: int
    maps: list[DerivedMap]


def _verdict(p: _Pending, model: Model, original: Model, z64: list[np.ndarray],
             clean: np.ndarray | None = None) -> ProofIssue | None:
    """The issue of ``p`` on the original's float64 accumulator ``z64`` (one array per sample), or None. ``clean``:
    the samples to judge on (:func:`_clean_samples`; all if None, none proves nothing)."""
    a3, z3 = p.a3, _original_z3(z64, p.nhwc)
    if clean is not None and not clean.all():
        if not clean.any():
            return None
        a3, z3 = a3[clean], z3[clean]
    fit64 = fit_affine(a3, z3, relu=p.mt.relu_inside)
    apply_derived(fit64, p.maps, a3, z3, p.mt.relu_inside, RESIDUAL, p.lo, p.hi)
    label, qlabel = node_label(p.mt.mt), node_label(p.mt.q)
    bad = [c for c in p.bad if fit64.ok[c] and fit64.resid[c] > RESIDUAL]
    if bad:
        c = bad[0]
        producer = model.find_producer(p.mt.a)
        return ProofIssue(node_label(producer) if producer is not None else label, p.mt.a, qlabel,
                          f"channel {c} of the accumulator is not an affine function of the original's "
                          f"'{p.mt.z}' (residual {fit64.resid[c]:.3g} accumulator steps on the reference data, "
                          f"{p.fit32.resid[c]:.3g} against its float32 execution): its weights differ from the original's")
    if not p.wrong32:
        return None
    wrong64 = _prove(p.mt, original, p.thr, fit64, p.lo, p.hi, p.rest)
    both = sorted(set(wrong64) & set(p.wrong32))
    return ProofIssue(label, p.mt.mt.inputs[1].name, qlabel, wrong64[both[0]]) if both else None


def quantizer_step(q: Any, channels: int, rest: int) -> np.ndarray | None:
    """Per channel, the original quantizer's output step (``|s|``; ``2|s|`` for a bipolar one)."""
    scale = const_array(q.inputs[1]) if len(q.inputs) > 1 else None
    if scale is None:
        return None
    try:
        per = np.broadcast_to(np.abs(np.asarray(scale, np.float64)), (1, channels) + (1,) * (rest - 1))
    except ValueError:
        return None
    step = per.reshape(channels) * (2.0 if is_bipolar(q) else 1.0)
    return step if np.all(step > 0) else None



def _level_function(mt: _Match, original: Model, channels: int, rest: int
                    ) -> tuple[Callable[[np.ndarray], np.ndarray | None], np.ndarray] | None:
    """The original quantizer of ``mt`` (in float64; a Relu in front of it applied first) as a level function of
    ``[C, M]`` real inputs, and its per-channel output step; None if its scale does not broadcast per channel."""
    step = quantizer_step(mt.q, channels, rest)
    if step is None:
        return None

    def levels(x: np.ndarray) -> np.ndarray | None:
        shape = (x.shape[1], channels) + (1,) * (rest - 1)
        out = quantize_original(mt.q, original, (np.maximum(x, 0.0) if mt.relu else x).T.reshape(shape))
        return None if out is None else out.reshape(x.shape[1], channels).T

    return levels, step


def _prove(mt: _Match, original: Model, thr: np.ndarray, fit: AffineFit, lo: float, hi: float,
           rest: int) -> dict[int, str]:
    """Step 2 of the module docstring for one matched pair (see :func:`prove_levels`), with the original quantizer
    (:func:`_level_function`) as the reference level function."""
    found = _level_function(mt, original, len(fit.ok), rest)
    return {} if found is None else prove_levels(thr, fit, lo, hi, *found)


def _derived(mt: _Match, original: Model, channels: int, rest: int) -> list[DerivedMap]:
    """The maps from ``mt``'s input to the original quantizer's input recorded by its real thresholds
    (:func:`verify.derived_map.derived_maps`)."""
    found = _level_function(mt, original, channels, rest)
    return [] if found is None else derived_maps(mt.mt, channels, *found)


def apply_derived(fit: AffineFit, maps: Sequence[DerivedMap], a3: np.ndarray, z3: np.ndarray, relu: bool,
                  tol: float, lo: float, hi: float) -> None:
    """In the channels where ``fit`` is not fitted (the samples do not determine the map), the first of
    ``maps`` that reproduces every sample of ``[samples, C, rest]`` arrays ``a3``, ``z3`` within ``tol``
    accumulator steps (through a Relu with ``relu``), in place: its slope and bias, and as residual the larger of
    the samples' and a bound on the float64 rounding of ``slope·a + bias`` on ``[lo, hi]``."""
    todo = ~fit.ok
    for m in maps:
        idx = np.flatnonzero(todo & m.ok)
        if not idx.size:
            continue
        slope, bias = m.slope[idx], m.bias[idx]
        x = slope[None, :, None] * a3[:, idx] + bias[None, :, None]
        resid = np.abs((np.maximum(x, 0.0) if relu else x) - z3[:, idx]).max(axis=(0, 2)) / np.abs(slope)
        rounding = 2.0**-50 * (np.abs(slope) * max(abs(lo), abs(hi)) + np.abs(bias)) / np.abs(slope)
        use = resid <= tol
        chosen = idx[use]
        fit.slope[chosen], fit.bias[chosen] = slope[use], bias[use]
        fit.resid[chosen] = np.maximum(resid, rounding)[use]
        fit.ok[chosen] = True
        todo[chosen] = False


def prove_levels(thr: np.ndarray, fit: AffineFit, lo: float, hi: float,
                 levels: Callable[[np.ndarray], np.ndarray | None], step: np.ndarray, *,
                 exact: np.ndarray | None = None, extrapolate: bool = False,
                 reference: str = "the original quantizer") -> dict[int, str]:
    """Whether ``#{k : a ≥ thr[c, k]}`` and ``levels(A_c·a + B_c)`` (``A_c``, ``B_c``: ``fit.slope``,
    ``fit.bias``; ``levels`` maps ``[C, M]`` real inputs to ``[C, M]`` output values, ``step[c]`` apart) are the
    same step function of the integer ``a`` in ``[lo, hi]`` up to the naming of their levels, for every channel
    with ``fit.ok``. Both are monotone; they are equal so iff they jump by the same number of levels at every
    integer. The thresholds jump only at ``ceil(thr[c, k])``: so the reference's jump is compared there (between
    ``t − 1`` and ``t``), and its total jump over ``[lo, hi]`` with the thresholds' total (then it cannot jump
    anywhere else). Each comparison evaluates ``levels`` at two points: ``O(C·N)`` evaluations, not one per integer
    of the range. ``levels`` is evaluated on either side of each mapped point, by the fit's uncertainty
    (``TIE_RTOL`` relative, 4 residuals, times ``1 + |a − mean|/std`` of the fitted data with ``extrapolate``, which
    also adds :data:`EXTRAPOLATION_RTOL` relative; 0 in the channels where ``exact`` says the map and ``levels`` are
    exact): where the two differ the point is a tie and proves nothing, else (``levels`` being monotone) that is its
    value at the point. Returns the channels that differ, with what shows it (empty if none, or if ``levels``
    returns None)."""
    channels = len(fit.ok)
    n = thr.shape[1]
    t = np.broadcast_to(thr.astype(np.float64), (channels, n))
    jump_at = np.clip(np.ceil(t), lo, hi + 1)  # where each threshold switches on, within the range
    points = np.clip(np.concatenate([jump_at, jump_at - 1, np.full((channels, 1), lo), np.full((channels, 1), hi)],
                                    axis=1), lo, hi)  # [C, M]
    ok = fit.ok
    slope, bias = np.where(ok, fit.slope, 1.0), np.where(ok, fit.bias, 0.0)
    x = points * slope[:, None] + bias[:, None]
    residual = np.where(ok, fit.resid, 0.0)  # in accumulator steps: the fit's own uncertainty
    eps = TIE_RTOL * np.maximum(np.abs(x), 1.0) + (4 * residual * np.abs(slope))[:, None] * (
        1.0 + np.abs(points - fit.mean[:, None]) / np.sqrt(np.maximum(fit.var, 1e-30))[:, None] if extrapolate else 1.0)
    if extrapolate:  # a map fitted to float32 samples, far from them: not better than a few float32 steps there
        eps += EXTRAPOLATION_RTOL * np.abs(x)
    if exact is not None:
        eps[exact] = 0.0
    m = x.shape[1]
    out = levels(np.concatenate([x - eps, x + eps], axis=1))  # one call, either side of the points
    if out is None:
        return {}
    # ``levels`` is monotone: where it agrees on both sides it takes that value at the point too; else a tie
    q0, qp = out[:, :m], out[:, m:]
    tie = q0 != qp  # type: ignore[operator]
    count = multithreshold_rows(points, t)  # the thresholds' level index at each point (a binary search)
    # (point, point before it) for every threshold inside the range, and (lo, hi)
    first = np.concatenate([np.arange(n), [2 * n]])
    second = np.concatenate([np.arange(n) + n, [2 * n + 1]])
    inside = np.concatenate([(jump_at > lo) & (jump_at <= hi), np.ones((channels, 1), bool)], axis=1)
    ours = np.abs(count[:, first] - count[:, second]).astype(np.int64)
    theirs = np.rint(np.abs(q0[:, first] - q0[:, second]) / step[:, None]).astype(np.int64)  # type: ignore[index]
    bad = inside & ok[:, None] & ~tie[:, first] & ~tie[:, second] & (ours != theirs)
    wrong: dict[int, str] = {}
    for c, k in zip(*np.nonzero(bad)):
        if int(c) in wrong:
            continue
        a0, a1 = sorted((points[c, second[k]], points[c, first[k]]))
        wrong[int(c)] = (f"channel {c}: from integer input {a0:g} to {a1:g} the thresholds change the level by "
                         f"{ours[c, k]}, {reference} by {theirs[c, k]} (the real thresholds of its levels "
                         f"differ from these: checked on every integer in [{lo:g}, {hi:g}])")
    return wrong
