"""Builders and checks for the QCDQ/QDQ import tests: small QDQ graphs in code, onnxruntime runs of the original,
and the check that a streamlined model is integer-only and agrees with onnxruntime's execution of the original."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from custom_ops.executor import Executor
from finnlite import Model
from finnlite.core.compat import fix_ir_version, ort_session
from streamline.pipeline import streamline_model
from verify import ReferenceData, VerificationHook, final_check
from finnlite.float_report import float_report

#: numpy type and ONNX type of each quantized element type the tests use
QTYPES = {"int8": TensorProto.INT8, "uint8": TensorProto.UINT8, "int4": TensorProto.INT4,
          "uint4": TensorProto.UINT4, "int16": TensorProto.INT16, "int32": TensorProto.INT32}
OPSET = 21


def qdq_nodes(x: str, y: str, scale: Any, zero: Any, qtype: str, *, axis: int | None = None,
              clip: tuple[int | None, int | None] | None = None, prefix: str | None = None,
              dq_scale: Any = None) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """``x → QuantizeLinear → [Clip] → DequantizeLinear → y`` (nodes named ``<prefix>_q``, ``_clip``, ``_dq``) and
    its initializers; ``dq_scale`` gives the DequantizeLinear a different scale (a requantization)."""
    p = prefix or y
    scale = np.asarray(scale, np.float32)
    zero = np.asarray(zero)
    kind = QTYPES[qtype]
    inits = [numpy_helper.from_array(scale, f"{p}_scale"),
             helper.make_tensor(f"{p}_zero", kind, list(zero.shape), zero.reshape(-1).astype(np.int64).tolist())]
    kw = {} if axis is None else {"axis": axis}
    nodes = [helper.make_node("QuantizeLinear", [x, f"{p}_scale", f"{p}_zero"], [f"{p}_q"], name=f"{p}_q", **kw)]
    q = f"{p}_q"
    if clip is not None:
        names = []
        for k, bound in zip(("lo", "hi"), clip):
            if bound is None:
                names.append("")
                continue
            inits.append(helper.make_tensor(f"{p}_clip_{k}", kind, [], [int(bound)]))
            names.append(f"{p}_clip_{k}")
        nodes.append(helper.make_node("Clip", [q, *names], [f"{p}_c"], name=f"{p}_clip"))
        q = f"{p}_c"
    s_dq = f"{p}_scale"
    if dq_scale is not None:
        inits.append(numpy_helper.from_array(np.asarray(dq_scale, np.float32), f"{p}_scale_dq"))
        s_dq = f"{p}_scale_dq"
    nodes.append(helper.make_node("DequantizeLinear", [q, s_dq, f"{p}_zero"], [y], name=f"{p}_dq", **kw))
    return nodes, inits


def model_of(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], inputs: dict[str, Sequence[int]],
             outputs: dict[str, Sequence[int] | None]) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "qdq", [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v)) for k, v in inputs.items()],
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, None if v is None else list(v))
         for k, v in outputs.items()], initializer=inits)
    return fix_ir_version(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]))


def ort_runner(proto: onnx.ModelProto) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """onnxruntime's execution of ``proto`` (graph optimizations off: every node computes what ONNX defines)."""
    sess = ort_session(proto)
    names = [o.name for o in sess.get_outputs()]
    return lambda inputs: dict(zip(names, sess.run(names, inputs)))


def samples(model: onnx.ModelProto | Model, n: int, seed: int, lo: float = -1.0, hi: float = 1.0
            ) -> dict[str, np.ndarray]:
    """``n`` uniform samples per data input, stacked along the batch axis."""
    return dict(ReferenceData.random(Model(model) if not isinstance(model, Model) else model, n=n, seed=seed,
                                     low=lo, high=hi).inputs)


@dataclass
class Outcome:
    """What :func:`streamline_and_check` found."""

    model: Model
    integer_only: bool
    float_nodes: list[str]
    samples: int
    exact: int                 # samples on which every output equals onnxruntime's bit for bit
    unexplained: list[int]     # samples whose dequantized outputs differ from onnxruntime's and are not float32
    #                            near-ties of the original
    max_steps: float           # largest output deviation from onnxruntime, in output quantization steps
    max_rel: float             # largest deviation of a float output (not dequantized), relative to its magnitude
    nodes_before: int
    nodes_after: int


def output_steps(proto: onnx.ModelProto) -> dict[str, float]:
    """The quantization step of each output produced by a DequantizeLinear with a scalar scale (else 0)."""
    inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    consts = {n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in proto.graph.node
              if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"}
    inits.update(consts)
    producers = {o: n for n in proto.graph.node for o in n.output}
    steps = {}
    for out in proto.graph.output:
        p = producers.get(out.name)
        s = inits.get(p.input[1]) if p is not None and p.op_type == "DequantizeLinear" else None
        steps[out.name] = float(np.max(s)) if s is not None else 0.0
    return steps


def streamline_and_check(proto: onnx.ModelProto, inputs: dict[str, np.ndarray], *, ort_reference: bool = True
                         ) -> Outcome:
    """Streamline ``proto`` with per-pass verification on ``inputs``, run the final check against the oracle's
    float32/float64 execution of the original (exact in integer tensors; raises otherwise), and, with
    ``ort_reference``, compare the outputs with onnxruntime's execution of the QDQ original: the deviation in
    output steps and the number of bit-exact samples."""
    model = Model(proto)
    nodes_before = len(model)
    ref = ReferenceData(model, inputs)
    result = streamline_model(model, hooks=[VerificationHook(ref)])
    final = final_check(ref, model)
    final.raise_for_errors()
    report = float_report(model, result.report)
    n = ref.num_samples
    exact, max_steps, max_rel, differ = n, 0.0, 0.0, []
    if ort_reference:
        b0 = ref.specs[0].batch0
        got = Executor(model).run(inputs)
        steps = output_steps(proto)
        exact = 0
        differ = []
        run = ort_runner(proto)
        for i in range(n):
            one = {k: v[i * b0:(i + 1) * b0] for k, v in inputs.items()}
            want = run(one)
            same, levels_same = True, True
            for name, w in want.items():
                g = got[name][i * b0:(i + 1) * b0]
                equal = bool(np.array_equal(g, w))
                same &= equal
                d = float(np.max(np.abs(g.astype(np.float64) - w))) if w.size else 0.0
                step = steps.get(name) or 0.0
                if step:
                    max_steps = max(max_steps, d / step)
                    levels_same &= equal
                else:  # a float output (no DequantizeLinear at the end): relative to its magnitude
                    max_rel = max(max_rel, d / max(float(np.max(np.abs(w))), 1e-30))
            exact += int(same)
            if not levels_same:
                differ.append(i)
    ties = set(final.near_tie_samples) | set(final.float_layer_tie_samples)
    return Outcome(model, report.integer_only, report.names(), n, exact, [i for i in differ if i not in ties],
                   max_steps, max_rel, nodes_before, len(model))
