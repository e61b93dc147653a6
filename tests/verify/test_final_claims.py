"""The final check's checks beyond the outputs' levels, on graphs built in code: datatype claims, the output
dequantization's constants, the first diverging tensor, and the default reference data."""

from __future__ import annotations

import numpy as np
import pytest

from finnlite import VerificationError
from finnlite.build import default_samples, make_reference
from finnlite.config import Config
from tests.verify.graphs import GraphBuilder, matmul_bias_relu
from verify import ReferenceData, final_check
from verify.annotations import check_annotations
from verify.tail import check_tail


def _mlp(acc: str = "INT6", weight: str = "INT2", out_dtype: str = "UINT2", w: np.ndarray | None = None):
    """x (INT3, 4 values) -> MatMul(W) -> acc -> MultiThreshold (3 thresholds) -> y."""
    g = GraphBuilder()
    g.input("x", [1, 4], datatype="INT3")
    g.init("W", w if w is not None else np.array([[1, -1, 0], [-2, 1, 1], [0, 1, -1], [1, 0, 1]], np.float32))
    g.datatypes["W"] = weight
    g.node("MatMul", ["x", "W"], ["acc"], "mm", datatype=acc)
    g.multithreshold("acc", "y", "mt", np.array([[-2.0, 0.0, 3.0]] * 3, np.float32), out_dtype)
    g.output("y", [1, 3])
    return g.model()


def test_true_annotations_pass() -> None:
    model = _mlp()
    assert check_annotations(model, ReferenceData.random(model, n=4, low=-4, high=3)) == []


@pytest.mark.parametrize("change, tensor, node, words", [
    ({"acc": "INT4"}, "acc", "mm", "derived range"),  # |acc| can reach 16 (4 inputs of -4 times weights)
    ({"weight": "BIPOLAR"}, "W", None, "outside [-1, 1]"),
    ({"weight": "INT2", "w": np.array([[1, -1, 0], [-1, 1, 1], [0, 1, -1], [1, 0, 1]], np.float32) + 0.5}, "W",
     None, "non-integer"),
    ({"out_dtype": "BIPOLAR"}, "y", "mt", "BIPOLAR is false: its levels hold values in [0, 3]"),
    ({"w": np.array([[1, -1, 0], [-2, 1, 1], [0, 1, -1], [1, 0, 5]], np.float32)}, "W", None, "outside [-2, 1]"),
])
def test_false_annotations_are_named(change: dict, tensor: str, node: str | None, words: str) -> None:
    model = _mlp(**change)
    issues = check_annotations(model, ReferenceData.random(model, n=4, low=-4, high=3))
    assert issues and issues[0].tensor == tensor and issues[0].node == node
    assert words in issues[0].describe()
    ref = ReferenceData.random(_mlp(), n=4, low=-4, high=3)
    result = final_check(ref, model)
    assert not result.ok
    with pytest.raises(VerificationError) as info:
        result.raise_for_errors()
    assert info.value.tensor == tensor


def test_a_claim_no_range_derives_is_checked_on_the_values_seen() -> None:
    g = GraphBuilder()
    g.input("x", [1, 4], datatype="INT3")
    g.init("c", np.float32(5.0))
    g.node("Add", ["x", "c"], ["y"], "shift", datatype="UINT2")  # values 1..8: not UINT2
    g.output("y", [1, 4])
    model = g.model()
    (issue,) = check_annotations(model, ReferenceData.random(model, n=4, low=-4, high=3))
    assert issue.tensor == "y" and issue.node == "shift" and "reference data show" in issue.message



@pytest.mark.parametrize("where", [0, (1 << 16) - 1, 1 << 16, 200_000])  # blocks of verify.annotations._BLOCK
def test_one_fraction_in_a_large_tensor_falsifies_an_integer_claim(where: int) -> None:
    g = GraphBuilder()
    g.input("x", [1, 200_001])
    g.init("c", np.float32(0.0))
    g.node("Add", ["x", "c"], ["y"], "shift", datatype="INT3")
    g.output("y", [1, 200_001])
    model = g.model()
    x = np.random.default_rng(0).integers(-4, 4, (1, 200_001)).astype(np.float32)
    assert check_annotations(model, ReferenceData(model, {"x": x})) == []
    x[0, where] = 0.5
    (issue,) = check_annotations(model, ReferenceData(model, {"x": x}))
    assert issue.tensor == "y" and "0.5" in issue.message

