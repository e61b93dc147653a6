"""The executor on small graphs: regions and kernels, forks and joins, several outputs, return_all, constant
folding, model sources, batches, float64, and the errors that name the node or tensor."""

from __future__ import annotations

import logging
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from custom_ops import make_op, plan
from custom_ops.executor import Executor, execute
from custom_ops.float64_ops import average_pool, conv, conv_transpose, resize
from finnlite.core.compat import make_model
from finnlite.core.errors import GraphError, ModelLoadError, OpError
from tests.qonnx_ref import qonnx_execute, qonnx_model

F32 = np.float32
Q = "qonnx.custom_op.general"


def build(nodes: list, inputs: dict[str, tuple], outputs: list[str], inits: dict[str, np.ndarray] | None = None,
          opset: int = 20, value_info: dict[str, tuple] | None = None) -> onnx.ModelProto:
    """A model: float graph inputs of the given shapes, outputs, initializers and the shapes of ``value_info``
    (an output without one is untyped)."""
    shapes = value_info or {}

    def info(name: str) -> onnx.ValueInfoProto:
        shape = shapes.get(name)
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, None if shape is None else list(shape))

    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in inputs.items()],
        [info(n) for n in outputs], [numpy_helper.from_array(np.asarray(v), n) for n, v in (inits or {}).items()],
        value_info=[info(n) for n in shapes if n not in outputs])
    return make_model(graph, opset=opset)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind == "f":
        return bool(np.all(a.view(f"u{a.itemsize}") == b.view(f"u{b.itemsize}")))
    return bool(np.array_equal(a, b))


