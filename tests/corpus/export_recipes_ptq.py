"""Build the recipes of issue 33 that quantize a trained or random float network (recipes 1, 2, 3 and 8).

Run with the side environment (torch, brevitas, onnxruntime, scikit-learn), never imported by finnlite's tests:

    $SIDE_PYTHON tests/corpus/export_recipes_ptq.py [--only NAME ...] [--cache DIR]

1. **Brevitas graph-mode PTQ** of torchvision architectures, as ``brevitas_examples.imagenet_classification.ptq``
   does it: ``preprocess_for_quantize`` (BatchNorm merged, 20 iterations of graph equalization with bias merging),
   ``quantize_model`` of ``ptq_common`` with the ``fx`` or ``layerwise`` backend (8- or 4-bit, per-tensor or
   per-channel weights, float or power-of-two scales, Int32 biases), a first forward pass, calibration, bias
   correction, then ``export_qonnx`` or ``export_onnx_qcdq``. ResNet-18, MobileNet-v2 (also at width 0.25) and
   SqueezeNet-1.1 at 64×64, ten classes, random weights and randomized BatchNorm statistics; a CIFAR-style ResNet
   of torchvision's ``BasicBlock`` (8/16/32 channels, 32×32) small enough to commit. torchvision's wheel is built
   for another torch: its pure-Python model modules are imported from the wheel file by path (``$TORCHVISION_WHEEL``,
   default ``wheels/torchvision-*.whl`` beside the side environment's venv), with two of its helpers stubbed (below).
2. **Quantized biases**, FINN's tutorial recipe: ``bias_quant=Int32Bias``/``Int16Bias`` on QuantConv2d/QuantLinear
   (the bias scale is the input's times the weight's, computed by Brevitas), fixed-point scales everywhere
   (``Int8WeightPerTensorFixedPoint``/``PerChannel``, ``Int8ActPerTensorFixedPoint``), ``QuantHardTanh``, no
   BatchNorm; one float-scale variant.
3. **onnxruntime ``quantize_static``** (QDQ, MinMax calibration, int8 weights per channel or per tensor, uint8
   asymmetric or int8 symmetric activations) after ``quant_pre_process``, on float TorchScript exports of
   ResNet-18 (64×64), the small ResNet and a plain CNN with BatchNorm (folded by the exporter).
8. **Trained networks**: an MLP and a CNN trained with QAT on scikit-learn's ``load_digits`` (8×8, pixel values
   0–16), exported; the test images are stored beside them (``<name>.npz``: ``x`` float32 inputs, ``y`` labels)
   and the manifest gives the test accuracy of the Brevitas model.

Files under 1 MB go to ``tests/corpus/models/recipes_ptq/`` with ``manifest.json`` (the fields of the corpus
manifest, plus ``recipe``, ``test_set`` for the trained ones and ``accuracy``); larger ones to
``$FINNLITE_CORPUS/recipes_ptq`` (default ``~/.cache/finnlite/corpus/recipes_ptq``) with a manifest of their own,
listed in the committed manifest with ``"cached": true``.
"""

from __future__ import annotations

import argparse
import glob
import importlib
import importlib.machinery
import json
import os
import sys
import tempfile
import traceback
import types
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
COMMITTED = HERE / "models" / "recipes_ptq"
LIMIT = 1 << 20
SUBDIR = "recipes_ptq"


def cache_dir() -> Path:
    root = Path(os.environ.get("FINNLITE_CORPUS", Path.home() / ".cache" / "finnlite" / "corpus"))
    return root / SUBDIR


