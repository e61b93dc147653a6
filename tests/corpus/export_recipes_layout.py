"""Build the layout, multi-I/O, squeeze-excitation and audio recipes of issue 33 (4–7) and write them with a manifest.

Run with the side environment (torch + brevitas), never imported by finnlite's tests:

    $SIDE_PYTHON tests/corpus/export_recipes_layout.py [--only NAME ...] [--cache DIR]

As ``tests/corpus/export.py`` does (and with its helpers): every model is exported with
``export_qonnx(..., dynamo=True)`` (files ``*_dyn.onnx``) and with the TorchScript exporter (``*_ts.onnx``); a
failing exporter is recorded in the manifest with its error; weights are random with fixed seeds, every BatchNorm
gets random statistics and affine parameters (about a third of the gammas negative), and activation scales are
calibrated on a few batches of inputs in the model's input range. Files under 1 MB go to
``tests/corpus/models/recipes_layout/`` (committed, with its own ``manifest.json``), larger ones to
``$FINNLITE_CORPUS/recipes_layout`` (default ``~/.cache/finnlite/corpus/recipes_layout``).

Manifest entry: as ``export.py``'s (``file, kind, description, exporter, input_shape, input_range, seed, nodes,
bytes``); a model with several inputs has one shape and one range per input, in the graph's input order
(``input_shape: [[...], [...]]``, ``input_range: [[lo, hi], [lo, hi]]``).

The recipes (issue 33):

* 4 layout and resampling ops between quantized layers: grouped convolutions (groups 2 and 4, not depthwise),
  dilated convolutions, a ShuffleNet channel shuffle (Reshape–Transpose–Reshape), the ESPCN super-resolution
  models of ``brevitas_examples.super_resolution`` (PixelShuffle = DepthToSpace), nearest-neighbour upsampling
  (``nn.Upsample`` and brevitas' ``QuantUpsamplingNearest2d``, ONNX Resize), a U-Net-style decoder
  (``QuantConvTranspose2d`` and skip Concats), average pools with a kernel smaller than the map, an Inception
  branch with a padded MaxPool on signed activations;
* 5 two graph inputs and two graph outputs (an image and a side vector concatenated after a Flatten; a main and an
  auxiliary head);
* 6 squeeze-excitation: global pool → FC → ReLU → FC → quantized sigmoid gate → channel-wise Mul (and the same
  with a float gate, which cannot be exact);
* 7 QuartzNet (``brevitas_examples.speech_to_text``: separable Conv1d, residual) and MelGAN
  (``brevitas_examples.text_to_speech``: ConvTranspose1d, LeakyReLU, 16-bit Tanh output), at small sizes.
"""

from __future__ import annotations

import argparse
import configparser
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
from brevitas.quant import Int8ActPerTensorFloat, Uint8ActPerTensorFloat

sys.path.insert(0, str(Path(__file__).resolve().parent))
from export import conv, inq, linear, randomize_bn, relu  # noqa: E402 - the corpus' helpers, beside this file

HERE = Path(__file__).resolve().parent
SUBDIR = "recipes_layout"
COMMITTED = HERE / "models" / SUBDIR
LIMIT = 1 << 20


def cache_dir() -> Path:
    return Path(os.environ.get("FINNLITE_CORPUS", Path.home() / ".cache" / "finnlite" / "corpus")) / SUBDIR


def sact(bits: int = 4) -> qnn.QuantIdentity:
    """A signed activation quantizer (per-tensor float scale)."""
    return qnn.QuantIdentity(act_quant=Int8ActPerTensorFloat, bit_width=bits, return_quant_tensor=False)


def value(x):
    return x.value if hasattr(x, "value") else x


# -- 4a grouped convolutions -----------------------------------------------------------------------------------------
class GroupedConv(nn.Module):
    """Conv stem, then a grouped conv with groups=2 and one with groups=4 (neither depthwise), each with BN and a
    ReLU quantizer; MaxPool, flatten, classifier."""

    def __init__(self, bits: int = 4, width: int = 16) -> None:
        super().__init__()
        self.inp = inq()
        self.c1, self.b1, self.a1 = conv(3, 8, bits=8), nn.BatchNorm2d(8), relu(bits)
        self.c2, self.b2, self.a2 = conv(8, width, bits=bits, groups=2), nn.BatchNorm2d(width), relu(bits)
        self.c3, self.b3, self.a3 = conv(width, width, bits=bits, groups=4), nn.BatchNorm2d(width), relu(bits)
        self.fc = linear(width * 4 * 4, 10, bits=8)

    def forward(self, x):
        x = self.a1(self.b1(self.c1(self.inp(x))))
        x = self.a2(self.b2(self.c2(x)))
        x = F.max_pool2d(self.a3(self.b3(self.c3(x))), 2)
        return self.fc(x.flatten(1))


