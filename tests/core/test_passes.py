"""Pass base classes, registry and the pass manager's fixpoint handling."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from finnlite import FixpointError, Model, PassError, PassManager, Rule, Stage, Transformation, register_pass
from finnlite.core.passes import fingerprint, get_pass, list_passes, run_pass
from tests.core.fixtures import add_chain, chain_model


class FoldAddChain(Rule):
    """Add(Add(x, a), b) → Add(x, a + b) for constant a, b (test rule)."""

    op_types = ("Add",)

    def match(self, model, node):
        prod = node.inputs[0].producer()
        if prod is None or prod.op_type != "Add":
            return self.miss(node, "producer is not an Add")
        if node.inputs[1].const_value is None or prod.inputs[1].const_value is None:
            return self.miss(node, "non-constant operand")
        if len(prod.outputs[0].uses()) != 1:
            return self.miss(node, "producer output is forked")
        return (prod, node)

    def rewrite(self, model, match):
        prod, node = match
        total = prod.inputs[1].const_value.numpy() + node.inputs[1].const_value.numpy()
        c = model.add_initializer(total.astype(np.float32))
        node.replace_input_with(0, prod.inputs[0])
        node.replace_input_with(1, c)
        model.remove_node(prod)


def test_rule_and_manager_reach_fixpoint():
    m = Model(add_chain(5))
    assert len(m) == 5
    report = PassManager([Stage("collapse", [FoldAddChain], fixpoint=True)]).run(m)
    assert len(m) == 1 and m.output_names == ["y"]
    np.testing.assert_allclose(m.get_initializer(m.graph.node(0).inputs[1].name), np.full(8, 5.0))
    assert any(r.changed for r in report.records) and not report.records[-1].changed
    assert report.stage_seconds["collapse"] >= 0


def test_max_rewrites_limits_a_rule():
    m = Model(add_chain(5))
    rule = FoldAddChain(max_rewrites=1)
    result = rule.run(m)
    assert result.changed and result.rewrites == 1 and len(m) == 4


class Flip(Transformation):
    """Swap Add and Mul op types back and forth (oscillates)."""

    def apply(self, model):
        for node in model.graph:
            node.op_type = {"Add": "Mul", "Mul": "Add"}.get(node.op_type, node.op_type)
        return True


class Grow(Transformation):
    """Append a Relu at the output every time (never converges)."""

    def apply(self, model):
        out = model.graph.outputs[0]
        node = ir.Node("", "Relu", [out], outputs=[model.make_value("r")])
        model.graph.append(node)
        model.graph.outputs[0] = node.outputs[0]
        return True


def test_oscillation_is_detected_and_named():
    m = Model(chain_model(2))
    with pytest.raises(FixpointError, match="oscillates.*Flip"):
        PassManager([Stage("s", [Flip], fixpoint=True)]).run(m)


def test_iteration_cap_names_passes():
    m = Model(chain_model(2))
    with pytest.raises(FixpointError, match="did not converge in 5 rounds.*Grow"):
        PassManager([Stage("s", [Grow], fixpoint=True, max_iterations=5)]).run(m)


def test_registry_and_run_pass():
    @register_pass(group="test")
    class NoOp(Transformation):
        """Does nothing."""

        def apply(self, model):
            return False

    assert get_pass("NoOp") is NoOp and NoOp in list_passes("test") and NoOp.summary() == "Does nothing."
    with pytest.raises(PassError, match="registered twice"):
        @register_pass(group="test")
        class OtherNoOp(Transformation):  # a different class under the same name
            name = "NoOp"
            def apply(self, model):
                return False
    with pytest.raises(PassError, match="no pass named"):
        get_pass("DoesNotExist")
    m = Model(chain_model(2))
    fp = fingerprint(m)
    assert not run_pass(m, "NoOp") and fingerprint(m) == fp
    assert m.transform(lambda model: False) is m


def test_qonnx_transformation_runs_on_our_model():
    from qonnx.transformation.general import GiveUniqueNodeNames

    m = Model(chain_model(2))
    m.transform(GiveUniqueNodeNames())
    assert [n.name for n in m.graph] == ["Add_0", "Mul_0"]


def test_misses_are_recorded():
    m = Model(chain_model(2))
    report = PassManager([Stage("s", [FoldAddChain])]).run(m)
    assert [(x.rule, x.reason) for x in report.misses] == [("FoldAddChain", "producer is not an Add")]


def test_transform_applies_a_pass_until_it_changes_nothing():
    m = Model(add_chain(5))
    assert m.transform(FoldAddChain(max_rewrites=1)) is m and len(m) == 1  # one rewrite per run, four runs
    with pytest.raises(FixpointError, match="Grow still changed the model after 3 runs"):
        Model(chain_model(2)).transform(Grow(), max_iterations=3)


class Crash(Transformation):
    """Fails on any graph."""

    def apply(self, model):
        raise RuntimeError("cannot handle the graph")


class Calls:
    """A hook recording what the manager calls, in order."""

    def __init__(self):
        self.calls = []

    def before_stage(self, stage, model):
        self.calls.append(("before_stage", stage.name))

    def before_pass(self, p, model, stage):
        self.calls.append(("before_pass", p.name))

    def after_pass(self, p, model, stage, record):
        self.calls.append(("after_pass", record.name))

    def after_stage(self, stage, model):
        self.calls.append(("after_stage", stage.name))

    def after_run(self, model, report):
        self.calls.append(("after_run", len(report.records)))

    def on_error(self, exc):
        self.calls.append(("on_error", type(exc).__name__))


def test_hooks_are_called_in_order_and_a_failed_run_keeps_its_partial_report():
    hook = Calls()
    manager = PassManager([Stage("a", [FoldAddChain])], [hook])
    manager.run(Model(add_chain(2)))
    assert hook.calls == [("before_stage", "a"), ("before_pass", "FoldAddChain"), ("after_pass", "FoldAddChain"),
                          ("after_stage", "a"), ("after_run", 1)]
    hook = Calls()
    manager = PassManager([Stage("a", [FoldAddChain]), Stage("b", [Crash])], [hook])
    with pytest.raises(RuntimeError, match="cannot handle"):
        manager.run(Model(add_chain(3)))
    assert [(r.stage, r.name, r.changed) for r in manager.report.records] == [("a", "FoldAddChain", True)]
    assert isinstance(manager.current[0], Crash) and manager.current[1].name == "b"
    assert hook.calls[-2:] == [("before_pass", "Crash"), ("on_error", "RuntimeError")]


def test_an_alias_resolves_and_cannot_shadow_a_pass_name():
    from finnlite.core.passes import list_aliases

    @register_pass(group="test")
    class AliasedNoOp(Transformation):
        """Does nothing."""

        aliases = ("FinnNameOfAliasedNoOp",)

        def apply(self, model):
            return False

    assert get_pass("FinnNameOfAliasedNoOp") is AliasedNoOp
    assert list_aliases()["FinnNameOfAliasedNoOp"] == "AliasedNoOp"
    with pytest.raises(PassError, match="already an alias of AliasedNoOp"):
        @register_pass(group="test")
        class FinnNameOfAliasedNoOp(Transformation):  # a pass named like an alias
            def apply(self, model):
                return False
    with pytest.raises(PassError, match="alias 'AliasedNoOp' of .* is already a pass"):
        @register_pass(group="test")
        class ShadowingNoOp(Transformation):  # an alias named like a pass
            aliases = ("AliasedNoOp",)

            def apply(self, model):
                return False
    with pytest.raises(PassError, match="no pass named"):
        get_pass("ShadowingNoOp")  # a refused registration leaves nothing behind

    @register_pass(group="test")
    class DerivedNoOp(AliasedNoOp):  # aliases are not inherited
        pass

    assert get_pass("FinnNameOfAliasedNoOp") is AliasedNoOp and get_pass("DerivedNoOp") is DerivedNoOp


class _CountsRuns(Transformation):
    """Implements ``run`` (test pass): renames nothing, reports one rewrite per call."""

    calls: list[str] = []

    def run(self, model, declined=frozenset()):
        type(self).calls.append("run")
        from finnlite.core.passes import PassResult
        return PassResult(False, 1)


class _OverridesApply(_CountsRuns):
    """Overrides ``apply`` of a pass that implements ``run``, as a user extends a FINN transformation."""

    def apply(self, model):
        type(self).calls.append("apply")
        return super().apply(model)


def test_a_subclass_overriding_apply_runs_its_apply():
    _CountsRuns.calls = []
    PassManager([Stage("s", [_OverridesApply])]).run(Model(add_chain(2)))
    assert _CountsRuns.calls == ["apply", "run"]
    _CountsRuns.calls = []
    PassManager([Stage("s", [_CountsRuns])]).run(Model(add_chain(2)))
    assert _CountsRuns.calls == ["run"]
