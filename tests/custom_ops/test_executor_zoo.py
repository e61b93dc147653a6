"""Acceptance: every zoo model runs in the executor with outputs — and every intermediate tensor — identical, bit
for bit, to qonnx's execute_onnx on inputs drawn from the manifest's ranges; the same with the quantizers removed;
batches and float64."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import onnx
import pytest

from custom_ops.executor import Executor
from tests.qonnx_ref import qonnx_execute
from tests.zoo import ZOO_MODELS, float_exposed, random_input, zoo_model_path


@lru_cache(maxsize=None)
def zoo_executor(name: str, **kwargs) -> Executor:
    return Executor(onnx.load(str(zoo_model_path(name))), **kwargs)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool(np.all(a.view(np.uint32) == b.view(np.uint32)))


@pytest.mark.parametrize("name", ZOO_MODELS)
def test_zoo_model_matches_qonnx_bit_for_bit(name):
    """Outputs on two inputs, and on the first every tensor qonnx computes, identical bit for bit."""
    model = onnx.load(str(zoo_model_path(name)))
    ex = zoo_executor(name)
    assert "0 run as kernels" in ex.describe(), ex.describe()  # the fast path covers the whole model
    produced = [t for n in model.graph.node for t in n.output]
    for seed, return_all in ((0, True), (1, False)):
        feeds = {ex.input_names[0]: random_input(name, seed)}
        got, ref = ex.run(feeds, return_all=return_all), qonnx_execute(model, feeds, return_all=return_all)
        keys = produced if return_all else list(ref)
        assert set(keys) <= set(got)
        for key in keys:
            assert same_bits(got[key], ref[key]), (name, seed, key, np.abs(got[key] - ref[key]).max())


@pytest.mark.parametrize("name", ["tfc_2w2a", "cnv_2w2a", "resnet18_4w4a_ts"])
def test_zoo_float_exposed_matches_qonnx_bit_for_bit(name):
    """With the activation quantizers removed, float rounding differences would reach the outputs unabsorbed:
    the regions' session options must still reproduce qonnx's one-session-per-node results exactly."""
    model = float_exposed(onnx.load(str(zoo_model_path(name))))
    ex = Executor(model)
    feeds = {ex.input_names[0]: random_input(name, 5)}
    got, ref = ex.run(feeds), qonnx_execute(model, feeds)
    for key in ref:
        assert same_bits(got[key], ref[key]), key


def test_zoo_batch_per_item_equals_single_runs():
    ex = zoo_executor("cnv_1w1a")
    xb = random_input("cnv_1w1a", 3, batch=3)
    got = ex.run({ex.input_names[0]: xb})
    for key, value in got.items():
        singles = np.concatenate([ex.run({ex.input_names[0]: xb[i:i + 1]})[key] for i in range(3)])
        assert value.shape[0] == 3 and same_bits(value, singles)


@pytest.mark.parametrize("name", ["tfc_2w2a", "resnet18_4w4a_ts"])
def test_zoo_vectorized_batch_keeps_the_batch(name, caplog):
    ex = Executor(zoo_model_path(name), batch_mode="vectorized")
    xb = random_input(name, 4, batch=4)
    got = ex.run({ex.input_names[0]: xb})
    assert not [r for r in caplog.records if "chunks" in r.getMessage()]  # the flatten was rewritten
    singles = [ex.run({ex.input_names[0]: xb[i:i + 1]}) for i in range(4)]
    for key, value in got.items():
        assert value.shape[0] == 4
        # onnxruntime's Gemm/Conv may round differently for another batch size; quantizers absorb nearly all
        expected = np.concatenate([s[key] for s in singles])
        assert np.mean(np.isclose(value, expected, rtol=1e-5, atol=1e-5)) > 0.9


def test_zoo_float64_mode_runs_and_agrees_with_float32():
    ex64 = zoo_executor("mobilenet_v1_4b", dtype=np.float64)
    assert "no double kernel" in ex64.describe()
    x = random_input("mobilenet_v1_4b", 0)
    y64 = ex64.run({ex64.input_names[0]: x})["linear"]
    y32 = zoo_executor("mobilenet_v1_4b").run({ex64.input_names[0]: x})["linear"]
    assert y64.dtype == np.float64 and y64.shape == y32.shape
    # float32 near-ties may move a few activations by one level; the logits stay close
    assert np.corrcoef(y64.ravel(), y32.ravel())[0, 1] > 0.99


@pytest.mark.parametrize("name", ["tfc_2w2a", "cnv_1w1a", "cnv_2w2a", "mobilenet_v1_4b"])
def test_streamlined_zoo_model_matches_qonnx_bit_for_bit(name):
    """The oracle on *streamlined* models (MultiThreshold, Im2Col lowered; Im2Col -> MatMul with integer operands run
    as one Conv) against qonnx's execute_onnx: outputs, and every tensor on the first input."""
    from finnlite import Model
    from streamline.pipeline import streamline_model

    m = Model(zoo_model_path(name))
    streamline_model(m, validate=False)
    model = m.to_proto()
    ex = Executor(model)
    if name.startswith("cnv_2") or name.startswith("mobilenet"):
        assert ex._fused, ex.describe()  # the integer fast path is in use
    produced = [t for n in model.graph.node for t in n.output]
    for seed, return_all in ((0, True), (1, False)):
        feeds = {ex.input_names[0]: random_input(name, seed)}
        got, ref = ex.run(feeds, return_all=return_all), qonnx_execute(model, feeds, return_all=return_all)
        keys = produced if return_all else list(ref)
        for key in keys:
            assert same_bits(got[key], ref[key]), (name, seed, key, np.abs(got[key] - ref[key]).max())
