"""The executor's integer fast path (custom_ops.intconv): Im2Col → MatMul run as one Conv when the operands are
small integers. Every case compares the fused plan with the plain plan (Im2Col kernel, then MatMul), bit for bit,
on random inputs; the integer-range analysis is checked on its own, and so are the cases that must not fuse."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from custom_ops.executor import Executor
from custom_ops.intconv import EXACT_LIMIT, conv_weights, integer_ranges
from custom_ops.im2col import conv_output_dim
from finnlite.core.compat import make_model
from finnlite.core.errors import GraphError

DOMAIN = "qonnx.custom_op.general"


def conv_model(h: int, w: int, c: int, cout: int, kernel=(3, 3), stride=(1, 1), pads=(1, 1, 1, 1), pad_value=0,
               dilations=(1, 1), depthwise=False, steps=15, out_bias=0.0, out_scale=1.0, weight_scale=1.0,
               weight_hi=8, seed=0, mt_input=True):
    """x (float) → MultiThreshold (integers 0..steps, + out_bias) → Im2Col → MatMul(integer W) → y."""
    rng = np.random.default_rng(seed)
    kh, kw = kernel
    oh = conv_output_dim(h, kh, stride[0], pads[0] + pads[2], dilations[0])
    ow = conv_output_dim(w, kw, stride[1], pads[1] + pads[3], dilations[1])
    if depthwise:
        cout = c
        wk = rng.integers(-weight_hi, weight_hi, size=(kh, kw, c)).astype(np.float32)
        wmat = np.zeros((kh, kw, c, c), np.float32)
        wmat[:, :, np.arange(c), np.arange(c)] = wk
        wmat = wmat.reshape(kh * kw * c, c)
    else:
        wmat = rng.integers(-weight_hi, weight_hi, size=(kh * kw * c, cout)).astype(np.float32)
    wmat = (wmat * np.float32(weight_scale)).astype(np.float32)
    thresholds = np.sort(rng.uniform(-10, 10, size=(c, steps)), axis=1).astype(np.float32)
    nodes = []
    src = "x"
    if mt_input:
        nodes.append(helper.make_node("MultiThreshold", ["x", "T"], ["a"], domain=DOMAIN, name="mt",
                                      out_dtype="UINT8", data_layout="NHWC", out_bias=float(out_bias),
                                      out_scale=float(out_scale)))
        src = "a"
    nodes += [
        helper.make_node("Im2Col", [src], ["p"], domain=DOMAIN, name="im2col", kernel_size=list(kernel),
                         stride=list(stride), pad_amount=list(pads), pad_value=int(pad_value),
                         dilations=list(dilations), input_shape=f"(1, {h}, {w}, {c})", depthwise=int(depthwise)),
        helper.make_node("MatMul", ["p", "W"], ["y"], name="matmul"),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, h, w, c])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, oh, ow, cout])],
                              [numpy_helper.from_array(thresholds, "T"), numpy_helper.from_array(wmat, "W")])
    return make_model(graph)


def fused_and_plain(model):
    fused = Executor(model)
    plain = Executor(model)
    plain._fused = {}
    plain._plans.clear()
    return fused, plain


def assert_same_bits(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), np.abs(a - b).max()


CASES = [
    dict(h=8, w=8, c=4, cout=6),
    dict(h=9, w=7, c=3, cout=5, stride=(2, 2)),
    dict(h=8, w=8, c=6, cout=6, depthwise=True),
    dict(h=10, w=10, c=8, cout=8, depthwise=True, stride=(2, 2)),
    dict(h=8, w=8, c=4, cout=4, pads=(0, 0, 0, 0)),
    dict(h=8, w=8, c=4, cout=3, pads=(1, 0, 2, 1), pad_value=3),
    dict(h=8, w=8, c=5, cout=5, depthwise=True, pad_value=-2),
    dict(h=11, w=9, c=3, cout=4, kernel=(3, 2), dilations=(2, 1), pads=(2, 1, 2, 1)),
    dict(h=6, w=6, c=7, cout=9, kernel=(1, 1), pads=(0, 0, 0, 0)),
    dict(h=1, w=12, c=3, cout=4, kernel=(1, 3), pads=(0, 1, 0, 1)),
    dict(h=8, w=8, c=4, cout=6, out_bias=-7.0),
    dict(h=8, w=8, c=4, cout=6, out_scale=2.0, out_bias=1.0, steps=3),
    dict(h=8, w=8, c=2, cout=2, steps=1),  # two channels of binary activations: block-diagonal is depthwise
    # K·max|W|·max|x| = 576·128·255 is above 2**24, the largest column sum 9·128·255 is not: the exact bound decides
    dict(h=6, w=6, c=64, cout=64, depthwise=True, steps=255, weight_hi=128),
]


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_fused_conv_is_bit_identical_to_im2col_matmul(case):
    model = conv_model(**case)
    fused, plain = fused_and_plain(model)
    assert len(fused._fused) == 1 and fused._fused[1][2], fused.describe()
    assert "as Conv" in fused.describe()
    rng = np.random.default_rng(1)
    for _ in range(4):
        x = rng.uniform(-12, 12, size=(1, case["h"], case["w"], case["c"])).astype(np.float32)
        x[0, 0, 0, 0] = -0.0
        assert_same_bits(fused.run({"x": x})["y"], plain.run({"x": x})["y"])


def test_zero_sums_are_positive_zero_like_matmul():
    model = conv_model(8, 8, 3, 4, steps=1, out_bias=0.0)
    fused, plain = fused_and_plain(model)
    x = np.full((1, 8, 8, 3), -100.0, np.float32)  # every threshold fails: all activations 0, every sum 0
    y = fused.run({"x": x})["y"]
    assert not np.any(y) and not np.any(np.signbit(y))
    assert_same_bits(y, plain.run({"x": x})["y"])


def test_batches_and_return_all():
    model = conv_model(8, 8, 4, 6, stride=(2, 2))
    fused, plain = fused_and_plain(model)
    x = np.random.default_rng(2).uniform(-12, 12, size=(3, 8, 8, 4)).astype(np.float32)
    assert_same_bits(fused.run({"x": x})["y"], plain.run({"x": x})["y"])
    everything = fused.run({"x": x[:1]}, return_all=True)
    assert "p" in everything  # the Im2Col output exists when every tensor is asked for
    assert any("matmul as Conv" in s.describe() for s in fused._plan(False, True).steps)
    want = plain.run({"x": x[:1]}, return_all=True)
    for name in ("p", "y"):
        assert_same_bits(everything[name], want[name])


@pytest.mark.parametrize("why, case", [
    ("float input", dict(mt_input=False)),
    ("fractional weights", dict(weight_scale=0.5)),
    ("fractional out_bias", dict(out_bias=0.5)),
    ("bound of 2**24", dict(steps=255, weight_hi=2 ** 14)),
])
def test_not_fused_without_an_exact_integer_bound(why, case):
    model = conv_model(8, 8, 4, 6, **case)
    fused, plain = fused_and_plain(model)
    assert fused._fused == {}, why
    x = np.random.default_rng(3).uniform(-12, 12, size=(1, 8, 8, 4)).astype(np.float32)
    assert_same_bits(fused.run({"x": x})["y"], plain.run({"x": x})["y"])


def test_windows_with_another_reader_still_run_and_the_matmul_runs_as_conv():
    model = conv_model(8, 8, 4, 6)
    model.graph.output.append(helper.make_tensor_value_info("p", TensorProto.FLOAT, None))
    fused, plain = fused_and_plain(model)
    (j, _, private), = fused._fused.values()
    assert not private and "matmul as Conv" in fused.describe()
    x = np.random.default_rng(5).uniform(-12, 12, size=(1, 8, 8, 4)).astype(np.float32)
    got, want = fused.run({"x": x}), plain.run({"x": x})
    assert_same_bits(got["y"], want["y"])
    assert_same_bits(got["p"], want["p"])


def test_not_fused_in_float64():
    assert Executor(conv_model(8, 8, 4, 6), dtype=np.float64)._fused == {}


def test_integer_ranges():
    from custom_ops.executor import Executor as E

    ex = E(conv_model(8, 8, 4, 6, steps=15, out_bias=-3.0, pad_value=-5, weight_hi=4))
    ranges = integer_ranges(ex._nodes, ex._ops, ex._constants)
    assert ranges["a"] == (-3.0, 12.0)
    assert ranges["p"] == (-5.0, 12.0)
    w = ex._constants["W"]
    exact = 12.0 * np.abs(w).sum(axis=0).max()  # the largest |y| the ranges may claim no less than
    lo, hi = ranges["y"]
    assert lo == -hi and exact <= hi <= 12.0 * w.shape[0] * np.abs(w).max() < EXACT_LIMIT
    assert "x" not in ranges


def test_conv_weights_dense_and_depthwise():
    rng = np.random.default_rng(4)
    dense = rng.integers(-3, 3, size=(2 * 3 * 4, 5)).astype(np.float32)
    wc, group = conv_weights(dense, (2, 3), 4)
    assert group == 1 and wc.shape == (5, 4, 2, 3)
    assert wc[2, 1, 1, 0] == dense[(1 * 3 + 0) * 4 + 1, 2]
    diag = np.zeros((2, 3, 4, 4), np.float32)
    diag[:, :, np.arange(4), np.arange(4)] = rng.integers(1, 3, size=(2, 3, 4))
    wc, group = conv_weights(diag.reshape(24, 4), (2, 3), 4)
    assert group == 4 and wc.shape == (4, 1, 2, 3)
    assert wc[3, 0, 1, 2] == diag[1, 2, 3, 3]
    for i, j in [(0, 1), (3, 2), (1, 3)]:  # one off-diagonal element anywhere makes it dense
        off = diag.copy()
        off[1, 0, i, j] = 1.0
        assert conv_weights(off.reshape(24, 4), (2, 3), 4)[1] == 1


def test_facts_of_frozen_weights_are_derived_once_and_forgotten_with_them():
    import gc

    from custom_ops import intconv
    from finnlite.core.model import freeze

    calls = []
    frozen = freeze(np.arange(12, dtype=np.float32).reshape(3, 4))
    compute = lambda: calls.append(1) or len(calls)  # noqa: E731
    memo = intconv._FrozenMemo()
    assert memo.get(frozen, ("x",), compute) == 1 and memo.get(frozen.view(), ("x",), compute) == 1
    assert memo.get(frozen[1:], ("x",), compute) == 2  # another view of the memory is another key
    writable = np.zeros(3, np.float32)
    assert memo.get(writable, ("x",), compute) == 3 and memo.get(writable, ("x",), compute) == 4  # never kept
    del frozen
    gc.collect()
    assert memo._entries == {} and memo._watched == set()


def _compact(model):
    """``model`` without its MatMul weight, and that weight as a DepthwiseWeight (it must be block-diagonal)."""
    from onnx import numpy_helper

    from finnlite.core.tensors import DepthwiseWeight

    proto = type(model)()
    proto.CopyFrom(model)
    init = next(t for t in proto.graph.initializer if t.name == "W")
    w = numpy_helper.to_array(init)
    c = w.shape[1]
    k = w.shape[0] // c
    kernel = w.reshape(k, c, c)[:, np.arange(c), np.arange(c)].T.reshape(c, *_kernel_of(proto))
    proto.graph.initializer.remove(init)
    return proto, DepthwiseWeight(kernel)


def _kernel_of(proto):
    node = next(n for n in proto.graph.node if n.op_type == "Im2Col")
    return tuple(next(a.ints for a in node.attribute if a.name == "kernel_size"))


@pytest.mark.parametrize("case, fused", [
    (dict(h=8, w=8, c=6, cout=6, depthwise=True), True),
    (dict(h=10, w=10, c=8, cout=8, depthwise=True, stride=(2, 2), kernel=(3, 2), pads=(1, 0, 1, 1)), True),
    (dict(h=8, w=8, c=5, cout=5, depthwise=True, pad_value=-2), True),
    (dict(h=8, w=8, c=4, cout=4, depthwise=True, mt_input=False), False),  # float input: no exact bound
    (dict(h=8, w=8, c=4, cout=4, depthwise=True, weight_scale=0.5), False),  # fractional weights
])
def test_a_compact_depthwise_weight_computes_what_the_dense_one_does(case, fused, monkeypatch):
    """Given as a DepthwiseWeight, a depthwise weight runs fused on its kernel without the dense matrix ever being
    made; where the pair cannot be fused the matrix is made once. Either way every bit is what the dense weight
    gives, in float32, in batches, with return_all and in float64."""
    import finnlite.core.tensors as tensors

    made = []
    real = tensors._dense_tensor
    monkeypatch.setattr(tensors, "_dense_tensor", lambda k: made.append(k) or real(k))  # before the weight binds it
    model = conv_model(**case)
    proto, weight = _compact(model)
    compact = Executor(proto, constants={"W": weight})
    dense = Executor(model)
    assert bool(compact._fused) == fused == bool(dense._fused)
    rng = np.random.default_rng(5)
    x = rng.uniform(-12, 12, size=(3, case["h"], case["w"], case["c"])).astype(np.float32)
    assert_same_bits(compact.run({"x": x})["y"], dense.run({"x": x})["y"])
    got, want = compact.run({"x": x[:1]}, return_all=True), dense.run({"x": x[:1]}, return_all=True)
    for name in want:
        if name != "W" or not fused:
            assert_same_bits(got[name], want[name])
    assert ("W" in got) == (not fused) and len(made) == (0 if fused else 1)
    wide = Executor(proto, dtype=np.float64, constants={"W": weight})
    np.testing.assert_array_equal(wide.run({"x": x})["y"], Executor(model, dtype=np.float64).run({"x": x})["y"])


def test_conv_weights_of_a_compact_depthwise_weight_are_its_kernel():
    from finnlite.core.tensors import DepthwiseWeight, depthwise_matrix

    kernel = np.random.default_rng(0).integers(-3, 4, size=(6, 3, 3)).astype(np.float32)
    t = DepthwiseWeight(kernel)
    w, group = conv_weights(t, (3, 3), 6)
    want, want_group = conv_weights(depthwise_matrix(kernel), (3, 3), 6)
    assert group == want_group == 6 and np.array_equal(w, want) and np.shares_memory(w, t.kernel)


def test_outputs_asked_for_run_on_the_same_executor():
    """``run(outputs=...)``: any tensor, a fused pair's window included, from the executor already built."""
    model = conv_model(8, 8, 4, 6)
    fused, plain = fused_and_plain(model)
    x = np.random.default_rng(6).uniform(-12, 12, size=(2, 8, 8, 4)).astype(np.float32)
    got = fused.run({"x": x}, outputs=["p", "y"])
    want = plain.run({"x": x}, return_all=True)
    assert sorted(got) == ["p", "y"]
    for name in ("p", "y"):
        assert_same_bits(got[name], want[name])
    assert sorted(fused.run({"x": x[:1]}, outputs=["y"])) == ["y"]  # a plan of its own: the pair stays fused
    with pytest.raises(GraphError, match="no tensor of this name"):
        fused.run({"x": x}, outputs=["nope"])
