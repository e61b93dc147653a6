"""The convert stage: QONNX quantizers → FINN-ONNX integer compute.

Passes, in order (:data:`CONVERT_PASSES`; :func:`convert_passes` for configured instances):

0. :class:`InferMissingShapes` — shapes where they are missing (a no-op after the tidy stage), since per-channel
   parameters need the rank of the tensor they scale.
1. :class:`~streamline.convert_weights.FoldQuantWeights` — constant quantizers (weights, biases) become integer
   initializers annotated with their exact datatype, the scale a Mul after the consumer (FINN's form, default) or,
   with ``scale_placement="before"``, in front of it (bit-exact); biases become their exact float constants.
2. :class:`~streamline.convert_acts.ConvertQuantActToMultiThreshold` — activation Quants become MultiThreshold
   [+ Add] [+ Mul], bit-exact on every float32 input.
3. :class:`~streamline.convert_acts.ConvertBipolarQuantActToMultiThreshold` — the same for BipolarQuant.
4. :class:`~streamline.convert_trunc.AvgPoolAndTruncToQuantAvgPool` — AveragePool + Trunc → QuantAvgPool2d + Mul
   (it needs the integer annotations step 2 produces).
5. :class:`~streamline.convert_trunc.ConvertTruncToMultiThreshold` — the remaining (version-2) Truncs.

What stays a quantizer is reported through the rules' misses (the pass manager collects them) with the reason:
non-constant parameters, parameters varying along two axes, more than ``max_threshold_bits`` bits (also logged as a
warning), a weight scale that does not commute with its consumer, a version-1 Trunc outside the pooling pattern.

What is exact (and the verification policy each pass declares): steps 2–5 are bit-exact in float32 (``equality``),
up to the sign of a zero result (a quantizer maps inputs just below zero to −0.0 where the converted graph gives
+0.0; equal as numbers). Step 1 is bit-exact with ``scale_placement="before"`` (``equality``), and with "after"
whenever the moved scales multiply exactly (power-of-two scales, as in the BNN-PYNQ models); otherwise it is exact
in real arithmetic and differs from float32 execution by the rounding of the consumer's sums (the default tolerance
policy, with one-step quantizer differences at float32 near-ties accepted).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from finnlite.core.passes import Pass, Transformation, register_pass
from streamline.convert_acts import ConvertBipolarQuantActToMultiThreshold, ConvertQuantActToMultiThreshold
from streamline.convert_common import DEFAULT_MAX_THRESHOLD_BITS
from streamline.convert_trunc import AvgPoolAndTruncToQuantAvgPool, ConvertTruncToMultiThreshold
from streamline.convert_weights import FoldQuantWeights, ScalePlacement

if TYPE_CHECKING:
    from finnlite.core.model import Model

__all__ = ["CONVERT_PASSES", "convert_passes", "convert", "InferMissingShapes", "FoldQuantWeights",
           "ConvertQuantActToMultiThreshold", "ConvertBipolarQuantActToMultiThreshold",
           "AvgPoolAndTruncToQuantAvgPool", "ConvertTruncToMultiThreshold", "DEFAULT_MAX_THRESHOLD_BITS"]


@register_pass(group="convert")
class InferMissingShapes(Transformation):
    """Infer the shapes of tensors that have none (a no-op after the tidy stage). Changes no node."""

    def apply(self, model: "Model") -> bool:
        if any(o.shape is None for n in model.graph for o in n.outputs):
            model.infer_shapes(only_missing=True)
        return False


#: The convert stage with default options, in order (classes; the pass manager instantiates them).
CONVERT_PASSES: list[type[Pass]] = [InferMissingShapes, FoldQuantWeights, ConvertQuantActToMultiThreshold,
                                    ConvertBipolarQuantActToMultiThreshold, AvgPoolAndTruncToQuantAvgPool,
                                    ConvertTruncToMultiThreshold]


def convert_passes(scale_placement: ScalePlacement = "after",
                   max_threshold_bits: int = DEFAULT_MAX_THRESHOLD_BITS, absorb_relu: bool = True) -> list[Pass]:
    """The convert stage as configured pass instances (for a ``Stage`` of the pass manager)."""
    return [InferMissingShapes(), FoldQuantWeights(scale_placement=scale_placement),
            ConvertQuantActToMultiThreshold(max_threshold_bits=max_threshold_bits, absorb_relu=absorb_relu),
            ConvertBipolarQuantActToMultiThreshold(max_threshold_bits=max_threshold_bits, absorb_relu=absorb_relu),
            AvgPoolAndTruncToQuantAvgPool(), ConvertTruncToMultiThreshold(max_threshold_bits=max_threshold_bits)]


def convert(model: "Model", **options: Any) -> Any:
    """Run the convert stage on ``model`` in place (options as :func:`convert_passes`), then drop dead nodes and
    unused initializers (no constant folding). Returns the pass manager's report (misses included)."""
    from finnlite.core.passes import PassManager, Stage

    report = PassManager([Stage("convert", convert_passes(**options))]).run(model)
    model.cleanup(fold_constants=False)
    return report
