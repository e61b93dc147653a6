"""Verification policies and the decorators that declare them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from finnlite import Stage, Transformation
from verify import DEFAULT_POLICY, Equality, Metric, Tolerance, equality, metric, resolve_policy, tolerance


def _agree(outputs, reference) -> float:
    return 1.0


def test_decorators_set_the_verification_attribute() -> None:
    @equality
    class A(Transformation):
        """a"""

    @equality(near_ties=False)
    class B(Transformation):
        """b"""

    @tolerance(atol=1e-6, rtol=1e-5, steps=1)
    class C(Transformation):
        """c"""

    @metric(_agree, 0.99, name="agreement")
    class D(Transformation):
        """d"""

    assert A.verification == Equality() and A.verification.near_ties
    assert B.verification == Equality(near_ties=False)
    assert C.verification == Tolerance(1e-6, 1e-5, 1)
    assert isinstance(D.verification, Metric) and D.verification.lo == 0.99 and D.verification.hi == math.inf
    assert D.verification.label == "agreement" and not D.verification.local
    assert Transformation.verification is None  # the base class is untouched


def test_resolution_order_pass_then_stage_then_default() -> None:
    @equality
    class Declared(Transformation):
        """declared"""

    class Undeclared(Transformation):
        """undeclared"""

    stage = Stage("s", [], verification=Tolerance(rtol=1e-3))
    assert resolve_policy(Declared(), stage) == Equality()
    assert resolve_policy(Undeclared(), stage) == Tolerance(rtol=1e-3)
    assert resolve_policy(Undeclared(), Stage("t", [])) is DEFAULT_POLICY
    assert equality(Stage("u", [])).verification == Equality()  # a stage instance can be decorated too


def test_bad_declarations_are_refused() -> None:
    with pytest.raises(ValueError, match="rtol"):
        Tolerance(rtol=-1)
    with pytest.raises(ValueError, match="atol"):
        Tolerance(atol=float("nan"))
    with pytest.raises(ValueError, match="callable"):
        Metric(None)
    with pytest.raises(ValueError, match="empty"):
        Metric(_agree, 1.0, 0.5)

    class Odd(Transformation):
        """odd"""

        verification = "exact please"

    with pytest.raises(TypeError, match="not a verify.Policy"):
        resolve_policy(Odd(), None)


def test_tolerance_bound_and_descriptions() -> None:
    t = Tolerance(atol=0.5, rtol=0.1, steps=2)
    np.testing.assert_allclose(t.bound(np.array([10.0, -20.0]), np.array([0.25, 0.25])), [2.0, 3.0])
    np.testing.assert_allclose(Tolerance(atol=0.5).bound(np.array([3.0]), None), [0.5])
    assert t.describe() == "tolerance(atol=0.5, rtol=0.1, steps=2)"
    assert Tolerance().describe() == "tolerance(exact)"
    assert Equality().describe() == "equality"
    assert Metric(_agree, 0.5, 1).describe() == "metric _agree in [0.5, 1]"
    assert Metric(_agree, 0.5).accepts(0.7) and not Metric(_agree, 0.5).accepts(float("nan"))
