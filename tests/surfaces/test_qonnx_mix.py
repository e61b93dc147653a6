"""Every model finnlite hands back is one qonnx's transformations accept: one typed value_info per tensor, none
for the graph's inputs and outputs (qonnx's InferShapes fails with "Multiple ValueInfoProto found" otherwise)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from finnlite import Model, get_pass
from finnlite.examples import build_tfc
from streamline.pipeline import streamline_model

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "models"


def _qonnx_accepts(model: Model) -> None:
    from qonnx.transformation.general import GiveUniqueNodeNames
    from qonnx.transformation.infer_datatypes import InferDataTypes
    from qonnx.transformation.infer_shapes import InferShapes

    proto = model.to_proto()
    names = [vi.name for vi in proto.graph.value_info]
    assert not [n for n, c in Counter(names).items() if c > 1]
    assert not set(names) & {v.name for v in [*proto.graph.input, *proto.graph.output]}
    wrapper = model.to_qonnx()
    for t in (InferShapes(), InferDataTypes(), GiveUniqueNodeNames()):
        wrapper = wrapper.transform(t)  # raises on a model qonnx cannot read (e.g. "Multiple ValueInfoProto")
    assert len(wrapper.graph.node) == len(model)


def test_qonnx_transformations_accept_finnlites_gemm_to_matmul() -> None:
    model = Model(build_tfc())
    model.transform(get_pass("GemmToMatMul")())
    assert "Gemm" not in model.op_histogram()
    _qonnx_accepts(model)


@pytest.mark.parametrize("source", ["tfc", "conv1d_vgg10_dyn", "resnet_mini_dyn"])
def test_qonnx_transformations_accept_the_streamlined_model(source: str) -> None:
    path = CORPUS / f"{source}.onnx"
    if source != "tfc" and not path.is_file():
        pytest.skip(f"corpus model {path.name} is not committed")
    model = Model(build_tfc() if source == "tfc" else path)
    streamline_model(model)
    _qonnx_accepts(model)
