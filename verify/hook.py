"""Per-pass verification: a :class:`finnlite.passes.PassManager` hook that checks every pass that changed the model.

How it stays cheap without missing a wrong rewrite:

* It keeps a *cache*: the value of every tensor of the current model on a few reference samples (computed once, on
  the original, by the oracle), and a snapshot of the model (an O(nodes) structural clone).
* A pass that reports no change is not checked (a cheap structural fingerprint confirms it changed nothing).
* After a pass that changed something, the nodes whose signature (op, attributes, tensor names, initializer
  contents) is new form the *region* (:mod:`verify.region`). Only the region is run, on the cached values of the
  tensors it reads; the tensors it hands on to the unchanged rest of the graph (and the graph outputs) must match
  their cached values under the pass's policy (:mod:`verify.policies`). Everything outside the region computes
  what it computed before on the same inputs, so nothing else can have changed.
* Boundary tensors keep their cached values (the cache is anchored to the original model's values, so tolerances
  never accumulate from pass to pass); tensors new inside the region get the values the region computed.
* A :class:`~verify.policies.Metric` policy is global: the whole model is run on the metric's data and the cache is
  rebuilt.

On a mismatch the hook finds the first diverging tensor inside the region (in topological order, matching tensors
of the two versions by name), saves the models before and after the pass, and raises
:class:`PassVerificationError` naming the pass, the tensor, its producing node, the largest error and the files.
Float32 near-ties (:mod:`verify.ties`) are accepted and logged with their margins.
"""

from __future__ import annotations

import logging
import re
from collections import ChainMap
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from finnlite.errors import FinnliteError, VerificationError
from finnlite.model import Model
from verify.compare import TensorDiff, compare_tensor, is_integer_tensor, quant_step
from verify.policies import DEFAULT_POLICY, Metric, Policy, resolve_policy
from verify.reference import ReferenceData
from verify.region import (Change, Fingerprints, Snapshot, ancestors, constant_tensors, descendants, find_change, hull,
                           node_label, node_signature, run_nodes, structure_key, topo_order)
from verify.ties import DEFAULT_NEAR_TIE_RTOL, QUANTIZER_OPS, NearTie, split_near_ties

log = logging.getLogger(__name__)

__all__ = ["VerificationHook", "PassVerificationError", "CheckRecord", "Verifier", "CheckOutcome", "probe_samples",
           "PROBE_ELEMENTS"]


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


@dataclass
class CheckOutcome:
    """The result of checking one model version against the cached one (see :meth:`Verifier.check`)."""

    ok: bool
    change: Change | None = None
    results: list[dict[str, np.ndarray]] = field(default_factory=list)
    near_ties: list[NearTie] = field(default_factory=list)
    message: str = ""
    node: str | None = None
    tensor: str | None = None
    max_error: float | None = None
    sample: int | None = None
    metric_values: list[dict[str, np.ndarray]] | None = None
    layouts: dict[str, tuple[int, ...]] = field(default_factory=dict)
    #: the nodes that were run (the changed ones, widened where changed values reach unchanged nodes)
    region: list[Any] = field(default_factory=list)
    #: tensors whose cached values stay (they matched: the cache keeps the original's values)
    keep: set[str] = field(default_factory=set)
    #: how many times the region was run (more than once when changed values had to be propagated)
    runs: int = 0


#: the per-pass checks use enough reference samples for about this many input values (at least 1, at most 8)
PROBE_ELEMENTS = 16384


