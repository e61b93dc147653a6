"""Weight quantizers → integer initializers + scale Mul (FoldQuantWeights).

Checked three ways: ``scale_placement="before"`` is bit-exact against the original in float32 for every consumer;
``"after"`` (FINN's form, the default) is compared with the original in float64, where moving the scale past the
consumer is exact up to float64 rounding (``rtol`` 1e-9), and is bit-exact in float32 for power-of-two scales;
and the integer initializers hold integers inside their annotated datatype.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from finnlite import Model, PassManager, Stage
from finnlite.core.datatypes import DataType
from streamline.convert import convert
from streamline.tidy import TIDY_PASSES
from tests.streamline.convert_helpers import assert_same, converted, graph_model, init, op_types, quant_node, run

RNG = np.random.default_rng(0)


def _weight_quant(w: np.ndarray, scale: np.ndarray, bits: int = 4, zp: np.ndarray | float = 0.0, signed: int = 1,
                  narrow: int = 1, op: str = "Quant", out: str = "Wq") -> tuple[list, list]:
    inits = [init("W", w.astype(np.float32)), init("ws", np.asarray(scale, np.float32)),
             init("wz", np.asarray(zp, np.float32)), init("wb", np.float32(bits))]
    return [quant_node(["W", "ws", "wz", "wb"], out, signed, narrow, name="wquant", op=op)], inits


def _scale(shape: tuple[int, ...], pow2: bool) -> np.ndarray:
    if pow2:
        return (2.0 ** RNG.integers(-6, 0, size=shape)).astype(np.float32)
    return np.exp(RNG.uniform(-4, -1, size=shape)).astype(np.float32)


def _matmul(pow2: bool, per_channel: bool = True, **kw):
    w = RNG.normal(size=(6, 5))
    q, inits = _weight_quant(w, _scale((1, 5) if per_channel else (), pow2), **kw)
    nodes = q + [helper.make_node("MatMul", ["x", "Wq"], ["y"], name="mm")]
    return graph_model(nodes, {"x": [3, 6]}, {"y": [3, 5]}, inits), {"x": [3, 6]}


def _conv(pow2: bool, group: int = 1, cin: int = 4, cout: int = 6, bias: str | None = None):
    w = RNG.normal(size=(cout, cin // group, 3, 3))
    q, inits = _weight_quant(w, _scale((cout, 1, 1, 1), pow2))
    ins = ["x", "Wq"]
    if bias == "quant":
        inits += [init("B", RNG.normal(size=cout).astype(np.float32)), init("bs", np.float32(2 ** -10)),
                  init("bz", np.float32(0)), init("bbits", np.float32(16))]
        q.append(quant_node(["B", "bs", "bz", "bbits"], "Bq", 1, 0, name="bquant"))
        ins.append("Bq")
    elif bias == "const":
        inits.append(init("B", RNG.normal(size=cout).astype(np.float32)))
        ins.append("B")
    nodes = q + [helper.make_node("Conv", ins, ["y"], group=group, pads=[1, 1, 1, 1], name="conv")]
    return graph_model(nodes, {"x": [2, cin, 5, 5]}, {"y": [2, cout, 5, 5]}, inits), {"x": [2, cin, 5, 5]}


def _conv_transpose(pow2: bool, group: int = 1, cin: int = 4, cout: int = 6, depthwise: bool = False):
    w = RNG.normal(size=(cin, cout // group, 3, 3))
    scale = _scale((cin, 1, 1, 1), pow2) if depthwise else _scale((1, cout // group, 1, 1), pow2)
    q, inits = _weight_quant(w, scale)
    nodes = q + [helper.make_node("ConvTranspose", ["x", "Wq"], ["y"], group=group, strides=[2, 2],
                                  name="convt")]
    return graph_model(nodes, {"x": [1, cin, 4, 4]}, {"y": [1, cout, 9, 9]}, inits), {"x": [1, cin, 4, 4]}


def _gemm(pow2: bool):
    w = RNG.normal(size=(5, 6))  # [N, K], transB = 1
    q, inits = _weight_quant(w, _scale((5, 1), pow2))
    inits += [init("B", RNG.normal(size=5).astype(np.float32)), init("bs", np.float32(2 ** -12)),
              init("bz", np.float32(0)), init("bbits", np.float32(32))]
    q.append(quant_node(["B", "bs", "bz", "bbits"], "Bq", 1, 0, name="bquant"))
    nodes = q + [helper.make_node("Gemm", ["x", "Wq", "Bq"], ["y"], transB=1, name="gemm")]
    return graph_model(nodes, {"x": [3, 6]}, {"y": [3, 5]}, inits), {"x": [3, 6]}


def _mul(pow2: bool):
    q, inits = _weight_quant(RNG.normal(size=(1, 4, 1)), _scale((1, 4, 1), pow2))
    nodes = q + [helper.make_node("Mul", ["x", "Wq"], ["y"], name="mul")]
    return graph_model(nodes, {"x": [2, 4, 3]}, {"y": [2, 4, 3]}, inits), {"x": [2, 4, 3]}


def _gather(pow2: bool, per: str):
    w = RNG.normal(size=(7, 4))
    scale = _scale((7, 1) if per == "row" else (1, 4), pow2)
    q, inits = _weight_quant(w, scale)
    nodes = q + [helper.make_node("Gather", ["Wq", "idx"], ["y"], axis=0, name="gather")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("idx", TensorProto.INT64, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])], initializer=inits)
    from finnlite.core.compat import make_model

    return make_model(graph), {"idx": None}


BUILDERS = {
    "matmul_per_channel": lambda p: _matmul(p),
    "matmul_per_tensor": lambda p: _matmul(p, per_channel=False),
    "conv": lambda p: _conv(p),
    "conv_grouped": lambda p: _conv(p, group=2),
    "conv_depthwise": lambda p: _conv(p, group=4, cin=4, cout=8),
    "conv_quant_bias": lambda p: _conv(p, bias="quant"),
    "conv_const_bias": lambda p: _conv(p, bias="const"),
    "conv_transpose": lambda p: _conv_transpose(p),
    "conv_transpose_grouped": lambda p: _conv_transpose(p, group=2),
    "conv_transpose_depthwise": lambda p: _conv_transpose(p, group=4, cin=4, cout=8, depthwise=True),
    "gemm_with_quant_bias": lambda p: _gemm(p),
    "mul": lambda p: _mul(p),
    "gather_per_row": lambda p: _gather(p, "row"),
    "gather_per_column": lambda p: _gather(p, "column"),
}


def _inputs(shapes: dict) -> dict[str, np.ndarray]:
    out = {}
    for name, shape in shapes.items():
        if name == "idx":
            out[name] = RNG.integers(0, 7, size=(2, 3)).astype(np.int64)
        else:
            out[name] = RNG.normal(size=shape).astype(np.float32)
    return out


def _check_integer_weights(model: Model) -> None:
    """Every annotated integer initializer holds integers its datatype allows, and no quantizer is left."""
    assert not {"Quant", "BipolarQuant"} & set(op_types(model)), op_types(model)
    found = 0
    for name, v in model.graph.initializers.items():
        if model.has_tensor_datatype(name) and model.get_tensor_datatype(name).is_integer():
            arr = v.const_value.numpy()
            assert np.all(model.get_tensor_datatype(name).allowed(arr)), name
            found += 1
    assert found >= 1


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_before_is_bit_exact(kind):
    proto, shapes = BUILDERS[kind](False)
    model, report = converted(proto, scale_placement="before")
    _check_integer_weights(model)
    x = _inputs(shapes)
    assert_same(run(model, x)["y"], run(proto, x)["y"], kind)


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_after_is_exact_in_real_arithmetic(kind):
    """The scale moved past the consumer: equal to the original up to float64 rounding."""
    proto, shapes = BUILDERS[kind](False)
    model, report = converted(proto)
    assert not report.misses, report.misses
    _check_integer_weights(model)
    consumer = {"matmul": "MatMul", "conv": "Conv", "gemm": "Gemm", "mul": "Mul", "gather": "Gather"}
    op = "ConvTranspose" if kind.startswith("conv_transpose") else consumer[kind.split("_")[0]]
    ops = op_types(model)
    assert ops.index("Mul", ops.index(op) + (1 if op == "Mul" else 0)) > ops.index(op), ops  # the scale follows
    x = _inputs(shapes)
    if op == "ConvTranspose":  # the executor has no float64 ConvTranspose: float32, to float32 precision
        want, got = run(proto, x)["y"], run(model, x)["y"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
        return
    x64 = {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in x.items()}
    want, got = run(proto, x64, dtype=np.float64)["y"], run(model, x64, dtype=np.float64)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9 * np.abs(want).max())


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_after_is_bit_exact_for_power_of_two_scales(kind):
    proto, shapes = BUILDERS[kind](True)
    model, report = converted(proto)
    assert not report.misses, report.misses
    x = _inputs(shapes)
    assert_same(run(model, x)["y"], run(proto, x)["y"], kind)


@pytest.mark.parametrize("bits,signed,narrow,op,dtype", [
    (2, 1, 1, "Quant", "INT2"), (4, 1, 0, "Quant", "INT4"), (3, 0, 0, "Quant", "UINT3"),
    (1, 1, 0, "Quant", "BIPOLAR"), (1, 0, 0, "Quant", "BINARY"), (1, 1, 0, "BipolarQuant", "BIPOLAR")])
def test_weight_datatypes(bits, signed, narrow, op, dtype):
    w = RNG.normal(size=(6, 5))
    q, inits = _weight_quant(w, np.float32(0.5), bits=bits, signed=signed, narrow=narrow, op=op)
    nodes = q + [helper.make_node("MatMul", ["x", "Wq"], ["y"])]
    proto = graph_model(nodes, {"x": [3, 6]}, {"y": [3, 5]}, inits)
    model, _ = converted(proto)
    mm = next(n for n in model.graph if n.op_type == "MatMul")
    wname = mm.inputs[1].name
    assert model.get_tensor_datatype(wname) == DataType[dtype]
    values = model.get_initializer(wname)
    assert DataType[dtype].allowed(values).all() and np.array_equal(values, np.round(values))
    x = {"x": RNG.normal(size=(3, 6)).astype(np.float32)}
    assert_same(run(model, x)["y"], run(proto, x)["y"])  # scale 0.5 is a power of two


@pytest.mark.parametrize("zp,dtype", [(np.float32(8), "INT4"), (np.float32(3), "INT5"),
                                      (np.array([[0, 8, 15, 4, 1]], np.float32), "INT5")])
def test_integer_zero_point_is_folded_and_widened(zp, dtype):
    """UINT4 weights with an integer zero-point z become the integers q - z, annotated with their range's type."""
    w = RNG.uniform(-2, 2, size=(6, 5))
    q, inits = _weight_quant(w, _scale((1, 5), True), bits=4, zp=zp, signed=0, narrow=0)
    nodes = q + [helper.make_node("MatMul", ["x", "Wq"], ["y"])]
    proto = graph_model(nodes, {"x": [3, 6]}, {"y": [3, 5]}, inits)
    model, report = converted(proto)
    assert not report.misses
    mm = next(n for n in model.graph if n.op_type == "MatMul")
    assert model.get_tensor_datatype(mm.inputs[1].name) == DataType[dtype]
    _check_integer_weights(model)
    x = {"x": RNG.normal(size=(3, 6)).astype(np.float32)}
    assert_same(run(model, x)["y"], run(proto, x)["y"])


