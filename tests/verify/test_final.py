"""The final check of a streamlined model against the original, and the verified-run helpers."""

from __future__ import annotations

import numpy as np
import pytest

from finnlite import Stage, VerificationError
from tests.verify.graphs import GraphBuilder, add_relu, batchnorm, matmul_bias_relu
from tests.verify.test_hook import FoldBatchNorm, RenameNodes
from tests.verify.test_wrong_rewrites import AddSelf
from verify import PassVerificationError, ReferenceData, final_check, integer_tail
from tests.verify.verified_run import verified_run


def test_float_outputs_within_rtol() -> None:
    model = matmul_bias_relu()
    ref = ReferenceData.random(model, n=6)
    result = final_check(ref, model)
    assert result.ok and result.near_tie_samples == []
    (out,) = result.outputs
    assert out.compared_as.startswith("float") and out.agree32 == 6 and out.max_error64 < 1e-5
    assert "float64 agrees on 6/6, float32 on 6/6" in result.summary()


def test_a_different_model_fails_the_final_check() -> None:
    model = matmul_bias_relu()
    ref = ReferenceData.random(model, n=4)
    w = model.get_initializer("W").copy()
    w[0, 0] += 0.5
    model.set_initializer("W", w)
    result = final_check(ref, model)
    assert not result.ok and len(result.outputs[0].error_samples) > 0
    with pytest.raises(VerificationError, match=r"tensor 'out': final check: .*differs from float64 execution"):
        result.raise_for_errors()


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_an_error_computing_the_originals_outputs_ahead_is_raised_by_the_check(monkeypatch) -> None:
    """The original's outputs are computed on a helper thread while the streamlined model runs: what fails there is
    raised by the final check itself, and the thread leaves no unhandled exception."""
    model = matmul_bias_relu()
    ref = ReferenceData.random(model, n=3)
    calls = []

    def broken(self, dtype=np.float32):
        calls.append(dtype)
        raise RuntimeError("the original cannot run")

    monkeypatch.setattr(ReferenceData, "outputs", broken)
    with pytest.raises(RuntimeError, match="the original cannot run"):
        final_check(ref, model)
    assert len(calls) == 2  # ahead on the helper thread, then again on the caller's


def _int_net():
    g = GraphBuilder()
    g.input("x", [1, 2, 2, 2])
    g.multithreshold("x", "q", "mt0", np.linspace(-1, 1, 7, dtype=np.float32)[None, :], "UINT3")
    g.init("s", np.float32(0.3)), g.init("b", np.float32(-0.7)), g.init("shape", np.array([1, -1]), np.int64)
    g.node("Mul", ["q", "s"], ["m"], "mul_out")
    g.node("Add", ["m", "b"], ["a"], "add_out")
    g.node("Reshape", ["a", "shape"], ["out"], "flat")
    g.input("y", [1, 8])
    g.node("Add", ["out", "y"], ["joined"], "join")
    g.output("out", [1, 8]), g.output("joined", [1, 8])
    return g.model()


def test_integer_tail() -> None:
    model = _int_net()
    q, tail = integer_tail(model, "out")
    assert q == "q" and [n.name for n in tail] == ["mul_out", "add_out", "flat"]
    assert integer_tail(model, "joined") is None  # a join with a non-constant input is not a dequantization
    ref = ReferenceData.random(model, n=3)
    result = final_check(ref, model)
    assert result.ok, result.summary()
    by_name = {o.name: o for o in result.outputs}
    assert by_name["out"].compared_as == "levels of integer tensor 'q' through 3 dequantization node(s)"
    assert by_name["out"].max_error64 < 1e-6 and by_name["joined"].compared_as.startswith("float")


def test_verified_run() -> None:
    model = batchnorm()
    ref = ReferenceData.random(model, n=4)
    run = verified_run(model, [Stage("s", [RenameNodes, FoldBatchNorm])], ref)
    assert run.final.ok and "final check" in run.summary()
    assert [r.label for r in run.hook.records] == ["pass 'RenameNodes'", "pass 'FoldBatchNorm'"]
    with pytest.raises(PassVerificationError):
        verified_run(add_relu(), [Stage("s", [AddSelf])])


@pytest.mark.parametrize("perturb", [False, True])
def test_float64_runs_where_float32_disagrees_and_decides(perturb: bool) -> None:
    """The original runs in float64 only on samples where float32 execution disagrees; a wrong weight fails them."""
    model = matmul_bias_relu()
    ref = ReferenceData.random(model, n=4)
    if perturb:
        w = model.get_initializer("W").copy()
        w[0, 0] += 0.5
        model.set_initializer("W", w)
    result = final_check(ref, model)
    assert result.ok == (not perturb)
    assert bool(result.outputs[0].error_samples) == perturb
    assert result.outputs[0].agree32 == 4 - len(result.outputs[0].error_samples)