def probe_samples(reference: ReferenceData) -> int:
    """How many samples of ``reference`` the per-pass checks use by default (see :data:`PROBE_ELEMENTS`)."""
    per_sample = sum(int(a.size) for a in reference.sample(0).values())
    return max(1, min(8, PROBE_ELEMENTS // max(per_sample, 1)))


#: the layout a tensor of this rank has when it carries no ``tensor_layout`` annotation (qonnx's convention)
_DEFAULT_LAYOUTS = {2: ["N", "C"], 4: ["N", "C", "H", "W"]}


def layout_permutation(after: Model, before: Model, name: str, after_shape: tuple[int, ...],
                       before_shape: tuple[int, ...], before_name: str | None = None) -> tuple[int, ...] | None:
    """The axis permutation taking tensor ``name`` from its layout in ``after`` to the layout of ``before_name``
    (default: the same name) in ``before`` (from their ``tensor_layout`` annotations, NCHW/NC when absent), or None
    when the layouts agree or cannot be matched."""
    before_name = before_name or name
    rank = len(after_shape)
    if rank != len(before_shape) or after.value(name) is None or before.value(before_name) is None:
        return None
    la = after.get_tensor_layout(name) or _DEFAULT_LAYOUTS.get(rank)
    lb = before.get_tensor_layout(before_name) or _DEFAULT_LAYOUTS.get(rank)
    if la is None or lb is None or la == lb or sorted(la) != sorted(lb) or len(set(la)) != rank:
        return None
    perm = tuple(la.index(axis) for axis in lb)
    return perm if tuple(after_shape[i] for i in perm) == tuple(before_shape) else None


def _quantizer_behind(model: Model, node: Any, depth: int = 4) -> Any:
    """The quantizer that decides ``node``'s output levels: ``node`` itself, or the quantizer behind a short chain
    of element-wise Mul/Div/Add/Sub by constants (an output dequantization); None if there is none."""
    while node is not None and depth > 0:
        if node.op_type in QUANTIZER_OPS:
            return node
        if node.op_type not in ("Mul", "Div", "Add", "Sub"):
            return None
        data = [v for v in node.inputs if v is not None and v.const_value is None and not model.is_initializer(v.name)]
        if len(data) != 1:
            return None
        node, depth = data[0].producer(), depth - 1
    return None


def _safe(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("_")[:60] or "pass"


class Verifier:
    """The cache (tensor values of the current model version on some reference samples) and a snapshot of that
    version, with :meth:`check` to compare a new version against it and :meth:`accept` to move on to it.

    Used by :class:`VerificationHook` and by :mod:`verify.bisect`."""

    def __init__(self, model: Model, reference: ReferenceData, samples: Sequence[int], *,
                 near_tie_rtol: float = DEFAULT_NEAR_TIE_RTOL) -> None:
        self.reference = reference
        self.sample_ids = list(samples)
        self.near_tie_rtol = near_tie_rtol
        self.fps = Fingerprints()
        self.values = self._full_values(model, initial=True)
        self.snapshot = Snapshot.take(model, self.fps)
        self.structure = structure_key(model)

    # -- cache -------------------------------------------------------------------------------------------------
    def _full_values(self, model: Model, initial: bool = False) -> list[dict[str, np.ndarray]]:
        if initial and self.reference.describes(model):
            return [dict(self.reference.values(i)) for i in self.sample_ids]
        from custom_ops.executor import Executor

        ex = Executor(model.to_proto())
        return [ex.run(self.reference.sample(i), return_all=True) for i in self.sample_ids]

    def unchanged(self, model: Model) -> bool:
        """True if ``model`` has the snapshot's structure (a cheap test for passes that report no change)."""
        return structure_key(model) == self.structure

    def _float64(self, sample_index: int, name: str) -> Callable[[], np.ndarray | None]:
        def get() -> np.ndarray | None:
            try:
                return self.reference.values(self.sample_ids[sample_index], np.float64).get(name)
            except Exception as exc:  # noqa: BLE001 - float64 evidence is optional; margins still apply
                log.warning("no float64 reference for near-tie classification: %s", exc)
                return None
        return get

    # -- checking ----------------------------------------------------------------------------------------------
    def check(self, model: Model, policy: Policy) -> CheckOutcome:
        """Compare ``model`` with the cached version under ``policy``; nothing is updated.

        The changed nodes are run on the cached values of what they read (a changed node that merely reads another
        tensor in place of an old one is set aside while that tensor holds the old values). Every tensor they
        compute that the old version also had is compared with its cached value. If all match, or the ones that
        differ are read only inside the region (a tensor name reused for another value), the pass is verified.
        Otherwise the region is run again with the matching tensors fed their cached values (teacher forcing: a
        near-tie inside the region cannot spread), and a differing tensor that unchanged nodes read pulls those
        nodes into the run (with everything between them and the region, so that no stale cached value is read).
        This repeats until the differing tensors stay inside the region (the values re-converge: a change of
        encoding, as an XNOR rewrite makes) or a graph output differs (a failure)."""
        self.fps.new_generation()
        if isinstance(policy, Metric):
            return self._check_metric(model, policy)
        change = find_change(self.snapshot, model, self.fps, self.values[0].keys())
        if change.problems:
            msg, node, tensor = change.problems[0]
            return CheckOutcome(False, change, message=msg, node=node, tensor=tensor)
        if not change.nodes:
            return CheckOutcome(True, change)
        constants = constant_tensors(model)
        outputs = {v.name for v in model.graph.outputs}
        # a changed node that only reads other tensors in place of old ones needs no re-run if those hold the old
        # values: it is set aside and run only if they do not
        pending = self._rewired(model, change.nodes)
        produced = {o.name for n in change.nodes for o in n.outputs}
        same: set[int] = set()
        for key, (node, pairs) in list(pending.items()):
            if all(a not in produced for a, _ in pairs):  # the new inputs are cached already: decide now
                del pending[key]
                if all(self._same_value(model, policy, a, b, [{}] * len(self.values)) for a, b in pairs):
                    same.add(key)
        region = [n for n in change.nodes if id(n) not in pending and id(n) not in same]
        widened = forcing = False
        if self._relayouts(model, produced):
            # the pass changes layouts (NCHW -> NHWC): unchanged element-wise nodes between changed ones now see
            # permuted inputs, so run everything between the changed nodes from the start
            region, widened, pending = hull(model, change.nodes), True, {}
        unforced: set[str] = set()  # tensors found to differ: their readers must see the computed values
        ties: dict[str, list[NearTie]] = {}
        runs = 0
        while True:
            runs += 1
            forced, relaid = self._forcible(model, region, unforced) if forcing else (set(), {})
            feeds: Sequence[Mapping[str, np.ndarray]] = self.values
            if relaid:  # forced tensors whose layout the pass changed are fed in the new layout
                feeds = [ChainMap({t: np.transpose(v[t], np.argsort(p)) for t, p in relaid.items()}, v)
                         for v in self.values]
            try:
                results = run_nodes(model, region, feeds, forced, constants)
            except FinnliteError as exc:
                if forced:  # a node may refuse a cached value fed to it (a changed encoding): feed computed ones
                    unforced |= forced
                    continue
                if widened:
                    return CheckOutcome(False, change, message=f"the model after the pass cannot run: {exc}",
                                        node=exc.node, tensor=exc.tensor)
                # a changed node may have read a stale cached value: run everything between the changed nodes
                region, widened, pending = hull(model, change.nodes), True, {}
                continue
            outcome = CheckOutcome(True, change, results, region=region, runs=runs)
            invalid: list[tuple[str, TensorDiff, int, Any]] = []
            valid: set[str] = set()
            layouts: dict[str, tuple[int, ...]] = {}
            for node in region:
                for o in node.outputs:
                    name = o.name
                    if not name or name not in self.values[0] or name not in results[0]:
                        continue
                    ties.pop(name, None)
                    for s, (res, old) in enumerate(zip(results, self.values)):
                        diff, found = self._compare(model, policy, name, res, old, s)
                        if diff.layout is not None:
                            layouts[name] = diff.layout
                        if not diff.ok:
                            invalid.append((name, diff, s, node))
                            break
                        ties.setdefault(name, []).extend(found)
                    else:
                        valid.add(name)
            log.debug("region of %d nodes, run %d: %d tensors differ (%s)", len(region), runs, len(invalid),
                      ", ".join(name for name, *_ in invalid[:5]))
            refed = {name for name, *_ in invalid} & forced
            if refed:  # their readers got the cached values: run again with the computed ones
                unforced |= refed
                continue
            rerun = [node for node, pairs in pending.values()
                     if not all(self._same_value(model, policy, a, b, results) for a, b in pairs)]
            pending = {}
            if rerun:
                region = topo_order(region + rerun)
                continue
            in_region = {id(n) for n in region}
            # tensors unchanged readers cannot take as before: the differing ones, and the ones that match only up to
            # a layout permutation (a reader is layout-agnostic or not: it has to run to tell)
            moved = [name for name, *_ in invalid] + [name for name in valid if name in layouts]
            down_nodes, _ = descendants(model, moved) if moved else (set(), set())
            # unchanged nodes that read a moved tensor and feed the region: what the region read from them was
            # stale, so its results are not final yet
            stale = (down_nodes & ancestors(region)) - in_region
            failing = next((x for x in invalid if x[0] in outputs), None)
            relaid_output = next((name for name in valid if name in layouts and name in outputs), None)
            if failing is None and relaid_output is not None:
                node = model.find_producer(relaid_output)
                failing = (relaid_output, TensorDiff(relaid_output, tuple(np.shape(self.values[0][relaid_output])),
                                                     True, shape_error="the pass changed the layout of this graph "
                                                                       f"output (permutation {layouts[relaid_output]})"),
                           0, node)
                invalid.append(failing)
            frontier = [u.node for name in moved for u in model.value(name).uses() if id(u.node) not in in_region]
            if (failing is not None or frontier) and invalid and not forcing:
                # a difference leaves the region: first make every check local (teacher forcing), so that a
                # near-tie inside the region does not spread to what it hands on
                forcing = True
                unforced |= {name for name, *_ in invalid}
                continue
            if failing is not None and not stale:
                self._describe_failure(outcome, invalid[0], failing)
                return outcome
            if not frontier:
                outcome.near_ties = [t for name in sorted(valid) for t in ties.get(name, [])]
                outcome.keep = valid
                outcome.layouts = {t: p for t, p in layouts.items() if t in valid}
                return outcome
            grow = in_region | {id(n) for n in frontier} | (down_nodes & ancestors(region + frontier))
            region = topo_order([n for n in model.graph if id(n) in grow])

    def _relayouts(self, model: Model, names: set[str]) -> bool:
        """True if the new version annotates one of ``names`` (cached ones) with another layout than the old."""
        before = self.snapshot.model
        cached = self.values[0]
        for name in names:
            if name in cached and before.value(name) is not None and model.value(name) is not None:
                rank = np.ndim(cached[name])
                la = model.get_tensor_layout(name) or _DEFAULT_LAYOUTS.get(rank)
                lb = before.get_tensor_layout(name) or _DEFAULT_LAYOUTS.get(rank)
                if la is not None and lb is not None and la != lb:
                    return True
        return False

    def _rewired(self, model: Model, nodes: Sequence[Any]) -> dict[int, tuple[Any, list[tuple[str, str]]]]:
        """Changed nodes that differ from the old node producing the same outputs only by reading other (non-constant)
        tensors: {id: (node, [(new input, old input), ...])}."""
        before = self.snapshot.model
        cached = self.values[0]
        found: dict[int, tuple[Any, list[tuple[str, str]]]] = {}
        for node in nodes:
            old = before.find_producer(node.outputs[0].name) if node.outputs else None
            if old is None or [o.name for o in old.outputs] != [o.name for o in node.outputs]:
                continue
            new_sig, old_sig = node_signature(node, self.fps), node_signature(old, self.fps)
            if new_sig[:3] != old_sig[:3] or new_sig[4:] != old_sig[4:] or len(new_sig[3]) != len(old_sig[3]):
                continue
            pairs = []
            for a, b in zip(new_sig[3], old_sig[3]):
                if a == b:
                    continue
                if len(a) != 1 or len(b) != 1 or not a[0] or b[0] not in cached:
                    break
                pairs.append((a[0], b[0]))
            else:
                if pairs:
                    found[id(node)] = (node, pairs)
        return found

    def _same_value(self, model: Model, policy: Policy, new: str, old: str,
                    results: Sequence[Mapping[str, np.ndarray]]) -> bool:
        """True if tensor ``new`` of the new version holds, on every sample, what ``old`` held (under ``policy``)."""
        before = self.snapshot.model
        for res, vals in zip(results, self.values):
            a = res[new] if new in res else vals.get(new)
            b = vals.get(old)
            if a is None or b is None:
                return False
            perm = layout_permutation(model, before, new, np.shape(a), np.shape(b), before_name=old)
            if perm is not None:
                a = np.transpose(a, perm)
            integer = is_integer_tensor(model, new) or is_integer_tensor(before, old)
            if not compare_tensor(new, a, b, policy, integer=integer, step=quant_step(before, old)).ok:
                return False
        return True

    def _forcible(self, model: Model, region: Sequence[Any], unforced: set[str]
                  ) -> tuple[set[str], dict[str, tuple[int, ...]]]:
        """The tensors the region both computes and reads that can be teacher-forced: cached, not known to
        differ, and of the shape and type the new version expects (up to a layout permutation, also returned)."""
        in_region = {id(n) for n in region}
        forced: set[str] = set()
        relaid: dict[str, tuple[int, ...]] = {}
        cached = self.values[0]
        for node in region:
            for o in node.outputs:
                name = o.name
                if not name or name in unforced or name not in cached or not any(
                        id(u.node) in in_region for u in o.uses()):
                    continue
                value = np.asarray(cached[name])
                if o.dtype is not None and o.dtype.numpy() != value.dtype:
                    continue
                shape = model.get_tensor_shape(name)
                if shape is not None and None not in shape and tuple(shape) != value.shape:
                    perm = layout_permutation(model, self.snapshot.model, name, tuple(shape), value.shape)
                    if perm is None:
                        continue
                    relaid[name] = perm
                forced.add(name)
        return forced, relaid

    def _compare(self, model: Model, policy: Policy, name: str, res: dict[str, np.ndarray],
                 old: dict[str, np.ndarray], s: int) -> tuple[TensorDiff, list[NearTie]]:
        before = self.snapshot.model
        integer = is_integer_tensor(model, name) or is_integer_tensor(before, name)
        actual = res[name]
        perm = layout_permutation(model, before, name, np.shape(actual), np.shape(old[name]))
        if perm is not None:  # the pass changed the tensor's layout (NCHW -> NHWC): compare in the old layout
            actual = np.transpose(actual, perm)
        step = quant_step(before, name) if perm is not None else quant_step(model, name)
        if step is None:
            step = quant_step(before, name)
        diff = compare_tensor(name, actual, old[name], policy, integer=integer, step=step)
        diff.layout = perm
        if diff.ok or diff.shape_error or not policy.near_ties:
            return diff, []
        quantizers = []
        after_node = _quantizer_behind(model, model.find_producer(name)) if perm is None else None
        before_node = _quantizer_behind(before, before.find_producer(name))
        if after_node is not None:
            quantizers.append((after_node, lambda n: res.get(n, old.get(n))))
        if before_node is not None:
            quantizers.append((before_node, old.get))
        ties, real = split_near_ties(diff.bad, diff.shape, actual, old[name], tensor=name, sample=s, step=step,
                                     quantizers=quantizers, rtol=self.near_tie_rtol,
                                     float64=self._float64(s, name))
        diff.bad = real
        return diff, ties

    def _describe_failure(self, outcome: CheckOutcome, first: tuple[str, TensorDiff, int, Any],
                          failing: tuple[str, TensorDiff, int, Any]) -> None:
        """Fill in the failure: the first diverging tensor (topological order) and the graph output it reaches."""
        name, diff, s, node = first
        outcome.ok = False
        outcome.tensor, outcome.node = name, node_label(node)
        outcome.max_error, outcome.sample = diff.max_abs, self.sample_ids[s]
        text = (f"first diverging tensor '{name}' (node '{node_label(node)}', {node.op_type}): "
                f"{diff.describe().split(': ', 1)[1]} on reference sample {self.sample_ids[s]}")
        if failing[0] != name:
            text += f"; it reaches the graph output as {failing[1].describe()}"
        outcome.message = text

    def _check_metric(self, model: Model, policy: Metric) -> CheckOutcome:
        from custom_ops.executor import Executor

        data: ReferenceData = policy.data if policy.data is not None else self.reference
        outputs = Executor(model.to_proto()).run(data.inputs)
        value = float(policy.fn(outputs, data.outputs(np.float32)))
        if not policy.accepts(value):
            return CheckOutcome(False, message=f"{policy.describe()}: got {value:.6g} on {data.num_samples} samples")
        return CheckOutcome(True, metric_values=self._full_values(model))

    # -- moving on ---------------------------------------------------------------------------------------------
    def accept(self, model: Model, outcome: CheckOutcome) -> None:
        """Make ``model`` the cached version (after a successful :meth:`check`)."""
        if outcome.metric_values is not None:
            self.values = outcome.metric_values
        elif outcome.change is not None:
            for vals, res in zip(self.values, outcome.results):
                for name in outcome.change.removed:
                    vals.pop(name, None)
                for name, arr in res.items():
                    if name not in outcome.keep:
                        vals[name] = arr
                for name, perm in outcome.layouts.items():  # keep the old values, in the new layout
                    if name in outcome.keep:
                        vals[name] = np.ascontiguousarray(np.transpose(vals[name], np.argsort(perm)))
        signatures = outcome.change.signatures if outcome.change is not None and outcome.change.signatures else None
        self.snapshot = Snapshot.take(model, self.fps, signatures)
        self.structure = structure_key(model)


class VerificationHook:
    """A pass-manager hook verifying each pass (``granularity="pass"``, the default) or each stage (``"stage"``)
    against cached reference values; ``"off"`` disables it.

    ``reference``: a :class:`ReferenceData` built from the original model (default: 8 random samples in [-1, 1]
    drawn when the first stage starts). ``samples``: how many of its samples the per-pass checks use (default:
    enough for about :data:`PROBE_ELEMENTS` input values, between 1 and 8: one image of an ImageNet network, eight
    MNIST digits). ``policy``:
    the default for passes and stages that declare none. ``save_dir``: where failing models are written (a new
    temporary folder by default). After the run, ``records`` lists the checks and ``near_ties`` the accepted
    float32 near-ties; :meth:`final_check` compares the result with the original on all reference samples."""

    def __init__(self, reference: ReferenceData | None = None, *, samples: int | None = None,
                 policy: Policy = DEFAULT_POLICY, granularity: str = "pass", save_dir: str | Path | None = None,
                 near_tie_rtol: float = DEFAULT_NEAR_TIE_RTOL) -> None:
        if granularity not in ("pass", "stage", "off"):
            raise ValueError(f"granularity must be 'pass', 'stage' or 'off', not {granularity!r}")
        self.reference = reference
        self.samples = samples
        self.policy = policy
        self.granularity = granularity
        self.save_dir = Path(save_dir) if save_dir is not None else None
        self.near_tie_rtol = near_tie_rtol
        self.verifier: Verifier | None = None
        self.records: list[CheckRecord] = []
        self.setup_seconds = 0.0
        self._failures = 0

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
        t0 = time.perf_counter()
        if self.reference is None:
            self.reference = ReferenceData.random(model, n=max(self.samples or 0, 8))
        n = self.samples or probe_samples(self.reference)
        ids = list(range(min(n, self.reference.num_samples)))
        self.verifier = Verifier(model, self.reference, ids, near_tie_rtol=self.near_tie_rtol)
        self.setup_seconds += time.perf_counter() - t0

    # -- the hook protocol -------------------------------------------------------------------------------------
    def before_stage(self, stage: Any, model: Model) -> None:
        if self.granularity != "off" and self.verifier is None:
            self.start(model)

    def before_pass(self, p: Any, model: Model, stage: Any) -> None:
        if self.granularity != "off" and self.verifier is None:
            self.start(model)

    def after_pass(self, p: Any, model: Model, stage: Any, record: Any) -> None:
        if self.granularity != "pass":
            return
        policy = resolve_policy(p, stage, self.policy)
        self.verify(model, policy, label=f"pass '{p.name}'", pass_name=p.name, stage=getattr(stage, "name", None),
                    iteration=getattr(record, "iteration", None), changed=bool(getattr(record, "changed", True)))

    def after_stage(self, stage: Any, model: Model) -> None:
        if self.granularity != "stage":
            return
        policy = resolve_policy(None, stage, self.policy)
        self.verify(model, policy, label=f"stage '{stage.name}'", pass_name=stage.name, stage=stage.name,
                    iteration=None, changed=True)

    # -- checking ----------------------------------------------------------------------------------------------
    def verify(self, model: Model, policy: Policy, *, label: str, pass_name: str, stage: str | None = None,
               iteration: int | None = None, changed: bool = True) -> CheckRecord | None:
        """Check ``model`` against the cached version and move on to it; raise :class:`PassVerificationError`."""
        if self.verifier is None:
            self.start(model)
        v = self.verifier
        assert v is not None
        if not changed:
            if v.unchanged(model):
                return None
            log.warning("%s reported no change but changed the graph; verifying it", label)
        t0 = time.perf_counter()
        outcome = v.check(model, policy)
        if not outcome.ok:
            self._fail(model, outcome, policy, label=label, pass_name=pass_name, stage=stage, iteration=iteration)
        v.accept(model, outcome)
        change = outcome.change
        changed = len(change.nodes) if change else len(model)
        ran = len(outcome.region) if change else len(model)
        rec = CheckRecord(label, stage, iteration, policy.describe(), changed, ran, time.perf_counter() - t0,
                          outcome.near_ties, outcome.runs)
        self.records.append(rec)
        if outcome.near_ties:
            log.info("%s: %d float32 near-tie(s) accepted, e.g. %s", label, len(outcome.near_ties),
                     outcome.near_ties[0].describe())
        return rec

    def _fail(self, model: Model, outcome: CheckOutcome, policy: Policy, *, label: str, pass_name: str,
              stage: str | None, iteration: int | None) -> None:
        assert self.verifier is not None
        self._failures += 1
        folder = self.save_dir or Path(tempfile.mkdtemp(prefix="finnlite-verify-"))
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
        edited = self.verifier.snapshot.edited_in_place(self.verifier.fps)
        where = ""
        if stage and stage != pass_name:
            where = f" (stage '{stage}'" + (f", round {iteration}" if iteration else "") + ")"
        text = f"{label}{where} broke equivalence under {policy.describe()}: {outcome.message}"
        if saved:
            text += f"; models before and after saved to {before_path} and {after_path}"
            if edited:
                text += (f" (the pass edited initializer(s) {', '.join(repr(e) for e in edited[:3])} in place: the "
                         "'before' model shows the edited values)")
        raise PassVerificationError(text, pass_name=pass_name, stage=stage, iteration=iteration, node=outcome.node,
                                    tensor=outcome.tensor, max_error=outcome.max_error, sample=outcome.sample,
                                    before_path=before_path if saved else None,
                                    after_path=after_path if saved else None)

    def final_check(self, model: Model, **kwargs: Any) -> Any:
        """Compare ``model`` with the original on every reference sample (see :func:`verify.final.final_check`)."""
        from verify.final import final_check

        if self.reference is None:
            raise VerificationError("no reference data: the hook never ran")
        return final_check(self.reference, model, **kwargs)

    def summary(self) -> str:
        """One line: checks, time, near-ties."""
        return (f"verification: {len(self.records)} checks, {self.seconds:.2f} s "
                f"(setup {self.setup_seconds:.2f} s), {len(self.near_ties)} float32 near-tie(s) accepted")