# -- imports the side environment lacks ----------------------------------------------------------------------------
def _stub(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
    for k, v in attrs.items():
        setattr(mod, k, v)
    sys.modules[name] = mod
    return mod


class _NoBar:
    """tqdm's interface without a progress bar (ptq_common imports tqdm, which the side environment lacks)."""

    def __init__(self, iterable=None, *args, **kwargs):
        self.iterable = iterable

    def __iter__(self):
        return iter(self.iterable)

    def __enter__(self):
        return self

    def __exit__(self, *args):
        return None

    def update(self, n=1):
        return None

    def close(self):
        return None

    def set_description(self, *args, **kwargs):
        return None


def torchvision_models():
    """torchvision's ``resnet``, ``mobilenetv2`` and ``squeezenet`` modules, loaded from the wheel file by path.

    The package's ``__init__`` (which loads the compiled ops built for another torch) is not run: ``torchvision``,
    ``torchvision.models``, ``.ops`` and ``.transforms`` are empty packages whose path points into the wheel, and two
    helpers these modules import are stubbed (``transforms._presets.ImageClassification``, only referenced by the
    pretrained-weights tables, and ``utils._log_api_usage_once``/``_make_ntuple``, which need PIL there)."""
    if "torchvision.models.resnet" not in sys.modules:
        wheel = os.environ.get("TORCHVISION_WHEEL") or next(iter(sorted(glob.glob(
            str(Path(sys.prefix).parent / "wheels" / "torchvision-*.whl")))), None)
        if wheel is None:
            raise SystemExit("no torchvision wheel: set TORCHVISION_WHEEL")
        for pkg in ("torchvision", "torchvision/models", "torchvision/ops", "torchvision/transforms"):
            mod = _stub(pkg.replace("/", "."))
            mod.__path__ = [f"{wheel}/{pkg}"]
            mod.__spec__.submodule_search_locations = mod.__path__
        _stub("torchvision.transforms._presets", ImageClassification=type("ImageClassification", (), {}))
        _stub("torchvision.utils", _log_api_usage_once=lambda *a, **k: None,
              _make_ntuple=lambda x, n: tuple(x) if hasattr(x, "__iter__") else (x,) * n)
        sys.path.insert(0, wheel)
    return tuple(importlib.import_module(f"torchvision.models.{m}") for m in ("resnet", "mobilenetv2", "squeezenet"))


def ptq_common():
    """``brevitas_examples.imagenet_classification.ptq.ptq_common`` (with a tqdm stand-in)."""
    if "tqdm" not in sys.modules:
        try:
            import tqdm  # noqa: F401
        except ImportError:
            _stub("tqdm", tqdm=_NoBar)
    from brevitas_examples.imagenet_classification.ptq import ptq_common as pc
    return pc


# -- helpers -------------------------------------------------------------------------------------------------------
def randomize_bn(model: nn.Module, gen: torch.Generator) -> None:
    """Random running statistics and affine parameters for every BatchNorm (about a fifth of the gammas negative)."""
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            c = m.num_features
            sign = torch.where(torch.rand(c, generator=gen) < 0.2, -1.0, 1.0)
            m.weight.data = sign * (0.5 + torch.rand(c, generator=gen))
            m.bias.data = 0.5 * torch.randn(c, generator=gen)
            m.running_mean.data = 0.5 * torch.randn(c, generator=gen)
            m.running_var.data = 0.5 + torch.rand(c, generator=gen)


def batches(shape: tuple, lo: float, hi: float, gen: torch.Generator, n: int = 4, size: int = 8) -> list:
    return [(lo + (hi - lo) * torch.rand((size,) + tuple(shape[1:]), generator=gen), None) for _ in range(n)]


def calibrate(model: nn.Module, data: list) -> None:
    from brevitas.graph.calibrate import calibration_mode

    model.eval()
    with torch.no_grad(), calibration_mode(model):
        for x, _ in data:
            model(x)
    model.eval()


# -- recipe 1: graph-mode PTQ --------------------------------------------------------------------------------------
class MiniResNet(nn.Module):
    """A CIFAR-style ResNet of torchvision's BasicBlock: 8-channel stem, stages of 8/16/32 channels (1x1-conv
    downsample shortcuts), global average pool, linear classifier."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        resnet = torchvision_models()[0]
        block = resnet.BasicBlock
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        layers, cin = [], 8
        for cout, stride in ((8, 1), (16, 2), (32, 2)):
            down = None
            if stride != 1 or cin != cout:
                down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))
            layers.append(block(cin, cout, stride, down))
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x):
        x = self.layers(self.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def arch(name: str) -> nn.Module:
    resnet, mobilenetv2, squeezenet = torchvision_models()
    return {"resnet18": lambda: resnet.resnet18(num_classes=10),
            "mobilenetv2": lambda: mobilenetv2.mobilenet_v2(num_classes=10),
            "mobilenetv2x025": lambda: mobilenetv2.MobileNetV2(num_classes=10, width_mult=0.25),
            "squeezenet11": lambda: squeezenet.squeezenet1_1(num_classes=10),
            "resnetmini": MiniResNet}[name]()


def ptq_model(net_name: str, backend: str, wbits: int, abits: int, granularity: str, scale: str, shape: tuple,
              lo: float, hi: float, seed: int) -> nn.Module:
    """The PTQ recipe of ``brevitas_examples.imagenet_classification.ptq.ptq_evaluate`` on a random network."""
    from brevitas.graph.quantize import preprocess_for_quantize

    pc = ptq_common()
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    net = arch(net_name)
    randomize_bn(net, gen)
    net.eval()
    net = preprocess_for_quantize(net, equalize_iters=20, equalize_merge_bias=True, merge_bn=True)
    q = pc.quantize_model(net, backend=backend, weight_bit_width=wbits, act_bit_width=abits, bias_bit_width=32,
                          weight_quant_granularity=granularity, act_quant_percentile=99.999, act_quant_type="sym",
                          scale_factor_type=scale, quant_format="int", layerwise_first_last_bit_width=8)
    data = batches(shape, lo, hi, gen)
    q.eval()
    with torch.no_grad():
        q(data[0][0])
    pc.calibrate(data, q)
    pc.apply_bias_correction(data, q)
    q.eval()
    return q


# -- recipe 2: quantized biases, fixed point, HardTanh, no BatchNorm ---------------------------------------------
def _bias_quant(bits: int):
    from brevitas.quant import Int16Bias, Int32Bias
    return {16: Int16Bias, 32: Int32Bias}[bits]


def _quantizers(fixed: bool, per_channel: bool):
    from brevitas.quant.fixed_point import (Int8ActPerTensorFixedPoint, Int8ActPerTensorFixedPointMinMaxInit,
                                            Int8WeightPerChannelFixedPoint, Int8WeightPerTensorFixedPoint,
                                            Uint8ActPerTensorFixedPoint)
    from brevitas.quant.scaled_int import (Int8ActPerTensorFloat, Int8ActPerTensorFloatMinMaxInit,
                                           Int8WeightPerChannelFloat, Int8WeightPerTensorFloat, Uint8ActPerTensorFloat)
    if fixed:
        w = Int8WeightPerChannelFixedPoint if per_channel else Int8WeightPerTensorFixedPoint
        return w, Int8ActPerTensorFixedPoint, Uint8ActPerTensorFixedPoint, Int8ActPerTensorFixedPointMinMaxInit
    w = Int8WeightPerChannelFloat if per_channel else Int8WeightPerTensorFloat
    return w, Int8ActPerTensorFloat, Uint8ActPerTensorFloat, Int8ActPerTensorFloatMinMaxInit


class BiasMlp(nn.Module):
    """FINN's tutorial recipe as an MLP: fixed-point input quantizer, QuantLinear layers with quantized biases
    (scale = input scale × weight scale), QuantHardTanh activations, no BatchNorm."""

    def __init__(self, bits: int, bias_bits: int, fixed: bool = True, per_channel: bool = False) -> None:
        super().__init__()
        import brevitas.nn as qnn
        wq, sq, _, htq = _quantizers(fixed, per_channel)
        bq = _bias_quant(bias_bits)
        self.inp = qnn.QuantIdentity(act_quant=sq, bit_width=8, return_quant_tensor=True)
        lin = lambda i, o: qnn.QuantLinear(i, o, bias=True, weight_quant=wq, weight_bit_width=bits,  # noqa: E731
                                           bias_quant=bq, return_quant_tensor=False)
        act = lambda: qnn.QuantHardTanh(act_quant=htq, bit_width=bits, min_val=-1.0, max_val=1.0,  # noqa: E731
                                        return_quant_tensor=True)
        self.fc1, self.a1 = lin(64, 64), act()
        self.fc2, self.a2 = lin(64, 32), act()
        self.fc3 = lin(32, 10)

    def forward(self, x):
        x = self.inp(x.flatten(1))
        return self.fc3(self.a2(self.fc2(self.a1(self.fc1(x)))))


class BiasCnn(nn.Module):
    """The same recipe as a CNN: QuantConv2d layers with quantized biases, a QuantHardTanh and a QuantReLU,
    MaxPools on quantized tensors, a QuantLinear classifier with a quantized bias; no BatchNorm."""

    def __init__(self, bits: int, bias_bits: int, fixed: bool = True, per_channel: bool = False) -> None:
        super().__init__()
        import brevitas.nn as qnn
        wq, sq, uq, htq = _quantizers(fixed, per_channel)
        bq = _bias_quant(bias_bits)
        self.inp = qnn.QuantIdentity(act_quant=sq, bit_width=8, return_quant_tensor=True)
        conv = lambda i, o: qnn.QuantConv2d(i, o, 3, padding=1, bias=True, weight_quant=wq,  # noqa: E731
                                            weight_bit_width=bits, bias_quant=bq, return_quant_tensor=False)
        self.c1 = conv(3, 16)
        self.a1 = qnn.QuantHardTanh(act_quant=htq, bit_width=bits, min_val=-1.0, max_val=1.0,
                                    return_quant_tensor=True)
        self.c2 = conv(16, 16)
        self.a2 = qnn.QuantReLU(act_quant=uq, bit_width=bits, return_quant_tensor=True)
        self.fc = qnn.QuantLinear(16 * 4 * 4, 10, bias=True, weight_quant=wq, weight_bit_width=bits, bias_quant=bq,
                                  return_quant_tensor=False)

    def forward(self, x):
        x = F.max_pool2d(self.a1(self.c1(self.inp(x))), 2)
        x = F.max_pool2d(self.a2(self.c2(x)), 2)
        return self.fc(x.flatten(1))


def bias_model(cls, bits: int, bias_bits: int, fixed: bool, per_channel: bool, shape: tuple, lo: float, hi: float,
               seed: int) -> nn.Module:
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = cls(bits, bias_bits, fixed, per_channel)
    with torch.no_grad():  # biases large enough to matter
        for m in model.modules():
            if getattr(m, "bias", None) is not None and isinstance(m, (nn.Conv2d, nn.Linear)):
                m.bias.data = 0.3 * torch.randn(m.bias.shape, generator=gen)
    calibrate(model, batches(shape, lo, hi, gen))
    return model


# -- recipe 3: onnxruntime quantize_static --------------------------------------------------------------------------
class PlainCnn(nn.Module):
    """Conv + BatchNorm + ReLU + MaxPool twice, a third Conv + ReLU, flatten, two Linear layers (float)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.c2, self.b2 = nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32)
        self.c3 = nn.Conv2d(32, 32, 3, padding=1)
        self.fc1, self.fc2 = nn.Linear(32 * 4 * 4, 64), nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.b1(self.c1(x))), 2)
        x = F.max_pool2d(F.relu(self.b2(self.c2(x))), 2)
        x = F.relu(self.c3(x))
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def ort_quantized(net_name: str, activations: str, per_channel: bool, shape: tuple, lo: float, hi: float, seed: int,
                  path: Path) -> None:
    """Export the float network with the TorchScript exporter, ``quant_pre_process`` it, then ``quantize_static``
    in QDQ format with MinMax calibration on random inputs in [lo, hi]; the result is written to ``path``."""
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                          quantize_static)
    from onnxruntime.quantization.shape_inference import quant_pre_process

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    net = PlainCnn() if net_name == "cnn" else arch(net_name)
    randomize_bn(net, gen)
    net.eval()
    calib = [x.numpy() for x, _ in batches(shape, lo, hi, gen, n=8, size=1)]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(calib)

        def get_next(self):
            x = next(self.it, None)
            return None if x is None else {"x": x}

    with tempfile.TemporaryDirectory() as tmp:
        fp = Path(tmp) / "float.onnx"
        pre = Path(tmp) / "pre.onnx"
        torch.onnx.export(net, torch.zeros(shape), str(fp), input_names=["x"], output_names=["y"], dynamo=False,
                          opset_version=17)
        quant_pre_process(str(fp), str(pre))
        signed = activations == "s8sym"
        quantize_static(str(pre), str(path), Reader(), quant_format=QuantFormat.QDQ, per_channel=per_channel,
                        activation_type=QuantType.QInt8 if signed else QuantType.QUInt8,
                        weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax,
                        extra_options={"ActivationSymmetric": signed})


