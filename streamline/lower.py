"""The lower stage: from a streamlined NCHW graph to the FINN-ONNX that FINN's ``step_convert_to_hw`` accepts.

What FINN's hardware conversion expects, and the pass that provides it:

* ``Im2Col`` (NHWC, ``pad_amount``, ``pad_value`` 0, ``depthwise``) + ``MatMul`` with a ``[K, N]`` integer
  weight → ConvolutionInputGenerator (+ FMPadding) and MVAU, or VVAU when the weight carries the depthwise
  ``tensor_sparsity`` annotation: :class:`~streamline.lower_conv.LowerConvsToMatMul` (grouped convolutions with a
  block-diagonal weight);
* ``FMPadding_Pixel`` + ``Im2Col`` + ``MatMul`` for a transposed convolution (FINN's pixel-padding deconvolution):
  :class:`~streamline.lower_deconv.LowerConvTransposeToMatMul`;
* ``MaxPoolNHWC`` → StreamingMaxPool or Pool: :class:`~streamline.lower_pool.MakeMaxPoolNHWC`; an integer
  average as ``Im2Col → Reshape → ReduceSum`` and a scale (an accumulating Pool):
  :class:`~streamline.lower_pool.LowerAveragePool`;
* DepthToSpace and SpaceToDepth as Reshape–Transpose–Reshape (:class:`~streamline.lower_space.LowerDepthToSpace`),
  folded into the layout by the NHWC conversion (FINN's Shuffle where one Transpose stays);
* NHWC everywhere, MultiThreshold with ``data_layout`` NHWC (Thresholding/MVAU activations), NHWC Add streams,
  Concat on the last axis, a flatten feeding the classifier's MVAU with permuted weight rows, and layout
  annotations: :class:`~streamline.layout.ConvertToNHWC` (one Transpose left, at the graph input), with FINN's
  local rules :class:`~streamline.layout.AbsorbTransposeIntoMultiThreshold` and
  :class:`~streamline.layout.AbsorbConsecutiveTransposes` for any Transposes left over;
* ``XnorPopcountMatMul`` with BINARY operands for bipolar layers (binary MVAU):
  :class:`~streamline.xnor.ConvertBipolarMatMulToXnorPopcount`;
* a TopK on an integer tensor (LabelSelect): :class:`~streamline.topk.AbsorbScalarMulAddIntoTopK`;
* integer, clipped thresholds with a threshold datatype: :class:`~streamline.round_thresholds.RoundAndClipThresholds`.

1-D networks (Conv1d, MaxPool1d on ``(N, C, W)``) first become 2-D ones with a trailing axis of size 1:
:class:`~streamline.lower_1d.Change3DTo4DTensors`.

``LOWER_PASSES`` is the stage's order: lowering makes NHWC islands, the layout pass joins them, the binary and
TopK rules then see the final structure, and thresholds are rounded last (the XNOR rewrite moves thresholds).
Datatypes are inferred once, after the XNOR rule (which proves bipolar inputs structurally) and before the two
rules that read integer input datatypes; every tensor the passes create is annotated as it is made.
"""

from __future__ import annotations

from streamline.datatypes import InferDataTypes
from streamline.layout import AbsorbConsecutiveTransposes, AbsorbTransposeIntoMultiThreshold, ConvertToNHWC
from streamline.lower_1d import Change3DTo4DTensors
from streamline.lower_conv import LowerConvsToMatMul
from streamline.lower_deconv import LowerConvTransposeToMatMul
from streamline.lower_pool import LowerAveragePool, MakeMaxPoolNHWC
from streamline.lower_space import LowerDepthToSpace
from streamline.round_thresholds import RoundAndClipThresholds
from streamline.topk import AbsorbScalarMulAddIntoTopK
from streamline.xnor import ConvertBipolarMatMulToXnorPopcount

#: The lower stage, in order (classes; the pass manager instantiates them).
LOWER_PASSES = [
    Change3DTo4DTensors,
    LowerConvsToMatMul,
    LowerConvTransposeToMatMul,
    MakeMaxPoolNHWC,
    LowerAveragePool,
    LowerDepthToSpace,
    ConvertToNHWC,
    AbsorbTransposeIntoMultiThreshold,
    AbsorbConsecutiveTransposes,
    ConvertBipolarMatMulToXnorPopcount,
    InferDataTypes,
    AbsorbScalarMulAddIntoTopK,
    RoundAndClipThresholds,
]

__all__ = ["LOWER_PASSES", "Change3DTo4DTensors", "LowerConvsToMatMul", "LowerConvTransposeToMatMul", "MakeMaxPoolNHWC",
           "LowerAveragePool", "LowerDepthToSpace", "ConvertToNHWC",
           "AbsorbTransposeIntoMultiThreshold", "AbsorbConsecutiveTransposes", "ConvertBipolarMatMulToXnorPopcount",
           "AbsorbScalarMulAddIntoTopK", "RoundAndClipThresholds"]
