"""finnlite.core.blockwise: whole-array checks block by block give the answers of the whole-array expressions."""

from __future__ import annotations

import numpy as np
import pytest

from finnlite.core.blockwise import BLOCK, all_blocks, all_in, all_integral


@pytest.mark.parametrize("size", [0, 1, BLOCK - 1, BLOCK, 3 * BLOCK + 5])
@pytest.mark.parametrize("bad_at", [None, 0, -1])
def test_all_in_matches_numpy(size, bad_at):
    w = np.where(np.arange(size) % 3 == 0, -1.0, 1.0).astype(np.float32).reshape(-1, 1)
    if bad_at is not None and size:
        w.reshape(-1)[bad_at] = 0.5  # the first element, or one in the last block
    assert all_in(w, 1, -1) == bool(np.all(np.abs(w) == 1))
    assert all_in(w, 1, -1, 0.5) is True


def test_all_in_nan_and_non_contiguous():
    a = np.ones((4, 2 * BLOCK), np.float32)
    a[3, -1] = np.nan
    assert not all_in(a, 1.0)
    assert all_in(a[:, ::2], 1.0)  # a strided view: every other column, without the NaN
    assert not all_in(a.T, 1.0)


def test_all_blocks_sees_every_block_and_stops_at_the_first_failure():
    seen = []

    def test(block):
        seen.append(block.size)
        return block.min() >= 0

    x = np.zeros(2 * BLOCK + 3)
    assert all_blocks(x, test) and seen == [BLOCK, BLOCK, 3]
    seen.clear()
    x[10] = -1
    assert not all_blocks(x, test) and seen == [BLOCK]


@pytest.mark.parametrize("bad", [None, 0.5, np.nan])
def test_all_integral_matches_numpy(bad):
    x = np.arange(-BLOCK, 2 * BLOCK + 8, dtype=np.float32).reshape(4, -1)
    x[0, 0] = np.inf  # equals its rounding, as for np.rint
    if bad is not None:
        x[3, -1] = bad  # in the last block
    assert all_integral(x) == bool(np.array_equal(x, np.rint(x)))
