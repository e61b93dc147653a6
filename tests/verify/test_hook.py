"""Per-pass verification: correct rewrites pass, only the touched region is re-run, policies mean what they say."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from finnlite import Model, PassManager, Rule, Stage, Transformation
from tests.verify.graphs import (GraphBuilder, add_relu, batchnorm, const, gemm, mul_matmul, mul_multithreshold,
                                 mul_pad, new_node, quant_graph, take_over, two_ops, two_transposes)
from verify import (Equality, PassVerificationError, ReferenceData, Tolerance, VerificationHook, equality, metric,
                    tolerance)


# -- correct rewrites ----------------------------------------------------------------------------------------------
class CollapseMuls(Rule):
    """Mul(Mul(x, a), b) → Mul(x, a·b) (float32 rounding may differ in the last bit)."""

    op_types = ("Mul",)

    def match(self, model, node):
        prod = node.inputs[0].producer()
        return node if prod is not None and prod.op_type == "Mul" else None

    def rewrite(self, model, node):
        first = node.inputs[0].producer()
        node.replace_input_with(1, model.add_initializer(const(model, first.inputs[1]) * const(model, node.inputs[1])))
        node.replace_input_with(0, first.inputs[0])
        model.remove_node(first)


@equality
class CollapseMulsExactly(CollapseMuls):
    """The same rewrite, wrongly declared bit-exact."""


@equality
class CommuteAdd(Rule):
    """Add(x, y) → Add(y, x)."""

    op_types = ("Add",)

    def match(self, model, node):
        return node

    def rewrite(self, model, node):
        x, y = node.inputs[0], node.inputs[1]
        node.replace_input_with(0, y)
        node.replace_input_with(1, x)


class AbsorbPositiveMul(Rule):
    """MultiThreshold(Mul(x, a), T) → MultiThreshold(x, T / a) for a > 0."""

    op_types = ("MultiThreshold",)

    def match(self, model, node):
        prod = node.inputs[0].producer()
        return node if prod is not None and prod.op_type == "Mul" else None

    def rewrite(self, model, node):
        mul = node.inputs[0].producer()
        t = (const(model, node.inputs[1]) / const(model, mul.inputs[1])).astype(np.float32)
        node.replace_input_with(0, mul.inputs[0])
        node.replace_input_with(1, model.add_initializer(t))
        model.remove_node(mul)


@equality
class MoveMulPastZeroPad(Rule):
    """Pad(Mul(x, a), 0) → Mul(Pad(x, 0), a) (exact: a·0 = 0)."""

    op_types = ("Pad",)

    def match(self, model, node):
        prod = node.inputs[0].producer()
        return node if prod is not None and prod.op_type == "Mul" else None

    def rewrite(self, model, node):
        mul = node.inputs[0].producer()
        p = new_node(model, "Pad", [mul.inputs[0], *node.inputs[1:]], "pad0_moved", node,
                     attrs=list(node.attributes.values()))
        out = new_node(model, "Mul", [p, mul.inputs[1]], "mul0_moved", node)
        take_over(model, node.outputs[0], out)
        model.remove_node(node)
        model.remove_node(mul)


class FoldBatchNorm(Rule):
    """BatchNormalization → Mul(γ/√(var+ε)) + Add(β − μγ/√(var+ε))."""

    op_types = ("BatchNormalization",)

    def match(self, model, node):
        return node

    def rewrite(self, model, node):
        gamma, beta, mean, var = (const(model, v).astype(np.float64) for v in node.inputs[1:5])
        a = gamma / np.sqrt(var + node.attributes["epsilon"].value)
        b = beta - mean * a
        m = new_node(model, "Mul", [node.inputs[0], model.add_initializer(a.reshape(1, -1, 1, 1).astype(np.float32))],
                     "bn0_mul", node)
        out = new_node(model, "Add", [m, model.add_initializer(b.reshape(1, -1, 1, 1).astype(np.float32))],
                       "bn0_add", node)
        take_over(model, node.outputs[0], out)
        model.remove_node(node)


@equality
class RemoveInverseTransposes(Rule):
    """Transpose(Transpose(x, p), p⁻¹) → x."""

    op_types = ("Transpose",)

    def match(self, model, node):
        prod = node.inputs[0].producer()
        if prod is None or prod.op_type != "Transpose":
            return None
        p1, p2 = list(prod.attributes["perm"].value), list(node.attributes["perm"].value)
        return node if [p1[i] for i in p2] == list(range(len(p1))) else self.miss(node, "not inverse perms")

    def rewrite(self, model, node):
        first = node.inputs[0].producer()
        x = first.inputs[0]
        for use in list(node.outputs[0].uses()):
            use.node.replace_input_with(use.idx, x)
        model.remove_node(node)
        model.remove_node(first)


class MoveScalarMulPastMatMul(Rule):
    """MatMul(Mul(x, a), W) → Mul(MatMul(x, W), a) for a scalar a."""

    op_types = ("MatMul",)

    def match(self, model, node):
        prod = node.inputs[0].producer()
        if prod is None or prod.op_type != "Mul":
            return None
        return node if const(model, prod.inputs[1]).size == 1 else self.miss(node, "the Mul is not scalar")

    def rewrite(self, model, node):
        mul = node.inputs[0].producer()
        mm = new_node(model, "MatMul", [mul.inputs[0], node.inputs[1]], "mm0_moved", node)
        out = new_node(model, "Mul", [mm, mul.inputs[1]], "mul0_moved", node)
        take_over(model, node.outputs[0], out)
        model.remove_node(node)
        model.remove_node(mul)


class GemmToMatMul(Rule):
    """Gemm(x, W, C, transB=1) → Add(MatMul(x, Wᵀ), C)."""

    op_types = ("Gemm",)

    def match(self, model, node):
        return node

    def rewrite(self, model, node):
        wt = model.add_initializer(const(model, node.inputs[1]).T.copy())
        mm = new_node(model, "MatMul", [node.inputs[0], wt], "gemm0_mm", node)
        out = new_node(model, "Add", [mm, node.inputs[2]], "gemm0_add", node)
        take_over(model, node.outputs[0], out)
        model.remove_node(node)


class RenameNodes(Transformation):
    """Give every node a new name (changes nothing that is computed)."""

    def apply(self, model):
        model.give_unique_node_names(prefix="renamed_")
        return True


def _mul_mul() -> Model:
    g = GraphBuilder()
    g.input("x", [1, 64])
    g.init("a", np.float32(0.1)), g.init("b", np.float32(0.3))
    g.node("Mul", ["x", "a"], ["t"], "mul0")
    g.node("Mul", ["t", "b"], ["out"], "mul1")
    g.output("out", [1, 64])
    return g.model()


def _scalar_mul_matmul() -> Model:
    g = GraphBuilder()
    g.input("x", [1, 8])
    g.init("a", np.float32(0.3)), g.init("W", np.random.default_rng(5).uniform(-1, 1, (8, 8)).astype(np.float32))
    g.node("Mul", ["x", "a"], ["m"], "mul0")
    g.node("MatMul", ["m", "W"], ["out"], "mm0")
    g.output("out", [1, 8])
    return g.model()


def _inverse_transposes() -> Model:
    g = GraphBuilder()
    g.input("x", [1, 2, 3, 4])
    g.node("Transpose", ["x"], ["t0"], "tr0", perm=[0, 2, 3, 1])
    g.node("Transpose", ["t0"], ["t1"], "tr1", perm=[0, 3, 1, 2])
    g.node("Relu", ["t1"], ["out"], "relu0")
    g.output("out", [1, 2, 3, 4])
    return g.model()


CORRECT = [
    (lambda: two_ops("Mul"), CollapseMuls),
    (_mul_mul, CollapseMuls),
    (add_relu, CommuteAdd),
    (lambda: mul_multithreshold(np.float32(2.5)), AbsorbPositiveMul),
    (lambda: mul_pad(0.0), MoveMulPastZeroPad),
    (batchnorm, FoldBatchNorm),
    (_inverse_transposes, RemoveInverseTransposes),
    (_scalar_mul_matmul, MoveScalarMulPastMatMul),
    (gemm, GemmToMatMul),
    (add_relu, RenameNodes),
]


@pytest.mark.parametrize("build, rule", CORRECT, ids=[r.__name__ for _, r in CORRECT])
def test_correct_rewrite_passes(build, rule) -> None:
    model = build()
    hook = VerificationHook(ReferenceData.random(model, n=4, seed=11))
    report = PassManager([Stage("ok", [rule])], [hook]).run(model)
    assert report.records[0].changed
    assert len(hook.records) == 1 and hook.records[0].label == f"pass '{rule.__name__}'"
    assert hook.near_ties == []


def test_renaming_touches_no_region() -> None:
    model = add_relu()
    hook = VerificationHook(ReferenceData.random(model, n=2))
    PassManager([Stage("ok", [RenameNodes])], [hook]).run(model)
    assert hook.records[0].region_nodes == 0


def test_equality_rejects_float_reassociation() -> None:
    model = _mul_mul()
    hook = VerificationHook(ReferenceData.random(model, n=4, seed=2))
    with pytest.raises(PassVerificationError, match=r"CollapseMulsExactly.*under equality.*'mul1'"):
        PassManager([Stage("s", [CollapseMulsExactly])], [hook]).run(model)


def test_only_the_touched_region_is_run() -> None:
    g = GraphBuilder()
    g.input("x", [1, 8])
    prev = "x"
    for i in range(12):
        g.init(f"c{i}", np.float32(1.0 + i / 8))
        prev = g.node("Mul" if i % 3 else "Add", [prev, f"c{i}"], [f"t{i}"], f"n{i}")
    g.node("Relu", [prev], ["out"], "relu")
    g.output("out", [1, 8])
    model = g.model()

    class BumpOneConstant(Transformation):
        """Replace c5 by an equal copy (same value, new initializer): a one-node change."""

        def apply(self, model):
            node = model.get_node_from_name("n5")
            node.replace_input_with(1, model.add_initializer(const(model, node.inputs[1]).copy()))
            return True

    hook = VerificationHook(ReferenceData.random(model, n=2))
    PassManager([Stage("s", [BumpOneConstant])], [hook]).run(model)
    (rec,) = hook.records
    assert (rec.changed_nodes, rec.region_nodes) == (1, 1)


class NoChange(Transformation):
    """Changes nothing and says so."""

    def apply(self, model):
        return False


def test_unchanged_passes_are_not_checked() -> None:
    model = add_relu()
    hook = VerificationHook(ReferenceData.random(model, n=2))
    PassManager([Stage("s", [NoChange, NoChange, CommuteAdd, NoChange])], [hook]).run(model)
    assert [r.label for r in hook.records] == ["pass 'CommuteAdd'"]


def test_stage_policy_applies_to_its_passes() -> None:
    model = _mul_mul()
    hook = VerificationHook(ReferenceData.random(model, n=4, seed=2))
    with pytest.raises(PassVerificationError, match="under equality"):
        PassManager([Stage("s", [CollapseMuls], verification=Equality())], [hook]).run(model)


def test_tolerances_do_not_accumulate_across_passes() -> None:
    """The cache keeps the original values of boundary tensors, so each check is against the original: two passes
    that each scale the output by 1 + 6e-6 pass one at a time but not together under rtol 1e-5."""

    @tolerance(rtol=1e-5)
    class ScaleOutput(Transformation):
        """Multiply the graph output by 1 + 6e-6."""

        def apply(self, model):
            out = model.graph.outputs[0]
            name = out.name
            scaled = new_node(model, "Mul", [out, model.add_initializer(np.float32(1 + 6e-6))],
                              f"scale{len(model)}", out.producer(), after=True)
            model.graph.outputs[0] = scaled
            out.name = model.make_new_valueinfo_name(name + "_unscaled")
            scaled.name = name
            model._reindex()  # noqa: SLF001
            return True

    model = add_relu()
    hook = VerificationHook(ReferenceData.random(model, n=2, low=1, high=2))
    PassManager([Stage("s", [ScaleOutput])], [hook]).run(model)
    with pytest.raises(PassVerificationError, match="ScaleOutput"):
        PassManager([Stage("s", [ScaleOutput])], [hook]).run(model)


class FloorRounding(Rule):
    """Quant rounding ROUND → FLOOR: differs by at most one step."""

    op_types = ("Quant",)

    def match(self, model, node):
        return node

    def rewrite(self, model, node):
        node.attributes["rounding_mode"] = ir.AttrString("rounding_mode", "FLOOR")


def test_tolerance_in_quantization_steps() -> None:
    model = quant_graph(3, False)
    ref = ReferenceData.random(model, n=4, low=-0.5, high=2.5)
    one_step = type("FloorOneStep", (FloorRounding,), {"verification": Tolerance(steps=1)})
    half_step = type("FloorHalfStep", (FloorRounding,), {"verification": Tolerance(steps=0.5)})
    PassManager([Stage("s", [one_step])], [VerificationHook(ref)]).run(model)
    with pytest.raises(PassVerificationError, match="FloorHalfStep"):
        PassManager([Stage("s", [half_step])], [VerificationHook(ref)]).run(quant_graph(3, False))


def _top1(outputs, reference) -> float:
    (name,) = reference
    return float(np.mean(np.argmax(outputs[name], axis=-1) == np.argmax(reference[name], axis=-1)))


def test_metric_policy_accepts_and_rejects() -> None:
    @metric(_top1, lo=1.0)
    class SlightlyScaleWeights(Transformation):
        """Scale the MatMul weight by 1.01 (changes values, not the argmax)."""

        def apply(self, model):
            node = model.get_node_from_name("mm0")
            node.replace_input_with(1, model.add_initializer(const(model, node.inputs[1]) * np.float32(1.01)))
            return True

    @metric(_top1, lo=0.9)
    class NegateWeights(Transformation):
        """Negate the MatMul weight (changes the argmax)."""

        def apply(self, model):
            node = model.get_node_from_name("mm0")
            node.replace_input_with(1, model.add_initializer(-const(model, node.inputs[1])))
            return True

    model = mul_matmul()
    ref = ReferenceData.random(model, n=16, seed=4)
    hook = VerificationHook(ref)
    PassManager([Stage("s", [SlightlyScaleWeights])], [hook]).run(model)
    assert hook.records[0].policy.startswith("metric _top1 in [1, inf]")
    with pytest.raises(PassVerificationError, match=r"NegateWeights.*metric _top1 in \[0.9, inf\]: got 0"):
        PassManager([Stage("s", [NegateWeights])], [hook]).run(model)


def test_a_stage_checked_whole_checks_once_and_replays_to_name_the_pass() -> None:
    from tests.verify.test_wrong_rewrites import AddSelf

    model = add_relu()
    hook = VerificationHook(ReferenceData.random(model, n=2))
    PassManager([Stage("good", [CommuteAdd, RenameNodes, CommuteAdd], check_whole=True)], [hook]).run(model)
    assert [r.label for r in hook.records] == ["stage 'good'"]  # one check for three passes
    with pytest.raises(PassVerificationError, match=r"pass 'AddSelf' \(stage 'mixed'\) broke equivalence") as info:
        mixed = Stage("mixed", [CommuteAdd, RenameNodes, AddSelf, CommuteAdd], check_whole=True)
        PassManager([mixed], [hook]).run(model)
    assert (info.value.pass_name, info.value.stage, info.value.node) == ("AddSelf", "mixed", "renamed_Add_0")


def test_default_reference_is_drawn_from_the_model() -> None:
    model = two_transposes()
    hook = VerificationHook(samples=2)
    PassManager([Stage("s", [RenameNodes])], [hook]).run(model)
    assert hook.reference is not None and hook.reference.num_samples == 8
    assert "verification: 1 checks" in hook.summary()


# -- changes of encoding: values that re-converge downstream ------------------------------------------------------
def _bipolar_matmul(identity: bool = True) -> Model:
    """x → MultiThreshold (bipolar: 2·[x ≥ 0] − 1) → Identity → MatMul(W ∈ ±1) → out."""
    g = GraphBuilder()
    g.input("x", [1, 8])
    g.init("t", np.zeros((1, 1), np.float32))
    g.init("W", np.where(np.random.default_rng(9).uniform(size=(8, 4)) > 0.5, 1.0, -1.0).astype(np.float32))
    g.node("MultiThreshold", ["x", "t"], ["b"], "mt0", domain="qonnx.custom_op.general", out_dtype="BIPOLAR",
           out_scale=2.0, out_bias=-1.0)
    g.node("Identity", ["b"], ["moved"], "move0")
    g.node("MatMul", ["moved", "W"], ["out"], "mm0")
    g.output("out", [1, 4])
    return g.model()


class BinaryEncoding(Rule):
    """MatMul(x, W) with bipolar x, W → 2·(x'·W') − K via the binary encoding x' = (x + 1)/2, W' = (W + 1)/2; the
    MultiThreshold now produces x' under the same tensor name (the values of 'b' and 'moved' change)."""

    op_types = ("MatMul",)
    xnor = True
    fix = True

    def match(self, model, node):
        return node

    def rewrite(self, model, node):
        mt = model.get_node_from_name("mt0")
        mt.attributes["out_scale"] = ir.AttrFloat32("out_scale", 1.0)
        mt.attributes["out_bias"] = ir.AttrFloat32("out_bias", 0.0)
        w = const(model, node.inputs[1])
        k = w.shape[0]
        if self.xnor:
            p = new_node(model, "XnorPopcountMatMul", [node.inputs[0], model.add_initializer((w + 1) / 2)], "xnor",
                         node, domain="qonnx.custom_op.general")
            y = new_node(model, "Mul", [p, model.add_initializer(np.float32(2))], "fix_mul", node)
            out = new_node(model, "Add", [y, model.add_initializer(np.float32(-k if self.fix else 0))], "fix_add",
                           node)
        else:  # x'·W, then 2·(x'·W) − Σ W
            p = new_node(model, "MatMul", [node.inputs[0], node.inputs[1]], "mm_binary", node)
            y = new_node(model, "Mul", [p, model.add_initializer(np.float32(2))], "fix_mul", node)
            colsum = w.sum(axis=0).astype(np.float32)
            out = new_node(model, "Sub", [y, model.add_initializer(colsum if self.fix else 0 * colsum)], "fix_add",
                           node)
        take_over(model, node.outputs[0], out)
        model.remove_node(node)


