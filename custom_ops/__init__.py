"""The QONNX/FINN custom operators: definitions, numpy reference kernels, shape and datatype inference.

Every op module is imported here explicitly, so an op is registered as soon as this package is imported, whatever
is imported first. Importing the package stays cheap: numpy, onnx and qonnx's datatypes, no onnxruntime.

Use :func:`make_op` on a node of a custom domain (see :func:`is_custom_domain`) to get its op, then
``op.execute(inputs)``, ``op.infer_shapes(shapes, values)`` or ``op.infer_datatypes(dtypes, values)``.
"""

from custom_ops import (bipolar_quant, fmpadding_pixel, im2col, maxpoolnhwc, multithreshold, quant, quantavgpool2d,
                        trunc, xnorpopcount)
from custom_ops.base import CustomOp, attrs_of
from custom_ops.registry import (CUSTOM_DOMAINS, HW_DOMAIN, QONNX_DOMAIN, is_custom_domain, is_standard_domain, lookup,
                                 make_op, register, register_alias, registered_ops)
from finnlite.core.ops import register_executor


def _executor(model, **options):  # the executor module loads onnxruntime: only when a model is run
    from custom_ops.executor import Executor

    return Executor(model, **options)


register_executor(_executor)

__all__ = [
    "CustomOp", "attrs_of", "CUSTOM_DOMAINS", "HW_DOMAIN", "QONNX_DOMAIN", "is_custom_domain", "is_standard_domain",
    "lookup", "make_op", "register", "register_alias", "registered_ops",
    "bipolar_quant", "fmpadding_pixel", "im2col", "maxpoolnhwc", "multithreshold", "quant", "quantavgpool2d", "trunc",
    "xnorpopcount",
]