def mixed_model() -> onnx.ModelProto:
    """x → Quant → Conv → fork: (Relu → NHWC → MaxPoolNHWC [kernel] → NCHW) and (MultiThreshold → MaxPool);
    join with Add; outputs: the sum and the MultiThreshold branch. A weight Quant to fold."""
    rng = np.random.default_rng(0)
    inits = {
        "s_in": np.array(0.05, F32), "z": np.array(0.0, F32), "b8": np.array(8, F32), "b2": np.array(2, F32),
        "w_float": rng.standard_normal((4, 3, 3, 3)).astype(F32), "s_w": np.array(0.4, F32),
        "thr": np.sort(rng.standard_normal((4, 3)).astype(F32) * 2, axis=1),
    }
    nodes = [
        helper.make_node("Quant", ["x", "s_in", "z", "b8"], ["xq"], domain=Q, name="quant_in", signed=1, narrow=0),
        helper.make_node("Quant", ["w_float", "s_w", "z", "b2"], ["w"], domain=Q, name="quant_w", signed=1,
                         narrow=1),
        helper.make_node("Conv", ["xq", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Transpose", ["r"], ["r_nhwc"], name="to_nhwc", perm=[0, 2, 3, 1]),
        helper.make_node("MaxPoolNHWC", ["r_nhwc"], ["p_nhwc"], domain=Q, name="pool_nhwc", kernel_shape=[2, 2],
                         strides=[2, 2], pads=[0, 0, 0, 0]),
        helper.make_node("Transpose", ["p_nhwc"], ["p"], name="to_nchw", perm=[0, 3, 1, 2]),
        helper.make_node("MultiThreshold", ["c", "thr"], ["m"], domain=Q, name="mt", out_dtype="UINT2",
                         out_scale=0.5, out_bias=-0.5),
        helper.make_node("MaxPool", ["m"], ["mp"], name="maxpool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Add", ["p", "mp"], ["sum"], name="join"),
    ]
    shapes = {"xq": (1, 3, 8, 8), "w": (4, 3, 3, 3), "c": (1, 4, 8, 8), "r": (1, 4, 8, 8), "r_nhwc": (1, 8, 8, 4),
              "p_nhwc": (1, 4, 4, 4), "p": (1, 4, 4, 4), "m": (1, 4, 8, 8), "mp": (1, 4, 4, 4), "sum": (1, 4, 4, 4)}
    return build(nodes, {"x": (1, 3, 8, 8)}, ["sum", "m"], inits, value_info=shapes)


def random_x(seed: int, shape: tuple = (1, 3, 8, 8)) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-3, 3, shape).astype(F32)


# -- plans and results ----------------------------------------------------------------------------------------
def test_mixed_graph_plan_regions_around_a_kernel():
    ex = Executor(mixed_model())
    steps = ex._plan(batched=False, return_all=False).steps
    kinds = [type(s).__name__ for s in steps]
    # MaxPoolNHWC runs its kernel, MaxPool runs alone (as qonnx runs it), the rest in two regions
    assert kinds == ["RegionStep", "KernelStep", "NodeSessionStep", "RegionStep"], ex.describe()
    assert steps[1].node.name == "pool_nhwc" and steps[2].node.name == "maxpool"
    # Quant and MultiThreshold are lowered into the first region; the weight Quant was folded
    first = {n.op_type for n in steps[0].nodes}
    assert {"Conv", "Round", "Clip", "GreaterOrEqual", "MatMul"} <= first and "Quant" not in first
    assert "w" in ex._constants and "quant_w" not in ex.describe()
    assert "2 custom nodes lowered, 1 run as kernels, 1 in sessions of their own" in ex.describe()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mixed_graph_matches_qonnx_bit_for_bit(seed):
    model, x = mixed_model(), random_x(seed)
    got = Executor(model).run({"x": x})
    ref = qonnx_execute(model, {"x": x})
    assert list(got) == ["sum", "m"]
    for name in ref:
        assert same_bits(got[name], ref[name]), name


def test_return_all_gives_every_tensor_as_qonnx_does():
    model, x = mixed_model(), random_x(3)
    ex = Executor(model)
    got = ex.run({"x": x}, return_all=True)
    ref = qonnx_execute(model, {"x": x}, return_all=True)
    tensors = {"x", "xq", "w", "c", "r", "r_nhwc", "p_nhwc", "p", "m", "mp", "sum", "w_float", "thr"}
    assert tensors <= set(got)
    for name in tensors:
        assert same_bits(got[name], ref[name]), name
    # the outputs-only plan gives the same outputs; constants come back read-only
    assert same_bits(ex.run({"x": x})["sum"], got["sum"])
    assert not got["w"].flags.writeable


def test_dead_nodes_are_not_run_unless_return_all():
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="live"),
             # a kernel that fails if it runs: its weights do not fit the input
             helper.make_node("XnorPopcountMatMul", ["x", "w"], ["dead"], domain=Q, name="dead_xnor")]
    model = build(nodes, {"x": (2, 3)}, ["y"], {"w": np.ones((5, 4), F32)})
    ex = Executor(model)
    x = np.array([[0, 1, 0], [1, 1, 0]], F32)
    assert same_bits(ex.run({"x": x})["y"], x)
    with pytest.raises(OpError, match="dead_xnor"):
        ex.run({"x": x}, return_all=True)


def test_chain_of_kernels_and_a_graph_output_that_is_an_input_or_constant():
    nodes = [helper.make_node("XnorPopcountMatMul", ["x", "w"], ["a"], domain=Q, name="xnor1"),
             helper.make_node("XnorPopcountMatMul", ["x", "w"], ["b"], domain=Q, name="xnor2"),
             helper.make_node("Add", ["a", "b"], ["s"], name="add")]
    w = np.array([[1, 0], [0, 0], [1, 1]], F32)
    model = build(nodes, {"x": (2, 3)}, ["s", "x", "w"], {"w": w})
    x = np.array([[0, 1, 1], [1, 0, 0]], F32)
    got = Executor(model).run({"x": x})
    assert same_bits(got["x"], x) and same_bits(got["w"], w)
    counts = make_op(nodes[0]).execute([x, w])[0]  # qonnx cannot run a graph whose input is also an output
    assert same_bits(got["s"], counts + counts)
    assert [type(step).__name__ for step in Executor(model)._plan(False, False).steps] == \
        ["KernelStep", "KernelStep", "RegionStep"]


