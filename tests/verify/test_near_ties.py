"""Float32 near-ties: x = 0.75 and s = 0.1f give x/s = 7.5 in float32 (rounded up to level 8) but 7.4999998882 in
real arithmetic (level 7). A model with exact thresholds computes level 7; it must be accepted as a near-tie (with
its margin), per pass and in the final check, and a real off-by-one must still fail."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import onnx_ir as ir
import pytest

from finnlite import Model, PassManager, Rule, Stage
from finnlite.core.compat import QONNX_DOMAIN
from tests.verify.graphs import GraphBuilder, const, float32_thresholds, new_node, take_over
from verify import PassVerificationError, ReferenceData, VerificationHook, equality, final_check

SCALE = np.float32(0.1)
BITS = 4
TIE_X = np.float32(0.75)
WIDTH = 64


def quant_model() -> Model:
    g = GraphBuilder()
    g.input("x", [1, WIDTH])
    g.quant("x", "out", "q0", SCALE, BITS, False)
    g.output("out", [1, WIDTH])
    return g.model()


def exact_thresholds(scale: np.float32, bits: int) -> np.ndarray:
    """For each level m, the least float32 x with x/s ≥ m − ½ in real numbers (> at an odd tie: half to even)."""
    s = Fraction(float(scale))
    out = []
    for m in range(1, 2**bits):
        bound = (m - Fraction(1, 2)) * s
        t = np.float32(float(bound))
        while Fraction(float(t)) < bound:
            t = np.nextafter(t, np.float32(np.inf))
        while Fraction(float(np.nextafter(t, np.float32(-np.inf)))) >= bound:
            t = np.nextafter(t, np.float32(-np.inf))
        if Fraction(float(t)) == bound and m % 2 == 1:
            t = np.nextafter(t, np.float32(np.inf))
        out.append(t)
    return np.array(out, np.float32)[None, :]


def reference(model: Model, with_tie: bool = True) -> ReferenceData:
    x = np.random.default_rng(3).uniform(0, 1.5, size=(4, WIDTH)).astype(np.float32)
    if with_tie:
        x[0, 5] = TIE_X
    return ReferenceData(model, x)


class QuantToThresholds(Rule):
    """Quant(x, s) → Mul(MultiThreshold(x, T), s), with the thresholds of ``thresholds()``."""

    op_types = ("Quant",)

    def thresholds(self) -> np.ndarray:
        return exact_thresholds(SCALE, BITS)

    def match(self, model, node):
        return node

    def rewrite(self, model, node):
        mt = new_node(model, "MultiThreshold", [node.inputs[0], model.add_initializer(self.thresholds())], "q0_mt",
                      node, domain=QONNX_DOMAIN, attrs=[ir.AttrString("out_dtype", "UINT4")])
        model.set_tensor_datatype(mt.name, "UINT4")
        out = new_node(model, "Mul", [mt, node.inputs[1]], "q0_scale", node)
        take_over(model, node.outputs[0], out)
        model.remove_node(node)


@equality
class ExactThresholds(QuantToThresholds):
    """Thresholds from exact arithmetic (what a streamlined integer model uses)."""


@equality(near_ties=False)
class ExactThresholdsNoTies(QuantToThresholds):
    """The same rewrite, under a policy that does not accept near-ties."""


@equality
class Float32Thresholds(QuantToThresholds):
    """Thresholds that reproduce the float32 quantizer bit for bit (what the convert stage uses)."""

    def thresholds(self) -> np.ndarray:
        return float32_thresholds(SCALE, BITS)


@equality
class ThresholdOffByOneStep(QuantToThresholds):
    """Level 8 switches on one step late (wrong)."""

    def thresholds(self) -> np.ndarray:
        t = exact_thresholds(SCALE, BITS)
        t[0, 7] = t[0, 8]
        return t


def test_the_tie_is_real() -> None:
    assert np.float32(TIE_X) / SCALE == np.float32(7.5)
    assert Fraction(float(TIE_X)) / Fraction(float(SCALE)) < Fraction(15, 2)


def test_per_pass_near_tie_is_accepted_and_reported() -> None:
    model = quant_model()
    hook = VerificationHook(reference(model), samples=4)
    PassManager([Stage("convert", [ExactThresholds])], [hook]).run(model)
    ties = hook.near_ties
    assert len(ties) == 1
    tie = ties[0]
    assert (tie.tensor, tie.sample, tie.index) == ("out", 0, (0, 5))
    assert tie.expected == pytest.approx(0.8) and tie.actual == pytest.approx(0.7)
    assert tie.node == "q0" and tie.evidence == "float64"
    assert tie.margin.value == 7.5 and tie.margin.relative < 1e-7 and not tie.margin.exact
    assert "relative margin" in tie.describe()


def test_no_near_tie_without_the_tie_input() -> None:
    model = quant_model()
    hook = VerificationHook(reference(model, with_tie=False))
    PassManager([Stage("convert", [ExactThresholds])], [hook]).run(model)
    assert hook.near_ties == [] and len(hook.records) == 1


def test_near_ties_can_be_refused_by_the_policy() -> None:
    model = quant_model()
    with pytest.raises(PassVerificationError, match=r"pass 'ExactThresholdsNoTies'.*'q0_scale'.*1 of 64 elements"):
        PassManager([Stage("convert", [ExactThresholdsNoTies])], [VerificationHook(reference(model))]).run(model)


def test_float32_faithful_thresholds_are_exact_in_float32() -> None:
    model = quant_model()
    hook = VerificationHook(reference(model))
    PassManager([Stage("convert", [Float32Thresholds])], [hook]).run(model)
    assert hook.near_ties == []


def test_off_by_one_step_is_not_a_near_tie() -> None:
    model = quant_model()
    with pytest.raises(PassVerificationError) as info:
        PassManager([Stage("convert", [ThresholdOffByOneStep])], [VerificationHook(reference(model))]).run(model)
    assert info.value.node == "q0_scale" and "ThresholdOffByOneStep" in str(info.value)


def test_final_check_counts_the_near_tie_and_explains_it() -> None:
    model = quant_model()
    ref = reference(model)
    PassManager([Stage("convert", [ExactThresholds])], [VerificationHook(ref)]).run(model)
    result = final_check(ref, model)
    assert result.ok, result.summary()
    (out,) = result.outputs
    assert out.compared_as.startswith("levels of integer tensor 'q0_mt") and "1 dequantization node" in out.compared_as
    assert out.near_tie_samples == [0] and out.agree32 == 3 and out.error_samples == []
    assert out.max_error64 < 1e-6
    (site,) = result.tie_sites
    assert (site.sample, site.node, site.tensor, site.index) == (0, "q0", "out", (0, 5))
    assert site.margin32.value == 7.5 and site.margin64.value == pytest.approx(7.4999998882, abs=1e-9)
    assert "7.5 in float32 vs 7.49999989 in float64" in site.describe()
    result.raise_for_errors()


def test_final_check_tells_float_layer_near_ties_from_errors() -> None:
    """A model reproducing float32 execution bit for bit agrees with the original's float32 execution at the tie,
    so the original does not run in float64 there (verify.final: a float-layer near-tie is told apart where float32
    execution disagrees, see test_final_check_explains_a_near_tie_of_a_float_input_layer). A threshold one step off
    is an error."""
    model = quant_model()
    ref = reference(model)
    PassManager([Stage("convert", [Float32Thresholds])], [VerificationHook(ref)]).run(model)
    result = final_check(ref, model)
    assert result.ok and result.outputs[0].agree32 == ref.num_samples, result.summary()
    assert result.float_layer_tie_samples == [] and result.near_tie_samples == []
    wrong = quant_model()
    with pytest.raises(PassVerificationError):  # per-pass verification catches it first ...
        PassManager([Stage("convert", [ThresholdOffByOneStep])], [VerificationHook(ref)]).run(wrong)
    result = final_check(ref, wrong)  # ... and the final check on its own, too
    assert not result.ok and result.float_layer_tie_samples == []
    with pytest.raises(Exception, match="differs from float64 execution of the original on [1-4] of 4 samples"):
        result.raise_for_errors()


def quant_matmul_model() -> Model:
    g = GraphBuilder()
    g.input("x", [1, WIDTH])
    g.quant("x", "q0out", "q0", SCALE, BITS, False)
    g.init("W", np.random.default_rng(8).uniform(-1, 1, (WIDTH, 8)).astype(np.float32))
    g.node("MatMul", ["q0out", "W"], ["out"], "mm0")
    g.output("out", [1, 8])
    return g.model()


@equality
class ExactThresholdsAndFreshWeights(QuantToThresholds):
    """Quant → exact thresholds, and the MatMul's weight replaced by an equal copy, in one pass (one region)."""

    def rewrite(self, model, node):
        mm = model.get_node_from_name("mm0")
        mm.replace_input_with(1, model.add_initializer(const(model, mm.inputs[1]).copy()))
        super().rewrite(model, node)


