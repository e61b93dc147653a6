"""Trunc → QuantAvgPool2d after average pooling (both Trunc versions), MultiThreshold otherwise, or a report.

Every converted graph is compared bit for bit (up to the sign of zero) with the original in the executor.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from finnlite.core.datatypes import DataType
from tests.streamline.convert_helpers import (assert_same, converted, graph_model, init, op_types, place, quant_node,
                                              run, tie_values)

RNG = np.random.default_rng(0)
S_IN = np.float32(0.06666667014360428)  # Brevitas' 1/15 activation scale, as in the zoo


def _pool_trunc_model(k: int, stride: int, hw: int, signed: int, version: int, *, trunc_scale: float,
                      in_bits: int, out_bits: int, out_scale: float | None = None, mul_k2: bool = False,
                      mode: str = "FLOOR", pads: int = 0, act_bits: int = 4):
    """x → Quant(act_bits, s_in) → AveragePool(k, stride) [→ Mul(k²)] → Trunc (version 1 or 2)."""
    inits = [init("s", S_IN), init("z", np.float32(0)), init("ab", np.float32(act_bits)),
             init("ts", np.float32(trunc_scale)), init("ib", np.float32(in_bits)), init("ob", np.float32(out_bits))]
    nodes = [quant_node(["x", "s", "z", "ab"], "q", signed=signed, narrow=0, name="act"),
             helper.make_node("AveragePool", ["q"], ["pool"], kernel_shape=[k, k], strides=[stride, stride],
                              pads=[pads] * 4, name="pool")]
    src = "pool"
    if mul_k2:
        inits.append(init("k2", np.float32(k * k)))
        nodes.append(helper.make_node("Mul", ["pool", "k2"], ["pk"], name="mulk2"))
        src = "pk"
    if version == 1:
        nodes.append(helper.make_node("Trunc", [src, "ts", "z", "ib", "ob"], ["y"], domain="qonnx.custom_op.general",
                                      rounding_mode=mode, name="trunc"))
    else:
        inits.append(init("os", np.float32(out_scale)))
        nodes.append(helper.make_node("Trunc", [src, "ts", "z", "ib", "os", "ob"], ["y"],
                                      domain="qonnx.custom_op.general", rounding_mode=mode, signed=signed, narrow=0,
                                      name="trunc"))
    out = (hw + 2 * pads - k) // stride + 1
    return graph_model(nodes, {"x": [2, 8, hw, hw]}, {"y": [2, 8, out, out]}, inits, opset_custom=version)


def _x(hw: int, signed: int) -> np.ndarray:
    lo = -1.2 if signed else -0.2
    return RNG.uniform(lo, 1.2, size=(2, 8, hw, hw)).astype(np.float32)


@pytest.mark.parametrize("case", ["mobilenet", "resnet", "signed", "v1_with_mul"])
def test_avgpool_and_trunc_become_quantavgpool(case):
    if case == "mobilenet":  # 7x7 global pool, sum of 49 UINT4 <= 735 (10 bits), shifted by 6 to 4 bits
        ts = S_IN / np.float32(49)
        proto = _pool_trunc_model(7, 1, 7, 0, 2, trunc_scale=ts, in_bits=10, out_bits=4, out_scale=ts * 64)
    elif case == "resnet":  # 4x4 pool, stride 4, no shift, 8 bits out
        ts = S_IN / np.float32(16)
        proto = _pool_trunc_model(4, 4, 8, 0, 2, trunc_scale=ts, in_bits=8, out_bits=8, out_scale=ts)
    elif case == "signed":  # INT4 input: negative sums, arithmetic shift right = floor
        ts = S_IN / np.float32(4)
        proto = _pool_trunc_model(2, 2, 6, 1, 2, trunc_scale=ts, in_bits=6, out_bits=4, out_scale=ts * 4)
    else:  # version 1 after AveragePool → Mul(k²): y = floor(S / 2^(in - out)) · s
        proto = _pool_trunc_model(2, 2, 6, 0, 1, trunc_scale=S_IN, in_bits=6, out_bits=4, mul_k2=True)
    model, report = converted(proto)
    assert op_types(model) == ["MultiThreshold", "QuantAvgPool2d", "Mul"], (op_types(model), report.misses)
    qap = model.graph.node(1)
    dt = model.get_tensor_datatype(qap.outputs[0].name)
    assert dt.name == ("INT" if case == "signed" else "UINT") + str(qap.attributes["obits"].value)
    for _ in range(3):
        x = _x(model.graph.inputs[0].shape[2], int(case == "signed"))
        values = run(model, {"x": x}, return_all=True)
        assert np.all(dt.allowed(values[qap.outputs[0].name]))
        assert_same(values["y"], run(proto, {"x": x})["y"], case)


@pytest.mark.parametrize("signed,mode", [(0, "FLOOR"), (0, "ROUND"), (1, "FLOOR")])
def test_avgpool_and_trunc_with_more_output_bits_become_quantavgpool(signed, mode):
    """Brevitas' TruncAvgPool2d(2, bit_width=8) on 4-bit activations: the 6-bit window sum is multiplied by 4 to 8
    bits (out_scale = scale/4), exact whatever the rounding mode: QuantAvgPool2d gives the sum (no shift), the Mul
    4·out_scale, bit-identical to the original."""
    ts = S_IN / np.float32(4)
    proto = _pool_trunc_model(2, 2, 6, signed, 2, trunc_scale=ts, in_bits=6, out_bits=8, out_scale=ts / 4,
                              mode=mode)
    model, report = converted(proto)
    assert op_types(model) == ["MultiThreshold", "QuantAvgPool2d", "Mul"], (op_types(model), report.misses)
    qap = model.graph.node(1)
    dt = model.get_tensor_datatype(qap.outputs[0].name)
    for _ in range(3):
        x = _x(6, signed)
        values = run(model, {"x": x}, return_all=True)
        sums = values[qap.outputs[0].name]
        assert np.all(dt.allowed(sums)) and np.max(np.abs(sums)) > 15  # sums, not 4-bit levels: nothing shifted out
        assert_same(values["y"], run(proto, {"x": x})["y"], f"{mode}, signed={signed}")


@pytest.mark.parametrize("why,kwargs", [
    ("rounding", dict(mode="ROUND")), ("padding", dict(pads=1))])
def test_pattern_mismatch_falls_back_to_thresholds(why, kwargs):
    """A Trunc that rounds to nearest, or follows a padded AveragePool, is not a QuantAvgPool2d: it becomes a
    MultiThreshold on the pooled float32 tensor, still exact."""
    ts = S_IN / np.float32(4)
    proto = _pool_trunc_model(2, 2, 6, 0, 2, trunc_scale=ts, in_bits=6, out_bits=4, out_scale=ts * 4, **kwargs)
    model, report = converted(proto)
    ops = op_types(model)
    assert "Trunc" not in ops and "QuantAvgPool2d" not in ops and ops.count("MultiThreshold") == 2, ops
    assert any(m.rule == "AvgPoolAndTruncToQuantAvgPool" for m in report.misses)
    for _ in range(3):
        x = _x(6, 0)
        assert_same(run(model, {"x": x})["y"], run(proto, {"x": x})["y"], why)


@pytest.mark.parametrize("signed,zp,axis", [(0, 0.0, None), (1, 0.0, 1), (1, 2.0, 1), (0, 1.0, None)])
def test_standalone_trunc_v2_to_multithreshold(signed, zp, axis):
    """A version-2 Trunc on an arbitrary float tensor (per-tensor or per-channel parameters, zero-point 0 or not)
    converts to thresholds, exact on inputs at every tie and threshold."""
    c = 3 if axis is not None else 1
    scale = np.array([0.125, 0.1, 0.3][:c], np.float32)
    out_scale = scale * np.float32(4)
    shape = [1, c, 1] if axis is not None else []
    zps = np.full(c, zp, np.float32)
    inits = [init("ts", scale.reshape(shape)), init("tz", np.float32(zp)), init("ib", np.float32(8)),
             init("os", out_scale.reshape(shape)), init("ob", np.float32(3))]
    node = helper.make_node("Trunc", ["x", "ts", "tz", "ib", "os", "ob"], ["y"], domain="qonnx.custom_op.general",
                            rounding_mode="FLOOR", signed=signed, narrow=0, name="trunc")
    values = tie_values(scale * 4, zps / 4, -8, 8)  # the Trunc's decisions lie at multiples of its output scale
    values = np.concatenate([values, tie_values(scale, zps, -40, 40)], axis=1)  # and of its input rounding
    x = place(values, 3, axis)
    proto = graph_model([node], {"x": list(x.shape)}, {"y": list(x.shape)}, inits)
    model, report = converted(proto)
    assert "Trunc" not in op_types(model), report.misses
    assert model.get_tensor_datatype(model.graph.node(0).outputs[0].name) == (DataType["INT3"] if signed
                                                                              else DataType["UINT3"])
    assert_same(run(model, {"x": x})["y"], run(proto, {"x": x})["y"])


def test_standalone_trunc_v1_is_reported():
    inits = [init("ts", np.float32(0.25)), init("tz", np.float32(0)), init("ib", np.float32(8)),
             init("ob", np.float32(4))]
    node = helper.make_node("Trunc", ["x", "ts", "tz", "ib", "ob"], ["y"], domain="qonnx.custom_op.general",
                            rounding_mode="FLOOR", name="trunc")
    proto = graph_model([node], {"x": [1, 4]}, {"y": [1, 4]}, inits, opset_custom=1)
    model, report = converted(proto)
    assert op_types(model) == ["Trunc"]
    assert any("version-1 Trunc" in m.reason for m in report.misses)