def test_graph_in_unsorted_order_and_legacy_domain():
    nodes = [helper.make_node("Mul", ["q", "two"], ["y"], name="mul"),
             helper.make_node("BipolarQuant", ["x", "s"], ["q"], domain="finn.custom_op.general", name="bq")]
    model = build(nodes, {"x": (4,)}, ["y"], {"two": np.array(2.0, F32), "s": np.array(0.5, F32)})
    model.opset_import.append(helper.make_opsetid("finn.custom_op.general", 1))
    got = Executor(model).run({"x": np.array([-1.0, -0.0, 0.0, 3.0], F32)})["y"]
    assert same_bits(got, np.array([-1.0, 1.0, 1.0, 1.0], F32))


def test_model_sources(tmp_path):
    from finnlite.core.model import Model

    model, x = mixed_model(), random_x(4)
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))

    class HasProto:
        def to_proto(self) -> onnx.ModelProto:
            return model

    expected = Executor(model).run({"x": x})["sum"]
    for source in (str(path), path, model.SerializeToString(), HasProto(), qonnx_model(model), Model.load(model)):
        assert same_bits(Executor(source).run({"x": x})["sum"], expected), type(source)
    assert same_bits(execute(model, {"x": x})["sum"], expected)
    with pytest.raises(ModelLoadError, match="no such model file"):
        Executor(tmp_path / "missing.onnx")
    with pytest.raises(ModelLoadError):
        Executor(42)


def test_standard_model_runs_in_plain_onnxruntime():
    rng = np.random.default_rng(1)
    inits = {"s": np.array(0.1, F32), "z": np.array(0.0, F32), "b": np.array(4, F32),
             "w": rng.standard_normal((6, 5)).astype(F32)}
    nodes = [helper.make_node("Quant", ["x", "s", "z", "b"], ["q"], domain=Q, signed=1, narrow=0),
             helper.make_node("MatMul", ["q", "w"], ["y"])]
    model = build(nodes, {"x": (2, 6)}, ["y"], inits)
    ex = Executor(model)
    standard = ex.standard_model()
    assert all(n.domain == "" for n in standard.graph.node)
    x = rng.standard_normal((2, 6)).astype(F32)
    session = plan.make_session(standard)
    assert same_bits(session.run(None, {"x": x})[0], ex.run({"x": x})["y"])
    with pytest.raises(OpError, match="pool_nhwc"):
        Executor(mixed_model()).standard_model()


# -- errors ---------------------------------------------------------------------------------------------------
def test_unknown_custom_op_and_domain_name_the_node():
    model = build([helper.make_node("Frobnicate", ["x"], ["y"], domain=Q, name="weird")], {"x": (1,)}, ["y"])
    with pytest.raises(OpError, match=r"node 'weird'.*unknown custom op 'Frobnicate'"):
        Executor(model)
    model = build([helper.make_node("Foo", ["x"], ["y"], domain="com.example", name="alien")], {"x": (1,)}, ["y"])
    with pytest.raises(OpError, match=r"node 'alien'.*unknown op domain 'com.example'"):
        Executor(model)


def test_malformed_graphs_raise_graph_errors():
    missing = build([helper.make_node("Add", ["x", "ghost"], ["y"], name="adder")], {"x": (1,)}, ["y"])
    with pytest.raises(GraphError, match=r"node 'adder', tensor 'ghost'.*not produced by any node"):
        Executor(missing)
    cycle = build([helper.make_node("Add", ["x", "b"], ["a"], name="n1"),
                   helper.make_node("Relu", ["a"], ["b"], name="n2")], {"x": (1,)}, ["a"])
    with pytest.raises(GraphError, match="cycle"):
        Executor(cycle)
    twice = build([helper.make_node("Relu", ["x"], ["y"], name="r1"),
                   helper.make_node("Relu", ["x"], ["y"], name="r2")], {"x": (1,)}, ["y"])
    with pytest.raises(GraphError, match=r"node 'r2', tensor 'y'.*produced twice"):
        Executor(twice)
    no_output = build([helper.make_node("Relu", ["x"], ["y"])], {"x": (1,)}, ["nothing"])
    with pytest.raises(GraphError, match=r"tensor 'nothing'.*graph output"):
        Executor(no_output)


