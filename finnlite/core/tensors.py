"""Tensors held in a compact form: the weight matrix of a lowered depthwise convolution.

FINN lowers a depthwise convolution to ``Im2Col(depthwise=1) → MatMul`` whose weight is the block-sparse
``[kh·kw·C, C]`` matrix with ``W[(a·kw + b)·C + c, c] = w[c, 0, a, b]`` and zeros elsewhere (its VVAU folds it back
into ``[C, 1, kh, kw]``). Dense, that matrix is ``kh·kw·C`` times the weights it holds.

:class:`DepthwiseWeight` is that matrix as an ``onnx_ir`` tensor (a :class:`onnx_ir.LazyTensor`) that stores only
the ``[C, kh, kw]`` kernel. Everything that asks for its contents gets the exact dense matrix (``numpy()``,
``tobytes()``, serialization, :meth:`finnlite.Model.get_initializer`, a qonnx ModelWrapper), made on demand and not
kept; :meth:`DepthwiseWeight.tofile` (saving) writes it block by block. Code that knows the form works on the kernel
instead: the executor runs it as a grouped ``Conv`` (:mod:`custom_ops.intconv`), datatype and range inference and
the inference cost read the values and column sums from the kernel, the verifier fingerprints it by identity.
"""

from __future__ import annotations

import functools
import pickle
import sys
import zlib
from typing import Any, BinaryIO

import numpy as np
import onnx_ir as ir

__all__ = ["DepthwiseWeight", "content_crc", "depthwise_matrix", "element_values", "freeze", "is_frozen",
           "is_immutable"]


def freeze(array: np.ndarray) -> np.ndarray:
    """Make ``array`` read-only, and every array it is a view of: an initializer's contents can then change only
    by replacing it, which is what lets the verifier fingerprint it once (see :func:`is_frozen`). Editing an
    initializer in place raises ``ValueError: assignment destination is read-only``; copy it first."""
    a: Any = array
    while isinstance(a, np.ndarray):
        a.flags.writeable = False
        a = a.base
    return array


def is_frozen(array: np.ndarray) -> bool:
    """True if nothing can write to ``array``'s memory through numpy: it and every array it is a view of are
    read-only, and the memory it wraps, if not an array's, is immutable (``bytes``) or absent."""
    a: Any = array
    while isinstance(a, np.ndarray):
        if a.flags.writeable:
            return False
        a = a.base
    return a is None or isinstance(a, bytes)


def depthwise_matrix(kernel: np.ndarray) -> np.ndarray:
    """The dense ``[kh·kw·C, C]`` matrix of a depthwise kernel ``[C, kh, kw]``: row ``(a·kw + b)·C + c`` holds
    ``kernel[c, a, b]`` in column ``c`` and zeros elsewhere (the order of :class:`custom_ops.im2col.Im2Col`'s
    windows)."""
    c, kh, kw = kernel.shape
    mat = np.zeros((kh, kw, c, c), dtype=kernel.dtype)
    idx = np.arange(c)
    mat[:, :, idx, idx] = kernel.transpose(1, 2, 0)
    return mat.reshape(kh * kw * c, c)


def _dense_tensor(kernel: np.ndarray) -> ir.Tensor:
    return ir.Tensor(freeze(depthwise_matrix(kernel)))


class DepthwiseWeight(ir.LazyTensor):
    """The ``[kh·kw·C, C]`` MatMul weight of a lowered depthwise convolution, stored as its kernel (module
    docstring). ``kernel``: the ``[C, kh, kw]`` weights (copied into a read-only array). Its contents never change:
    a rewrite that needs other weights makes a new tensor."""

    __slots__ = ("kernel",)

    def __init__(self, kernel: np.ndarray, *, name: str | None = None, doc_string: str | None = None,
                 metadata_props: dict[str, str] | None = None) -> None:
        kernel = np.array(kernel, copy=True, order="C")
        if kernel.ndim != 3:
            raise ValueError(f"a depthwise kernel is [C, kh, kw], not of shape {kernel.shape}")
        freeze(kernel)
        c, kh, kw = kernel.shape
        # the thunk holds the kernel, not the tensor: no reference cycle keeps a dropped weight alive
        super().__init__(functools.partial(_dense_tensor, kernel), dtype=ir.DataType.from_numpy(kernel.dtype),
                         shape=ir.Shape([kh * kw * c, c]), name=name, doc_string=doc_string,
                         metadata_props=metadata_props)
        self.kernel = kernel

    @property
    def channels(self) -> int:
        return int(self.kernel.shape[0])

    @property
    def kernel_shape(self) -> tuple[int, int]:
        return int(self.kernel.shape[1]), int(self.kernel.shape[2])

    def element_values(self) -> np.ndarray:
        """A 1-D array holding every value the dense matrix holds, and no other: the kernel's, and 0 when the
        matrix has zeros (any C > 1). For value ranges, datatypes and checks such as "all ±1" without the matrix."""
        flat = self.kernel.reshape(-1)
        return np.append(flat, flat.dtype.type(0)) if self.channels > 1 else flat

    def column_weights(self) -> np.ndarray:
        """``[C, kh·kw]``: the nonzero-pattern entries of each column of the dense matrix (column ``c`` holds
        ``kernel[c]`` and zeros), for per-column sums."""
        return self.kernel.reshape(self.channels, -1)

    def density(self) -> float:
        """The fraction of nonzero elements of the dense matrix."""
        size = self.kernel.size * self.channels
        return float(np.count_nonzero(self.kernel)) / size if size else 1.0

    def tofile(self, file: BinaryIO) -> None:
        """Write the dense matrix's bytes (little-endian, as ONNX stores raw data) to ``file``, one ``[C, C]`` block
        of rows at a time: never the whole matrix in memory."""
        c, kh, kw = self.kernel.shape
        dtype = self.kernel.dtype.newbyteorder("<") if sys.byteorder != "little" else self.kernel.dtype
        block = np.zeros((c, c), dtype=dtype)
        idx = np.arange(c)
        for a in range(kh):
            for b in range(kw):
                block[idx, idx] = self.kernel[:, a, b]
                file.write(memoryview(block).cast("B"))

    def __repr__(self) -> str:
        c, kh, kw = self.kernel.shape
        return f"{self._repr_base()}(depthwise kernel [{c}, {kh}, {kw}], name={self.name!r})"


def element_values(t: Any) -> np.ndarray:
    """The values of tensor ``t`` (for a depthwise weight, the values its dense matrix holds: same range)."""
    return t.element_values() if isinstance(t, DepthwiseWeight) else t.numpy()


def content_crc(array: np.ndarray) -> int:
    """crc32 of an array's contents (its bytes in C order; its pickle for an object array): how an edit in place
    of a tensor that is not immutable (:func:`is_immutable`) is seen."""
    array = np.asarray(array)
    if array.dtype.hasobject:
        return zlib.crc32(pickle.dumps(array))
    return zlib.crc32(memoryview(np.ascontiguousarray(array)).cast("B"))


def is_immutable(tensor: Any) -> bool:
    """True if the contents of the ``onnx_ir`` tensor cannot change without the tensor being replaced: read from a
    file (a view of a proto nothing edits), a :class:`DepthwiseWeight`, or an ``ir.Tensor`` over a read-only array
    whose memory nothing else can write (:func:`freeze`). Decided without reading the data."""
    if isinstance(tensor, (ir.serde.TensorProtoTensor, DepthwiseWeight)):
        return True
    raw = getattr(tensor, "raw", None)
    return isinstance(tensor, ir.Tensor) and isinstance(raw, np.ndarray) and is_frozen(raw)
