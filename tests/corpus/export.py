"""Build the corpus of small Brevitas exports (issue 23) and write them with a manifest.

Run with the side environment (torch + brevitas), never imported by finnlite's tests:

    $SIDE_PYTHON tests/corpus/export.py [--only NAME ...] [--cache DIR]

Every model is exported twice, with ``export_qonnx(..., dynamo=True)`` (torch.export) and with the TorchScript
exporter (``dynamo=False``); the file names end in ``_dyn`` and ``_ts``. A failing exporter is recorded in the
manifest with its error instead of a file. Weights are random (fixed seeds), every BatchNorm gets random statistics
and affine parameters (about a third of the gammas negative), and activation scales are calibrated with
``brevitas.graph.calibrate.calibration_mode`` on a few batches of inputs in the model's input range, so that the
scales are those a user's export would have. Files under 1 MB go to ``tests/corpus/models/`` (committed, with
``manifest.json``), larger ones to ``$FINNLITE_CORPUS`` (default ``~/.cache/finnlite/corpus``, with its own
``manifest.json``).

Manifest entry: ``{file, kind, description, exporter, input_shape, input_range, nodes, bytes}``, or ``{kind,
description, exporter, error}`` when the exporter failed; the committed manifest also lists the cached models, with
``"cached": true``. ``input_range`` is the range of the calibration data,
which the input quantizer's scale was calibrated to (so it is the input quantizer's range, up to rounding).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Callable

import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F

import brevitas.nn as qnn
from brevitas.export import export_qonnx
from brevitas.graph.calibrate import calibration_mode
from brevitas.quant import (Int8ActPerTensorFloat, Int8WeightPerTensorFloat, ShiftedUint8ActPerTensorFloat,
                            ShiftedUint8WeightPerTensorFloat, TruncTo8bit, RoundTo8bit, Uint8ActPerTensorFloat)

HERE = Path(__file__).resolve().parent
COMMITTED = HERE / "models"
LIMIT = 1 << 20


def cache_dir() -> Path:
    return Path(os.environ.get("FINNLITE_CORPUS", Path.home() / ".cache" / "finnlite" / "corpus"))


# -- helpers -------------------------------------------------------------------------------------------------------
def inq(bits: int = 8, signed: bool = True, **kw) -> qnn.QuantIdentity:
    """The input quantizer: 8-bit signed (or unsigned) per-tensor float scale, calibrated."""
    quant = Int8ActPerTensorFloat if signed else Uint8ActPerTensorFloat
    return qnn.QuantIdentity(act_quant=quant, bit_width=bits, return_quant_tensor=False, **kw)


def relu(bits: int = 4, **kw) -> qnn.QuantReLU:
    kw.setdefault("return_quant_tensor", False)
    return qnn.QuantReLU(bit_width=bits, **kw)


def conv(cin: int, cout: int, k: int = 3, bits: int = 4, pad: int = 1, stride: int = 1, **kw) -> qnn.QuantConv2d:
    return qnn.QuantConv2d(cin, cout, k, padding=pad, stride=stride, bias=kw.pop("bias", False),
                           weight_bit_width=bits, **kw)


def linear(cin: int, cout: int, bits: int = 4, bias: bool = True, **kw) -> qnn.QuantLinear:
    return qnn.QuantLinear(cin, cout, bias=bias, weight_bit_width=bits, **kw)


def randomize_bn(model: nn.Module, gen: torch.Generator) -> None:
    """Random running mean/variance, gamma (about a third negative) and beta for every BatchNorm."""
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            c = m.num_features
            sign = torch.where(torch.rand(c, generator=gen) < 0.33, -1.0, 1.0)
            m.weight.data = sign * (0.5 + torch.rand(c, generator=gen))
            m.bias.data = 0.5 * torch.randn(c, generator=gen)
            m.running_mean.data = 0.5 * torch.randn(c, generator=gen)
            m.running_var.data = 0.5 + torch.rand(c, generator=gen)


def randomize_prelu(model: nn.Module, gen: torch.Generator) -> None:
    for m in model.modules():
        if isinstance(m, nn.PReLU):
            m.weight.data = 0.05 + 0.4 * torch.rand(m.weight.shape, generator=gen)


def calibrate(model: nn.Module, shape: tuple, lo: float, hi: float, gen: torch.Generator, batches: int = 4) -> None:
    """Activation scales from statistics of a few batches in [lo, hi] (eval-mode BatchNorm), then eval."""
    model.eval()
    with torch.no_grad(), calibration_mode(model):
        for _ in range(batches):
            x = lo + (hi - lo) * torch.rand((8,) + tuple(shape[1:]), generator=gen)
            model(x)
    model.eval()


# -- kind 1: TorchScript patterns ----------------------------------------------------------------------------------
class MlpPreproc(nn.Module):
    """Preprocessing (x − 0.5) / 0.25 · 0.5 before the input quantizer, Linear without bias (Transpose + MatMul in
    TorchScript) and with bias (Gemm), BatchNorm1d, 2-bit and 4-bit activations, flatten by ``flatten(1)``."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = inq()
        self.fc1 = linear(64, 32, bits=2, bias=False)
        self.bn1 = nn.BatchNorm1d(32)
        self.act1 = relu(2)
        self.fc2 = linear(32, 32, bits=4, bias=True)
        self.bn2 = nn.BatchNorm1d(32)
        self.act2 = relu(4)
        self.fc3 = linear(32, 10, bits=4, bias=True)

    def forward(self, x):
        x = ((x - 0.5) / 0.25) * 0.5
        x = self.inp(x).flatten(1)
        x = self.act1(self.bn1(self.fc1(x)))
        x = self.act2(self.bn2(self.fc2(x)))
        return self.fc3(x)