def test_bad_user_inputs_name_the_tensor():
    ex = Executor(mixed_model())
    x = random_x(0)
    with pytest.raises(GraphError, match=r"tensor 'y'.*not an input"):
        ex.run({"x": x, "y": x})
    with pytest.raises(GraphError, match=r"tensor 'x'.*missing"):
        ex.run({})
    with pytest.raises(GraphError, match=r"tensor 'x'.*shape \(1, 3, 7, 8\).*\(1, 3, 8, 8\)"):
        ex.run({"x": x[:, :, :7]})
    with pytest.raises(GraphError, match=r"tensor 'x'.*dtype float64.*float32"):
        ex.run({"x": x.astype(np.float64)})
    with pytest.raises(GraphError, match=r"tensor 'thr'.*initializer"):
        ex.run({"x": x, "thr": np.zeros((4, 3), F32)})


def test_runtime_failures_name_the_node():
    # a Reshape to a size that does not fit fails in onnxruntime
    model = build([helper.make_node("Reshape", ["x", "shape"], ["y"], name="bad_reshape")], {"x": (2, 3)}, ["y"],
                  {"shape": np.array([4, 2], np.int64)})
    with pytest.raises(OpError, match="bad_reshape"):
        Executor(model).run({"x": np.zeros((2, 3), F32)})
    # thresholds that do not fit the channels: the op's own check, at plan time
    model = build([helper.make_node("MultiThreshold", ["x", "t"], ["y"], domain=Q, name="mt", out_dtype="UINT2")],
                  {"x": (1, 3, 2, 2)}, ["y"], {"t": np.zeros((2, 3), F32)})
    with pytest.raises(OpError, match=r"node 'mt'.*2 rows.*3 channels"):
        Executor(model)


# -- batches --------------------------------------------------------------------------------------------------
def flatten_model() -> onnx.ModelProto:
    """x (1, 2, 3, 3) → Quant → Reshape([1, -1]) → Gemm → Quant: a flatten with the batch hard-coded."""
    rng = np.random.default_rng(2)
    inits = {"s": np.array(0.1, F32), "z": np.array(0.0, F32), "b": np.array(4, F32),
             "shape": np.array([1, -1], np.int64), "w": rng.standard_normal((5, 18)).astype(F32),
             "bias": rng.standard_normal(5).astype(F32)}
    nodes = [helper.make_node("Quant", ["x", "s", "z", "b"], ["q"], domain=Q, signed=1, narrow=0),
             helper.make_node("Reshape", ["q", "shape"], ["flat"], name="flatten", allowzero=1),
             helper.make_node("Gemm", ["flat", "w", "bias"], ["g"], transB=1),
             helper.make_node("Quant", ["g", "s", "z", "b"], ["y"], domain=Q, signed=1, narrow=0)]
    return build(nodes, {"x": (1, 2, 3, 3)}, ["y"], inits, value_info={"flat": (1, 18)})


def batch_of(n: int) -> np.ndarray:
    return np.random.default_rng(n).uniform(-2, 2, (n, 2, 3, 3)).astype(F32)


def test_per_item_batches_equal_single_runs_bit_for_bit():
    ex = Executor(flatten_model())
    xb = batch_of(5)
    got = ex.run({"x": xb})["y"]
    singles = np.concatenate([ex.run({"x": xb[i:i + 1]})["y"] for i in range(5)])
    assert got.shape == (5, 5) and same_bits(got, singles)
    everything = ex.run({"x": xb}, return_all=True)
    assert everything["flat"].shape == (5, 18) and everything["w"].shape == (5, 18)


def test_vectorized_batches_rewrite_the_flatten(caplog):
    ex = Executor(flatten_model(), batch_mode="vectorized")
    xb = batch_of(4)
    with caplog.at_level(logging.WARNING):
        got = ex.run({"x": xb})["y"]
    assert not caplog.records
    reshape = next(n for s in ex._plan(True, False).steps for n in s.nodes if n.op_type == "Reshape")
    assert list(ex._plan(True, False).steps[0].constants[reshape.input[1]]) == [-1, 18]
    singles = np.concatenate([Executor(flatten_model()).run({"x": xb[i:i + 1]})["y"] for i in range(4)])
    assert got.shape == (4, 5)
    np.testing.assert_allclose(got, singles, atol=0.1 + 1e-6)  # at most one quantization step apart


