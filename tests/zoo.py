"""The model zoo for tests: where it is, its manifest, and seeded random inputs from the manifest's ranges.

The zoo lives in ``$FINNLITE_ZOO`` (default ``<repo>/../shared/zoo``). Tests that need it call :func:`require_zoo`
(or use :data:`ZOO_MODELS` with :func:`zoo_model_path`), which skips with a reason naming the missing path.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

REPO = Path(__file__).resolve().parents[1]
#: the six models of the zoo, smallest first
ZOO_MODELS = ("tfc_1w1a", "tfc_2w2a", "cnv_1w1a", "cnv_2w2a", "resnet18_4w4a_ts", "mobilenet_v1_4b")


def zoo_dir() -> Path:
    """The zoo directory: ``$FINNLITE_ZOO`` or ``<repo>/../shared/zoo``."""
    return Path(os.environ.get("FINNLITE_ZOO", REPO.parent / "shared" / "zoo"))


def zoo_available() -> bool:
    """True if the zoo directory holds a manifest."""
    return (zoo_dir() / "manifest.json").is_file()


def require_zoo() -> Path:
    """The zoo directory, or skip the calling test with the reason."""
    if not zoo_available():
        pytest.skip("model zoo not found (set FINNLITE_ZOO to its directory; the default is ../shared/zoo beside the "
                    "checkout)")
    return zoo_dir()


@lru_cache(maxsize=None)
def _manifest(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def manifest() -> dict[str, Any]:
    """The zoo's manifest.json: {model: {file, input_shape, input_range, description, sha256, nodes}}."""
    return _manifest(str(require_zoo() / "manifest.json"))


def zoo_model_path(name: str) -> Path:
    """The .onnx file of zoo model ``name`` (skips the test if the zoo or the file is absent)."""
    path = require_zoo() / manifest()[name]["file"]
    if not path.is_file():
        pytest.skip(f"zoo model file {path.name} not found in FINNLITE_ZOO")
    return path


def random_input(name: str, seed: int = 0, batch: int | None = None, dtype: Any = np.float32) -> np.ndarray:
    """A uniform random input for zoo model ``name`` in its manifest range; ``batch`` replaces the leading dim."""
    entry = manifest()[name]
    shape = list(entry["input_shape"])
    if batch is not None:
        shape[0] = batch
    lo, hi = entry["input_range"]
    rng = np.random.default_rng(seed)
    return rng.uniform(lo, hi, size=shape).astype(dtype)


def float_exposed(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with every quantizer of a non-constant tensor (Quant, BipolarQuant, Trunc) replaced by
    Identity: the float computation between quantizers reaches the outputs, no quantizer absorbs a rounding
    difference (a sharper test of bit-exactness than the quantized model). Weight quantizers stay."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    constants = {t.name for t in copy.graph.initializer}
    for node in copy.graph.node:
        if node.domain and node.op_type in ("Quant", "BipolarQuant", "Trunc") and node.input[0] not in constants:
            node.CopyFrom(onnx.helper.make_node("Identity", [node.input[0]], [node.output[0]], name=node.name))
    return copy
