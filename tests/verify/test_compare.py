"""Tensor comparison under policies, and quantization steps."""

from __future__ import annotations

import numpy as np

from tests.verify.graphs import GraphBuilder, int_multithreshold, quant_graph
from verify import Equality, Tolerance, compare_tensor, quant_step


def test_exact_comparison_reports_the_worst_element() -> None:
    a = np.array([[1.0, 2.0, 3.0]], np.float32)
    b = np.array([[1.0, 2.5, 3.0]], np.float32)
    d = compare_tensor("t", a, b, Equality())
    assert not d.ok and d.bad.tolist() == [1] and d.max_abs == 0.5 and d.worst == (0, 1)
    assert (d.expected_value, d.actual_value) == (2.5, 2.0)
    assert "1 of 3 elements differ (compared exactly); max abs error 0.5 at (0, 1)" in d.describe()
    assert compare_tensor("t", a, a.copy(), Equality()).ok


def test_nan_equals_nan_and_shapes_must_match() -> None:
    a = np.array([np.nan, 1.0])
    assert compare_tensor("t", a, a.copy(), Equality()).ok
    d = compare_tensor("t", np.array([np.nan, 1.0]), np.array([0.0, 1.0]), Tolerance(atol=10))
    assert not d.ok and d.max_abs == np.inf
    d = compare_tensor("t", np.zeros((1, 4)), np.zeros((1, 5)), Tolerance(atol=1))
    assert not d.ok and "shape (1, 4), expected (1, 5)" in d.describe()


def test_tolerance_and_integer_exactness() -> None:
    a, b = np.array([1.0, 100.0]), np.array([1.000001, 100.001])
    assert compare_tensor("t", a, b, Tolerance(rtol=2e-5)).ok
    assert not compare_tensor("t", a, b, Tolerance(rtol=2e-6)).ok
    assert not compare_tensor("t", a, b, Tolerance(rtol=2e-5), integer=True).ok  # integer tensors: always exact
    cancelled = np.array([1000.0, 0.001]), np.array([1000.0, 0.0011])  # noise relative to the tensor's largest value
    assert compare_tensor("t", *cancelled, Tolerance(rtol_max=1e-6)).ok
    assert not compare_tensor("t", *cancelled, Tolerance(rtol=1e-3)).ok
    steps = compare_tensor("t", np.array([0.5, 1.0]), np.array([0.75, 1.0]), Tolerance(steps=1), step=0.25)
    assert steps.ok
    assert not compare_tensor("t", np.array([0.5]), np.array([1.0]), Tolerance(steps=1), step=0.25).ok
    per_channel = compare_tensor("t", np.zeros((2, 2)), np.array([[0.1, 0.1], [1.0, 1.0]]), Tolerance(steps=1),
                                 step=np.array([[0.1], [0.5]]))
    assert per_channel.bad.tolist() == [2, 3]


def test_tolerance_decides_as_the_element_wise_bound() -> None:
    """The comparison skips the per-element bounds when the largest error is below all of them: on errors placed
    just inside and just outside each element's bound (float32 and float64, per-channel steps, signs and zeros), the
    elements it reports are exactly those above :meth:`Tolerance.bound`."""
    rng = np.random.default_rng(7)
    for trial in range(200):
        dtype = np.float32 if trial % 2 else np.float64
        b = (rng.standard_normal((3, 4, 5)) * 10.0 ** rng.integers(-3, 4)).astype(dtype)
        b[0, 0, :2] = 0
        policy = Tolerance(atol=float(rng.choice([0, 1e-6])), rtol=float(rng.choice([0, 1e-5])),
                           rtol_max=float(rng.choice([0, 1e-4])), steps=float(rng.choice([0, 0.5])))
        step = rng.uniform(0.01, 0.1, (1, 4, 1)) if policy.steps else None
        bound = policy.bound(b, None if step is None else np.broadcast_to(step, b.shape))
        if not bound.max() > 0:
            continue
        scale = rng.choice([0.5, 0.999, 1.0, 1.001, 2.0], size=b.shape, p=[0.9, 0.04, 0.02, 0.02, 0.02]) \
            if trial % 3 else np.full(b.shape, 0.999)
        a = (b + np.sign(rng.standard_normal(b.shape)) * bound * scale).astype(dtype)
        err = np.abs(a.astype(dtype) - b)
        expected = np.flatnonzero(err > policy.bound(b, None if step is None else np.broadcast_to(step, b.shape)))
        got = compare_tensor("t", a, b, policy, step=step)
        assert got.bad.tolist() == expected.tolist(), trial
        assert got.ok == (expected.size == 0)
        assert got.max_abs == float(err.reshape(-1)[expected].max() if expected.size else err.max())