def test_a_change_of_encoding_that_reconverges_passes() -> None:
    for xnor in (True, False):  # the XNOR op refuses the stale bipolar values: the region is widened first
        rule = type("BinaryEncodingX" if xnor else "BinaryEncodingM", (BinaryEncoding,), {"xnor": xnor})
        model = _bipolar_matmul()
        hook = VerificationHook(ReferenceData.random(model, n=4), policy=Equality())
        PassManager([Stage("lower", [rule])], [hook]).run(model)
        (rec,) = hook.records
        assert (rec.changed_nodes, rec.region_nodes) == (4, 5)  # the unchanged Identity had to be run too
        assert np.array_equal(np.unique(hook.verifier.values[0]["moved"]), [0.0, 1.0])  # the cache follows


def test_a_wrong_change_of_encoding_fails() -> None:
    for xnor in (True, False):
        rule = type("BrokenEncoding", (BinaryEncoding,), {"xnor": xnor, "fix": False})
        model = _bipolar_matmul()
        hook = VerificationHook(ReferenceData.random(model, n=4))
        with pytest.raises(PassVerificationError, match="pass 'BrokenEncoding'.*reaches the graph output as tensor "
                                                        "'out'") as info:
            PassManager([Stage("lower", [rule])], [hook]).run(model)
        assert info.value.node == "mt0" and info.value.tensor == "b"


