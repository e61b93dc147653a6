"""The range of a matrix product's accumulator: one derivation, shared by the pipeline's datatype inference
(:mod:`streamline.datatypes`), the verifier's derived ranges (:mod:`verify.annotations`) and the per-layer widths
``finnlite info`` shows (:mod:`finnlite.cost`).

For an output channel ``c`` with weights ``w[k, c]`` and inputs ``x_k`` anywhere in ``[lo, hi]``,
``Σ_k x_k·w[k, c]`` is largest with ``x_k = hi`` where ``w > 0`` and ``x_k = lo`` where ``w < 0``, so it lies in
``[lo·P_c + hi·N_c, hi·P_c + lo·N_c]`` with ``P_c`` the sum of the channel's positive weights and ``N_c`` of its
negative ones; both ends are attained (the inputs vary independently), so the range over all channels is exact.
This is what FINN's ``calculate_matvec_accumulator_range`` computes from a layer's weights and input datatype.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from finnlite.core.tensors import DepthwiseWeight

__all__ = ["weight_sums", "accumulator_range"]

#: per output channel, the sum of the positive weights and of the negative weights; whether every weight is an
#: integer
WeightSums = tuple[np.ndarray, np.ndarray, bool]


def weight_sums(w: Any, op: str) -> WeightSums | None:
    """:data:`WeightSums` of the constant weight ``w`` (an array, an ``ir`` tensor or a
    :class:`~finnlite.core.tensors.DepthwiseWeight`) of a ``MatMul`` (``[K, N]``, channels along axis 1), ``Conv``
    (``[O, I/g, kh, kw]``, channels along axis 0) or ``Gemm`` with ``transB`` (``op="GemmT"``: ``[N, K]``); None for a
    MatMul weight that is not 2-D."""
    if isinstance(w, DepthwiseWeight):
        cols = np.asarray(w.column_weights())  # [C, k]: a channel's weights, without the dense matrix's zeros
    else:
        arr = np.asarray(w.numpy() if hasattr(w, "numpy") else w)
        if op in ("Conv", "GemmT"):
            cols = arr.reshape(arr.shape[0], -1)
        elif arr.ndim == 2:
            cols = arr.T
        else:
            return None
    if cols.dtype.kind != "f":
        cols = cols.astype(np.float64)
    return (np.maximum(cols, 0).sum(axis=1, dtype=np.float64), np.minimum(cols, 0).sum(axis=1, dtype=np.float64),
            bool(np.array_equal(cols, np.rint(cols))))


def accumulator_range(lo: float, hi: float, sums: WeightSums) -> tuple[float, float]:
    """The range of ``Σ_k x_k·w[k, c]`` over every output channel ``c`` for inputs in ``[lo, hi]`` (module
    docstring); ``(-inf, inf)`` when an infinite input bound meets a zero sum (no bound then)."""
    pos, neg, _ = sums
    with np.errstate(invalid="ignore"):
        high = hi * pos + lo * neg
        low = lo * pos + hi * neg
    if pos.size == 0:
        return 0.0, 0.0
    if np.isnan(high).any() or np.isnan(low).any():
        return -np.inf, np.inf
    return float(low.min()), float(high.max())
