"""Boundary-seeking verification (:mod:`verify.boundary`): inputs whose first-layer pre-activations sit on and next to
the thresholds pass on correct models and catch a first-layer threshold fault that random samples of the same count
miss.

Faults: in a float first layer (a Conv on the float input, as in MobileNet), one threshold of one channel moved by
1e-4 of the channel's threshold magnitude (far beyond float32 rounding, far inside the spread of the values); in an
input quantizer (the MultiThreshold reads the input itself, its thresholds are exact float32 numbers), one threshold
moved by one float32 ulp (an off-by-one in the tie rule). Each is shown missed by the random final check with the
same sample count and caught by boundary mode, the error naming the MultiThreshold.
"""

from __future__ import annotations

import numpy as np
import pytest

from finnlite import Model
from finnlite.build import make_reference, streamline
from finnlite.cli import main
from finnlite.core.compat import QONNX_DOMAIN
from finnlite.config import Config
from finnlite.core.errors import VerificationError
from tests.verify.graphs import GraphBuilder
from tests.zoo import ZOO_MODELS, manifest, zoo_model_path
from verify import ReferenceData, final_check
from verify.boundary import boundary_check, boundary_reference, find_first_layer

SAMPLES = 8


def _quant_weight(g: GraphBuilder, name: str, w: np.ndarray, scale: float, bits: int = 4) -> str:
    g.init(f"{name}_f", w)
    return g.quant(f"{name}_f", name, f"{name}_q", scale, bits, True)


def float_conv_net() -> Model:
    """A float first layer: Conv on the float input (4-bit weights), per-channel scale and bias, Relu, 4-bit
    quantizer; then a 1x1 Conv, a quantizer and a MatMul classifier."""
    rng = np.random.default_rng(3)
    g = GraphBuilder()
    g.input("x", [1, 3, 24, 24])
    w1 = _quant_weight(g, "w1", rng.integers(-7, 8, size=(4, 3, 3, 3)).astype(np.float32) / 8, 1 / 8)
    g.node("Conv", ["x", w1], ["c1"], "conv1", kernel_shape=[3, 3])
    g.init("gamma", rng.uniform(0.5, 1.5, size=(1, 4, 1, 1)).astype(np.float32) * np.array([1, -1, 1, 1],
                                                                                        np.float32).reshape(1, 4, 1, 1))
    g.init("beta", rng.uniform(-0.5, 0.5, size=(1, 4, 1, 1)).astype(np.float32))
    g.node("Mul", ["c1", "gamma"], ["m1"], "bn_mul")
    g.node("Add", ["m1", "beta"], ["a1"], "bn_add")
    g.node("Relu", ["a1"], ["r1"], "relu1")
    g.quant("r1", "q1", "act1", 0.25, 4, False)
    w2 = _quant_weight(g, "w2", rng.integers(-7, 8, size=(4, 4, 1, 1)).astype(np.float32) / 8, 1 / 8)
    g.node("Conv", ["q1", w2], ["c2"], "conv2", kernel_shape=[1, 1])
    g.quant("c2", "q2", "act2", 0.5, 4, True)
    g.init("shape", np.array([1, 4 * 22 * 22], np.int64), np.int64)
    g.node("Reshape", ["q2", "shape"], ["flat"], "flatten")
    w3 = _quant_weight(g, "w3", rng.integers(-7, 8, size=(4 * 22 * 22, 10)).astype(np.float32) / 8, 1 / 8)
    g.node("MatMul", ["flat", w3], ["y"], "fc")
    g.output("y", [1, 10])
    return g.model()


def input_quant_net() -> Model:
    """An input quantizer behind a preprocessing ``2·x − 1`` (4-bit, scale 1/8), then two quantized MatMuls."""
    rng = np.random.default_rng(5)
    g = GraphBuilder()
    g.input("x", [1, 256])
    g.init("two", np.float32(2.0)), g.init("one", np.float32(1.0))
    g.node("Mul", ["x", "two"], ["m"], "pre_mul")
    g.node("Sub", ["m", "one"], ["s"], "pre_sub")
    g.quant("s", "q0", "inq", 1 / 8, 4, True)
    w1 = _quant_weight(g, "w1", rng.integers(-1, 2, size=(256, 16)).astype(np.float32), 1.0, 2)
    g.node("MatMul", ["q0", w1], ["h"], "fc1")
    g.quant("h", "q1", "act1", 1.0, 4, True)
    w2 = _quant_weight(g, "w2", rng.integers(-1, 2, size=(16, 10)).astype(np.float32), 1.0, 2)
    g.node("MatMul", ["q1", w2], ["y"], "fc2")
    g.output("y", [1, 10])
    return g.model()


def _streamlined(model: Model) -> Model:
    copy = Model(model.to_proto())
    report = streamline(copy, verify="off", extras=False)
    assert report.ok, report.error
    return copy


def _first_mt(model: Model):
    return next(n for n in model.graph if n.op_type == "MultiThreshold")


def _shift_threshold(model: Model, channel: int, k: int, how) -> str:
    mt = _first_mt(model)
    thr = np.array(model.get_initializer(mt.inputs[1].name), copy=True)
    c = channel if thr.shape[0] > 1 else 0
    thr[c, k] = how(thr[c])
    model.set_initializer(mt.inputs[1].name, thr.astype(np.float32))
    return mt.name


def _random_and_boundary(original: Model, mutant: Model, low: float, high: float):
    random_ref = ReferenceData.random(original, n=SAMPLES, seed=0, low=low, high=high)
    random = final_check(random_ref, mutant)
    ref, plan = boundary_reference(original, n=SAMPLES, seed=0, low=low, high=high)
    assert plan.layer is not None, plan.reason
    return random, boundary_check(ref, mutant, plan)


