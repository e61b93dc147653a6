"""The final check: the streamlined model against the original QONNX model, on every reference sample.

A QONNX graph means real-number arithmetic; its float32 execution is an approximation, and a correct integer model
(exact accumulators, thresholds from exact arithmetic) can round one level differently at a float32 near-tie. So
each output is compared with both executions of the original:

* **Integer outputs.** When the output is an integer tensor ``q`` followed by an affine tail of constant
  Mul/Div/Add/Sub and shape ops (the output dequantization a streamlined model ends with), the tail is evaluated
  in float64 on the streamlined ``q`` and compared with the original's output *in quantization steps*: the levels
  agree when every element is within half a step. Agreement with float64 execution is required; disagreement with
  float32 execution only is a *near-tie*, counted per sample and explained by the first quantizer of the original
  whose float32 and float64 levels differ (with the margin of its input to the rounding boundary). Where that
  quantizer's float64 input is itself within float64 rounding of the boundary (:data:`REFERENCE_TIE_RTOL`),
  agreement with float32 execution is accepted as a near-tie too: neither execution decides that element.
* **Float outputs** (no integer tensor behind them) are compared within ``float_rtol`` of the output's magnitude.

The original runs in float64 only on the samples where the streamlined model disagrees with its float32 execution:
a sample that agrees with float32 is taken to agree with float64 too (the two executions of the original differ
only at float32 near-ties, where a correct streamlined model follows float64); no sample that disagrees with both
is accepted.

The streamlined model runs in float32, its deployment arithmetic. Its integer parts are exact there, but a model
whose input is float keeps a float first layer: it accumulates in float32, and the thresholds of its quantizer are
float32 numbers, so no float execution of it is exact. A sample that disagrees with float64 execution of the
original is therefore run again with the streamlined model in float64; if it agrees then, or if a MultiThreshold of
a float tensor meets an input within :data:`FLOAT_LAYER_RTOL` of a threshold on that run (a float32 threshold is
that close to the real one) and flipping that element to the other side makes the outputs agree, the sample is a
near-tie of the streamlined model's own float layers (counted apart, with its site). Otherwise the streamlined
model computes something else in real arithmetic: an error, always (:meth:`FinalCheck.raise_for_errors`).
"""

from __future__ import annotations

import logging
import threading
from collections import ChainMap
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np
import onnx_ir as ir

from custom_ops.executor import Executor
from custom_ops.subgraph import executor_with_outputs, subgraph_model
from finnlite.core.errors import VerificationError
from finnlite.core.model import Model, as_model
from finnlite.core.traverse import constant_tensors, descendants, node_label, topo_order
from verify.annotations import AnnotationIssue, check_annotations, derived_ranges, observed_ranges
from verify.compare import is_integer_tensor, quant_step
from verify.locate import Divergence, first_divergence
from verify.proofs import ProofIssue, proof_inputs, proof_samples, prove_thresholds
from verify.reference import ReferenceData
from verify.region import run_nodes
from verify.tail import TailIssue, check_tail, tail_outputs64
from verify.ties import QUANTIZER_OPS, Margin, margin_at, near_elements
from verify.weights import WeightIssue, compare_weights

log = logging.getLogger(__name__)

__all__ = ["final_check", "FinalCheck", "OutputCheck", "TieSite", "integer_tail"]

_AFFINE = ("Mul", "Div", "Add", "Sub")
_SHAPE = ("Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity")


@dataclass
class OutputCheck:
    """The comparison of one output over all samples."""

    name: str
    compared_as: str
    samples: int = 0
    agree32: int = 0
    near_tie_samples: list[int] = field(default_factory=list)
    error_samples: list[int] = field(default_factory=list)
    #: samples where the streamlined model, run in float32, differs from float64 execution of the original but agrees
    #: when run in float64 itself: a float32 near-tie in its own float layers (a first layer on a float input)
    float_layer_ties: list[int] = field(default_factory=list)
    max_error64: float = 0.0
    unit: str = "steps"

    @property
    def ok(self) -> bool:
        return not self.error_samples


