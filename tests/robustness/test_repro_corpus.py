"""Real Brevitas exports of the reproducers' recipes, many seeds (``tests/corpus/export_repro_recipes.py``).

The exports live in ``$FINNLITE_CORPUS/repro_recipes`` (default ``~/.cache/finnlite/corpus/repro_recipes``) with a
``manifest.json``; without them every test skips and says how to make them. Each model is streamlined with the
defaults (per-pass verification on the default reference data: the ResNet's input quantizer range, a guessed
[-1, 1] for ProxylessNAS) and must:

* ``resnet_cifar_s*``: come out integer-only and equal to the original's float64 execution on 32 inputs in [-1, 1];
* ``proxyless_*``: pass the final check on 32 inputs in the realistic [-2.5, 2.5], every sample agreeing with float64
  execution of the original or differing by a near-tie of the model's own float first layer (explained), with no
  weight or threshold proved different from the original's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from finnlite import Model
from finnlite.build import streamline
from verify import ReferenceData, final_check

pytestmark = [pytest.mark.zoo, pytest.mark.slow]

SAMPLES = 32
EXPORT = "tests/corpus/export_repro_recipes.py (run by a python with torch and brevitas)"


def corpus_dir() -> Path:
    return Path(os.environ.get("FINNLITE_CORPUS", Path.home() / ".cache" / "finnlite" / "corpus")) / "repro_recipes"


def _manifest() -> dict:
    path = corpus_dir() / "manifest.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _params() -> list:
    entries = _manifest()
    if not entries:
        return [pytest.param(None, id="absent")]
    return [pytest.param(name, id=name) for name in sorted(entries)]


@pytest.mark.parametrize("name", _params())
def test_recipe_export_streams_and_agrees_with_float64(name: str | None) -> None:
    if name is None:
        pytest.skip(f"no exports in {corpus_dir()}: make them with {EXPORT} or set FINNLITE_CORPUS")
    entry = _manifest()[name]
    path = corpus_dir() / entry["file"]
    if not path.is_file():
        pytest.skip(f"{path} not found: export it with {EXPORT}")
    model = Model(path)
    report = streamline(model, extras=False)
    assert report.error is None, report.error
    lo, hi = entry["input_range"]
    final = final_check(ReferenceData.random(Model(path), n=SAMPLES, seed=entry["seed"], low=lo, high=hi), model)
    assert final.ok, final.summary()
    assert not final.proof_issues and not final.weight_issues, final.summary()
    assert all(not o.error_samples for o in final.outputs), final.summary()
    if entry["recipe"] == "resnet_cifar":
        assert report.float_nodes.integer_only, report.float_nodes.text()
        assert all(not o.float_layer_ties for o in final.outputs), final.summary()
    else:
        assert all(len(o.float_layer_ties) <= 2 for o in final.outputs), final.summary()