def test_fractional_zero_point():
    """A fractional zero-point cannot be folded into integers: "after" reports it and leaves the quantizer,
    "before" converts it exactly (q, Add(-z), Mul(s))."""
    q, inits = _weight_quant(RNG.normal(size=(6, 5)), np.float32(0.3), zp=np.float32(0.5), signed=1, narrow=0)
    proto = graph_model(q + [helper.make_node("MatMul", ["x", "Wq"], ["y"])], {"x": [3, 6]}, {"y": [3, 5]}, inits)
    model, report = converted(proto)
    assert "Quant" in op_types(model)
    assert any("fractional zero-point" in m.reason for m in report.misses)
    model, report = converted(proto, scale_placement="before")
    assert op_types(model) == ["Add", "Mul", "MatMul"]
    x = {"x": RNG.normal(size=(3, 6)).astype(np.float32)}
    assert_same(run(model, x)["y"], run(proto, x)["y"])


def test_scale_along_a_summed_axis_is_reported():
    q, inits = _weight_quant(RNG.normal(size=(6, 5)), _scale((6, 1), False))  # per input channel
    proto = graph_model(q + [helper.make_node("MatMul", ["x", "Wq"], ["y"])], {"x": [3, 6]}, {"y": [3, 5]}, inits)
    model, report = converted(proto)
    assert "Quant" in op_types(model)
    assert any("summed" in m.reason for m in report.misses)


