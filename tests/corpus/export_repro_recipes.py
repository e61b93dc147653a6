"""Export many seeds of the two reproducers' recipes (issue 34) into the corpus cache, for the slow tests.

Run with the side environment that has torch and brevitas (finnlite itself never imports them), one export at a
time::

    $SIDE_PYTHON tests/corpus/export_repro_recipes.py [--out DIR] [--recipes resnet_cifar proxyless]
        [--seeds 0-19] [--full-seeds 0-2]

The recipes are those of the reproducers' README (``resnet_cifar.onnx`` and ``proxylessnas_4b.onnx``):

* ``resnet_cifar`` — a CIFAR-10 ResNet: 3 stages × 2 basic blocks of 16/32/64 channels, 1×1-conv downsample
  shortcuts with BatchNorm, 4-bit body (weights and activations), 8-bit stem and classifier weights, an 8-bit
  input quantizer, the two summands of each residual Add requantized by the block's own quantizer (distinct from
  the ones that produced them), a float global average pool before an 8-bit requantizer; 1×3×32×32 inputs in
  [-1, 1].
* ``proxyless`` — ``brevitas_examples``' ``model_with_cfg("quant_proxylessnas_mobile14_4b", pretrained=None)``: no
  input quantizer, the first convolution (8-bit weights) reads the float, normalized image, whose realistic range
  is [-2.5, 2.5]. The seeds take 1×3×64×64 inputs, the final 7×7 average pool (``TruncAvgPool2d``, kernel 7 for the
  224×224 input) made a 2×2 one with the same bit width and rounding; ``--full-seeds`` are exported at 1×3×224×224
  as they are.

Weights are PyTorch's own initialisation after ``torch.manual_seed(seed)``; every BatchNorm gets, from a generator
of the same seed, running mean ~ N(0, 0.5²), running variance ~ U(0.2, 2.2), gamma ~ U(0.5, 1.5), beta ~ N(0, 0.3²).
The ResNet's activation scales are calibrated on four random batches in its input range
(``brevitas.graph.calibrate.calibration_mode``); ProxylessNAS keeps Brevitas' initial scales, as the reproducer
does. Both are exported with ``export_qonnx(..., dynamo=True)`` (weights in a ``.onnx.data`` file beside the model).

The files go to ``--out``, else ``$FINNLITE_CORPUS/repro_recipes`` (default
``~/.cache/finnlite/corpus/repro_recipes``), with ``manifest.json``: ``{name: {file, recipe, seed, input_shape,
input_range, exporter, nodes}}`` (merged with an existing one). ``tests/robustness/test_repro_corpus.py`` reads
them. This file is not imported by the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

#: recipe → input range of its inputs (the reproducers' README)
RANGES = {"resnet_cifar": (-1.0, 1.0), "proxyless": (-2.5, 2.5)}


def corpus_dir() -> Path:
    """``$FINNLITE_CORPUS/repro_recipes`` (``$FINNLITE_CORPUS`` defaults to ``~/.cache/finnlite/corpus``)."""
    return Path(os.environ.get("FINNLITE_CORPUS", Path.home() / ".cache" / "finnlite" / "corpus")) / "repro_recipes"


def randomize_bn(model, seed: int) -> None:
    """The README's BatchNorm statistics, in place, from a generator of ``seed``."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                n = m.num_features
                m.running_mean.copy_(torch.randn(n, generator=gen) * 0.5)
                m.running_var.copy_(torch.rand(n, generator=gen) * 2.0 + 0.2)
                m.weight.copy_(torch.rand(n, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(n, generator=gen) * 0.3)


def cifar_resnet():
    """The CIFAR ResNet of the module docstring (a fresh, untrained module)."""
    import brevitas.nn as qnn
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.c1 = qnn.QuantConv2d(cin, cout, 3, stride=stride, padding=1, bias=False, weight_bit_width=4)
            self.b1 = nn.BatchNorm2d(cout)
            self.a1 = qnn.QuantReLU(bit_width=4)
            self.c2 = qnn.QuantConv2d(cout, cout, 3, padding=1, bias=False, weight_bit_width=4)
            self.b2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(qnn.QuantConv2d(cin, cout, 1, stride=stride, bias=False,
                                                          weight_bit_width=4), nn.BatchNorm2d(cout))
            self.addq = qnn.QuantIdentity(bit_width=4)  # requantizes both summands
            self.out = qnn.QuantReLU(bit_width=4)

        def forward(self, x):
            h = self.b2(self.c2(self.a1(self.b1(self.c1(x)))))
            s = self.down(x) if self.down is not None else x
            return self.out(self.addq(h) + self.addq(s))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = qnn.QuantIdentity(bit_width=8)
            self.stem = nn.Sequential(qnn.QuantConv2d(3, 16, 3, padding=1, bias=False, weight_bit_width=8),
                                      nn.BatchNorm2d(16), qnn.QuantReLU(bit_width=4))
            blocks, cin = [], 16
            for stage, width in enumerate((16, 32, 64)):
                for b in range(2):
                    blocks.append(Block(cin, width, 2 if stage > 0 and b == 0 else 1))
                    cin = width
            self.blocks = nn.Sequential(*blocks)
            self.q = qnn.QuantIdentity(bit_width=8)
            self.fc = qnn.QuantLinear(64, 10, bias=False, weight_bit_width=8)

        def forward(self, x):
            x = self.blocks(self.stem(self.inp(x)))
            return self.fc(self.q(x.mean((2, 3))))

    return Net()


def calibrate(model, shape: tuple[int, ...], lo: float, hi: float, seed: int) -> None:
    """Activation scales from four random batches uniform in [lo, hi]."""
    import torch
    from brevitas.graph.calibrate import calibration_mode

    gen = torch.Generator().manual_seed(seed + 1)
    model.eval()
    with torch.no_grad(), calibration_mode(model):
        for _ in range(4):
            model(torch.rand((4,) + shape[1:], generator=gen) * (hi - lo) + lo)


def proxyless(size: int):
    """``quant_proxylessnas_mobile14_4b`` untrained; for an input smaller than 224 its final average pool covers
    the smaller map (``size / 32``) with the same bit width and rounding."""
    from brevitas.nn import TruncAvgPool2d
    from brevitas_examples.imagenet_classification.models import model_with_cfg

    model, cfg = model_with_cfg("quant_proxylessnas_mobile14_4b", pretrained=None)
    if size != 224:
        impl = "round" if cfg.getboolean("QUANT", "ROUND_AVG_POOL") else "floor"
        bits = int(cfg.get("QUANT", "BIT_WIDTH"))
        model.final_pool = TruncAvgPool2d(kernel_size=size // 32, stride=1, bit_width=bits,
                                          float_to_int_impl_type=impl)
    return model


def export_one(recipe: str, seed: int, size: int, out: Path) -> tuple[str, dict]:
    """Build, randomize, (calibrate,) export one model; returns its manifest entry."""
    import onnx
    import torch
    from brevitas.export import export_qonnx

    lo, hi = RANGES[recipe]
    torch.manual_seed(seed)
    if recipe == "resnet_cifar":
        shape = (1, 3, 32, 32)
        model = cifar_resnet()
        randomize_bn(model, seed)
        calibrate(model, shape, lo, hi, seed)
        name = f"resnet_cifar_s{seed}"
    else:
        shape = (1, 3, size, size)
        model = proxyless(size)
        randomize_bn(model, seed)
        name = f"proxyless_{size}_s{seed}"
    model.eval()
    path = out / f"{name}.onnx"
    start = time.perf_counter()
    export_qonnx(model, torch.zeros(shape), export_path=str(path), dynamo=True)
    nodes = len(onnx.load(str(path), load_external_data=False).graph.node)
    entry = {"file": path.name, "recipe": recipe, "seed": seed, "input_shape": list(shape),
             "input_range": [lo, hi], "exporter": "dynamo", "nodes": nodes}
    print(f"{name}: {nodes} nodes, {time.perf_counter() - start:.1f} s", flush=True)
    return name, entry


def _seeds(text: str) -> list[int]:
    if not text:
        return []
    if "-" in text:
        a, b = text.split("-")
        return list(range(int(a), int(b) + 1))
    return [int(s) for s in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: $FINNLITE_CORPUS/"
                                                                "repro_recipes)")
    parser.add_argument("--recipes", nargs="+", choices=sorted(RANGES), default=sorted(RANGES))
    parser.add_argument("--seeds", default="0-19", help="seeds, e.g. 0-19 or 3,5 (default 0-19)")
    parser.add_argument("--full-seeds", default="0-2", help="ProxylessNAS seeds exported at 224x224 (default 0-2)")
    args = parser.parse_args(argv)
    out = args.out or corpus_dir()
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text(encoding="utf-8")) if manifest_path.is_file() else {}
    jobs = [(r, s, 64) for r in args.recipes for s in _seeds(args.seeds)]
    if "proxyless" in args.recipes:
        jobs += [("proxyless", s, 224) for s in _seeds(args.full_seeds)]
    for recipe, seed, size in jobs:
        name, entry = export_one(recipe, seed, size, out)
        manifest[name] = entry
        manifest_path.write_text(json.dumps(dict(sorted(manifest.items())), indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
