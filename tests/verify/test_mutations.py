"""Mutation testing of the final check: small faults planted in correct streamlined models must all be caught, each
failure naming the faulty tensor or node.

Kinds (each a real fault, chosen so that some input in the tensor's range shows it): ``threshold`` (one threshold
of one channel of a MultiThreshold on an integer input moved by ±1, inside the input's range), ``weight`` (one
element of an integer weight changed, within its datatype), ``tail_scale`` (the output Mul x1.001), ``tail_bias``
(the output Add + 0.3 step), ``permuted_channel`` (two output channels of a layer's weight swapped),
``annotation_act`` (an activation's finn_datatype narrowed or made BIPOLAR where it
holds 0), ``annotation_weight`` (likewise on a weight), ``out_dtype`` (a MultiThreshold's out_dtype). The zoo
variant runs on the small zoo models (tfc_1w1a, tfc_2w2a, cnv_1w1a, cnv_2w2a; skipped, saying so, when the zoo is
absent; the larger ones are marked slow); the code-built variant on a TFC-style MLP from
:func:`finnlite.examples.build_tfc`, so the fast suite always runs it. A table of kinds x caught x named is printed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from finnlite import Model
from finnlite.build import make_reference, streamline
from finnlite.config import Config
from finnlite.core.datatypes import DataType, is_integer_type
from finnlite.core.errors import VerificationError
from tests.zoo import manifest, zoo_model_path
from verify import final_check

KINDS = ("threshold", "weight", "tail_scale", "tail_bias", "annotation_act", "annotation_weight", "out_dtype",
         "permuted_channel")


# -- helpers on the streamlined ModelProto ----------------------------------------------------------------------------
def _inits(proto: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    return {t.name: t for t in proto.graph.initializer}


def _set_init(proto: onnx.ModelProto, name: str, arr: np.ndarray) -> None:
    t = _inits(proto)[name]
    t.CopyFrom(numpy_helper.from_array(arr.astype(numpy_helper.to_array(t).dtype), name))


def _dtype(proto: onnx.ModelProto, name: str) -> str | None:
    for qa in proto.graph.quantization_annotation:
        if qa.tensor_name == name:
            for kv in qa.quant_parameter_tensor_names:
                if kv.key == "finn_datatype":
                    return kv.value
    return None


def _set_dtype(proto: onnx.ModelProto, name: str, dt: str) -> None:
    for qa in proto.graph.quantization_annotation:
        if qa.tensor_name == name:
            for kv in qa.quant_parameter_tensor_names:
                if kv.key == "finn_datatype":
                    kv.value = dt
                    return
    qa = proto.graph.quantization_annotation.add(tensor_name=name)
    qa.quant_parameter_tensor_names.add(key="finn_datatype", value=dt)


def _attr(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _int_mts(proto: onnx.ModelProto) -> list[onnx.NodeProto]:
    """MultiThresholds whose input is an integer tensor (not the first layer on a float input)."""
    return [n for n in proto.graph.node if n.op_type == "MultiThreshold"
            and is_integer_type(DataType[_dtype(proto, n.input[0]) or "FLOAT32"])]


def _narrower(values: np.ndarray) -> str:
    """A datatype that does not hold ``values``: BIPOLAR if they hold 0, else one bit too few."""
    v = np.asarray(values, np.float64)
    if (v == 0).any():
        return "BIPOLAR"
    if v.min() >= 0:
        return "BINARY" if v.max() > 1 else "BIPOLAR"
    bits = max(int(np.ceil(np.log2(max(-v.min(), v.max() + 1)))) + 1, 2)
    return f"INT{bits - 1}" if bits > 2 else "UINT2"


def _one_bit_short(lo: float, hi: float) -> str:
    """The narrowest INTn/UINTn holding ``[lo, hi]``, one bit narrower (as a wrongly sized accumulator)."""
    from finnlite.core.datatypes import smallest_int_type

    dt = smallest_int_type(lo, hi)
    bits = dt.bitwidth()
    if bits <= 2:
        return "BINARY" if not dt.signed() else "BIPOLAR"
    return f"{'INT' if dt.signed() else 'UINT'}{bits - 1}"


# -- the mutants -------------------------------------------------------------------------------------------------------
def _pick(items: list[Any], variant: int) -> Any:
    """The first, the last and the middle of ``items`` for variants 0, 1, 2, ... (cycling)."""
    order = [0, len(items) - 1, len(items) // 2]
    return items[order[variant % 3]]


def _acc_range(proto: onnx.ModelProto, name: str) -> tuple[float, float]:
    """The range an integer MultiThreshold input can take: from the graph (weights and input levels), else its
    datatype's."""
    from verify.annotations import derived_ranges

    found = derived_ranges(Model(proto, check=False)).get(name)
    if found is not None:
        return found[0], found[1]
    dt = DataType[_dtype(proto, name)]
    return float(dt.min()), float(dt.max())