@dataclass
class TieSite:
    """Where a near-tie sample's float32 and float64 executions of the original first part: the quantizer node,
    its output tensor, the element, and the margin of its input in float64 (and float32)."""

    sample: int
    node: str
    tensor: str
    index: tuple[int, ...]
    margin64: Margin | None
    margin32: Margin | None

    def describe(self) -> str:
        text = f"sample {self.sample}: node '{self.node}' tensor '{self.tensor}' {self.index}"
        if self.margin64 is not None and self.margin32 is not None:
            text += (f": input {self.margin32.value:.9g} in float32 vs {self.margin64.value:.9g} in float64, "
                     f"boundary {self.margin64.boundary:.9g}, margin {self.margin64.relative:.2e}")
        elif self.margin64 is not None:
            text += (f": input {self.margin64.value:.9g} vs threshold {self.margin64.boundary:.9g}, relative margin "
                     f"{self.margin64.relative:.2e}")
        return text


@dataclass
class FinalCheck:
    """The result of :func:`final_check`: per output, how many samples agree with the float32 and float64
    executions of the original, and where the near-ties come from."""

    samples: int
    outputs: list[OutputCheck] = field(default_factory=list)
    tie_sites: list[TieSite] = field(default_factory=list)
    #: where the streamlined model's own float layers met a near-tie (margin measured on its float64 run)
    float_layer_sites: list[TieSite] = field(default_factory=list)
    float64_error: str | None = None
    #: false integer datatype claims (:mod:`verify.annotations`)
    annotation_issues: list[AnnotationIssue] = field(default_factory=list)
    #: output dequantizations whose scale or bias differ from the original's (:mod:`verify.tail`)
    tail_issues: list[TailIssue] = field(default_factory=list)
    #: where a failing output's divergence starts (:mod:`verify.locate`), when it can be told
    divergence: Divergence | None = None
    #: MultiThresholds (or their accumulators) proved different from the original's quantizers (:mod:`verify.proofs`)
    proof_issues: list[ProofIssue] = field(default_factory=list)
    #: streamlined weights that are not the original's up to a scale per output channel (:mod:`verify.weights`)
    weight_issues: list[WeightIssue] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True if every output agrees with float64 execution of the original on every sample, the output
        dequantization equals the original's, every datatype annotation holds and no threshold or weight matched
        to the original's differs from it."""
        return (self.float64_error is None and all(o.ok for o in self.outputs) and not self.annotation_issues
                and not self.tail_issues and not self.proof_issues and not self.weight_issues)

    @property
    def near_tie_samples(self) -> list[int]:
        """Samples that disagree with float32 execution of the original but agree with float64 (near-ties)."""
        return sorted({s for o in self.outputs for s in o.near_tie_samples})

    @property
    def float_layer_tie_samples(self) -> list[int]:
        """Samples on which the streamlined model agrees with float64 execution only when run in float64 itself."""
        return sorted({s for o in self.outputs for s in o.float_layer_ties})

    def summary(self) -> str:
        """A few lines for people."""
        lines = [f"final check against the original on {self.samples} samples:"]
        for o in self.outputs:
            agree64 = o.samples - len(o.error_samples) - len(o.float_layer_ties)
            lines.append(f"  output '{o.name}' ({o.compared_as}): float64 agrees on {agree64}/{o.samples}, float32 "
                         f"on {o.agree32}/{o.samples}, {len(o.near_tie_samples)} float32 near-tie sample(s); max "
                         f"deviation from float64 {o.max_error64:.3g} {o.unit}")
            if o.float_layer_ties:
                lines.append(f"    {len(o.float_layer_ties)} sample(s) {o.float_layer_ties[:8]} differ from float64 "
                             "by a near-tie in the streamlined model's own float layers (a first layer on a float "
                             "input: its thresholds are float32 numbers)")
        if self.float64_error:
            lines.append(f"  float64 execution of the original failed: {self.float64_error}")
        for site in self.tie_sites:
            lines.append(f"  near-tie {site.describe()}")
        for site in self.float_layer_sites:
            lines.append(f"  near-tie of the streamlined model's float layer, {site.describe()}")
        if self.divergence is not None:
            lines.append(f"  {self.divergence.describe()}")
        for issue in self.tail_issues:
            lines.append(f"  tail: {issue.describe()}")
        for p in self.proof_issues:
            lines.append(f"  threshold proof: {p.describe()}")
        for w in self.weight_issues:
            lines.append(f"  weights: {w.describe()}")
        for a in self.annotation_issues:
            lines.append(f"  false annotation: {a.describe()}")
        return "\n".join(lines)

    def raise_for_errors(self) -> None:
        """Raise :class:`VerificationError` if some output disagrees with float64 execution of the original."""
        if self.float64_error is not None:
            raise VerificationError(f"final check: cannot run the original in float64 ({self.float64_error})")
        # the most precise first: a weight comparison, a proof or a false claim names the fault itself, and a wrong
        # output dequantization explains outputs that differ (after the weights: a wrong last layer shows there too)
        for w in self.weight_issues:  # a proof: whatever else differs follows from it
            raise VerificationError(f"final check: the weights differ from the original layer '{w.layer}': "
                                    f"{w.message}", node=w.node, tensor=w.tensor)
        for t in self.tail_issues:
            if t.explains_levels:
                raise VerificationError(f"final check: {t.message}", node=t.node, tensor=t.output)
        for p in self.proof_issues:
            raise VerificationError(f"final check: against the original quantizer '{p.quantizer}': {p.message}",
                                    node=p.node, tensor=p.tensor)
        for a in self.annotation_issues:
            more = f" (and {len(self.annotation_issues) - 1} more false annotation(s))" \
                if len(self.annotation_issues) > 1 else ""
            raise VerificationError(f"final check: {a.source} {a.claim} is false: {a.message}{more}", node=a.node,
                                    tensor=a.tensor)
        for o in self.outputs:
            if o.error_samples:
                d = self.divergence
                where = f"; {d.describe()}" if d is not None else ""
                raise VerificationError(
                    f"final check: the streamlined model differs from float64 execution of the original on "
                    f"{len(o.error_samples)} of {o.samples} samples in output '{o.name}' (first: sample "
                    f"{o.error_samples[0]}; max deviation {o.max_error64:.6g} {o.unit}, compared {o.compared_as})"
                    f"{where}", node=d.node if d is not None else None, tensor=d.tensor if d is not None else o.name)
        for t in self.tail_issues:
            raise VerificationError(f"final check: {t.message}", node=t.node, tensor=t.output)