# -- recipe 8: trained digits ---------------------------------------------------------------------------------------
class DigitsMlp(nn.Module):
    """load_digits MLP: unsigned 8-bit input quantizer (pixels 0–16), QuantLinear + BatchNorm1d + QuantReLU twice,
    QuantLinear classifier; weights and activations of ``bits`` bits."""

    def __init__(self, bits: int) -> None:
        super().__init__()
        import brevitas.nn as qnn
        from brevitas.quant import Uint8ActPerTensorFloat
        self.inp = qnn.QuantIdentity(act_quant=Uint8ActPerTensorFloat, bit_width=8, return_quant_tensor=False)
        self.fc1, self.b1 = qnn.QuantLinear(64, 64, bias=False, weight_bit_width=bits), nn.BatchNorm1d(64)
        self.a1 = qnn.QuantReLU(bit_width=bits)
        self.fc2, self.b2 = qnn.QuantLinear(64, 32, bias=False, weight_bit_width=bits), nn.BatchNorm1d(32)
        self.a2 = qnn.QuantReLU(bit_width=bits)
        self.fc3 = qnn.QuantLinear(32, 10, bias=True, weight_bit_width=max(bits, 4))

    def forward(self, x):
        x = self.inp(x.flatten(1))
        return self.fc3(self.a2(self.b2(self.fc2(self.a1(self.b1(self.fc1(x)))))))