def _tail_net(scale: float = 0.3, bias: float = -0.7):
    g = GraphBuilder()
    g.input("x", [1, 8])
    g.multithreshold("x", "q", "mt0", np.linspace(-1, 1, 7, dtype=np.float32)[None, :], "UINT3")
    g.init("s", np.float32(scale)), g.init("b", np.float32(bias))
    g.node("Mul", ["q", "s"], ["m"], "mul_out")
    g.node("Add", ["m", "b"], ["out"], "add_out")
    g.output("out", [1, 8])
    return g.model()


@pytest.mark.parametrize("scale, bias, node", [(0.3 * 1.001, -0.7, "mul_out"), (0.3, -0.7 + 0.3 * 0.3, "add_out"),
                                               (0.3, -0.7 - 0.45 * 0.3, "add_out")])
def test_tail_constants_are_compared_as_numbers(scale: float, bias: float, node: str) -> None:
    ref = ReferenceData.random(_tail_net(), n=4)
    result = final_check(ref, _tail_net(scale, bias))
    assert all(o.ok for o in result.outputs)  # within half a step: the levels agree
    assert not result.ok and result.tail_issues[0].node == node
    with pytest.raises(VerificationError, match="output dequantization"):
        result.raise_for_errors()
    assert final_check(ref, _tail_net()).ok


def test_the_tail_of_the_original_runs_alone_from_its_last_quantizers() -> None:
    from verify.tail import last_quantizers, tail_outputs64

    g = GraphBuilder()  # a Quant, then the affine tail
    g.input("x", [1, 8])
    g.quant("x", "q", "quant", 0.25, 3, False)
    g.init("s", np.float32(0.3)), g.init("b", np.float32(-0.7))
    g.node("Mul", ["q", "s"], ["m"], "mul_out")
    g.node("Add", ["m", "b"], ["out"], "add_out")
    g.output("out", [1, 8])
    model = g.model()
    nodes, cuts = last_quantizers(model)
    assert [n.name for n in nodes] == ["quant", "mul_out", "add_out"] and [q.name for q in cuts] == ["quant"]
    ref = ReferenceData.random(model, n=3, seed=2)
    got = tail_outputs64(ref, [0, 2])
    want = ref.outputs(np.float64)["out"]
    np.testing.assert_array_equal(got[2]["out"], want[2:3])
    assert sorted(got) == [0, 2]
    assert last_quantizers(_tail_net()) is None  # a MultiThreshold is run through (its output is no input it
    # requantizes), and before it is the graph input
    g = GraphBuilder()  # no quantizer between the input and the output: no tail
    g.input("x", [1, 4])
    g.init("W", np.ones((4, 2), np.float32))
    g.node("MatMul", ["x", "W"], ["y"], "mm")
    g.output("y", [1, 2])
    assert last_quantizers(g.model()) is None


@pytest.mark.zoo
@pytest.mark.parametrize("name", ["cnv_2w2a", "resnet18_4w4a_ts", "tfc_1w1a"])
def test_the_original_tail_in_float64_is_float64_execution(name: str) -> None:
    from finnlite import Model
    from tests.zoo import manifest, zoo_model_path
    from verify.tail import tail_outputs64

    lo, hi = manifest()[name]["input_range"]
    ref = ReferenceData.random(Model(zoo_model_path(name)), n=3, seed=0, low=lo, high=hi)
    got = tail_outputs64(ref, [0, 1, 2])
    want = ref.outputs(np.float64)
    for out, full in want.items():
        tail = np.concatenate([got[i][out] for i in range(3)])
        np.testing.assert_allclose(tail, full, rtol=1e-12, atol=1e-12 * float(np.abs(full).max()))


def test_check_tail_accepts_float32_copies_of_the_constants() -> None:
    from custom_ops.executor import Executor
    from verify.final import _tail_runner, integer_tail

    model = _tail_net(float(np.float32(1 / 3)), float(np.float32(-2 / 3)))
    q, nodes = integer_tail(model, "out")
    levels = np.arange(8, dtype=np.float64)[None, :]
    runner = _tail_runner(model, q, nodes, levels)
    exact = levels / 3 - 2 / 3  # the real numbers the float32 constants stand for
    assert isinstance(runner, Executor)
    assert check_tail("out", q, runner, nodes, [(0, levels, exact)]) is None
    issue = check_tail("out", q, runner, nodes, [(0, levels, exact * 1.00001)])
    assert issue is not None and issue.node == "mul_out"


