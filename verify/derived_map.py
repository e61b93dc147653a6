"""The affine map from a streamlined MultiThreshold's input to the original quantizer's input, read from the
node's real thresholds instead of fitted on samples.

The threshold proof (:mod:`verify.proofs`) needs, per channel, the map ``z = A_c·a + B_c`` from the integer
accumulator ``a`` to the original quantizer's input ``z``. Fitted on the reference samples, it is determined only
where ``a`` takes two values or more in the channel; on a narrow input range an accumulator can be constant. The
streamliner keeps that map exactly: a MultiThreshold's real thresholds (:mod:`streamline.real_thresholds`) are
``R = (base − β)/α``, where ``base`` are the switching points of the quantizer it was made from, on that
quantizer's input, and α, β compose every scale and bias absorbed in front of it since. So
``a ≥ R ⇔ α·a + β ≥ base``: the map is ``z = α·a + β``, or ``z = −(α·a + β)`` after a negative factor (a count
from above: ``base`` and ``β`` negated).

:func:`derived_maps` takes that record only where it speaks of the original quantizer's input: in a channel, every
finite ``base`` must be a switching point of the original quantizer (its own kernel, in float64, with a Relu right
before it applied) at which it changes by as many levels as ``base`` has thresholds there, and it must change by no
more levels in all than ``base`` has finite thresholds. That fixes the sign, too (both signs pass where the
quantizer's switching points are symmetric about 0: then either gives the same jumps at every integer). A record
in another normalization (a scaled ``base``, a join's or a border's own thresholds), or one where a Relu or a clip
before an absorbed bias made the map affine only on part of the range, fails the test, and nothing is derived. The
caller still requires the map to reproduce every sample (:func:`verify.proofs.apply_derived`).

Through a map that passes, the original quantizer changes level exactly where the count against ``base`` does, so
thresholds materialized from the record (:mod:`streamline.round_thresholds`) are proved, and a stored threshold
that is not the record's (one moved by one) is proved wrong, whatever the samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from custom_ops.multithreshold import multithreshold_rows
from streamline.real_thresholds import get_real_thresholds

__all__ = ["DerivedMap", "derived_maps", "SWITCH_RTOL"]

#: how far on either side of a switching point the quantizer is evaluated, relative to the point (or to the step,
#: near 0): far beyond float64 rounding, far within any gap between two switching points
SWITCH_RTOL = 1e-9


@dataclass
class DerivedMap:
    """Per channel, ``z = slope·a + bias`` (float64 roundings of exact rationals); ``ok`` where the record is the
    original quantizer's, with this sign."""

    slope: np.ndarray
    bias: np.ndarray
    ok: np.ndarray


def derived_maps(node: Any, channels: int, levels: Callable[[np.ndarray], np.ndarray | None],
                 step: np.ndarray) -> list[DerivedMap]:
    """The candidate maps (module docstring) of MultiThreshold ``node`` with ``channels`` channels, one per sign
    that some channel's record passes; ``levels`` maps ``[C, M]`` real inputs of the original quantizer to its
    ``[C, M]`` outputs, ``step[c]`` apart. Empty without real thresholds or where they do not broadcast."""
    rt = get_real_thresholds(node)
    if rt is None or rt.shape[0] not in (1, channels) or rt.base.shape[0] not in (1, channels):
        return []
    base = np.broadcast_to(rt.base, (channels, rt.base.shape[1]))
    alpha = np.broadcast_to(rt.alpha.floats(), (channels,))
    beta = np.broadcast_to(rt.beta.floats(), (channels,))
    maps = []
    for sign in (1.0, -1.0):
        ok = _switching_points(base, sign, levels, step)
        if ok.any():
            maps.append(DerivedMap(sign * alpha, sign * beta, ok & (alpha > 0) & np.isfinite(alpha * beta)))
    return maps


def _switching_points(base: np.ndarray, sign: float, levels: Callable[[np.ndarray], np.ndarray | None],
                      step: np.ndarray) -> np.ndarray:
    """Per channel: whether the quantizer ``levels(sign·u)`` jumps at every finite ``base`` by as many levels as the
    count ``#{k : u ≥ base[c, k]}`` does, and by as many in all from ``N + 1`` steps below the least finite ``base``
    to as far above the greatest (``N`` thresholds; a quantizer of ``N + 1`` levels has all its switching points
    there). An infinite ``base`` (a threshold always or never passed: a Relu or a clip composed into the record)
    is so only where the quantizer is constant too: where it is not, the record's map is not the quantizer's input
    on the whole range (a Relu in front of an absorbed bias)."""
    finite = np.isfinite(base)
    some = finite.any(axis=1)
    b = np.where(finite, base, 0.0)
    margin = (base.shape[1] + 1) * step[:, None]
    lo = np.where(some[:, None], np.where(finite, base, np.inf).min(axis=1, keepdims=True, initial=np.inf), 0.0)
    hi = np.where(some[:, None], np.where(finite, base, -np.inf).max(axis=1, keepdims=True, initial=-np.inf), 0.0)
    below = np.concatenate([b - SWITCH_RTOL * np.maximum(np.abs(b), step[:, None]), lo - margin], axis=1)
    above = np.concatenate([b + SWITCH_RTOL * np.maximum(np.abs(b), step[:, None]), hi + margin], axis=1)
    width = below.shape[1]
    out = levels(sign * np.concatenate([below, above], axis=1))
    if out is None:
        return np.zeros(base.shape[0], bool)
    theirs = np.rint(np.abs(out[:, width:] - out[:, :width]) / step[:, None]).astype(np.int64)
    ours = (multithreshold_rows(above, base) - multithreshold_rows(below, base)).astype(np.int64)
    agree = np.concatenate([finite, np.ones((base.shape[0], 1), bool)], axis=1)
    return some & np.all((theirs == ours) | ~agree, axis=1)
