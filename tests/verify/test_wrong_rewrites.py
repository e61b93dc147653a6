"""Deliberately wrong rewrites: each one must be caught by per-pass verification, and the error must name the pass
and the first diverging node (and save the models before and after the pass)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx_ir as ir
import pytest

from finnlite import Model, PassManager, Rule, Stage, Transformation, VerificationError
from finnlite.core.compat import QONNX_DOMAIN
from tests.verify.graphs import (add_conv, add_relu, batchnorm, channel_mul_relu, clip_graph, const, gemm,
                                 int_multithreshold, matmul_bias_relu, mul_add, mul_matmul, mul_maxpool,
                                 mul_multithreshold, mul_pad, new_node, numpy_weight_matmul, quant_graph, sub_graph,
                                 take_over, transpose_reshape, two_ops, two_transposes)
from verify import PassVerificationError, ReferenceData, VerificationHook

# -- wrong rewrites ----------------------------------------------------------------------------------------------
class EveryNode(Rule):
    """A wrong rewrite applied to every node of its op types."""

    def match(self, model, node):
        return node


class FedBy(Rule):
    """A wrong rewrite of a node whose first input a ``producer_op`` node computes."""

    producer_op = ""

    def match(self, model, node):
        prod = node.inputs[0].producer()
        return node if prod is not None and prod.op_type == self.producer_op else None


def replace_node(model, node, out) -> None:
    """``out`` takes over ``node``'s output, and ``node`` goes."""
    take_over(model, node.outputs[0], out)
    model.remove_node(node)


def replace_pair(model, node, producer, out) -> None:
    """``out`` takes over ``node``'s output; ``node`` and the ``producer`` of its input go."""
    replace_node(model, node, out)
    model.remove_node(producer)


class AddSelf(EveryNode):
    """Add(x, y) → Add(x, x)  (wrong)."""

    op_types = ("Add",)

    def rewrite(self, model, node):
        node.replace_input_with(1, node.inputs[0])


class ThresholdOffByOne(EveryNode):
    """MultiThreshold thresholds T → T + 1  (wrong: moves every integer threshold)."""

    op_types = ("MultiThreshold",)

    def rewrite(self, model, node):
        node.replace_input_with(1, model.add_initializer(const(model, node.inputs[1]) + 1))


class DropBias(FedBy):
    """Add(MatMul(x, W), b) → MatMul(x, W)  (wrong: the bias is lost)."""

    op_types = ("Add",)
    producer_op = "MatMul"

    def rewrite(self, model, node):
        model.bypass_node(node, 0)


class AbsorbNegativeMulNoReversal(FedBy):
    """MultiThreshold(Mul(x, a), T) → MultiThreshold(x, sort(T / a)) for a < 0  (wrong: needs the comparison
    reversed)."""

    op_types = ("MultiThreshold",)
    producer_op = "Mul"

    def rewrite(self, model, node):
        mul = node.inputs[0].producer()
        t = np.sort(const(model, node.inputs[1]) / const(model, mul.inputs[1]), axis=1)
        node.replace_input_with(0, mul.inputs[0])
        node.replace_input_with(1, model.add_initializer(t.astype(np.float32)))
        model.remove_node(mul)


class MoveChannelMulWrongAxis(FedBy):
    """Relu(Mul(x, c)) → Mul(Relu(x), c) with the per-channel c put on the last axis  (wrong axis)."""

    op_types = ("Relu",)
    producer_op = "Mul"

    def rewrite(self, model, node):
        mul = node.inputs[0].producer()
        c = const(model, mul.inputs[1]).reshape(1, 1, 1, -1)
        r = new_node(model, "Relu", [mul.inputs[0]], "relu0_moved", node)
        out = new_node(model, "Mul", [r, model.add_initializer(c)], "mul0_moved", node)
        replace_pair(model, node, mul, out)