def mutate(kind: str, proto: onnx.ModelProto, variant: int = 0) -> set[str]:
    """Plant a fault of ``kind`` in ``proto`` (edited in place; ``variant`` chooses where, and the sign); the names
    of the faulty tensor and node that a report may give."""
    rng = np.random.default_rng(variant)
    sign = 1 if variant % 2 == 0 else -1
    inits = _inits(proto)
    nodes = list(proto.graph.node)
    layers = [n for n in nodes if n.op_type in ("MatMul", "XnorPopcountMatMul") and n.input[1] in inits]
    if kind == "threshold":
        node = _pick(_int_mts(proto), variant)
        thr = numpy_helper.to_array(inits[node.input[1]]).astype(np.float64)
        lo, hi = _acc_range(proto, node.input[0])
        # a threshold inside the input's range, moved by one: some integer input changes level
        inside = np.flatnonzero((thr > lo + 1) & (thr < hi - 1))
        c, k = np.unravel_index(int(rng.choice(inside)), thr.shape)
        thr[c, k] += sign
        _set_init(proto, node.input[1], thr)
        return {node.name, node.input[1], node.output[0]}
    if kind == "weight":
        node = _pick(layers[1:], variant)  # not the first layer: it may read a float input
        w = numpy_helper.to_array(inits[node.input[1]]).astype(np.float64)
        dt = DataType[_dtype(proto, node.input[1])]
        nonzero = np.flatnonzero(w.reshape(-1) != 0) if dt.name not in ("BIPOLAR", "BINARY") else np.arange(w.size)
        idx = np.unravel_index(int(rng.choice(nonzero)), w.shape)
        if dt.name == "BIPOLAR":
            w[idx] = -w[idx]
        elif dt.name == "BINARY":
            w[idx] = 1 - w[idx]
        else:
            w[idx] = w[idx] + sign if dt.min() <= w[idx] + sign <= dt.max() else w[idx] - sign
        _set_init(proto, node.input[1], w)
        return {node.name, node.input[1], node.output[0]}
    if kind == "permuted_channel":  # two output channels of a layer swapped (columns that differ)
        node = _pick(layers[1:], variant)
        w = numpy_helper.to_array(inits[node.input[1]]).astype(np.float64)
        a = 0
        b = next(c for c in range(1, w.shape[1]) if not np.array_equal(w[:, c], w[:, a]))
        w[:, [a, b]] = w[:, [b, a]]
        _set_init(proto, node.input[1], w)
        return {node.name, node.input[1], node.output[0]}
    if kind == "tail_bias" and not any(n.op_type == "Add" for n in nodes):  # a tail without bias: give it one
        mul = [n for n in nodes if n.op_type == "Mul"][-1]
        out = mul.output[0]
        mul.output[0] = out + "_unbiased"
        scale = np.abs(numpy_helper.to_array(inits[mul.input[1]]).astype(np.float32))
        proto.graph.initializer.append(numpy_helper.from_array(sign * 0.3 * scale, out + "_bias"))
        proto.graph.node.append(helper.make_node("Add", [mul.output[0], out + "_bias"], [out], name="planted_add"))
        return {"planted_add", out + "_bias", out}
    if kind in ("tail_scale", "tail_bias"):
        op = "Mul" if kind == "tail_scale" else "Add"
        node = [n for n in nodes if n.op_type == op][-1]
        mul = [n for n in nodes if n.op_type == "Mul"][-1]
        c = numpy_helper.to_array(inits[node.input[1]]).astype(np.float64)
        scale = np.abs(numpy_helper.to_array(inits[mul.input[1]]).astype(np.float64))
        _set_init(proto, node.input[1], c * (1 + sign * 0.001) if kind == "tail_scale" else c + sign * 0.3 * scale)
        return {node.name, node.input[1], node.output[0], proto.graph.output[0].name}
    if kind == "annotation_act":
        if variant % 2 == 0:  # an integer accumulator
            node = _pick([n for n in layers if is_integer_type(DataType[_dtype(proto, n.output[0]) or "FLOAT32"])],
                         variant // 2)
            lo, hi = _acc_range(proto, node.output[0])
            _set_dtype(proto, node.output[0], _one_bit_short(lo, hi))
        else:  # a MultiThreshold's output
            node = _pick(_int_mts(proto), variant // 2)
            n = numpy_helper.to_array(inits[node.input[1]]).shape[-1]
            levels = float(_attr(node, "out_bias", 0.0)) + float(_attr(node, "out_scale", 1.0)) * np.arange(n + 1)
            _set_dtype(proto, node.output[0], _narrower(levels))
        return {node.name, node.output[0]}
    if kind == "annotation_weight":
        node = _pick(layers, variant)
        w = numpy_helper.to_array(inits[node.input[1]])
        _set_dtype(proto, node.input[1], _narrower(w))
        return {node.name, node.input[1]}
    if kind == "out_dtype":
        node = _pick(_int_mts(proto), variant)
        n = numpy_helper.to_array(inits[node.input[1]]).shape[-1]
        levels = float(_attr(node, "out_bias", 0.0)) + float(_attr(node, "out_scale", 1.0)) * np.arange(n + 1)
        wrong = _narrower(levels)
        for a in node.attribute:
            if a.name == "out_dtype":
                a.s = wrong.encode()
        return {node.name, node.output[0]}
    raise ValueError(kind)


def run_mutants(original: Model, streamlined: onnx.ModelProto, reference: Any, kinds: tuple[str, ...] = KINDS,
                variants: int = 3) -> dict[str, list[tuple[bool, bool, str]]]:
    """``variants`` mutants of each kind of ``streamlined`` through the final check against ``original``: per kind,
    ``(caught, named, message)`` of each (named: the error's node or tensor is the faulty one)."""
    table: dict[str, list[tuple[bool, bool, str]]] = {}
    for kind in kinds:
        for variant in range(variants):
            proto = onnx.ModelProto()
            proto.CopyFrom(streamlined)
            names = mutate(kind, proto, variant)
            result = final_check(reference, Model(proto, check=False))
            if result.ok:
                table.setdefault(kind, []).append((False, False, f"not caught ({sorted(names)[0]})"))
                continue
            with pytest.raises(VerificationError) as info:
                result.raise_for_errors()
            err = info.value
            table.setdefault(kind, []).append((True, bool({err.node, err.tensor} & names), str(err)))
    return table


def _print_table(title: str, table: dict[str, list[tuple[bool, bool, str]]]) -> None:
    print(f"\n{title}\n  {'kind':18s} mutants caught named  first message")
    for kind, rows in table.items():
        caught, named = sum(r[0] for r in rows), sum(r[1] for r in rows)
        print(f"  {kind:18s} {len(rows):7d} {caught:6d} {named:5d}  {rows[0][2][:110]}")


def _check(title: str, original: Model, streamlined: onnx.ModelProto, reference: Any,
           kinds: tuple[str, ...] = KINDS) -> None:
    assert final_check(reference, Model(streamlined, check=False)).ok, "the unmutated model fails"
    table = run_mutants(original, streamlined, reference, kinds)
    _print_table(title, table)
    missed = [(k, msg) for k, rows in table.items() for caught, named, msg in rows if not (caught and named)]
    assert not missed, f"{title}: not caught or not named: {missed}"


# -- the code-built variant (always runs) -----------------------------------------------------------------------------
@pytest.mark.parametrize("large", [False, True])
def test_mutants_of_a_code_built_mlp(large: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """``large``: the final check as on a large input (ImageNet's, ``verify.proofs.LARGE_INPUT``), which proves a
    convolution's thresholds on one sample; a dense layer has one value per channel in a sample, and its thresholds
    are still proved on every sample (on one, a threshold off by one went unseen)."""
    from finnlite.examples import build_tfc

    if large:
        monkeypatch.setattr("verify.proofs.LARGE_INPUT", 1)

    source = build_tfc(wbits=2, abits=2, seed=3)
    original = Model(source)
    work = Model(source)
    report = streamline(work, verify="off", extras=False)
    assert report.ok
    reference, _ = make_reference(original, Config(), samples=8)
    _check("code-built TFC (2w2a)", original, work.to_proto(), reference)


#: the kinds whose facts are proved without the samples (a threshold's proof checks its accumulator's map against
#: them: :func:`test_threshold_mutants_on_a_narrow_input_range`)
RANGE_FREE_KINDS = tuple(k for k in KINDS if k != "threshold")


def _narrow(low: float, high: float, kinds: tuple[str, ...]) -> None:
    from finnlite.examples import build_tfc

    source = build_tfc(wbits=2, abits=2, seed=3)
    original = Model(source)
    work = Model(source)
    assert streamline(work, verify="off", extras=False).ok
    reference, _ = make_reference(original, Config(), samples=8, input_range=(low, high))
    _check(f"code-built TFC (2w2a), inputs in [{low:g}, {high:g}]", original, work.to_proto(), reference, kinds)


@pytest.mark.parametrize("low, high", [(-1.0, 1.0), (0.0, 0.05), (0.5, 0.52)])
def test_mutants_are_caught_whatever_the_input_range(low: float, high: float) -> None:
    """The same mutants, checked on reference samples from a narrow input range (on which most of them change no
    output): the facts that do not depend on the samples are proved — the weights (a changed element, two channels
    swapped) against the original's, the datatype claims against the ranges derived from the graph, the output
    dequantization against the original's as numbers — so each mutant is caught, and named, whatever the range."""
    _narrow(low, high, RANGE_FREE_KINDS)


@pytest.mark.parametrize("low, high", [(0.0, 0.05), (0.5, 0.52)])
def test_threshold_mutants_on_a_narrow_input_range(low: float, high: float) -> None:
    """A threshold off by one, on reference samples from a narrow input range: a channel's accumulator takes too
    few values there to fit its map to the original's quantizer input, and the proof takes the map its real
    thresholds record (``verify.derived_map``) instead, so the threshold is proved wrong whatever the samples."""
    _narrow(low, high, ("threshold",))


# -- the zoo variant ---------------------------------------------------------------------------------------------------
def _zoo(name: str) -> None:
    path = zoo_model_path(name)
    original = Model(path)
    work = Model(path)
    report = streamline(work, verify="off", extras=False)
    assert report.ok
    lo, hi = manifest()[name]["input_range"]  # as a user gives --input-range (mobilenet's is not in the model)
    reference, _ = make_reference(original, Config(), samples=8, input_range=(lo, hi))
    _check(name, original, work.to_proto(), reference)


@pytest.mark.zoo
@pytest.mark.parametrize("name", ["tfc_1w1a", "tfc_2w2a", "cnv_1w1a", "cnv_2w2a"])
def test_mutants_of_small_zoo_models(name: str) -> None:
    _zoo(name)


@pytest.mark.zoo
@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18_4w4a_ts", "mobilenet_v1_4b"])
def test_mutants_of_large_zoo_models(name: str) -> None:
    _zoo(name)


# -- what each part of the final check adds ------------------------------------------------------------------------
#: a part of the final check switched off (final_check's keyword), and the kinds of mutant only it catches
PARTS = {"annotations": ({"annotations": False}, ("annotation_act", "annotation_weight", "out_dtype")),
         "proofs": ({"proofs": False}, ("threshold", "weight")),
         "tail": ({"tail_samples": 0}, ("tail_scale", "tail_bias"))}


@pytest.mark.parametrize("part", sorted(PARTS))
def test_each_part_of_the_final_check_catches_mutants_the_others_miss(part: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """With one part switched off (the datatype claims, the proofs of thresholds and weights, or the output
    dequantization as numbers), some mutants of its kinds pass the rest of the check on the code-built TFC, which
    the whole check catches (:func:`test_mutants_are_caught_whatever_the_input_range`): each part is on the default
    path for faults nothing else sees. The samples are from a narrow input range, as a user's real inputs may be."""
    from functools import partial

    from finnlite.examples import build_tfc

    source = build_tfc(wbits=2, abits=2, seed=3)
    original, work = Model(source), Model(source)
    assert streamline(work, verify="off", extras=False).ok
    reference, _ = make_reference(original, Config(), samples=8, input_range=(0.0, 0.05))
    off, kinds = PARTS[part]
    monkeypatch.setattr(f"{__name__}.final_check", partial(final_check, **off))
    table = run_mutants(original, work.to_proto(), reference, kinds)
    for kind in kinds:
        assert not all(caught for caught, _, _ in table[kind]), f"without {part}, every {kind} mutant is still caught"
