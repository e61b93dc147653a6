"""Verification: policies, reference data, per-pass checking, the final check and bisection (the integer-only
report, :func:`finnlite.float_report.float_report`, is a face's).

Typical use::

    from verify import ReferenceData, VerificationHook, final_check
    ref = ReferenceData.random(model, n=32, seed=0, low=-1, high=1)   # snapshot of the original, before the run
    hook = VerificationHook(ref)                                       # per-pass verification
    report = PassManager(stages, [hook]).run(model)                    # raises PassVerificationError on a bad pass
    print(final_check(ref, model).summary())                           # the streamlined model vs the original
    # (outputs, and: datatype claims, output dequantization, thresholds and weights against the original's)

Passes declare how they are checked with :func:`equality`, :func:`tolerance` or :func:`metric`.
"""

from verify.annotations import AnnotationIssue, check_annotations
from verify.bisect import BisectResult, bisect_pipeline
from verify.compare import TensorDiff, compare_tensor, quant_step
from verify.final import FinalCheck, OutputCheck, TieSite, final_check, integer_tail
from verify.hook import CheckRecord, PassVerificationError, VerificationHook
from finnlite.core.policies import (DEFAULT_POLICY, Equality, Metric, Policy, Tolerance, equality, metric,
                                    resolve_policy, tolerance)
from verify.reference import ReferenceData, ReferenceDataError
from verify.ties import Margin, NearTie
from verify.locate import Divergence, first_divergence
from verify.proofs import ProofIssue, prove_thresholds
from verify.tail import TailIssue, check_tail
from verify.verifier import CheckOutcome, Verifier
from verify.weights import WeightIssue, compare_weights

__all__ = [
    "Policy", "Equality", "Tolerance", "Metric", "equality", "tolerance", "metric", "DEFAULT_POLICY", "resolve_policy",
    "ReferenceData", "ReferenceDataError",
    "TensorDiff", "compare_tensor", "quant_step",
    "NearTie", "Margin",
    "VerificationHook", "Verifier", "CheckOutcome", "PassVerificationError", "CheckRecord",
    "FinalCheck", "OutputCheck", "TieSite", "final_check", "integer_tail",
    "BisectResult", "bisect_pipeline",
    "AnnotationIssue", "check_annotations", "TailIssue", "check_tail", "ProofIssue", "prove_thresholds",
    "WeightIssue", "compare_weights", "Divergence", "first_divergence",
]