def _two_layers(t0: list[float]):
    g = GraphBuilder()
    g.input("x", [1, 2, 4, 4])
    g.multithreshold("x", "q", "mt0", np.array([t0], np.float32), "UINT3")
    g.multithreshold("q", "r", "mt1", np.array([[1.0, 3.0, 6.0]], np.float32), "UINT2")
    g.output("r", [1, 2, 4, 4])
    return g.model()


def test_a_failure_names_the_first_diverging_tensor() -> None:
    good = [-0.75, -0.5, -0.25, 0.0, 0.25, 0.5, 0.75]
    bad = [-0.75, -0.5, -0.25, 0.0, 0.25, 0.4, 0.75]  # level 6 starts earlier: q diverges, then r
    ref = ReferenceData.random(_two_layers(good), n=4)
    result = final_check(ref, _two_layers(bad))
    assert not result.ok and result.divergence is not None
    assert result.divergence.tensor == "q" and result.divergence.node == "mt0"
    with pytest.raises(VerificationError) as info:
        result.raise_for_errors()
    assert info.value.node == "mt0" and info.value.tensor == "q" and "first diverging tensor" in str(info.value)


def test_eight_samples_and_a_stated_guess_of_the_input_range() -> None:
    """No input quantizer or datatype: a wide assumed range, and a result verified on it says so (once: the
    description of the samples names the range, the verdict carries the warning)."""
    from finnlite.report import VerificationResult

    model = matmul_bias_relu()
    assert default_samples(model) == 8
    reference, described = make_reference(model, Config())
    assert "8 random samples" in described and "in [-3, 3] (assumed)" in described and "WARNING" not in described
    assert reference.assumed == {"x": (-3.0, 3.0)}
    x = np.stack([reference.sample(i)["x"] for i in range(reference.num_samples)])
    assert x.min() < -2 and x.max() > 2  # the samples cover the range
    result = VerificationResult("final", described, 8, assumed=reference.assumed)
    assert result.status == "verified on an assumed input range [-3, 3]"
    assert result.text().count("WARNING") == 1 and "--input-range" in result.text()
    assert result.to_dict()["assumed_input_ranges"] == {"x": [-3.0, 3.0]}
    given, _ = make_reference(model, Config(), input_range=(-1.0, 1.0))
    assert given.assumed == {} and VerificationResult("final", "", 8, assumed=given.assumed).status == "verified"


def test_float64_from_levels_when_a_target_also_feeds_a_later_quantizer() -> None:
    """x -> Quant q0 -> Mul = z1 -> Quant q1 -> Add = z2: z1 is both a target and the data input of q1 (ProxylessNAS:
    a BatchNorm output proved and then quantized); q1 reads its own float32 levels, not z1, in the small model."""
    from verify.tail import float64_from_levels, last_quantizers

    g = GraphBuilder()
    g.input("x", [1, 6])
    g.quant("x", "q0", "quant0", 0.1, 4, True)
    g.init("c", np.array([[0.3, -0.7, 1.1, 0.9, -0.2, 0.5]], np.float32))
    g.node("Mul", ["q0", "c"], ["z1"], "mul")
    g.quant("z1", "q1", "quant1", 0.05, 4, True)
    g.init("d", np.float32(0.013))
    g.node("Add", ["q1", "d"], ["z2"], "add")
    g.output("z2", [1, 6])
    model = g.model()
    nodes, cuts = last_quantizers(model, ["z1", "z2"])
    assert sorted(q.name for q in cuts) == ["quant0", "quant1"]  # quant1 starts z2's tail, fed its own levels
    assert {n.name for n in nodes} == {"quant0", "mul", "quant1", "add"}
    ref = ReferenceData.random(model, n=2, seed=3)
    got = float64_from_levels(ref, ["z1", "z2"], [0, 1])
    for i in (0, 1):
        full = ref.values(i, np.float64)
        for name in ("z1", "z2"):
            np.testing.assert_array_equal(got[i][name], full[name])


@pytest.mark.parametrize("index", range(6))
def test_the_tail_check_passes_the_unequal_scale_joins(index: int) -> None:
    """The joins of tests/streamline/test_join.py (a fork into two output quantizers among them) pass the final check
    as the CLI runs it (float64 on mismatches only): a sample whose levels part between the original's float32 and
    float64 runs is compared with the whole float64 run, never with the tail from float32 levels."""
    from finnlite import Model
    from finnlite.build import streamline
    from tests.streamline.test_join import JOINS, _join_model

    s1, s2, qa, qb, outs = JOINS[index]
    report = streamline(Model(_join_model(s1, s2, qa, qb, outs, 16)), verify="final", input_range=(-2.0, 2.0),
                        extras=False)
    assert report.error is None, report.error
