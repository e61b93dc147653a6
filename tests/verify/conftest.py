"""Failing checks in these tests save their models under the test's temporary folder, not the system's."""

from __future__ import annotations

from pathlib import Path

import pytest

from verify.hook import SAVE_DIR_ENV


@pytest.fixture(autouse=True)
def _verify_save_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SAVE_DIR_ENV, str(tmp_path))