# -- rewired readers ------------------------------------------------------------------------------------------------
def _bn_threshold() -> Model:
    g = GraphBuilder()
    g.input("x", [1, 3, 2, 2])
    for name, value in (("gamma", [1.0, 0.5, 2.0]), ("beta", [0.1, -0.2, 0.3]), ("mean", [0.0, 0.5, -0.5]),
                        ("var", [0.05, 0.2, 0.5])):
        g.init(name, np.array(value, np.float32))
    g.node("BatchNormalization", ["x", "gamma", "beta", "mean", "var"], ["y"], "bn0", epsilon=0.1)
    g.multithreshold("y", "out", "mt0", np.tile(np.linspace(-2, 2, 7, dtype=np.float32), (3, 1)), "UINT3")
    g.output("out", [1, 3, 2, 2])
    return g.model()


class FoldBatchNormRewiring(Rule):
    """BatchNormalization → Mul + Add under new names; the reader is rewired to the Add (``eps`` scales the
    epsilon: 1 is right, 0 forgets it)."""

    op_types = ("BatchNormalization",)
    eps = 1.0

    def match(self, model, node):
        return node

    def rewrite(self, model, node):
        gamma, beta, mean, var = (const(model, v).astype(np.float64) for v in node.inputs[1:5])
        a = gamma / np.sqrt(var + self.eps * node.attributes["epsilon"].value)
        b = beta - mean * a
        m = new_node(model, "Mul", [node.inputs[0], model.add_initializer(a.reshape(1, -1, 1, 1).astype(np.float32))],
                     "bn0_mul", node)
        out = new_node(model, "Add", [m, model.add_initializer(b.reshape(1, -1, 1, 1).astype(np.float32))],
                       "bn0_add", node)
        for use in list(node.outputs[0].uses()):
            use.node.replace_input_with(use.idx, out)
        model.remove_node(node)


