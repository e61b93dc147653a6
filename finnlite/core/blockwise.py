"""Whole-array checks made block by block, so that a check over a large weight needs temporaries of one block.

A test such as ``np.all(np.abs(w) == 1)`` over a weight makes two temporaries of the weight's size (the absolute
values, then the booleans). :func:`all_blocks` applies the test to consecutive blocks of the flattened
array instead and stops at the first block that fails; the answer is the same.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

__all__ = ["BLOCK", "all_blocks", "all_in", "all_integral"]

#: elements per block (256 KB of float32): large enough that the per-block overhead is negligible
BLOCK = 1 << 16


def all_blocks(array: np.ndarray, test: Callable[[np.ndarray], bool | np.bool_]) -> bool:
    """Whether ``test(block)`` is true for every block of ``array`` flattened in C order (a view where the array
    is contiguous). ``test`` gets a 1-D array of at most :data:`BLOCK` elements and says whether all of them pass;
    an empty array passes."""
    flat = np.asarray(array).reshape(-1)
    return all(bool(test(flat[i:i + BLOCK])) for i in range(0, flat.size, BLOCK))


def all_in(array: np.ndarray, *values: float) -> bool:
    """Whether every element of ``array`` equals one of ``values`` (NaN never does)."""
    def test(block: np.ndarray) -> bool:
        hit = block == values[0]
        for v in values[1:]:
            hit |= block == v
        return bool(hit.all())

    return all_blocks(array, test)


def all_integral(array: np.ndarray) -> bool:
    """Whether every element of ``array`` equals its rounding to an integer (infinities do, NaN does not)."""
    return all_blocks(array, lambda block: np.array_equal(block, np.rint(block)))