def integer_tail(model: Model, output: str) -> tuple[str, list[ir.Node]] | None:
    """``(q, tail)`` if graph output ``output`` is an integer-annotated tensor ``q`` followed by ``tail``: nodes
    that are constant Mul/Div/Add/Sub or shape ops (in execution order). None if there is no such tensor."""
    tail: list[ir.Node] = []
    name = output
    for _ in range(64):
        if is_integer_tensor(model, name):
            return name, list(reversed(tail))
        node = model.find_producer(name)
        if node is None:
            return None
        data = [v for v in node.inputs if v is not None and not _is_const(model, v)]
        if len(data) != 1 or len(node.outputs) != 1 or node.op_type not in _AFFINE + _SHAPE:
            return None
        if node.op_type in _SHAPE + ("Div",) and node.inputs[0] is not data[0]:
            return None
        tail.append(node)
        name = data[0].name
    return None


def _is_const(model: Model, v: ir.Value) -> bool:
    if v.const_value is not None or model.is_initializer(v.name):
        return True
    prod = v.producer()
    return prod is not None and prod.op_type == "Constant"


def _slice(arr: np.ndarray, i: int, b0: int) -> np.ndarray:
    return arr[i * b0:(i + 1) * b0]


def _tail_runner(model: Model, q: str, tail: list[ir.Node], example: np.ndarray) -> Any:
    consts: dict[str, np.ndarray] = {}
    for node in tail:
        for v in node.inputs:
            if v is not None and _is_const(model, v):
                if v.const_value is not None:
                    consts[v.name] = v.const_value.numpy()
                elif model.get_initializer(v.name) is not None:
                    consts[v.name] = model.get_initializer(v.name)
    nodes = list(tail)
    for node in tail:
        for v in node.inputs:
            prod = v.producer() if v is not None else None
            if prod is not None and prod.op_type == "Constant" and prod not in nodes:
                nodes.insert(0, prod)
    proto = subgraph_model(nodes, {q: example.astype(np.float64)}, consts, model.graph.opset_imports)
    return Executor(proto, dtype=np.float64)