def test_vectorized_batches_fall_back_to_chunks_when_the_batch_is_lost(caplog):
    # (1, 6) → Reshape([2, 3]) → ReduceSum over axis 0: the batch is folded into the reshape, no rewrite applies
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"], name="fold_batch"),
             helper.make_node("ReduceSum", ["r", "axis"], ["y"], keepdims=1)]
    model = build(nodes, {"x": (1, 6)}, ["y"], {"shape": np.array([2, 3], np.int64),
                                                "axis": np.array([0], np.int64)})
    ex = Executor(model, batch_mode="vectorized")
    xb = np.arange(18, dtype=F32).reshape(3, 6)
    with caplog.at_level(logging.WARNING):
        got = ex.run({"x": xb})["y"]
    assert any("chunks" in r.getMessage() and "fold_batch" in r.getMessage() for r in caplog.records)
    expected = np.concatenate([Executor(model).run({"x": xb[i:i + 1]})["y"] for i in range(3)])
    assert same_bits(got, expected)
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # from now on straight to chunks, without another warning
        assert same_bits(ex.run({"x": xb})["y"], expected)
    assert not caplog.records


def test_batch_errors():
    ex = Executor(flatten_model())
    with pytest.raises(GraphError, match="batch size 0"):
        ex.run({"x": np.zeros((0, 2, 3, 3), F32)})
    two = build([helper.make_node("Add", ["a", "b"], ["y"])], {"a": (2, 3), "b": (2, 3)}, ["y"])
    with pytest.raises(GraphError, match="not a multiple"):
        Executor(two).run({"a": np.zeros((3, 3), F32), "b": np.zeros((3, 3), F32)})
    with pytest.raises(GraphError, match="same N"):
        Executor(two).run({"a": np.zeros((4, 3), F32), "b": np.zeros((6, 3), F32)})
    got = Executor(two).run({"a": np.ones((4, 3), F32), "b": np.ones((4, 3), F32)})["y"]
    assert same_bits(got, np.full((4, 3), 2, F32))


# -- float64 --------------------------------------------------------------------------------------------------
def test_float64_mode_runs_in_double_and_resolves_float32_ties():
    """A float32 quotient that rounds onto a tie (3.5 → even, 4) while the exact quotient is below it (→ 3)."""
    s, x = F32(0.1), F32(0.35)
    assert x / s == F32(3.5) and np.float64(x) / np.float64(s) < 3.5
    model = build([helper.make_node("Quant", ["x", "s", "z", "b"], ["y"], domain=Q, signed=1, narrow=0)],
                  {"x": (1,)}, ["y"], {"s": np.array(s), "z": np.array(0.0, F32), "b": np.array(8, F32)})
    xs = np.array([x], F32)
    assert Executor(model).run({"x": xs})["y"][0] == F32(4) * s
    y64 = Executor(model, dtype=np.float64).run({"x": xs})["y"]
    assert y64.dtype == np.float64 and y64[0] == 3 * np.float64(s)


def test_float64_mode_runs_conv_and_pools_through_numpy():
    rng = np.random.default_rng(7)
    inits = {"w": rng.standard_normal((6, 2, 3, 3)).astype(F32), "b": rng.standard_normal(6).astype(F32),
             "third": np.array(1 / 3, F32)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", group=2, pads=[1, 0, 2, 1],
                              strides=[2, 1], dilations=[1, 2]),
             helper.make_node("AveragePool", ["c"], ["a"], name="avg", kernel_shape=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["a"], ["g"], name="gap"),
             helper.make_node("Cast", ["g"], ["g32"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["g32", "third"], ["y"])]
    model = build(nodes, {"x": (1, 4, 9, 8)}, ["y", "a"], inits)
    x = rng.standard_normal((1, 4, 9, 8)).astype(F32)
    ex64 = Executor(model, dtype=np.float64)
    assert ex64.describe().count("no double kernel") == 3
    got = ex64.run({"x": x})
    ref = Executor(model).run({"x": x})
    for name in ("y", "a"):
        assert got[name].dtype == np.float64
        np.testing.assert_allclose(got[name], ref[name], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op,attrs,slope", [
    ("LeakyRelu", dict(alpha=0.125), None), ("LeakyRelu", dict(), None), ("PRelu", dict(), (4, 1, 1)),
    ("PRelu", dict(), (1,)), ("HardSigmoid", dict(alpha=1 / 6, beta=0.5), None), ("HardSigmoid", dict(), None)])