def test_first_layers_are_found() -> None:
    layer, _ = find_first_layer(float_conv_net())
    assert layer is not None and layer.kind == "float layer" and layer.layer.name == "conv1" and layer.relu
    assert layer.z == "a1"
    layer, _ = find_first_layer(input_quant_net())
    assert layer is not None and layer.kind == "input quantizer" and layer.z == "s"


def test_integer_input_falls_back_and_says_why() -> None:
    g = GraphBuilder()
    g.input("x", [1, 8], datatype="UINT8")
    g.quant("x", "y", "q", 1.0, 4, True)
    g.output("y", [1, 8])
    ref, plan = boundary_reference(g.model(), n=2, seed=0, low=0, high=255)
    assert plan.layer is None and "proofs" in plan.reason and ref.num_samples == 2


@pytest.mark.parametrize("build", [float_conv_net, input_quant_net])
def test_boundary_mode_passes_on_correct_models(build) -> None:
    original = build()
    ref, plan = boundary_reference(original, n=SAMPLES, seed=0)
    # targets sit where they were asked to: near ones outside float rounding, on both sides of the boundaries
    near = [t for t in plan.targets if "2^" in t.kind]
    assert len(near) > 100 and len({t.boundary for t in near}) > 10
    assert all((t.offset < 0) == t.kind.startswith("below") for t in near)
    result = boundary_check(ref, _streamlined(original), plan)
    assert result.ok, result.summary()
    assert result.first_layer.elements > 0 and not result.first_layer.skipped


def test_float_first_layer_fault_missed_by_random_caught_by_boundary() -> None:
    original = float_conv_net()
    mutant = _streamlined(original)
    node = _shift_threshold(mutant, 2, 3, lambda row: row[3] + 1e-4 * np.abs(row).max())
    random, boundary = _random_and_boundary(original, mutant, -1.0, 1.0)
    assert random.ok, "random sampling was expected to miss this fault: " + random.summary()
    assert not boundary.ok and boundary.first_layer.issues
    with pytest.raises(VerificationError) as err:
        boundary.raise_for_errors()
    assert err.value.node == node and "first layer" in str(err.value)


def test_input_quantizer_off_by_one_ulp_missed_by_random_caught_by_boundary() -> None:
    original = input_quant_net()
    mutant = _streamlined(original)
    node = _shift_threshold(mutant, 0, 9, lambda row: np.nextafter(row[9], np.float32(np.inf), dtype=np.float32))
    random, boundary = _random_and_boundary(original, mutant, -1.0, 1.0)
    assert random.ok, "random sampling was expected to miss this fault: " + random.summary()
    assert boundary.first_layer.exact and not boundary.ok
    with pytest.raises(VerificationError) as err:
        boundary.raise_for_errors()
    assert err.value.node == node


def test_config_and_streamline_switch() -> None:
    cfg = Config.from_dict({"verification": {"boundary": True, "samples": 4}})
    model = float_conv_net()
    ref, described = make_reference(model, cfg)
    assert "boundary-seeking" in described and ref.boundary_plan.layer is not None
    report = streamline(model, cfg, verify="final", extras=False)
    assert report.ok, report.error
    assert "boundary mode:" in report.verification.text() and "first layer" in report.verification.text()


def test_cli_verify_boundary(tmp_path, capsys) -> None:
    original = float_conv_net()
    orig_path, out_path = tmp_path / "orig.onnx", tmp_path / "out.onnx"
    original.save(orig_path)
    mutant = _streamlined(original)
    mutant.save(out_path)
    assert main(["verify", str(orig_path), str(out_path), "--boundary", "--input-range", "-1", "1"]) == 0
    assert "boundary mode:" in capsys.readouterr().out
    _shift_threshold(mutant, 2, 3, lambda row: row[3] + 1e-4 * np.abs(row).max())
    mutant.save(out_path)
    assert main(["verify", str(orig_path), str(out_path), "--input-range", "-1", "1"]) == 0  # random: missed
    assert main(["verify", str(orig_path), str(out_path), "--boundary", "--input-range", "-1", "1"]) == 1
    assert "first layer differs" in capsys.readouterr().err


# -- the zoo -------------------------------------------------------------------------------------------------------
def _zoo(name: str) -> tuple[Model, Model, float, float]:
    original = Model(zoo_model_path(name))
    lo, hi = manifest()[name]["input_range"]
    return original, _streamlined(original), lo, hi


@pytest.mark.zoo
@pytest.mark.parametrize("name", ZOO_MODELS)
def test_zoo_boundary_mode_no_false_alarm(name: str) -> None:
    original, streamlined, lo, hi = _zoo(name)
    ref, plan = boundary_reference(original, n=SAMPLES, seed=0, low=lo, high=hi)
    assert plan.layer is not None, plan.reason
    result = boundary_check(ref, streamlined, plan)
    print(f"{name}: {plan.describe()}\n{result.first_layer.describe()}")
    assert result.ok, result.summary()


@pytest.mark.zoo
@pytest.mark.slow
def test_zoo_float_first_layer_fault_mobilenet() -> None:
    original, mutant, lo, hi = _zoo("mobilenet_v1_4b")
    node = _shift_threshold(mutant, 5, 7, lambda row: row[7] + 1e-4 * np.abs(row).max())
    random = final_check(ReferenceData.random(original, n=SAMPLES, seed=0, low=lo, high=hi), mutant)
    assert random.ok, "random sampling was expected to miss this fault: " + random.summary()
    ref, plan = boundary_reference(original, n=SAMPLES, seed=0, low=lo, high=hi)
    result = boundary_check(ref, mutant, plan)
    with pytest.raises(VerificationError) as err:
        result.raise_for_errors()
    assert err.value.node == node
