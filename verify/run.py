"""Running a pipeline verified end to end, and measuring what verification costs.

:func:`verified_run` runs stages on a model in place with a :class:`~verify.hook.VerificationHook` and then the
final check against the original (always); :func:`measure_overhead` times the same pipeline with and without
per-pass verification on copies of a model (for the bench).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

from finnlite.model import Model
from finnlite.passes import PassManager, RunReport, Stage
from verify.final import FinalCheck, final_check
from verify.hook import VerificationHook, probe_samples
from verify.reference import ReferenceData

__all__ = ["VerifiedRun", "verified_run", "Overhead", "measure_overhead"]


@dataclass
class VerifiedRun:
    """The pass manager's report, the hook (its check records and near-ties) and the final check."""

    report: RunReport
    hook: VerificationHook
    final: FinalCheck

    def summary(self) -> str:
        return f"{self.hook.summary()}\n{self.final.summary()}"


def verified_run(model: Model, stages: Sequence[Stage], reference: ReferenceData | None = None, *,
                 raise_on_final: bool = True, **hook_options: Any) -> VerifiedRun:
    """Run ``stages`` on ``model`` in place with per-pass verification, then compare the result with the original
    on every reference sample; a failing pass raises :class:`~verify.hook.PassVerificationError`, a failing final
    check :class:`~finnlite.errors.VerificationError` (unless ``raise_on_final`` is False)."""
    reference = reference or ReferenceData.random(model, n=8)
    reference.precompute(values=hook_options.get("samples") or probe_samples(reference))
    hook = VerificationHook(reference, **hook_options)
    report = PassManager(stages, [hook]).run(model)
    hook.close()  # the cached tensor values are not needed by the final check: free them before it runs
    final = final_check(reference, model)
    if raise_on_final:
        final.raise_for_errors()
    return VerifiedRun(report, hook, final)


@dataclass
class Overhead:
    """Wall times of the pipeline without and with per-pass verification (final check excluded)."""

    plain_seconds: float
    verified_seconds: float
    checks: int
    setup_seconds: float

    @property
    def ratio(self) -> float:
        return self.verified_seconds / self.plain_seconds if self.plain_seconds > 0 else float("inf")

    def text(self) -> str:
        return (f"pipeline {self.plain_seconds:.2f} s; with per-pass verification {self.verified_seconds:.2f} s "
                f"({self.ratio:.2f}x; {self.checks} checks, {self.setup_seconds:.2f} s of it reference setup)")


def measure_overhead(model: Any, stages: Any, reference: ReferenceData, *, samples: int | None = None,
                     granularity: str = "pass") -> Overhead:
    """Run the pipeline on two copies of ``model``: once plain, once with a verification hook (``samples`` and
    ``granularity`` as for :class:`~verify.hook.VerificationHook`); ``stages`` is a list of stages or a function
    returning a fresh one (passes may keep state)."""
    make = stages if callable(stages) else (lambda: stages)
    plain = Model(model.to_proto() if isinstance(model, Model) else model, check=False)
    t0 = time.perf_counter()
    PassManager(make(), []).run(plain)
    t_plain = time.perf_counter() - t0
    verified = Model(model.to_proto() if isinstance(model, Model) else model, check=False)
    hook = VerificationHook(reference, samples=samples, granularity=granularity)
    t0 = time.perf_counter()
    PassManager(make(), [hook]).run(verified)
    t_verified = time.perf_counter() - t0
    hook.close()
    return Overhead(t_plain, t_verified, len(hook.records), hook.setup_seconds)