def test_float64_activations_match_onnxruntime(op, attrs, slope):
    """onnxruntime has no double LeakyRelu, PRelu or HardSigmoid: the float64 mode runs them through numpy, with
    the results of the float32 kernels (up to float32 rounding), in double."""
    rng = np.random.default_rng(3)
    x = (4 * rng.standard_normal((2, 4, 3, 3))).astype(F32)
    x[0, 0, 0, :2] = 0.0, -3.0  # zero and the HardSigmoid's saturation points
    inits = {"slope": (0.05 + 0.4 * rng.random(slope)).astype(F32)} if slope else {}
    model = build([helper.make_node(op, ["x"] + list(inits), ["y"], **attrs)], {"x": x.shape}, ["y"], inits)
    ex64 = Executor(model, dtype=np.float64)
    assert "no double kernel" in ex64.describe()
    got = ex64.run({"x": x})["y"]
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, Executor(model).run({"x": x})["y"], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("attrs,w_shape,x_shape", [
    (dict(), (4, 3, 3, 3), (2, 3, 7, 7)),
    (dict(strides=[2, 3], pads=[1, 2, 0, 1], dilations=[2, 1]), (4, 3, 3, 2), (1, 3, 9, 10)),
    (dict(group=3), (6, 1, 3, 3), (1, 3, 6, 6)),
    (dict(auto_pad="SAME_UPPER", strides=[2, 2]), (2, 3, 4, 4), (1, 3, 7, 7)),
    (dict(auto_pad="SAME_LOWER"), (2, 3, 2, 2), (1, 3, 5, 5)),
    (dict(auto_pad="VALID"), (2, 3, 2, 2), (1, 3, 5, 5)),
    (dict(pads=[1, 1]), (3, 2, 3), (2, 2, 10)),
    (dict(group=2, strides=[1, 2, 1]), (4, 1, 2, 2, 2), (1, 2, 4, 5, 3))])
def test_float64_conv_kernel_matches_onnxruntime(attrs, w_shape, x_shape):
    rng = np.random.default_rng(len(w_shape))
    x, w = rng.standard_normal(x_shape).astype(F32), rng.standard_normal(w_shape).astype(F32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], **attrs)
    model = build([node], {"x": x_shape}, ["y"], {"w": w})
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    got = conv(node, [x.astype(np.float64), w.astype(np.float64)])[0]
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("attrs", [dict(kernel_shape=[3, 3]), dict(kernel_shape=[2, 3], strides=[2, 1]),
                                   dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                                   dict(kernel_shape=[3, 3], pads=[1, 0, 1, 2], count_include_pad=1),
                                   dict(kernel_shape=[2, 2], auto_pad="SAME_UPPER", strides=[2, 2])])
def test_float64_average_pool_kernel_matches_onnxruntime(attrs):
    x = np.random.default_rng(0).standard_normal((1, 2, 7, 6)).astype(F32)
    node = helper.make_node("AveragePool", ["x"], ["y"], **attrs)
    model = build([node], {"x": x.shape}, ["y"])
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    np.testing.assert_allclose(average_pool(node, [x.astype(np.float64)])[0], expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(OpError, match="ceil_mode"):
        average_pool(helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], ceil_mode=1), [x])


@pytest.mark.parametrize("attrs,w_shape,x_shape", [
    (dict(strides=[2, 2]), (3, 4, 2, 2), (1, 3, 4, 5)),
    (dict(strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]), (3, 2, 3, 3), (2, 3, 4, 4)),
    (dict(strides=[3, 1], pads=[0, 1, 2, 0], dilations=[1, 2]), (2, 3, 3, 2), (1, 2, 3, 4)),
    (dict(group=2, strides=[2, 2]), (4, 3, 3, 3), (1, 4, 3, 3)),
    (dict(strides=[8], pads=[4, 4]), (4, 2, 16), (1, 4, 5)),
    (dict(strides=[2], pads=[1, 1], dilations=[3]), (2, 2, 4), (1, 2, 6))])