class MoveMulPastPad(FedBy):
    """Pad(Mul(x, a), fill) → Mul(Pad(x, fill), a)  (wrong for a non-zero fill: the border becomes a·fill)."""

    op_types = ("Pad",)
    producer_op = "Mul"

    def rewrite(self, model, node):
        mul = node.inputs[0].producer()
        p = new_node(model, "Pad", [mul.inputs[0], *node.inputs[1:]], "pad0_moved", node,
                     attrs=list(node.attributes.values()))
        out = new_node(model, "Mul", [p, mul.inputs[1]], "mul0_moved", node)
        replace_pair(model, node, mul, out)


class MoveMulPastAddKeepingBias(FedBy):
    """Add(Mul(x, a), b) → Mul(Add(x, b), a)  (wrong: the bias must become b / a)."""

    op_types = ("Add",)
    producer_op = "Mul"

    def rewrite(self, model, node):
        mul = node.inputs[0].producer()
        s = new_node(model, "Add", [mul.inputs[0], node.inputs[1]], "add0_moved", node)
        out = new_node(model, "Mul", [s, mul.inputs[1]], "mul0_moved", node)
        replace_pair(model, node, mul, out)


class MoveAddPastPaddedConv(FedBy):
    """Conv(Add(x, b), W) → Add(Conv(x, W), Σ W·b)  (wrong with zero padding: the border sees 0, not b)."""

    op_types = ("Conv",)
    producer_op = "Add"

    def rewrite(self, model, node):
        add = node.inputs[0].producer()
        w, b = const(model, node.inputs[1]), const(model, add.inputs[1]).reshape(-1)
        bias = np.einsum("oikl,i->o", w, b).reshape(1, -1, 1, 1).astype(np.float32)
        c = new_node(model, "Conv", [add.inputs[0], node.inputs[1]], "conv0_moved", node,
                     attrs=list(node.attributes.values()))
        out = new_node(model, "Add", [c, model.add_initializer(bias)], "add0_moved", node)
        replace_pair(model, node, add, out)


class ComposeTransposesWrongOrder(FedBy):
    """Transpose(Transpose(x, p1), p2) → Transpose(x, p2∘p1)  (wrong: the composition is p1∘p2)."""

    op_types = ("Transpose",)
    producer_op = "Transpose"

    def rewrite(self, model, node):
        first = node.inputs[0].producer()
        p1, p2 = list(first.attributes["perm"].value), list(node.attributes["perm"].value)
        perm = [p2[p1[i]] for i in range(len(p1))]
        out = new_node(model, "Transpose", [first.inputs[0]], "tr01", node, attrs=[ir.AttrInt64s("perm", perm)])
        replace_pair(model, node, first, out)


class MoveVectorMulPastMatMul(FedBy):
    """MatMul(Mul(x, a), W) → Mul(MatMul(x, W), a)  (wrong: only a scalar a commutes with MatMul)."""

    op_types = ("MatMul",)
    producer_op = "Mul"

    def rewrite(self, model, node):
        mul = node.inputs[0].producer()
        mm = new_node(model, "MatMul", [mul.inputs[0], node.inputs[1]], "mm0_moved", node)
        out = new_node(model, "Mul", [mm, mul.inputs[1]], "mul0_moved", node)
        replace_pair(model, node, mul, out)


class CollapseMulsByAdding(FedBy):
    """Mul(Mul(x, a), b) → Mul(x, a + b)  (wrong: a · b)."""

    op_types = ("Mul",)
    producer_op = "Mul"

    def rewrite(self, model, node):
        first = node.inputs[0].producer()
        c = const(model, first.inputs[1]) + const(model, node.inputs[1])
        node.replace_input_with(0, first.inputs[0])
        node.replace_input_with(1, model.add_initializer(c))
        model.remove_node(first)


class CollapseAddsBySubtracting(FedBy):
    """Add(Add(x, a), b) → Add(x, a − b)  (wrong: a + b)."""

    op_types = ("Add",)
    producer_op = "Add"

    def rewrite(self, model, node):
        first = node.inputs[0].producer()
        c = const(model, first.inputs[1]) - const(model, node.inputs[1])
        node.replace_input_with(0, first.inputs[0])
        node.replace_input_with(1, model.add_initializer(c))
        model.remove_node(first)


