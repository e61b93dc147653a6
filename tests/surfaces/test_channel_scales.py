"""The integer-only report names a per-channel scale that reaches a channel-mixing layer, and what to change."""

from __future__ import annotations

import numpy as np
import pytest

from finnlite.core.compat import QONNX_DOMAIN
from tests.verify.graphs import GraphBuilder
from finnlite.float_report import float_report

_T = np.tile(np.arange(15, dtype=np.float32) - 7.0, (4, 1))


def _net(scale, *, group: int = 1, flatten: bool = False):
    """x → MT(UINT4, 4 channels) → MaxPool → Mul(scale) → Conv(int W, group) → MT → y, or → Reshape → MatMul."""
    rng = np.random.default_rng(0)
    g = GraphBuilder()
    g.input("x", [1, 4, 4, 4])
    g.multithreshold("x", "a0", "quant_a0", _T, "UINT4")
    g.node("MaxPool", ["a0"], ["p"], "pool", kernel_shape=[2, 2], strides=[2, 2], datatype="UINT4")
    g.init("s", np.asarray(scale, dtype=np.float32))
    g.node("Mul", ["p", "s"], ["f"], "scale")
    if flatten:
        g.init("shape", np.array([1, 16]), np.int64)
        g.init("W", rng.integers(-3, 4, (16, 3)).astype(np.float32))
        g.node("Reshape", ["f", "shape"], ["flat"], "flatten")
        g.node("MatMul", ["flat", "W"], ["y"], "classifier")
        g.output("y", [1, 3])
    else:
        g.init("W", rng.integers(-3, 4, (4, 4 // group, 1, 1)).astype(np.float32))
        g.node("Conv", ["f", "W"], ["c"], "conv", kernel_shape=[1, 1], group=group)
        g.node("Sin", ["c"], ["y"], "sin")  # a float consumer: the Conv's result is not the graph output
        g.output("y", [1, 4, 2, 2])
    return g.model()


def test_per_channel_scale_into_a_conv_is_explained() -> None:
    report = float_report(_net(np.array([0.5, 0.25, 0.125, 0.75]).reshape(1, 4, 1, 1)))
    mul, conv = report.nodes[:2]
    assert (mul.name, conv.name) == ("scale", "conv")
    assert mul.cause.startswith("4 distinct per-channel scales (0.125 … 0.75) of the activation quantizer now "
                                "MultiThreshold 'quant_a0' reach the channel-mixing Conv 'conv': ")
    assert "per-tensor scaling on that quantizer (Brevitas scaling_per_output_channel=False)" in mul.cause
    assert "before 'conv'" in mul.cause
    assert mul.text().endswith(mul.cause)  # the cause replaces "no rule tried it"
    assert conv.cause == "" and conv.reason.endswith("float because of Mul 'scale' above")
    assert report.to_dict()["float_nodes"][0]["cause"] == mul.cause


def test_per_channel_scale_into_the_classifier_names_the_path() -> None:
    (mul, *_rest) = float_report(_net(np.array([0.5, 0.25, 0.5, 0.75]).reshape(1, 4, 1, 1), flatten=True)).nodes
    assert "3 distinct per-channel scales" in mul.cause
    assert "reach the channel-mixing MatMul 'classifier' via Reshape" in mul.cause


@pytest.mark.parametrize("scale,group", [(np.float32(0.5), 1),  # one scale: a rule moves it, no cause to give
                                         (np.full((1, 4, 1, 1), 0.5), 1),  # equal per-channel values
                                         (np.array([0.5, 0.25, 0.125, 0.75]).reshape(1, 4, 1, 1), 4)])  # depthwise
def test_no_cause_where_the_scale_is_not_the_obstacle(scale, group) -> None:
    report = float_report(_net(scale, group=group))
    assert report.nodes and all(n.cause == "" for n in report.nodes)
    assert "no rule tried it" in report.nodes[0].text()


def test_depthwise_im2col_before_the_matmul_does_not_mix_channels() -> None:
    g = GraphBuilder()
    g.input("x", [1, 2, 2, 4])
    g.multithreshold("x", "a0", "quant_a0", _T, "UINT4")
    g.init("s", np.array([0.5, 0.25, 0.125, 0.75], dtype=np.float32))
    g.node("Mul", ["a0", "s"], ["f"], "scale")
    g.node("Im2Col", ["f"], ["cols"], "im2col", domain=QONNX_DOMAIN, stride=[1, 1], kernel_size=[1, 1],
           input_shape="(1, 2, 2, 4)", depthwise=1)
    g.init("W", np.diag([1.0, -2.0, 3.0, 1.0]).astype(np.float32))
    g.node("MatMul", ["cols", "W"], ["y"], "dw_matmul")
    g.output("y", [1, 2, 2, 4])
    report = float_report(g.model())
    assert report.names()[0] == "scale" and all(n.cause == "" for n in report.nodes)


@pytest.mark.parametrize("exporter", ["dyn", "ts"])
def test_the_corpus_gap_is_explained_where_it_starts(exporter) -> None:
    """perchannel_maxpool (tests/corpus KNOWN_GAPS): its 7 float nodes come from 2 per-channel scales, each
    explained at its Mul: one reaches the second Conv (lowered: Im2Col + MatMul), one the classifier."""
    from finnlite import Model
    from finnlite.build import streamline
    from tests.corpus.check import committed_entries, model_path

    model = Model(model_path(committed_entries()[f"perchannel_maxpool_{exporter}"]))
    report = streamline(model, verify="off", extras=False).float_nodes
    causes = [n for n in report.nodes if n.cause]
    assert [n.op_type for n in causes] == ["Mul", "Mul"]
    assert "reach the channel-mixing MatMul" in causes[0].cause and "via Im2Col" in causes[0].cause
    assert "_matmul'" in causes[0].cause  # the lowered Conv
    # the second scale passes the Flatten as a per-feature factor (MoveLinearPastDataMovement) and stops right at
    # the classifier
    assert "reach the channel-mixing MatMul 'node_linear_MatMul'" in causes[1].cause.replace("'/fc/Gemm_MatMul'",
                                                                                             "'node_linear_MatMul'")
    others = [n for n in report.nodes if not n.cause]
    assert len(others) == 5 and all(n.reason.endswith("above") for n in others)
