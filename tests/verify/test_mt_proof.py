"""Per-pass threshold proofs (verify.mt_proof): a threshold off by one in one channel, at an input the probe samples
never reach, passes the sampled comparison but not the proof; a correct absorption is proved; outside the proof's
conditions the sampled comparison decides alone."""

from __future__ import annotations

import logging

import numpy as np
import onnx_ir as ir
import pytest

from finnlite import PassManager, Rule, Stage
from finnlite.core.compat import QONNX_DOMAIN
from tests.verify.graphs import GraphBuilder, const, new_node, take_over
from verify import PassVerificationError, ReferenceData, VerificationHook
import verify.hook

C, N = 4, 7
#: channel 2's probe inputs stay below this: the last threshold (9 − b) is never reached there
CEILING = 3


def add_mt(bias: np.ndarray, datatype: str | None = "INT6"):
    """x (INT6, [1, 4, 8, 8]) → Add(per-channel bias) → MultiThreshold(thresholds −9, −6, ..., 9) → UINT3."""
    g = GraphBuilder()
    g.input("x", [1, C, 8, 8], datatype=datatype)
    g.init("b", bias.reshape(1, C, 1, 1))
    g.node("Add", ["x", "b"], ["s"], "add0")
    g.multithreshold("s", "out", "mt0", np.tile(np.arange(-9, 10, 3, dtype=np.float32), (C, 1)), "UINT3")
    g.output("out", [1, C, 8, 8])
    return g.model()


def probe(model, samples: int = 2) -> ReferenceData:
    """Integer inputs over the whole INT6 range, except channel 2: below :data:`CEILING`."""
    rng = np.random.default_rng(1)
    x = rng.integers(-32, 32, size=(samples, 1, C, 8, 8)).astype(np.float32)
    x[:, :, 2] = rng.integers(-32, CEILING, size=(samples, 1, 8, 8))
    return ReferenceData(model, {"x": x})


def absorb_into_thresholds(op_type: str, thresholds) -> type[Rule]:
    """MultiThreshold(op(x, ...), T) → MultiThreshold(x, thresholds(model, T, op)): a test rule absorbing the
    ``op_type`` node before a MultiThreshold into its thresholds."""

    class AbsorbForTest(Rule):
        name = f"Absorb{op_type}ForTest"
        op_types = ("MultiThreshold",)

        def match(self, model, node):
            prod = node.inputs[0].producer()
            return node if prod is not None and prod.op_type == op_type else None

        def rewrite(self, model, node):
            prod = node.inputs[0].producer()
            t = thresholds(model, const(model, node.inputs[1]), prod)
            node.replace_input_with(0, prod.inputs[0])
            node.replace_input_with(1, model.add_initializer(np.asarray(t, np.float32)))
            model.remove_node(prod)

    return AbsorbForTest


def absorb_add(fault: tuple[int, int, float] | None = None) -> type[Rule]:
    """MultiThreshold(Add(x, b), T) → MultiThreshold(x, T − b); ``fault = (channel, k, delta)`` adds ``delta`` to
    one new threshold (a wrong rewrite)."""

    def thresholds(model, t, add):
        t = t - const(model, add.inputs[1]).reshape(C, 1)
        if fault is not None:
            t[fault[0], fault[1]] += fault[2]
        return t

    return absorb_into_thresholds("Add", thresholds)


def run(model, rule, monkeypatch=None) -> VerificationHook:
    if monkeypatch is not None:  # the sampled comparison alone
        monkeypatch.setattr(verify.hook, "prove_changed_thresholds", lambda *a: None)
    hook = VerificationHook(probe(model))
    PassManager([Stage("s", [rule])], [hook]).run(model)
    return hook


INTEGER = np.array([1, -2, 3, 0], np.float32)  # every jump of the new thresholds is an exact tie of the old ones
DYADIC = np.array([0.5, -0.25, 1.5, 0.75], np.float32)  # x + b exact in float32: the map is exact too
DECIMAL = np.array([0.3, -0.7, 1.3, 0.1], np.float32)  # x + b rounded in float32: the float32 Add reproduced


@pytest.mark.parametrize("bias", [INTEGER, DYADIC, DECIMAL])
def test_threshold_off_by_one_passes_sampling_but_not_the_proof(bias, monkeypatch) -> None:
    faulty = absorb_add((2, N - 1, 1.0))
    run(add_mt(bias), faulty, monkeypatch)  # the probe samples never reach channel 2's last threshold
    monkeypatch.undo()
    with pytest.raises(PassVerificationError) as info:
        run(add_mt(bias), faulty)
    err = info.value
    assert err.pass_name == "AbsorbAddForTest" and err.node == "mt0" and err.tensor == "out"
    assert "channel 2:" in str(err) and "MultiThreshold 'mt0'" in str(err)
    assert "the thresholds change the level by 1, the MultiThreshold before the pass ('mt0') by 0" in str(err)