class DigitsCnn(nn.Module):
    """load_digits CNN on 1×8×8: QuantConv2d + BatchNorm2d + QuantReLU + MaxPool twice (16, 32 channels), QuantLinear
    classifier; with ``bias_bits`` the convolutions keep a bias quantized to Int16/Int32 and have no BatchNorm."""

    def __init__(self, bits: int, bias_bits: int | None = None) -> None:
        super().__init__()
        import brevitas.nn as qnn
        from brevitas.quant import Uint8ActPerTensorFloat
        rq = bias_bits is not None
        extra = {"bias_quant": _bias_quant(bias_bits)} if rq else {}
        self.inp = qnn.QuantIdentity(act_quant=Uint8ActPerTensorFloat, bit_width=8, return_quant_tensor=rq)
        self.c1 = qnn.QuantConv2d(1, 16, 3, padding=1, bias=rq, weight_bit_width=bits, **extra)
        self.c2 = qnn.QuantConv2d(16, 32, 3, padding=1, bias=rq, weight_bit_width=bits, **extra)
        self.b1 = nn.Identity() if rq else nn.BatchNorm2d(16)
        self.b2 = nn.Identity() if rq else nn.BatchNorm2d(32)
        self.a1 = qnn.QuantReLU(bit_width=bits, return_quant_tensor=rq)
        self.a2 = qnn.QuantReLU(bit_width=bits, return_quant_tensor=rq)
        self.fc = qnn.QuantLinear(32 * 2 * 2, 10, bias=True, weight_bit_width=max(bits, 4), **extra)

    def forward(self, x):
        x = F.max_pool2d(self.a1(self.b1(self.c1(self.inp(x)))), 2)
        x = F.max_pool2d(self.a2(self.b2(self.c2(x))), 2)
        return self.fc(x.flatten(1))


