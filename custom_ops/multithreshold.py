"""MultiThreshold: counting thresholds, the activation of a streamlined FINN network.

Inputs ``x`` and ``thresholds`` of shape ``(C, N)`` or ``(1, N)`` (one row for all channels). For every element
of ``x`` in channel ``c``::

    y = out_scale * #{k : x >= thresholds[c, k]} + out_bias

The count does not assume sorted rows (FINN keeps them sorted); a NaN input passes no threshold, a NaN threshold
is never passed. The count is taken in ``x``'s dtype before scaling, as in qonnx, so float32 results are
bit-identical to qonnx's.

Attributes (qonnx's): ``out_dtype`` (required, a datatype name), ``out_scale`` (default 1.0), ``out_bias``
(default 0.0), ``data_layout`` (default ""). The channel axis is the position of ``C`` in ``data_layout``
(``NCHW``, ``NHWC``, ``NC``, ``NCW``, ``NWC``, ...); a layout without ``C`` means axis 1. With no layout it follows
from the rank, as qonnx guesses: rank 2 ``NC``, rank 3 ``NWC`` (channels *last*), rank 4 ``NCHW``, otherwise axis 1.

Output datatype, as qonnx infers it: ``out_dtype``, or FLOAT32 when ``out_scale`` or ``out_bias`` is not an
integer. Output shape: the input's.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from custom_ops.base import CustomOp
from custom_ops.common import Shape, float_attr, known_int, shape_of
from custom_ops.registry import register
from finnlite.core.datatypes import BaseDataType, DataType, parse_datatype
from finnlite.core.errors import DataTypeError

#: with the channels last, thresholds are repeated over rows up to this many elements a step, and this many in all
#: (multithreshold)
_ROW_BLOCK, _TILE = 1 << 14, 1 << 18

#: qonnx's layout guess for an input without a ``data_layout``, by rank
_LAYOUT_OF_RANK = {2: "NC", 3: "NWC", 4: "NCHW"}


def channel_axis_of(data_layout: str, ndim: int) -> int:
    """The channel axis a MultiThreshold uses for an input of rank ``ndim`` (module docstring)."""
    layout = data_layout or _LAYOUT_OF_RANK.get(ndim, "")
    return layout.index("C") if "C" in layout else 1


#: from this many steps on, :func:`multithreshold` counts by a binary search in each sorted row
_SEARCH_STEPS = 256


#: rows of at least this many queries are searched one numpy call per row (the call's overhead is then small)
_ROW_QUERIES = 1 << 12


def search_sorted_rows(sorted_v: np.ndarray, q: np.ndarray, right: bool) -> np.ndarray:
    """Row by row, ``np.searchsorted(sorted_v[c], q[c], side)`` (``side="right"`` if ``right``) for ``sorted_v``
    ``[C, N]`` and ``q`` ``[C, M]``; a NaN in ``sorted_v`` sorts last, as in numpy (for a NaN query the result is
    unspecified: callers count it as 0). Long rows take one numpy call each; short ones
    (many channels of a few queries each) are searched all at once, by a binary search of ``⌈log₂(N + 1)⌉``
    vectorized steps."""
    rows, n = sorted_v.shape
    side = "right" if right else "left"
    if q.shape[1] >= _ROW_QUERIES or rows == 1:
        out = np.empty(q.shape, np.int64)
        for c in range(rows):
            out[c] = np.searchsorted(sorted_v[c], q[c], side=side)
        return out
    lo = np.zeros(q.shape, np.int64)
    hi = np.full(q.shape, n, np.int64)
    flat = np.append(sorted_v.ravel(), np.nan)  # a guard for finished searches (mid = N)
    offset = (np.arange(rows) * n)[:, None]
    for _ in range(int(n).bit_length()):
        mid = (lo + hi) >> 1
        at = flat[np.where(mid < n, offset + mid, flat.size - 1)]
        go = (at <= q) if right else (at < q)  # False against a NaN: it sorts above every q
        go &= mid < hi
        lo = np.where(go, mid + 1, lo)
        hi = np.where(go, hi, mid)
    return lo


def _search_counts(x2: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """``#{k : x ≥ thresholds[c, k]}`` for ``x2`` ``[C, M]`` (or ``[1, M]`` against one row) by a binary search
    in each sorted row, compared in float64 (exact for float32 values, as numpy's comparison promotes them): a NaN
    input passes no threshold, a NaN threshold (sorted last) is never passed."""
    x2 = np.asarray(x2, dtype=np.float64)
    t = np.sort(np.asarray(thresholds, dtype=np.float64), axis=1)
    if t.shape[0] == 1 and x2.shape[0] > 1:
        t = np.broadcast_to(t, (x2.shape[0], t.shape[1]))
    counts = search_sorted_rows(t, x2, right=True)
    counts[np.isnan(x2)] = 0
    return counts


def multithreshold_rows(x: np.ndarray, thresholds: np.ndarray, out_scale: float = 1.0,
                        out_bias: float = 0.0) -> np.ndarray:
    """:func:`multithreshold` of ``x`` ``[C, M]`` with ``thresholds`` ``[C, N]`` or ``[1, N]`` (channels on axis
    0) in float64, by a binary search in each sorted row: ``O(M·log N)``, for many thresholds (a 16-bit quantizer's
    65535) evaluated at many points."""
    x = np.asarray(x, dtype=np.float64)
    t = np.broadcast_to(np.asarray(thresholds, dtype=np.float64), (x.shape[0], np.shape(thresholds)[1]))
    return out_scale * _search_counts(x, t).astype(np.float64) + out_bias


def multithreshold(x: np.ndarray, thresholds: np.ndarray, out_scale: float = 1.0, out_bias: float = 0.0,
                   channel_axis: int = 1) -> np.ndarray:
    """``out_scale * #{k : x >= thresholds[c, k]} + out_bias`` with ``c`` the index along ``channel_axis``.

    ``thresholds`` is ``(C, N)`` or ``(1, N)``. One threshold step at a time: its column, shaped to broadcast
    along the channel axis, is compared with all of ``x`` and the hits are added into a counter of the narrowest
    unsigned type that holds ``N`` (uint8 for up to 255 steps). Only the counter and one boolean array of
    ``x``'s size are live, and the passes over memory are byte-wide. With the channels last (NHWC), the column is
    repeated over a block of rows, so that each comparison runs on arrays of one shape rather than broadcasting a
    short row (the same comparisons, fewer and longer loops). From 256 steps on (a 16-bit quantizer), a binary
    search in each sorted row counts instead (the same comparisons' result). ``ValueError`` for mismatched
    shapes."""
    x = np.asarray(x)
    thresholds = np.asarray(thresholds)
    if thresholds.ndim != 2:
        raise ValueError(f"thresholds must have shape (channels, steps), got {thresholds.shape}")
    if not -x.ndim <= channel_axis < x.ndim:
        raise ValueError(f"channel axis {channel_axis} out of range for an input of shape {x.shape}")
    axis = channel_axis % x.ndim
    channels, steps = thresholds.shape
    if channels not in (1, x.shape[axis]):
        raise ValueError(f"thresholds have {channels} rows, the input has {x.shape[axis]} channels")
    if steps >= _SEARCH_STEPS:  # many steps (a 16-bit output quantizer): a binary search per element
        moved = np.moveaxis(x, axis, 0)
        flat = moved.reshape(1 if channels == 1 else x.shape[axis], -1)
        counts = np.moveaxis(_search_counts(flat, thresholds).reshape(moved.shape), 0, axis)
        return _scaled(counts, x.dtype, out_scale, out_bias)
    view = x
    # (steps, 1, .., C, .., 1): step k broadcasts one value per channel over x
    shape = (steps,) + (1,) * axis + (channels,) + (1,) * (x.ndim - 1 - axis)
    columns = np.ascontiguousarray(thresholds.T).reshape(shape)
    if axis == x.ndim - 1 and channels > 1 and x.flags.c_contiguous:
        rows = x.size // channels
        repeat = min(_ROW_BLOCK, _TILE // steps) // channels
        while repeat > 1 and rows % repeat:
            repeat //= 2
        if repeat > 1:  # x as (rows / repeat, repeat * C), each column repeated: one row of it per comparison
            view = x.reshape(rows // repeat, repeat * channels)
            columns = np.tile(thresholds.T, (1, repeat)).reshape(steps, 1, repeat * channels)
    counter = np.uint8 if steps < 1 << 8 else np.uint16 if steps < 1 << 16 else np.int64
    counts = np.zeros(view.shape, dtype=counter)
    hits = np.empty(view.shape, dtype=bool)
    as_int = hits.view(np.uint8) if counter is not np.int64 else hits  # bool as 0/1 bytes: no cast in the sum
    for k in range(steps):
        np.greater_equal(view, columns[k], out=hits)
        counts += as_int
    return _scaled(counts.reshape(x.shape), x.dtype, out_scale, out_bias)


def _scaled(counts: np.ndarray, dtype: np.dtype, out_scale: float, out_bias: float) -> np.ndarray:
    """``out_scale · counts + out_bias`` with the counts taken in the input's dtype first, as qonnx does."""
    levels = counts.astype(dtype)
    if levels.dtype.kind != "f":  # an integer input: the float result numpy's promotion gives
        return out_scale * levels + out_bias
    # in place: the same float arithmetic without two more arrays of x's size
    if out_scale != 1.0:
        levels *= out_scale
    if out_bias != 0.0:
        levels += out_bias
    return levels


@register
class MultiThreshold(CustomOp):
    """Counting thresholds per channel (module docstring)."""

    op_type = "MultiThreshold"
    attr_spec = {
        "out_dtype": ("s", True, ""),
        "out_scale": ("f", False, 1.0),
        "out_bias": ("f", False, 0.0),
        "data_layout": ("s", False, ""),
    }
    num_inputs = (2, 2)

    def validate_attrs(self) -> None:
        try:
            self.out_dtype = parse_datatype(self.attrs["out_dtype"])
        except DataTypeError:
            raise self.fail(f"attribute 'out_dtype' is not a datatype: {self.attrs['out_dtype']!r}") from None
        self.out_scale = float_attr(self, "out_scale")
        self.out_bias = float_attr(self, "out_bias")
        layout = self.attrs["data_layout"]
        if not isinstance(layout, str) or not (layout == "" or layout.isalpha()) or layout.count("C") > 1:
            raise self.fail(f"attribute 'data_layout' must be a layout such as 'NCHW' or 'NHWC', got {layout!r}")
        self.data_layout = layout

    def channel_axis(self, ndim: int) -> int:
        """The channel axis for an input of rank ``ndim``; an error if the input has no such axis."""
        axis = channel_axis_of(self.data_layout, ndim)
        if axis >= ndim:
            layout = f"data_layout '{self.data_layout}'" if self.data_layout else "the default layout"
            raise self.fail(f"{layout} puts the channels on axis {axis}, the input has rank {ndim}")
        return axis

    def _check_shapes(self, x_shape: tuple | None, t_shape: tuple | None) -> None:
        if t_shape is None:
            return
        if len(t_shape) != 2:
            raise self.fail(f"thresholds must have shape (channels, steps), got {tuple(t_shape)}")
        if x_shape is None:
            return
        channels = known_int(x_shape[self.channel_axis(len(x_shape))])
        rows = known_int(t_shape[0])
        if channels is not None and rows is not None and rows not in (1, channels):
            raise self.fail(f"thresholds have {rows} rows, the input has {channels} channels "
                            f"on axis {self.channel_axis(len(x_shape))}")

    def validate_inputs(self, inputs: Sequence[np.ndarray | None]) -> None:
        self.check_num_inputs(len(inputs))
        self._check_shapes(shape_of(inputs[0]), shape_of(inputs[1]))

    def validate_strict(self, inputs: Sequence[np.ndarray | None]) -> None:
        """Also: constant thresholds hold no NaN and every row is sorted (non-decreasing), as FINN requires."""
        self.validate_inputs(inputs)
        thresholds = inputs[1]
        if thresholds is None:
            return
        t = np.asarray(thresholds, dtype=np.float64)
        if np.isnan(t).any():
            row = int(np.argwhere(np.isnan(t))[0][0])
            raise self.fail(f"thresholds hold NaN (row {row})")
        if t.ndim == 2 and t.shape[1] > 1:
            down = t[:, 1:] < t[:, :-1]  # compared, not subtracted: equal infinite thresholds are sorted
            if down.any():
                row, k = (int(i) for i in np.argwhere(down)[0])
                raise self.fail(f"thresholds are not sorted in row {row} (step {k + 1}: {t[row, k + 1]:g} < "
                                f"{t[row, k]:g})")

    def execute(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.validate_inputs(inputs)
        x, thresholds = (np.asarray(v) for v in inputs)
        axis = self.channel_axis(x.ndim)
        return [np.asarray(multithreshold(x, thresholds, self.out_scale, self.out_bias, axis))]

    def infer_shapes(self, shapes: Sequence[Shape | None],
                     values: Sequence[np.ndarray | None]) -> list[Shape | None]:
        self.check_num_inputs(len(shapes))
        self._check_shapes(shapes[0], shapes[1])
        return [None if shapes[0] is None else tuple(shapes[0])]

    def infer_datatypes(self, dtypes: Sequence[BaseDataType | None],
                        values: Sequence[np.ndarray | None]) -> list[BaseDataType]:
        self.check_num_inputs(len(dtypes))
        if self.out_scale != int(self.out_scale) or self.out_bias != int(self.out_bias):
            return [DataType["FLOAT32"]]
        return [self.out_dtype]
