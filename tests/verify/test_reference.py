"""Reference data: random and user-supplied inputs, validation, cached reference results of the original."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest

from finnlite import ConfigError
from tests.verify.graphs import GraphBuilder, add_relu, int_multithreshold, matmul_bias_relu, quant_graph
from verify import ReferenceData, ReferenceDataError


def test_random_inputs_follow_range_and_seed() -> None:
    model = add_relu()
    a = ReferenceData.random(model, n=5, seed=3, low=2, high=3, ranges={"y": (-1, 0)})
    b = ReferenceData.random(model, n=5, seed=3, low=2, high=3, ranges={"y": (-1, 0)})
    assert a.num_samples == 5 and a.inputs["x"].shape == (5, 8) and a.inputs["x"].dtype == np.float32
    assert 2 <= a.inputs["x"].min() and a.inputs["x"].max() < 3 and a.inputs["y"].max() < 0
    np.testing.assert_array_equal(a.inputs["x"], b.inputs["x"])
    assert not np.array_equal(a.inputs["x"], ReferenceData.random(model, n=5, seed=4, low=2, high=3).inputs["x"])
    assert a.sample(2)["x"].shape == (1, 8)


def test_integer_annotated_inputs_get_integers_of_their_type() -> None:
    ref = ReferenceData.random(int_multithreshold(), n=3, low=-50, high=50)
    x = ref.inputs["x"]
    assert np.array_equal(x, np.round(x)) and x.min() >= 0 and x.max() <= 15 and len(np.unique(x)) > 10
    g = GraphBuilder()
    g.input("x", [1, 16], datatype="BIPOLAR")
    g.node("Relu", ["x"], ["out"], "relu0")
    g.output("out", [1, 16])
    assert set(np.unique(ReferenceData.random(g.model(), n=2).inputs["x"])) == {-1.0, 1.0}


def test_symbolic_dims_need_a_shape() -> None:
    g = GraphBuilder()
    g.input("x", [1, 8])
    g.node("Relu", ["x"], ["out"], "relu0")
    g.output("out")
    model = g.model()
    model.set_tensor_shape("x", [None, 8])
    with pytest.raises(ReferenceDataError, match="symbolic dims"):
        ReferenceData.random(model)
    assert ReferenceData.random(model, n=2, shapes={"x": [1, 8]}).inputs["x"].shape == (2, 8)


def test_user_files(tmp_path: Path) -> None:
    model = matmul_bias_relu()
    data = np.random.default_rng(0).uniform(-1, 1, (6, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", data)
    np.savez(tmp_path / "named.npz", x=data)
    np.savez(tmp_path / "anon.npz", data.reshape(6, 1, 8))  # (N, batch, ...) under the default key
    for name in ("x.npy", "named.npz", "anon.npz"):
        ref = ReferenceData.load(model, tmp_path / name)
        assert ref.num_samples == 6 and ref.source.endswith(name)
        np.testing.assert_array_equal(ref.inputs["x"], data)
    assert ReferenceData(model, data.astype(np.float64)).inputs["x"].dtype == np.float32


@pytest.mark.parametrize("inputs, message", [
    ({"x": np.zeros((2, 7), np.float32)}, r"shape \(2, 7\); the model input is \(1, 8\)"),
    ({"x": np.zeros((2, 8)), "z": np.zeros((2, 8))}, "not an input of the model"),
    ({"x": np.full((2, 8), np.nan, np.float32)}, "NaN"),
    ({"x": np.zeros((2, 8), bool)}, "dtype bool"),
    ({}, "no reference values for input"),
])
def test_bad_user_inputs_are_explained(inputs, message) -> None:
    with pytest.raises(ReferenceDataError, match=message):
        ReferenceData(matmul_bias_relu(), inputs)


def test_bad_values_for_an_integer_input() -> None:
    model = int_multithreshold()
    with pytest.raises(ReferenceDataError, match="not UINT4"):
        ReferenceData(model, np.full((1, 4, 4, 4), 16.0, np.float32))
    with pytest.raises(ReferenceDataError, match="not UINT4"):
        ReferenceData(model, np.full((1, 4, 4, 4), 0.5, np.float32))


def test_sample_counts_must_agree_and_files_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ReferenceDataError, match="different sample counts"):
        ReferenceData(add_relu(), {"x": np.zeros((2, 8)), "y": np.zeros((3, 8))})
    with pytest.raises(ReferenceDataError, match="not found") as info:
        ReferenceData.load(add_relu(), tmp_path / "missing.npz")
    assert isinstance(info.value, ConfigError) and info.value.exit_code == 2
    np.save(tmp_path / "one.npy", np.zeros((2, 8), np.float32))
    with pytest.raises(ReferenceDataError, match="2 inputs"):
        ReferenceData.load(add_relu(), tmp_path / "one.npy")
    (tmp_path / "junk.npz").write_bytes(b"not numpy")
    with pytest.raises(ReferenceDataError, match="junk.npz"):
        ReferenceData.load(add_relu(), tmp_path / "junk.npz")


def test_results_are_cached_and_the_original_is_a_snapshot() -> None:
    model = quant_graph(3, False)
    ref = ReferenceData.random(model, n=4, low=-0.5, high=2.5)
    out32 = ref.outputs()
    assert ref.outputs() is out32 and out32["out"].shape == (4, 16)
    np.testing.assert_allclose(ref.outputs(np.float64)["out"], out32["out"], rtol=1e-6)
    values = ref.values(1)
    assert ref.values(1) is values and {"x", "out", "q0_scale"} <= set(values)
    np.testing.assert_array_equal(values["out"], out32["out"][1:2])
    model.get_node_from_name("q0").attributes["rounding_mode"] = ir.AttrString("rounding_mode", "FLOOR")
    # editing the model later does not change the reference
    assert ref.describes(quant_graph(3, False)) and not ref.describes(model)
    np.testing.assert_array_equal(ref.executor().run(ref.inputs)["out"], out32["out"])


def _weighted_model():
    """A MatMul model whose weight is large enough to be kept as an array (not serialized into the snapshot)."""
    from onnx import TensorProto, helper, numpy_helper

    from finnlite import Model
    from finnlite.core.compat import make_model
    from custom_ops.plan import FEED_ELEMENTS as _FEED_ELEMENTS

    k, n = 256, _FEED_ELEMENTS // 256 + 1
    rng = np.random.default_rng(0)
    w = rng.integers(-3, 4, size=(k, n)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
                              [numpy_helper.from_array(w, "w")])
    return Model(make_model(graph, custom_opset=None)), w


def test_the_snapshot_shares_the_models_frozen_weights_and_ignores_later_replacements() -> None:
    model, w = _weighted_model()
    ref = ReferenceData.random(model, n=3, seed=1)
    assert np.shares_memory(ref._weights["w"], model.get_initializer("w"))
    before = ref.outputs()["y"].copy()
    model.set_initializer("w", -w)  # the pipeline replaces weights; the reference keeps the original's
    ref._outputs.clear()
    np.testing.assert_array_equal(ref.outputs()["y"], before)


def test_precompute_keeps_every_result_the_same() -> None:
    model, _ = _weighted_model()
    plain = ReferenceData.random(model, n=3, seed=1)
    ref = ReferenceData.random(model, n=3, seed=1)
    ref.precompute(values=2)
    assert list(ref._executors) == ["float32"]  # kept for later requests (ReferenceData.tensors)
    np.testing.assert_array_equal(ref.outputs()["y"], plain.outputs()["y"])
    taken = ref.take_values(1)
    assert (np.dtype(np.float32).name, 1) not in ref._values  # handed over, not kept
    np.testing.assert_array_equal(taken["h"], plain.values(1)["h"])
    # the original runs again: same results in float32 and float64
    np.testing.assert_array_equal(ref.values(2)["h"], plain.values(2)["h"])
    np.testing.assert_array_equal(ref.outputs(np.float64)["y"], plain.outputs(np.float64)["y"])
    assert list(ref._executors) == ["float64"]  # one executor at a time
    np.testing.assert_array_equal(ref._weights["w"], plain._weights["w"])
    assert ref.original().to_proto().SerializeToString() == plain.original().to_proto().SerializeToString()


def _quantized_weight_model(layers: int = 4):
    """x -> MatMul(Quant(w_i)) ``layers`` times, each w_i (256 x 256) large enough to be fed to the sessions."""
    from onnx import TensorProto, helper, numpy_helper

    from finnlite import Model
    from finnlite.core.compat import QONNX_DOMAIN, make_model
    from custom_ops.plan import FEED_ELEMENTS as _FEED_ELEMENTS

    k = 256
    assert k * k >= _FEED_ELEMENTS
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.float32(v), name) for name, v in (("s", 0.25), ("z", 0.0), ("b", 4.0))]
    nodes, src = [], "x"
    for i in range(layers):
        inits.append(numpy_helper.from_array((rng.normal(size=(k, k)) / 16).astype(np.float32), f"w{i}"))
        out = "y" if i == layers - 1 else f"h{i}"
        nodes += [helper.make_node("Quant", [f"w{i}", "s", "z", "b"], [f"q{i}"], domain=QONNX_DOMAIN, signed=1,
                                   narrow=1, rounding_mode="ROUND"), helper.make_node("MatMul", [src, f"q{i}"], [out])]
        src = out
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, k])], inits)
    return Model(make_model(graph))


def test_the_original_values_are_those_of_a_full_run() -> None:
    from custom_ops.executor import Executor

    model = _quantized_weight_model(3)
    per_channel = np.linspace(0.01, 0.5, 256, dtype=np.float32).reshape(1, 256)  # a scale per output channel
    q1 = model.get_node_from_name(model.find_producer("q1").name)
    q1.replace_input_with(1, model.add_initializer(per_channel, "s1"))
    ref = ReferenceData.random(model, n=2, seed=1)
    outputs = ref.outputs()["y"]
    first, second = ref.values(0), ref.values(1)
    full = Executor(model.to_proto()).run(ref.sample(0), return_all=True)
    for name in full:
        assert np.array_equal(np.asarray(first[name]).view(np.uint8), np.asarray(full[name]).view(np.uint8)), name
    np.testing.assert_array_equal(np.concatenate([first["y"], second["y"]]), outputs)
    again = ReferenceData.random(model, n=2, seed=1)
    again.precompute(values=1)
    np.testing.assert_array_equal(again.outputs()["y"], outputs)
    assert np.array_equal(again.values(0)["q1"], first["q1"])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_selected_tensors_are_those_of_the_full_run(dtype: type) -> None:
    """``tensors`` (an executor exposing only some tensors) computes what the run exposing every tensor does."""
    model, _ = _weighted_model()
    ref = ReferenceData.random(model, n=3, seed=2)
    got = dict(ref.tensors(["h"], [2, 0], dtype))
    assert list(got) == [2, 0]
    for i, values in got.items():
        assert set(values) == {"h", "y"}
        every = ref.values(i, dtype)
        for name in ("h", "y"):
            assert values[name].dtype == dtype
            np.testing.assert_array_equal(values[name], every[name])


def test_tensors_reuses_the_executor_and_computes_what_values_computes() -> None:
    model, _ = _weighted_model()
    ref = ReferenceData.random(model, n=3, seed=1)
    ref.precompute()
    ref.outputs()
    ex = ref._executors["float32"]
    got = dict(ref.tensors(["h"], [0, 2]))
    assert ref._executors["float32"] is ex  # no second executor built
    assert sorted(got[2]) == ["h", "y"]  # the outputs and the tensors asked for
    for i in (0, 2):
        np.testing.assert_array_equal(got[i]["h"], ref.values(i)["h"])
        np.testing.assert_array_equal(got[i]["y"], ref.outputs()["y"][i:i + 1])


def test_outputs_come_with_tensors_run_on_every_sample() -> None:
    model, _ = _weighted_model()
    plain = ReferenceData.random(model, n=3, seed=1)
    ref = ReferenceData.random(model, n=3, seed=1)
    for _ in ref.tensors(["h"], range(3)):
        pass
    assert "float32" not in ref._outputs  # assembled when first asked for, not before
    runs = []
    ex = ref._executors["float32"]
    ex.run, original_run = (lambda *a, **k: runs.append(a) or original_run(*a, **k)), ex.run
    got = ref.outputs()["y"]
    assert not runs  # no run: the three samples' outputs were seen
    np.testing.assert_array_equal(got, plain.outputs()["y"])
    partial = ReferenceData.random(model, n=3, seed=1)
    for _ in partial.tensors(["h"], [0, 2]):
        pass
    np.testing.assert_array_equal(partial.outputs()["y"], plain.outputs()["y"])  # one missing: a full run


def test_the_original_model_holds_the_snapshots_weights_without_a_copy(caplog) -> None:
    model, _ = _weighted_model()
    ref = ReferenceData.random(model, n=2, seed=1)
    with caplog.at_level("WARNING"):
        original = ref.original()
    assert not caplog.records  # no complaint about the weights' readers before the weights are set
    assert np.shares_memory(original.get_initializer("w"), ref._weights["w"])
    assert ref.describes(original)
    from custom_ops.executor import Executor

    np.testing.assert_array_equal(Executor(original.to_proto()).run(ref.sample(1))["y"], ref.outputs()["y"][1:2])