def digits_split():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = d.images.astype(np.float32)[:, None]  # (N, 1, 8, 8), values 0..16
    return train_test_split(x, d.target.astype(np.int64), test_size=0.25, random_state=0, stratify=d.target)


def digits_model(kind: str, bits: int, bias_bits: int | None, seed: int, epochs: int = 60) -> tuple[nn.Module, dict]:
    """QAT on the training split (Adam, cross-entropy, batch 64); returns the eval-mode model and its test set."""
    x_tr, x_te, y_tr, y_te = digits_split()
    torch.manual_seed(seed)
    model = DigitsMlp(bits) if kind == "mlp" else DigitsCnn(bits, bias_bits)
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs)
    xt, yt = torch.from_numpy(x_tr), torch.from_numpy(y_tr)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        model.train()
        perm = torch.randperm(len(xt), generator=gen)
        for i in range(0, len(xt), 64):
            idx = perm[i:i + 64]
            opt.zero_grad()
            out = model(xt[idx])
            out = out.value if hasattr(out, "value") else out
            F.cross_entropy(out, yt[idx]).backward()
            opt.step()
        sched.step()
    model.eval()
    with torch.no_grad():
        out = model(torch.from_numpy(x_te))
        out = out.value if hasattr(out, "value") else out
    acc = float((out.argmax(1).numpy() == y_te).mean())
    return model, {"x": x_te, "y": y_te, "accuracy": acc}


