"""Issue 33's recipes 1, 2, 3 and 8 (``tests/corpus/export_recipes_ptq.py``) through the default pipeline.

Every model of ``tests/corpus/models/recipes_ptq/manifest.json`` (and of ``$FINNLITE_CORPUS/recipes_ptq``'s
manifest, the larger ones, when present) must come out integer-only (no interior float node, no Quant /
BipolarQuant / Trunc / BatchNormalization left, at most one final float Mul and one Add), with at most one
Transpose (one image input), agreeing with float64 execution of the original on 32 inputs over the manifest's input
range (``tests/corpus/check.py``); a trained model (``test_set`` in its manifest entry) on every test image
instead. Models that do not pass yet are strict xfails in :data:`KNOWN_GAPS` with the reason.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.corpus.check import COMMITTED, cache_dir, check_model, manifest_entries

RECIPES = COMMITTED / "recipes_ptq"


def cache() -> "object":
    return cache_dir() / "recipes_ptq"


_LAYERWISE = ("impossible exactly, and finnlite streamline says so at the node with the user's change "
              "(finnlite.grid_cause): Brevitas' layerwise backend quantizes only layer inputs, so {what}; the change: "
              "the fx backend (which quantizes layer outputs and requantizes residual Adds) or power-of-two scales, "
              "as ptq_mobilenetv2_layerwise_w4a4_pt_po2, which passes")

#: model -> why it does not pass yet (checked: an entry that passes makes its test fail)
KNOWN_GAPS: dict[str, str] = {
    "ptq_resnetmini_layerwise_w8a8_pt_float": _LAYERWISE.format(
        what="the residual chain adds float layer outputs of unrelated scales (ratios of 24-bit integers) through "
             "ReLUs and joins, and the stem's bias is off the accumulator's integer grid (its scale fl32(s_in·s_w) "
             "is not s_in·s_w); the float region runs in float32, so its quantizers differ from float64 at float32 "
             "near-ties, which the proofs report"),
    "ptq_squeezenet11_layerwise_w8a8_pc_float": _LAYERWISE.format(
        what="the classifier's off-grid bias (scale fl32(s_in·s_w)) is followed by a ReLU and the global mean with "
             "no quantizer: Add, Relu, ReduceMean stay float at the output"),
}


def committed() -> dict:
    return {k: e for k, e in manifest_entries(RECIPES).items() if not e.get("cached")}


def _params(entries: dict) -> list:
    params = []
    for name, entry in sorted(entries.items()):
        marks = [pytest.mark.xfail(strict=True, reason=KNOWN_GAPS[name])] if name in KNOWN_GAPS else []
        params.append(pytest.param(name, entry, id=name, marks=marks))
    return params


def _run(name: str, entry: dict) -> None:
    if "error" in entry:
        pytest.skip(f"the {entry['exporter']} export failed on this model: {entry['error']}")
    inputs = None
    if entry.get("test_set"):
        data = np.load(f"{entry['dir']}/{entry['test_set']}")
        inputs = data["x"].astype(np.float32)
    result = check_model(name, entry, inputs=inputs)
    problems = result.problems()
    assert not problems, f"{name}: " + "; ".join(problems)


@pytest.mark.parametrize("name,entry", _params(committed()))
def test_committed_recipe(name: str, entry: dict) -> None:
    _run(name, entry)


_CACHED = manifest_entries(cache())


@pytest.mark.slow
@pytest.mark.parametrize("name,entry", _params(_CACHED) or [pytest.param(None, None, id="absent")])
def test_cached_recipe(name: str | None, entry: dict | None) -> None:
    if entry is None:
        pytest.skip(f"no recipes cache at {cache()} (tests/corpus/export_recipes_ptq.py writes the models over 1 MB "
                    "there; set FINNLITE_CORPUS)")
    _run(name, entry)


def test_every_recipe_is_committed_at_least_once() -> None:
    """CI (without the cache) exercises every recipe: each has a committed model that exported."""
    recipes = {e["recipe"] for e in manifest_entries(RECIPES).values()}
    small = {e["recipe"] for e in committed().values() if "error" not in e}
    assert recipes and recipes == small, f"recipes without a committed model: {sorted(recipes - small)}"


def test_known_gaps_name_recipe_models() -> None:
    """Every entry of the gap table names a model of the recipes (the committed manifest lists the cached ones)."""
    stale = [name for name in KNOWN_GAPS if name not in manifest_entries(RECIPES)]
    assert not stale, f"KNOWN_GAPS names models the recipes do not have: {stale}"
