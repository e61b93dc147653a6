"""Bisection: the first failing pass of a pipeline and, inside it, the first failing rewrite."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from finnlite import Rule, Stage, Transformation
from tests.verify.graphs import GraphBuilder, const
from tests.verify.test_hook import CommuteAdd, NoChange, RenameNodes
from verify import ReferenceData, bisect_pipeline
from finnlite.cli import main


def _adds(n: int = 6):
    g = GraphBuilder()
    g.input("x", [1, 8])
    prev = "x"
    for i in range(n):
        g.init(f"c{i}", np.float32(0.5 + i))
        prev = g.node("Add", [prev, f"c{i}"], [f"t{i}"], f"add{i}")
    g.node("Relu", [prev], ["out"], "relu")
    g.output("out", [1, 8])
    return g.model()


class RefreshConstants(Rule):
    """Replace each Add's constant by a fresh copy; the third copy is off by one (wrong)."""

    op_types = ("Add",)

    def __init__(self, max_rewrites=None):
        super().__init__(max_rewrites)
        self.done = 0  # rewrites of the run in progress

    def run(self, model, declined=frozenset(), max_rewrites=None, keep_matches=False):
        self.done = 0
        return super().run(model, declined, max_rewrites, keep_matches)

    def match(self, model, node):
        return node if node.inputs[1].name.startswith("c") and not node.inputs[1].name.startswith("c_") else None

    def rewrite(self, model, node):
        c = const(model, node.inputs[1]).copy()
        if self.done == 2:  # the third rewrite
            c = c + 1
        self.done += 1
        node.replace_input_with(1, model.add_initializer(c, prefix="c_"))


class BreakEverything(Transformation):
    """Negate every Add constant (wrong; not a Rule, so only the pass can be named)."""

    def apply(self, model):
        for node in list(model.graph):
            if node.op_type == "Add":
                node.replace_input_with(1, model.add_initializer(-const(model, node.inputs[1])))
        return True


def _stages(bad):
    return [Stage("tidy", [RenameNodes, NoChange]), Stage("streamline", [bad], fixpoint=True)]


def test_bisect_names_the_pass_and_the_rewrite() -> None:
    model = _adds()
    result = bisect_pipeline(model, _stages(RefreshConstants), ReferenceData.random(model, n=4), samples=2)
    assert not result.ok
    assert (result.stage, result.pass_name, result.iteration) == ("streamline", "RefreshConstants", 1)
    assert (result.rewrite, result.rewrites) == (3, 6)
    assert result.match == "Add 'renamed_Add_2'" and result.node == "renamed_Add_2"
    assert "first failing rewrite: #3 of 6, matched at Add 'renamed_Add_2'" in result.text()
    assert len(model) == 7 and model.get_node_from_name("add0") is not None  # the caller's model is untouched


def test_bisect_of_a_plain_transformation_names_the_pass() -> None:
    model = _adds(3)
    result = bisect_pipeline(model, _stages(BreakEverything), samples=2)
    assert result.pass_name == "BreakEverything" and result.rewrite is None
    assert "BreakEverything" in result.text() and result.error is not None


def test_bisect_of_a_clean_pipeline() -> None:
    model = _adds(3)
    result = bisect_pipeline(model, [Stage("tidy", [RenameNodes, CommuteAdd])], samples=2)
    assert result.ok and "every pass preserves equivalence" in result.text()


def test_command_line_reports_bad_input(tmp_path: Path, capsys) -> None:
    assert main(["bisect", str(tmp_path / "missing.onnx"), "-q"]) == 2
    assert "error:" in capsys.readouterr().err


def test_bisect_of_a_stage_checked_as_a_whole_reapplies_the_pass_it_names(caplog) -> None:
    # the stage fails at its end, after its last pass (a correct Rule); the replay names RefreshConstants, and
    # bisection must re-apply RefreshConstants (not the last pass) to find the rewrite
    model = _adds()
    stages = [Stage("tidy", [RenameNodes]), Stage("lower", [RefreshConstants, CommuteAdd], check_whole=True)]
    result = bisect_pipeline(model, stages, ReferenceData.random(model, n=4), samples=2)
    assert (result.stage, result.pass_name) == ("lower", "RefreshConstants")
    assert (result.rewrite, result.rewrites) == (3, 6)
    assert result.match == "Add 'renamed_Add_2'"
    assert "did not reproduce" not in caplog.text


def test_a_match_record_is_described_by_its_nodes() -> None:
    from streamline.absorb import LinearIntoThresholds
    from verify.heal import describe_match
    import onnx_ir as ir

    mt, add = ir.Node("qonnx.custom_op.general", "MultiThreshold", [], name="mt"), ir.Node("", "Add", [], name="a")
    assert describe_match(LinearIntoThresholds(mt, add, 1, np.array([1.0]), 1)) == "MultiThreshold 'mt', Add 'a'"
