"""The verifier: the cached values of the current model version, and checking a new version against them.

How it stays cheap without missing a wrong rewrite:

* It keeps a *cache*: the value of every tensor of the current model version on a few reference samples (computed
  once, on the original, by the oracle), and a snapshot of that version (an O(nodes) structural clone).
* The nodes of a new version whose signature (op, attributes, tensor names, initializer contents) the old version
  lacks form the *region* (:mod:`verify.region`). Only the region is run, on the cached values of the tensors it
  reads, and every tensor it computes that the old version also had must match its cached value under the policy
  (:mod:`finnlite.core.policies`); everything outside the region computes what it computed before on the same inputs.
  When a differing tensor (or one in another layout) reaches unchanged nodes, they are run too, until the values
  re-converge or a graph output differs (:meth:`Verifier.check`).
* Matching tensors keep their cached values (the cache stays anchored to the original model's values, so
  tolerances never accumulate from pass to pass); tensors new in the region get the values it computed.
* A :class:`~finnlite.core.policies.Metric` policy is global: the whole model is run on the metric's data and
  the cache is rebuilt.
"""

from __future__ import annotations

import logging
from collections import ChainMap
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from custom_ops.executor import Executor
from finnlite.core.errors import FinnliteError
from finnlite.core.model import Model
from finnlite.core.policies import Metric, Policy
from finnlite.core.traverse import ancestors, constant_tensors, descendants, node_label, topo_order
from verify.cache import SampleValues
from verify.compare import TensorDiff, compare_tensor, is_integer_tensor, quant_step
from verify.real64 import Real64
from verify.reference import ReferenceData
from verify.region import Change, Fingerprints, Snapshot, find_change, hull, node_signature, run_nodes
from verify.ties import DEFAULT_NEAR_TIE_RTOL, QUANTIZER_OPS, NearTie, split_near_ties

log = logging.getLogger(__name__)

__all__ = ["Verifier", "CheckOutcome", "layout_permutation", "tie_key"]


def tie_key(tie: NearTie) -> tuple[str, int, tuple[int, ...]]:
    """A near-tie as ``(node, sample position, index)``: the same element of the same node's output in another run
    of the same pipeline (tensor names made by rules carry counters that differ between runs; node names do not)."""
    return (tie.node or tie.tensor, int(tie.sample), tuple(int(i) for i in tie.index))


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
    #: on failure: the flat indices (in the cached layout) of the differing elements of ``tensor`` on ``sample``
    elements: np.ndarray | None = None


@dataclass
class _Status:
    """How one computed tensor compares with its cached value: ``ok``, the diff (of the failing ``sample`` when
    not ok), its producing node, the layout permutation applied, the near-ties accepted."""

    name: str
    ok: bool
    diff: TensorDiff
    sample: int
    node: Any
    layout: tuple[int, ...] | None = None
    ties: list[NearTie] = field(default_factory=list)


@dataclass
class _RegionRun:
    """The state of one :meth:`Verifier.check` while its region grows: the nodes run (``region``), those to run
    next (``todo``), the changed nodes set aside (``pending``), what was computed and how it compares
    (``status``), the tensors teacher forcing must not feed (``unforced``)."""

    model: Model
    policy: Policy
    change: Change
    constants: Any
    outputs: set[str]
    region: list[Any] = field(default_factory=list)
    todo: list[Any] = field(default_factory=list)
    pending: dict[int, tuple[Any, list[tuple[str, str]]]] = field(default_factory=dict)
    widened: bool = False
    forcing: bool = False
    unforced: set[str] = field(default_factory=set)
    status: dict[str, "_Status"] = field(default_factory=dict)
    computed: list[SampleValues] = field(default_factory=list)
    runs: int = 0
    failed: CheckOutcome | None = None


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


def _lookup(first: Mapping[str, np.ndarray], then: Mapping[str, np.ndarray] | None, model: Model
            ) -> Callable[[str], np.ndarray | None]:
    """A tensor value by name: from ``first``, else ``then``, else the model's initializers."""
    def get(name: str) -> np.ndarray | None:
        if name in first:
            return first[name]
        if then is not None and name in then:
            return then[name]
        return model.get_initializer(name)
    return get


