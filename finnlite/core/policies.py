"""Verification policies: what "computes the same" means for a pass or a stage.

A pass (or a :class:`~finnlite.core.passes.Stage`) declares its policy in its ``verification`` attribute, most
easily with one of the decorators::

    @equality                              # bit-exact on every compared tensor
    class MoveTransposePastRelu(Rule): ...

    @tolerance(rtol=1e-6, steps=0)         # float reassociation: allow rounding noise
    class MoveScalarMulPastMatMul(Rule): ...

    @metric(top1_agreement, lo=0.99)       # a global criterion on the outputs of the whole model
    class ApproximateSomething(Transformation): ...

Three rules hold under every policy:

* tensors annotated with an integer datatype (in the model before or after the pass) compare exactly;
* a one-step difference of a quantizer's output at a float32 near-tie (float64 execution of the version before
  the pass, of the version after it and, where it has the tensor, of the original give the same level there:
  :mod:`verify.ties`) is a *near-tie*, reported with its margin, not a failure — unless the policy says
  ``near_ties=False``;
* a pass that changes nothing is not checked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

__all__ = ["Policy", "Equality", "Tolerance", "Metric", "equality", "tolerance", "metric", "DEFAULT_POLICY",
           "resolve_policy"]

#: a metric function: (outputs of the checked model, reference outputs of the original) -> a number; both map
#: output names to arrays stacked over the samples along axis 0
MetricFn = Callable[[Mapping[str, np.ndarray], Mapping[str, np.ndarray]], float]


@dataclass(frozen=True)
class Policy:
    """Base class of the policies. ``near_ties``: accept one-step quantizer differences at float32 near-ties."""

    near_ties: bool = field(default=True, kw_only=True)

    @property
    def local(self) -> bool:
        """True if the policy compares tensors one by one (so that only the changed region needs re-running)."""
        return True

    def describe(self) -> str:
        """A short human-readable form, used in error messages."""
        return type(self).__name__


@dataclass(frozen=True)
class Equality(Policy):
    """Every compared tensor must be bit-identical (NaN equals NaN)."""

    def describe(self) -> str:
        return "equality"


@dataclass(frozen=True)
class Tolerance(Policy):
    """Element-wise ``|new − ref| ≤ atol + rtol·|ref| + rtol_max·max|ref| + steps·step``.

    ``rtol_max`` is relative to the largest magnitude in the compared tensor (per sample): float rounding noise of
    a reassociated sum scales with the terms, not with a result that cancelled to nearly zero. ``step`` is the
    quantization step of the compared tensor (the scale of the Quant producing it, a MultiThreshold's
    ``out_scale``, or a Mul of such a tensor by a constant; 0 where no step is known). Integer-annotated tensors
    still compare exactly."""

    atol: float = 0.0
    rtol: float = 0.0
    steps: float = 0.0
    rtol_max: float = 0.0

    def __post_init__(self) -> None:
        for name in ("atol", "rtol", "steps", "rtol_max"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"tolerance {name} must be a finite number >= 0, got {value!r}")

    def bound(self, expected: np.ndarray, step: np.ndarray | float | None) -> np.ndarray:
        """The allowed absolute difference for each element of ``expected``."""
        magnitude = np.abs(expected if expected.dtype.kind == "f" else expected.astype(np.float64))
        allowed = self.atol + self.rtol * magnitude
        if self.rtol_max and magnitude.size:
            largest = float(magnitude.max())
            if not np.isfinite(largest):  # the largest finite magnitude (a masked maximum: slower, so only here)
                largest = float(np.max(magnitude, where=np.isfinite(magnitude), initial=0.0))
            allowed = allowed + self.rtol_max * largest
        if self.steps and step is not None:
            allowed = allowed + self.steps * np.abs(np.asarray(step, dtype=np.float64))
        return allowed

    def least_bound(self, expected: np.ndarray, step: np.ndarray | float | None) -> float:
        """A number no element of :meth:`bound` is below (up to float32 rounding of the bound: keep a margin), from
        reductions only: ``atol + rtol·min|ref| + rtol_max·max|ref| + steps·min|step|``; NaN if ``expected`` is not
        all finite."""
        if not expected.size:
            return math.inf
        hi, lo = float(expected.max()), float(expected.min())
        if not (math.isfinite(hi) and math.isfinite(lo)):
            return math.nan
        smallest = 0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi))
        least = self.atol + self.rtol * smallest + self.rtol_max * max(abs(lo), abs(hi))
        if self.steps and step is not None:
            least += self.steps * float(np.min(np.abs(step)))
        return least

    def describe(self) -> str:
        parts = [f"{k}={getattr(self, k):g}" for k in ("atol", "rtol", "rtol_max", "steps") if getattr(self, k)]
        return f"tolerance({', '.join(parts) or 'exact'})"


@dataclass(frozen=True)
class Metric(Policy):
    """A user function of the whole model's outputs that must lie in ``[lo, hi]``.

    ``fn(outputs, reference)`` receives the checked model's outputs and the original model's float32 outputs on
    the same inputs (name -> array, samples stacked on axis 0). ``data`` is a :class:`verify.ReferenceData` to
    evaluate on (for instance a labelled dataset's images); None uses the verifier's reference data. A metric is
    global: the checked model is run whole, and the verifier's per-tensor cache is rebuilt afterwards."""

    fn: MetricFn | None = None
    lo: float = -math.inf
    hi: float = math.inf
    name: str = ""
    data: Any = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise ValueError("a metric policy needs a callable fn(outputs, reference) -> float")
        if self.lo > self.hi:
            raise ValueError(f"metric range is empty: lo={self.lo} > hi={self.hi}")

    @property
    def local(self) -> bool:
        return False

    @property
    def label(self) -> str:
        """The metric's name (``name``, else the function's name)."""
        return self.name or getattr(self.fn, "__name__", "metric")

    def accepts(self, value: float) -> bool:
        """True if ``value`` lies in ``[lo, hi]`` (NaN never does)."""
        return bool(self.lo <= value <= self.hi)

    def describe(self) -> str:
        return f"metric {self.label} in [{self.lo:g}, {self.hi:g}]"


#: the policy of a pass that declares none, in a stage that declares none: float rounding noise (relative 1e-5 of
#: an element, 1e-4 of the tensor's largest magnitude) is tolerated, integer tensors compare exactly
DEFAULT_POLICY: Policy = Tolerance(rtol=1e-5, rtol_max=1e-4)


def _declare(target: Any, policy: Policy) -> Any:
    """Set ``target.verification`` (a pass class, a pass instance or a Stage) and return ``target``."""
    try:
        setattr(target, "verification", policy)
    except AttributeError as exc:  # frozen or slotted objects
        raise TypeError(f"cannot attach a verification policy to {target!r}") from exc
    return target


def equality(target: Any = None, *, near_ties: bool = True) -> Any:
    """Declare :class:`Equality` on a pass class, pass instance or Stage: ``@equality`` or
    ``@equality(near_ties=False)``."""
    policy = Equality(near_ties=near_ties)
    if target is None:
        return lambda t: _declare(t, policy)
    return _declare(target, policy)


def tolerance(*, atol: float = 0.0, rtol: float = 0.0, steps: float = 0.0, rtol_max: float = 0.0,
              near_ties: bool = True) -> Callable[[Any], Any]:
    """Declare :class:`Tolerance`: ``@tolerance(rtol=1e-6)``, ``@tolerance(steps=1)``, ``@tolerance(rtol_max=1e-5)``."""
    policy = Tolerance(near_ties=near_ties, atol=atol, rtol=rtol, steps=steps, rtol_max=rtol_max)
    return lambda t: _declare(t, policy)


def metric(fn: MetricFn, lo: float = -math.inf, hi: float = math.inf, *, name: str = "", data: Any = None
           ) -> Callable[[Any], Any]:
    """Declare :class:`Metric`: ``@metric(top1_agreement, lo=0.99)``."""
    policy = Metric(fn=fn, lo=lo, hi=hi, name=name, data=data)
    return lambda t: _declare(t, policy)


def resolve_policy(p: Any, stage: Any = None, default: Policy = DEFAULT_POLICY) -> Policy:
    """The policy that applies to pass ``p`` in ``stage``: the pass's own, else the stage's, else ``default``."""
    for source in (p, stage):
        policy = getattr(source, "verification", None) if source is not None else None
        if policy is not None:
            if not isinstance(policy, Policy):
                raise TypeError(f"verification of {source!r} is {policy!r}, not a verify.Policy")
            return policy
    return default
