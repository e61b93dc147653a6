"""The Python conveniences a new user reaches for: one array for a single-input model, ``Model.execute``."""

from __future__ import annotations

import numpy as np
import pytest

from custom_ops.executor import Executor
from finnlite import GraphError, Model
from finnlite.examples import build_tfc


def test_executor_and_model_run_one_array_for_a_single_input_model() -> None:
    model = Model(build_tfc())
    x = np.random.default_rng(0).uniform(0, 1, (3, 1, 28, 28)).astype(np.float32)
    by_name = Executor(model).run({"x": x})
    for got in (Executor(model).run(x), model.execute(x), model.execute({"x": x})):
        assert got.keys() == by_name.keys() and all(np.array_equal(got[k], by_name[k]) for k in got)
    f64 = model.execute(x.astype(np.float64), dtype=np.float64)
    assert next(iter(f64.values())).dtype == np.float64


def test_one_array_for_a_two_input_model_names_the_inputs() -> None:
    from onnx import TensorProto, helper

    from finnlite.core.compat import make_model

    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"], name="add")], "two",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4]) for n in "ab"],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = Model(make_model(graph))
    with pytest.raises(GraphError, match=r"2 data inputs \['a', 'b'\]"):
        model.execute(np.zeros((1, 4), np.float32))
    y = model.execute({"a": np.ones((1, 4), np.float32), "b": np.ones((1, 4), np.float32)})["y"]
    assert np.array_equal(y, np.full((1, 4), 2, np.float32))