# -- the table -------------------------------------------------------------------------------------------------------
IMG64, IMG32 = (1, 3, 64, 64), (1, 3, 32, 32)
#: name -> (recipe, exporter, input shape, input range, description, builder); the builder returns a Brevitas model
#: (exported by ``exporter``: qonnx_dyn, qonnx_ts, qcdq), or writes the file itself (exporter ``ort``), or returns a
#: (model, test set) pair (trained)
SPECS: dict[str, tuple] = {}


def _ptq(name, net, backend, wb, ab, gran, scale, exporter, shape, seed=33):
    desc = (f"graph-mode PTQ ({backend} backend) of {net}: W{wb}A{ab}, {gran.replace('_', '-')} weights, "
            f"{'power-of-two' if scale == 'po2_scale' else 'float'} scales, Int32 biases, BN merged, graph "
            f"equalization, calibration, bias correction")
    SPECS[name] = ("1 graph-mode PTQ", exporter, shape, (-2.0, 2.0), desc,
                   lambda: ptq_model(net, backend, wb, ab, gran, scale, shape, -2.0, 2.0, seed))


_ptq("ptq_resnet18_fx_w8a8_pt_float", "resnet18", "fx", 8, 8, "per_tensor", "float_scale", "qonnx_dyn", IMG64)
_ptq("ptq_resnet18_fx_w4a4_pc_po2", "resnet18", "fx", 4, 4, "per_channel", "po2_scale", "qcdq", IMG64)
_ptq("ptq_mobilenetv2_fx_w8a8_pc_float", "mobilenetv2", "fx", 8, 8, "per_channel", "float_scale", "qonnx_ts", IMG64)
_ptq("ptq_mobilenetv2_layerwise_w4a4_pt_po2", "mobilenetv2", "layerwise", 4, 4, "per_tensor", "po2_scale", "qcdq",
     IMG64)
_ptq("ptq_mobilenetv2x025_fx_w4a4_pc_float", "mobilenetv2x025", "fx", 4, 4, "per_channel", "float_scale", "qcdq",
     IMG64)