def _tie_site(reference: ReferenceData, sample: int) -> TieSite | None:
    """The first quantizer of the original whose float32 and float64 levels differ on ``sample``."""
    original = reference.original()
    v32, v64 = reference.values(sample, np.float32), reference.values(sample, np.float64)
    for node in topo_order(list(original.graph)):
        if node.op_type not in QUANTIZER_OPS or not node.outputs:
            continue
        out = node.outputs[0].name
        if out not in v32 or out not in v64:
            continue
        step = quant_step(original, out)
        a, b = np.asarray(v32[out], np.float64), np.asarray(v64[out], np.float64)
        if a.shape != b.shape:
            continue
        half = 0.5 * np.broadcast_to(np.abs(np.asarray(step if step is not None else 0.0, np.float64)), a.shape)
        bad = np.flatnonzero(np.abs(a - b) > np.maximum(half, 1e-12))
        if bad.size:
            index = tuple(int(i) for i in np.unravel_index(int(bad[0]), a.shape))
            return TieSite(sample, node_label(node), out, index, margin_at(node, v64.get, index),
                           margin_at(node, v32.get, index))
    return None


#: a quantizer input this close (relative) to a rounding boundary in float64 execution of the original may be on
#: either side in real arithmetic: float64 accumulation (BLAS sums, fused multiply-adds) errs by more than this
REFERENCE_TIE_RTOL = 1e-12


def _reference_tie(reference: ReferenceData, sample: int) -> bool:
    """True if the first quantizer of the original whose float32 and float64 levels differ on ``sample`` has its
    float64 input within :data:`REFERENCE_TIE_RTOL` of the boundary: there float64 execution is no better a judge
    than float32 (e.g. ``a*w - a*w`` summed with a fused multiply-add is -1e-17, not 0, and a bipolar quantizer
    reads it as -1). A streamlined model that agrees with float32 execution there is at a near-tie, not wrong."""
    site = _tie_site(reference, sample)
    return site is not None and site.margin64 is not None and site.margin64.relative <= REFERENCE_TIE_RTOL


#: a threshold stored as a float32 number is within 2^-24 of the real one (relative); inputs this close to a
#: threshold on the float64 run of the streamlined model can be float-layer near-ties
FLOAT_LAYER_RTOL = 2.0**-22


def _float_layer_tie(model: Model, values: dict[str, np.ndarray], sample: int,
                     agrees: Callable[[Mapping[str, np.ndarray]], bool]) -> TieSite | None:
    """Explain a disagreement with float64 execution of the original by a near-tie of a quantizer of a float tensor
    (a first layer on a float input): an input element within :data:`FLOAT_LAYER_RTOL` of a threshold on the float64
    run ``values`` of ``model`` whose flip to the other side of the threshold makes the outputs agree (``agrees``,
    on a re-run of everything after that quantizer). Returns the site, or None if no such near-tie explains it."""
    const = constant_tensors(model)
    lookup = lambda t: values.get(t, model.get_initializer(t))  # noqa: E731
    for node in topo_order(list(model.graph)):
        if node.op_type != "MultiThreshold" or not node.inputs or node.inputs[0] is None:
            continue
        name = node.inputs[0].name
        if name in const or is_integer_tensor(model, name):
            continue
        found = near_elements(node, lookup, FLOAT_LAYER_RTOL, limit=8)
        if not found:
            continue
        out = node.outputs[0].name
        scale_attr = node.attributes.get("out_scale")
        scale = float(scale_attr.value) if scale_attr is not None else 1.0
        later = topo_order([n for n in model.graph if id(n) in descendants(model, [out])[0]])
        candidates = [[f] for f in found] + ([found] if len(found) > 1 else [])
        for flips in candidates:
            flipped = np.array(values[out], copy=True)
            for index, margin in flips:  # the other side of the threshold: one level less (x ≥ t) or more
                flipped[index] += -scale if margin.value >= margin.boundary else scale
            rerun = run_nodes(model, later, [ChainMap({out: flipped}, values)], set(), const, np.float64)[0]
            if agrees(ChainMap(rerun, {out: flipped}, values)):
                index, margin = flips[0]
                return TieSite(sample, node_label(node), out, index, margin, None)
    return None


