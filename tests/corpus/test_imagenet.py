"""ProxylessNAS mobile14 at 4 bits (Brevitas' ImageNet example, random weights) streamlined end to end.

The export is made by ``tests/corpus/export_imagenet.py`` (in the side environment with torch and brevitas) into
``$FINNLITE_CORPUS`` (default ``~/.cache/finnlite/corpus``); without it the test is skipped and says so. The model
has no input quantizer, so the default reference data ([-1, 1], one sample) misses most of its input range: the
test feeds 32 samples uniform in [-2.5, 2.5] (issue 24) and requires the streamlined model to agree exactly with
the float64 execution of the original in its integer output levels, with no float node left.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from finnlite import Model
from verify import ReferenceData, final_check
from finnlite.float_report import float_report

pytestmark = [pytest.mark.zoo, pytest.mark.slow]

#: the default export, and issue 24's recipe (BatchNorm statistics randomized, affine left): both from the exporter
NAMES = ("quant_proxylessnas_mobile14_4b", "quant_proxylessnas_mobile14_4b_issue24")
INPUT_RANGE = (-2.5, 2.5)
SAMPLES = 32


def corpus_path(name: str) -> Path:
    """``$FINNLITE_CORPUS/<name>.onnx`` (default ``~/.cache/finnlite/corpus``); skips the test if it is absent."""
    folder = Path(os.environ.get("FINNLITE_CORPUS", Path.home() / ".cache" / "finnlite" / "corpus"))
    path = folder / f"{name}.onnx"
    if not path.is_file():
        pytest.skip(f"{name}.onnx not found in FINNLITE_CORPUS (default ~/.cache/finnlite/corpus): export it with "
                    "tests/corpus/export_imagenet.py in an environment with torch and brevitas")
    return path


@pytest.mark.parametrize("name", NAMES)
def test_proxylessnas_streamlines_and_agrees_with_float64_on_wide_inputs(name: str) -> None:
    from streamline.pipeline import streamline_model

    model = Model(corpus_path(name))
    ref = ReferenceData.random(model, n=SAMPLES, seed=0, low=INPUT_RANGE[0], high=INPUT_RANGE[1])
    result = streamline_model(model)
    final = final_check(ref, model)
    print(final.summary())
    final.raise_for_errors()
    assert all(o.compared_as.startswith("levels of integer tensor") for o in final.outputs), final.summary()
    report = float_report(model, result.report)
    assert report.integer_only, report.text()