# -- 4b dilated convolutions -----------------------------------------------------------------------------------------
class DilatedConv(nn.Module):
    """Convolutions with dilation 2 (padding 2) and 3 (padding 3), the second one grouped (groups=2) if asked; BN,
    ReLU quantizers, global max pool, classifier."""

    def __init__(self, grouped: bool = False, bits: int = 4) -> None:
        super().__init__()
        self.inp = inq()
        self.c1, self.b1, self.a1 = conv(3, 8, bits=8, pad=2, dilation=2), nn.BatchNorm2d(8), relu(bits)
        self.c2, self.b2, self.a2 = (conv(8, 8, bits=bits, pad=3, dilation=3, groups=2 if grouped else 1),
                                     nn.BatchNorm2d(8), relu(bits))
        self.fc = linear(8 * 4, 10, bits=8)

    def forward(self, x):
        x = self.a1(self.b1(self.c1(self.inp(x))))
        x = F.max_pool2d(self.a2(self.b2(self.c2(x))), 4)
        return self.fc(x.flatten(1))


# -- 4c channel shuffle (ShuffleNet unit) ----------------------------------------------------------------------------
def channel_shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    """ShuffleNet's shuffle, as torchvision writes it: view, transpose, contiguous, view."""
    b, c, h, w = x.shape
    x = x.view(b, groups, c // groups, h, w)
    x = torch.transpose(x, 1, 2).contiguous()
    return x.view(b, c, h, w)


class ShuffleUnit(nn.Module):
    """ShuffleNet-v1 style: grouped 1×1 conv + BN + ReLU quantizer, channel shuffle, depthwise 3×3 conv + BN +
    signed quantizer, grouped 1×1 conv + BN, a residual Add with the unit's input (one shared quantizer), ReLU
    quantizer; global average pool, requantizer, classifier."""

    def __init__(self, groups: int, width: int = 16) -> None:
        super().__init__()
        self.groups = groups
        self.inp = inq()
        self.c0, self.b0, self.a0 = conv(3, width, bits=8), nn.BatchNorm2d(width), relu(4)
        self.g1, self.bg1, self.ag1 = conv(width, width, k=1, pad=0, groups=groups), nn.BatchNorm2d(width), relu(4)
        self.dw, self.bdw, self.adw = conv(width, width, groups=width), nn.BatchNorm2d(width), sact(4)
        self.g2, self.bg2 = conv(width, width, k=1, pad=0, groups=groups), nn.BatchNorm2d(width)
        self.q = sact(4)
        self.out = relu(4)
        self.req = sact(8)
        self.fc = linear(width, 10, bits=8)

    def forward(self, x):
        x = self.a0(self.b0(self.c0(self.inp(x))))
        y = channel_shuffle(self.ag1(self.bg1(self.g1(x))), self.groups)
        y = self.bg2(self.g2(self.adw(self.bdw(self.dw(y)))))
        x = self.out(self.q(y) + self.q(x))
        return self.fc(self.req(F.adaptive_avg_pool2d(x, 1).flatten(1)))


# -- 4d ESPCN (brevitas_examples.super_resolution) ------------------------------------------------------------------
def espcn(upscale: int, bits: int) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        from brevitas_examples.super_resolution.models import quant_espcn_base
        return quant_espcn_base(upscale_factor=upscale, weight_bit_width=bits, act_bit_width=bits)
    return make


# -- 4e nearest-neighbour upsampling ---------------------------------------------------------------------------------
class Upsample(nn.Module):
    """Conv + BN + ReLU quantizer at half resolution, ``nn.Upsample(scale_factor=2, mode="nearest")`` (or brevitas'
    ``QuantUpsamplingNearest2d`` when ``quant``), a conv at full resolution, BN, ReLU quantizer, MaxPool, classifier."""

    def __init__(self, quant: bool = False) -> None:
        super().__init__()
        self.inp = inq()
        self.c1, self.b1, self.a1 = conv(3, 8, bits=8, stride=2), nn.BatchNorm2d(8), relu(4)
        self.up = (qnn.QuantUpsamplingNearest2d(scale_factor=2, return_quant_tensor=True) if quant else
                   nn.Upsample(scale_factor=2, mode="nearest"))
        if quant:
            self.a1 = relu(4, return_quant_tensor=True)
        self.c2, self.b2, self.a2 = conv(8, 8), nn.BatchNorm2d(8), relu(4)
        self.fc = linear(8 * 2 * 2, 10, bits=8)

    def forward(self, x):
        x = value(self.up(self.a1(self.b1(self.c1(self.inp(x))))))
        x = F.max_pool2d(self.a2(self.b2(self.c2(x))), 4)
        return self.fc(x.flatten(1))


class SubpixelUpsample(nn.Module):
    """The ESPCN example's ``QuantNearestNeighborConvolution`` (quantizer, QuantUpsamplingNearest2d, conv) in a
    small encoder–decoder with a 4-D image output (an 8-bit unsigned output quantizer)."""

    def __init__(self) -> None:
        super().__init__()
        from brevitas_examples.super_resolution.models.common import QuantNearestNeighborConvolution
        self.inp = inq(signed=False)
        self.c1, self.b1 = conv(1, 8, bits=8, stride=2), nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.up = QuantNearestNeighborConvolution(8, 4, upscale_factor=2, act_bit_width=4, weight_bit_width=4,
                                                  bias=False)
        self.out = qnn.QuantReLU(act_quant=Uint8ActPerTensorFloat, bit_width=8, return_quant_tensor=False)

    def forward(self, x):
        x = self.relu(self.b1(self.c1(self.inp(x))))
        return self.out(self.up(x))


# -- 4f U-Net decoder --------------------------------------------------------------------------------------------------
class UNet(nn.Module):
    """Two encoder stages (conv, BN, ReLU quantizer, MaxPool), a bottleneck, and two decoder stages, each a
    ``QuantConvTranspose2d`` (kernel 2, stride 2, or kernel 3, stride 2, padding 1, output_padding 1) with BN and a
    ReLU quantizer, concatenated with the encoder's skip tensor, then a conv; a 1×1 conv head to a 4-D map. As FINN
    flows want it, the two inputs of each Concat share one quantizer (the skip tensor is requantized by the decoder's
    ReLU quantizer), so that the concatenation has one scale."""

    def __init__(self, k3: bool = False, bits: int = 4) -> None:
        super().__init__()
        self.inp = inq()
        self.e1, self.be1, self.ae1 = conv(3, 8, bits=8), nn.BatchNorm2d(8), relu(bits)
        self.e2, self.be2, self.ae2 = conv(8, 16, bits=bits), nn.BatchNorm2d(16), relu(bits)
        self.m, self.bm, self.am = conv(16, 16, bits=bits), nn.BatchNorm2d(16), relu(bits)
        kw = dict(kernel_size=3, stride=2, padding=1, output_padding=1) if k3 else dict(kernel_size=2, stride=2)
        self.u2 = qnn.QuantConvTranspose2d(16, 16, bias=False, weight_bit_width=bits, **kw)
        self.bu2, self.au2 = nn.BatchNorm2d(16), relu(bits)
        self.d2, self.bd2, self.ad2 = conv(32, 8, bits=bits), nn.BatchNorm2d(8), relu(bits)
        self.u1 = qnn.QuantConvTranspose2d(8, 8, bias=False, weight_bit_width=bits, **kw)
        self.bu1, self.au1 = nn.BatchNorm2d(8), relu(bits)
        self.d1, self.bd1, self.ad1 = conv(16, 8, bits=bits), nn.BatchNorm2d(8), relu(bits)
        self.head = conv(8, 2, k=1, pad=0, bits=8, bias=True)

    def forward(self, x):
        s1 = self.ae1(self.be1(self.e1(self.inp(x))))
        s2 = self.ae2(self.be2(self.e2(F.max_pool2d(s1, 2))))
        m = self.am(self.bm(self.m(F.max_pool2d(s2, 2))))
        y = self.au2(self.bu2(self.u2(m)))
        y = self.ad2(self.bd2(self.d2(torch.cat([y, self.au2(s2)], dim=1))))
        y = self.au1(self.bu1(self.u1(y)))
        y = self.ad1(self.bd1(self.d1(torch.cat([y, self.au1(s1)], dim=1))))
        return self.head(y)


# -- 4g average pools with a kernel smaller than the map -------------------------------------------------------------
class SmallAvgPool(nn.Module):
    """Float ``nn.AvgPool2d`` between quantizers with a kernel smaller than the map: kernel 2 stride 2, or kernel 3
    stride 1 padding 1 (``count_include_pad``: the border averages count the zeros), then a requantizer, a conv and
    the classifier."""

    def __init__(self, padded: bool) -> None:
        super().__init__()
        self.inp = inq()
        self.c1, self.b1, self.a1 = conv(3, 8, bits=8), nn.BatchNorm2d(8), relu(4)
        self.pool = nn.AvgPool2d(3, stride=1, padding=1) if padded else nn.AvgPool2d(2)
        self.req = relu(4)
        self.c2, self.b2, self.a2 = conv(8, 8), nn.BatchNorm2d(8), relu(4)
        self.pool_out = 4 if padded else 2
        self.fc = linear(8 * 2 * 2, 10, bits=8)

    def forward(self, x):
        x = self.req(self.pool(self.a1(self.b1(self.c1(self.inp(x))))))
        x = F.max_pool2d(self.a2(self.b2(self.c2(x))), self.pool_out)
        return self.fc(x.flatten(1))


# -- 4h Inception branch: padded MaxPool on signed activations ------------------------------------------------------
class InceptionPool(nn.Module):
    """A signed quantizer (``bits``) after conv + BN, then an Inception block: a 1×1 conv branch and a
    ``MaxPool2d(3, stride=1, padding=1)`` → 1×1 conv branch (the max pool pads the signed levels), concatenated,
    requantized; classifier."""

    def __init__(self, bits: int = 4) -> None:
        super().__init__()
        self.inp = inq()
        self.c1, self.b1, self.a1 = conv(3, 8, bits=8), nn.BatchNorm2d(8), sact(bits)
        self.br1, self.bb1 = conv(8, 8, k=1, pad=0), nn.BatchNorm2d(8)
        self.br2, self.bb2 = conv(8, 8, k=1, pad=0), nn.BatchNorm2d(8)
        self.q = relu(4)
        self.fc = linear(16 * 2 * 2, 10, bits=8)

    def forward(self, x):
        x = self.a1(self.b1(self.c1(self.inp(x))))
        y = torch.cat([self.bb1(self.br1(x)), self.bb2(self.br2(F.max_pool2d(x, 3, stride=1, padding=1)))], dim=1)
        return self.fc(F.max_pool2d(self.q(y), 4).flatten(1))


# -- 5 two inputs, two outputs ------------------------------------------------------------------------------------
class TwoInTwoOut(nn.Module):
    """An image (8-bit input quantizer, two convs with BN and ReLU quantizers, the second with stride 2) and a side
    vector, concatenated after a Flatten, a FC + BN + ReLU quantizer and the main head; an auxiliary head from the
    image features: global average pool, requantizer, FC. The side vector's input quantizer also requantizes the
    flattened image features (one quantizer on both inputs of the Concat, as FINN flows want)."""

    def __init__(self, side: int = 6, width: int = 8, bits: int = 4) -> None:
        super().__init__()
        self.inp = inq()
        self.vin = inq()
        self.c1, self.b1, self.a1 = conv(3, width, bits=8), nn.BatchNorm2d(width), relu(bits)
        self.c2, self.b2, self.a2 = conv(width, width, bits=bits, stride=2), nn.BatchNorm2d(width), relu(bits)
        self.fc1, self.bn, self.act = linear(width * 16 + side, 16, bits=bits), nn.BatchNorm1d(16), relu(bits)
        self.main = linear(16, 4, bits=8)
        self.req = relu(8)
        self.aux = linear(width, 3, bits=8)

    def forward(self, x, v):
        f = self.a2(self.b2(self.c2(self.a1(self.b1(self.c1(self.inp(x)))))))
        h = torch.cat([self.vin(f.flatten(1)), self.vin(v)], dim=1)
        main = self.main(self.act(self.bn(self.fc1(h))))
        aux = self.aux(self.req(F.adaptive_avg_pool2d(f, 1).flatten(1)))
        return main, aux


# -- 6 squeeze-excitation ---------------------------------------------------------------------------------------------
class SqueezeExcite(nn.Module):
    """Conv + BN + ReLU quantizer, then squeeze-excitation: global average pool, FC, ReLU quantizer, FC, a gate
    (``QuantSigmoid`` with ``gate_bits``, or a float ``Sigmoid`` when ``gate_bits`` is 0), channel-wise Mul of the
    features by the gate, a requantizer; conv, classifier."""

    def __init__(self, width: int = 16, reduction: int = 4, bits: int = 4, gate_bits: int = 4) -> None:
        super().__init__()
        self.inp = inq()
        self.c1, self.b1, self.a1 = conv(3, width, bits=8), nn.BatchNorm2d(width), relu(bits)
        self.fc1 = linear(width, width // reduction, bits=bits)
        self.r = relu(bits)
        self.fc2 = linear(width // reduction, width, bits=bits)
        self.gate = qnn.QuantSigmoid(bit_width=gate_bits, return_quant_tensor=False) if gate_bits else nn.Sigmoid()
        self.req = relu(bits)
        self.c2, self.b2, self.a2 = conv(width, 8), nn.BatchNorm2d(8), relu(bits)
        self.fc = linear(8 * 4, 10, bits=8)

    def forward(self, x):
        x = self.a1(self.b1(self.c1(self.inp(x))))
        s = F.adaptive_avg_pool2d(x, 1).flatten(1)
        g = self.gate(self.fc2(self.r(self.fc1(s))))
        x = self.req(x * g.view(g.shape[0], -1, 1, 1))
        x = F.max_pool2d(self.a2(self.b2(self.c2(x))), 4)
        return self.fc(x.flatten(1))


# -- 7 QuartzNet and MelGAN -----------------------------------------------------------------------------------------
QUARTZNET_TOPOLOGY = [
    {"filters": 32, "repeat": 1, "kernel": [11], "stride": [2], "dilation": [1], "dropout": 0.0, "residual": False,
     "separable": True},
    {"filters": 32, "repeat": 2, "kernel": [13], "stride": [1], "dilation": [1], "dropout": 0.0, "residual": True,
     "separable": True},
    {"filters": 48, "repeat": 2, "kernel": [15], "stride": [1], "dilation": [1], "dropout": 0.0, "residual": True,
     "separable": True},
    {"filters": 48, "repeat": 1, "kernel": [17], "stride": [1], "dilation": [2], "dropout": 0.0, "residual": False,
     "separable": True},
    {"filters": 64, "repeat": 1, "kernel": [1], "stride": [1], "dilation": [1], "dropout": 0.0, "residual": False},
]


def _quartznet_parts():
    """``brevitas_examples/speech_to_text/quartznet/parts`` as a package whose ``__init__`` is not run (it imports
    the data pipeline's dependencies, librosa and others, which the model does not need): its ``quartznet`` module
    (JasperBlock) and ``common`` module (the quantized layer factories)."""
    import importlib
    import importlib.util
    import types

    root = Path(importlib.util.find_spec("brevitas_examples").submodule_search_locations[0]) / "speech_to_text"
    if "_quartznet_parts" not in sys.modules:
        pkg = types.ModuleType("_quartznet_parts")
        pkg.__path__ = [str(root / "quartznet" / "parts")]
        sys.modules["_quartznet_parts"] = pkg
    return (importlib.import_module("_quartznet_parts.quartznet"), importlib.import_module("_quartznet_parts.common"),
            root / "cfg")


class QuartzNet(nn.Module):
    """``brevitas_examples.speech_to_text``'s QuartzNet with the example's quantization config ``cfg``: its
    ``JasperBlock`` s (separable Conv1d, BatchNorm1d, per-channel or per-tensor ReLU/HardTanh quantizers, residual
    1×1 convs) on a small topology (five blocks, 32–64 filters, kernels 11–17, one of dilation 2, residual blocks
    of two sub-blocks) over 32 mel features, as the example's encoder builds them in export mode (no masking), and
    the CTC decoder's 1×1 Conv1d with bias; the logits are the output (the greedy CTC decoding is left out). An
    8-bit signed input quantizer."""

    def __init__(self, cfg_name: str) -> None:
        super().__init__()
        parts, common, cfg_dir = _quartznet_parts()
        cfg = configparser.ConfigParser()
        cfg.read(cfg_dir / f"{cfg_name}.ini")
        outer, inner = cfg.getint("QUANT", "OUTER_LAYERS_BIT_WIDTH"), cfg.getint("QUANT", "INNER_LAYERS_BIT_WIDTH")
        blocks, feat = [], 32
        for i, lcfg in enumerate(QUARTZNET_TOPOLOGY):
            blocks.append(parts.JasperBlock(
                feat, lcfg["filters"], repeat=lcfg["repeat"], kernel_size=lcfg["kernel"], stride=lcfg["stride"],
                dilation=lcfg["dilation"], dropout=lcfg["dropout"], residual=lcfg["residual"],
                separable=lcfg.get("separable", False), activation="relu", conv_mask=False,
                bit_width=outer if i == 0 else inner, absolute_act_val=cfg.getint("ACTIVATIONS", "ABS_ACT_VAL"),
                activation_inner_scaling_per_output_channel=cfg.getboolean("ACTIVATIONS",
                                                                           "INNER_SCALING_PER_CHANNEL"),
                activation_other_scaling_per_output_channel=cfg.getboolean("ACTIVATIONS",
                                                                           "OTHER_SCALING_PER_CHANNEL"),
                weight_scaling_per_output_channel=cfg.getboolean("WEIGHT", "ENCODER_SCALING_PER_OUTPUT_CHANNEL"),
                fused_bn=cfg.getboolean("QUANT", "FUSED_BN")))
            feat = lcfg["filters"]
        self.encoder = nn.Sequential(*blocks)
        self.encoder.apply(lambda m: parts.init_weights(m, mode="xavier_uniform"))
        self.decoder = common.make_quantconv1d(
            feat, 29, kernel_size=1, bias=True, bit_width=outer,
            scaling_per_channel=cfg.getboolean("WEIGHT", "DECODER_SCALING_PER_OUTPUT_CHANNEL"))
        self.inp = sact(8)

    def forward(self, x):
        out, _ = self.encoder(([self.inp(x)], None))
        return self.decoder(out[-1])


class MelGAN(nn.Module):
    """``brevitas_examples.text_to_speech``'s MelGAN generator at a small width: the example's own blocks
    (``make_quantconv1d``, ``make_transpconv1d`` with weight norm, ``ResStack`` with dilations 1, 3, 9, LeakyReLU
    followed by a QuantHardTanh) and its 16-bit ``QuantTanh`` output; two upsampling stages (ConvTranspose1d kernel
    16 stride 8 padding 4, kernel 4 stride 2 padding 1). ``(mel + 5) / 5`` as in the example, then an 8-bit input
    quantizer (``input_quant``) or, as in the example, none (the first Conv1d reads the float input)."""

    def __init__(self, mel: int = 16, width: int = 32, bits: int = 8, last_bits: int = 16,
                 input_quant: bool = True) -> None:
        super().__init__()
        from brevitas_examples.text_to_speech.melgan.common import (make_hardtanh_activation,
                                                                    make_leakyRelu_activation, make_quantconv1d,
                                                                    make_tanh_activation, make_transpconv1d)
        from brevitas_examples.text_to_speech.melgan.res_stack_brevitas import ResStack

        wn = nn.utils.weight_norm
        self.inp = make_hardtanh_activation(bits) if input_quant else nn.Identity()
        self.generator = nn.Sequential(
            wn(make_quantconv1d(mel, width, kernel_size=7, stride=1, padding=3, bit_width=bits)),
            make_leakyRelu_activation(bits),
            wn(make_transpconv1d(width, width // 2, kernel_size=16, stride=8, padding=4, bit_width=bits)),
            ResStack(width // 2, bit_width=bits),
            make_leakyRelu_activation(bits),
            wn(make_transpconv1d(width // 2, width // 4, kernel_size=4, stride=2, padding=1, bit_width=bits)),
            ResStack(width // 4, bit_width=bits),
            make_leakyRelu_activation(bits),
            wn(make_quantconv1d(width // 4, 1, kernel_size=7, stride=1, padding=3, bit_width=bits)),
            make_tanh_activation(bit_width=last_bits))

    def forward(self, mel):
        return self.generator(self.inp((mel + 5.0) / 5.0))


# -- the table -----------------------------------------------------------------------------------------------------
#: name -> (kind, builder, input shape(s), input range(s), calibrate)
SPECS: dict[str, tuple] = {
    "grouped_4b": ("4 grouped conv", lambda: GroupedConv(4, 16), (1, 3, 8, 8), (-1.0, 1.0), True),
    "grouped_8b": ("4 grouped conv", lambda: GroupedConv(8, 24), (1, 3, 8, 8), (-1.0, 1.0), True),
    "dilated": ("4 dilated conv", lambda: DilatedConv(False), (1, 3, 8, 8), (-1.0, 1.0), True),
    "dilated_grouped": ("4 dilated conv", lambda: DilatedConv(True, 6), (1, 3, 8, 8), (-1.0, 1.0), True),
    "shuffle_g2": ("4 channel shuffle", lambda: ShuffleUnit(2, 16), (1, 3, 8, 8), (-1.0, 1.0), True),
    "shuffle_g4": ("4 channel shuffle", lambda: ShuffleUnit(4, 16), (1, 3, 8, 8), (-1.0, 1.0), True),
    "espcn_x2_w4a4": ("4 pixel shuffle", espcn(2, 4), (1, 3, 8, 8), (0.0, 1.0), True),
    "espcn_x3_w8a8": ("4 pixel shuffle", espcn(3, 8), (1, 3, 6, 6), (0.0, 1.0), True),
    "upsample_nearest": ("4 upsample", lambda: Upsample(False), (1, 3, 8, 8), (-1.0, 1.0), True),
    "upsample_quant": ("4 upsample", lambda: Upsample(True), (1, 3, 8, 8), (-1.0, 1.0), True),
    "upsample_nnconv": ("4 upsample", SubpixelUpsample, (1, 1, 8, 8), (0.0, 1.0), True),
    "unet_k2": ("4 conv transpose", lambda: UNet(False), (1, 3, 8, 8), (-1.0, 1.0), True),
    "unet_k3": ("4 conv transpose", lambda: UNet(True, 8), (1, 3, 8, 8), (-1.0, 1.0), True),
    "avgpool_k2": ("4 average pool", lambda: SmallAvgPool(False), (1, 3, 8, 8), (-1.0, 1.0), True),
    "avgpool_k3_pad": ("4 average pool", lambda: SmallAvgPool(True), (1, 3, 8, 8), (-1.0, 1.0), True),
    "maxpool_signed_4b": ("4 signed padded max pool", lambda: InceptionPool(4), (1, 3, 8, 8), (-1.0, 1.0), True),
    "maxpool_signed_8b": ("4 signed padded max pool", lambda: InceptionPool(8), (1, 3, 8, 8), (-1.0, 1.0), True),
    "two_io": ("5 two inputs, two outputs", lambda: TwoInTwoOut(6, 8, 4), ((1, 3, 8, 8), (1, 6)),
               ((-1.0, 1.0), (0.0, 1.0)), True),
    "two_io_8b": ("5 two inputs, two outputs", lambda: TwoInTwoOut(5, 12, 8), ((1, 3, 8, 8), (1, 5)),
                  ((-1.0, 1.0), (0.0, 2.0)), True),
    "se_4b": ("6 squeeze-excitation", lambda: SqueezeExcite(16, 4, 4, 4), (1, 3, 8, 8), (-1.0, 1.0), True),
    "se_8b": ("6 squeeze-excitation", lambda: SqueezeExcite(24, 2, 8, 8), (1, 3, 8, 8), (-1.0, 1.0), True),
    "se_float_gate": ("6 squeeze-excitation", lambda: SqueezeExcite(16, 4, 4, 0), (1, 3, 8, 8), (-1.0, 1.0),
                      True),
    "quartznet_pc4b": ("7 quartznet", lambda: QuartzNet("quant_quartznet_perchannelscaling_4b"), (1, 32, 32),
                       (-1.0, 1.0), True),
    "quartznet_pt8b": ("7 quartznet", lambda: QuartzNet("quant_quartznet_pertensorscaling_8b"), (1, 32, 32),
                       (-1.0, 1.0), True),
    "melgan_8b": ("7 melgan", lambda: MelGAN(16, 32, 8, 16, True), (1, 16, 8), (-6.0, 1.0), True),
    "melgan_float_input": ("7 melgan", lambda: MelGAN(16, 16, 8, 16, False), (1, 16, 6), (-6.0, 1.0), True),
}


def _shapes(spec: tuple) -> list[tuple]:
    shape = spec[2]
    return list(shape) if isinstance(shape[0], tuple) else [shape]


def _ranges(spec: tuple) -> list[tuple]:
    rng = spec[3]
    return list(rng) if isinstance(rng[0], tuple) else [rng]


def _inputs(spec: tuple, gen: torch.Generator, batch: int | None = None) -> tuple:
    return tuple(lo + (hi - lo) * torch.rand(((batch,) + tuple(s[1:])) if batch else s, generator=gen)
                 for s, (lo, hi) in zip(_shapes(spec), _ranges(spec)))


def calibration_safe_upsampling(model: nn.Module) -> None:
    """brevitas' QuantUpsamplingNearest2d needs a QuantTensor, which calibration mode (quantizers off) does not
    give: there it upsamples the plain tensor as the quantized one would be (export is unaffected)."""
    from brevitas.quant_tensor import QuantTensor

    for m in model.modules():
        if isinstance(m, qnn.QuantUpsamplingNearest2d):
            quant_forward = m.forward

            def forward(x, m=m, quant_forward=quant_forward):
                if isinstance(x, QuantTensor):
                    return quant_forward(x)
                return F.interpolate(x, m.size, m.scale_factor, m.mode, m.align_corners)

            m.forward = forward


def build(name: str, seed: int) -> nn.Module:
    spec = SPECS[name]
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = spec[1]()
    model.eval()
    randomize_bn(model, gen)
    calibration_safe_upsampling(model)
    if spec[4]:
        model.eval()
        with torch.no_grad(), calibration_mode(model):
            for _ in range(4):
                model(*_inputs(spec, gen, batch=8))
    model.eval()
    return model


def export_one(name: str, seed: int, committed: dict, cached: dict, cache: Path) -> None:
    spec = SPECS[name]
    kind = spec[0]
    shapes, ranges = _shapes(spec), _ranges(spec)
    for tag, dynamo in (("dyn", True), ("ts", False)):
        key = f"{name}_{tag}"
        model = build(name, seed)
        entry = {"kind": kind, "exporter": "dynamo" if dynamo else "torchscript",
                 "description": " ".join((type(model).__doc__ or type(model).__name__).split()),
                 "input_shape": list(shapes[0]) if len(shapes) == 1 else [list(s) for s in shapes],
                 "input_range": list(ranges[0]) if len(ranges) == 1 else [list(r) for r in ranges], "seed": seed}
        x = _inputs(spec, torch.Generator().manual_seed(seed))
        tmp = cache / f"{key}.onnx.tmp"
        tmp.parent.mkdir(parents=True, exist_ok=True)
        try:
            export_qonnx(model, x[0] if len(x) == 1 else x, str(tmp), dynamo=dynamo)
        except Exception as exc:  # noqa: BLE001 - recorded in the manifest
            msg = f"{type(exc).__name__}: {exc}".strip().splitlines()
            entry["error"] = " ".join(msg[:3])[:500]
            committed[key] = entry
            print(f"{key}: export failed: {entry['error']}", file=sys.stderr)
            traceback.print_exc(limit=2)
            tmp.unlink(missing_ok=True)
            Path(f"{tmp}.data").unlink(missing_ok=True)
            continue
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
            committed[key] = {**entry, "cached": True}
        print(f"{key}: {entry['nodes']} nodes, {size / 1024:.0f} kB -> {'committed' if size < LIMIT else cache}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", help="export only these models (names of SPECS)")
    ap.add_argument("--cache", type=Path, default=None, help="cache dir (default $FINNLITE_CORPUS/recipes_layout)")
    ap.add_argument("--seed", type=int, default=33)
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