def test_a_near_tie_does_not_spread_inside_a_region() -> None:
    """The MatMul is checked on the cached value of the quantizer's output (teacher forcing), so the near-tie of
    the quantizer does not turn into a real difference of the MatMul's float output."""
    model = quant_matmul_model()
    hook = VerificationHook(reference(model))
    PassManager([Stage("convert", [ExactThresholdsAndFreshWeights])], [hook]).run(model)
    (rec,) = hook.records
    assert (rec.changed_nodes, rec.runs) == (3, 2)  # the second run is the teacher-forced one
    assert [(t.tensor, t.index) for t in hook.near_ties] == [("q0out", (0, 5))]
    result = final_check(reference(quant_matmul_model()), model)
    assert result.ok and result.near_tie_samples == [0], result.summary()


def rounded_thresholds(scale: np.float32, bits: int) -> np.ndarray:
    """Each threshold (m − ½)·s rounded to the nearest float32 (what a float-input layer has to store)."""
    s = Fraction(float(scale))
    return np.array([np.float32(float((m - Fraction(1, 2)) * s)) for m in range(1, 2**bits)], np.float32)[None, :]


def test_final_check_explains_a_near_tie_of_a_float_input_layer() -> None:
    """A quantizer of a float input keeps float32 thresholds: at an input equal to a threshold that was rounded
    down, the streamlined model (in float32 and in float64) says level m where real arithmetic says m − 1. The final
    check reports it as a near-tie of the model's own float layer, with its margin, not as an error."""
    t = rounded_thresholds(SCALE, BITS)
    s = Fraction(float(SCALE))
    m = next(k for k in range(1, 2**BITS) if Fraction(float(t[0, k - 1])) < (k - Fraction(1, 2)) * s)
    original = quant_model()
    x = np.random.default_rng(5).uniform(0, 1.5, size=(2, WIDTH)).astype(np.float32)
    x[1, 3] = t[0, m - 1]
    ref = ReferenceData(original, x)
    g = GraphBuilder()
    g.input("x", [1, WIDTH])
    g.multithreshold("x", "level", "mt0", t, "UINT4")
    g.init("s", SCALE)
    g.node("Mul", ["level", "s"], ["out"], "dequant")
    g.output("out", [1, WIDTH])
    result = final_check(ref, g.model())
    assert result.ok, result.summary()
    assert result.float_layer_tie_samples == [1] and result.outputs[0].error_samples == []
    (site,) = result.float_layer_sites
    assert (site.node, site.index) == ("mt0", (0, 3)) and site.margin64.relative < 1e-6
    assert "near-tie of the streamlined model's float layer" in result.summary()