def _layout_of(model: Model, name: str, rank: int) -> tuple[str, ...] | None:
    """The axis names of tensor ``name`` in ``model`` (its ``tensor_layout``, else NCHW/NC by rank), or None."""
    layout = (model.get_tensor_layout(name) if model.value(name) is not None else None) or _DEFAULT_LAYOUTS.get(rank)
    return tuple(layout) if layout is not None and len(layout) == rank else None


def _same_element(index: tuple[int, ...], frame: tuple[tuple[str, ...] | None, tuple[int, ...]] | None,
                  layout: tuple[str, ...] | None, shape: tuple[int, ...]) -> int | None:
    """The flat index, in a tensor of ``shape`` and ``layout``, of the element at ``index`` of a tensor with the
    layout and shape of ``frame`` (None: the same as now); None if it cannot be followed (see
    :meth:`Verifier._inherited`)."""
    src_layout, src_shape = frame if frame is not None else (layout, shape)
    if len(index) != len(src_shape) or any(not 0 <= i < n for i, n in zip(index, src_shape)):
        return None
    if src_layout is not None and layout is not None and src_layout != layout and len(src_layout) == len(layout) \
            and sorted(src_layout) == sorted(layout) and len(set(layout)) == len(layout):
        index = tuple(index[src_layout.index(axis)] for axis in layout)
        src_shape = tuple(src_shape[src_layout.index(axis)] for axis in layout)
    elif src_layout != layout and len(src_shape) == len(shape):
        return None  # another order of the axes that the names do not tell
    if tuple(src_shape) == tuple(shape):
        return int(np.ravel_multi_index(index, shape)) if shape else 0
    if [n for n in src_shape if n != 1] == [n for n in shape if n != 1]:  # axes of size 1 added or removed
        return int(np.ravel_multi_index(index, src_shape)) if src_shape else 0
    return None


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