class CnnReshape(nn.Module):
    """Conv, BN, ReLU, MaxPool; flatten by ``x.view(x.size(0), -1)`` (Shape/Gather/Concat/Constant nodes in
    TorchScript), Linear without bias, the same 4-bit quantizer configuration on every layer (shared constants)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = inq()
        self.c1, self.b1, self.a1 = conv(3, 8), nn.BatchNorm2d(8), relu(4)
        self.c2, self.b2, self.a2 = conv(8, 8), nn.BatchNorm2d(8), relu(4)
        self.fc = linear(8 * 4 * 4, 10, bias=False)

    def forward(self, x):
        x = self.inp(x)
        x = F.max_pool2d(self.a1(self.b1(self.c1(x))), 2)
        x = F.max_pool2d(self.a2(self.b2(self.c2(x))), 2)
        return self.fc(x.view(x.size(0), -1))


# -- kind 2: Conv1d (RadioML VGG10 style) --------------------------------------------------------------------------
class Vgg10Mini(nn.Module):
    """QuantConv1d + BatchNorm1d + QuantReLU + MaxPool1d, three times; flatten; QuantLinear + BN1d + ReLU; output."""

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = [inq()]
        cin = 2
        for _ in range(3):
            layers += [qnn.QuantConv1d(cin, 8, 3, padding=1, bias=False, weight_bit_width=4), nn.BatchNorm1d(8),
                       relu(4), nn.MaxPool1d(2)]
            cin = 8
        self.features = nn.Sequential(*layers)
        self.fc1, self.bn, self.act = linear(8 * 8, 16, bias=False), nn.BatchNorm1d(16), relu(4)
        self.fc2 = linear(16, 6, bits=8)

    def forward(self, x):
        x = self.features(x).flatten(1)
        return self.fc2(self.act(self.bn(self.fc1(x))))


# -- kind 3: Concat, per-channel activation scales through MaxPool ------------------------------------------------
class ConcatNet(nn.Module):
    """Two conv branches concatenated on channels: ``shared`` — one QuantReLU module quantizes both branches (equal
    scales); otherwise each branch has its own quantizer (unequal scales)."""

    def __init__(self, shared: bool) -> None:
        super().__init__()
        self.inp = inq()
        self.c0, self.b0, self.a0 = conv(3, 8), nn.BatchNorm2d(8), relu(4)
        self.ca, self.ba = conv(8, 8), nn.BatchNorm2d(8)
        self.cb, self.bb = conv(8, 8, k=1, pad=0), nn.BatchNorm2d(8)
        self.qa = relu(4)
        self.qb = self.qa if shared else relu(4)
        self.c2, self.b2, self.a2 = conv(16, 8), nn.BatchNorm2d(8), relu(4)
        self.fc = linear(8, 10, bias=True)

    def forward(self, x):
        x = self.a0(self.b0(self.c0(self.inp(x))))
        x = torch.cat([self.qa(self.ba(self.ca(x))), self.qb(self.bb(self.cb(x)))], dim=1)
        x = self.a2(self.b2(self.c2(x)))
        return self.fc(F.max_pool2d(x, 8).flatten(1))


class PerChannelPool(nn.Module):
    """BN with negative gammas, then a QuantReLU with per-channel scales (``scaling_per_output_channel=True``),
    MaxPool2d, a conv: the MaxPool commutes with the per-channel scale only where it is positive."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = inq()
        self.c1, self.b1 = conv(3, 8), nn.BatchNorm2d(8)
        self.a1 = relu(4, scaling_per_output_channel=True, per_channel_broadcastable_shape=(1, 8, 1, 1),
                       scaling_stats_permute_dims=(1, 0, 2, 3))
        self.c2, self.b2 = conv(8, 8), nn.BatchNorm2d(8)
        self.a2 = qnn.QuantIdentity(act_quant=Int8ActPerTensorFloat, bit_width=4, scaling_per_output_channel=True,
                                    per_channel_broadcastable_shape=(1, 8, 1, 1),
                                    scaling_stats_permute_dims=(1, 0, 2, 3))
        self.fc = linear(8 * 2 * 2, 10, bias=True)

    def forward(self, x):
        x = F.max_pool2d(self.a1(self.b1(self.c1(self.inp(x)))), 2)
        x = F.max_pool2d(self.a2(self.b2(self.c2(x))), 2)
        return self.fc(x.flatten(1))



