"""Self-healing: undo the one rewrite of a pass that broke equivalence, decline it, and keep the others.

When a per-pass check fails (:mod:`verify.hook`), the model before the pass is still at hand (the verifier's
snapshot). For a :class:`~finnlite.core.passes.Rule`, :func:`decline_bad_rewrites` re-applies the rule to a copy of
it with at most ``k`` rewrites (:meth:`~finnlite.core.passes.Rule.run`) and finds the least ``k`` whose result fails the same check (binary search, as
:mod:`verify.bisect` does): rewrite ``k`` is the bad one. Its anchor (the node the rule visited,
:func:`finnlite.core.passes.anchor_of`) is declined, the rule is applied again in full with that anchor declined,
and the result is checked; if another rewrite fails too, the search repeats (at most :data:`MAX_DECLINED` times per
pass run). The caller makes the passing result the model and tells the pass manager the declined anchors, so that
no later round or stage performs those rewrites again. A pass that is not a Rule cannot be undone in part: the
whole pass run is undone and declined (anchor ``"*"``).

What was declined is kept as :class:`DeclinedRewrite` records: the report lists them with the failing tensor, and
``finnlite streamline --strict`` exits 1 if there is any.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import onnx_ir as ir

from finnlite.core.clone import clone_model
from finnlite.core.model import Model
from finnlite.core.passes import Rule
from finnlite.core.traverse import node_label

__all__ = ["DeclinedRewrite", "HealResult", "decline_bad_rewrites", "describe_match", "apply_rule",
           "first_failing_rewrite", "MAX_DECLINED"]

#: at most this many rewrites of one pass run are declined before the failure is reported as it is
MAX_DECLINED = 16


@dataclass
class DeclinedRewrite:
    """A rewrite undone because it broke equivalence: the pass, its stage and fixpoint round, the anchor node the
    rule visited (``"*"``: the whole pass run was undone), the nodes it matched, and the failing check's tensor, node
    and message."""

    pass_name: str
    stage: str | None
    iteration: int | None
    anchor: str
    match: str | None
    tensor: str | None
    node: str | None
    message: str

    def describe(self) -> str:
        """One line for people."""
        where = f"stage '{self.stage}'" + (f", round {self.iteration}" if self.iteration else "") if self.stage else ""
        what = "the whole pass run" if self.anchor == "*" else f"its rewrite at '{self.anchor}'"
        if self.match and self.anchor != "*":
            what += f" ({self.match})"
        tensor = f"; failing tensor '{self.tensor}'" if self.tensor else ""
        return f"{self.pass_name}{' (' + where + ')' if where else ''}: {what} declined{tensor}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _is_record(x: Any) -> bool:
    return dataclasses.is_dataclass(x) and not isinstance(x, type)


def describe_match(match: Any) -> str:
    """The nodes a rule's match names, for people."""
    if isinstance(match, ir.Node):
        return f"{match.op_type} '{node_label(match)}'"
    if _is_record(match):  # a rule's match record: its fields
        match = [getattr(match, f.name) for f in dataclasses.fields(match)]
    if isinstance(match, dict):
        match = list(match.values())
    if isinstance(match, (list, tuple)):
        parts = [describe_match(x) for x in match if isinstance(x, (ir.Node, list, tuple, dict)) or _is_record(x)]
        if parts:
            return ", ".join(parts)
    return repr(match)[:120]


def apply_rule(rule: Rule, before: Model, k: int | None, declined: frozenset[str] | set[str]
               ) -> tuple[Model, list[Any], list[str]]:
    """A copy of ``before`` with ``rule`` applied (at most ``k`` rewrites, none at a ``declined`` anchor); the matches
    and anchors of its rewrites. ``before`` is not changed."""
    trial = clone_model(before)
    result = rule.run(trial, frozenset(declined), max_rewrites=k, keep_matches=True)
    return trial, list(result.matches), list(result.anchors)


@dataclass
class HealResult:
    """A rule's result without its bad rewrites: ``model`` passes the check (``outcome``); ``declined`` lists, per
    declined rewrite, ``(anchor, match description, the failing outcome of the least failing trial)``."""

    model: Model
    outcome: Any
    declined: list[tuple[str, str, Any]]


Trial = tuple[Any, list[Any], list[str]]


def first_failing_rewrite(rule: Rule, before: Model, check: Callable[[Model], Any],
                          declined: frozenset[str] | set[str] = frozenset(), whole: Trial | None = None
                          ) -> tuple[int, int, Trial] | None:
    """``(k, n, (outcome, matches, anchors))``: of the ``n`` rewrites of the whole application of ``rule`` to a copy
    of ``before``, the least ``k`` such that applying at most ``k`` (:func:`apply_rule`) fails ``check``, with that
    trial's outcome, matches and anchors, found by binary search (the first ``k`` rewrites of a failing trial fail
    in every longer one). The whole application (``whole``, if the caller has tried it) comes first: None if it
    passes or rewrites nothing."""
    cache: dict[int | None, Trial] = {} if whole is None else {None: whole}

    def trial(k: int | None) -> tuple[Any, list[Any], list[str]]:
        if k not in cache:
            model, matches, anchors = apply_rule(rule, before, k, declined)
            cache[k] = (check(model), matches, anchors)
        return cache[k]

    outcome, _, anchors = trial(None)
    if outcome.ok or not anchors:
        return None
    cache[len(anchors)] = cache[None]
    lo, hi = 1, len(anchors)
    while lo < hi:
        mid = (lo + hi) // 2
        if not trial(mid)[0].ok:
            hi = mid
        else:
            lo = mid + 1
    return lo, len(anchors), trial(lo)


def decline_bad_rewrites(rule: Rule, before: Model, check: Callable[[Model], Any],
                         limit: int = MAX_DECLINED, declined: frozenset[str] = frozenset()) -> HealResult | None:
    """``rule`` applied to a copy of ``before`` without the rewrites that fail ``check`` (module docstring), nor at
    the anchors ``declined`` before. None if that cannot be done: the rule rewrites nothing and the check still
    fails (the fault is not this rule's), or more than ``limit`` rewrites would have to be declined."""
    declined = set(declined)
    found: list[tuple[str, str, Any]] = []
    for _ in range(limit + 1):
        full, matches, anchors = apply_rule(rule, before, None, declined)
        outcome = check(full)
        if outcome.ok:
            return HealResult(full, outcome, found)
        if len(found) >= limit:
            return None
        first = first_failing_rewrite(rule, before, check, declined, (outcome, matches, anchors))
        if first is None:
            return None
        k, _, (bad, ms, ans) = first
        if len(ans) < k or ans[k - 1] in declined:
            return None  # the trials do not replay the same rewrites: nothing sound to decline
        declined.add(ans[k - 1])
        found.append((ans[k - 1], describe_match(ms[k - 1]) if len(ms) >= k else "", bad))
    return None