def test_a_rewired_reader_is_not_run_when_its_new_input_holds_the_old_values() -> None:
    model = _bn_threshold()
    hook = VerificationHook(ReferenceData.random(model, n=4, seed=3))
    PassManager([Stage("s", [FoldBatchNormRewiring])], [hook]).run(model)
    (rec,) = hook.records
    assert (rec.changed_nodes, rec.region_nodes, rec.runs) == (3, 2, 1)  # the MultiThreshold was not run


def test_a_rewired_reader_whose_new_input_differs_is_run_and_named() -> None:
    model = _bn_threshold()
    hook = VerificationHook(ReferenceData.random(model, n=4, seed=3))
    broken = type("FoldBatchNormNoEps", (FoldBatchNormRewiring,), {"eps": 0.0})
    with pytest.raises(PassVerificationError, match="pass 'FoldBatchNormNoEps'") as info:
        PassManager([Stage("s", [broken])], [hook]).run(model)
    assert (info.value.node, info.value.tensor) == ("mt0", "out")


# -- layout changes ------------------------------------------------------------------------------------------------
def _conv_relu(last: str) -> Model:
    """x → Conv → t → Relu → r → (Conv | Flatten) → out, with C = H = W = 4."""
    rng = np.random.default_rng(12)
    g = GraphBuilder()
    g.input("x", [1, 4, 4, 4])
    g.init("W1", rng.uniform(-1, 1, (4, 4, 1, 1)).astype(np.float32))
    g.node("Conv", ["x", "W1"], ["t"], "conv1")
    g.node("Relu", ["t"], ["r"], "relu")
    if last == "Conv":
        g.init("W2", rng.uniform(-1, 1, (4, 4, 1, 1)).astype(np.float32))
        g.node("Conv", ["r", "W2"], ["out"], "conv2")
    else:
        g.node("Flatten", ["r"], ["out"], "flat")
    g.output("out", [1, 4, 4, 4] if last == "Conv" else [1, 64])
    return g.model()


