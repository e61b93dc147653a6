"""qonnx's ``execute_onnx`` as a reference, usable with onnx >= 1.22.

qonnx builds a one-node model per standard node with ``qonnx.util.basic.qonnx_make_model``, which (through
``onnx.helper.make_model``) stamps IR version 14; onnxruntime 1.31 rejects that. :func:`qonnx_execute` runs
``execute_onnx`` with that builder patched to write IR version 10, and restores it afterwards.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import onnx

import qonnx.core.onnx_exec as _onnx_exec
from qonnx.core.modelwrapper import ModelWrapper
from qonnx.transformation.infer_shapes import InferShapes

from finnlite.compat import fix_ir_version

_ORIGINAL_MAKE_MODEL = _onnx_exec.qonnx_make_model


def _make_model_ir10(graph: onnx.GraphProto, **kwargs: Any) -> onnx.ModelProto:
    return fix_ir_version(_ORIGINAL_MAKE_MODEL(graph, **kwargs))


@contextlib.contextmanager
def qonnx_ir_patch() -> Iterator[None]:
    """Within the block, qonnx's per-node models carry an IR version onnxruntime accepts."""
    saved = _onnx_exec.qonnx_make_model
    _onnx_exec.qonnx_make_model = _make_model_ir10
    try:
        yield
    finally:
        _onnx_exec.qonnx_make_model = saved


def qonnx_model(model: onnx.ModelProto | str | Path | ModelWrapper | Any) -> ModelWrapper:
    """A qonnx ModelWrapper for a ModelProto, a path, a ModelWrapper or an object with ``to_proto()``, with
    qonnx's shape inference applied if some tensor has no shape (``execute_onnx`` requires them all)."""
    if isinstance(model, ModelWrapper):
        return model
    if isinstance(model, (str, Path)):
        model = onnx.load(str(model))
    elif not isinstance(model, onnx.ModelProto) and hasattr(model, "to_proto"):
        model = model.to_proto()
    wrapper = ModelWrapper(fix_ir_version(onnx.ModelProto.FromString(model.SerializeToString())))
    if not wrapper.check_all_tensor_shapes_specified():
        # execute_onnx needs a shape for every tensor (the TorchScript exporter leaves some out)
        wrapper = wrapper.transform(InferShapes())
    return wrapper


def qonnx_execute(model: onnx.ModelProto | str | Path | ModelWrapper | Any, inputs: dict[str, np.ndarray],
                  return_all: bool = False) -> dict[str, np.ndarray]:
    """qonnx's ``execute_onnx(model, inputs)``: the graph outputs (every tensor with ``return_all``)."""
    wrapper = qonnx_model(model)
    with qonnx_ir_patch():
        return _onnx_exec.execute_onnx(wrapper, inputs, return_full_exec_context=return_all)
