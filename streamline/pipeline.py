"""The default pipeline: the ordered stages that take a QONNX model to FINN-ONNX.

``default_stages()`` lists them; :func:`streamline_model` runs them on a :class:`finnlite.Model` in place with a
:class:`finnlite.PassManager` and returns what happened. One pipeline for every model, no per-model step lists:

1. ``tidy`` — QDQ chains → Quant (:mod:`streamline.convert_qcdq`), shapes, constant folding, Gemm → MatMul,
   Conv bias → Add, Sub → Add (exact in float32);
2. ``convert`` — weight quantizers folded into integer initializers, activation quantizers → MultiThreshold,
   AveragePool + Trunc → QuantAvgPool2d (bit-exact in float32 where the scales allow);
3. ``streamline`` (to a fixpoint) — collapse ∘ reorder ∘ absorb: every scale and bias moves forward and into the
   next MultiThreshold's exact thresholds;
4. ``lower`` — Conv → Im2Col + MatMul, MaxPool → MaxPoolNHWC, NHWC with one Transpose at the input, XNOR-popcount
   for bipolar layers, TopK, threshold rounding;
5. ``restreamline`` (to a fixpoint) — the same rules again on what lowering exposed;
6. ``finalize`` — global-pool outputs squeezed to [N, C] before a classifier MatMul, global sums in FINN's
   lowered-pooling form, datatypes, integer thresholds, dead nodes.

The fixpoint stages terminate: every rule moves a constant forward, merges two nodes or removes one, and the pass
manager detects oscillation and caps the rounds regardless.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from finnlite.core.errors import ConfigError
from finnlite.core.model import Model
from finnlite.core.passes import PassManager, PassResult, RunReport, Stage, Transformation, register_pass
from finnlite.core.validate import validate_model
from streamline.absorb import ABSORB_PASSES, MaterializeThresholds
from streamline.absorb_monotone import MONOTONE_PASSES
from streamline.channel_gather import (AbsorbChannelGatherIntoWeights, CollapseDataMovement,
                                       MoveChannelGatherPastChannelwise)
from streamline.collapse import COLLAPSE_PASSES
from streamline.convert import CONVERT_PASSES
from streamline.datatypes import InferDataTypes
from streamline.finn_pool import LowerGlobalSum
from streamline.finn_tail import MoveOutputScaleBeforeLayout
from streamline.join import IntegerJoinMultipliers
from streamline.join_conv import IntegerConvInputScales
from streamline.lower import LOWER_PASSES
from streamline.monotone_movement import MoveMonotonePastDataMovement
from streamline.pool_sign import AbsorbChannelSignIntoMultiThreshold, ShiftSignedLevelsPastPaddedMaxPool
from streamline.reduce import REDUCE_PASSES
from streamline.preprocess import MoveAddPastPaddedConv
from streamline.border import AbsorbBorderIntoThresholds
from streamline.reorder import REORDER_PASSES
from streamline.round_thresholds import RoundAndClipThresholds
from streamline.squeeze_pool import SqueezeGlobalPoolOutput
from streamline.tidy import TIDY_PASSES, MakeNodeNamesUnique


@register_pass(group="finalize")
class RemoveDeadNodes(Transformation):
    """Remove nodes whose outputs nothing reads and initializers nothing reads (no constant folding)."""

    aliases = ("RemoveUnusedNodes", "RemoveUnusedTensors")

    def apply(self, model: Any) -> bool:
        return model.cleanup(fold_constants=False)


class _StagesPass(Transformation):
    """Runs default stages as one pass (FINN's names for what a stage does; see :func:`default_stages`)."""

    group = "stage"
    stages: tuple[str, ...] = ()

    def run(self, model: Any, declined: frozenset[str] = frozenset()) -> PassResult:
        report = PassManager(select_stages(default_stages(), self.stages)).run(model)
        return PassResult(any(r.changed for r in report.records), sum(r.rewrites or 0 for r in report.records),
                          tuple(report.misses))


def streamline_passes() -> list:
    """One round of the streamlining fixpoint: datatypes first (the rules read them), then collapse, reorder,
    absorb, and the thresholds re-materialized for the datatypes the round produced. Joins of differently scaled
    branches read only by thresholds take integer multipliers (:mod:`streamline.join`) before the reorder rules
    would equalize their scales by the exact ratio."""
    return [InferDataTypes, *COLLAPSE_PASSES, CollapseDataMovement, IntegerJoinMultipliers, IntegerConvInputScales,
            *REORDER_PASSES, MoveMonotonePastDataMovement, MoveChannelGatherPastChannelwise,
            AbsorbChannelGatherIntoWeights, *REDUCE_PASSES, AbsorbBorderIntoThresholds, MoveAddPastPaddedConv,
            *ABSORB_PASSES, AbsorbChannelSignIntoMultiThreshold, ShiftSignedLevelsPastPaddedMaxPool,
            *MONOTONE_PASSES, RemoveDeadNodes, InferDataTypes, MaterializeThresholds]


def default_stages() -> list[Stage]:
    """The stages of the default pipeline, in order."""
    return [
        Stage("tidy", TIDY_PASSES),
        Stage("convert", CONVERT_PASSES),
        Stage("streamline", streamline_passes(), fixpoint=True),
        # LowerConvsToMatMul, ConvertToNHWC and the XNOR conversion each rewrite every layer: checked together at
        # the stage's end, the network runs once (twice where a changed encoding has to re-converge)
        Stage("lower", LOWER_PASSES, check_whole=True),
        Stage("restreamline", streamline_passes(), fixpoint=True),
        Stage("finalize", [SqueezeGlobalPoolOutput, LowerGlobalSum, MoveOutputScaleBeforeLayout, InferDataTypes,
                           RoundAndClipThresholds, RemoveDeadNodes, InferDataTypes, MakeNodeNamesUnique]),
    ]


@register_pass
class ConvertQONNXtoFINN(_StagesPass):
    """The tidy and convert stages as one pass: QONNX → FINN-ONNX (integer weights, MultiThreshold activations),
    as FINN's transformation of this name."""

    stages = ("tidy", "convert")


@register_pass
class Streamline(_StagesPass):
    """The streamline stage as one pass: scales and biases moved and absorbed to a fixpoint, as FINN's
    transformation of this name."""

    stages = ("streamline",)


def stage_names() -> list[str]:
    """Names of the default stages, in order."""
    return [s.name for s in default_stages()]


@dataclass
class StreamlineResult:
    """The outcome of a pipeline run: the pass manager's report, op histograms and the wall time."""

    report: RunReport
    histogram_before: dict[str, int]
    histogram_after: dict[str, int]
    seconds: float
    stages: list[str] = field(default_factory=list)


def select_stages(stages: Sequence[Stage], only: Sequence[str] | None) -> list[Stage]:
    """The stages named in ``only`` (in pipeline order); a :class:`ConfigError` for an unknown name."""
    if only is None:
        return list(stages)
    unknown = set(only) - {s.name for s in stages}
    if unknown:
        raise ConfigError(f"unknown stage(s) {sorted(unknown)}; the stages are {[s.name for s in stages]}")
    return [s for s in stages if s.name in only]


def streamline_model(model: Model, stages: Sequence[Stage] | None = None, hooks: Iterable[Any] = (),
                     only: Sequence[str] | None = None, validate: bool = True) -> StreamlineResult:
    """Run the pipeline on ``model`` in place. ``only`` selects stages by name (in pipeline order). With
    ``validate`` (the default) the model is first checked as an input (:func:`finnlite.core.validate.validate_model`),
    so that a malformed graph or a bad quantizer parameter is reported up front, naming the node."""
    stages = select_stages(list(stages) if stages is not None else default_stages(), only)
    if validate:
        validate_model(model)
    before = model.op_histogram()
    t0 = time.perf_counter()
    report = PassManager(stages, hooks).run(model)
    return StreamlineResult(report, before, model.op_histogram(), time.perf_counter() - t0,
                            [s.name for s in stages])
