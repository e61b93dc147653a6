"""The accumulator range (finnlite.core.ranges), against enumeration of every input vector."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from finnlite.core.ranges import accumulator_range, weight_sums
from finnlite.core.tensors import DepthwiseWeight


def _enumerated(w_cols: np.ndarray, lo: int, hi: int) -> tuple[float, float]:
    """min and max of x · w[c] over every integer x in [lo, hi]^K and every channel c (w_cols: [C, K])."""
    xs = np.array(list(itertools.product(range(lo, hi + 1), repeat=w_cols.shape[1])), dtype=np.float64)
    acc = xs @ w_cols.T
    return float(acc.min()), float(acc.max())


@pytest.mark.parametrize("lo,hi", [(0, 3), (-2, 1), (-1, 1), (0, 1), (-4, -1)])
@pytest.mark.parametrize("seed", range(4))
def test_matmul_conv_and_gemm_ranges_are_exact(lo: int, hi: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    w = rng.integers(-3, 4, size=(4, 3)).astype(np.float32)  # MatMul [K, N]
    expected = _enumerated(w.T, lo, hi)
    sums = weight_sums(w, "MatMul")
    assert sums is not None and sums[2]
    assert accumulator_range(lo, hi, sums) == expected
    assert accumulator_range(lo, hi, weight_sums(w.T, "GemmT")) == expected  # Gemm with transB: [N, K]
    conv = w.T.reshape(3, 2, 2, 1)  # Conv [O, I, kh, kw]: the same 4 weights per output channel
    assert accumulator_range(lo, hi, weight_sums(conv, "Conv")) == expected


def test_depthwise_weight_sums_skip_the_dense_zeros() -> None:
    kernel = np.array([[[1, -2], [3, 0]], [[-1, -1], [2, 2]]], dtype=np.float32)  # [C=2, kh=2, kw=2]
    dw = DepthwiseWeight(kernel)
    pos, neg, integer = weight_sums(dw, "MatMul")
    assert integer and pos.tolist() == [4, 4] and neg.tolist() == [-2, -2]
    dense = weight_sums(dw.numpy(), "MatMul")  # the [8, 2] matrix with its zeros: the same sums
    assert pos.tolist() == dense[0].tolist() and neg.tolist() == dense[1].tolist()
    assert accumulator_range(0, 3, (pos, neg, integer)) == _enumerated(kernel.reshape(2, 4), 0, 3)


def test_non_integer_weights_and_unbounded_inputs() -> None:
    sums = weight_sums(np.array([[0.5], [1.0]], np.float32), "MatMul")
    assert sums is not None and not sums[2]
    assert weight_sums(np.ones((2, 2, 2), np.float32), "MatMul") is None
    zero_column = weight_sums(np.array([[0.0, 1.0]], np.float32), "MatMul")
    assert accumulator_range(-np.inf, np.inf, zero_column) == (-np.inf, np.inf)
