"""Per-pass verification: a :class:`finnlite.passes.PassManager` hook that checks every pass that changed the model.

A pass that reports no change is not checked (a cheap structural key confirms it changed nothing); after any other
pass the :class:`~verify.verifier.Verifier` compares the new model version with the cached one, only where it
changed (see :mod:`verify.verifier`), under the policy the pass (or its stage) declares. On a mismatch the hook
saves the models before and after the pass and raises :class:`PassVerificationError` naming the pass, the first
diverging tensor and its producing node, the largest error and the files. Float32 near-ties (:mod:`verify.ties`)
are accepted and logged with their margins.

By default the checks run in the background, so that they overlap the next passes, and the pipeline goes on: in a
forked worker process where that is supported (``background="process"``; Linux with two CPUs or more, see
:mod:`verify.worker`), which receives each changed version serialized without the initializers it holds already;
else on a thread (``background="thread"``), which receives a private structural copy of each changed version (the
copies share the initializer arrays, which :meth:`finnlite.Model.set_initializer` freezes). A failure is raised at
the next pass boundary, or when the run ends (:meth:`VerificationHook.after_run`), still naming the pass that broke
equivalence; if the pipeline itself fails first, the hook reports a pending verification failure ahead of that
error (:meth:`VerificationHook.on_error`). ``background=False`` checks each pass before the next one starts. In the
worker process the checks run exactly as in this one (the same :class:`VerificationHook` code, forked); their
records, near-ties, log messages and failures come back to this process.

Coalescing (``coalesce=True``, the default, in the background): while earlier checks are still running or queued,
the next passes of the same stage under the same policy are held instead of being sent one by one (no copy, no
message, no structural key per pass); when the checks have caught up, or the held runs took :data:`HOLD_SECONDS`
together, or before a pass that cannot join them (another policy, a metric, a pass that does not pickle), or at the
stage's end, the version after the held runs is checked at once, under their common policy. The time limit keeps
groups to quick passes, which make small changes: a check's fixed part (sending the version, building an executor
for the region) is then most of its cost, and one check instead of several saves it. Long passes move scales across
many layers; checked together, their changes make many more tensors differ from the cached values than each does
alone, and one check of all of them costs more than their checks one by one (ResNet-18's streamline stage as one
check: 470 ms against 160 ms). Per-pass ratios on the zoo, medians of 9 rounds, without coalescing and with it:
tfc_1w1a 2.80 -> 2.08, cnv_2w2a 1.62 -> 1.48, resnet18 1.89 -> 1.68, mobilenet 1.44 -> 1.42. If that check fails,
the held runs are replayed one at a time from the last verified version, each checked on its own, so that the error
names the first failing pass, as for a stage check; if the pipeline fails while runs are held, they are replayed and
checked the same way before its error is raised. A held check's record is labelled ``passes 'A', 'B'`` (those that
changed the model). How many passes a check covers depends on how far behind the checks were, so it varies from run
to run; every pass is covered.
"""

from __future__ import annotations

import logging
import os
import pickle
import re
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx_ir as ir

from custom_ops.plan import release_memory
from finnlite.errors import VerificationError
from finnlite.memory import anonymous_memory
from finnlite.model import Model, freeze
from finnlite.tensors import content_crc, is_immutable
from verify.clone import clone_model
from verify.policies import DEFAULT_POLICY, Equality, Metric, Policy, Tolerance, resolve_policy
from verify.reference import ReferenceData
from verify.region import structure_key
from verify.ties import DEFAULT_NEAR_TIE_RTOL, NearTie
from verify.verifier import CheckOutcome, Verifier
from verify.worker import VersionReceiver, VersionSender, Worker, process_supported, replay_logs

log = logging.getLogger(__name__)

__all__ = ["VerificationHook", "PassVerificationError", "CheckRecord", "probe_samples", "PROBE_ELEMENTS"]


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


@dataclass
class _Failure:
    """A failed check, kept until it is raised: the version checked and everything the error names."""

    version: Model
    outcome: CheckOutcome
    policy: Policy
    label: str
    pass_name: str
    stage: str | None
    iteration: int | None
    runs: list[tuple[Any, Policy, int | None]] | None


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
    #: the pass the check is of, the stage for a stage check, or "A, B" for passes checked together
    pass_name: str = ""