class Verifier:
    """The cache (tensor values of the current model version on some reference samples) and a snapshot of that
    version, with :meth:`check` to compare a new version against it and :meth:`accept` to move on to it.

    Used by :class:`VerificationHook` and by :mod:`verify.bisect`."""

    def __init__(self, model: Model, reference: ReferenceData, samples: Sequence[int], *,
                 near_tie_rtol: float = DEFAULT_NEAR_TIE_RTOL, private: bool = False) -> None:
        """``private``: ``model`` is a copy that nothing else changes (kept as the snapshot, not cloned again)."""
        self.reference = reference
        self.sample_ids = list(samples)
        self.near_tie_rtol = near_tie_rtol
        self.fps = Fingerprints()
        #: near-ties (:func:`tie_key`) that :meth:`check` must not accept (see
        #: :class:`verify.hook.VerificationHook`'s ``reject_ties``)
        self.reject_ties: set[tuple[str, int, tuple[int, ...]]] = set()
        #: near-ties accepted by earlier checks, by (tensor or node, sample position): the cache keeps the original's
        #: value there, so a later version that still computes the accepted value is not told apart (see
        #: :meth:`_inherited`)
        self.accepted: dict[tuple[str, int], list[NearTie]] = {}
        #: where each near-tie found by :meth:`_compare` lies: the layout and shape of the tensor it indexes (the
        #: cache's, at the time), so that a later check can find the same element in another layout
        self._tie_frames: dict[NearTie, tuple[tuple[str, ...] | None, tuple[int, ...]]] = {}
        self.values = self._full_values(model, initial=True)
        #: per check: the float64 versions of the model before and after the pass, and their values by sample (the
        #: version after, once accepted, is kept as "next": the next check's version before)
        self._sides: dict[str, tuple[Real64, dict[int, dict[str, np.ndarray]]]] = {}
        self.snapshot = Snapshot.take(model, self.fps, copy=not private)

    # -- cache -------------------------------------------------------------------------------------------------
    def _full_values(self, model: Model, initial: bool = False) -> list[SampleValues]:
        if initial and self.reference.describes(model):
            return [SampleValues(self.reference.take_values(i)) for i in self.sample_ids]
        ex = Executor(model.to_proto())
        return [SampleValues(ex.run(self.reference.sample(i), return_all=True)) for i in self.sample_ids]

    def _float64(self, sample_index: int, name: str) -> Callable[[], np.ndarray | None]:
        def get() -> np.ndarray | None:
            if not self.reference.computes(name):  # a tensor the pipeline made: the original has no value for it
                return None
            try:
                return self.reference.values(self.sample_ids[sample_index], np.float64).get(name)
            except Exception as exc:  # noqa: BLE001 - float64 evidence is optional; margins still apply
                log.warning("no float64 reference for near-tie classification: %s", exc)
                return None
        return get

    def _side64(self, side: str, model: Model, sample_index: int, name: str) -> np.ndarray | None:
        """Tensor ``name`` of ``model`` (the version before the pass, ``side="before"``, or after it) on reference
        sample ``sample_index`` in float64 execution of what the version means (:mod:`verify.real64`); None if it
        cannot be computed."""
        if side not in self._sides:
            self._sides[side] = (Real64(model), {})
        version, by_sample = self._sides[side]
        if not by_sample:
            by_sample.update({i: {} for i in range(len(self.sample_ids))})
        if name not in by_sample[sample_index]:
            try:  # for every probe sample at once (one executor): the other samples ask next
                version.values_of([self.reference.sample(i) for i in self.sample_ids], [name],
                                  [by_sample[i] for i in range(len(self.sample_ids))])
            except Exception as exc:  # noqa: BLE001 - without float64 evidence no near-tie is accepted
                log.warning("no float64 run of the %s side for near-tie classification: %s", side, exc)
                return None
        return by_sample[sample_index].get(name)

    def _sides64(self, model: Model, sample_index: int, name: str, perm: tuple[int, ...] | None
                 ) -> Callable[[], tuple[np.ndarray | None, np.ndarray | None]]:
        """The float64 values of tensor ``name`` before and after the pass (the after side in the before side's
        layout), computed when first asked."""
        def get() -> tuple[np.ndarray | None, np.ndarray | None]:
            before = self._side64("before", self.snapshot.model, sample_index, name)
            after = self._side64("after", model, sample_index, name)
            if after is not None and perm is not None:
                after = np.transpose(after, perm)
            return before, after
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
        # the float64 runs of the version checked last, if it was accepted, serve as this check's "before" side
        self._sides = {"before": self._sides.pop("next")} if "next" in self._sides else {}
        if isinstance(policy, Metric):
            return self._check_metric(model, policy)
        change = find_change(self.snapshot, model, self.fps, self.values[0].keys())
        if change.problems:
            msg, node, tensor = change.problems[0]
            return CheckOutcome(False, change, message=msg, node=node, tensor=tensor)
        if not change.nodes:
            return CheckOutcome(True, change)
        r = self._start(model, policy, change)
        while True:
            outcome = self._step(r)
            if outcome is not None:
                return outcome

    def _start(self, model: Model, policy: Policy, change: Change) -> "_RegionRun":
        """The first region of a check: the changed nodes, less those set aside (a changed node that only reads
        other tensors in place of old ones needs no re-run if those hold the old values: it is set aside and run
        only if they do not); everything between the changed nodes if the pass changes layouts."""
        r = _RegionRun(model, policy, change, constant_tensors(model), {v.name for v in model.graph.outputs},
                       computed=[SampleValues() for _ in self.values])
        r.pending = self._rewired(model, change.nodes)
        produced = {o.name for n in change.nodes for o in n.outputs}
        same: set[int] = set()
        for key, (node, pairs) in list(r.pending.items()):
            if all(a not in produced for a, _ in pairs):  # the new inputs are cached already: decide now
                del r.pending[key]
                if all(self._same_value(model, policy, a, b, [{}] * len(self.values)) for a, b in pairs):
                    same.add(key)
        r.region = [n for n in change.nodes if id(n) not in r.pending and id(n) not in same]
        if self._relayouts(model, produced):
            # the pass changes layouts (NCHW -> NHWC): unchanged element-wise nodes between changed ones now see
            # permuted inputs, so run everything between the changed nodes from the start
            r.region, r.widened, r.pending = hull(model, change.nodes), True, {}
        r.todo = list(r.region)
        return r

    def _step(self, r: "_RegionRun") -> CheckOutcome | None:
        """Run the region's pending nodes once and compare what they computed: the outcome when that decides the
        check, else None (``r`` says what runs next)."""
        model, policy = r.model, r.policy
        r.runs += 1
        forced, relaid = self._forcible(model, r.region, r.unforced) if r.forcing else (set(), {})
        results = self._execute(r, forced, relaid)
        if results is None:
            return r.failed
        made = [o.name for n in r.todo for o in n.outputs if o.name]
        for c, res in zip(r.computed, results):  # what the nodes computed (not what they were fed), as held
            c.update({name: dict.__getitem__(res, name) for name in made if name in res})
        for node in r.todo:
            for o in node.outputs:
                if o.name and o.name in self.values[0] and o.name in r.computed[0]:
                    r.status[o.name] = self._status(model, policy, o.name, node, r.computed)
        invalid = [r.status[o.name] for n in r.region for o in n.outputs
                   if o.name in r.status and not r.status[o.name].ok]
        log.debug("region of %d nodes, run %d of %d nodes: %d tensors differ (%s)", len(r.region), r.runs,
                  len(r.todo), len(invalid), ", ".join(x.name for x in invalid[:5]))
        refed = {x.name for x in invalid} & forced
        if refed:  # their readers got the cached values: run again with the computed ones
            r.unforced |= refed
            r.todo = self._downstream(model, r.region, refed)
            return None
        if r.forcing:
            # tensors that differed in the run without forcing but match now that what they read is forced (the
            # difference came from upstream, or is a near-tie accepted here): their readers get the cached values
            # too, so that a near-tie does not spread (a one-step window difference would reach a MatMul's
            # accumulator as a whole weight)
            settled = {x.name for x in r.status.values() if x.ok and x.name in r.unforced}
            if settled:
                settled &= self._forcible(model, r.region, r.unforced - settled)[0]
            if settled:
                r.unforced -= settled
                r.todo = self._downstream(model, r.region, settled)
                return None
        rerun = [node for node, pairs in r.pending.values()
                 if not all(self._same_value(model, policy, a, b, r.computed) for a, b in pairs)]
        r.pending = {}
        if rerun:
            r.region = topo_order(r.region + rerun)
            r.todo = self._downstream(model, r.region, {o.name for n in rerun for o in n.outputs}, rerun)
            return None
        return self._spread(r, invalid)

    def _execute(self, r: "_RegionRun", forced: set[str], relaid: dict[str, tuple[int, ...]]
                 ) -> list[dict[str, np.ndarray]] | None:
        """The values of ``r.todo`` on the cached and computed values, ``forced`` tensors fed their cached values
        (in the new layout where ``relaid``); None if they cannot run (``r`` is widened for another try, or
        ``r.failed`` says why the version cannot run)."""
        feeds = [ChainMap({t: v[t] if t not in relaid else np.transpose(v[t], np.argsort(relaid[t]))
                           for t in forced}, c, v) for c, v in zip(r.computed, self.values)]
        try:
            return run_nodes(r.model, r.todo, feeds, forced, r.constants)
        except FinnliteError as exc:
            if forced:  # a node may refuse a cached value fed to it (a changed encoding): feed computed ones
                r.unforced |= forced
                r.todo = list(r.region)
                return None
            if r.widened:
                r.failed = CheckOutcome(False, r.change, message=f"the model after the pass cannot run: {exc}",
                                        node=exc.node, tensor=exc.tensor)
                return None
            # a changed node may have read a stale cached value: run everything between the changed nodes
            r.region, r.widened, r.pending = hull(r.model, r.change.nodes), True, {}
            r.todo, r.status, r.computed = list(r.region), {}, [SampleValues() for _ in self.values]
            return None

    def _spread(self, r: "_RegionRun", invalid: list["_Status"]) -> CheckOutcome | None:
        """Where the differing tensors go: a graph output (a failure), unchanged readers (the region grows to them,
        and the next run covers them) or nowhere (the pass is verified); teacher forcing first when a difference
        leaves the region."""
        model, region = r.model, r.region
        in_region = {id(n) for n in region}
        # tensors unchanged readers cannot take as before: the differing ones, and the ones that match only up to
        # a layout permutation (a reader is layout-agnostic or not: it has to run to tell)
        moved = [x.name for x in invalid] + [x.name for x in r.status.values() if x.ok and x.layout is not None]
        down_nodes, _ = descendants(model, moved) if moved else (set(), set())
        # unchanged nodes that read a moved tensor and feed the region: what the region read from them was stale,
        # so its results are not final yet
        stale = (down_nodes & ancestors(region)) - in_region
        failing = next((x for x in invalid if x.name in r.outputs), None)
        relaid_output = next((x for x in r.status.values() if x.ok and x.layout is not None and x.name in r.outputs),
                             None)
        if failing is None and relaid_output is not None:
            failing = _Status(relaid_output.name, False, TensorDiff(
                relaid_output.name, relaid_output.diff.shape, True, shape_error="the pass changed the layout of "
                f"this graph output (permutation {relaid_output.layout})"), 0, relaid_output.node)
            invalid.append(failing)
        frontier = [u.node for name in moved for u in model.value(name).uses() if id(u.node) not in in_region]
        if (failing is not None or frontier) and invalid and not r.forcing:
            # a difference leaves the region: first make every check local (teacher forcing), so that a near-tie
            # inside the region does not spread to what it hands on
            r.forcing = True
            r.unforced |= {x.name for x in invalid}
            r.todo = list(region)
            return None
        outcome = CheckOutcome(True, r.change, r.computed, region=region, runs=r.runs)
        if failing is not None and not stale:
            first = invalid[0]
            self._describe_failure(outcome, (first.name, first.diff, first.sample, first.node),
                                   (failing.name, failing.diff, failing.sample, failing.node))
            return outcome
        if not frontier:
            valid = {x.name for x in r.status.values() if x.ok}
            outcome.near_ties = [t for name in sorted(valid) for t in r.status[name].ties]
            outcome.keep = valid
            outcome.layouts = {x.name: x.layout for x in r.status.values() if x.ok and x.layout is not None}
            return outcome
        added = {id(n) for n in frontier} | ((down_nodes & ancestors(region + frontier)) - in_region)
        r.region = topo_order([n for n in model.graph if id(n) in in_region or id(n) in added])
        new_nodes = [n for n in r.region if id(n) in added]
        r.todo = self._downstream(model, r.region, {o.name for n in new_nodes for o in n.outputs}, new_nodes)
        return None

    def _status(self, model: Model, policy: Policy, name: str, node: Any,
                computed: Sequence[Mapping[str, np.ndarray]]) -> "_Status":
        """Compare a computed tensor with its cached value on every sample."""
        ties: list[NearTie] = []
        layout = None
        for s, (res, old) in enumerate(zip(computed, self.values)):
            diff, found = self._compare(model, policy, name, res, old, s)
            layout = diff.layout
            if not diff.ok:
                return _Status(name, False, diff, s, node, layout)
            ties += found
        return _Status(name, True, diff, 0, node, layout, ties)

    @staticmethod
    def _downstream(model: Model, region: Sequence[Any], names: set[str], extra: Sequence[Any] = ()) -> list[Any]:
        """The region's nodes that read ``names`` directly or indirectly (plus ``extra``), in topological order."""
        down, _ = descendants(model, names)
        keep = down | {id(n) for n in extra}
        return [n for n in region if id(n) in keep]

    def _relayouts(self, model: Model, names: set[str]) -> bool:
        """True if the new version annotates one of ``names`` (cached ones) with another layout than the old."""
        before = self.snapshot.model
        cached = self.values[0]
        for name in names:
            if name in cached and before.value(name) is not None and model.value(name) is not None:
                rank = len(cached.meta(name)[0])
                la = model.get_tensor_layout(name) or _DEFAULT_LAYOUTS.get(rank)
                lb = before.get_tensor_layout(name) or _DEFAULT_LAYOUTS.get(rank)
                if la is not None and lb is not None and la != lb:
                    return True
        return False

    def _rewired(self, model: Model, nodes: Sequence[Any]) -> dict[int, tuple[Any, list[tuple[str, str]]]]:
        """Changed nodes that differ from the old node producing the same outputs only by reading other (non-constant)
        tensors: {id: (node, [(new input, old input), ...])}."""
        cached = self.values[0]
        found: dict[int, tuple[Any, list[tuple[str, str]]]] = {}
        for node in nodes:
            old = self.snapshot.producers.get(node.outputs[0].name) if node.outputs else None
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
                shape_cached, dtype_cached = cached.meta(name)
                if o.dtype is not None and o.dtype.numpy() != dtype_cached:
                    continue
                shape = model.get_tensor_shape(name)
                if shape is not None and None not in shape:
                    perm = layout_permutation(model, self.snapshot.model, name, tuple(shape), shape_cached)
                    if perm is not None:
                        relaid[name] = perm
                    elif tuple(shape) != shape_cached:
                        continue
                elif self._relayouts(model, {name}):  # a layout change that cannot be mapped without the shape
                    continue
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
        before_node = _quantizer_behind(before, self.snapshot.producers.get(name))
        if after_node is not None:
            quantizers.append((after_node, _lookup(res, old, model)))
        if before_node is not None:
            quantizers.append((before_node, _lookup(old, None, before)))
        ties, real = split_near_ties(diff.bad, diff.shape, actual, old[name], tensor=name, sample=s, step=step,
                                     quantizers=quantizers, rtol=self.near_tie_rtol,
                                     float64=self._float64(s, name), grid_step=quant_step(before, name),
                                     sides64=self._sides64(model, s, name, perm))
        if ties:
            frame = (_layout_of(before, name, len(diff.shape)), tuple(diff.shape))
            self._tie_frames.update((t, frame) for t in ties)
        if real.size and self.accepted:
            ties, real = self._inherited(model, name, diff.shape, actual, old[name], s, ties, real)
        if self.reject_ties and ties:
            back = [t for t in ties if tie_key(t) in self.reject_ties]
            if back:
                gone = {id(t) for t in back}
                ties = [t for t in ties if id(t) not in gone]
                flat = [int(np.ravel_multi_index(t.index, diff.shape)) if diff.shape else 0 for t in back]
                real = np.union1d(np.asarray(real, np.int64), np.asarray(flat, np.int64))
        diff.bad = real
        return diff, ties

    def _inherited(self, model: Model, name: str, shape: tuple[int, ...], actual: np.ndarray, expected: np.ndarray,
                   s: int, ties: list[NearTie], real: np.ndarray) -> tuple[list[NearTie], np.ndarray]:
        """Move the differences of tensor ``name`` (sample position ``s``) that an earlier check accepted as near-ties
        from ``real`` to ``ties``: the same tensor or quantizer node, the same sample, the same expected and actual
        values at the same element (its index carried over a layout change by the axis names, or over added or
        removed axes of size 1; an element that cannot be followed so is not inherited). The version before this one
        computes them as well, and the earlier check decided them; the new records say which check that was. A
        difference with the values of an accepted near-tie at another element is not one: a wrong rewrite on a
        tensor with few levels makes such pairs."""
        producer = model.find_producer(name)
        keys = [name] + ([node_label(producer)] if producer is not None else [])
        q = _quantizer_behind(model, producer)
        if q is not None:
            keys.append(node_label(q))
        pool = [t for k in dict.fromkeys(keys) for t in self.accepted.get((k, s), [])]
        if not pool:
            return ties, real
        a = np.asarray(actual, np.float64).reshape(-1)
        e = np.asarray(expected, np.float64).reshape(-1)
        layout = _layout_of(self.snapshot.model, name, len(shape))
        at = [_same_element(t.index, self._tie_frames.get(t), layout, tuple(shape)) for t in pool]
        used: set[int] = set()
        keep = []
        for flat in np.asarray(real).tolist():
            match = next((i for i, t in enumerate(pool) if i not in used and at[i] == flat
                          and float(t.actual) == a[flat] and float(t.expected) == e[flat]), None)
            if match is None:
                keep.append(flat)
                continue
            used.add(match)
            t = pool[match]
            index = tuple(int(i) for i in np.unravel_index(int(flat), shape)) if shape else ()
            evidence = t.evidence if t.evidence.startswith("inherited") else f"inherited: {t.evidence}"
            ties = ties + [NearTie(name, s, index, t.expected, t.actual, t.node, t.margin, evidence)]
        return ties, np.asarray(keep, np.int64)

    def _describe_failure(self, outcome: CheckOutcome, first: tuple[str, TensorDiff, int, Any],
                          failing: tuple[str, TensorDiff, int, Any]) -> None:
        """Fill in the failure: the first diverging tensor (topological order) and the graph output it reaches."""
        name, diff, s, node = first
        outcome.ok = False
        outcome.tensor, outcome.node = name, node_label(node)
        outcome.max_error, outcome.sample = diff.max_abs, self.sample_ids[s]
        outcome.elements = None if diff.shape_error else np.asarray(diff.bad, np.int64)
        text = (f"first diverging tensor '{name}' (node '{node_label(node)}', {node.op_type}): "
                f"{diff.describe().split(': ', 1)[1]} on reference sample {self.sample_ids[s]}")
        if failing[0] != name:
            text += f"; it reaches the graph output as {failing[1].describe()}"
        outcome.message = text

    def _check_metric(self, model: Model, policy: Metric) -> CheckOutcome:
        data: ReferenceData = policy.data if policy.data is not None else self.reference
        outputs = Executor(model.to_proto()).run(data.inputs)
        value = float(policy.fn(outputs, data.outputs(np.float32)))
        if not policy.accepts(value):
            return CheckOutcome(False, message=f"{policy.describe()}: got {value:.6g} on {data.num_samples} samples")
        return CheckOutcome(True, metric_values=self._full_values(model))

    # -- moving on ---------------------------------------------------------------------------------------------
    def accept(self, model: Model, outcome: CheckOutcome, *, private: bool = False) -> None:
        """Make ``model`` the cached version (after a successful :meth:`check`); ``private`` as for the
        constructor."""
        if outcome.metric_values is not None:
            self.values = [SampleValues(v) for v in outcome.metric_values]
        elif outcome.change is not None:
            for vals, res in zip(self.values, outcome.results):
                for name in outcome.change.removed:
                    vals.pop(name, None)
                for name, arr in res.items():  # as held: a window stays a recomputation (verify.cache)
                    if name not in outcome.keep:
                        vals[name] = arr
                for name, perm in outcome.layouts.items():  # keep the old values, in the new layout
                    if name in outcome.keep:
                        vals[name] = np.ascontiguousarray(np.transpose(vals[name], np.argsort(perm)))
        for t in outcome.near_ties:  # remembered by tensor and by node (a tensor may be renamed, a node not)
            if t.evidence.startswith("inherited"):
                continue  # the earlier acceptance is remembered already
            for key in dict.fromkeys(k for k in (t.tensor, t.node) if k):
                group = self.accepted.setdefault((key, int(t.sample)), [])
                if not any(u.expected == t.expected and u.actual == t.actual and u.index == t.index for u in group):
                    group.append(t)
        after = self._sides.get("after")
        self._sides = {"next": after} if after is not None else {}  # the next check's version before (see check)
        signatures = outcome.change.signatures if outcome.change is not None and outcome.change.signatures else None
        self.snapshot = Snapshot.take(model, self.fps, signatures, copy=not private)
        self.fps.retain(self.snapshot.model)
