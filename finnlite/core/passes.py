"""Passes: base classes, an explicit registry, and the pass manager.

* :class:`Transformation` edits a model in place; ``run`` returns a :class:`PassResult` (whether it changed
  anything, and for a rule its rewrites and misses), ``apply`` just whether it changed anything. :class:`Rule` is
  a local rewrite (match a node, check conditions, rewrite) whose ``run`` walks the graph once; a match with more
  than two parts is a small named record (a frozen dataclass). :class:`AnalysisPass` only reads.
* The registry (:mod:`finnlite.core.registry`) maps a pass name to its class; its functions are re-exported here.
* :class:`PassManager` runs ordered :class:`Stage` objects. A fixpoint stage repeats its passes until one full
  round changes nothing. Termination is guaranteed by cycle detection (a fingerprint of the graph after each round:
  seeing one twice means the passes oscillate) and a hard iteration cap; both raise :class:`FixpointError` naming
  the passes that kept changing the graph. Every pass run is recorded (time, changed, rewrites, node counts) in the
  manager's :class:`RunReport`, which stays readable when a run fails; hooks (:class:`Hook`: the verifier, a progress
  display) are called around each stage and pass.
* Rewrites *declined by verification* (:attr:`PassManager.declined`: ``(pass name, anchor)`` pairs, see
  :func:`anchor_of`) are not performed again: the manager hands a rule's declined anchors to :meth:`Rule.run`,
  which skips them (recording a :class:`Miss`), and does not run again a pass declined as a whole (anchor ``"*"``). The verifier's hook adds to the
  set when it undoes a rewrite that broke equivalence (:mod:`verify.hook`).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable, Protocol, Sequence

from finnlite.core.errors import FixpointError, PassError
from finnlite.core.registry import get_pass, list_aliases, list_passes, register_pass  # noqa: F401 - re-exported

if TYPE_CHECKING:
    import onnx_ir as ir

    from finnlite.core.model import Model


class Pass:
    """Base class of all passes. ``name`` defaults to the class name; ``group`` is the stage family
    (``tidy``, ``convert``, ``absorb``, ``reorder``, ``collapse``, ``lower``, ``finalize``, ``analysis``...).
    ``verification`` is the policy a pass declares for per-pass verification (see the ``verify`` package);
    None means the stage's or manager's default."""

    name: ClassVar[str] = ""
    group: ClassVar[str] = "misc"
    verification: ClassVar[Any] = None
    #: FINN/qonnx transformation names this pass covers (registered with it; not inherited by subclasses)
    aliases: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            cls.name = cls.__name__

    @classmethod
    def summary(cls) -> str:
        """The first line of the docstring."""
        doc = (cls.__doc__ or "").strip()
        return doc.splitlines()[0] if doc else ""


@dataclass
class Miss:
    """Why a rule did not apply at a node: the condition that failed. Collected for the integer-only report."""

    rule: str
    node: str
    reason: str


@dataclass(frozen=True, slots=True)
class PassResult:
    """What one run of a pass did: whether it ``changed`` the model; ``rewrites``: how many rewrites it performed
    (None: a pass that does not count them); ``misses``: the conditions that failed where it did not apply; for a
    :class:`Rule`, per rewrite in order, its anchor (:func:`anchor_of`) and, when asked for, its match (``anchors``,
    ``matches``: what bisection and healing replay)."""

    changed: bool
    rewrites: int | None = None
    misses: tuple[Miss, ...] = ()
    anchors: tuple[str, ...] = ()
    matches: tuple[Any, ...] = ()


class Transformation(Pass):
    """A pass that edits the model in place. A subclass implements ``apply`` (True if it changed anything) or, to
    report more than that, ``run`` (a :class:`PassResult`); the other one follows from it. The one a class defines
    lowest in its hierarchy is the one that runs: a subclass overriding ``apply`` of a pass that implements ``run``
    runs its ``apply`` (which may call ``super().apply``)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "apply" in cls.__dict__ and "run" not in cls.__dict__:
            cls.run = Transformation.run  # type: ignore[method-assign]  # runs this class's apply

    def apply(self, model: "Model") -> bool:
        run = next((k.__dict__["run"] for k in type(self).__mro__
                    if "run" in k.__dict__ and k.__dict__["run"] is not Transformation.run), None)
        if run is None:
            raise PassError(f"{self.name} does not implement apply()")
        return run(self, model).changed

    def run(self, model: "Model", declined: frozenset[str] = frozenset()) -> PassResult:
        """Run on ``model`` in place and say what was done. ``declined``: the anchors (:func:`anchor_of`) where a
        :class:`Rule` must not rewrite; any other pass is declined only as a whole, by not being run."""
        return PassResult(bool(self.apply(model)))


