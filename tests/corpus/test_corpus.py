"""The Brevitas export corpus (issue 23) through the default pipeline.

For every model of ``tests/corpus/models/manifest.json`` (and of ``$FINNLITE_CORPUS``'s manifest when present),
the default pipeline must give an integer-only model (no interior float node, no Quant / BipolarQuant / Trunc /
BatchNormalization left, at most one final float Mul and one Add), with at most one Transpose, that agrees with
float64 execution of the original on 32 inputs over the input quantizer's range (``tests/corpus/check.py``).

Models that do not pass yet are listed in :data:`KNOWN_GAPS` with the precise reason and run as
``xfail(strict=True)``: the suite stays green, every gap is written down, and a model that starts passing fails
until its entry is removed. Exporter failures recorded in a manifest are skipped with the exporter's error.
"""

from __future__ import annotations

import pytest

from tests.corpus.check import cached_entries, check_model, committed_entries, corpus_names

#: model -> why it does not pass yet (checked: an entry that passes makes its test fail)
KNOWN_GAPS: dict[str, str] = {
    **{f"perchannel_maxpool_{e}": "impossible exactly (finnlite streamline says so at each scale's Mul): the "
       "per-channel activation scales (scaling_per_output_channel, 7 and 8 distinct values) pass the MaxPools and "
       "then reach channel-mixing layers, the second Conv and the classifier MatMul: Σ_c W[c, o]·s_c·x_c with "
       "integer W is exact in integers only for equal s_c (or two before a Conv, IntegerConvInputScales); the "
       "user's change: per-tensor scaling on those quantizers, or a per-tensor requantizer before the Conv and the "
       "classifier, as in perchannel_exact" for e in ("dyn", "ts")},
}


def _params(entries: dict) -> list:
    params = []
    for name, entry in sorted(entries.items()):
        marks = []
        if name in KNOWN_GAPS:
            marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_GAPS[name]))
        params.append(pytest.param(name, entry, id=name, marks=marks))
    return params


def _run(name: str, entry: dict) -> None:
    if "error" in entry:
        pytest.skip(f"the {entry['exporter']} exporter failed on this model: {entry['error']}")
    result = check_model(name, entry)
    problems = result.problems()
    assert not problems, f"{name}: " + "; ".join(problems)


@pytest.mark.parametrize("name,entry", _params(committed_entries()))
def test_committed_model(name: str, entry: dict) -> None:
    _run(name, entry)


_CACHED = cached_entries()


@pytest.mark.slow
@pytest.mark.parametrize("name,entry", _params(_CACHED) or [pytest.param(None, None, id="absent")])
def test_cached_model(name: str | None, entry: dict | None) -> None:
    if entry is None:
        pytest.skip("no corpus cache in FINNLITE_CORPUS (default ~/.cache/finnlite/corpus; tests/corpus/export.py "
                    "writes the models over 1 MB there)")
    _run(name, entry)


def test_known_gaps_name_corpus_models() -> None:
    """Every entry of the gap table names a model of the corpus (a renamed model must not hide a stale entry)."""
    stale = [name for name in KNOWN_GAPS if name not in corpus_names()]
    assert not stale, f"KNOWN_GAPS names models the corpus does not have: {stale}"
