"""Structural checks of pure layout passes (:mod:`verify.layout_proof`): ConvertToNHWC and FINN's Transpose rules
are proved to compute the same up to the permutation, without running anything; a wrong permutation is refuted
naming the node; a rewrite the proof cannot follow falls back to sampling and says so."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir
import pytest

from finnlite import Model, PassManager, Stage, Transformation
from finnlite.core.compat import QONNX_DOMAIN
from streamline.layout import AbsorbConsecutiveTransposes, AbsorbTransposeIntoMultiThreshold, ConvertToNHWC
from tests.verify.graphs import GraphBuilder
from tests.zoo import manifest, zoo_model_path
from verify import PassVerificationError, ReferenceData, VerificationHook, final_check
from verify.clone import clone_model
from verify.layout_proof import prove_layout


def nchw_net() -> Model:
    """NCHW: per-channel Mul, per-channel MultiThreshold, Concat on channels, Flatten, MatMul (the flatten makes
    ConvertToNHWC permute the MatMul's weight rows), and a Transpose pair."""
    rng = np.random.default_rng(0)
    g = GraphBuilder()
    g.input("x", [1, 4, 3, 3])
    g.init("c", rng.uniform(0.5, 2, size=(1, 4, 1, 1)).astype(np.float32))
    g.node("Mul", ["x", "c"], ["m"], "mul")
    thr = np.sort(rng.uniform(-2, 2, size=(4, 3)), axis=1).astype(np.float32)
    g.multithreshold("m", "t", "mt", thr, "UINT2")
    g.node("Transpose", ["t"], ["tt"], "tr1", perm=[0, 2, 3, 1])
    g.node("Transpose", ["tt"], ["t2"], "tr2", perm=[0, 3, 1, 2])
    g.node("Concat", ["t2", "m"], ["cat"], "concat", axis=1)
    g.node("Flatten", ["cat"], ["flat"], "flatten", axis=1)
    g.init("W", rng.integers(-3, 4, size=(72, 5)).astype(np.float32))
    g.node("MatMul", ["flat", "W"], ["y"], "fc")
    g.output("y", [1, 5])
    m = g.model()
    m.infer_shapes()
    return m


def _converted(model: Model) -> tuple[Model, Model]:
    before = clone_model(model)
    assert ConvertToNHWC().apply(model)
    return before, model


def _const_input(model: Model, node_name: str, index: int) -> tuple[ir.Value, np.ndarray]:
    node = model.get_node_from_name(node_name)
    v = node.inputs[index]
    return v, np.array(model.get_initializer(v.name), copy=True)


def test_convert_to_nhwc_is_proved() -> None:
    before, after = _converted(nchw_net())
    assert any(n.op_type == "MultiThreshold" and n.attributes["data_layout"].value == "NHWC" for n in after.graph)
    proof = prove_layout(before, after)
    assert proof.status == "proved", proof.message


def test_wrong_weight_row_order_is_refuted_naming_the_matmul() -> None:
    before, after = _converted(nchw_net())
    v, w = _const_input(after, "fc", 1)
    w[[0, 1]] = w[[1, 0]]  # two rows of the permuted weight swapped: a wrong feature order
    after.set_initializer(v.name, w)
    proof = prove_layout(before, after)
    assert proof.status == "refuted" and proof.node == "fc"
    assert "constant differs" in proof.message


def test_wrong_constant_permutation_is_refuted_naming_the_mul() -> None:
    before, after = _converted(nchw_net())
    v, c = _const_input(after, "mul", 1)
    after.set_initializer(v.name, c[..., ::-1].copy())  # channels reversed: the wrong permutation
    proof = prove_layout(before, after)
    assert proof.status == "refuted" and proof.node == "mul", proof.message


def test_wrong_channel_axis_is_refuted_naming_the_multithreshold() -> None:
    model = nchw_net()
    before = clone_model(model)
    # a wrong data_layout: the thresholds now act along H instead of C
    mt = model.get_node_from_name("mt")
    mt.attributes["data_layout"] = ir.AttrString("data_layout", "NHCW")
    proof = prove_layout(before, model)
    assert proof.status == "refuted" and proof.node == "mt"
    assert "axis" in proof.message


def test_transpose_rules_are_proved() -> None:
    g = GraphBuilder()
    g.input("x", [1, 3, 2, 2])
    g.node("Transpose", ["x"], ["a"], "to_nhwc", perm=[0, 2, 3, 1])
    g.node("Transpose", ["a"], ["b"], "to_nchw", perm=[0, 3, 1, 2])
    g.multithreshold("b", "t", "mt", np.array([[0.0, 0.5]] * 3, np.float32), "UINT2")
    g.node("Relu", ["t"], ["y"], "relu")
    g.output("y", [1, 3, 2, 2])
    model = g.model()
    model.infer_shapes()
    for rule in (AbsorbTransposeIntoMultiThreshold, AbsorbConsecutiveTransposes):
        before = clone_model(model)
        rule().apply(model)
        assert prove_layout(before, model).status == "proved", rule.__name__


# -- in the per-pass checks --------------------------------------------------------------------------------------
class _SwapRows(Transformation):
    """A broken layout pass: ConvertToNHWC, then two rows of the classifier's weight swapped."""

    pure_layout = True

    def apply(self, model: Model) -> bool:
        ConvertToNHWC().apply(model)
        v, w = _const_input(model, "fc", 1)
        w[[0, 1]] = w[[1, 0]]
        model.set_initializer(v.name, w)
        return True


class _SoftmaxFirst(Transformation):
    """A correct layout rewrite the proof has no rule for: Transpose → Softmax(axis 3) becomes
    Softmax(axis 1) → Transpose."""

    pure_layout = True

    def apply(self, model: Model) -> bool:
        tr = model.get_node_from_name("tr")
        sm = model.get_node_from_name("sm")
        x, y = tr.inputs[0], sm.outputs[0]
        mid = ir.Value(name="sm_nchw", shape=x.shape, type=x.type)
        new_sm = ir.Node("", "Softmax", [x], attributes=[ir.AttrInt64("axis", 1)], outputs=[mid], name="sm")
        out = ir.Value(name="y_new", shape=y.shape, type=y.type)
        new_tr = ir.Node("", "Transpose", [mid], attributes=[ir.AttrInt64s("perm", [0, 2, 3, 1])], outputs=[out],
                         name="tr")
        model.graph.insert_after(sm, [new_sm, new_tr])
        model.graph.outputs[0] = out
        model.remove_node(sm)
        model.remove_node(tr)
        y.name, out.name = "y_old", "y"
        return True


def _run(model: Model, p: Any) -> VerificationHook:
    hook = VerificationHook(ReferenceData.random(model, n=4, seed=0, low=-2, high=2))
    PassManager([Stage("lower", [p])], [hook]).run(model)
    return hook


def test_hook_proves_convert_to_nhwc_and_keeps_the_cache_right() -> None:
    model = nchw_net()
    reference = ReferenceData.random(model, n=4, seed=0, low=-2, high=2)
    hook = VerificationHook(reference)
    PassManager([Stage("lower", [ConvertToNHWC, AbsorbConsecutiveTransposes])], [hook]).run(model)
    rec = next(r for r in hook.records if r.pass_name == "ConvertToNHWC")
    assert rec.policy.startswith("structural proof") and rec.region_nodes == 0
    # the cached values were moved to the new layout by the proof: they equal a fresh run of the new version (up to
    # float32 rounding where the MatMul now sums its permuted rows in another order)
    from custom_ops.executor import Executor

    fresh = Executor(model.to_proto()).run(reference.sample(0), return_all=True)
    cached = hook.verifier.values[0]
    for name in fresh:
        if name in cached and model.find_producer(name) is not None:
            np.testing.assert_allclose(np.asarray(cached[name]), fresh[name], rtol=1e-6, err_msg=name)
    assert final_check(reference, model).ok


def test_hook_reports_a_wrong_permutation_naming_the_node() -> None:
    with pytest.raises(PassVerificationError) as err:
        _run(nchw_net(), _SwapRows)
    assert err.value.node == "fc" and "structural check" in str(err.value)
    assert err.value.pass_name == "_SwapRows"


def test_hook_falls_back_to_sampling_and_says_why() -> None:
    g = GraphBuilder()
    g.input("x", [1, 4, 3, 3])
    g.node("Transpose", ["x"], ["a"], "tr", perm=[0, 2, 3, 1])
    g.node("Softmax", ["a"], ["y"], "sm", axis=3)
    g.output("y", [1, 3, 3, 4])
    model = g.model()
    model.infer_shapes()
    hook = _run(model, _SoftmaxFirst)
    rec = hook.records[-1]
    assert "structural check undecided" in rec.policy and "sampled" in rec.policy and rec.region_nodes > 0


@pytest.mark.zoo
@pytest.mark.parametrize("name", ["cnv_1w1a", "cnv_2w2a"])
def test_zoo_layout_passes_are_proved(name: str) -> None:
    from finnlite.config import Config

    model = Model(zoo_model_path(name))
    lo, hi = manifest()[name]["input_range"]
    # per-pass checks (the default checks the lower stage as a whole, proving nothing structurally: verify.hook)
    hook = VerificationHook(ReferenceData.random(model, n=2, seed=0, low=lo, high=hi), granularity="every-pass")
    PassManager(Config().build_stages(), [hook]).run(model)
    for layout_pass in ("ConvertToNHWC", "MakeMaxPoolNHWC"):  # CNV has MaxPools
        rec = next(r for r in hook.records if r.pass_name == layout_pass)
        assert rec.policy.startswith("structural proof"), (layout_pass, rec.policy)


def maxpool_net(**attrs: Any) -> Model:
    """NCHW: a per-channel MultiThreshold, a MaxPool (with ``attrs``) and a per-channel Mul."""
    rng = np.random.default_rng(3)
    g = GraphBuilder()
    g.input("x", [1, 3, 6, 6])
    thr = np.sort(rng.uniform(-2, 2, size=(3, 3)), axis=1).astype(np.float32)
    g.multithreshold("x", "t", "mt", thr, "UINT2")
    g.node("MaxPool", ["t"], ["p"], "pool", **{"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                                               **attrs})
    g.init("c", rng.uniform(0.5, 2, size=(1, 3, 1, 1)).astype(np.float32))
    g.node("Mul", ["p", "c"], ["y"], "mul")
    g.output("y", [1, 3, 3, 3])
    m = g.model()
    m.infer_shapes()
    return m


@pytest.mark.parametrize("attrs", [{}, {"ceil_mode": 1}])
def test_make_maxpool_nhwc_is_proved_alone_and_with_convert_to_nhwc(attrs: dict) -> None:
    from streamline.lower_pool import MakeMaxPoolNHWC

    model = maxpool_net(**attrs)
    before = clone_model(model)
    assert MakeMaxPoolNHWC().apply(model)
    assert any(n.op_type == "MaxPoolNHWC" for n in model.graph)
    assert prove_layout(before, model).status == "proved"
    assert ConvertToNHWC().apply(model)
    proof = prove_layout(before, model)
    assert proof.status == "proved", proof.message
    hook = _run(maxpool_net(**attrs), MakeMaxPoolNHWC)  # in the hook: proved, nothing run
    rec = next(r for r in hook.records if r.pass_name == "MakeMaxPoolNHWC")
    assert rec.policy.startswith("structural proof") and rec.region_nodes == 0


class _WrongStrides(Transformation):
    """A broken MakeMaxPoolNHWC: the NHWC pool gets strides 1, and its output shape follows."""

    pure_layout = True

    def apply(self, model: Model) -> bool:
        from streamline.lower_pool import MakeMaxPoolNHWC

        MakeMaxPoolNHWC().apply(model)
        pool = next(n for n in model.graph if n.op_type == "MaxPoolNHWC")
        pool.attributes["strides"] = ir.AttrInt64s("strides", [1, 1])
        return True


def test_a_wrong_nhwc_pool_is_not_proved_and_sampling_catches_it() -> None:
    model = maxpool_net()
    before = clone_model(model)
    _WrongStrides().apply(model)
    assert prove_layout(before, model).status != "proved"
    with pytest.raises(PassVerificationError) as err:
        _run(maxpool_net(), _WrongStrides)
    assert err.value.pass_name == "_WrongStrides"