class AbsorbMulWithoutScaling(FedBy):
    """MultiThreshold(Mul(x, a), T) → MultiThreshold(x, T)  (wrong: T / a)."""

    op_types = ("MultiThreshold",)
    producer_op = "Mul"

    def rewrite(self, model, node):
        mul = node.inputs[0].producer()
        node.replace_input_with(0, mul.inputs[0])
        model.remove_node(mul)


class AbsorbAddWrongSign(FedBy):
    """MultiThreshold(Add(x, b), T) → MultiThreshold(x, T + b)  (wrong: T − b)."""

    op_types = ("MultiThreshold",)
    producer_op = "Add"

    def rewrite(self, model, node):
        add = node.inputs[0].producer()
        t = const(model, node.inputs[1]) + const(model, add.inputs[1]).reshape(-1, 1)
        node.replace_input_with(0, add.inputs[0])
        node.replace_input_with(1, model.add_initializer(t.astype(np.float32)))
        model.remove_node(add)


class QuantToThresholdsOffByHalfStep(EveryNode):
    """Quant(x, s) → Mul(MultiThreshold(x, m·s), s)  (wrong: the thresholds of ROUND are (m − ½)·s)."""

    op_types = ("Quant",)
    scale_output = True

    def rewrite(self, model, node):
        s = float(const(model, node.inputs[1]))
        levels = 2 ** int(const(model, node.inputs[3])) - 1
        t = (np.arange(1, levels + 1, dtype=np.float32) * np.float32(s))[None, :]
        mt = new_node(model, "MultiThreshold", [node.inputs[0], model.add_initializer(t)], "q0_mt", node,
                      domain=QONNX_DOMAIN, attrs=[ir.AttrString("out_dtype", "UINT3")])
        out = new_node(model, "Mul", [mt, node.inputs[1]], "q0_scale", node) if self.scale_output else mt
        replace_node(model, node, out)


class QuantToThresholdsWithoutScale(QuantToThresholdsOffByHalfStep):
    """Quant(x, s) → MultiThreshold(x, T)  (wrong: the levels are not multiplied back by s)."""

    scale_output = False

    def rewrite(self, model, node):
        s = np.float32(const(model, node.inputs[1]))
        t = ((np.arange(1, 8, dtype=np.float32) - np.float32(0.5)) * s)[None, :]
        mt = new_node(model, "MultiThreshold", [node.inputs[0], model.add_initializer(t)], "q0_mt", node,
                      domain=QONNX_DOMAIN, attrs=[ir.AttrString("out_dtype", "UINT3")])
        replace_node(model, node, mt)


class DropReluBeforeQuant(FedBy):
    """Quant(Relu(x)) → Quant(x)  (wrong for a signed quantizer: negative values survive)."""

    op_types = ("Quant",)
    producer_op = "Relu"

    def rewrite(self, model, node):
        relu = node.inputs[0].producer()
        node.replace_input_with(0, relu.inputs[0])
        model.remove_node(relu)


class MoveNegativeMulPastMaxPool(FedBy):
    """MaxPool(Mul(x, a)) → Mul(MaxPool(x), a)  (wrong for a < 0: the max becomes the min)."""

    op_types = ("MaxPool",)
    producer_op = "Mul"

    def rewrite(self, model, node):
        mul = node.inputs[0].producer()
        p = new_node(model, "MaxPool", [mul.inputs[0]], "pool0_moved", node, attrs=list(node.attributes.values()))
        out = new_node(model, "Mul", [p, mul.inputs[1]], "mul0_moved", node)
        replace_pair(model, node, mul, out)


class SwapSubOperands(EveryNode):
    """Sub(x, y) → Sub(y, x)  (wrong: Sub does not commute)."""

    op_types = ("Sub",)

    def rewrite(self, model, node):
        x, y = node.inputs[0], node.inputs[1]
        node.replace_input_with(0, y)
        node.replace_input_with(1, x)


class DropTransposeBeforeFlatten(FedBy):
    """Reshape(Transpose(x), [1, -1]) → Reshape(x, [1, -1])  (wrong: the element order changes)."""

    op_types = ("Reshape",)
    producer_op = "Transpose"

    def rewrite(self, model, node):
        tr = node.inputs[0].producer()
        node.replace_input_with(0, tr.inputs[0])
        model.remove_node(tr)


