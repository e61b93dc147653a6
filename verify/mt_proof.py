"""Per-pass proofs for rewritten MultiThresholds: every channel, every integer of the input's range.

The per-pass check (:meth:`verify.verifier.Verifier.check`) compares tensors on a few probe samples; a threshold
off by one in one channel shows only if a sample lands on it. After a check passes, :func:`prove_changed_thresholds`
looks at every MultiThreshold ``y = MT_new(x)`` the pass changed (its thresholds, or what feeds it) whose output
tensor the version before the pass produced by a MultiThreshold (or quantizer) ``y = F_old(z)``, and proves
``MT_new(x) = F_old(z)`` for every integer ``x`` of the range, when:

* ``x`` is an integer tensor of known range ``[lo, hi]`` (its datatype annotation: the range the threshold rules
  clip to, :mod:`streamline.round_thresholds`);
* ``z`` is, per channel ``c``, an affine function ``z = A_c·x + B_c`` of ``x``: ``x`` keeps its values through the
  pass, and before it ``z`` was ``x`` (``A = 1, B = 0`` exactly) or was computed from ``x`` by a chain of per-element
  affine ops with constant operands (:data:`ELEMENTWISE`: an absorbed Mul, Add, BatchNorm; no Relu, quantizer or
  join, where a map that is affine on the samples need not be so on the whole range). ``A_c``, ``B_c`` are the
  least-squares fit (:func:`verify.proofs.fit_affine`) of the cached old ``z`` against ``x`` on the probe samples,
  which must leave no residual above :data:`verify.proofs.RESIDUAL32` of a step (a constant that varies along the
  map is not one map per channel), ``x`` taking at least three values in the channel.

Then both sides are monotone step functions of the integer ``x``, compared at every jump of ``MT_new`` and over the
whole range (:func:`verify.proofs.prove_levels`, ``O(C·N)`` evaluations of ``F_old``). A mapped point within the
fit's uncertainty of an old threshold is a tie and proves nothing, unless the map is exact: the chain is at most a
Mul then an Add by float32 constants that, applied in float32 as before the pass, reproduce every sample of ``z``,
and ``a·x + b`` is exact in float64 on the range (all terms multiples of ``2^g``, below ``2^(53+g)``), as when an
integer bias is absorbed (``z = x + b``, ``T_new = T − b``: every jump is a tie) or a scale (an accumulator near
2^19 times a float32 scale: the least-squares slope is off by more than its residual suggests, far from the
samples' mean). An old MultiThreshold is judged by its real thresholds where it carries them
(:func:`~streamline.real_thresholds.encoded_real_thresholds`): its float32 thresholds decide only float32
inputs, and the mapped points are float64. A mismatch is returned as ``(message, node, tensor)`` naming the node and the channel; where
the conditions do not hold nothing is proved (debug log) and the sampled comparison stands alone.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from custom_ops.multithreshold import channel_axis_of, multithreshold_rows
from finnlite.core.model import Model
from finnlite.core.policies import Equality, Policy, Tolerance
from finnlite.core.shapes import const_array
from finnlite.core.traverse import node_label
from streamline.exact import EXACT_KEY
from streamline.real_thresholds import encoded_real_thresholds
from verify.compare import is_integer_tensor
from verify.proofs import (PROOF_QUANTIZERS, RESIDUAL32, AffineFit, fit_affine, prove_levels, quantize_original,
                           quantizer_step)

log = logging.getLogger(__name__)

__all__ = ["prove_changed_thresholds", "exact_levels", "ELEMENTWISE"]

#: per-element affine ops (with constant other operands): a chain of them from ``x`` to ``z`` in the version before
#: the pass makes ``z`` an affine function of ``x`` per element, on every input, not only on the samples
ELEMENTWISE = frozenset({"Mul", "Add", "Sub", "Div", "BatchNormalization", "Identity"})


def _affine_chain(before: Any, z: str, x: str, depth: int = 8) -> bool:
    """Whether, before the pass, ``z`` is ``x`` or is computed from ``x`` by a chain of :data:`ELEMENTWISE` ops whose
    other operands are constants (``x`` their data input: not ``c / x``)."""
    for _ in range(depth):
        if z == x:
            return True
        node = before.producers.get(z)
        if node is None or node.op_type not in ELEMENTWISE:
            return False
        computed = [v for v in node.inputs if v is not None and const_array(v) is None]
        if len(computed) != 1 or (node.op_type in ("Div", "BatchNormalization") and computed[0] is not node.inputs[0]):
            return False
        z = computed[0].name
    return False


#: the fit uses at most this many positions per channel and sample (a 112×112 map: every 13th): plenty to tell an
#: affine map from another, and the cost stays that of a small tensor
POSITIONS = 1024


def _attr(node: Any, name: str, default: Any) -> Any:
    return node.attributes[name].value if name in node.attributes else default


def _old_levels(old: Any, before: Model, channels: int, rest: int) -> tuple[Any, np.ndarray] | None:
    """The old node's level function on ``[C, M]`` real inputs and its per-channel output step, or None. An old
    MultiThreshold whose stored thresholds are the float32 form of the real ones it carries
    (:func:`~streamline.real_thresholds.encoded_real_thresholds`) has its levels counted against the real ones: the
    fit maps an integer to a float64 value, which can lie between ``R`` and its float32 form ``T`` (an accumulator
    near 2^19 times a scale: a float32 step there is 2^-8), and what the pass must keep is the real-number
    meaning, which the rewritten node is made from."""
    if old.op_type in PROOF_QUANTIZERS:
        step = quantizer_step(old, channels, rest)

        def quantized(x: np.ndarray) -> np.ndarray | None:
            out = quantize_original(old, before, x.T.reshape((x.shape[1], channels) + (1,) * (rest - 1)))
            return None if out is None else out.reshape(x.shape[1], channels).T
        return (quantized, step) if step is not None else None
    thr = const_array(old.inputs[1]) if len(old.inputs) > 1 and old.inputs[1] is not None else None
    scale, bias = float(_attr(old, "out_scale", 1.0)), float(_attr(old, "out_bias", 0.0))
    if thr is None or thr.ndim != 2 or thr.shape[0] not in (1, channels) or scale == 0:
        return None
    step = np.full(channels, abs(scale))
    rt = encoded_real_thresholds(old, np.asarray(thr))
    if rt is not None:
        return (lambda x: scale * rt.count_passed(x).astype(np.float64) + bias), step
    t = np.broadcast_to(np.asarray(thr, np.float64), (channels, thr.shape[1]))
    return (lambda x: multithreshold_rows(x, t, scale, bias)), step


def _granularity(values: np.ndarray) -> np.ndarray:
    """Per row of ``values`` (finite floats), the exponent ``g`` of the least significant bit set in any of them:
    each is a multiple of ``2^g`` (a large number for a row of zeros)."""
    values = np.asarray(values, np.float64)
    mant, exp = np.frexp(values)
    bits = (np.abs(mant) * 2.0**53).astype(np.int64)
    low = np.frexp((bits & -bits).astype(np.float64))[1] - 1  # the lowest set bit of the 53-bit mantissa
    return np.where(values != 0, exp - 53 + low, 1 << 20).min(axis=1)


def _chain_constants(before: Any, z: str, x: str, ndim: int, axis: int, channels: int
                     ) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]] | None:
    """``(a, b, ops)`` when, before the pass, ``z`` is ``x`` through ``ops``, one of ``()``, ``("Mul",)``,
    ``("Add",)`` or ``("Mul", "Add")`` (from ``x`` on), each with a constant that is a scalar or one float32 value
    per channel of ``axis`` and is what the node means (no exact value of its own, :mod:`streamline.exact`, of which
    the float32 constant would be a rounding): ``a``, ``b`` per channel (1 and 0 where absent). None for any other
    chain."""
    from streamline.exact import channel_vector

    a, b = np.ones(channels, np.float32), np.zeros(channels, np.float32)
    ops: list[str] = []
    while z != x:
        node = before.producers.get(z)
        if node is None or node.op_type not in ("Mul", "Add") or len(node.inputs) != 2 or len(ops) >= 2:
            return None
        if node.metadata_props.get(EXACT_KEY):
            return None  # its float32 constant rounds an exact one (streamline.exact): the real map is not it
        consts = [const_array(v) if v is not None else None for v in node.inputs]
        if sum(c is not None for c in consts) != 1:
            return None
        k = 0 if consts[0] is not None else 1
        c = np.asarray(consts[k])
        vec = channel_vector(c, ndim, axis) if c.dtype == np.float32 else None
        if vec is None or vec.size not in (1, channels):
            return None
        if node.op_type == "Mul":
            a = np.broadcast_to(vec, (channels,)).astype(np.float32)
        else:
            b = np.broadcast_to(vec, (channels,)).astype(np.float32)
        ops.insert(0, node.op_type)
        z = node.inputs[1 - k].name
    return (a, b, tuple(ops)) if tuple(ops) in ((), ("Mul",), ("Add",), ("Mul", "Add")) else None


def _exact(fit: AffineFit, a3: np.ndarray, z3: np.ndarray, chain: tuple[np.ndarray, np.ndarray, tuple[str, ...]]
           | None, lo: float, hi: float) -> np.ndarray:
    """The channels where the map from ``x`` to ``z`` is known exactly: the chain's own float32 constants
    (:func:`_chain_constants`), applied in float32 as the version before the pass applies them, reproduce every
    sample of ``z``, and ``a·x + b`` is exact in float64 on the range (all terms multiples of ``2^g``, below
    ``2^(53+g)``), so that the level function sees the real number ``z`` means. Their fit is replaced by ``a, b``."""
    if chain is None:
        return np.zeros_like(fit.ok)
    a, b, ops = chain
    x32 = a3.astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        z32 = x32 * a[None, :, None] if "Mul" in ops else x32
        z32 = z32 + b[None, :, None] if "Add" in ops else z32
    same = fit.ok & np.all(z32.astype(np.float64) == z3, axis=(0, 2)) & np.all(np.abs(a3) <= 2.0**24, axis=(0, 2))
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    g = np.minimum(_granularity(a64[:, None]), _granularity(b64[:, None]))  # x is an integer: a·x a multiple of 2^g_a
    bound = np.abs(a64) * max(abs(lo), abs(hi) + 1) + np.abs(b64)
    exact = same & (bound < np.ldexp(1.0, np.minimum(53 + g, 1000)))
    fit.slope, fit.bias = np.where(exact, a64, fit.slope), np.where(exact, b64, fit.bias)
    fit.resid = np.where(exact, 0.0, fit.resid)
    return exact


def _per_channel(values: list[np.ndarray], axis: int) -> np.ndarray:
    """``[samples, C, positions]`` in float64 from per-sample arrays with channel axis ``axis``, at most
    :data:`POSITIONS` positions (evenly strided) per channel and sample."""
    arr = np.moveaxis(np.stack(values), axis + 1, 1)
    arr = arr.reshape(arr.shape[0], arr.shape[1], -1)
    return arr[:, :, ::-(-arr.shape[2] // POSITIONS)].astype(np.float64)


def _skip(label: str, why: str) -> None:
    log.debug("MultiThreshold '%s': not proved (%s); the sampled comparison decides", label, why)


def exact_levels(policy: Policy) -> bool:
    """Whether ``policy`` admits no change of a quantized level (equality, or a tolerance of float rounding noise):
    a pass checked under a looser one may change thresholds on purpose, and nothing is proved."""
    if isinstance(policy, Equality):
        return True
    return isinstance(policy, Tolerance) and policy.steps == 0 and policy.atol == 0 and max(
        policy.rtol, policy.rtol_max) <= 1e-4


def prove_changed_thresholds(verifier: Any, model: Model, outcome: Any, policy: Policy) -> tuple[str, str, str] | None:
    """Prove the MultiThresholds the pass checked under ``policy`` changed (module docstring) against the verifier's
    cached version, before :meth:`~verify.verifier.Verifier.accept`; ``(message, node, tensor)`` of the first
    mismatch, or None."""
    change = outcome.change
    if change is None or not outcome.results or not exact_levels(policy):
        return None
    mts = [n for n in change.nodes if n.op_type == "MultiThreshold"]
    if not mts:
        return None
    snap = verifier.snapshot
    for node in mts:
        label = node_label(node)
        old = snap.producers.get(node.outputs[0].name)
        x = node.inputs[0].name if node.inputs and node.inputs[0] is not None else ""
        if old is None or old.op_type not in ("MultiThreshold", *PROOF_QUANTIZERS) or not old.inputs or not x:
            _skip(label, "no MultiThreshold or quantizer made its output before the pass")
            continue
        dt = model.get_tensor_datatype(x)
        thr = const_array(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
        if model.is_initializer(x) or not is_integer_tensor(model, x) or dt is None or thr is None or thr.ndim != 2:
            _skip(label, f"input '{x}' is not an integer tensor of known range, or its thresholds are not constant")
            continue
        z = old.inputs[0].name
        if x in outcome.results[0] and x not in outcome.keep or x not in verifier.values[0] or not _affine_chain(
                snap, z, x):
            _skip(label, f"'{z}' before the pass is not '{x}' (with its values) or an affine function of it")
            continue
        xs = [r[x] if x in r else v[x] for r, v in zip(outcome.results, verifier.values)]
        zs = [v[z] for v in verifier.values] if z in verifier.values[0] else None
        ndim = np.ndim(xs[0])
        axis = channel_axis_of(_attr(node, "data_layout", ""), ndim)
        if zs is None or np.shape(zs[0]) != np.shape(xs[0]) or ndim < 2 or (
                channel_axis_of(_attr(old, "data_layout", ""), ndim) if old.op_type == "MultiThreshold" else 1) != axis:
            _skip(label, f"'{z}' before the pass and '{x}' differ in shape or layout")
            continue
        a3, z3 = (_per_channel(v, axis) for v in (xs, zs))
        channels, rest = a3.shape[1], ndim - 1
        if thr.shape[0] not in (1, channels) or (found := _old_levels(old, snap.model, channels, rest)) is None:
            _skip(label, "thresholds or the old node's parameters do not broadcast per channel")
            continue
        levels, step = found
        lo, hi = float(np.ceil(dt.min())), float(np.floor(dt.max()))
        if x == z:  # the same tensor with the same values: the identity, exactly
            ones = np.ones(channels)
            fit = AffineFit(ones, 0 * ones, 0 * ones, ones > 0, 0 * ones, ones)
            exact = fit.ok
        else:
            fit = fit_affine(a3, z3)
            # three values or more: a variance below that of the two extremes alone, (max − mean)·(mean − min)
            three = fit.var < (a3.max(axis=(0, 2)) - fit.mean) * (fit.mean - a3.min(axis=(0, 2))) * (1 - 1e-9)
            fit.ok &= (fit.resid <= RESIDUAL32) & three
            chain = _chain_constants(snap, z, x, ndim, axis, channels)
            exact = _exact(fit, a3, z3, chain, lo, hi)
        proved = int(fit.ok.sum())
        if not proved:
            _skip(label, f"no channel of '{z}' is an affine function of '{x}' on the probe samples")
            continue
        wrong = prove_levels(thr, fit, lo, hi, levels, step, exact=exact, extrapolate=True,
                             reference=f"the {old.op_type} before the pass ('{node_label(old)}')")
        log.debug("MultiThreshold '%s': %d of %d channels proved on [%g, %g] (%d exactly)", label, proved,
                  channels, lo, hi, int(exact.sum()))
        if wrong:
            c = min(wrong)
            return (f"MultiThreshold '{label}' (thresholds '{node.inputs[1].name}') is not the {old.op_type} it "
                    f"replaces on every integer input: {wrong[c]}", label, node.outputs[0].name)
    return None