class AnalysisPass(Pass):
    """A pass that only reads the model and returns a result."""

    group: ClassVar[str] = "analysis"

    def analyze(self, model: "Model") -> Any:
        raise PassError(f"{self.name} does not implement analyze()")


#: the anchor of a pass declined as a whole (a transformation that is not a :class:`Rule`)
WHOLE_PASS = "*"


def anchor_of(node: "ir.Node") -> str:
    """The name by which a rewrite anchored at ``node`` (the node :meth:`Rule.run` visited) is declined: the
    node's name, or its first output's name when it has none (output names are unique in a graph)."""
    if node.name:
        return node.name
    return f"->{node.outputs[0].name}" if node.outputs else node.op_type


class Rule(Transformation):
    """A local rewrite: ``match(model, node)`` returns a match (any truthy object: the node, a pair, or a small
    frozen dataclass naming the parts) or a :class:`Miss`/None, and ``rewrite(model, match)`` performs the edit.
    ``run`` visits every node once in graph order, skipping nodes removed by earlier rewrites of the same run;
    initializers the visited node read that a rewrite leaves unused are removed at once (as the next cleanup would).
    It returns a :class:`PassResult` with the number of rewrites, the misses (:meth:`miss`), and each rewrite's
    anchor (and match, with ``keep_matches``: matches can hold weights that a rewrite replaced).

    ``max_rewrites`` limits how many rewrites one run performs (bisection and healing pass their own limit to
    :meth:`run` to find the first bad rewrite). A match at a ``declined`` anchor is recorded as a miss instead."""

    op_types: ClassVar[tuple[str, ...]] = ()

    def __init__(self, max_rewrites: int | None = None) -> None:
        self.max_rewrites = max_rewrites
        self._misses: list[Miss] = []  # the misses of the run in progress (see miss)

    def match(self, model: "Model", node: "ir.Node") -> Any:
        raise PassError(f"{self.name} does not implement match()")

    def rewrite(self, model: "Model", match: Any) -> None:
        raise PassError(f"{self.name} does not implement rewrite()")

    def miss(self, node: "ir.Node", reason: str) -> Miss:
        """Record that the rule did not apply at ``node`` because of ``reason`` (a miss of the run in progress);
        returns the :class:`Miss`."""
        m = Miss(self.name, node.name or node.op_type, reason)
        self._misses.append(m)
        return m

    def run(self, model: "Model", declined: frozenset[str] = frozenset(), max_rewrites: int | None = None,
            keep_matches: bool = False) -> PassResult:
        """Match and rewrite at every node of ``model`` once (class docstring); ``max_rewrites``: this run's limit
        (default: the rule's own)."""
        limit = self.max_rewrites if max_rewrites is None else max_rewrites
        self._misses = misses = []
        anchors: list[str] = []
        matches: list[Any] = []
        for node in list(model.graph):
            if limit is not None and len(anchors) >= limit:
                break
            if node.graph is not model.graph:
                continue
            if self.op_types and node.op_type not in self.op_types:
                continue
            m = self.match(model, node)
            if not m or isinstance(m, Miss):
                continue
            anchor = anchor_of(node)
            if anchor in declined:
                self.miss(node, "declined by verification: this rewrite broke equivalence here")
                continue
            consts = [v for v in node.inputs if v is not None and v.is_initializer()]
            self.rewrite(model, m)
            anchors.append(anchor)
            if keep_matches:
                matches.append(m)
            model.drop_if_unused(*consts)
            consts.clear()  # no reference to a dropped weight is left while the next node is matched
        return PassResult(bool(anchors), len(anchors), tuple(misses), tuple(anchors), tuple(matches))


def instantiate(p: Pass | type[Pass] | str) -> Pass:
    """A pass instance from an instance (returned as it is), a pass class or a registered pass name."""
    if isinstance(p, str):
        p = get_pass(p)
    if isinstance(p, type):
        return p()
    return p


