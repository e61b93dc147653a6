"""onnxruntime sessions across a fork: a process forked from the one that made a session (the per-pass checks'
worker) neither runs nor destroys it — the threads of its thread pool did not survive the fork — but parks it and
makes its own (custom_ops.plan._INHERITED)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from onnx import TensorProto, helper

import custom_ops.plan as plan
from custom_ops.executor import Executor
from finnlite.compat import make_model


def _executor() -> Executor:
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="r"), helper.make_node("MaxPool", ["a"], ["y"], name="p",
                                                                               kernel_shape=[2, 2])]
    graph = helper.make_graph(nodes, "g", [vi("x", TensorProto.FLOAT, [1, 1, 4, 4])],
                              [vi("y", TensorProto.FLOAT, [1, 1, 2, 2])])
    return Executor(make_model(graph, custom_opset=None))


def test_sessions_made_by_another_process_are_parked_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    ex = _executor()
    x = {"x": np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4) - 8}
    expected = ex.run(x)["y"]
    steps = ex._plan(False, False).steps
    made = [s._session if isinstance(s, plan.RegionStep) else dict(s._sessions) for s in steps]
    assert all(made) and {type(s).__name__ for s in steps} == {"RegionStep", "NodeSessionStep"}
    parked = len(plan._INHERITED)
    monkeypatch.setattr(os, "getpid", lambda: -1)  # as in a forked child: the sessions are its parent's
    np.testing.assert_array_equal(ex.run(x)["y"], expected)
    assert len(plan._INHERITED) == parked + 2  # each step's session parked, a new one made and run
    assert all(s._session is not made[i] for i, s in enumerate(steps) if isinstance(s, plan.RegionStep))
    monkeypatch.setattr(os, "getpid", lambda: -2)  # forked again: dropping a session parks it too
    for step in steps:
        step.release()
    assert len(plan._INHERITED) == parked + 4  # both steps made their sessions under -1: parked, not destroyed
    del plan._INHERITED[parked:]


def test_the_arena_shrinker_is_made_again_in_a_forked_process(monkeypatch: pytest.MonkeyPatch) -> None:
    _executor().run({"x": np.zeros((1, 1, 4, 4), np.float32)})  # a region session registers the shared arena
    plan.release_memory()
    if plan._SHRINKER is None:
        pytest.skip("this onnxruntime has no shared arena to shrink")
    first, parked = plan._SHRINKER, len(plan._INHERITED)
    monkeypatch.setattr(os, "getpid", lambda: -1)
    plan.release_memory()
    assert plan._SHRINKER is not first and plan._INHERITED[parked:] == [first]
    del plan._INHERITED[parked:]
