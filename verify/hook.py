"""Per-pass verification: a :class:`~finnlite.core.passes.PassManager` hook that checks every pass that changed
the model.

A pass that reports no change is not checked (a cheap structural key confirms it changed nothing); after any other
pass the :class:`~verify.verifier.Verifier` compares the new model version with the cached one, only where it
changed (see :mod:`verify.verifier`), under the policy the pass (or its stage) declares. On a mismatch the hook
saves the models before and after the pass and raises :class:`PassVerificationError` naming the pass, the first
diverging tensor and its producing node, the largest error and the files. Float32 near-ties (:mod:`verify.ties`)
are accepted and logged with their margins. A MultiThreshold the pass rewrote is also proved on every integer of its
input's range where :mod:`verify.mt_proof` can (a threshold off by one that no probe sample reaches fails the check,
naming the node and the channel). The checks run in this process, each one before the next pass starts.

A stage declared with ``check_whole=True`` (:class:`finnlite.core.passes.Stage`) is checked once, at its end, for
everything its passes changed; if that check fails, its pass runs are replayed one by one from the last verified
version, each checked on its own, so that the error names the first failing pass.

A failing check first asks whether the pass is at fault: the cached values are the original's (an accepted near-tie
keeps the original's value in the cache), so when the model *before* the pass already computes something else for
the first diverging tensor, the difference is older than the pass. The error (:class:`InheritedDeviation`) then
says so and names the earlier check that accepted near-ties on that tensor or upstream of it.

With ``heal=True`` a failing pass does not stop the run: the rewrite that broke the check is found, undone and
declined (:mod:`verify.heal`; the whole pass run for a pass that is not a Rule), the pass manager is told not to
perform it again, and the run goes on; ``declined`` lists what was declined. An :class:`InheritedDeviation` is still
raised (the earlier pass's rewrite is not at hand any more): :func:`finnlite.build.streamline` runs the pipeline
again from the start with those near-ties rejected (``reject_ties``), so that the earlier pass's check fails and
is healed in its turn.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from custom_ops.plan import release_arena
from finnlite.core.clone import clone_model
from finnlite.core.errors import VerificationError
from finnlite.core.model import Model, freeze
from finnlite.core.passes import WHOLE_PASS, Rule
from finnlite.core.policies import DEFAULT_POLICY, Equality, Metric, Policy, Tolerance, resolve_policy
from finnlite.core.tensors import content_crc, is_immutable
from finnlite.core.traverse import ancestors, constant_tensors
from verify.compare import compare_tensor, is_integer_tensor
from verify.final import final_check
from verify.heal import DeclinedRewrite, decline_bad_rewrites
from verify.mt_proof import prove_changed_thresholds
from verify.reference import ReferenceData
from verify.region import run_nodes, structure_key
from verify.ties import DEFAULT_NEAR_TIE_RTOL, NearTie
from verify.verifier import CheckOutcome, Verifier

log = logging.getLogger(__name__)

__all__ = ["VerificationHook", "PassVerificationError", "InheritedDeviation", "CheckRecord", "probe_samples",
           "PROBE_ELEMENTS"]

Runs = list[tuple[Any, Policy, "int | None"]]


class PassVerificationError(VerificationError):
    """A pass (or stage) changed what the model computes. Attributes: ``pass_name``, ``stage``, ``iteration``,
    ``node`` and ``tensor`` (the first diverging one), ``max_error``, ``sample``, ``before_path``, ``after_path``."""

    def __init__(self, message: str, *, pass_name: str, stage: str | None = None, iteration: int | None = None,
                 node: str | None = None, tensor: str | None = None, max_error: float | None = None,
                 sample: int | None = None, before_path: str | None = None, after_path: str | None = None) -> None:
        super().__init__(message, node=node, tensor=tensor)
        self.pass_name, self.stage, self.iteration = pass_name, stage, iteration
        self.max_error, self.sample = max_error, sample
        self.before_path, self.after_path = before_path, after_path


class InheritedDeviation(PassVerificationError):
    """A check failed on a tensor that the model *before* the pass already computes differently from the original:
    the pass is not at fault. ``checked_pass``: the pass whose check failed; ``pass_name``, ``stage``,
    ``iteration``: the earlier check that accepted near-ties on that tensor or upstream of it (None if none did);
    ``ties``: those near-ties."""

    def __init__(self, message: str, *, checked_pass: str, ties: list[NearTie], **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.checked_pass = checked_pass
        self.ties = ties


@dataclass
class CheckRecord:
    """One verification: what was checked, how many nodes changed, how many were run (the changed ones, widened
    where changed values reach unchanged nodes), how long it took, the near-ties accepted."""

    label: str
    stage: str | None
    iteration: int | None
    policy: str
    changed_nodes: int
    region_nodes: int
    seconds: float
    near_ties: list[NearTie] = field(default_factory=list)
    runs: int = 1
    #: the pass the check is of, or the stage for a stage check
    pass_name: str = ""


#: environment variable naming the folder under which failing checks save their models (default: the system's
#: temporary folder)
SAVE_DIR_ENV = "FINNLITE_VERIFY_DIR"

#: the per-pass checks use enough reference samples for about this many input values (at least 1, at most 8)
PROBE_ELEMENTS = 4096


def probe_samples(reference: ReferenceData) -> int:
    """How many samples of ``reference`` the per-pass checks use by default (see :data:`PROBE_ELEMENTS`)."""
    per_sample = sum(int(a.size) for a in reference.sample(0).values())
    return max(1, min(8, PROBE_ELEMENTS // max(per_sample, 1)))


def _union_policy(policies: list[Policy], default: Policy) -> Policy:
    """One policy admitting what each of ``policies`` admits (for checking several passes at once): equality if
    they all say so, else the largest of each tolerance; near-ties if any accepts them."""
    if not policies:
        return default
    near = any(p.near_ties for p in policies)
    if all(isinstance(p, Equality) for p in policies):
        return Equality(near_ties=near)
    tol = [p for p in policies if isinstance(p, Tolerance)]
    return Tolerance(near_ties=near, atol=max(t.atol for t in tol), rtol=max(t.rtol for t in tol),
                     steps=max(t.steps for t in tol), rtol_max=max(t.rtol_max for t in tol))


def _safe(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("_")[:60] or "pass"


class VerificationHook:
    """A pass-manager hook verifying each pass that changed the model against cached reference values (the
    ``verify="each"`` mode of :func:`finnlite.build.streamline` and the CLI). A stage declaring ``check_whole=True``
    (:class:`finnlite.core.passes.Stage`) is checked once, for what all its passes changed, at its end; on a
    failure its passes are replayed one by one from the last verified version to name the first failing pass.

    ``reference``: a :class:`ReferenceData` built from the original model (default: 8 random samples in [-1, 1]
    drawn when the first stage starts). ``samples``: how many of its samples the per-pass checks use (default:
    enough for about :data:`PROBE_ELEMENTS` input values, between 1 and 8: one image of an ImageNet network, eight
    MNIST digits). ``policy``: the default for passes and stages that declare none. ``save_dir``: where failing
    models are written (a new temporary folder by default, under ``$FINNLITE_VERIFY_DIR`` if set). After the run,
    ``records`` lists the checks and ``near_ties`` the accepted float32 near-ties; :meth:`final_check` compares the
    result with the original on all reference samples. ``heal``: undo and decline the rewrites that fail their
    check instead of raising (module docstring; ``declined`` lists them); ``reject_ties``: near-ties, as
    :func:`verify.verifier.tie_key` gives them, that no check accepts."""

    def __init__(self, reference: ReferenceData | None = None, *, samples: int | None = None,
                 policy: Policy = DEFAULT_POLICY, save_dir: str | Path | None = None,
                 near_tie_rtol: float = DEFAULT_NEAR_TIE_RTOL, heal: bool = False,
                 reject_ties: set[tuple[str, int, tuple[int, ...]]] | None = None) -> None:
        self.reference = reference
        self.samples = samples
        self.policy = policy
        self.save_dir = Path(save_dir) if save_dir is not None else None
        self.near_tie_rtol = near_tie_rtol
        self.verifier: Verifier | None = None
        self.records: list[CheckRecord] = []
        self._stage_runs: Runs = []
        self.setup_seconds = 0.0
        self._failures = 0
        self._structure: int | None = None  # structure_key of the last version checked
        self._copies: dict[int, tuple[Any, int, Any]] = {}  # frozen copies of writable initializers (_private_copy)
        self.heal = heal
        #: near-ties the checks must not accept (module docstring), as :func:`verify.verifier.tie_key` gives them
        self.reject_ties = set(reject_ties or ())
        #: what healing declined, in order
        self.declined: list[DeclinedRewrite] = []
        #: the (pass name, anchor) pairs the pass manager must not perform (its own set once a run starts)
        self.declined_keys: set[tuple[str, str]] = set()
        self.manager: Any = None

    # -- state -------------------------------------------------------------------------------------------------
    @property
    def near_ties(self) -> list[NearTie]:
        """Every near-tie accepted so far."""
        return [t for r in self.records for t in r.near_ties]

    @property
    def seconds(self) -> float:
        """Time spent verifying (setup included)."""
        return self.setup_seconds + sum(r.seconds for r in self.records)

    def start(self, model: Model) -> None:
        """Take the reference values and the snapshot of ``model`` (done by the first hook call if not before)."""
        if self.verifier is not None:
            return
        t0 = time.perf_counter()
        if self.reference is None:
            self.reference = ReferenceData.random(model, n=max(self.samples or 0, 8))
        self._structure = structure_key(model)
        n = self.samples or probe_samples(self.reference)
        ids = list(range(min(n, self.reference.num_samples)))
        self.verifier = Verifier(self._private_copy(model), self.reference, ids, near_tie_rtol=self.near_tie_rtol,
                                 private=True)
        self.verifier.reject_ties = self.reject_ties
        self.setup_seconds += time.perf_counter() - t0

    def close(self) -> None:
        """Drop the verifier (its cached tensor values and snapshot) and give the memory they held in onnxruntime's
        arena back (:func:`custom_ops.plan.release_arena`); the records stay. A later pass manager run starts a new
        one."""
        held = self.verifier is not None
        self.verifier, self._structure, self._stage_runs, self._copies = None, None, [], {}
        if held:
            release_arena()

    # -- checking ----------------------------------------------------------------------------------------------
    def verify(self, model: Model, policy: Policy, *, label: str, pass_name: str, stage: str | None = None,
               iteration: int | None = None, changed: bool = True, runs: Runs | None = None,
               pass_obj: Any = None) -> None:
        """Check ``model`` against the last verified version and move on to it; raise
        :class:`PassVerificationError`. ``runs``: the pass runs a stage check covers (replayed on a failure).
        ``pass_obj``: the pass checked, which
        healing (``heal``) re-applies without its failing rewrites; ``model`` is then edited in place."""
        self.start(model)
        key = structure_key(model)
        if not changed:
            if key == self._structure:
                return
            log.warning("%s reported no change but changed the graph; verifying it", label)
        self._structure = key
        v = self.verifier
        assert v is not None
        t0 = time.perf_counter()
        live, model = model, self._private_copy(model)
        outcome = self._outcome(model, policy)
        if not outcome.ok:
            if not isinstance(policy, Metric):
                self._raise_if_inherited(outcome, label, pass_name, stage, iteration)
            if runs is not None and len(runs) > 1:  # several passes checked at once: name the first failing one
                log.info("%s failed its check; replaying its %d pass run(s) to find the first failing one",
                         label, len(runs))
                healed = self._replay(runs, stage)  # raises the first failing run's error unless it heals it
                if healed is not None:
                    live.replace_ir(healed.ir)
                    self._structure = structure_key(live)
                    return
            elif self.heal and pass_obj is not None and not isinstance(policy, Metric) and self._heal(
                    live, pass_obj, policy, outcome, label, stage, iteration, t0):
                return
            raise self._error(model, outcome, policy, label, pass_name, stage, iteration)
        self._accept(model, outcome, policy.describe(), label, stage, iteration, pass_name, t0)

    def _outcome(self, model: Model, policy: Policy) -> CheckOutcome:
        """The check of ``model`` (a version no one else edits) against the last verified one: sampling, and the
        threshold proofs of the MultiThresholds it changed."""
        v = self.verifier
        assert v is not None
        outcome = v.check(model, policy)
        if outcome.ok and (proof := prove_changed_thresholds(v, model, outcome, policy)):
            outcome.ok, (outcome.message, outcome.node, outcome.tensor) = False, proof
        return outcome

    def _accept(self, model: Model, outcome: CheckOutcome, how: str, label: str, stage: str | None,
                iteration: int | None, pass_name: str, t0: float) -> None:
        """Move the verifier on to ``model`` (private) after a passing check, and record the check."""
        v = self.verifier
        assert v is not None
        v.accept(model, outcome, private=True)
        change = outcome.change
        self.records.append(CheckRecord(label, stage, iteration, how,
                                        len(change.nodes) if change else len(model),
                                        len(outcome.region) if change else len(model),
                                        time.perf_counter() - t0, outcome.near_ties, outcome.runs, pass_name))
        if outcome.near_ties:
            log.info("%s: %d float32 near-tie(s) accepted, e.g. %s", label, len(outcome.near_ties),
                     outcome.near_ties[0].describe())

    # -- healing and blame -------------------------------------------------------------------------------------
    def _heal(self, live: Model, p: Any, policy: Policy, failed: CheckOutcome, label: str,
              stage: str | None, iteration: int | None, t0: float) -> bool:
        """Make ``live`` the version before pass ``p`` plus the rewrites of ``p`` that pass the check (module
        docstring); False if that cannot be done (the failure is then raised as it is)."""
        v = self.verifier
        assert v is not None
        before = v.snapshot.model
        if isinstance(p, Rule):
            declined = frozenset(a for name, a in self.declined_keys if name == p.name)
            result = decline_bad_rewrites(p, before, lambda m: self._outcome(m, policy), declined=declined)
            if result is None:
                return False
            version = result.model
            found = [(anchor, match, bad) for anchor, match, bad in result.declined]
        else:  # not a Rule: the whole pass run is undone
            version = clone_model(before)
            found = [(WHOLE_PASS, None, failed)]
        model = self._private_copy(version)
        outcome = self._outcome(model, policy)
        if not outcome.ok:
            return False
        for anchor, match, bad in found:
            record = DeclinedRewrite(p.name, stage, iteration, anchor, match, bad.tensor, bad.node, bad.message)
            self.declined.append(record)
            self.declined_keys.add((p.name, anchor))
            log.info("verification declined a rewrite: %s", record.describe())
        live.replace_ir(version.ir)
        self._structure = structure_key(live)
        self._accept(model, outcome, policy.describe(), label, stage, iteration, p.name, t0)
        return True

    def _raise_if_inherited(self, outcome: CheckOutcome, label: str, pass_name: str, stage: str | None,
                            iteration: int | None) -> None:
        """Raise :class:`InheritedDeviation` if the version before the pass already computes the first diverging
        tensor differently from the cached (the original's) values on the failing sample, at the elements where the
        check fails (module docstring): elsewhere, such a difference is an accepted near-tie beside a wrong rewrite."""
        v = self.verifier
        assert v is not None
        tensor, sample = outcome.tensor, outcome.sample
        before = v.snapshot.model
        if tensor is None or sample is None or sample not in v.sample_ids or before.value(tensor) is None:
            return
        s = v.sample_ids.index(sample)
        if tensor not in v.values[s]:
            return
        cached = np.asarray(v.values[s][tensor])
        producer = before.find_producer(tensor)
        if producer is None:
            return
        try:  # the node before the pass, on the cached values of what it reads (as the checks run it)
            own = run_nodes(before, [producer], [v.values[s]], set(), constant_tensors(before))[0][tensor]
        except Exception as exc:  # noqa: BLE001 - no verdict on the before version: the failure stands as it is
            log.debug("could not run the version before %s: %s", label, exc)
            return
        if np.shape(own) != cached.shape or compare_tensor(
                tensor, np.asarray(own), cached, Equality(), integer=is_integer_tensor(before, tensor)).ok:
            return
        bad = outcome.elements
        if bad is not None and bad.size and np.array_equal(np.asarray(own, np.float64).reshape(-1)[bad],
                                                           cached.astype(np.float64).reshape(-1)[bad]):
            return  # where the check fails, the version before computes the cached values: the pass is at fault
        ids = ancestors([producer])
        upstream = {tensor} | {o.name for n in before.graph if id(n) in ids for o in n.outputs}
        culprit, ties = None, []
        for record in reversed(self.records):
            ties = [t for t in record.near_ties if t.tensor in upstream]
            if ties:
                culprit = record
                break
        here = f"{label}" + (f" (stage '{stage}'" + (f", round {iteration}" if iteration else "") + ")"
                             if stage and stage != pass_name else "")
        diff = np.flatnonzero(np.asarray(own, np.float64).reshape(-1) != cached.astype(np.float64).reshape(-1))
        text = (f"{here} is not at fault: before it, node '{producer.name}' already computes tensor '{tensor}' "
                f"differently from the original ({diff.size} element(s) on reference sample {sample}); ")
        if culprit is not None:
            where = f" (stage '{culprit.stage}'" + (f", round {culprit.iteration}" if culprit.iteration else "") + ")"
            text += (f"pass '{culprit.pass_name or culprit.label}'{where} accepted {len(ties)} float32 near-tie(s) "
                     f"there or upstream, e.g. {ties[0].describe()}; that acceptance does not hold further on: "
                     f"{outcome.message}")
        else:
            text += f"no earlier check accepted a near-tie there: {outcome.message}"
        raise InheritedDeviation(text, checked_pass=pass_name, ties=ties,
                                 pass_name=(culprit.pass_name or culprit.label) if culprit else pass_name,
                                 stage=culprit.stage if culprit else stage,
                                 iteration=culprit.iteration if culprit else iteration, node=outcome.node,
                                 tensor=tensor, max_error=outcome.max_error, sample=sample)

    def _private_copy(self, model: Model) -> Model:
        """A structural copy of ``model`` that the passes cannot change: it shares the immutable initializers
        (frozen arrays, tensors read from the file, compact depthwise weights:
        :func:`finnlite.core.tensors.is_immutable`);
        a writable one (set through onnx_ir, not :meth:`Model.set_initializer`) is copied and frozen, and the copy is
        reused while the array's bytes stay the same (crc32), so that an edit in place shows as a new version."""
        version = clone_model(model)
        for value in version.graph.initializers.values():
            t = value.const_value
            if t is None or is_immutable(t):
                continue
            arr = t.numpy()
            crc = content_crc(arr)
            known = self._copies.get(id(t))
            if known is None or known[0] is not t or known[1] != crc:
                known = (t, crc, ir.tensor(freeze(np.array(arr)), name=t.name))
                self._copies[id(t)] = known
            value.const_value = known[2]
        return version

    def _replay(self, runs: Runs, stage: str | None) -> Model | None:
        """Apply ``runs`` one by one to a copy of the last verified version, checking each now: raises the first
        failing one's :class:`PassVerificationError` (the copy is the verifier's; nothing else changes). With
        ``heal``, a failing run is healed instead and the replay goes on; the healed version is returned."""
        assert self.verifier is not None
        base = clone_model(self.verifier.snapshot.model)
        for p, pol, iteration in runs:
            declined = self.manager.declined_anchors(p) if self.manager is not None else frozenset()
            if declined is None:
                continue
            p.run(base, declined)
            self.verify(base, pol, label=f"pass '{p.name}'", pass_name=p.name, stage=stage, iteration=iteration,
                        pass_obj=p)
        return base if self.heal else None

    def _per_stage(self, stage: Any) -> bool:
        """True if ``stage``'s passes are checked together at its end."""
        return bool(getattr(stage, "check_whole", False))

    def _check_stage(self, model: Model, stage: Any) -> None:
        """Check everything the passes recorded since the last check did, at once (replayed on a failure)."""
        runs, self._stage_runs = self._stage_runs, []
        name = getattr(stage, "name", "?")
        policy = _union_policy([pol for _, pol, _ in runs], resolve_policy(None, stage, self.policy))
        self.verify(model, policy, label=f"stage '{name}'", pass_name=name, stage=name, runs=runs)

    # -- the hook protocol -------------------------------------------------------------------------------------
    def before_run(self, manager: Any, model: Model) -> None:
        """The pass manager starts: its ``declined`` set becomes the one healing adds to (what was declined before
        is kept in it)."""
        self.manager = manager
        manager.declined |= self.declined_keys
        self.declined_keys = manager.declined

    def before_stage(self, stage: Any, model: Model) -> None:
        self.start(model)
        self._stage_runs = []

    def before_pass(self, p: Any, model: Model, stage: Any) -> None:
        self.start(model)

    def after_pass(self, p: Any, model: Model, stage: Any, record: Any) -> None:
        policy = resolve_policy(p, stage, self.policy)
        iteration = getattr(record, "iteration", None)
        # in a stage checked as a whole every pass waits for its end: checking the states between alone would run
        # lowered depthwise MatMuls outside their fused Conv, on dense block-diagonal matrices (finnlite.core.tensors)
        if self._per_stage(stage) and not isinstance(policy, Metric):
            self._stage_runs.append((p, policy, iteration))
            return
        if self._stage_runs:  # a metric pass inside a deferred stage: check what came before it first
            self._check_stage(model, stage)
        self.verify(model, policy, label=f"pass '{p.name}'", pass_name=p.name, stage=getattr(stage, "name", None),
                    iteration=iteration, changed=bool(getattr(record, "changed", True)), pass_obj=p)

    def after_stage(self, stage: Any, model: Model) -> None:
        if self._per_stage(stage) and self._stage_runs:
            self._check_stage(model, stage)

    def on_error(self, exc: BaseException) -> None:
        """The pipeline failed: the runs of a stage waiting for its end-of-stage check are dropped."""
        self._stage_runs = []

    def _error(self, model: Model, outcome: CheckOutcome, policy: Policy, label: str, pass_name: str,
               stage: str | None, iteration: int | None) -> PassVerificationError:
        """The error for a failed check, with the models before and after saved."""
        assert self.verifier is not None
        self._failures += 1
        folder = self.save_dir or Path(tempfile.mkdtemp(prefix="finnlite-verify-", dir=os.environ.get(SAVE_DIR_ENV)))
        self.save_dir = folder
        folder.mkdir(parents=True, exist_ok=True)
        stem = folder / f"{self._failures:03d}_{_safe(pass_name)}"
        before_path, after_path = f"{stem}_before.onnx", f"{stem}_after.onnx"
        saved = True
        try:
            self.verifier.snapshot.model.save(before_path)
            model.save(after_path)
        except Exception as exc:  # noqa: BLE001 - a broken graph may not serialize; the error still stands
            saved = False
            log.warning("could not save the models of the failing check: %s", exc)
        where = ""
        if stage and stage != pass_name:
            where = f" (stage '{stage}'" + (f", round {iteration}" if iteration else "") + ")"
        text = f"{label}{where} broke equivalence under {policy.describe()}: {outcome.message}"
        if saved:
            text += f"; models before and after saved to {before_path} and {after_path}"
        return PassVerificationError(text, pass_name=pass_name, stage=stage, iteration=iteration, node=outcome.node,
                                     tensor=outcome.tensor, max_error=outcome.max_error, sample=outcome.sample,
                                     before_path=before_path if saved else None,
                                     after_path=after_path if saved else None)

    def final_check(self, model: Model, **kwargs: Any) -> Any:
        """Compare ``model`` with the original on every reference sample (see :func:`verify.final.final_check`)."""
        if self.reference is None:
            raise VerificationError("no reference data: the hook never ran")
        return final_check(self.reference, model, **kwargs)

    def summary(self) -> str:
        """One line: checks, time, near-ties."""
        text = (f"verification: {len(self.records)} checks, {self.seconds:.2f} s "
                f"(setup {self.setup_seconds:.2f} s), {len(self.near_ties)} float32 near-tie(s) accepted")
        return text + (f", {len(self.declined)} rewrite(s) declined" if self.declined else "")