class ToNHWC(Transformation):
    """conv1 produces t in NHWC (annotated), the Relu is left as it is (element-wise), and the last node reads r
    back in NCHW (``back``: False forgets to, which is wrong)."""

    back = True

    def apply(self, model):
        conv1 = model.get_node_from_name("conv1")
        t_nhwc = new_node(model, "Transpose", [conv1.outputs[0]], "to_nhwc", conv1, after=True,
                          attrs=[ir.AttrInt64s("perm", [0, 2, 3, 1])])
        take_over(model, model.value("t"), t_nhwc)
        model.get_node_from_name("to_nhwc").replace_input_with(0, conv1.outputs[0])
        for name in ("t", "r"):
            model.set_tensor_layout(name, ["N", "H", "W", "C"])
        last = next(n for n in model.graph if n.name in ("conv2", "flat"))
        if self.back:
            r_nchw = new_node(model, "Transpose", [model.value("r")], "to_nchw", last,
                              attrs=[ir.AttrInt64s("perm", [0, 3, 1, 2])])
            last.replace_input_with(0, r_nchw)
        return True


def test_a_layout_change_is_verified_through_unchanged_elementwise_nodes() -> None:
    model = _conv_relu("Conv")
    hook = VerificationHook(ReferenceData.random(model, n=2), policy=Equality())
    PassManager([Stage("lower", [ToNHWC])], [hook]).run(model)
    (rec,) = hook.records
    assert rec.region_nodes == rec.changed_nodes + 1  # the unchanged Relu ran on the NHWC tensor
    assert hook.verifier.values[0]["r"].shape == (1, 4, 4, 4)


