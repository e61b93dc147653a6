"""Issue 33's recipes 4–7 (tests/corpus/export_recipes_layout.py) through the default pipeline.

For every model of ``tests/corpus/models/recipes_layout/manifest.json`` (and of ``$FINNLITE_CORPUS/recipes_layout``
when present) the default pipeline must give what ``tests/corpus/test_corpus.py`` asks of the corpus — integer-only,
at most one Transpose per image or sequence input and output, agreement with float64 execution of the original on
32 inputs (per input range, two inputs included) — and, since "clean" means lowered to the form FINN maps, no
convolution, transposed convolution, pool, DepthToSpace/SpaceToDepth or Gather left in its ONNX form (each becomes
Im2Col/MatMul, FMPadding_Pixel, MaxPoolNHWC, lowered pooling, layout or weights). Models that do not pass are in
:data:`KNOWN_GAPS` with the reason, as strict xfails.
"""

from __future__ import annotations

import pytest

from tests.corpus.check import cache_dir, cached_entries, check_model, committed_entries, corpus_names

SUBDIR = "recipes_layout"
#: ops that must not survive the lowering
NOT_LOWERED = ("Conv", "ConvTranspose", "DepthToSpace", "SpaceToDepth", "AveragePool", "MaxPool",
               "GlobalAveragePool", "Gather")

KNOWN_GAPS: dict[str, str] = {
    **{f"melgan_float_input_{e}": "the example's first Conv1d reads the float input (no input quantizer): its "
       "(mel + 5)/5 normalization (a Mul and an Add on the float input) and the Conv stay float before the first "
       "quantizer; with an input quantizer (melgan_8b) the same network is clean" for e in ("dyn", "ts")},
    **{f"se_float_gate_{e}": "impossible exactly: the squeeze-excitation gate is a float Sigmoid, and the product of "
       "the features by it is real-valued (finnlite streamline names the gate, the product and the change: "
       "quantize the gate, as se_4b and se_8b do)" for e in ("dyn", "ts")},
}


def _params(entries: dict) -> list:
    return [pytest.param(name, entry, id=name, marks=[pytest.mark.xfail(strict=True, reason=KNOWN_GAPS[name])]
                         if name in KNOWN_GAPS else []) for name, entry in sorted(entries.items())]


def _run(name: str, entry: dict) -> None:
    if "error" in entry:
        pytest.skip(f"the {entry['exporter']} exporter failed on this model: {entry['error']}")
    result = check_model(name, entry)
    problems = result.problems()
    left = [f"{result.ops[o]} {o}" for o in NOT_LOWERED if result.ops.get(o)]
    if left and not result.crash:
        problems.append(f"not lowered: {', '.join(left)}")
    assert not problems, f"{name}: " + "; ".join(problems)


@pytest.mark.parametrize("name,entry", _params(committed_entries(SUBDIR)))
def test_committed_recipe(name: str, entry: dict) -> None:
    _run(name, entry)


_CACHED = cached_entries(SUBDIR)


@pytest.mark.slow
@pytest.mark.parametrize("name,entry", _params(_CACHED) or [pytest.param(None, None, id="absent")])
def test_cached_recipe(name: str | None, entry: dict | None) -> None:
    if entry is None:
        pytest.skip(f"no recipe cache at {cache_dir() / SUBDIR} (tests/corpus/export_recipes_layout.py writes the "
                    "models over 1 MB there; set FINNLITE_CORPUS)")
    _run(name, entry)


def test_every_recipe_has_two_models_at_least() -> None:
    """Each recipe kind of the issue (4–7) has at least two models, and the gaps name models of the folder."""
    entries = committed_entries(SUBDIR)
    kinds: dict[str, int] = {}
    for entry in entries.values():
        kinds[entry["kind"].split()[0]] = kinds.get(entry["kind"].split()[0], 0) + 1
    assert all(kinds.get(k, 0) >= 2 for k in ("4", "5", "6", "7")), kinds
    assert len(entries) >= 20
    stale = [name for name in KNOWN_GAPS if name not in corpus_names(SUBDIR)]
    assert not stale, f"KNOWN_GAPS names models the folder does not have: {stale}"


def test_a_float_gate_is_explained() -> None:
    """se_float_gate: the report names the float Sigmoid gate, the product it feeds and the change."""
    from finnlite import Model
    from finnlite.build import streamline
    from tests.corpus.check import model_path

    for exporter in ("dyn", "ts"):
        model = Model(model_path(committed_entries(SUBDIR)[f"se_float_gate_{exporter}"]))
        report = streamline(model, verify="off", extras=False).float_nodes
        causes = [n.cause for n in report.nodes if n.cause]
        assert len(causes) == 1, report.text()
        assert "Sigmoid" in causes[0] and "is a float gate: Mul" in causes[0] and "QuantSigmoid" in causes[0]
