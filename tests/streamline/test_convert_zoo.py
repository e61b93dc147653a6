"""Acceptance of the convert stage on the six zoo models (real Brevitas exports).

What is checked, precisely:

* ``scale_placement="before"`` (convert stage alone, on the raw export): no Quant, BipolarQuant or Trunc left, no
  misses, and the outputs on 32 random inputs from the manifest's ranges (one batch) are **bit-identical** to the
  original's in the executor (float32). All six models.
* The default pipeline (tidy, then convert with FINN's ``scale_placement="after"``): nothing left, no misses;
  **bit-identical** outputs on 32 inputs for the four BNN-PYNQ models, whose scales are powers of two. For
  mobilenet and resnet18, whose weight scales are arbitrary floats, moving a scale past a convolution changes the
  float32 rounding of its sums (and tidy's Gemm → MatMul + Add changes the last bit of the classifier), so the
  outputs are not bit-identical; there the test keeps every intermediate tensor (32 inputs for resnet18, 4 for
  the slower mobilenet) and requires that the
  first quantizer (in graph order) whose output differs from the original's differs only at near-ties — inputs
  whose ``x/s`` lies within 1e-3 of a rounding boundary — and that the predicted classes agree. (The algebra of
  "after" is checked exactly, in float64, in ``test_convert_weights.py``.)
* Annotations: every MultiThreshold output is annotated with its ``out_dtype`` and holds only values it allows;
  every integer-annotated initializer holds allowed values.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

from custom_ops.executor import Executor
from finnlite import Model
from finnlite.core.datatypes import DataType
from streamline.convert import convert
from streamline.pipeline import streamline_model
from streamline.thresholds import float32_to_key
from tests.streamline.convert_helpers import assert_same
from tests.zoo import ZOO_MODELS, random_input, zoo_model_path

pytestmark = pytest.mark.zoo
QUANTIZERS = {"Quant", "IntQuant", "BipolarQuant", "Trunc"}
POW2_MODELS = ("tfc_1w1a", "tfc_2w2a", "cnv_1w1a", "cnv_2w2a")
BATCH = 32


def _batch(name: str, n: int = BATCH) -> np.ndarray:
    return random_input(name, seed=1234, batch=n)


#: inputs for the near-tie analysis of the default pipeline (every intermediate tensor is kept): mobilenet's
#: converted graph runs slowly in the executor (a MultiThreshold compares with every threshold), so it gets 4
_TIE_BATCH = {"mobilenet_v1_4b": 4, "resnet18_4w4a_ts": BATCH}


@lru_cache(maxsize=None)
def _original_all(name: str, n: int) -> dict[str, np.ndarray]:
    model = Model(zoo_model_path(name))
    return Executor(model).run({model.input_names[0]: _batch(name, n)}, return_all=True)


def _original_outputs(name: str) -> dict[str, np.ndarray]:
    if _TIE_BATCH.get(name) == BATCH:  # shared with the near-tie analysis
        everything = _original_all(name, BATCH)
    else:
        model = Model(zoo_model_path(name))
        everything = Executor(model).run({model.input_names[0]: _batch(name)})
    return {k: everything[k] for k in Model(zoo_model_path(name)).output_names}


def _run(model: Model, x: np.ndarray, **kwargs) -> dict[str, np.ndarray]:
    return Executor(model).run({model.input_names[0]: x}, **kwargs)


def _check_annotations(model: Model, values: dict[str, np.ndarray] | None = None) -> None:
    for node in model.graph:
        if node.op_type == "MultiThreshold":
            name = node.outputs[0].name
            dt = model.get_tensor_datatype(name)
            assert dt.name == node.attributes["out_dtype"].value and dt.is_integer(), (name, dt)
            if values is not None:
                assert np.all(dt.allowed(values[name])), (name, dt)
    for name, v in model.graph.initializers.items():
        if model.has_tensor_datatype(name) and model.get_tensor_datatype(name).is_integer():
            assert np.all(model.get_tensor_datatype(name).allowed(v.const_value.numpy())), name


_PARAMS = [pytest.param(n, marks=pytest.mark.slow) if n == "mobilenet_v1_4b" else n for n in ZOO_MODELS]


@pytest.mark.parametrize("name", _PARAMS)
def test_zoo_convert_is_bit_exact(name):
    model = Model(zoo_model_path(name))
    report = convert(model, scale_placement="before")
    hist = model.op_histogram()
    assert not QUANTIZERS & set(hist), hist
    assert not report.misses, report.misses
    assert hist.get("MultiThreshold", 0) > 0
    _check_annotations(model)
    got = _run(model, _batch(name))
    for out, want in _original_outputs(name).items():
        assert_same(got[out], want, f"{name}:{out}")
        assert np.array_equal(got[out].view(np.uint32), want.view(np.uint32))  # not even a signed zero differs


def _first_divergence(original: Model, r0: dict, r1: dict) -> tuple[str, int] | None:
    """The first activation quantizer of ``original`` (graph order) whose output differs between the runs, after
    checking that all its differing elements are near-ties of the original: x/s + z within 1e-3 of k + 1/2."""
    for node in original.graph:
        y = node.outputs[0].name
        if node.op_type != "Quant" or node.inputs[0].const_value is not None or y not in r1:
            continue
        differ = float32_to_key(r0[y]) != float32_to_key(r1[y])
        if not differ.any():
            continue
        assert node.attributes["rounding_mode"].value == "ROUND"
        scale = node.inputs[1].const_value.numpy().astype(np.float64)
        zeropt = node.inputs[2].const_value.numpy().astype(np.float64)
        v = r0[node.inputs[0].name].astype(np.float64) / scale + zeropt
        dist = np.abs(v - np.floor(v) - 0.5)[differ]
        assert dist.max() < 1e-3, f"{y}: {differ.sum()} levels differ, not at ties (distance up to {dist.max()})"
        return y, int(differ.sum())
    return None


@pytest.mark.parametrize("name", ZOO_MODELS)
def test_zoo_default_pipeline(name):
    """Tidy + convert with the default options (scale after the consumer, FINN's form)."""
    model = Model(zoo_model_path(name))
    result = streamline_model(model, only=["tidy", "convert"])
    hist = model.op_histogram()
    assert not QUANTIZERS & set(hist), hist
    assert not [m for m in result.report.misses if m.rule != "GemmToMatMul"], result.report.misses
    if name in POW2_MODELS:
        got = _run(model, _batch(name))
        for out, want in _original_outputs(name).items():
            assert_same(got[out], want, f"{name}:{out}")
        _check_annotations(model)
        return
    original = Model(zoo_model_path(name))
    n = _TIE_BATCH[name]
    r0, r1 = _original_all(name, n), _run(model, _batch(name, n), return_all=True)
    _check_annotations(model, r1)
    divergence = _first_divergence(original, r0, r1)
    out = original.output_names[0]
    assert np.array_equal(r0[out].argmax(axis=1), r1[out].argmax(axis=1))
    np.testing.assert_allclose(r1[out], r0[out], rtol=0, atol=0.05 * np.abs(r0[out]).max())
    if divergence is None:  # then only float32 rounding of the sums remains
        np.testing.assert_allclose(r1[out], r0[out], rtol=1e-4, atol=1e-5 * np.abs(r0[out]).max())


@pytest.mark.parametrize("name,placement", [("tfc_1w1a", "before"), ("tfc_2w2a", "after"), ("cnv_1w1a", "after"),
                                            ("resnet18_4w4a_ts", "before")])
def test_zoo_per_pass_verifier_accepts_the_stage(name, placement):
    """The per-pass verifier (verify.VerificationHook) accepts every pass of the convert stage under the policy it
    declares: equality for the activation and Trunc passes and for "before", tolerance for "after"."""
    from finnlite import PassManager, Stage
    from streamline.convert import convert_passes
    from tests.zoo import manifest
    from verify import ReferenceData, VerificationHook

    model = Model(zoo_model_path(name))
    lo, hi = manifest()[name]["input_range"]
    hook = VerificationHook(ReferenceData.random(model, n=4, seed=3, low=lo, high=hi))
    PassManager([Stage("convert", convert_passes(scale_placement=placement))], [hook]).run(model)
    assert not QUANTIZERS & set(model.op_histogram())


def test_zoo_datatypes_of_bnn_models():
    """Spot checks of the annotations FINN gets wrong or leaves out: BIPOLAR weights and activations in tfc_1w1a,
    INT2 (narrow, 3 levels) in tfc_2w2a, and the 8-bit signed input quantizer of cnv as 255 thresholds."""
    m = Model(zoo_model_path("tfc_1w1a"))
    convert(m)
    mts = [n for n in m.graph if n.op_type == "MultiThreshold"]
    assert {n.attributes["out_dtype"].value for n in mts} == {"BIPOLAR"}
    weights = [n.inputs[1].name for n in m.graph if n.op_type == "Gemm"]
    assert {m.get_tensor_datatype(w) for w in weights} == {DataType["BIPOLAR"]}
    m = Model(zoo_model_path("tfc_2w2a"))
    convert(m)
    mts = [n for n in m.graph if n.op_type == "MultiThreshold"]
    assert {n.attributes["out_dtype"].value for n in mts} == {"INT2"}
    assert all(m.get_initializer(n.inputs[1].name).shape[1] == 2 for n in mts)
    m = Model(zoo_model_path("cnv_2w2a"))
    convert(m)
    first = next(n for n in m.graph if n.op_type == "MultiThreshold")
    assert m.get_initializer(first.inputs[1].name).shape == (1, 255)
    assert first.attributes["out_dtype"].value == "INT8"
