"""FINN's hand-off on issue 33's recipes 1, 2, 3 and 8 (``tests/corpus/models/recipes_ptq``, and the larger ones of
``$FINNLITE_CORPUS/recipes_ptq`` when present).

Each model is streamlined here (the default pipeline, final check on its input range), then finn-plus 1.6.1 in the
side environment (``$FINNLITE_FINN_PYTHON``; skipped, saying so, without it) runs ``step_convert_to_hw``,
``step_minimize_bit_width_initial`` and ``step_create_dataflow_partition`` (``tests/finn/handoff.py``). A model
passes as in ``test_finn_handoff.py``: one partition, nothing left in software but layout ops at its borders and
at most one final float Mul and Add. Models that do not pass are in :data:`KNOWN_GAPS` with the reason (strict
xfails): where finnlite cannot make them integer (``tests/corpus/test_recipes_ptq.py``), or the HW layer
finn-plus 1.6.1 lacks.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.corpus.test_recipes_ptq import KNOWN_GAPS as STREAMLINE_GAPS
from tests.corpus.test_recipes_ptq import RECIPES, cache, committed
from tests.corpus.check import manifest_entries, model_path
from tests.finn.test_finn_handoff import _run_side, _streamline, finn_python, problems

pytestmark = pytest.mark.slow

#: model -> why FINN's hand-off does not pass (checked: an entry that passes makes its test fail). The hand-off
#: streamlines with the final check only, so the per-pass gaps of the corpus test do not apply here.
KNOWN_GAPS: dict[str, str] = {
    name: "not integer-only (" + STREAMLINE_GAPS[name].split(";")[0] + "): its float ops stay in software between HW "
          "layers and step_create_dataflow_partition refuses them"
    for name in ("ptq_resnetmini_layerwise_w8a8_pt_float", "ptq_squeezenet11_layerwise_w8a8_pc_float")}


def _models(cached: bool) -> dict[str, dict[str, Any]]:
    entries = manifest_entries(cache()) if cached else committed()
    return {name: {"path": model_path(e), "range": tuple(e["input_range"]), "pre": False, "error": e.get("error")}
            for name, e in sorted(entries.items())}


def _handoff(tmp_path_factory: pytest.TempPathFactory, cached: bool) -> dict[str, Any]:
    python = finn_python()
    work = tmp_path_factory.mktemp("finn_recipes_ptq")
    results: dict[str, Any] = {}
    paths = []
    for name, spec in _models(cached).items():
        if spec.get("error"):
            continue
        out = work / f"{name}.onnx"
        try:
            error = _streamline(spec, out)
        except Exception as exc:  # noqa: BLE001 - recorded for that model's test
            error = f"finnlite crashed: {type(exc).__name__}: {exc}"
        if error:
            results[name] = {"finnlite_error": error}
        else:
            paths.append(out)
    if paths:
        results.update(_run_side(python, "convert", paths, work, timeout=3600))
    return results


@pytest.fixture(scope="module")
def handoff(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _handoff(tmp_path_factory, cached=False)


@pytest.fixture(scope="module")
def handoff_cached(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _handoff(tmp_path_factory, cached=True)


def _params(cached: bool) -> list:
    params = []
    for name in _models(cached):
        marks = [pytest.mark.xfail(strict=True, reason=KNOWN_GAPS[name])] if name in KNOWN_GAPS else []
        params.append(pytest.param(name, id=name, marks=marks))
    return params or [pytest.param(None, id="absent")]


def _check(name: str | None, results: dict[str, Any], cached: bool) -> None:
    if name is None:
        pytest.skip(f"no recipes cache at {cache()} (tests/corpus/export_recipes_ptq.py writes it; set "
                    "FINNLITE_CORPUS)")
    spec = _models(cached)[name]
    if spec.get("error"):
        pytest.skip(f"the exporter failed on this model: {spec['error']}")
    found = problems(results[name])
    assert not found, f"{name}: " + "; ".join(found)


@pytest.mark.parametrize("name", _params(False))
def test_finn_takes_the_recipe(name: str | None, handoff: dict[str, Any]) -> None:
    _check(name, handoff, False)


@pytest.mark.parametrize("name", _params(True))
def test_finn_takes_the_cached_recipe(name: str | None, handoff_cached: dict[str, Any]) -> None:
    _check(name, handoff_cached, True)


def test_known_gaps_name_models() -> None:
    known = set(manifest_entries(RECIPES))
    stale = [name for name in KNOWN_GAPS if name not in known]
    assert not stale, f"KNOWN_GAPS names models the recipes do not have: {stale}"