_ptq("ptq_squeezenet11_fx_w8a8_pt_po2", "squeezenet11", "fx", 8, 8, "per_tensor", "po2_scale", "qcdq", IMG64)
_ptq("ptq_squeezenet11_layerwise_w8a8_pc_float", "squeezenet11", "layerwise", 8, 8, "per_channel", "float_scale",
     "qonnx_dyn", IMG64)
_ptq("ptq_resnetmini_fx_w8a8_pt_float", "resnetmini", "fx", 8, 8, "per_tensor", "float_scale", "qonnx_dyn", IMG32)
_ptq("ptq_resnetmini_fx_w4a4_pc_po2", "resnetmini", "fx", 4, 4, "per_channel", "po2_scale", "qcdq", IMG32)
_ptq("ptq_resnetmini_layerwise_w8a8_pt_float", "resnetmini", "layerwise", 8, 8, "per_tensor", "float_scale",
     "qonnx_ts", IMG32)


def _bias(name, cls, bits, bias_bits, fixed, pc, exporter, shape):
    desc = (f"{cls.__name__}: {' '.join((cls.__doc__ or '').split())} W{bits}A{bits}, Int{bias_bits}Bias, "
            f"{'fixed-point' if fixed else 'float'} scales, {'per-channel' if pc else 'per-tensor'} weights")
    SPECS[name] = ("2 quantized biases", exporter, shape, (-1.0, 1.0), desc,
                   lambda: bias_model(cls, bits, bias_bits, fixed, pc, shape, -1.0, 1.0, 33))


_bias("bias_mlp_int32_fixed_w8", BiasMlp, 8, 32, True, False, "qonnx_dyn", (1, 64))
_bias("bias_mlp_int32_fixed_w4", BiasMlp, 4, 32, True, False, "qcdq", (1, 64))
_bias("bias_cnn_int16_fixed_w8_pc", BiasCnn, 8, 16, True, True, "qonnx_ts", (1, 3, 16, 16))
_bias("bias_cnn_int32_fixed_w4", BiasCnn, 4, 32, True, False, "qcdq", (1, 3, 16, 16))
_bias("bias_cnn_int32_float_w4_pc", BiasCnn, 4, 32, False, True, "qonnx_dyn", (1, 3, 16, 16))


def _ort(name, net, acts, pc, shape):
    desc = (f"onnxruntime quantize_static (QDQ, MinMax) of a float {net} export: "
            f"{'uint8 asymmetric' if acts == 'u8asym' else 'int8 symmetric'} activations, int8 "
            f"{'per-channel' if pc else 'per-tensor'} weights")
    SPECS[name] = ("3 onnxruntime QDQ", "ort", shape, (-2.0, 2.0), desc,
                   lambda path: ort_quantized(net, acts, pc, shape, -2.0, 2.0, 33, path))


_ort("ort_resnet18_u8asym_pc", "resnet18", "u8asym", True, IMG64)
_ort("ort_resnet18_s8sym_pc", "resnet18", "s8sym", True, IMG64)
_ort("ort_resnetmini_u8asym_pc", "resnetmini", "u8asym", True, IMG32)
_ort("ort_resnetmini_s8sym_pt", "resnetmini", "s8sym", False, IMG32)
_ort("ort_cnn_u8asym_pc", "cnn", "u8asym", True, (1, 3, 16, 16))
_ort("ort_cnn_s8sym_pc", "cnn", "s8sym", True, (1, 3, 16, 16))


def _digits(name, kind, bits, bias_bits, exporter):
    cls = DigitsMlp if kind == "mlp" else DigitsCnn
    desc = (f"{cls.__name__}: {' '.join((cls.__doc__ or '').split())} Trained (QAT) with W{bits}A{bits}"
            + (f", Int{bias_bits}Bias" if bias_bits else ""))
    SPECS[name] = ("8 trained digits", exporter, (1, 1, 8, 8), (0.0, 16.0), desc,
                   lambda: digits_model(kind, bits, bias_bits, 33))


