"""Self-healing per-pass verification (:mod:`verify.heal`, ``VerificationHook(heal=True)``) and the blame of a
difference older than the pass (:class:`verify.hook.InheritedDeviation`)."""

from __future__ import annotations

import numpy as np
import pytest

from custom_ops.executor import Executor
from finnlite import Model, PassManager, Rule, Stage, Transformation
from tests.verify.graphs import GraphBuilder
from verify import ReferenceData, VerificationHook
from verify.hook import InheritedDeviation
from verify.ties import NearTie


def relu_chain(n: int = 4) -> Model:
    """x → Relu r0 → Relu r1 → ... → y (every Relu named)."""
    g = GraphBuilder()
    x = g.input("x", [2, 8])
    for i in range(n):
        x = g.node("Relu", [x], [f"t{i}"], name=f"r{i}")
    g.output(x, [2, 8])
    return g.model()


class RenewRelus(Rule):
    """Relu → a new Relu node (exact) — except at ``r1``, which becomes Neg (wrong): one bad rewrite of four."""

    op_types = ("Relu",)

    def match(self, model, node):
        return node if not node.name.startswith("new_") else None

    def rewrite(self, model, node):
        from onnx_ir import Node

        op = "Neg" if node.name == "r1" else "Relu"
        new = Node("", op, [node.inputs[0]], name=f"new_{node.name}", num_outputs=1)
        model.graph.insert_after(node, new)
        model.replace_uses(node.outputs[0], new.outputs[0])
        model.remove_node(node)


class ScaleInput(Transformation):
    """Mul the graph input by 2 (wrong; not a Rule: undone as a whole)."""

    def apply(self, model):
        if any(n.op_type == "Mul" for n in model.graph):
            return False
        from onnx_ir import Node

        x = model.graph.inputs[0]
        two = model.add_initializer(np.array(2.0, np.float32))
        mul = Node("", "Mul", [x, two], name="scale", num_outputs=1)
        first = next(iter(model.graph))
        for use in list(x.uses()):
            use.node.replace_input_with(use.idx, mul.outputs[0])
        model.graph.insert_before(first, mul)
        return True


def _outputs(model: Model, x: np.ndarray) -> np.ndarray:
    return next(iter(Executor(model.to_proto()).run({"x": x}).values()))


@pytest.mark.declines
@pytest.mark.parametrize("check_whole", [False, True])
def test_the_bad_rewrite_is_declined_and_the_others_stay(check_whole: bool) -> None:
    model, original = relu_chain(), relu_chain()
    reference = ReferenceData.random(original, n=4, seed=1)
    hook = VerificationHook(reference, heal=True)
    manager = PassManager([Stage("s", [RenewRelus], fixpoint=True, check_whole=check_whole)], [hook])
    manager.run(model)
    assert [(d.pass_name, d.anchor) for d in hook.declined] == [("RenewRelus", "r1")]
    assert hook.declined[0].tensor and "differ" in hook.declined[0].message
    assert ("RenewRelus", "r1") in manager.declined
    assert sorted(n.name for n in model.graph) == ["new_r0", "new_r2", "new_r3", "r1"]
    x = np.random.default_rng(0).normal(size=(2, 8)).astype(np.float32)
    np.testing.assert_array_equal(_outputs(model, x), _outputs(original, x))
    if not check_whole:  # the next round of the fixpoint matched r1 again: a miss, not a rewrite
        assert any("declined by verification" in m.reason for m in manager.report.misses)


@pytest.mark.declines
def test_a_pass_that_is_not_a_rule_is_undone_and_not_run_again() -> None:
    model, original = relu_chain(2), relu_chain(2)
    hook = VerificationHook(ReferenceData.random(original, n=4, seed=1), heal=True)
    manager = PassManager([Stage("s", [ScaleInput, RenewRelus], fixpoint=True)], [hook])
    manager.run(model)
    assert [(d.pass_name, d.anchor) for d in hook.declined] == [("ScaleInput", "*"), ("RenewRelus", "r1")]
    assert not any(n.op_type == "Mul" for n in model.graph)
    assert sum(r.name == "ScaleInput" for r in manager.report.records) == 1  # declined: not run in later rounds