class _Sample(dict):
    """One sample's outputs (already sliced), as opposed to outputs stacked over all samples."""


class _LazyFloat64:
    """The original's float64 outputs, computed per sample on first use (module docstring: only samples that
    disagree with its float32 execution, or that the tail check asks for)."""

    def __init__(self, reference: ReferenceData, b0: int) -> None:
        self.reference, self.b0 = reference, b0
        self.cache: dict[int, dict[str, np.ndarray]] = {}

    def sample(self, i: int) -> dict[str, np.ndarray]:
        if i not in self.cache:
            self.cache[i] = self.reference.executor(np.float64).run(self.reference.sample(i))
        return self.cache[i]


def _quietly(fn: Callable[..., Any], *args: Any) -> None:
    """``fn(*args)`` on a helper thread; what it raises is only logged: the caller asks again on its own thread,
    where the error is raised and reported."""
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001
        log.debug("computing ahead failed (asked again later): %s", exc)


class _FinalRun:
    """One final check's shared state (:func:`final_check`): the streamlined model's values on every sample, the
    original's outputs, and the :class:`FinalCheck` being filled in. Each check is one method over it."""

    def __init__(self, reference: ReferenceData, model: Model, float_rtol: float) -> None:
        self.reference, self.m, self.float_rtol = reference, model, float_rtol
        self.n = reference.num_samples
        self.b0 = reference.specs[0].batch0
        self.result = FinalCheck(self.n)
        self.tails = {o: integer_tail(model, o) for o in model.output_names}
        #: the integer tensors before the outputs' tails (run as extra outputs of the streamlined model)
        self.extra = [t[0] for t in self.tails.values() if t is not None]
        #: per sample, the streamlined model's outputs and integer tensors before their tails
        self.slices: list[dict[str, np.ndarray]] = [{} for _ in range(self.n)]
        self.ref32: dict[str, np.ndarray] = {}
        self.lazy64 = _LazyFloat64(reference, self.b0)  # the original's float64 outputs, per sample on demand
        self.runners: dict[str, Any] = {}  # per output, its dequantization tail run in float64
        self.tail64: dict[int, dict[str, np.ndarray]] = {}  # the original's float64 outputs from its tail
        self.in64: Any = None  # the streamlined model run in float64 (its own float layers)

    # -- the streamlined model's run, and the checks riding on it ---------------------------------------------
    def run_streamlined(self, annotations: bool, proofs: bool) -> dict[int, dict[str, np.ndarray]]:
        """One run of the streamlined model per sample, every tensor: the annotations' values, the proofs' inputs
        and the outputs (with the integer tensors before their tails). The weights are compared first, the
        thresholds proved after. Returns the original's float64 outputs the proofs computed, by sample."""
        m, reference, n, result = self.m, self.reference, self.n, self.result
        keep = proof_inputs(m, reference) if proofs else set()
        kept: dict[int, dict[str, np.ndarray]] = \
            {i: {} for i in range(min(n, proof_samples(reference, m)))} if keep else {}
        original32 = None
        if len(kept) < n:
            # the original's float32 outputs on a helper thread while this one runs the streamlined model
            # (onnxruntime and numpy's kernels release the GIL), and before the proofs, whose float64 run would drop
            # the executor; when the proofs run every sample, their run gives the outputs (ReferenceData.outputs)
            original32 = threading.Thread(target=_quietly, args=(reference.outputs, np.float32), daemon=True)
            original32.start()
        proved: set[str] = set()  # the streamlined layers whose weights are proved equal to the original's
        if proofs:
            result.weight_issues = compare_weights(m, reference.original(), proved, reference.folded)
        executor = executor_with_outputs(m, self.extra)
        want = set(m.output_names) | set(self.extra)

        def each(i: int, values: dict[str, np.ndarray]) -> None:
            self.slices[i] = {k: values[k] for k in want}
            if i in kept:
                kept[i] = {k: values[k] for k in keep if k in values}

        ranges = derived_ranges(m) if annotations or keep else None
        if annotations:
            result.annotation_issues = check_annotations(m, reference, executor=executor, each=each, derived=ranges)
        else:
            observed_ranges(m, reference, [], executor=executor, each=each)
        del executor
        if original32 is not None:
            original32.join()
        outputs64: dict[int, dict[str, np.ndarray]] = {}  # the original's, from the proofs' float64 runs
        if kept:
            try:
                result.proof_issues = prove_thresholds(m, reference, [kept[i] for i in sorted(kept)], sorted(kept),
                                                       ranges=ranges, outputs64=outputs64, proved_layers=proved)
            except Exception as exc:  # noqa: BLE001 - a proof that cannot run proves nothing; the other checks stand
                log.warning("could not compare the thresholds with the original quantizers: %s", exc)
            kept.clear()
        return outputs64

    def load_original(self, outputs64: dict[int, dict[str, np.ndarray]]) -> None:
        """The original's float32 outputs on every sample; its float64 ones come per sample, when asked for (those
        the proofs computed are known already)."""
        self.ref32 = self.reference.outputs(np.float32)
        self.lazy64.cache.update(outputs64)

    def _ref64(self, i: int) -> _Sample | None:
        """The original's float64 outputs for sample ``i``; None if they cannot be computed (the error is
        recorded)."""
        try:
            return _Sample(self.lazy64.sample(i))
        except Exception as exc:  # noqa: BLE001 - reported, and makes the check fail
            self.result.float64_error = f"{type(exc).__name__}: {exc}"
            return None

    # -- comparing the outputs ---------------------------------------------------------------------------------
    def deviation(self, out: str, values: Mapping[str, np.ndarray], ref: Any, i: int) -> float:
        """How far output ``out`` of ``values`` is from ``ref``'s on sample ``i``: in quantization steps behind an
        integer tail, else relative to the magnitude of the original's float32 output."""
        tail = self.tails[out]
        expected = (ref[out] if isinstance(ref, _Sample) else _slice(ref[out], i, self.b0)).astype(np.float64)
        if tail is None:
            mag = max(float(np.max(np.abs(_slice(self.ref32[out], i, self.b0)))), 1e-30)
            return float(np.max(np.abs(values[out].astype(np.float64) - expected), initial=0.0)) / mag
        qi = values[tail[0]].astype(np.float64)
        runner = self.runners.get(out)
        if runner is None:
            y, step = qi, np.ones_like(qi)
        else:
            y = runner.run({tail[0]: qi})[out]
            step = np.abs(runner.run({tail[0]: qi + 1})[out] - y)
        step = np.where(step > 0, step, np.inf)
        return float(np.max(np.abs(y - expected) / step, initial=0.0))

    def compare_output(self, out: str, tail_samples: int) -> None:
        """Compare output ``out`` on every sample with both executions of the original, then its dequantization."""
        tail = self.tails[out]
        if out not in self.ref32:
            raise VerificationError("the streamlined model has an output the original lacks", tensor=out)
        if tail is not None:
            q, nodes = tail
            check = OutputCheck(out, f"levels of integer tensor '{q}'" + (
                f" through {len(nodes)} dequantization node(s)" if nodes else ""), self.n)
            if nodes:
                self.runners[out] = _tail_runner(self.m, q, nodes, self.slices[0][q])
        else:
            check = OutputCheck(out, f"float, rtol {self.float_rtol:g} of the output's magnitude", self.n,
                                unit="x magnitude")
        limit = 0.5 if tail is not None else self.float_rtol
        agree32: set[int] = set()
        for i in range(self.n):
            self._compare_sample(check, i, limit, agree32)
        self.result.outputs.append(check)
        if tail is not None and out in self.runners and tail_samples > 0 and self.result.float64_error is None:
            self._check_tail(check, tail, agree32, tail_samples)

    def _compare_sample(self, check: OutputCheck, i: int, limit: float, agree32: set[int]) -> None:
        """Sample ``i`` of output ``check.name``: agreement with float32 execution of the original, then with
        float64 (a near-tie, an own float-layer near-tie, or an error)."""
        out = check.name
        ok32 = self.deviation(out, self.slices[i], self.ref32, i) < limit
        check.agree32 += int(ok32)
        if ok32:  # then it agrees with float64 too (module docstring)
            agree32.add(i)
            return
        ref64 = self._ref64(i)
        if ref64 is None:
            if not ok32:
                check.error_samples.append(i)
            return
        d64 = self.deviation(out, self.slices[i], ref64, i)
        if d64 >= limit:
            d64 = self._own_float_layers(check, i, ref64, limit)
        if d64 >= limit and ok32 and _reference_tie(self.reference, i):
            d64 = 0.0  # float64 execution of the original is itself within its rounding of a boundary
        check.max_error64 = max(check.max_error64, d64)
        if d64 >= limit:
            check.error_samples.append(i)
        elif not ok32 and i not in check.float_layer_ties:
            check.near_tie_samples.append(i)

    def _own_float_layers(self, check: OutputCheck, i: int, ref64: Any, limit: float) -> float:
        """The deviation of sample ``i`` once the streamlined model's own float parts (a first layer on a float
        input) are ruled out: it runs in float64; if it still differs, a near-tie at a quantizer of a float tensor
        (its thresholds are float32 numbers: they cannot be exact there) may explain it (0 then)."""
        out = check.name
        if self.in64 is None:
            self.in64 = executor_with_outputs(self.m, self.extra, np.float64)
        values64 = self.in64.run(self.reference.sample(i), return_all=True)
        d64 = self.deviation(out, values64, ref64, i)
        if d64 < limit:
            check.float_layer_ties.append(i)
            return d64
        site = _float_layer_tie(self.m, values64, i, lambda vals: self.deviation(out, vals, ref64, i) < limit)
        if site is None:
            return d64
        check.float_layer_ties.append(i)
        self.result.float_layer_sites.append(site)
        return 0.0

    def _check_tail(self, check: OutputCheck, tail: tuple[str, list[ir.Node]], agree32: set[int],
                    tail_samples: int) -> None:
        """The output dequantization's scale and bias as numbers (:mod:`verify.tail`), on samples whose levels
        agree and on those that do not: if the original's output is exactly affine in the streamlined levels there
        too, the levels are right and the dequantization's constants are not."""
        out, lazy64 = check.name, self.lazy64
        wrong = set(check.error_samples)
        agreeing = [i for i in range(self.n) if i not in wrong and i not in check.float_layer_ties]
        have = [i for i in agreeing if i in lazy64.cache]  # run in float64 already
        chosen = (have or agreeing)[:tail_samples]
        # where the levels agree with float32 execution, the original's tail alone in float64 from those levels
        # (not the whole network): a sample where float32 and float64 execution part is run whole
        fresh = [i for i in chosen if i not in lazy64.cache and i in agree32]
        chosen += [i for i in check.error_samples][:8]
        triples = []
        try:
            if any(i not in self.tail64 for i in fresh):
                self.tail64.update(tail_outputs64(self.reference, [i for i in fresh if i not in self.tail64]) or {})
            for i in chosen:
                if i not in lazy64.cache and i in agree32 and i in self.tail64:
                    y64 = self.tail64[i][out]
                else:
                    y64 = lazy64.sample(i)[out]
                triples.append((i, self.slices[i][tail[0]], y64))
        except Exception as exc:  # noqa: BLE001 - reported, and makes the check fail
            self.result.float64_error = f"{type(exc).__name__}: {exc}"
        issue = check_tail(out, tail[0], self.runners[out], tail[1], triples)
        # where the levels differ and the constants do not explain it, the levels are wrong: the output's error (and
        # the first diverging tensor) says so, not the tail
        if issue is not None and (issue.explains_levels or not check.error_samples):
            self.result.tail_issues.append(issue)

    # -- explaining ------------------------------------------------------------------------------------------
    def locate(self) -> None:
        """After a failure, the first intermediate tensor that diverges (:mod:`verify.locate`)."""
        result = self.result
        failing = sorted({s for o in result.outputs for s in o.error_samples})
        if not failing:
            return
        others = [i for i in range(self.n) if i != failing[0]][:3]
        try:
            result.divergence = first_divergence(self.m, self.reference, [failing[0]] + others)
        except Exception as exc:  # noqa: BLE001 - a location is a bonus, the failure stands
            log.warning("could not locate the first diverging tensor: %s", exc)
        bad_tail = next((self.tails[o.name] for o in result.outputs if o.error_samples and self.tails.get(o.name)),
                        None)
        if result.divergence is None and bad_tail is not None:  # nothing shared diverges before the output's q
            producer = self.m.find_producer(bad_tail[0])
            result.divergence = Divergence(bad_tail[0], node_label(producer) if producer is not None else None,
                                           "the output's integer tensor; no tensor shared with the original "
                                           "diverges before it")

    def explain_ties(self, explain: int) -> None:
        """For the first ``explain`` near-tie samples, the quantizer where float32 and float64 execution part."""
        samples = self.result.near_tie_samples[:explain]
        try:  # each dtype's values for every sample in turn: the reference keeps one executor at a time
            for dtype in (np.float32, np.float64):
                for i in samples:
                    self.reference.values(i, dtype)
        except Exception as exc:  # noqa: BLE001 - each sample below tries again and says what failed
            log.debug("could not compute the near-tie samples' values: %s", exc)
        for i in samples:
            try:
                site = _tie_site(self.reference, i)
            except Exception as exc:  # noqa: BLE001 - an explanation is a bonus, the counts stand
                log.warning("could not locate the near-tie of sample %d: %s", i, exc)
                site = None
            if site is not None:
                self.result.tie_sites.append(site)


