"""Export Brevitas' ImageNet example networks (random weights) as QONNX files for the slow corpus tests.

Run with the side environment that has torch and brevitas (finnlite itself never imports them)::

    $SIDE_PYTHON tests/corpus/export_imagenet.py [--out DIR] [--models NAME ...] [--dynamo]

Each network comes from ``brevitas_examples.imagenet_classification`` untrained (``pretrained=False``), with
the layers' own random weights (PyTorch's initialisation after ``torch.manual_seed(seed)``) and every BatchNorm
given random running mean, running variance, weight (about a fifth of the gammas negative) and bias, so that the
thresholds are per channel and non-trivial as in a trained network. The activation scales keep Brevitas' initial
values, as in the export of issue 24 (``--calibrate`` sets them from a few random batches instead, with
``brevitas.graph.calibrate.calibration_mode``). The model is put in eval mode and exported with
``brevitas.export.export_qonnx`` — the TorchScript exporter (``dynamo=False``) unless ``--dynamo`` is given (which
works too, with the weights in a ``.onnx.data`` file beside). The files go to ``--out``, else ``$FINNLITE_CORPUS``,
else ``~/.cache/finnlite/corpus``, named ``<model>.onnx``; a ``<model>.json`` beside each gives the input shape and
range. ``<model>_issue24.onnx`` randomizes the BatchNorm statistics only, the recipe of issue 24: with the defaults
(seed 0) it holds a weight whose quantizer rounds differently in float32 and in float64 (``fl32(w / s)`` = 5.5), and
before the fix the final check failed on 2 of 32 inputs in [-2.5, 2.5] (42 steps), which the slow test
``tests/corpus/test_imagenet.py`` checks.
This file is not imported by the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

#: file name → (constructor in brevitas_examples.imagenet_classification.models, input range, BatchNorm affine
#: randomized too); the ``_issue24`` variant randomizes the statistics only, as the export of issue 24 did
MODELS = {
    "quant_proxylessnas_mobile14_4b": ("quant_proxylessnas_mobile14_4b", (-2.5, 2.5), True),
    "quant_proxylessnas_mobile14_4b_issue24": ("quant_proxylessnas_mobile14_4b", (-2.5, 2.5), False),
    "quant_mobilenet_v1_4b": ("quant_mobilenet_v1_4b", (-2.5, 2.5), True),
}
INPUT_SHAPE = (1, 3, 224, 224)


def corpus_dir() -> Path:
    """``$FINNLITE_CORPUS`` or ``~/.cache/finnlite/corpus``."""
    return Path(os.environ.get("FINNLITE_CORPUS", Path.home() / ".cache" / "finnlite" / "corpus"))


def randomize(model, seed: int, affine: bool = True) -> None:
    """Random BatchNorm statistics and, with ``affine``, weight and bias (some negative gammas), in place, from
    ``seed``. The weights keep the layers' own random initialisation (drawn after ``torch.manual_seed(seed)``)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                n = module.num_features
                if not affine:  # issue 24's recipe
                    module.running_mean.copy_(torch.randn(n, generator=gen))
                    module.running_var.copy_(torch.rand(n, generator=gen) + 0.1)
                    continue
                module.running_mean.copy_(torch.randn(n, generator=gen) * 0.5)
                module.running_var.copy_(torch.rand(n, generator=gen) * 1.5 + 0.25)
                sign = torch.where(torch.rand(n, generator=gen) < 0.2, -1.0, 1.0)
                module.weight.copy_(sign * (torch.rand(n, generator=gen) * 1.5 + 0.25))
                module.bias.copy_(torch.randn(n, generator=gen) * 0.5)


def calibrate(model, lo: float, hi: float, seed: int, batches: int = 4, batch_size: int = 4) -> None:
    """Set the activation scales from a few random batches uniform in [lo, hi]."""
    import torch
    from brevitas.graph.calibrate import calibration_mode

    gen = torch.Generator().manual_seed(seed + 1)
    model.eval()
    with torch.no_grad(), calibration_mode(model):
        for _ in range(batches):
            model(torch.rand((batch_size,) + INPUT_SHAPE[1:], generator=gen) * (hi - lo) + lo)


def export_one(name: str, out: Path, seed: int, dynamo: bool, calibrated: bool = False) -> Path:
    """Build, randomize, calibrate and export model ``name`` to ``out/<name>.onnx``; returns the path."""
    import torch
    from brevitas.export import export_qonnx
    from brevitas_examples.imagenet_classification import models

    ctor, (lo, hi), affine = MODELS[name]
    torch.manual_seed(seed)
    model = getattr(models, ctor)(pretrained=False)
    randomize(model, seed, affine)
    if calibrated:
        calibrate(model, lo, hi, seed)
    model.eval()
    path = out / f"{name}.onnx"
    start = time.perf_counter()
    export_qonnx(model, torch.zeros(INPUT_SHAPE), export_path=str(path), dynamo=dynamo)
    meta = {
        "file": path.name,
        "input_shape": list(INPUT_SHAPE),
        "input_range": [lo, hi],
        "seed": seed,
        "exporter": "dynamo" if dynamo else "torchscript",
        "calibrated": calibrated,
        "batchnorm_affine_randomized": affine,
        "description": f"brevitas_examples.imagenet_classification {ctor}, random weights, randomized BatchNorm",
    }
    (out / f"{name}.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    print(f"{name}: {path} ({path.stat().st_size / 1e6:.1f} MB, {time.perf_counter() - start:.1f} s)")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: $FINNLITE_CORPUS)")
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=sorted(MODELS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dynamo", action="store_true", help="use the torch.export (dynamo) exporter")
    parser.add_argument("--calibrate", action="store_true",
                        help="set the activation scales from a few random batches (default: Brevitas' initial values)")
    args = parser.parse_args(argv)
    out = args.out or corpus_dir()
    out.mkdir(parents=True, exist_ok=True)
    for name in args.models:
        export_one(name, out, args.seed, args.dynamo, args.calibrate)
    return 0


if __name__ == "__main__":
    sys.exit(main())