_digits("digits_mlp_w2a2", "mlp", 2, None, "qonnx_dyn")
_digits("digits_mlp_w4a4", "mlp", 4, None, "qcdq")
_digits("digits_cnn_w4a4", "cnn", 4, None, "qonnx_ts")
_digits("digits_cnn_w8a8_int32bias", "cnn", 8, 32, "qcdq")


def export(model: nn.Module, exporter: str, shape: tuple, lo: float, hi: float, path: Path) -> None:
    from brevitas.export import export_onnx_qcdq, export_qonnx

    x = lo + (hi - lo) * torch.rand(shape, generator=torch.Generator().manual_seed(0))
    if exporter == "qcdq":  # the dynamo QCDQ exporter refuses quantized biases
        export_onnx_qcdq(model, x, str(path), dynamo=False)
    else:
        export_qonnx(model, x, str(path), dynamo=exporter == "qonnx_dyn")
    Path(f"{path}.data").unlink(missing_ok=True)  # torch.export's weights file; brevitas re-saved them inline


def export_one(name: str, committed: dict, cached: dict, cache: Path) -> None:
    recipe, exporter, shape, (lo, hi), desc, build = SPECS[name]
    entry = {"kind": recipe, "recipe": recipe, "exporter": exporter, "description": desc,
             "input_shape": list(shape), "input_range": [lo, hi]}
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f"{name}.onnx.tmp"
    test_set = None
    try:
        if exporter == "ort":
            build(tmp)
        else:
            made = build()
            if isinstance(made, tuple):
                made, test_set = made
                entry["accuracy"] = round(test_set["accuracy"], 4)
            export(made, exporter, shape, lo, hi, tmp)
    except Exception as exc:  # noqa: BLE001 - recorded in the manifest
        msg = f"{type(exc).__name__}: {exc}".strip().splitlines()
        entry["error"] = " ".join(msg[:3])[:500]
        committed[name] = entry
        print(f"{name}: export failed: {entry['error']}", file=sys.stderr)
        traceback.print_exc(limit=4)
        tmp.unlink(missing_ok=True)
        return
    proto = onnx.load(str(tmp))
    entry["nodes"] = len(proto.graph.node)
    size = tmp.stat().st_size
    entry["bytes"] = size
    entry["file"] = f"{name}.onnx"
    small = size < LIMIT
    folder = COMMITTED if small else cache
    folder.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, folder / entry["file"])
    if test_set is not None:
        entry["test_set"] = f"{name}.npz"
        np.savez_compressed(folder / entry["test_set"], x=test_set["x"], y=test_set["y"])
    if small:
        committed[name] = entry
        cached.pop(name, None)
    else:
        cached[name] = entry
        committed[name] = {**entry, "cached": True}
    extra = f", test accuracy {entry['accuracy']:.3f}" if "accuracy" in entry else ""
    print(f"{name}: {entry['nodes']} nodes, {size / 1024:.0f} kB -> {'committed' if small else cache}{extra}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", help="export only these models (names of SPECS)")
    ap.add_argument("--cache", type=Path, default=None, help="cache dir (default $FINNLITE_CORPUS/recipes_ptq)")
    args = ap.parse_args()
    cache = args.cache or cache_dir()
    names = args.only or list(SPECS)
    unknown = set(names) - set(SPECS)
    if unknown:
        ap.error(f"unknown model(s) {sorted(unknown)}")

    def load(path: Path) -> dict:
        return json.loads(path.read_text()) if path.is_file() else {}

    committed, cached = load(COMMITTED / "manifest.json"), load(cache / "manifest.json")
    for name in names:
        export_one(name, committed, cached, cache)
        COMMITTED.mkdir(parents=True, exist_ok=True)
        (COMMITTED / "manifest.json").write_text(json.dumps(dict(sorted(committed.items())), indent=1) + "\n")
        if cached:
            (cache / "manifest.json").write_text(json.dumps(dict(sorted(cached.items())), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