class FoldBatchNormWithoutEpsilon(EveryNode):
    """BatchNormalization → Mul(γ/√var) + Add(β − μγ/√var)  (wrong: √(var + ε))."""

    op_types = ("BatchNormalization",)

    def rewrite(self, model, node):
        gamma, beta, mean, var = (const(model, v) for v in node.inputs[1:5])
        a = (gamma / np.sqrt(var)).astype(np.float32)
        b = (beta - mean * a).astype(np.float32)
        m = new_node(model, "Mul", [node.inputs[0], model.add_initializer(a.reshape(1, -1, 1, 1))], "bn0_mul", node)
        out = new_node(model, "Add", [m, model.add_initializer(b.reshape(1, -1, 1, 1))], "bn0_add", node)
        replace_node(model, node, out)


class GemmToMatMulIgnoringTransB(EveryNode):
    """Gemm(x, W, C, transB=1) → MatMul(x, W) + C  (wrong: W must be transposed)."""

    op_types = ("Gemm",)

    def rewrite(self, model, node):
        mm = new_node(model, "MatMul", [node.inputs[0], node.inputs[1]], "gemm0_mm", node)
        out = new_node(model, "Add", [mm, node.inputs[2]], "gemm0_add", node)
        replace_node(model, node, out)


class ClipToRelu(EveryNode):
    """Clip(x, 0, 6) → Relu(x)  (wrong: the upper bound is lost)."""

    op_types = ("Clip",)

    def rewrite(self, model, node):
        out = new_node(model, "Relu", [node.inputs[0]], "clip0_relu", node)
        replace_node(model, node, out)


class ChangeRoundingMode(EveryNode):
    """Quant rounding_mode ROUND → FLOOR  (wrong: an attribute-only change)."""

    op_types = ("Quant",)

    def rewrite(self, model, node):
        node.attributes["rounding_mode"] = ir.AttrString("rounding_mode", "FLOOR")


class EditWeightInPlace(EveryNode):
    """Scale the MatMul weight in place (wrong, and invisible to the node structure: only its content changes)."""

    op_types = ("MatMul",)

    def rewrite(self, model, node):
        w = model.get_initializer(node.inputs[1].name)
        w *= 1.5


class LyingAddToSub(Transformation):
    """Turn every Add into a Sub, and report that nothing changed (wrong twice)."""

    def apply(self, model):
        for node in model.graph:
            if node.op_type == "Add":
                node.op_type = "Sub"
        return False


@dataclass
class Case:
    """A wrong rewrite: the graph it breaks, the pass, the node the error must name, reference options."""

    build: Callable[[], Model]
    rule: type
    node: str
    reference: dict[str, Any] = field(default_factory=dict)


CASES = [
    Case(add_relu, AddSelf, "add0"),
    Case(int_multithreshold, ThresholdOffByOne, "mt0", {"low": 0, "high": 15}),
    Case(matmul_bias_relu, DropBias, "relu0"),
    Case(lambda: mul_multithreshold(np.float32(-0.5)), AbsorbNegativeMulNoReversal, "mt0"),
    Case(channel_mul_relu, MoveChannelMulWrongAxis, "mul0_moved"),
    Case(lambda: mul_pad(1.0), MoveMulPastPad, "mul0_moved"),
    Case(mul_add, MoveMulPastAddKeepingBias, "mul0_moved"),
    Case(add_conv, MoveAddPastPaddedConv, "add0_moved"),
    Case(two_transposes, ComposeTransposesWrongOrder, "tr01"),
    Case(mul_matmul, MoveVectorMulPastMatMul, "mul0_moved"),
    Case(lambda: two_ops("Mul"), CollapseMulsByAdding, "mul1"),
    Case(lambda: two_ops("Add"), CollapseAddsBySubtracting, "add1"),
    Case(lambda: mul_multithreshold(np.float32(2.5)), AbsorbMulWithoutScaling, "mt0"),
    Case(lambda: mul_multithreshold(np.array([0.1, -0.2, 0.3, 0.4], np.float32).reshape(1, 4, 1, 1), "Add"),
         AbsorbAddWrongSign, "mt0"),
    Case(quant_graph, QuantToThresholdsOffByHalfStep, "q0_scale", {"low": -0.5, "high": 2.5}),
    Case(quant_graph, QuantToThresholdsWithoutScale, "q0_mt", {"low": -0.5, "high": 2.5}),
    Case(lambda: quant_graph(4, True, relu=True), DropReluBeforeQuant, "q0"),
    Case(mul_maxpool, MoveNegativeMulPastMaxPool, "mul0_moved"),
    Case(sub_graph, SwapSubOperands, "sub0"),
    Case(transpose_reshape, DropTransposeBeforeFlatten, "flat0"),
    Case(batchnorm, FoldBatchNormWithoutEpsilon, "bn0_add"),
    Case(gemm, GemmToMatMulIgnoringTransB, "gemm0_add"),
    Case(clip_graph, ClipToRelu, "clip0_relu", {"low": -10, "high": 10}),
    Case(lambda: quant_graph(3, False), ChangeRoundingMode, "q0", {"low": -0.5, "high": 2.5}),
    Case(numpy_weight_matmul, EditWeightInPlace, "mm0"),
    Case(add_relu, LyingAddToSub, "add0"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.rule.__name__ for c in CASES])