def pc_relu(bits: int, channels: int) -> qnn.QuantReLU:
    """A QuantReLU with one scale per channel (``scaling_per_output_channel=True``)."""
    return relu(bits, scaling_per_output_channel=True, per_channel_broadcastable_shape=(1, channels, 1, 1),
                scaling_stats_permute_dims=(1, 0, 2, 3))


class PerChannelExact(nn.Module):
    """The exact form of per-channel activation scales: per-channel QuantReLUs through MaxPools into a depthwise
    conv and into a per-tensor requantizer, one of them followed by a BN with negative gammas before its MaxPool
    (a per-channel factor of mixed sign), and a BN with negative gammas right after a conv before a MaxPool; only
    per-tensor scales reach the channel-mixing conv and the classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = inq()
        self.c1, self.b1, self.a1 = conv(3, 8), nn.BatchNorm2d(8), pc_relu(4, 8)
        self.dw, self.b2, self.a2 = conv(8, 8, groups=8), nn.BatchNorm2d(8), pc_relu(4, 8)
        self.bn_after = nn.BatchNorm2d(8)
        self.req = qnn.QuantIdentity(act_quant=Int8ActPerTensorFloat, bit_width=4, return_quant_tensor=False)
        self.c3, self.b3, self.a3 = conv(8, 8), nn.BatchNorm2d(8), relu(4)
        self.fc = linear(8 * 2 * 2, 10, bias=True)

    def forward(self, x):
        x = F.max_pool2d(self.a1(self.b1(self.c1(self.inp(x)))), 2)
        x = self.req(F.max_pool2d(self.bn_after(self.a2(self.b2(self.dw(x)))), 2))
        x = self.a3(F.max_pool2d(self.b3(self.c3(x)), 2))
        return self.fc(x.flatten(1))


# -- kind 4: residual Add ------------------------------------------------------------------------------------------
class ResidualAdd(nn.Module):
    """y = q1(bn(conv(x))) + q2(x') with two quantizers, or one shared quantizer on both branches; requantized."""

    def __init__(self, shared: bool) -> None:
        super().__init__()
        self.inp = inq()
        self.c0, self.b0, self.a0 = conv(3, 8), nn.BatchNorm2d(8), relu(4)
        self.c1, self.b1 = conv(8, 8), nn.BatchNorm2d(8)
        self.q1 = qnn.QuantIdentity(act_quant=Int8ActPerTensorFloat, bit_width=4, return_quant_tensor=False)
        self.q2 = self.q1 if shared else qnn.QuantIdentity(act_quant=Int8ActPerTensorFloat, bit_width=6,
                                                           return_quant_tensor=False)
        self.a2 = relu(4)
        self.fc = linear(8 * 4 * 4, 10, bias=True)

    def forward(self, x):
        x = self.a0(self.b0(self.c0(self.inp(x))))
        y = self.a2(self.q1(self.b1(self.c1(x))) + self.q2(x))
        return self.fc(F.max_pool2d(y, 2).flatten(1))


# -- kind 5: asymmetric quantizers ---------------------------------------------------------------------------------
class Asymmetric(nn.Module):
    """ShiftedUint8ActPerTensorFloat (nonzero zero point) on the input and between layers, asymmetric
    (ShiftedUint8WeightPerTensorFloat) weights on the middle layer."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = qnn.QuantIdentity(act_quant=ShiftedUint8ActPerTensorFloat, return_quant_tensor=False)
        self.fc1, self.bn1 = linear(32, 32, bits=4), nn.BatchNorm1d(32)
        self.a1 = qnn.QuantIdentity(act_quant=ShiftedUint8ActPerTensorFloat, bit_width=4, return_quant_tensor=False)
        self.fc2 = qnn.QuantLinear(32, 16, bias=True, weight_quant=ShiftedUint8WeightPerTensorFloat,
                                   weight_bit_width=4)
        self.bn2, self.a2 = nn.BatchNorm1d(16), relu(4)
        self.fc3 = linear(16, 10, bias=True)

    def forward(self, x):
        x = self.a1(self.bn1(self.fc1(self.inp(x))))
        return self.fc3(self.a2(self.bn2(self.fc2(x))))


# -- kind 6: nonlinear activations between quantizers ------------------------------------------------------------
class Activations(nn.Module):
    """Each block: Linear + BN, then a monotone nonlinearity, then a quantizer (QuantTanh, QuantSigmoid,
    QuantHardTanh, float Hardsigmoid/LeakyReLU/PReLU followed by QuantIdentity)."""

    def __init__(self, which: str) -> None:
        super().__init__()
        self.which = which
        self.inp = inq()
        self.fc1, self.bn1 = linear(32, 32), nn.BatchNorm1d(32)
        acts = {"tanh": lambda: qnn.QuantTanh(bit_width=4),
                "sigmoid": lambda: qnn.QuantSigmoid(bit_width=4),
                "hardtanh": lambda: qnn.QuantHardTanh(bit_width=4, max_val=1.0, min_val=-1.0),
                "hardsigmoid": lambda: nn.Sequential(nn.Hardsigmoid(), qnn.QuantIdentity(bit_width=4)),
                "leakyrelu": lambda: nn.Sequential(nn.LeakyReLU(0.125), qnn.QuantIdentity(bit_width=4)),
                "prelu": lambda: nn.Sequential(nn.PReLU(32), qnn.QuantIdentity(bit_width=4))}
        self.act1 = acts[which]()
        self.fc2, self.bn2, self.act2 = linear(32, 16), nn.BatchNorm1d(16), relu(4)
        self.fc3 = linear(16, 10)

    def forward(self, x):
        x = self.act1(self.bn1(self.fc1(self.inp(x))))
        return self.fc3(self.act2(self.bn2(self.fc2(x))))


# -- kind 7: average pools, 8-bit first/last layers with 4-bit bodies -----------------------------------------------
class Pools(nn.Module):
    """8-bit first conv and last linear, 4-bit body; the pool is one of TruncAvgPool2d (FLOOR / ROUND),
    TruncAdaptiveAvgPool2d, float AdaptiveAvgPool2d, GlobalAveragePool-as-mean, each followed by a requantizer."""

    def __init__(self, which: str) -> None:
        super().__init__()
        self.which = which
        self.inp = inq()
        self.c1, self.b1, self.a1 = conv(3, 8, bits=8), nn.BatchNorm2d(8), relu(4)
        self.c2, self.b2 = conv(8, 8, bits=4), nn.BatchNorm2d(8)
        self.a2 = relu(4, return_quant_tensor=which.startswith("trunc"))
        pools = {"trunc_floor": lambda: qnn.TruncAvgPool2d(2, stride=2, trunc_quant=TruncTo8bit, bit_width=8),
                 "trunc_round": lambda: qnn.TruncAvgPool2d(2, stride=2, trunc_quant=RoundTo8bit, bit_width=8),
                 "trunc_adaptive": lambda: qnn.TruncAdaptiveAvgPool2d((1, 1), trunc_quant=RoundTo8bit, bit_width=8),
                 "float_adaptive": lambda: nn.AdaptiveAvgPool2d((1, 1)),
                 "float_mean": lambda: None}
        self.pool = pools[which]()
        self.req = qnn.QuantIdentity(act_quant=Int8ActPerTensorFloat, bit_width=8, return_quant_tensor=False)
        feat = 8 * 4 * 4 if which in ("trunc_floor", "trunc_round") else 8
        self.fc = linear(feat, 10, bits=8)

    def forward(self, x):
        x = self.a1(self.b1(self.c1(self.inp(x))))
        x = self.a2(self.b2(self.c2(x)))
        if self.which == "float_mean":
            x = x.mean(dim=(2, 3), keepdim=True)
        else:
            x = self.pool(x)
        if hasattr(x, "value"):
            x = x.value
        return self.fc(self.req(x).flatten(1))


# -- kind 8: tokens ------------------------------------------------------------------------------------------------
class Tokens(nn.Module):
    """Conv stem, NCHW → NHWC permute and reshape to (B, HW, C) tokens, a token-wise 3-D QuantLinear + ReLU, transpose
    back to (B, C, HW), flatten, classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = inq()
        self.c1, self.b1, self.a1 = conv(3, 8, stride=2), nn.BatchNorm2d(8), relu(4)
        self.tok = linear(8, 12, bias=True)
        self.a2 = relu(4)
        self.fc = linear(12 * 16, 10, bias=True)

    def forward(self, x):
        x = self.a1(self.b1(self.c1(self.inp(x))))
        b, c, h, w = x.shape
        t = x.permute(0, 2, 3, 1).reshape(b, h * w, c)
        t = self.a2(self.tok(t))
        return self.fc(t.transpose(1, 2).flatten(1))


# -- kind 9: small ResNet (CIFAR style) ----------------------------------------------------------------------------
class Block(nn.Module):
    """A basic block; ``shared``: one quantizer on the residual branch and on the shortcut (the identity shortcut
    is requantized by it), as Brevitas' ResNet examples do, so that both summands have one scale."""

    def __init__(self, cin: int, cout: int, stride: int, shared: bool = False) -> None:
        super().__init__()
        self.shared = shared
        self.c1, self.b1, self.a1 = conv(cin, cout, stride=stride), nn.BatchNorm2d(cout), relu(4)
        self.c2, self.b2 = conv(cout, cout), nn.BatchNorm2d(cout)
        self.q = qnn.QuantIdentity(act_quant=Int8ActPerTensorFloat, bit_width=4, return_quant_tensor=False)
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(conv(cin, cout, k=1, pad=0, stride=stride), nn.BatchNorm2d(cout),
                                      self.q if shared else
                                      qnn.QuantIdentity(act_quant=Int8ActPerTensorFloat, bit_width=4))
        else:
            self.down = None
        self.out = relu(4)

    def forward(self, x):
        y = self.q(self.b2(self.c2(self.a1(self.b1(self.c1(x))))))
        s = self.down(x) if self.down is not None else (self.q(x) if self.shared else x)
        return self.out(y + s)


class ResNetMini(nn.Module):
    """8-bit stem, three basic blocks (two with 1x1-conv downsample shortcuts), float global average pool, 8-bit
    requantizer, 8-bit classifier; ``shared``: each block's summands share one quantizer."""

    def __init__(self, shared: bool = False) -> None:
        super().__init__()
        self.inp = inq()
        self.stem, self.bn, self.act = conv(3, 8, bits=8), nn.BatchNorm2d(8), relu(4)
        self.blocks = nn.Sequential(Block(8, 8, 1, shared), Block(8, 16, 2, shared), Block(16, 16, 2, shared))
        self.req = qnn.QuantIdentity(act_quant=Int8ActPerTensorFloat, bit_width=8)
        self.fc = linear(16, 10, bits=8)

    def forward(self, x):
        x = self.blocks(self.act(self.bn(self.stem(self.inp(x)))))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(self.req(x))


# -- bnn_pynq ------------------------------------------------------------------------------------------------------
def bnn_pynq(name: str) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        from brevitas_examples.bnn_pynq import models
        return getattr(models, name)(pretrained=False)
    return make


# -- the table -----------------------------------------------------------------------------------------------------
#: name -> (kind, builder, input shape, input range, calibrate)
SPECS: dict[str, tuple[str, Callable[[], nn.Module], tuple, tuple[float, float], bool]] = {
    "ts_mlp_preproc": ("1 torchscript patterns", MlpPreproc, (1, 1, 8, 8), (0.0, 1.0), True),
    "ts_cnn_view": ("1 torchscript patterns", CnnReshape, (1, 3, 16, 16), (-1.0, 1.0), True),
    "conv1d_vgg10": ("2 conv1d", Vgg10Mini, (1, 2, 64), (-1.0, 1.0), True),
    "concat_shared": ("3 concat", lambda: ConcatNet(True), (1, 3, 8, 8), (-1.0, 1.0), True),
    "concat_distinct": ("3 concat", lambda: ConcatNet(False), (1, 3, 8, 8), (-1.0, 1.0), True),
    "perchannel_maxpool": ("3 per-channel scales", PerChannelPool, (1, 3, 8, 8), (-1.0, 1.0), True),
    "perchannel_exact": ("3 per-channel scales", PerChannelExact, (1, 3, 16, 16), (-1.0, 1.0), True),
    "residual_distinct": ("4 residual add", lambda: ResidualAdd(False), (1, 3, 8, 8), (-1.0, 1.0), True),
    "residual_shared": ("4 residual add", lambda: ResidualAdd(True), (1, 3, 8, 8), (-1.0, 1.0), True),
    "asymmetric": ("5 asymmetric", Asymmetric, (1, 32), (0.0, 1.0), True),
    **{f"act_{a}": ("6 activations", (lambda a=a: Activations(a)), (1, 32), (-1.0, 1.0), True)
       for a in ("tanh", "sigmoid", "hardtanh", "hardsigmoid", "leakyrelu", "prelu")},
    **{f"pool_{p}": ("7 pools", (lambda p=p: Pools(p)), (1, 3, 8, 8), (-1.0, 1.0), True)
       for p in ("trunc_floor", "trunc_round", "trunc_adaptive", "float_adaptive", "float_mean")},
    "tokens": ("8 tokens", Tokens, (1, 3, 8, 8), (-1.0, 1.0), True),
    "resnet_mini": ("9 resnet", ResNetMini, (1, 3, 16, 16), (-1.0, 1.0), True),
    "resnet_mini_shared": ("9 resnet", lambda: ResNetMini(True), (1, 3, 16, 16), (-1.0, 1.0), True),
    "bnn_tfc_1w2a": ("bnn_pynq", bnn_pynq("tfc_1w2a"), (1, 1, 28, 28), (0.0, 1.0), False),
    "bnn_sfc_1w1a": ("bnn_pynq", bnn_pynq("sfc_1w1a"), (1, 1, 28, 28), (0.0, 1.0), False),
    "bnn_lfc_1w2a": ("bnn_pynq", bnn_pynq("lfc_1w2a"), (1, 1, 28, 28), (0.0, 1.0), False),
    "bnn_cnv_1w2a": ("bnn_pynq", bnn_pynq("cnv_1w2a"), (1, 3, 32, 32), (-1.0, 1.0), False),
}


def build(name: str, seed: int) -> nn.Module:
    kind, make, shape, (lo, hi), calib = SPECS[name]
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = make()
    model.eval()
    randomize_bn(model, gen)
    randomize_prelu(model, gen)
    if calib:
        calibrate(model, shape, lo, hi, gen)
    return model


def export_one(name: str, seed: int, committed: dict, cached: dict, cache: Path) -> None:
    kind, make, shape, (lo, hi), _ = SPECS[name]
    for tag, dynamo in (("dyn", True), ("ts", False)):
        key = f"{name}_{tag}"
        model = build(name, seed)
        entry = {"kind": kind, "exporter": "dynamo" if dynamo else "torchscript",
                 "description": " ".join((type(model).__doc__ or type(model).__name__).split()),
                 "input_shape": list(shape), "input_range": [lo, hi], "seed": seed}
        x = lo + (hi - lo) * torch.rand(shape, generator=torch.Generator().manual_seed(seed))
        tmp = cache / f"{key}.onnx.tmp"
        tmp.parent.mkdir(parents=True, exist_ok=True)
        try:
            export_qonnx(model, x, str(tmp), dynamo=dynamo)
        except Exception as exc:  # noqa: BLE001 - recorded in the manifest
            msg = f"{type(exc).__name__}: {exc}".strip().splitlines()
            entry["error"] = " ".join(msg[:3])[:500]
            committed[key] = entry
            print(f"{key}: export failed: {entry['error']}", file=sys.stderr)
            traceback.print_exc(limit=2)
            tmp.unlink(missing_ok=True)
            Path(f"{tmp}.data").unlink(missing_ok=True)
            continue
        # torch.export's ONNX writer leaves the weights it wrote beside the file; brevitas re-saves them inline
        Path(f"{tmp}.data").unlink(missing_ok=True)
        size = tmp.stat().st_size
        proto = onnx.load(str(tmp))
        entry["nodes"] = len(proto.graph.node)
        entry["bytes"] = size
        entry["file"] = f"{key}.onnx"
        if size < LIMIT:
            COMMITTED.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, COMMITTED / entry["file"])
            committed[key] = entry
            cached.pop(key, None)
        else:
            os.replace(tmp, cache / entry["file"])
            cached[key] = entry
            committed[key] = {**entry, "cached": True}  # listed, so that the tests can name what is missing
        print(f"{key}: {entry['nodes']} nodes, {size / 1024:.0f} kB -> {'committed' if size < LIMIT else cache}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", help="export only these models (names of SPECS)")
    ap.add_argument("--cache", type=Path, default=None, help="cache dir (default $FINNLITE_CORPUS)")
    ap.add_argument("--seed", type=int, default=23)
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
        export_one(name, args.seed, committed, cached, cache)
    COMMITTED.mkdir(parents=True, exist_ok=True)
    (COMMITTED / "manifest.json").write_text(json.dumps(dict(sorted(committed.items())), indent=1) + "\n")
    if cached:
        cache.mkdir(parents=True, exist_ok=True)
        (cache / "manifest.json").write_text(json.dumps(dict(sorted(cached.items())), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