def test_a_layout_sensitive_reader_left_unchanged_is_caught() -> None:
    model = _conv_relu("Flatten")
    broken = type("ToNHWCForgetful", (ToNHWC,), {"back": False})
    with pytest.raises(PassVerificationError, match="pass 'ToNHWCForgetful'") as info:
        PassManager([Stage("lower", [broken])], [VerificationHook(ReferenceData.random(model, n=2))]).run(model)
    assert (info.value.node, info.value.tensor) == ("flat", "out")
    model = _conv_relu("Conv")
    with pytest.raises(PassVerificationError, match="pass 'ToNHWCForgetful'") as info:
        PassManager([Stage("lower", [broken])], [VerificationHook(ReferenceData.random(model, n=2))]).run(model)
    assert (info.value.node, info.value.tensor) == ("conv2", "out")


# -- failures and crashes ------------------------------------------------------------------------------------------------
class Crash(Transformation):
    """A pass that fails on any graph (as a later pass may on a graph a wrong rewrite broke)."""

    def apply(self, model):
        raise RuntimeError("this pass cannot handle the graph")


def test_a_failure_stops_the_run_before_the_next_pass() -> None:
    from tests.verify.test_wrong_rewrites import AddSelf

    model = add_relu()
    hook = VerificationHook(ReferenceData.random(model, n=2))
    ran: list[str] = []

    class Later(Transformation):
        def apply(self, model):
            ran.append("later")
            return False

    with pytest.raises(PassVerificationError, match=r"pass 'AddSelf' .*broke equivalence") as info:
        PassManager([Stage("a", [CommuteAdd, AddSelf, Later]), Stage("b", [Later])], [hook]).run(model)
    assert info.value.pass_name == "AddSelf" and info.value.node == "add0"
    assert [r.label for r in hook.records] == ["pass 'CommuteAdd'"]  # nothing after the failure was accepted
    assert ran == []  # checked before the next pass started