def test_float64_conv_transpose_kernel_matches_onnxruntime(attrs, w_shape, x_shape):
    rng = np.random.default_rng(len(w_shape) + x_shape[-1])
    x, w = rng.standard_normal(x_shape).astype(F32), rng.standard_normal(w_shape).astype(F32)
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], **attrs)
    model = build([node], {"x": x_shape}, ["y"], {"w": w})
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    got = conv_transpose(node, [x.astype(np.float64), w.astype(np.float64)])[0]
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("attrs,scales", [
    (dict(mode="nearest"), [1, 1, 2, 2]),
    (dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor"), [1, 1, 3, 1.5]),
    (dict(mode="nearest", coordinate_transformation_mode="half_pixel", nearest_mode="round_prefer_ceil"),
     [1, 1, 0.5, 2])])
def test_float64_resize_kernel_matches_onnxruntime(attrs, scales):
    x = np.random.default_rng(0).standard_normal((1, 2, 4, 6)).astype(F32)
    node = helper.make_node("Resize", ["x", "", "s"], ["y"], **attrs)
    model = build([node], {"x": x.shape}, ["y"], {"s": np.asarray(scales, F32)})
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    got = resize(node, [x.astype(np.float64), None, np.asarray(scales, np.float64)])[0]
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, expected.astype(np.float64))
    with pytest.raises(OpError, match="linear"):
        resize(helper.make_node("Resize", ["x", "", "s"], ["y"], mode="linear"),
               [x.astype(np.float64), None, np.asarray(scales, np.float64)])


def test_constructor_argument_checks():
    with pytest.raises(ValueError, match="dtype"):
        Executor(mixed_model(), dtype=np.float16)
    with pytest.raises(ValueError, match="batch_mode"):
        Executor(mixed_model(), batch_mode="fast")


def test_constant_folding_batches_nodes_into_one_session_and_names_a_failing_one(monkeypatch):
    """Weight-quantizer-like chains fold in one session (bit-identical to folding node by node), and a folding
    failure still names its node."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(4, 4)).astype(F32)
    quant = [helper.make_node("Quant", ["w", "s", "z", "b"], ["wq"], domain=Q, name="wquant", signed=1, narrow=0,
                              rounding_mode="ROUND"),
             helper.make_node("Transpose", ["wq"], ["wt"], name="wtrans", perm=[1, 0]),
             helper.make_node("Neg", ["wt"], ["wn"], name="wneg"),
             helper.make_node("MatMul", ["x", "wn"], ["y"], name="mm")]
    inits = {"w": w, "s": np.array(0.25, F32), "z": np.array(0.0, F32), "b": np.array(4.0, F32)}
    model = build(quant, {"x": (2, 4)}, ["y"], inits)
    sessions = []
    real = plan.make_session
    monkeypatch.setattr(plan, "make_session", lambda m, t=None: sessions.append(len(m.graph.node)) or real(m, t))
    ex = Executor(model)
    assert len(sessions) == 1 and sessions[0] > 3  # one folding session for the quantizer and both layout ops
    ex.run({"x": np.ones((2, 4), F32)})
    assert sessions[1] == 1  # the region session
    expected = -np.transpose(make_op(quant[0]).execute([w, inits["s"], inits["z"], inits["b"]])[0])
    assert np.array_equal(ex._constants["wn"].view(np.uint32), expected.astype(F32).view(np.uint32))
    bad = build([helper.make_node("Neg", ["c"], ["d"], name="ok_neg"),
                 helper.make_node("Reshape", ["d", "shape"], ["e"], name="bad_reshape"),
                 helper.make_node("Add", ["x", "e"], ["y"], name="add")],
                {"x": (6,)}, ["y"], {"c": np.ones(6, F32), "shape": np.array([4], np.int64)})
    with pytest.raises(OpError) as err:
        Executor(bad)
    assert err.value.node == "bad_reshape"


def test_nodes_with_one_name_run():
    """onnxruntime refuses a graph with two nodes of one name; a node's name does not change what it computes, so
    the executor's regions give repeated names a suffix (the model is left as it was)."""
    nodes = [helper.make_node("Add", ["x", "c"], ["a"], name="same"),
             helper.make_node("Mul", ["a", "c"], ["b"], name="same"),
             helper.make_node("Relu", ["b"], ["y"], name="same")]
    model = build(nodes, {"x": (1, 4)}, ["y"], {"c": np.full(4, 2.0, F32)})
    x = np.arange(-2, 2, dtype=F32).reshape(1, 4)
    np.testing.assert_array_equal(Executor(model).run({"x": x})["y"], np.maximum((x + 2) * 2, 0))
    assert [n.name for n in model.graph.node] == ["same"] * 3


