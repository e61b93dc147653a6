"""Input preprocessing (streamline.preprocess): a UINT8 input with ``(x·scale − mean)/std`` in front, moved into
the first layer so that its MatMul reads integers; the result is checked against the original with the same
preprocessing in front, on 32 UINT8 inputs. Also the CLI options and the configuration block."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from finnlite import Model
from finnlite.build import streamline
from finnlite.cli import main
from finnlite.config import Config, load_config
from finnlite.core.errors import ConfigError
from streamline.preprocess import Preprocessing, insert_preprocessing, parse_number
from tests.streamline.convert_helpers import graph_model, init, quant_node
from tests.zoo import zoo_model_path

MEAN = (0.485, 0.456, 0.406)
STD = (0.226, 0.226, 0.226)


def _conv_net(pad: int) -> onnx.ModelProto:
    """x[1,3,8,8] → Conv(Quant(W) 4-bit, pad) → Relu → Quant(4-bit unsigned) → Conv(Quant(W2)) → Quant → y:
    a first layer reading the float input, as in MobileNet-v1 / ResNet-18 exports."""
    rng = np.random.default_rng(5)
    nodes = [quant_node(["w1", "ws1", "z0", "b4"], "w1q", name="wq1"),
             onnx.helper.make_node("Conv", ["x", "w1q"], ["c1"], name="conv1", pads=[pad] * 4, kernel_shape=[3, 3]),
             onnx.helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             quant_node(["r1", "as1", "z0", "b4"], "a1", signed=0, name="aq1"),
             quant_node(["w2", "ws2", "z0", "b4"], "w2q", name="wq2"),
             onnx.helper.make_node("Conv", ["a1", "w2q"], ["c2"], name="conv2", kernel_shape=[3, 3]),
             quant_node(["c2", "as2", "z0", "b4"], "y", name="aq2")]
    size = 8 + 2 * pad - 2
    inits = [init("w1", rng.standard_normal((6, 3, 3, 3)).astype(np.float32)),
             init("ws1", rng.uniform(0.05, 0.2, size=(6, 1, 1, 1)).astype(np.float32)),
             init("w2", rng.standard_normal((4, 6, 3, 3)).astype(np.float32)),
             init("ws2", np.float32(0.125)), init("z0", np.float32(0)), init("b4", np.float32(4)),
             init("as1", np.float32(0.25)), init("as2", np.float32(0.5))]
    return graph_model(nodes, {"x": [1, 3, 8, 8]}, {"y": [1, 4, size - 2, size - 2]}, inits)


def _mlp() -> onnx.ModelProto:
    rng = np.random.default_rng(6)
    nodes = [quant_node(["w1", "ws1", "z0", "b4"], "w1q", name="wq1"),
             onnx.helper.make_node("MatMul", ["x", "w1q"], ["h"], name="mm1"),
             quant_node(["h", "as1", "z0", "b4"], "y", name="aq1")]
    inits = [init("w1", rng.standard_normal((5, 7)).astype(np.float32)),
             init("ws1", rng.uniform(0.05, 0.2, size=(1, 7)).astype(np.float32)),
             init("z0", np.float32(0)), init("b4", np.float32(4)), init("as1", np.float32(0.5))]
    return graph_model(nodes, {"x": [1, 5]}, {"y": [1, 7]}, inits)


def _first_matmul_input_type(model: Model) -> str:
    first = next(n for n in model.graph if n.op_type in ("MatMul", "Conv"))
    return model.get_tensor_datatype(first.inputs[0].name).name


def _run(proto_or_path, pre: Preprocessing, samples: int = 32):
    model = Model(proto_or_path)
    report = streamline(model, verify="each", samples=samples, preprocessing=pre, extras=False)
    report.raise_for_errors()
    final = report.verification.final
    assert final is not None and final.ok and final.samples == samples, final.summary()
    assert model.get_tensor_datatype(model.input_names[0]).name == "UINT8"
    return model, report


@pytest.mark.parametrize("pad", [0, 1], ids=["unpadded", "padded"])
def test_conv_first_layer_reads_integers(pad: int) -> None:
    model, report = _run(_conv_net(pad), Preprocessing("UINT8", 1 / 255, MEAN, STD))
    assert _first_matmul_input_type(model) == "UINT8"
    floats = report.float_nodes
    assert floats.integer_only, floats.text()
    if pad == 1:  # the border bias varies per position: an integer Add (AbsorbBorderIntoThresholds)
        border = [n for n in model.graph if n.op_type == "Add" and n.name.endswith("_border_add")]
        assert len(border) == 1 and model.get_tensor_datatype(border[0].outputs[0].name).signed()


def test_matmul_first_layer_with_per_feature_mean() -> None:
    model, report = _run(_mlp(), Preprocessing("UINT8", 1 / 255, (0.1, 0.2, 0.3, 0.4, 0.5), (0.25,)))
    assert _first_matmul_input_type(model) == "UINT8"
    assert report.float_nodes.integer_only, report.float_nodes.text()


def test_per_channel_std_keeps_the_first_layer_float_and_says_why() -> None:
    model, report = _run(_conv_net(0), Preprocessing("UINT8", 1 / 255, MEAN, (0.229, 0.224, 0.225)), samples=8)
    assert _first_matmul_input_type(model) != "UINT8"
    assert not report.float_nodes.integer_only


def test_insertion_keeps_the_interface_and_computes_the_formula() -> None:
    from custom_ops.executor import Executor

    proto = _conv_net(1)
    model = Model(proto)
    insert_preprocessing(model, Preprocessing("UINT8", 1 / 255, MEAN, (0.229, 0.224, 0.225)))
    assert model.input_names == ["x"] and model.get_tensor_shape("x") == (1, 3, 8, 8)
    x = np.random.default_rng(0).integers(0, 256, size=(1, 3, 8, 8)).astype(np.float32)
    mean = np.array(MEAN, np.float32).reshape(3, 1, 1)
    std = np.array((0.229, 0.224, 0.225), np.float32).reshape(3, 1, 1)
    pre = (x * np.float32(1 / 255) - mean) / std
    np.testing.assert_array_equal(Executor(model).run({"x": x})["y"], Executor(proto).run({"x": pre})["y"])


def test_bad_preprocessing_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="2 mean values for input 'x' with 3 channels"):
        insert_preprocessing(Model(_conv_net(0)), Preprocessing(mean=(0.1, 0.2)))
    with pytest.raises(ConfigError, match="integer type"):
        Preprocessing("FLOAT32")
    with pytest.raises(ConfigError, match="std must be > 0"):
        Preprocessing(std=(0.0,))
    with pytest.raises(ConfigError, match="not a number"):
        parse_number("1/x", "--input-scale")
    assert parse_number("1/255") == 1 / 255


def test_cli_options(tmp_path, capsys) -> None:
    src, out = tmp_path / "net.onnx", tmp_path / "out.onnx"
    onnx.save(_conv_net(0), src)
    code = main(["streamline", str(src), "-o", str(out), "-q", "--input-datatype", "UINT8", "--input-scale",
                 "1/255", "--mean", *map(str, MEAN), "--std", "0.226"])
    text = capsys.readouterr()
    assert code == 0, text.err
    assert "integer-only" in text.out
    assert Model(out).get_tensor_datatype("x").name == "UINT8"
    code = main(["streamline", str(src), "-o", str(out), "-q", "--mean", "0.1", "0.2"])
    err = capsys.readouterr().err
    assert code == 2 and "2 mean values" in err and "Traceback" not in err, err


def test_config_block(tmp_path) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_text("preprocessing:\n  input_datatype: UINT8\n  scale: 1/255\n  mean: [0.485, 0.456, 0.406]\n"
                    "  std: 0.226\n")
    cfg = load_config(path)
    assert cfg.preprocessing == Preprocessing("UINT8", 1 / 255, MEAN, (0.226,))
    model = Model(_conv_net(0))
    report = streamline(model, cfg, verify="final", samples=4, extras=False)
    assert report.ok and model.get_tensor_datatype("x").name == "UINT8"
    path.write_text("preprocessing:\n  mean: [0.1]\n  stdev: 2\n")
    with pytest.raises(ConfigError, match="preprocessing.stdev"):
        load_config(path)
    with pytest.raises(ConfigError, match="preprocessing.scale"):
        Config.from_dict({"preprocessing": {"scale": "a/b"}})


@pytest.mark.zoo
@pytest.mark.slow
@pytest.mark.parametrize("name", ["mobilenet_v1_4b", "resnet18_4w4a_ts"])
def test_zoo_first_layer_reads_uint8(name: str) -> None:
    model, report = _run(zoo_model_path(name), Preprocessing("UINT8", 1 / 255, MEAN, STD))
    first = _first_matmul_input_type(model)
    print(f"{name}: first MatMul input {first}; {report.verification.final.summary()}; float nodes "
          f"{report.float_nodes.names()}")
    assert first == "UINT8"
    assert report.float_nodes.integer_only, report.float_nodes.text()  # resnet18: its padded border is integer
