"""Suite-wide guard: per-pass verification heals a run by declining a rewrite that breaks equivalence
(:mod:`verify.heal`); in the test suite that would hide a wrong rule. Every test fails if a rewrite was declined in
its process, unless it is marked ``declines`` (the tests of healing itself)."""

from __future__ import annotations

from typing import Any, Iterator

import pytest


@pytest.fixture(autouse=True)
def _no_declined_rewrite(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from verify.hook import VerificationHook

    declined: list[Any] = []
    heal = VerificationHook._heal

    def watched(self: VerificationHook, *args: Any, **kwargs: Any) -> bool:
        before = len(self.declined)
        done = heal(self, *args, **kwargs)
        declined.extend(self.declined[before:])
        return done

    monkeypatch.setattr(VerificationHook, "_heal", watched)
    yield
    if declined and request.node.get_closest_marker("declines") is None:
        pytest.fail("verification declined rewrite(s) (mark the test 'declines' if that is what it tests): "
                    + "; ".join(d.describe() for d in declined))