def final_check(reference: ReferenceData, model: Any, *, float_rtol: float = 1e-5, explain: int = 4,
                annotations: bool = True, tail_samples: int = 2, locate: bool = True,
                proofs: bool = True) -> FinalCheck:
    """Compare ``model`` (the streamlined model, run in float32) with the original model of ``reference`` run in
    float32 and in float64, on every reference sample (module docstring). ``explain``: for how many near-tie
    samples to find the quantizer where float32 and float64 execution of the original part.

    Further checks (each a failure of its own): ``annotations``: every integer datatype claim of ``model`` against
    the values seen on the samples and the ranges derived from the graph (:mod:`verify.annotations`);
    ``tail_samples``: on that many samples whose levels agree (those the proofs ran the original in float64 on, if
    any; else its tail from the last quantizers runs in float64 on them, :func:`verify.tail.tail_outputs64`), the
    output dequantization's scale and bias as numbers (:mod:`verify.tail`); ``locate``: after a failure, the first
    intermediate tensor that diverges (:mod:`verify.locate`); ``proofs``: every MultiThreshold matched to a quantizer
    of the original, on every integer input of its range (:mod:`verify.proofs`), and every weight matched to an
    original layer, element by element (:mod:`verify.weights`)."""
    run = _FinalRun(reference, as_model(model), float_rtol)
    outputs64 = run.run_streamlined(annotations, proofs)
    run.load_original(outputs64)
    for out in run.m.output_names:
        run.compare_output(out, tail_samples)
    if locate:
        run.locate()
    run.explain_ties(explain)
    return run.result