def test_quantization_steps() -> None:
    m = quant_graph(3, False)
    assert float(quant_step(m, "out")) == 0.25 and quant_step(m, "x") is None
    assert quant_step(int_multithreshold(), "out") == 1.0  # annotated UINT4
    g = GraphBuilder()
    g.input("x", [1, 4])
    g.init("t", np.zeros((1, 3), np.float32)), g.init("c", np.array([2.0, -3.0, 1.0, 1.0], np.float32))
    g.init("s", np.float32(0.5))
    g.node("MultiThreshold", ["x", "t"], ["m"], "mt", domain="qonnx.custom_op.general", out_dtype="UINT2",
           out_scale=0.5)
    g.node("Mul", ["m", "c"], ["y"], "mul")
    g.node("BipolarQuant", ["x", "s"], ["b"], "bq", domain="qonnx.custom_op.general")
    g.output("y", [1, 4]), g.output("b", [1, 4])
    model = g.model()
    assert quant_step(model, "m") == 0.5
    np.testing.assert_allclose(quant_step(model, "y"), [1.0, 1.5, 0.5, 0.5])
    assert float(quant_step(model, "b")) == 1.0


def test_bipolar_annotated_tensor_has_step_two() -> None:
    """Levels ±1: one level apart is 2, as for a BipolarQuant of scale 1 (a flip is one step, not two)."""
    model = int_multithreshold()
    model.set_tensor_datatype("out", "BIPOLAR")
    assert quant_step(model, "out") == 2.0


def test_float64_runs_are_consulted_only_where_they_could_explain() -> None:
    """split_near_ties runs the float64 sides only when every difference is one step and a whole number of the
    cached value's steps (its grid, grid_step): float64's value is one of those levels, so an element off that grid
    differs whatever it says. A one-step difference is a near-tie only where float64 execution of the version
    before, of the version after and (where it has the tensor) of the original agree on a level of the two."""
    from verify.ties import split_near_ties

    calls = []

    def sides(before, after):
        return lambda: calls.append(1) or (before, after)

    expected = np.array([-1.0, 1.0, 1.0, -1.0])
    encoded = np.array([0.0, 1.0, 1.0, 0.0])  # the same signs as {0, 1}: no level of a {-1, 1} tensor
    diff = np.array([0, 3])
    args = dict(tensor="t", sample=0, step=1.0, quantizers=[], rtol=1e-5)
    ties, real = split_near_ties(diff, (4,), encoded, expected, sides64=sides(encoded, encoded), grid_step=2.0,
                                 **args)
    assert ties == [] and real.tolist() == [0, 3] and calls == []
    # without the grid, the float64 sides run (and here, agreeing on the new values, excuse the elements)
    ties, real = split_near_ties(diff, (4,), encoded, expected, sides64=sides(encoded, encoded), **args)
    assert calls == [1] and real.size == 0 and [t.evidence for t in ties] == ["float64", "float64"]
    flipped = np.array([1.0, 1.0, 1.0, 1.0])
    step2 = dict(args, step=2.0)
    # a whole step away (a level flipped): both float64 sides must give the same level
    ties, real = split_near_ties(diff, (4,), flipped, expected, sides64=sides(flipped, flipped), grid_step=2.0,
                                 **step2)
    assert calls == [1, 1] and real.size == 0 and len(ties) == 2
    ties, real = split_near_ties(diff, (4,), flipped, expected, sides64=sides(expected, flipped), grid_step=2.0,
                                 **step2)
    assert real.tolist() == [0, 3] and ties == []
    # the original's float64 run, where it has the tensor, must agree too
    ties, real = split_near_ties(diff, (4,), flipped, expected, sides64=sides(flipped, flipped), grid_step=2.0,
                                 float64=lambda: expected, **step2)
    assert real.tolist() == [0, 3] and ties == []
    # float64 sides that agree on a third level explain neither value
    third = np.array([3.0, 1.0, 1.0, 3.0])
    ties, real = split_near_ties(diff, (4,), flipped, expected, sides64=sides(third, third), grid_step=2.0, **step2)
    assert real.tolist() == [0, 3] and ties == []


def test_a_margin_alone_never_makes_a_near_tie(monkeypatch) -> None:
    """Without float64 evidence a one-step difference is real, however near its input is to a boundary (an
    accumulator next to a threshold off by one looks the same); and off the grid no margin is even computed."""
    import verify.ties
    from verify.ties import Margin, split_near_ties

    asked = []
    near = Margin(7.5, 7.5, 0.0, False)
    monkeypatch.setattr(verify.ties, "margin_at", lambda node, values, index: asked.append(index) or near)
    expected = np.array([-1.0, 1.0, 1.0, -1.0])
    encoded = np.array([0.0, 1.0, 1.0, 0.0])
    diff = np.array([0, 3])
    args = dict(tensor="t", sample=0, step=1.0, quantizers=[(object(), lambda name: None)], rtol=1e-5)
    ties, real = split_near_ties(diff, (4,), encoded, expected, grid_step=2.0, **args)
    assert ties == [] and real.tolist() == [0, 3] and asked == []
    ties, real = split_near_ties(diff, (4,), encoded, expected, **args)
    assert ties == [] and real.tolist() == [0, 3]
    ties, real = split_near_ties(diff, (4,), encoded, expected, sides64=lambda: (None, encoded), **args)
    assert ties == [] and real.tolist() == [0, 3]