def test_a_failure_is_reported_before_a_later_crash() -> None:
    from tests.verify.test_wrong_rewrites import AddSelf

    model = add_relu()
    hook = VerificationHook(ReferenceData.random(model, n=2))
    with pytest.raises(PassVerificationError, match=r"pass 'AddSelf'"):
        PassManager([Stage("a", [AddSelf, Crash])], [hook]).run(model)
    clean = add_relu()
    with pytest.raises(RuntimeError, match="cannot handle"):  # with nothing wrong before it, the crash itself
        PassManager([Stage("a", [CommuteAdd, Crash])], [VerificationHook(ReferenceData.random(clean, n=2))]).run(clean)


def test_replaced_weights_are_not_kept_alive_by_the_checks() -> None:
    import gc
    import weakref

    model = _mul_mul()
    hook = VerificationHook(ReferenceData.random(model, n=2))
    PassManager([Stage("s", [RenameNodes])], [hook]).run(model)  # fingerprints every weight
    old = [weakref.ref(v.const_value) for v in model.graph.initializers.values()]
    class ReplaceWeights(Transformation):
        """Every initializer replaced by a new array of the same values."""

        def apply(self, model):
            for name in list(model.graph.initializers):
                model.set_initializer(name, np.array(model.get_initializer(name)))
            return True

    PassManager([Stage("s", [ReplaceWeights])], [hook]).run(model)
    gc.collect()
    current = {id(v.const_value) for v in model.graph.initializers.values()}
    alive = [r() for r in old if r() is not None]
    assert alive == []  # the replaced ones are gone
    held = {id(t) for t, _ in hook.verifier.fps._cache.values()}
    assert held <= {id(v.const_value) for v in model.graph.initializers.values()}
    hook.close()
    assert hook.verifier is None and len(hook.records) == 2
