"""FINN's next step on issue 33's recipes 4–7 (tests/corpus/models/recipes_layout), as tests/finn/test_finn_handoff.py
does for the corpus: each model streamlined here (default pipeline, final check), then finn-plus 1.6.1's
``step_convert_to_hw``, ``step_minimize_bit_width_initial`` and ``step_create_dataflow_partition`` in the side
environment (``$FINNLITE_FINN_PYTHON``; skipped, saying so, without it). A model passes when the accelerator is one
partition with nothing in software but layout ops at its borders and each output's dequantization (one Mul and one
Add per graph output).

Where finn-plus 1.6.1 has no HW layer for an op the model is a strict xfail naming the op and the FINN layer it
would need (:data:`KNOWN_GAPS`); for a nearest-neighbour Resize the layer exists (``UpsampleNearestNeighbour``) but
``step_convert_to_hw`` runs its ``InferUpsample`` only when the model has an ``Upsample`` node:
:func:`test_resize_is_finns_upsample_layer` shows that with ``InferUpsample`` applied first the model is one
partition.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.corpus.check import committed_entries, model_path
from tests.finn.test_finn_handoff import HANDOFF, _streamline, finn_python, problems

pytestmark = pytest.mark.slow
SUBDIR = "recipes_layout"
UPSAMPLE = ("upsample_nearest", "upsample_quant", "upsample_nnconv")

KNOWN_GAPS: dict[str, str] = {
    **{f"{m}_{e}": "Resize (nearest) stays in software between HW layers: finn-plus 1.6.1's step_convert_to_hw "
       "runs InferUpsample (Resize → UpsampleNearestNeighbour) only when the model has an Upsample node; with "
       "InferUpsample applied first it is one partition (test_resize_is_finns_upsample_layer)"
       for m in UPSAMPLE for e in ("dyn", "ts")},
    **{f"melgan_float_input_{e}": "the first Conv1d reads the float input (no input quantizer, as in the example): "
       "its Im2Col and float MatMul stay in software (tests/corpus KNOWN_GAPS; melgan_8b is the clean form)"
       for e in ("dyn", "ts")},
    **{f"se_float_gate_{e}": "the float Sigmoid gate and its product stay float (tests/corpus KNOWN_GAPS): float "
       "MVAU/ElementwiseMul in the interior" for e in ("dyn", "ts")},
}


def _entries() -> dict[str, dict[str, Any]]:
    return {k: e for k, e in committed_entries(SUBDIR).items() if "error" not in e}


def _spec(entry: dict[str, Any]) -> dict[str, Any]:
    rng = entry["input_range"]
    return {"path": model_path(entry), "range": None if isinstance(rng[0], list) else tuple(rng), "pre": False}


def _handoff(tmp_path_factory: pytest.TempPathFactory, names: list[str], infer_upsample: bool) -> dict[str, Any]:
    """Streamline ``names`` here, then FINN's steps on all of them in one run of the side environment."""
    python = finn_python()
    work = tmp_path_factory.mktemp("finn_recipes")
    results: dict[str, Any] = {}
    paths: list[Path] = []
    for name in names:
        out = work / f"{name}.onnx"
        error = _streamline(_spec(_entries()[name]), out)
        if error:
            results[name] = {"finnlite_error": error}
        else:
            paths.append(out)
    if paths:
        cmd = [str(python), str(HANDOFF), "convert", *map(str, paths), "--out", str(work)]
        proc = subprocess.run(cmd + (["--infer-upsample"] if infer_upsample else []), capture_output=True,
                              text=True, timeout=3600, cwd=str(work))
        assert proc.returncode == 0, f"handoff.py convert failed:\n{proc.stderr[-4000:]}"
        results.update(json.loads(proc.stdout.strip().splitlines()[-1]))
    return results


@pytest.fixture(scope="module")
def handoff(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _handoff(tmp_path_factory, sorted(_entries()), infer_upsample=False)


def _problems(name: str, result: dict[str, Any]) -> list[str]:
    """:func:`tests.finn.test_finn_handoff.problems`, with one dequantization Mul and Add per graph output."""
    found = problems(result)
    outputs = 2 if name.startswith("two_io") else 1
    if outputs > 1:
        found = [p for p in found if not p.startswith("the final float ops are more than one Mul and one Add")]
        tail = [n["op_type"] for n in result.get("float_hw", []) if n["side"] == "output"]
        if tail.count("ElementwiseMul") > outputs or tail.count("ElementwiseAdd") > outputs:
            found.append(f"more than one Mul and one Add per output: {tail}")
    return found


def _params() -> list:
    return [pytest.param(n, id=n, marks=[pytest.mark.xfail(strict=True, reason=KNOWN_GAPS[n])] if n in KNOWN_GAPS
                         else []) for n in sorted(_entries())]


@pytest.mark.parametrize("name", _params())
def test_finn_takes_the_recipe(name: str, handoff: dict[str, Any]) -> None:
    found = _problems(name, handoff[name])
    assert not found, f"{name}: " + "; ".join(found)


def test_resize_is_finns_upsample_layer(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The lowered Resize (NHWC, scales [1, s, s, 1], integer input) is what FINN's InferUpsample converts: with it
    applied before step_convert_to_hw, the upsampling models are one partition."""
    names = [f"{m}_{e}" for m in UPSAMPLE for e in ("dyn", "ts")]
    results = _handoff(tmp_path_factory, names, infer_upsample=True)
    for name in names:
        assert "UpsampleNearestNeighbour" in results[name].get("hw", {}), results[name]
        assert not _problems(name, results[name]), (name, _problems(name, results[name]))


def test_known_gaps_name_recipes() -> None:
    stale = [name for name in KNOWN_GAPS if name not in _entries()]
    assert not stale, stale