def test_a_correct_absorption_is_proved(caplog) -> None:
    with caplog.at_level(logging.DEBUG, logger="verify.mt_proof"):
        for bias in (INTEGER, DYADIC, DECIMAL):
            run(add_mt(bias), absorb_add())
    proved = [r.getMessage() for r in caplog.records if "proved on" in r.getMessage()]
    assert proved == [f"MultiThreshold 'mt0': 4 of 4 channels proved on [-32, 31] ({k} exactly)" for k in (4, 4, 4)]


def test_a_fault_in_the_sampled_region_is_still_caught_by_sampling() -> None:
    with pytest.raises(PassVerificationError, match="first diverging tensor 'out'"):
        run(add_mt(INTEGER, datatype=None), absorb_add((0, 3, 1.0)))


def test_outside_the_conditions_sampling_decides(caplog) -> None:
    """A float input (no integer datatype): nothing is proved, said at debug level; the fault out of the probe
    samples' reach passes, as with sampling alone."""
    with caplog.at_level(logging.DEBUG, logger="verify.mt_proof"):
        run(add_mt(INTEGER, datatype=None), absorb_add((2, N - 1, 1.0)))
    assert "'mt0': not proved (input 'x' is not an integer tensor" in caplog.text


def test_one_value_per_channel_is_not_fitted(caplog) -> None:
    """A channel whose input takes fewer than three values on the probe samples has no fitted map: not proved."""
    model = add_mt(DECIMAL)
    hook = VerificationHook(ReferenceData(model, {"x": np.ones((1, 1, C, 8, 8), np.float32)}))
    with caplog.at_level(logging.DEBUG, logger="verify.mt_proof"):
        PassManager([Stage("s", [absorb_add((2, N - 1, 1.0))])], [hook]).run(model)
    assert "'mt0': not proved (no channel of 's' is an affine function of 'x'" in caplog.text


def test_a_quantizer_replaced_by_thresholds_is_proved_against_the_quantizer(monkeypatch) -> None:
    """x (INT6) → Quant(scale 1, signed 3 bits) becomes MultiThreshold(x, −3.5 … 2.5) − 4, with one threshold
    one step off where the probe samples do not reach: the quantizer (its kernel, in float64) is the old level
    function."""
    g = GraphBuilder()
    g.input("x", [1, C, 8, 8], datatype="INT6")
    g.quant("x", "out", "q0", 1.0, 3, True)
    g.output("out", [1, C, 8, 8])

    def to_thresholds(fault: float) -> type[Rule]:
        class QuantToThresholds(Rule):
            op_types = ("Quant",)

            def match(self, model, node):
                return node

            def rewrite(self, model, node):
                t = np.tile(np.arange(-3.5, 3, 1.0, dtype=np.float32), (C, 1))
                t[2, -1] += fault
                attrs = [ir.AttrFloat32("out_bias", -4.0), ir.AttrString("out_dtype", "INT3")]
                out = new_node(model, "MultiThreshold", [node.inputs[0], model.add_initializer(t)], "mt0", node,
                               domain=QONNX_DOMAIN, attrs=attrs)
                take_over(model, node.outputs[0], out)
                model.remove_node(node)

        return QuantToThresholds

    run(g.model(), to_thresholds(0.0))
    run(g.model(), to_thresholds(1.0), monkeypatch)  # sampling alone misses it
    monkeypatch.undo()
    with pytest.raises(PassVerificationError, match="channel 2: from integer input 3 to 4 the thresholds change the "
                                                    r"level by 1, the Quant before the pass \('q0'\) by 0"):
        run(g.model(), to_thresholds(1.0))


def test_an_absorbed_relu_is_not_proved(caplog) -> None:
    """MultiThreshold(Relu(x), [−1, 1, 3]) → MultiThreshold(x, [−32, 1, 3]) is right on INT6; on probe samples that
    are all ≥ 0 the map from x to Relu(x) looks like the identity, which it is not below 0: a pass that absorbs a
    Relu is not proved (else this would be a false alarm), the sampled comparison decides."""
    g = GraphBuilder()
    g.input("x", [1, C, 8, 8], datatype="INT6")
    g.node("Relu", ["x"], ["r"], "relu0")
    g.multithreshold("r", "out", "mt0", np.tile(np.array([-1, 1, 3], np.float32), (C, 1)), "UINT2")
    g.output("out", [1, C, 8, 8])

    AbsorbReluForTest = absorb_into_thresholds("Relu", lambda model, t, relu: np.where(t <= 0, -32, t))

    model = g.model()
    x = np.random.default_rng(2).integers(0, 32, size=(2, 1, C, 8, 8)).astype(np.float32)
    with caplog.at_level(logging.DEBUG, logger="verify.mt_proof"):
        PassManager([Stage("s", [AbsorbReluForTest])], [VerificationHook(ReferenceData(model, {"x": x}))]).run(model)
    assert "'mt0': not proved ('r' before the pass is not 'x' (with its values) or an affine function of it)" \
        in caplog.text
