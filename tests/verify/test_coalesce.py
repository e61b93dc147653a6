"""Coalescing: while the background checks run behind, the next pass runs of a stage under one policy are held and
checked together; a failure still names its pass (the held runs are replayed one by one), and a crash of a later
pass still reports a broken held one first."""

from __future__ import annotations

import logging

import pytest

import verify.hook
from finnlite import PassManager, Stage, Transformation
from tests.verify.graphs import add_relu
from tests.verify.test_hook import CommuteAdd, Crash, NoChange, RenameNodes
from tests.verify.test_wrong_rewrites import AddSelf
from verify import PassVerificationError, ReferenceData, VerificationHook, equality

MODES = ["process", "thread"]


@equality
class RenameExactly(RenameNodes):
    """RenameNodes, declared bit-exact (the policy of CommuteAdd, so that the two may be held together)."""


@equality
class AddSelfExactly(AddSelf):
    """AddSelf (wrong), declared bit-exact."""


@equality
class NoChangeExactly(NoChange):
    """Changes nothing, declared bit-exact."""


@equality
class CommuteQuietly(Transformation):
    """Swaps the inputs of every Add but reports that nothing changed."""

    def apply(self, model):
        for node in model.graph:
            if node.op_type == "Add":
                x, y = node.inputs[0], node.inputs[1]
                node.replace_input_with(0, y)
                node.replace_input_with(1, x)
        return False


@equality
class Unpicklable(RenameNodes):
    """RenameNodes holding a lambda: it cannot travel to the worker process, which replays held runs."""

    def __init__(self) -> None:
        self.hook = lambda: None


@pytest.fixture
def behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks always look behind, and held runs have no time limit: every run that may be held is, until
    something releases it."""
    monkeypatch.setattr(VerificationHook, "_behind", lambda self: True)
    monkeypatch.setattr(verify.hook, "HOLD_SECONDS", 60.0)


def _run(passes: list, background: str, **options) -> VerificationHook:
    model = add_relu()
    hook = VerificationHook(ReferenceData.random(model, n=2), background=background, **options)
    PassManager([Stage("s", passes)], [hook]).run(model)
    return hook


@pytest.mark.parametrize("background", MODES)
def test_held_runs_are_checked_together(behind: None, background: str) -> None:
    hook = _run([CommuteAdd, NoChangeExactly, RenameExactly, NoChangeExactly], background)
    (record,) = hook.records
    assert record.label == "passes 'CommuteAdd', 'RenameExactly'" and record.stage == "s"
    assert record.changed_nodes >= 1


@pytest.mark.parametrize("background", MODES)
def test_without_coalescing_each_pass_is_checked_alone(behind: None, background: str) -> None:
    hook = _run([CommuteAdd, NoChangeExactly, RenameExactly], background, coalesce=False)
    assert [r.label for r in hook.records] == ["pass 'CommuteAdd'", "pass 'RenameExactly'"]


def test_checks_in_this_thread_hold_nothing(behind: None) -> None:
    hook = _run([CommuteAdd, RenameExactly], False)
    assert [r.label for r in hook.records] == ["pass 'CommuteAdd'", "pass 'RenameExactly'"]


@pytest.mark.parametrize("background", MODES)
def test_a_failing_held_run_is_named(behind: None, background: str) -> None:
    with pytest.raises(PassVerificationError, match=r"pass 'AddSelfExactly' .*broke equivalence") as info:
        _run([CommuteAdd, AddSelfExactly, RenameExactly], background)
    assert info.value.pass_name == "AddSelfExactly" and info.value.node == "add0" and info.value.stage == "s"


@pytest.mark.parametrize("background", MODES)
def test_held_runs_that_took_long_enough_are_released(behind: None, background: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verify.hook, "HOLD_SECONDS", 0.0)  # any run takes that long: each is checked alone
    hook = _run([CommuteAdd, NoChangeExactly, RenameExactly], background)
    assert [r.label for r in hook.records] == ["pass 'CommuteAdd'", "pass 'RenameExactly'"]


@pytest.mark.parametrize("background", MODES)
def test_another_policy_releases_the_held_runs(behind: None, background: str) -> None:
    hook = _run([CommuteAdd, RenameNodes, CommuteAdd], background)
    assert [r.label for r in hook.records] == ["pass 'CommuteAdd'", "pass 'RenameNodes'", "pass 'CommuteAdd'"]


@pytest.mark.parametrize("background", MODES)
def test_held_runs_end_with_their_stage(behind: None, background: str) -> None:
    model = add_relu()
    hook = VerificationHook(ReferenceData.random(model, n=2), background=background)
    PassManager([Stage("a", [CommuteAdd]), Stage("b", [RenameExactly])], [hook]).run(model)
    assert [(r.label, r.stage) for r in hook.records] == [("pass 'CommuteAdd'", "a"), ("pass 'RenameExactly'", "b")]


def test_a_pass_that_cannot_travel_is_checked_alone(behind: None) -> None:
    hook = _run([CommuteAdd, Unpicklable, RenameExactly], "process")
    assert [r.label for r in hook.records] == ["pass 'CommuteAdd'", "pass 'Unpicklable'", "pass 'RenameExactly'"]


@pytest.mark.parametrize("background", MODES)
def test_a_crash_after_held_runs_reports_a_broken_one_first(behind: None, background: str) -> None:
    with pytest.raises(PassVerificationError, match=r"pass 'AddSelfExactly'") as info:
        _run([CommuteAdd, AddSelfExactly, Crash], background)
    assert isinstance(info.value.__cause__, RuntimeError)  # the crash is kept as the cause
    with pytest.raises(RuntimeError, match="cannot handle"):  # held runs that were right: the crash itself
        _run([CommuteAdd, RenameExactly, Crash], background)


@pytest.mark.parametrize("background", MODES)
def test_a_held_pass_that_hides_its_change_is_still_checked(behind: None, background: str,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="verify.hook"):
        hook = _run([CommuteQuietly, NoChangeExactly], background)
    assert [r.label for r in hook.records] == ["passes 'CommuteQuietly', 'NoChangeExactly'"]
    assert "reported no change but changed the graph" in caplog.text


@pytest.mark.parametrize("background", MODES)
def test_runs_held_when_a_driver_ends_without_its_stage_end_are_checked(behind: None, background: str) -> None:
    from finnlite.passes import PassRecord

    model = add_relu()
    hook = VerificationHook(ReferenceData.random(model, n=2), background=background)
    stage = Stage("s", [CommuteAdd, RenameExactly])
    for p in (CommuteAdd(), RenameExactly()):  # a driver calling the pass hooks itself, without after_stage
        hook.before_pass(p, model, stage)
        changed = p.apply(model)
        hook.after_pass(p, model, stage, PassRecord("s", p.name, 0, 0.0, changed, len(model), len(model)))
    hook.after_run(model)
    assert [r.label for r in hook.records] == ["passes 'CommuteAdd', 'RenameExactly'"]
    held = VerificationHook(ReferenceData.random(add_relu(), n=2), background=background)
    other = add_relu()
    for p in (CommuteAdd(), RenameExactly()):
        held.before_pass(p, other, stage)
        held.after_pass(p, other, stage, PassRecord("s", p.name, 0, 0.0, p.apply(other), len(other), len(other)))
    held.close()  # neither the stage's end nor the run's: replayed, each pass on its own
    assert [r.label for r in held.records] == ["pass 'CommuteAdd'", "pass 'RenameExactly'"]