def test_bias_quantizer_becomes_its_exact_constant():
    """A quantized bias feeding an Add is folded into the float constant the quantizer computes (bit-exact)."""
    q, inits = _weight_quant(RNG.normal(size=(5,)), np.float32(0.0123), bits=16, narrow=0, out="Bq")
    proto = graph_model(q + [helper.make_node("Add", ["x", "Bq"], ["y"])], {"x": [3, 5]}, {"y": [3, 5]}, inits)
    model, report = converted(proto)
    assert op_types(model) == ["Add"] and not report.misses
    x = {"x": RNG.normal(size=(3, 5)).astype(np.float32)}
    assert_same(run(model, x)["y"], run(proto, x)["y"])


@pytest.mark.parametrize("placement", ["after", "before"])
def test_wide_bias_beyond_float32_integers(placement):
    """A 32-bit bias quantizer whose integers exceed 2^24 (not representable in float32) still folds into its
    exact float constant; a weight like that is reported instead."""
    b = np.array([3e7, -5e8, 0.37, 1.5e9, -2.0], np.float64) * 0.001
    q, inits = _weight_quant(b, np.float32(0.001), bits=32, narrow=0, out="Bq")
    proto = graph_model(q + [helper.make_node("Add", ["x", "Bq"], ["y"])], {"x": [3, 5]}, {"y": [3, 5]}, inits)
    model, report = converted(proto, scale_placement=placement)
    assert op_types(model) == ["Add"] and not report.misses
    x = {"x": RNG.normal(size=(3, 5)).astype(np.float32)}
    assert_same(run(model, x)["y"], run(proto, x)["y"])
    q, inits = _weight_quant(np.resize(b, (6, 5)), np.float32(0.001), bits=32, narrow=0)
    proto = graph_model(q + [helper.make_node("MatMul", ["x", "Wq"], ["y"])], {"x": [3, 6]}, {"y": [3, 5]}, inits)
    model, report = converted(proto, scale_placement=placement)
    assert "Quant" in op_types(model)
    assert any("not reproduced exactly" in m.reason for m in report.misses)


