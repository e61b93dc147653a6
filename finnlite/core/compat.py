"""Version glue for onnx and onnxruntime.

onnx >= 1.22 stamps IR version 14 on every model ``onnx.helper.make_model`` builds, and onnxruntime 1.31 accepts at
most 13. Every model finnlite builds or hands to onnxruntime therefore gets an explicit IR version from here.
"""

from __future__ import annotations

from typing import Any, Sequence

import onnx
from onnx import helper

#: The IR version finnlite writes: supported by onnxruntime >= 1.16 and by qonnx/FINN's tools.
IR_VERSION = 10
#: The default ONNX opset of the models finnlite builds (Brevitas exports use 20 as well).
OPSET = 20
QONNX_DOMAIN = "qonnx.custom_op.general"


def fix_ir_version(model: onnx.ModelProto, ir_version: int = IR_VERSION) -> onnx.ModelProto:
    """Set ``model.ir_version`` to one onnxruntime accepts (in place, returned for chaining); an older IR version
    is kept."""
    if model.ir_version == 0 or model.ir_version > ir_version:
        model.ir_version = ir_version
    return model


def make_model(graph: onnx.GraphProto, opset: int = OPSET, custom_opset: int | None = 1,
               extra_opsets: Sequence[tuple[str, int]] = (), **kwargs: Any) -> onnx.ModelProto:
    """``onnx.helper.make_model`` with a supported IR version and the opsets finnlite uses (the default domain at
    ``opset`` and, unless ``custom_opset`` is None, the qonnx custom-op domain)."""
    opsets = [helper.make_opsetid("", opset)]
    if custom_opset is not None:
        opsets.append(helper.make_opsetid(QONNX_DOMAIN, custom_opset))
    opsets += [helper.make_opsetid(d, v) for d, v in extra_opsets]
    kwargs.setdefault("producer_name", "finnlite")
    model = helper.make_model(graph, opset_imports=opsets, **kwargs)
    return fix_ir_version(model)


def ort_session(model: onnx.ModelProto | bytes, optimize: bool = False, threads: int | None = None) -> Any:
    """An onnxruntime CPU session for ``model`` with its IR version fixed.

    ``optimize=False`` (the default) disables graph optimizations, so that fused kernels (Conv+BatchNorm, Gemm
    from MatMul+Add, ...) do not change float results: each node computes what it computes on its own."""
    import onnxruntime as ort

    if isinstance(model, (bytes, bytearray)):
        proto = onnx.ModelProto()
        proto.ParseFromString(bytes(model))
        model = proto
    if model.ir_version > IR_VERSION:
        model = onnx.ModelProto.FromString(model.SerializeToString())
        fix_ir_version(model)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")  # idle threads sleep: see custom_ops.plan
    if threads is not None:
        opts.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), sess_options=opts, providers=["CPUExecutionProvider"])
