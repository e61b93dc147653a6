"""Bisection: replay a pipeline on a model with per-pass verification and name the first pass, and inside it the
first rewrite, that breaks equivalence.

The pipeline is replayed on a copy of the model with a :class:`~verify.hook.VerificationHook`, which stops at the
first pass whose result does not match its input on the reference data. If that pass is a
:class:`~finnlite.core.passes.Rule`, it is re-applied to the model as it was before the pass with at most ``k`` rewrites,
and the least ``k`` whose result fails the same check (found by binary search) is the first bad rewrite; the
matches in the rule's :class:`~finnlite.core.passes.PassResult` name the nodes it matched. The command line is ``finnlite bisect``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

from finnlite.core.model import as_model
from finnlite.core.passes import Pass, PassManager, Rule, Stage, instantiate
from finnlite.core.policies import DEFAULT_POLICY, Policy, resolve_policy
from verify.heal import describe_match, first_failing_rewrite
from verify.hook import PassVerificationError, VerificationHook
from verify.reference import ReferenceData
from verify.ties import DEFAULT_NEAR_TIE_RTOL

log = logging.getLogger(__name__)

__all__ = ["BisectResult", "bisect_pipeline"]


@dataclass
class BisectResult:
    """What bisection found. ``ok`` when every pass verified. Otherwise the failing ``stage``, ``pass_name`` and
    fixpoint ``iteration``; for a Rule, ``rewrite`` (1-based) of ``rewrites`` in that run and the nodes it matched
    (``match``), with the check's ``message``, ``node`` and ``tensor``; ``error`` is the pass-level error."""

    ok: bool
    stage: str | None = None
    pass_name: str | None = None
    iteration: int | None = None
    rewrite: int | None = None
    rewrites: int | None = None
    match: str | None = None
    message: str = ""
    node: str | None = None
    tensor: str | None = None
    error: PassVerificationError | None = None

    def text(self) -> str:
        """A readable account."""
        if self.ok:
            return "every pass preserves equivalence on the reference data"
        where = f"stage '{self.stage}'" + (f", round {self.iteration}" if self.iteration else "")
        lines = [f"first failing pass: {self.pass_name} ({where})"]
        if self.rewrite is not None:
            lines.append(f"first failing rewrite: #{self.rewrite} of {self.rewrites}, matched at {self.match}")
            lines.append(f"  {self.message}")
        elif self.error is not None:
            lines.append(f"  {self.error}")
        return "\n".join(lines)


def bisect_pipeline(model: Any, stages: Sequence[Stage], reference: ReferenceData | None = None, *,
                    samples: int = 4, policy: Policy = DEFAULT_POLICY,
                    near_tie_rtol: float = DEFAULT_NEAR_TIE_RTOL) -> BisectResult:
    """Replay ``stages`` on a copy of ``model`` and find the first pass and rewrite that break equivalence (module
    docstring). ``reference`` defaults to 8 random samples in [-1, 1]."""
    work = as_model(model).copy()
    reference = reference or ReferenceData.random(work, n=max(samples, 8))
    hook = VerificationHook(reference, samples=samples, policy=policy, near_tie_rtol=near_tie_rtol)
    manager = PassManager(stages, [hook])
    try:
        manager.run(work)
    except PassVerificationError as err:
        assert manager.current is not None and hook.verifier is not None
        p, stage = manager.current
        result = BisectResult(False, err.stage, err.pass_name, err.iteration, message=str(err), node=err.node,
                              tensor=err.tensor, error=err)
        p = _failing_pass(p, stage, err)
        if isinstance(p, Rule):
            _bisect_rule(p, resolve_policy(p, stage, policy), hook, result, manager.declined_anchors(p) or frozenset())
        return result
    return BisectResult(True)


def _failing_pass(current: Pass, stage: Stage, err: PassVerificationError) -> Pass | None:
    """The pass the error names. A stage checked as a whole fails at its end, after its last pass, and names the
    first failing pass found by replaying the stage: that is one of the stage's passes, not ``current``."""
    if err.pass_name == current.name:
        return current
    for q in stage.passes:
        q = instantiate(q)
        if q.name == err.pass_name:
            return q
    return None  # a stage check of a single run names the stage: nothing to re-apply


def _bisect_rule(rule: Rule, policy: Policy, hook: VerificationHook, result: BisectResult,
                 declined: frozenset[str] = frozenset()) -> None:
    verifier = hook.verifier
    assert verifier is not None
    first = first_failing_rewrite(rule, verifier.snapshot.model, lambda m: verifier.check(m, policy), declined)
    if first is None:
        log.warning("re-applying %s to the model before it did not reproduce the failure", rule.name)
        return
    k, total, (outcome, matches, _) = first
    result.rewrite, result.rewrites = k, total
    result.match = describe_match(matches[k - 1]) if len(matches) >= k else None
    result.message, result.node, result.tensor = outcome.message, outcome.node, outcome.tensor