def test_wrong_rewrite_is_caught(case: Case, tmp_path: Path) -> None:
    model = case.build()
    ref = ReferenceData.random(model, n=4, seed=7, **case.reference)
    hook = VerificationHook(ref, save_dir=tmp_path)
    with pytest.raises(PassVerificationError) as info:
        PassManager([Stage("wrong", [case.rule])], [hook]).run(model)
    err = info.value
    text = str(err)
    assert err.pass_name == case.rule.__name__ and f"pass '{case.rule.__name__}'" in text
    assert err.node == case.node and f"node '{case.node}'" in text
    assert err.tensor is not None and f"first diverging tensor '{err.tensor}'" in text
    assert err.max_error is not None and err.max_error > 0
    assert isinstance(err, VerificationError) and err.exit_code == 1
    assert Path(err.before_path).is_file() and Path(err.after_path).is_file()
    assert str(err.before_path) in text and str(err.after_path) in text
    # (EditWeightInPlace included: the checks hold a frozen copy of a writable weight, taken before the pass)
    # the saved "before" model is the model before the pass: it still matches the reference outputs
    before = Model(err.before_path)
    from custom_ops.executor import Executor

    got = Executor(before.to_proto()).run(ref.inputs)
    for name, value in ref.outputs().items():
        np.testing.assert_array_equal(got[name], value)


def test_suite_has_at_least_twenty_wrong_rewrites() -> None:
    assert len({c.rule for c in CASES}) >= 20


class DanglingInput(EveryNode):
    """Rewire the Relu to read a tensor nothing produces (structurally wrong)."""

    op_types = ("Relu",)

    def rewrite(self, model, node):
        node.replace_input_with(0, ir.Value(name="ghost"))


class RewireOutput(Transformation):
    """Make the Add's output the graph output instead of the Relu's (changes the model's interface)."""

    def apply(self, model):
        add = model.get_node_from_name("add0")
        model.graph.outputs[0] = add.outputs[0]
        return True


def test_structural_breakage_names_pass_and_node(tmp_path: Path) -> None:
    model = add_relu()
    hook = VerificationHook(ReferenceData.random(model, n=2), save_dir=tmp_path)
    with pytest.raises(PassVerificationError) as info:
        PassManager([Stage("s", [DanglingInput])], [hook]).run(model)
    assert info.value.node == "relu0" and info.value.tensor == "ghost"
    assert "pass 'DanglingInput'" in str(info.value) and "nothing produces" in str(info.value)


def test_interface_change_is_caught(tmp_path: Path) -> None:
    model = add_relu()
    hook = VerificationHook(ReferenceData.random(model, n=2), save_dir=tmp_path)
    with pytest.raises(PassVerificationError, match=r"pass 'RewireOutput'.*interface: outputs \['out'\] -> \['s'\]"):
        PassManager([Stage("s", [RewireOutput])], [hook]).run(model)