def _is_qonnx_transformation(p: Any) -> bool:
    try:
        from qonnx.transformation.base import Transformation as QonnxTransformation
    except ImportError:  # pragma: no cover - qonnx is a dependency
        return False
    return isinstance(p, QonnxTransformation)


def run_pass(model: "Model", p: Any) -> bool:
    """Run one pass on ``model`` in place: a finnlite pass (instance, class or registered name), a plain
    function ``f(model) -> bool``, or a qonnx ``Transformation`` (instance or class, run through a qonnx
    ModelWrapper; the model's graph is then replaced by the result). Returns whether the model changed."""
    if isinstance(p, str) or (isinstance(p, type) and issubclass(p, Pass)):
        p = instantiate(p)
    elif isinstance(p, type):
        p = p()
    if isinstance(p, Transformation):
        return bool(p.apply(model))
    if isinstance(p, AnalysisPass):
        raise PassError(f"{p.name} is an analysis; use model.analysis()")
    if _is_qonnx_transformation(p):
        before = fingerprint(model)
        result = model.to_qonnx().transform(p)
        model.replace_ir(type(model)(result, check=False).ir)
        return fingerprint(model) != before
    if callable(p):
        return bool(p(model))
    raise PassError(f"cannot run {p!r} as a pass")


def fingerprint(model: "Model") -> str:
    """A digest of the graph's structure (nodes, their wiring and attributes, initializer names and shapes), used
    to detect oscillation. Linear in the size of the graph."""
    h = hashlib.blake2b(digest_size=16)
    for node in model.graph:
        h.update(node.domain.encode())
        h.update(node.op_type.encode())
        for v in node.inputs:
            h.update(b"|" + (v.name.encode() if v is not None and v.name else b"-"))
        h.update(b">")
        for v in node.outputs:
            h.update(b"|" + v.name.encode())
        for key, attr in sorted(node.attributes.items()):
            h.update(key.encode() + repr(attr.value).encode()[:256])
    for name, v in sorted(model.graph.initializers.items()):
        h.update(name.encode())
        if v.const_value is not None:
            h.update(repr(tuple(v.const_value.shape)).encode())
    return h.hexdigest()


# -- stages and the manager ------------------------------------------------------------------------------------
@dataclass
class Stage:
    """An ordered list of passes. With ``fixpoint`` the list is repeated until a round changes nothing, at most
    ``max_iterations`` rounds. ``verification`` is the stage's default policy for its passes. ``check_whole``:
    per-pass verification (``verify="each"``) checks what all the stage's passes changed at once, at its end,
    instead of each pass that changed something; a failure is replayed pass by pass to name the first failing
    one. That pays off when consecutive passes each rewrite the whole network, so that every per-pass check would
    run all of it (see :class:`verify.hook.VerificationHook`)."""

    name: str
    passes: Sequence[Pass | type[Pass] | str]
    fixpoint: bool = False
    max_iterations: int = 100
    verification: Any = None
    check_whole: bool = False


@dataclass
class PassRecord:
    """What one pass run did."""

    stage: str
    name: str
    iteration: int
    seconds: float
    changed: bool
    nodes_before: int
    nodes_after: int
    rewrites: int | None = None


@dataclass
class RunReport:
    """Everything the manager recorded: pass records, stage times, and the near-misses of the rules."""

    records: list[PassRecord] = field(default_factory=list)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    misses: list[Miss] = field(default_factory=list)


class Hook(Protocol):
    """What the manager calls on its hooks, in this order; a hook defines only the methods it needs."""

    def before_run(self, manager: "PassManager", model: "Model") -> None:
        """The run starts; ``manager.declined`` is where a hook records the rewrites it declines."""

    def before_stage(self, stage: Stage, model: "Model") -> None: ...
    def before_pass(self, p: Pass, model: "Model", stage: Stage) -> None: ...
    def after_pass(self, p: Pass, model: "Model", stage: Stage, record: PassRecord) -> None: ...
    def after_stage(self, stage: Stage, model: "Model") -> None: ...
    def after_run(self, model: "Model", report: RunReport) -> None: ...
    def on_error(self, exc: BaseException) -> None:
        """The run failed with ``exc``; the hook may raise another error in its place (chained to it)."""


