"""The verifier's cache of one sample's tensor values, where an entry may be made when read instead of stored.

Per-pass verification keeps the value of every tensor of the current model version (:mod:`verify.verifier`). The
outputs of ``Im2Col`` nodes are ``kh·kw`` times their input, and a region run often need not make them: the executor runs an
``Im2Col`` and the ``MatMul`` reading it as one ``Conv`` (:mod:`custom_ops.intconv`). :func:`verify.region.run_nodes`
returns every window as a :class:`Recompute` entry (the ``Im2Col`` kernel and its input array), whether the run
made it (an unfused pair: a float input, a binary ``XnorPopcountMatMul``) or not, and :class:`SampleValues` makes
the array, by that kernel, only when the entry is read: a window is pure data movement of its input, so the array
is the one the run returns. Entries pass from a run's results into the cache as they are. Readers that need only a
tensor's shape and dtype use :meth:`SampleValues.meta`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["Recompute", "SampleValues"]


class Recompute:
    """A cached tensor held as the kernel that computes it and the arrays it reads."""

    __slots__ = ("op", "inputs", "shape", "dtype")

    def __init__(self, op: Any, inputs: list[np.ndarray | None], shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.op, self.inputs, self.shape, self.dtype = op, inputs, tuple(shape), np.dtype(dtype)

    def value(self) -> np.ndarray:
        return np.asarray(self.op.execute(list(self.inputs))[0])


class SampleValues(dict):
    """One sample's cached tensors by name: arrays, or :class:`Recompute` entries made into arrays when read
    (``[]``, :meth:`get`, a ``ChainMap`` over it). Iterating and ``in`` see every name."""

    def __getitem__(self, key: str) -> np.ndarray:
        value = dict.__getitem__(self, key)
        return value.value() if isinstance(value, Recompute) else value

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        return self[key] if key in self else default

    def meta(self, key: str) -> tuple[tuple[int, ...], np.dtype]:
        """The shape and dtype of tensor ``key``, without making a recomputed one."""
        value = dict.__getitem__(self, key)
        if isinstance(value, Recompute):
            return value.shape, value.dtype
        arr = np.asarray(value)
        return arr.shape, arr.dtype
