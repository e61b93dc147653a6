"""qonnx's ``execute_onnx`` as the reference, usable with onnx >= 1.22.

qonnx builds one-node models (``execute_onnx`` per standard node; MaxPoolNHWC and QuantAvgPool2d inside their
kernels) with ``qonnx.util.basic.qonnx_make_model``, which through ``onnx.helper.make_model`` stamps IR version
14; onnxruntime 1.31 rejects that. :func:`qonnx_ir_patch` makes every qonnx module's ``qonnx_make_model`` write
IR version 10 for the duration of a block, and :func:`qonnx_execute` runs ``execute_onnx`` under it::

    from tests.qonnx_ref import qonnx_execute
    outputs = qonnx_execute(model_or_path, {"x": x})                  # {output name: array}
    context = qonnx_execute(model_or_path, {"x": x}, return_all=True)  # every tensor
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import onnx
import qonnx.core.onnx_exec  # noqa: F401 - loads the modules that hold a reference to qonnx_make_model
import qonnx.custom_op.general  # noqa: F401
import qonnx.util.basic as qonnx_basic
from qonnx.core.modelwrapper import ModelWrapper
from qonnx.transformation.infer_shapes import InferShapes

from finnlite.core.compat import fix_ir_version

_ORIGINAL_MAKE_MODEL = qonnx_basic.qonnx_make_model


def _make_model_ir10(graph: onnx.GraphProto, **kwargs: Any) -> onnx.ModelProto:
    return fix_ir_version(_ORIGINAL_MAKE_MODEL(graph, **kwargs))


@contextlib.contextmanager
def qonnx_ir_patch() -> Iterator[None]:
    """Within the block, every model qonnx builds carries an IR version onnxruntime accepts."""
    patched = [module for name, module in list(sys.modules.items())
               if name.startswith("qonnx") and getattr(module, "qonnx_make_model", None) is _ORIGINAL_MAKE_MODEL]
    for module in patched:
        module.qonnx_make_model = _make_model_ir10
    try:
        yield
    finally:
        for module in patched:
            module.qonnx_make_model = _ORIGINAL_MAKE_MODEL


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
        with qonnx_ir_patch():
            wrapper = wrapper.transform(InferShapes())
    return wrapper


def qonnx_execute(model: onnx.ModelProto | str | Path | ModelWrapper | Any, inputs: dict[str, np.ndarray],
                  return_all: bool = False) -> dict[str, np.ndarray]:
    """qonnx's ``execute_onnx(model, inputs)``: the graph outputs (every tensor with ``return_all``)."""
    wrapper = qonnx_model(model)
    with qonnx_ir_patch():
        return qonnx.core.onnx_exec.execute_onnx(wrapper, inputs, return_full_exec_context=return_all)