class PassManager:
    """Runs stages of passes on a model in place (see the module docstring). ``report`` is the record of the
    current or last run, partial if that run failed; ``current`` is the pass being run and its stage (after a
    failure: the pass that failed, or whose check failed). ``declined``: the ``(pass name, anchor)`` pairs of the
    rewrites verification declined (module docstring); pass a set to share it between runs."""

    def __init__(self, stages: Iterable[Stage], hooks: Iterable[Any] = (),
                 declined: set[tuple[str, str]] | None = None) -> None:
        self.stages = list(stages)
        self.hooks = list(hooks)
        self.report = RunReport()
        self.current: tuple[Pass, Stage] | None = None
        self.declined: set[tuple[str, str]] = declined if declined is not None else set()

    def declined_anchors(self, p: Pass) -> frozenset[str] | None:
        """The anchors where ``p`` must not rewrite (what verification declined, for :meth:`Transformation.run`);
        None if the whole pass is declined (then it is not run)."""
        if (p.name, WHOLE_PASS) in self.declined:
            return None
        return frozenset(a for name, a in self.declined if name == p.name)

    def _call(self, method: str, *args: Any) -> None:
        for hook in self.hooks:
            fn = getattr(hook, method, None)
            if fn is not None:
                fn(*args)

    def _run_one(self, p: Pass, model: "Model", stage: Stage, iteration: int,
                 report: RunReport) -> PassResult | None:
        """Run ``p`` once and record it; None if it is declined as a whole."""
        declined = self.declined_anchors(p)
        if declined is None:
            return None
        self.current = (p, stage)
        self._call("before_pass", p, model, stage)
        n0 = len(model)
        t0 = time.perf_counter()
        result = p.run(model, declined)
        rec = PassRecord(stage.name, p.name, iteration, time.perf_counter() - t0, result.changed, n0, len(model),
                         result.rewrites)
        report.records.append(rec)
        self._call("after_pass", p, model, stage, rec)
        return result

    def run_stage(self, stage: Stage, model: "Model", report: RunReport) -> None:
        """Run one stage (to a fixpoint if it is one). The misses of each pass's last run go to the report."""
        passes = [instantiate(p) for p in stage.passes]
        last_misses: list[tuple[Miss, ...]] = [()] * len(passes)

        def one_round(iteration: int) -> list[str]:
            changers = []
            for i, p in enumerate(passes):
                result = self._run_one(p, model, stage, iteration, report)
                if result is not None:
                    last_misses[i] = result.misses
                    if result.changed:
                        changers.append(p.name)
            return changers

        self._call("before_stage", stage, model)
        t0 = time.perf_counter()
        if stage.fixpoint:
            self._fixpoint(stage, model, one_round)
        else:
            one_round(0)
        for misses in last_misses:
            report.misses.extend(misses)
        report.stage_seconds[stage.name] = report.stage_seconds.get(stage.name, 0.0) + time.perf_counter() - t0
        self._call("after_stage", stage, model)

    @staticmethod
    def _fixpoint(stage: Stage, model: "Model", one_round: Callable[[int], list[str]]) -> None:
        """Repeat ``one_round`` (which returns the names of the passes that changed the graph) until a round
        changes nothing; raise :class:`FixpointError` on a repeated graph or after ``stage.max_iterations``."""
        seen: dict[str, int] = {fingerprint(model): 0}
        changers_by_round: list[list[str]] = []
        for iteration in range(1, stage.max_iterations + 1):
            changers = one_round(iteration)
            if not changers:
                return
            changers_by_round.append(changers)
            fp = fingerprint(model)
            if fp in seen:
                names = sorted({n for r in changers_by_round[seen[fp]:] for n in r})
                raise FixpointError(f"stage '{stage.name}' oscillates: round {iteration} returned the graph of "
                                    f"round {seen[fp]}; passes involved: {', '.join(names)}")
            seen[fp] = iteration
        names = sorted({n for r in changers_by_round[-3:] for n in r})
        raise FixpointError(f"stage '{stage.name}' did not converge in {stage.max_iterations} rounds; "
                            f"passes still changing the graph: {', '.join(names)}")

    def run(self, model: "Model") -> RunReport:
        """Run every stage in order on ``model`` (in place) and return the record of what happened (also kept in
        ``self.report``, partial if the run fails). Hooks are called as :class:`Hook` says."""
        report = self.report = RunReport()
        self._call("before_run", self, model)
        try:
            for stage in self.stages:
                self.run_stage(stage, model, report)
        except BaseException as exc:
            self._call("on_error", exc)
            raise
        self._call("after_run", model, report)
        self.current = None
        return report
