"""The package: registration in every domain, nodes from onnx and onnx_ir, a cheap import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

import custom_ops
from custom_ops import CUSTOM_DOMAINS, lookup, make_op
from custom_ops.quant import Quant
from finnlite.core.compat import make_model
from finnlite.core.errors import OpError

OP_TYPES = ["Quant", "IntQuant", "BipolarQuant", "Trunc", "MultiThreshold", "XnorPopcountMatMul", "Im2Col",
            "MaxPoolNHWC", "QuantAvgPool2d"]


@pytest.mark.parametrize("domain", CUSTOM_DOMAINS)
def test_every_op_in_every_domain(domain):
    for op_type in OP_TYPES:
        assert lookup(domain, op_type).op_type == ("Quant" if op_type == "IntQuant" else op_type)
    assert lookup(domain, "IntQuant") is Quant
    with pytest.raises(OpError, match="FloatQuant"):
        lookup(domain, "FloatQuant", "fq")


# one node of each op, with the inputs to run it
NODES = [
    ("Quant", dict(signed=1, narrow=1, rounding_mode="ROUND"),
     [np.linspace(-3, 3, 12, dtype=np.float32).reshape(1, 3, 4), np.float32(0.5), np.float32(0), np.float32(3)]),
    ("MultiThreshold", dict(out_dtype="INT2", out_scale=1.0, out_bias=-2.0, data_layout="NCW"),
     [np.linspace(-3, 3, 12, dtype=np.float32).reshape(1, 3, 4), np.array([[-1, 0, 1]], np.float32)]),
    ("Im2Col", dict(kernel_size=[2, 2], stride=[1, 1], input_shape="(1, 3, 3, 2)", pad_amount=[1, 0, 0, 1],
                    pad_value=0, dilations=[1, 1]),
     [np.arange(18, dtype=np.float32).reshape(1, 3, 3, 2)]),
    ("Trunc", dict(rounding_mode="FLOOR", signed=0, narrow=0),
     [np.arange(8, dtype=np.float32), np.float32(1), np.float32(0), np.float32(8), np.float32(4),
      np.float32(6)]),
]


@pytest.mark.parametrize("op_type,attrs,inputs", NODES, ids=[n[0] for n in NODES])
def test_nodes_from_onnx_and_onnx_ir_agree(op_type, attrs, inputs):
    inputs = [np.asarray(v) for v in inputs]
    proto = helper.make_node(op_type, [f"i{k}" for k in range(len(inputs))], ["y"], name="nd",
                             domain="qonnx.custom_op.general", **attrs)
    graph = helper.make_graph([proto], "g", [helper.make_tensor_value_info(f"i{k}", TensorProto.FLOAT, v.shape)
                                             for k, v in enumerate(inputs)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    ir_node = next(iter(ir.serde.deserialize_model(make_model(graph)).graph))
    from_proto, from_ir = make_op(proto), make_op(ir_node)
    assert from_proto.attrs == from_ir.attrs
    np.testing.assert_array_equal(from_proto.execute(inputs)[0], from_ir.execute(inputs)[0])


def test_import_is_cheap_and_complete():
    """A fresh interpreter: importing the registry first still finds every op once the package is imported (nine
    ops in three domains, FINN's FMPadding_Pixel HW layer in its own), and onnxruntime is not imported."""
    code = ("import sys, custom_ops.registry as r; import custom_ops; "
            "assert len(r.registered_ops()) == 28, r.registered_ops(); "
            "assert 'onnxruntime' not in sys.modules; print('ok')")
    repo = Path(custom_ops.__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=repo)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
