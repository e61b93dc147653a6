"""The verifier's cache keeps the windows of an Im2Col as recomputations (verify.cache), fused or not, and per-pass
verification still sees every change to them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest

from custom_ops.executor import Executor
from finnlite import PassManager, Rule, Stage
from streamline.lower import LOWER_PASSES
from streamline.lower_conv import LowerConvsToMatMul
from tests.streamline.test_lower_common import GraphBuilder, int_weights, sorted_thresholds
from verify import PassVerificationError, ReferenceData, VerificationHook
from verify.cache import Recompute, SampleValues

RNG = np.random.default_rng(11)


def _mt_conv(depthwise: bool = False):
    """x → MultiThreshold (small integers) → 3x3 Conv with integer weights, padding 1: after lowering, an Im2Col
    whose MatMul the executor runs fused with it."""
    g = GraphBuilder()
    c = 4
    a = g.mt("x", sorted_thresholds(RNG, c, 3, -2, 2), "UINT2")
    w = int_weights(RNG, (c, 1, 3, 3) if depthwise else (c, c, 3, 3))
    y = g.node("Conv", [a, g.const(w)], pads=[1, 1, 1, 1], group=c if depthwise else 1)
    return g.build({"x": (1, c, 6, 6)}, [y])


def test_sample_values_make_recomputed_entries_when_read():
    class Double:
        def execute(self, inputs):
            return [inputs[0] * 2]

    x = np.arange(4, dtype=np.float32)
    values = SampleValues(x=x)
    dict.__setitem__(values, "y", Recompute(Double(), [x], (4,), np.float32))
    np.testing.assert_array_equal(values["y"], x * 2)
    np.testing.assert_array_equal(values.get("y"), x * 2)
    assert values.get("z") is None and "y" in values and set(values) == {"x", "y"}
    assert values.meta("y") == ((4,), np.dtype(np.float32)) and values.meta("x") == ((4,), np.dtype(np.float32))
    assert isinstance(dict.__getitem__(values, "y"), Recompute)  # reading does not store the array


@pytest.mark.parametrize("depthwise", [False, True])
def test_lowering_caches_the_window_as_a_recomputation_equal_to_it(depthwise):
    model = _mt_conv(depthwise)
    ref = ReferenceData.random(model, n=2, seed=3, low=-3, high=3)
    hook = VerificationHook(ref)
    # the lower stage as the pipeline checks it: as a whole (ConvertToNHWC changes the MultiThreshold too, so the
    # region proves the window's integer range and runs it fused)
    PassManager([Stage("lower", LOWER_PASSES, check_whole=True)], [hook]).run(model)
    window = model.get_nodes_by_op_type("Im2Col")[0].outputs[0].name
    cached = hook.verifier.values
    assert all(isinstance(dict.__getitem__(v, window), Recompute) for v in cached)
    full = Executor(model.to_proto())
    for i, values in enumerate(cached):
        want = full.run(ref.sample(i), return_all=True)[window]
        got = values[window]
        assert got.dtype == want.dtype and np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_a_window_the_run_made_is_cached_as_a_recomputation_too():
    """A float input has no integer range: the Im2Col runs and its MatMul reads the window (not fused). The cache
    still holds the window as a recomputation, and it is the array the run made."""
    g = GraphBuilder()
    c = 3
    y = g.node("Conv", ["x", g.const(int_weights(RNG, (c, c, 3, 3)))], pads=[1, 1, 1, 1])
    model = g.build({"x": (1, c, 5, 5)}, [y])
    ref = ReferenceData.random(model, n=2, seed=4, low=-3, high=3)
    hook = VerificationHook(ref)
    PassManager([Stage("lower", LOWER_PASSES, check_whole=True)], [hook]).run(model)
    window = model.get_nodes_by_op_type("Im2Col")[0].outputs[0].name
    full = Executor(model.to_proto())
    assert not full._fused
    for i, values in enumerate(hook.verifier.values):
        assert isinstance(dict.__getitem__(values, window), Recompute)
        want = full.run(ref.sample(i), return_all=True)[window]
        got = values[window]
        assert got.dtype == want.dtype and np.array_equal(got.view(np.uint32), want.view(np.uint32))
        assert values.meta(window) == (want.shape, want.dtype)


class PadWithOne(Rule):
    """Im2Col(pad_value=0) → Im2Col(pad_value=1)  (wrong: the border of every window changes)."""

    op_types = ("Im2Col",)

    def match(self, model, node):
        return node

    def rewrite(self, model, node):
        node.attributes["pad_value"] = ir.AttrInt64("pad_value", 1)


def test_a_wrong_change_to_a_cached_window_is_caught(tmp_path: Path):
    model = _mt_conv()
    ref = ReferenceData.random(model, n=2, seed=3, low=-3, high=3)
    hook = VerificationHook(ref, save_dir=tmp_path)
    stages = [Stage("lower", LOWER_PASSES, check_whole=True), Stage("wrong", [PadWithOne])]
    with pytest.raises(PassVerificationError) as info:
        PassManager(stages, [hook]).run(model)
    err = info.value
    im2col = model.get_nodes_by_op_type("Im2Col")[0]
    assert err.pass_name == "PadWithOne" and err.node == im2col.name and err.tensor == im2col.outputs[0].name
    # what the wrong pass was checked against: the window held as a recomputation
    assert isinstance(dict.__getitem__(hook.verifier.values[0], im2col.outputs[0].name), Recompute)


def test_the_executor_leaves_out_fused_windows_only_when_asked():
    model = _mt_conv()
    PassManager([Stage("lower", [LowerConvsToMatMul])]).run(model)
    window = model.get_nodes_by_op_type("Im2Col")[0].outputs[0].name
    ex = Executor(model.to_proto())
    assert ex._fused
    x = {"x": RNG.uniform(-3, 3, size=(1, 4, 6, 6)).astype(np.float32)}
    everything = ex.run(x, return_all=True)
    lean = ex.run(x, return_all=True, windows=False)
    assert window in everything and window not in lean
    assert set(everything) - set(lean) == {window}
    for name, value in lean.items():
        assert np.array_equal(np.asarray(value), np.asarray(everything[name])), name
    assert ex.run(x, windows=False).keys() == ex.run(x).keys()  # without return_all it changes nothing