#: environment variable naming the folder under which failing checks save their models (default: the system's
#: temporary folder)
SAVE_DIR_ENV = "FINNLITE_VERIFY_DIR"

#: coalescing holds pass runs until they took this long together (seconds; see the module docstring)
HOLD_SECONDS = 0.005
#: the worker process gives memory back after a check once its anonymous memory grew by this much since it last did
#: (:meth:`VerificationHook._give_back`)
RELEASE_BYTES = 4 << 20

#: the per-pass checks use enough reference samples for about this many input values (at least 1, at most 8)
PROBE_ELEMENTS = 16384


def probe_samples(reference: ReferenceData) -> int:
    """How many samples of ``reference`` the per-pass checks use by default (see :data:`PROBE_ELEMENTS`)."""
    per_sample = sum(int(a.size) for a in reference.sample(0).values())
    return max(1, min(8, PROBE_ELEMENTS // max(per_sample, 1)))


def _pickled(runs: list[tuple[Any, Policy, int | None]] | None) -> bytes | None:
    """A stage check's pass runs for the worker process (replayed there on a failure), or None if they do not
    pickle (a failing stage is then reported without naming its pass)."""
    if runs is None:
        return None
    try:
        return pickle.dumps(runs)
    except Exception as exc:  # noqa: BLE001 - a pass holding a lambda, a lock, ...
        log.warning("the passes of a stage check cannot be sent to the verification worker (%s); a failure of the "
                    "stage will not name its pass", exc)
        return None


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


def _load_check_libraries() -> None:
    """Import what the checks run — the executor with its lowerings, and onnxruntime — in this process before a
    worker is forked, so that the worker has them as forked. Otherwise every worker imports them itself (about
    60 ms, mostly onnxruntime), which a short pipeline does not cover: tfc_1w1a's per-pass ratio was 4.4x instead
    of 2.9x where the caller had not run the executor before (the command always has: the reference outputs)."""
    import onnxruntime  # noqa: F401

    import custom_ops.executor  # noqa: F401


class VerificationHook:
    """A pass-manager hook verifying each pass that changed the model (``granularity="pass"``, the default) against
    cached reference values. ``"stage"`` checks what a whole stage changed at once and, on a failure, replays the
    stage's passes one by one from the last verified version to name the first failing pass (cheaper only when the
    passes keep tensor names for unchanged values); ``"off"`` disables it. With ``"pass"``, a stage that declares
    ``granularity="stage"`` (:class:`finnlite.passes.Stage`) is still checked as a whole; ``"every-pass"`` checks
    every pass on its own regardless.

    ``reference``: a :class:`ReferenceData` built from the original model (default: 8 random samples in [-1, 1]
    drawn when the first stage starts). ``samples``: how many of its samples the per-pass checks use (default:
    enough for about :data:`PROBE_ELEMENTS` input values, between 1 and 8: one image of an ImageNet network, eight
    MNIST digits). ``policy``: the default for passes and stages that declare none. ``save_dir``: where failing
    models are written (a new temporary folder by default, under ``$FINNLITE_VERIFY_DIR`` if set). After the run,
    ``records`` lists the checks and ``near_ties`` the accepted float32 near-ties; :meth:`final_check` compares the
    result with the original on all reference samples. ``background``: ``True`` (a worker process where supported,
    else a thread), ``"process"``, ``"thread"`` or ``False`` (module docstring). With a worker process,
    ``verifier`` stays None in this process. ``coalesce`` (with ``granularity="pass"`` in the background): while
    the earlier checks still run, the next passes of a stage under the same policy are not checked one by one but
    held, and checked together once the checks caught up (module docstring)."""

    def __init__(self, reference: ReferenceData | None = None, *, samples: int | None = None,
                 policy: Policy = DEFAULT_POLICY, granularity: str = "pass", save_dir: str | Path | None = None,
                 near_tie_rtol: float = DEFAULT_NEAR_TIE_RTOL, background: bool | str = True,
                 coalesce: bool = True) -> None:
        if granularity not in ("pass", "every-pass", "stage", "off"):
            raise ValueError(f"granularity must be 'pass', 'every-pass', 'stage' or 'off', not {granularity!r}")
        if background not in (True, False, "thread", "process"):
            raise ValueError(f"background must be True, False, 'thread' or 'process', not {background!r}")
        self.reference = reference
        self.samples = samples
        self.policy = policy
        self.granularity = granularity
        self.save_dir = Path(save_dir) if save_dir is not None else None
        self.near_tie_rtol = near_tie_rtol
        self.background = background
        self.coalesce = coalesce
        self.verifier: Verifier | None = None
        self._records: list[CheckRecord] = []
        self._stage_runs: list[tuple[Any, Policy, int | None]] = []
        #: the pass runs held while the checks ran behind (coalescing): (pass, policy, round, changed), one stage
        self._held: list[tuple[Any, Policy, int | None, bool]] = []
        self._held_stage: str | None = None
        self._held_seconds = 0.0  # the time the held runs took
        self.setup_seconds = 0.0
        self._failures = 0
        self._started = False
        self._structure: int | None = None  # structure_key of the last version handed to the checks
        self._failure: _Failure | None = None  # the first failing check, not raised yet
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []
        self._lock = threading.Lock()
        self._copies: dict[int, tuple[Any, int, Any]] = {}  # frozen copies of writable initializers (_private_copy)
        self._worker: Worker | None = None  # the worker process (background="process")
        self._sender: VersionSender | None = None  # what the worker process holds, and each version for it
        self._remote: BaseException | None = None  # the first failure or error the worker process reported
        self._child: tuple[Model, dict[int, Any]] | None = None  # in the worker: the first version, its tensors
        self._receiver: VersionReceiver | None = None  # in the worker: the versions rebuilt from the messages
        self._released = 0  # in the worker: its anonymous memory after it last gave memory back
        #: the worker process's peak memory of its own (beyond the pages it shares with this process), in bytes,
        #: known once :meth:`close` stopped it (None without a worker process, or if unreadable)
        self.worker_memory: int | None = None

    @property
    def in_process(self) -> bool:
        """True if the checks run in a worker process: ``background="process"`` where processes can fork, or
        ``True`` where a worker is supported (:func:`verify.worker.process_supported`)."""
        if self.background == "process":
            return hasattr(os, "fork")
        return self.background is True and process_supported()

    # -- state -------------------------------------------------------------------------------------------------
    @property
    def records(self) -> list[CheckRecord]:
        """The checks made so far (waits for the running ones)."""
        self.wait(raise_failure=False)
        return self._records

    @property
    def near_ties(self) -> list[NearTie]:
        """Every near-tie accepted so far."""
        return [t for r in self.records for t in r.near_ties]

    @property
    def seconds(self) -> float:
        """Time spent verifying (setup included; in the background, overlapping the passes)."""
        return self.setup_seconds + sum(r.seconds for r in self.records)

    def start(self, model: Model) -> None:
        """Take the reference values and the snapshot of ``model`` (done by the first hook call if not before)."""
        if self._started:
            return
        self._started = True
        if self.reference is None:
            self.reference = ReferenceData.random(model, n=max(self.samples or 0, 8))
        self._structure = structure_key(model)
        if self.in_process:
            _load_check_libraries()
            # the worker takes ``model`` as it is when forked: later edits here are not its (copy on write)
            self._sender = VersionSender()
            self._child = (model, self._sender.register(model))
            try:
                self._worker = Worker(self._serve)
            except OSError as exc:  # no fork possible now (process or memory limits): a thread does the checks
                log.warning("cannot start the verification worker process (%s); checking on a thread", exc)
                self.background, self._sender = "thread", None
            self._child = None
            if self._worker is not None:
                self._worker.send(("start",))
                # the worker has the original's precomputed tensor values (its cache to be); this process does not
                # need them, and they would stay in its peak for the whole run (MobileNet-v1: 115 MB for one image)
                self.reference.forget_values()
                release_memory()
                return
        self._run(self._start, self._private_copy(model))

    def _start(self, version: Model) -> None:
        t0 = time.perf_counter()
        assert self.reference is not None
        n = self.samples or probe_samples(self.reference)
        ids = list(range(min(n, self.reference.num_samples)))
        self.verifier = Verifier(version, self.reference, ids, near_tie_rtol=self.near_tie_rtol, private=True)
        self.setup_seconds += time.perf_counter() - t0

    # -- running the checks ------------------------------------------------------------------------------------
    def _run(self, task: Callable[..., None], *args: Any) -> None:
        """Run ``task`` now, or queue it on the worker thread (tasks run one at a time, in order)."""
        if not self.background:
            task(*args)
            self.raise_failure()
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="finnlite-verify")
        with self._lock:
            self._pending.append(self._pool.submit(task, *args))
        if self._failure is not None:  # an earlier check failed: stop here rather than at the end
            self.wait()

    def wait(self, raise_failure: bool = True) -> None:
        """Wait for the queued checks; then raise the first failure (:class:`PassVerificationError`), if any and
        ``raise_failure``. An unexpected error inside a check is re-raised as it is."""
        if self._worker is not None:
            self._collect(block=True)
        while True:
            with self._lock:
                pending, self._pending = self._pending, []
            if not pending:
                break
            for fut in pending:
                fut.result()
        if raise_failure:
            self.raise_failure()

    def raise_failure(self) -> None:
        """Raise the first failing check's :class:`PassVerificationError` (saving its models), if there is one."""
        remote, self._remote = self._remote, None
        if remote is not None:
            raise remote
        failure, self._failure = self._failure, None
        if failure is None:
            return
        error = self._error(failure)  # saves the models while the verifier still holds the version before
        if failure.runs is not None:  # several passes checked at once: replay them to name the first failing one
            log.info("%s failed its check; replaying its %d pass run(s) to find the first failing one",
                     failure.label, len(failure.runs))
            self._replay(failure.runs, failure.stage)
        raise error

    def close(self) -> None:
        """Wait for the checks, then drop the verifier (its cached tensor values and snapshot); the records stay.
        A later pass manager run starts a new one. Pass runs still held (a driver that did not end its stage) are
        checked first, by replaying them."""
        if self._held and self._started:
            self._replay_held()
        self.wait(raise_failure=False)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._worker is not None:
            self.worker_memory = self._worker.stop()
            self._worker, self._sender = None, None
        self.verifier, self._started, self._structure, self._copies = None, False, None, {}
        release_memory()  # the verifier's cached tensors and the checks' intermediates

    def after_run(self, model: Model, report: Any = None) -> None:
        """The pipeline finished: check what is still held, wait for the last checks and raise a failure."""
        if self._held:
            self._release(model)
        self.wait()

    def on_error(self, exc: BaseException) -> None:
        """The pipeline failed: if a check of an earlier pass fails (waiting for the queued ones), raise that
        instead, since the broken rewrite is the likelier cause. Nothing is waited for on an interrupt."""
        if not isinstance(exc, Exception):
            self._take_held()
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool, self._pending = None, []
            if self._worker is not None:
                self._worker.kill()
                self._worker, self._sender = None, None
            return
        if isinstance(exc, PassVerificationError):
            return
        try:
            self.wait()
            self._replay_held()
            self.wait()
        except PassVerificationError as failure:
            raise failure from exc

    def _replay_held(self) -> None:
        """After a failed pass (the model may be half rewritten): check the held runs that changed the model by
        replaying them from the last verified version (in the background; :meth:`wait` for the result)."""
        held, stage = self._take_held()
        if not any(changed for _, _, _, changed in held):
            return
        runs = [(p, pol, iteration) for p, pol, iteration, _ in held]
        if self._worker is not None:
            self._worker.send(("replay", pickle.dumps(runs), stage))
        else:
            self._run(self._replay, runs, stage)

    # -- the hook protocol -------------------------------------------------------------------------------------
    def before_stage(self, stage: Any, model: Model) -> None:
        if self.granularity != "off":
            self.start(model)
        self._stage_runs = []

    def before_pass(self, p: Any, model: Model, stage: Any) -> None:
        if self.granularity == "off":
            return
        self.start(model)
        if self._held and not (self._may_hold(p, resolve_policy(p, stage, self.policy), stage) and self._behind()):
            self._release(model)  # the held runs are checked now, before ``p`` changes the model

    def after_pass(self, p: Any, model: Model, stage: Any, record: Any) -> None:
        if self.granularity == "off":
            return
        policy = resolve_policy(p, stage, self.policy)
        iteration = getattr(record, "iteration", None)
        if self._per_stage(stage) and not isinstance(policy, Metric):
            self._stage_runs.append((p, policy, iteration))
            if p.name in getattr(stage, "check_after", ()):
                self._check_deferred(model, stage, upto=p.name)
            return
        if self._stage_runs:  # a metric pass inside a deferred stage: check what came before it first
            self._check_deferred(model, stage)
        changed = bool(getattr(record, "changed", True))
        if self._held or (self._may_hold(p, policy, stage) and self._behind()):
            # (with runs held already, before_pass made sure that this one may join them)
            self._held.append((p, policy, iteration, changed))
            self._held_stage = getattr(stage, "name", None)
            self._held_seconds += getattr(record, "seconds", 0.0)
            if not self._behind():
                self._release(model)
            return
        self.verify(model, policy, label=f"pass '{p.name}'", pass_name=p.name, stage=getattr(stage, "name", None),
                    iteration=iteration, changed=changed)

    def after_stage(self, stage: Any, model: Model) -> None:
        if self._held:
            self._release(model)
        if self._per_stage(stage) and self._stage_runs:
            self._check_deferred(model, stage)

    # -- coalescing: holding pass runs while the checks run behind ------------------------------------------------
    def _behind(self) -> bool:
        """True if earlier checks are still running or queued (background checks only)."""
        if self._worker is not None:
            self._collect(block=False)
            return self._worker.pending > 0
        if not self.background:
            return False
        with self._lock:
            return any(not f.done() for f in self._pending)

    def _may_hold(self, p: Any, policy: Policy, stage: Any) -> bool:
        """True if the run of ``p`` may be held with the runs held now: coalescing is on, the checks run in the
        background one pass at a time, ``policy`` is not a metric and is the held runs' policy, the stage is theirs,
        they took less than :data:`HOLD_SECONDS`, and (for the worker process, which replays them on a failure)
        ``p`` pickles."""
        if not (self.coalesce and self.granularity == "pass" and self.background) or isinstance(policy, Metric):
            return False
        if self._held and (policy != self._held[0][1] or getattr(stage, "name", None) != self._held_stage
                           or self._held_seconds >= HOLD_SECONDS):
            return False
        if self._worker is not None:
            try:
                pickle.dumps(p)
            except Exception:  # noqa: BLE001 - a pass holding a lambda, a lock, ...: checked on its own
                return False
        return True

    def _take_held(self) -> tuple[list[tuple[Any, Policy, int | None, bool]], str | None]:
        """The held runs and their stage, no longer held."""
        held, stage = self._held, self._held_stage
        self._held, self._held_stage, self._held_seconds = [], None, 0.0
        return held, stage

    def _release(self, model: Model) -> None:
        """Check the held runs together on ``model`` (the version after the last of them), under their policy,
        named after the passes that changed the model (all of them if none said so); on a failure they are
        replayed one by one from the last verified version to name the first failing pass (as for a stage check)."""
        held, stage = self._take_held()
        changed = [h for h in held if h[3]]
        named = changed or held
        names = list(dict.fromkeys(p.name for p, _, _, _ in named))
        label = f"pass '{names[0]}'" if len(names) == 1 else "passes " + ", ".join(f"'{n}'" for n in names)
        runs = [(p, pol, iteration) for p, pol, iteration, _ in held] if len(held) > 1 else None
        self.verify(model, held[0][1], label=label, pass_name=", ".join(names), stage=stage,
                    iteration=named[-1][2] if len(named) == 1 else None, changed=bool(changed), runs=runs)

    def _replay(self, runs: list[tuple[Any, Policy, int | None]], stage: str | None) -> None:
        """Apply ``runs`` one by one to a copy of the last verified version, checking each now: raises the first
        failing one's :class:`PassVerificationError` (the copy is the verifier's; nothing else changes)."""
        assert self.verifier is not None
        base = clone_model(self.verifier.snapshot.model)
        background, self.background = self.background, False
        try:
            for p, pol, iteration in runs:
                p.apply(base)
                self.verify(base, pol, label=f"pass '{p.name}'", pass_name=p.name, stage=stage, iteration=iteration,
                            changed=True)
        finally:
            self.background = background

    # -- deferred (per-stage) checking -------------------------------------------------------------------------
    def _per_stage(self, stage: Any) -> bool:
        """True if ``stage``'s passes are checked together at its end."""
        if self.granularity in ("stage", "every-pass"):
            return self.granularity == "stage"
        return getattr(stage, "granularity", None) == "stage"

    def _check_deferred(self, model: Model, stage: Any, upto: str | None = None) -> None:
        """Check everything the passes recorded since the last check did, at once; on a failure, replay them one by
        one from the last checked version to name the first failing pass (:meth:`raise_failure`). ``upto``: the
        pass of a ``check_after`` checkpoint that triggered the check (None at the stage's end)."""
        runs, self._stage_runs = self._stage_runs, []
        name = getattr(stage, "name", "?")
        policy = _union_policy([pol for _, pol, _ in runs], resolve_policy(None, stage, self.policy))
        label = f"stage '{name}'" + (f" up to '{upto}'" if upto else "")
        self.verify(model, policy, label=label, pass_name=name, stage=name, runs=runs)

    def verify(self, model: Model, policy: Policy, *, label: str, pass_name: str, stage: str | None = None,
               iteration: int | None = None, changed: bool = True,
               runs: list[tuple[Any, Policy, int | None]] | None = None) -> None:
        """Check ``model`` against the last verified version and move on to it (on the worker thread in the
        background mode; :meth:`wait` for the result); raise :class:`PassVerificationError`. ``runs``: the pass
        runs a stage check covers (replayed on a failure)."""
        self.start(model)
        key = structure_key(model)
        if not changed:
            if key == self._structure:
                return
            log.warning("%s reported no change but changed the graph; verifying it", label)
        self._structure = key
        if self._worker is not None:
            assert self._sender is not None
            message, buffers = self._sender.encode(model)
            request = ("check", message, policy, label, pass_name, stage, iteration, _pickled(runs))
            self._worker.send(request, buffers)
            self._collect(block=False)
            if self._remote is not None:  # an earlier check failed: stop here rather than at the end
                self.wait()
            return
        self._run(self._check, self._private_copy(model), policy, label, pass_name, stage, iteration, runs)

    def _private_copy(self, model: Model) -> Model:
        """A structural copy of ``model`` that the passes cannot change: it shares the immutable initializers
        (frozen arrays, tensors read from the file, compact depthwise weights: :func:`finnlite.tensors.is_immutable`);
        a writable one (set through onnx_ir, not :meth:`Model.set_initializer`) is
        copied and frozen, and the copy is reused while the array's bytes stay the same (crc32), so that an edit
        in place shows as a new version of that initializer."""
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

    def _check(self, version: Model, policy: Policy, label: str, pass_name: str, stage: str | None,
               iteration: int | None, runs: list[tuple[Any, Policy, int | None]] | None) -> None:
        if self._failure is not None:  # checks after a failure would compare against the wrong version
            return
        v = self.verifier
        assert v is not None
        t0 = time.perf_counter()
        outcome = v.check(version, policy)
        if not outcome.ok:
            self._failure = _Failure(version, outcome, policy, label, pass_name, stage, iteration, runs)
            return
        v.accept(version, outcome, private=True)
        change = outcome.change
        changed = len(change.nodes) if change else len(version)
        ran = len(outcome.region) if change else len(version)
        self._records.append(CheckRecord(label, stage, iteration, policy.describe(), changed, ran,
                                         time.perf_counter() - t0, outcome.near_ties, outcome.runs, pass_name))
        if outcome.near_ties:
            log.info("%s: %d float32 near-tie(s) accepted, e.g. %s", label, len(outcome.near_ties),
                     outcome.near_ties[0].describe())

    # -- the worker process ------------------------------------------------------------------------------------
    def _collect(self, block: bool) -> None:
        """Take in the worker process's replies (all pending ones if ``block``): records, log messages, the first
        failure (kept in ``_remote`` to be raised)."""
        assert self._worker is not None
        for reply, logs in self._worker.replies(block):
            replay_logs(logs)
            kind = reply[0]
            if kind == "started":
                self.setup_seconds += reply[1]
            elif kind == "checked":
                records, failure, save_dir = reply[1:]
                self._records.extend(records)
                if save_dir is not None:
                    self.save_dir = Path(save_dir)
                if failure is not None and self._remote is None:
                    message, fields = failure
                    self._remote = PassVerificationError(message, **fields)
            elif self._remote is None:  # ("error", exception): a check raised something unexpected
                self._remote = reply[1]

    def _serve(self, request: tuple, buffers: list[np.ndarray]) -> tuple:
        """In the worker process: start the verifier on the first version, or check one version (sent without the
        tensors the worker holds) as :meth:`verify` does in-process, replaying a stage's passes on a failure."""
        if request[0] == "start":
            assert self._child is not None
            first, store = self._child
            self._child, self.background = None, False
            self._receiver = VersionReceiver(store)
            self._released = anonymous_memory()
            self._start(first)
            self._give_back()  # the reference run's executor and intermediates, if it ran here
            return ("started", self.setup_seconds)
        done = len(self._records)
        failure = None
        try:
            if request[0] == "replay":  # held runs, after the pipeline failed: each checked on its own
                _, runs, stage = request
                self._replay(pickle.loads(runs), stage)
            else:
                _, message, policy, label, pass_name, stage, iteration, runs = request
                assert self._receiver is not None
                version = self._receiver.decode(message, buffers)
                self._check(version, policy, label, pass_name, stage, iteration,
                            pickle.loads(runs) if runs is not None else None)
                self.raise_failure()
        except PassVerificationError as exc:
            failure = (exc.message, {"pass_name": exc.pass_name, "stage": exc.stage, "iteration": exc.iteration,
                                     "node": exc.node, "tensor": exc.tensor, "max_error": exc.max_error,
                                     "sample": exc.sample, "before_path": exc.before_path,
                                     "after_path": exc.after_path})
        self._give_back()
        return ("checked", self._records[done:], failure, str(self.save_dir) if self.save_dir else None)

    def _give_back(self) -> None:
        """In the worker process, after its set-up and after each check: give what the checks' executors left in
        onnxruntime's arena and the C heap back (:func:`custom_ops.plan.release_memory`), so that the next check's
        allocations do not stack on it (the worker's peak: resnet18 254 -> 180 MB, cnv_1w1a 58 -> 46 MB), once its
        anonymous memory has grown by :data:`RELEASE_BYTES` since it last did. Below that there is little to give
        back, and what is given back costs the next check page faults to touch again (about 2 µs a page here): tfc's
        checks never reach it, and its per-pass ratio goes from 2.15-2.25 to 2.07-2.14 (3 runs of 25 rounds; worker
        peak: cnv_1w1a 2 MB more, resnet18 and MobileNet-v1 the same)."""
        if anonymous_memory() - self._released >= RELEASE_BYTES:
            release_memory()
            self._released = anonymous_memory()

    def _error(self, failure: "_Failure") -> "PassVerificationError":
        """The error for a failed check, with the models before and after saved."""
        assert self.verifier is not None
        model, outcome, policy = failure.version, failure.outcome, failure.policy
        label, pass_name, stage, iteration = failure.label, failure.pass_name, failure.stage, failure.iteration
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
        from verify.final import final_check

        if self.reference is None:
            raise VerificationError("no reference data: the hook never ran")
        self.wait()
        return final_check(self.reference, model, **kwargs)

    def summary(self) -> str:
        """One line: checks, time, near-ties."""
        return (f"verification: {len(self.records)} checks, {self.seconds:.2f} s "
                f"(setup {self.setup_seconds:.2f} s), {len(self.near_ties)} float32 near-tie(s) accepted")
