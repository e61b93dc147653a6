"""Running a pipeline verified end to end: :func:`verified_run` runs stages on a model in place with a
:class:`~verify.hook.VerificationHook` and then the final check against the original (always)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from finnlite.core.model import Model
from finnlite.core.passes import PassManager, RunReport, Stage
from verify.final import FinalCheck, final_check
from verify.hook import VerificationHook, probe_samples
from verify.reference import ReferenceData

__all__ = ["VerifiedRun", "verified_run"]


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
    check :class:`~finnlite.core.errors.VerificationError` (unless ``raise_on_final`` is False)."""
    reference = reference or ReferenceData.random(model, n=8)
    reference.precompute(values=hook_options.get("samples") or probe_samples(reference))
    hook = VerificationHook(reference, **hook_options)
    report = PassManager(stages, [hook]).run(model)
    hook.close()  # the cached tensor values are not needed by the final check: free them before it runs
    final = final_check(reference, model)
    if raise_on_final:
        final.raise_for_errors()
    return VerifiedRun(report, hook, final)