def test_gemm_after_tidy():
    """With the tidy stage first (Gemm → MatMul + Add, the weight quantizer transposed), the weight scale follows
    the MatMul and the bias quantizer becomes a constant; "before" is bit-exact against the tidied graph."""
    proto, shapes = _gemm(False)
    x = _inputs(shapes)
    tidied = Model(proto)
    PassManager([Stage("tidy", TIDY_PASSES)]).run(tidied)
    for placement in ("after", "before"):
        model = Model(tidied.to_proto())
        report = convert(model, scale_placement=placement)
        assert not report.misses
        ops = op_types(model)
        assert "Quant" not in ops and "Gemm" not in ops, ops
        if placement == "after":
            assert ops == ["MatMul", "Mul", "Add"], ops
            x64 = {"x": x["x"].astype(np.float64)}
            np.testing.assert_allclose(run(model, x64, dtype=np.float64)["y"], run(proto, x64, dtype=np.float64)["y"],
                                       rtol=1e-9, atol=1e-12)
        else:
            assert_same(run(model, x)["y"], run(tidied, x)["y"])


@pytest.mark.parametrize("op,bits,zp,scale_shape", [("Quant", 4, 0.0, (7, 1, 1, 1)), ("Quant", 3, 2.0, ()),
                                                    ("Quant", 5, 0.0, (1, 3, 1, 1)),
                                                    ("BipolarQuant", 1, 0.0, (7, 1, 1, 1))])
