"""Quantized weights in memory: regions run their nodes in the order given (a weight quantizer right before the
layer reading it, not all of them first)."""

from __future__ import annotations

import json
import os

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from custom_ops.plan import session_options
from finnlite.core.compat import IR_VERSION, QONNX_DOMAIN, fix_ir_version, make_model


def _layers(rng: np.random.Generator, sizes: list[int], quant: bool) -> object:
    """x → MatMul(x, Q(w_k)) for each k: ``Q`` a qonnx Quant (``quant``) or a Div by a scale."""
    nodes, inits = [], []
    x = "x"
    for k, n in enumerate(sizes):
        inits += [numpy_helper.from_array(rng.normal(size=(n, n)).astype(np.float32), f"w{k}"),
                  numpy_helper.from_array(np.float32(0.25), f"s{k}")]
        if quant:
            inits += [numpy_helper.from_array(np.float32(0.0), f"z{k}"),
                      numpy_helper.from_array(np.float32(4.0), f"b{k}")]
            nodes.append(helper.make_node("Quant", [f"w{k}", f"s{k}", f"z{k}", f"b{k}"], [f"q{k}"], name=f"quant{k}",
                                          domain=QONNX_DOMAIN, signed=1, narrow=1, rounding_mode="ROUND"))
        else:
            nodes.append(helper.make_node("Div", [f"w{k}", f"s{k}"], [f"q{k}"], name=f"quant{k}"))
        nodes.append(helper.make_node("MatMul", [x, f"q{k}"], [f"y{k}"], name=f"mm{k}"))
        x = f"y{k}"
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "layers", [vi("x", TensorProto.FLOAT, [2, sizes[0]])],
                              [vi(x, TensorProto.FLOAT, [2, sizes[-1]])], inits)
    return make_model(graph)


def test_regions_run_their_nodes_in_the_order_given(tmp_path):
    model = fix_ir_version(_layers(np.random.default_rng(0), [8] * 4, quant=False), IR_VERSION)
    opts = session_options()
    opts.enable_profiling = True
    opts.profile_file_prefix = str(tmp_path / "order")
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    session.run(None, {"x": np.ones((2, 8), np.float32)})
    path = session.end_profiling()
    with open(path) as f:
        events = json.load(f)
    os.remove(path)
    order = [e["name"][: -len("_kernel_time")] for e in events
             if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    # onnxruntime's default order runs quant3, quant2, quant1, quant0 first: every quantized weight alive at once
    assert order == ["quant0", "mm0", "quant1", "mm1", "quant2", "mm2", "quant3", "mm3"]


def test_arrays_survive_the_arena_giving_memory_back():
    """:func:`custom_ops.plan.release_arena` frees only blocks no array uses: a result held across it keeps its
    values while later runs reuse the arena, and executors old and new compute the same after it."""
    from custom_ops.executor import Executor
    from custom_ops.plan import release_arena

    rng = np.random.default_rng(3)
    model = fix_ir_version(_layers(rng, [64] * 3, quant=True), IR_VERSION)
    ex = Executor(model)
    xs = [rng.normal(size=(2, 64)).astype(np.float32) for _ in range(3)]
    held = ex.run({"x": xs[0]}, return_all=True)
    copies = {k: np.array(v, copy=True) for k, v in held.items()}
    release_arena()
    later = [ex.run({"x": x}, return_all=True) for x in xs[1:]]  # allocate from the shrunk arena
    for k, v in copies.items():
        assert np.array_equal(held[k], v), k
    fresh = Executor(model)
    for x, got in zip(xs[1:], later):
        again = fresh.run({"x": x}, return_all=True)
        assert all(np.array_equal(again[k], got[k]) for k in got)
    assert not np.array_equal(later[0]["y2"], held["y2"])  # the inputs differ: the runs are not all one