def test_without_healing_the_failure_is_raised() -> None:
    from verify import PassVerificationError

    hook = VerificationHook(ReferenceData.random(relu_chain(), n=4, seed=1))
    with pytest.raises(PassVerificationError, match="pass 'RenewRelus'"):
        PassManager([Stage("s", [RenewRelus])], [hook]).run(relu_chain())


class ReluToMax(Rule):
    """Relu(x) → Max(x, 0) (exact), at the Relu named ``at``: the node making that Relu's tensor changes."""

    op_types = ("Relu",)
    at = ""

    def match(self, model, node):
        return node if node.name == self.at else None

    def rewrite(self, model, node):
        from onnx_ir import Node

        zero = model.add_initializer(np.zeros((), np.float32))
        new = Node("", "Max", [node.inputs[0], zero], name=f"{node.name}_max", num_outputs=1)
        model.graph.insert_after(node, new)
        name = node.outputs[0].name
        model.replace_uses(node.outputs[0], new.outputs[0])
        model.remove_node(node)
        new.outputs[0].name = name  # the same tensor, made by a new node


def max_at(name: str) -> ReluToMax:
    rule = ReluToMax()
    rule.at = name
    return rule


def _poked(hook: VerificationHook, tensor: str, accepted: bool) -> NearTie:
    """Make the verifier's cache disagree with what the current version computes at one element of ``tensor`` (as
    an earlier acceptance of a near-tie does: the cache keeps the original's value), and record that acceptance as
    an earlier check's (``accepted``: remembered by the verifier too, as :meth:`Verifier.accept` does)."""
    v = hook.verifier
    values = v.values[0]
    arr = np.array(values[tensor], copy=True)
    actual = float(arr.reshape(-1)[3])
    arr.reshape(-1)[3] = actual + 1.0
    values[tensor] = arr
    expected = float(arr.reshape(-1)[3])
    tie = NearTie(tensor, 0, tuple(int(i) for i in np.unravel_index(3, arr.shape)), expected, actual, "r3", None,
                  "margin")
    hook.records[-1].near_ties.append(tie)
    if accepted:
        v.accepted.setdefault((tensor, 0), []).append(tie)
    return tie


@pytest.mark.parametrize("accepted", [False, True])
def test_a_difference_older_than_the_pass_is_not_blamed_on_it(accepted: bool) -> None:
    """The cache says one thing at an element of the output ``t3``, the version before the pass computes another (an earlier
    check accepted it): a pass that merely re-creates the node is not at fault. If the verifier remembers the
    acceptance (as it does), the check accepts the element again, saying where it comes from; if not, the error names
    the earlier pass."""
    model = relu_chain()
    hook = VerificationHook(ReferenceData.random(relu_chain(), n=1, seed=1), samples=1)
    PassManager([Stage("first", [max_at("r0")])], [hook]).run(model)  # verified: the cache of t3 is taken
    hook.records[-1].pass_name = "EarlierPass"
    _poked(hook, "t3", accepted)
    second = PassManager([Stage("second", [max_at("r3")])], [hook])  # re-makes t3 (the output), exactly
    if accepted:
        second.run(model)
        ties = hook.records[-1].near_ties
        assert len(ties) == 1 and ties[0].evidence.startswith("inherited") and ties[0].tensor == "t3"
        return
    with pytest.raises(InheritedDeviation) as info:
        second.run(model)
    err = info.value
    assert err.checked_pass == "ReluToMax" and err.pass_name == "EarlierPass" and err.tensor == "t3"
    assert "is not at fault" in str(err) and "pass 'EarlierPass'" in str(err) and len(err.ties) == 1