def test_a_run_drops_each_tensor_after_its_last_reader():
    """Without return_all a plan drops an intermediate tensor as soon as no later step reads it (a run holds what is
    still needed, not every activation); the results are those of a run that keeps everything."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="r0"),
             helper.make_node("MultiThreshold", ["a", "T"], ["b"], domain=Q, name="mt", out_dtype="UINT2"),
             helper.make_node("Add", ["b", "a"], ["c"], name="add"),
             helper.make_node("MultiThreshold", ["c", "T"], ["d"], domain=Q, name="mt2", out_dtype="UINT2"),
             helper.make_node("Mul", ["d", "c"], ["y"], name="mul")]
    inits = {"T": np.sort(np.random.default_rng(0).uniform(-1, 3, size=(1, 3)), axis=1).astype(F32)}
    model = build(nodes, {"x": (1, 4)}, ["y"], inits)
    ex = Executor(model, lower=False)  # MultiThresholds as kernels: steps between regions
    x = {"x": np.random.default_rng(1).uniform(-2, 2, size=(1, 4)).astype(F32)}
    everything = ex.run(x, return_all=True)
    plan = ex._plan(False, False)
    dropped = {t for names in plan._drop for t in names}
    assert {"a", "b", "c", "d"} <= dropped and "y" not in dropped and len(plan.steps) > 2
    env = dict(ex._constants)
    env.update(x)
    plan.execute(env)
    assert "y" in env and not {"a", "b", "c", "d"} & set(env)
    np.testing.assert_array_equal(ex.run(x)["y"], everything["y"])
    assert ex._plan(False, True)._drop is None  # return_all keeps every tensor


@pytest.mark.parametrize("op", ["Quant", "BipolarQuant"])
def test_large_weight_quantizers_fold_by_rows_with_their_kernel(monkeypatch, op):
    """A quantizer of a large weight folds through its numpy kernel over blocks of rows (no session and none of
    its weight-sized temporaries): bit-identical to the kernel on the whole weight."""
    from custom_ops.plan import FEED_ELEMENTS

    rng = np.random.default_rng(1)
    rows = 64
    w = rng.normal(size=(rows, FEED_ELEMENTS // 16)).astype(F32)
    s = np.exp(rng.uniform(-3, 0, size=(rows, 1))).astype(F32)  # per row: sliced with each block
    inputs = ["w", "s", "z", "b"] if op == "Quant" else ["w", "s"]
    attrs = {"signed": 1, "narrow": 1} if op == "Quant" else {}
    node = helper.make_node(op, inputs, ["wq"], domain=Q, name="wquant", **attrs)
    inits = {"w": w, "s": s, "z": np.array(0.0, F32), "b": np.array(3.0, F32)}
    model = build([node, helper.make_node("MatMul", ["x", "wq"], ["y"], name="mm")], {"x": (2, rows)}, ["y"],
                  {k: v for k, v in inits.items() if k in inputs})
    sessions = []
    real = plan.make_session
    monkeypatch.setattr(plan, "make_session", lambda m, t=None, **kw: sessions.append(len(m.graph.node))
                        or real(m, t, **kw))
    ex = Executor(model)
    assert sessions == [] and "wq" in ex._constants
    expected = make_op(node).execute([inits[k] for k in inputs])[0]
    assert np.array_equal(ex._constants["wq"].view(np.uint32), expected.astype(F32).view(np.uint32))
