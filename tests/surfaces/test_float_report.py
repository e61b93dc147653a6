"""The integer-only report: float nodes left after streamlining, with the closest rule and its failed condition."""

from __future__ import annotations

import numpy as np

from finnlite import PassManager, Rule, Stage
from tests.verify.graphs import GraphBuilder, const
from verify import ReferenceData, VerificationHook
from finnlite.float_report import float_report


def _network(unsupported: bool):
    """x → MT(UINT4) → MatMul(int W) → Mul(s1) → [Sin] → MT(UINT4) → MatMul(int W) → Mul(s2) → Add(b) → y."""
    rng = np.random.default_rng(0)
    g = GraphBuilder()
    g.input("x", [1, 8])
    g.multithreshold("x", "a0", "mt0", np.linspace(-1, 1, 15, dtype=np.float32)[None, :], "UINT4")
    g.init("W0", rng.integers(-3, 4, (8, 8)).astype(np.float32)), g.init("s1", np.float32(0.05))
    g.node("MatMul", ["a0", "W0"], ["acc0"], "mm0", datatype="INT32")
    g.node("Mul", ["acc0", "s1"], ["f0"], "mul0")
    src = g.node("Sin", ["f0"], ["sin"], "sin0") if unsupported else "f0"
    g.multithreshold(src, "a1", "mt1", np.linspace(-1, 1, 15, dtype=np.float32)[None, :], "UINT4")
    g.init("W1", rng.integers(-3, 4, (8, 4)).astype(np.float32)), g.init("s2", np.float32(0.1))
    g.init("b", np.float32(0.5))
    g.node("MatMul", ["a1", "W1"], ["acc1"], "mm1", datatype="INT32")
    g.node("Mul", ["acc1", "s2"], ["y0"], "mul_out")
    g.node("Add", ["y0", "b"], ["out"], "add_out")
    g.output("out", [1, 4])
    return g.model()


class AbsorbMulIntoMultiThreshold(Rule):
    """MultiThreshold(Mul(x, a), T) → MultiThreshold(x, T / a) for a scalar a > 0 (test version)."""

    op_types = ("Mul",)

    def match(self, model, node):
        consumer = model.find_consumer(node.outputs[0].name)
        if consumer is None or consumer.op_type != "MultiThreshold":
            what = "a graph output" if consumer is None else f"{consumer.op_type} '{consumer.name}'"
            return self.miss(node, f"the Mul feeds {what}, not a MultiThreshold")
        return node

    def rewrite(self, model, node):
        mt = model.find_consumer(node.outputs[0].name)
        t = (const(model, mt.inputs[1]) / const(model, node.inputs[1])).astype(np.float32)
        mt.replace_input_with(0, node.inputs[0])
        mt.replace_input_with(1, model.add_initializer(t))
        model.remove_node(node)


class MoveMulPastMonotonic(Rule):
    """f(Mul(x, a)) → Mul(f(x), a) for f commuting with positive scaling (test version: Relu only)."""

    op_types = ("Mul",)

    def match(self, model, node):
        consumer = model.find_consumer(node.outputs[0].name)
        if consumer is not None and consumer.op_type != "Relu":
            return self.miss(node, f"{consumer.op_type} does not commute with a scaling")
        return None

    def rewrite(self, model, node):
        raise AssertionError("never matches in this test")


def _streamline(model):
    ref = ReferenceData.random(model, n=2)
    stage = Stage("streamline", [MoveMulPastMonotonic, AbsorbMulIntoMultiThreshold], fixpoint=True)
    return PassManager([stage], [VerificationHook(ref)]).run(model)


def test_fully_integer_model_has_no_float_node() -> None:
    model = _network(unsupported=False)
    report = float_report(model, _streamline(model))
    assert report.integer_only and report.nodes == []
    assert report.dequantization == ["Mul 'mul_out'", "Add 'add_out'"]
    assert report.text().startswith("integer-only: no float node is left")


def test_unsupported_node_in_the_middle() -> None:
    model = _network(unsupported=True)
    run = _streamline(model)
    report = float_report(model, run)
    assert not report.integer_only
    assert report.names() == ["mul0", "sin0"]
    mul, sin = report.nodes
    assert mul.closest.rule == "AbsorbMulIntoMultiThreshold"
    assert mul.closest.reason == "the Mul feeds Sin 'sin0', not a MultiThreshold"
    assert [m.rule for m in mul.misses] == ["MoveMulPastMonotonic", "AbsorbMulIntoMultiThreshold"]
    assert mul.float_outputs == ["f0"] and mul.float_inputs == []
    assert sin.closest is None and sin.float_inputs == ["f0"]
    data = report.to_dict()
    assert data["integer_only"] is False and data["float_nodes"][0]["closest"]["rule"] == "AbsorbMulIntoMultiThreshold"
    text = report.text()
    assert "2 float node(s) left" in text
    assert "Mul 'mul0': output 'f0' has no integer datatype; closest rule AbsorbMulIntoMultiThreshold: the Mul " \
           "feeds Sin 'sin0', not a MultiThreshold; also MoveMulPastMonotonic: Sin does not commute" in text
    assert "Sin 'sin0': output 'sin' has no integer datatype (float input 'f0'); no rule tried it" in text


def test_progress_attribute_decides_the_closest_rule() -> None:
    from finnlite.core.passes import Miss

    model = _network(unsupported=True)
    far, near = Miss("Far", "mul0", "op type"), Miss("Near", "mul0", "third condition")
    far.progress, near.progress = 0, 2
    (mul, _) = float_report(model, [near, far]).nodes
    assert mul.closest.rule == "Near"


def _float_input_net(scale_before_threshold: bool):
    """x (float) → Transpose → MatMul(int W) → [Mul] → MultiThreshold → MatMul(int W) → out."""
    rng = np.random.default_rng(1)
    g = GraphBuilder()
    g.input("x", [8, 1])
    g.node("Transpose", ["x"], ["xt"], "tr", perm=[1, 0])
    g.init("W0", rng.integers(-3, 4, (8, 8)).astype(np.float32))
    g.init("W1", rng.integers(-3, 4, (8, 4)).astype(np.float32))
    src = g.node("MatMul", ["xt", "W0"], ["acc"], "first_mm")
    if scale_before_threshold:
        g.init("s", np.float32(0.5))
        src = g.node("Mul", [src, "s"], ["scaled"], "first_scale")
    g.multithreshold(src, "a", "mt0", np.linspace(-1, 1, 3, dtype=np.float32)[None, :], "UINT2")
    g.node("MatMul", ["a", "W1"], ["out"], "mm1", datatype="INT32")
    g.output("out", [1, 4])
    return g.model()


def test_the_input_layer_on_a_float_input_is_allowed() -> None:
    report = float_report(_float_input_net(False))
    assert report.integer_only and report.input_layer == ["MatMul 'first_mm'"]
    assert "input layer on the float input (allowed): MatMul 'first_mm'" in report.text()
    report = float_report(_float_input_net(True))  # a Mul there belongs in the thresholds
    assert report.names() == ["first_scale"]