def test_integer_weight_by_blocks_is_the_whole_weight_split(monkeypatch, op, bits, zp, scale_shape):
    """The split runs over blocks of rows: with blocks of a few elements (per-row, per-column and per-tensor scales,
    a zero-point) it gives the integers of the whole weight, bit for bit, and q − z times s is the kernel's
    output."""
    import streamline.convert_weights as cw
    from custom_ops.bipolar_quant import bipolar_quant
    from custom_ops.quant import quant

    w = RNG.normal(size=(7, 3, 3, 3)).astype(np.float32)
    scale = _scale(scale_shape, pow2=False)
    nodes, inits = _weight_quant(w, scale, bits=bits, zp=zp, signed=1, narrow=0, op=op)
    model = Model(graph_model(nodes + [helper.make_node("Identity", ["Wq"], ["y"])], {}, {"y": [7, 3, 3, 3]}, inits))
    node = next(n for n in model.graph if n.op_type == op)
    whole = cw.integer_weight(node)
    monkeypatch.setattr(cw, "_BLOCK_ELEMENTS", 20)  # 27 elements a row: one row a block
    checked = _count_blocks(monkeypatch, cw)
    blocks = cw.integer_weight(node)
    assert len(checked) == 7
    np.testing.assert_array_equal(blocks.q.view(np.int32), whole.q.view(np.int32))
    expected = (bipolar_quant(w, scale) if op == "BipolarQuant"
                else quant(w, scale, np.float32(zp), np.float32(bits), True, False))
    np.testing.assert_array_equal((blocks.q - np.float32(zp)) * scale, expected)


def _count_blocks(monkeypatch, cw) -> list[int]:  # noqa: ANN001
    """A list that grows by one for each block integer_weight checks."""
    calls: list[int] = []
    check = cw._same_float32
    monkeypatch.setattr(cw, "_same_float32", lambda a, b: calls.append(a.shape[0]) or check(a, b))
    return calls


def test_integer_weight_by_blocks_refuses_a_last_block_it_cannot_reproduce(monkeypatch):
    """Integers beyond float32's 2^24 in the last row only (blocks of one row): the split is refused."""
    import streamline.convert_weights as cw

    monkeypatch.setattr(cw, "_BLOCK_ELEMENTS", 5)
    w = np.concatenate([RNG.normal(size=(6, 5)), [[3e7, -5e8, 0.37, 1.5e9, -2.0]]]) * 0.001
    for rows, refused in ((6, False), (7, True)):
        nodes, inits = _weight_quant(w[:rows], np.float32(0.001), bits=32, narrow=0)
        model = Model(graph_model(nodes + [helper.make_node("Identity", ["Wq"], ["y"])], {}, {"y": [rows, 5]},
                                  inits))
        node = next(n for n in model.graph if n.op_type == "Quant")
        checked = _count_blocks(monkeypatch, cw)
        if refused:
            with pytest.raises(cw.Unsupported, match="not reproduced exactly"):
                cw.integer_weight(node)
        else:
            assert cw.integer_weight(node).q.shape == (rows, 5)
        assert len(checked) == rows  # one row a block; refused at the last
