"""FMPadding_Pixel (FINN's zero insertion of a transposed convolution) against a direct construction."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from custom_ops import HW_DOMAIN, make_op
from finnlite.core.datatypes import DataType
from finnlite.core.errors import OpError


def _op(h, w, sh, sw, c=3, dt="INT4"):
    node = helper.make_node("FMPadding_Pixel", ["x"], ["y"], domain=HW_DOMAIN, name="pp", ImgDim=[h, w],
                            Stride=[sh, sw], NumChannels=c, inputDataType=dt, backend="fpgadataflow")
    return make_op(node)


@pytest.mark.parametrize("h,w,sh,sw", [(3, 4, 2, 2), (2, 5, 3, 1), (1, 4, 1, 8), (4, 4, 1, 1)])
def test_zeros_between_pixels(h, w, sh, sw):
    op = _op(h, w, sh, sw)
    x = np.random.default_rng(h * w).integers(-8, 8, size=(2, h, w, 3)).astype(np.float32)
    y = op.execute([x])[0]
    expected = np.zeros((2, h + (h - 1) * (sh - 1), w + (w - 1) * (sw - 1), 3), np.float32)
    for i in range(h):
        for j in range(w):
            expected[:, i * sh, j * sw] = x[:, i, j]
    np.testing.assert_array_equal(y, expected)
    assert op.infer_shapes([x.shape], [None]) == [expected.shape]
    assert op.infer_datatypes([DataType["INT4"]], [None]) == [DataType["INT4"]]


def test_bad_shapes_and_datatypes():
    op = _op(3, 4, 2, 2)
    with pytest.raises(OpError, match="ImgDim"):
        op.execute([np.zeros((1, 3, 5, 3), np.float32)])
    with pytest.raises(OpError, match="zeros"):
        op.infer_datatypes([DataType["BIPOLAR"]], [None])
