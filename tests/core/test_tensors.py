"""DepthwiseWeight: the block-sparse weight of a lowered depthwise convolution, held as its kernel."""

from __future__ import annotations

import io

import numpy as np
import onnx
import onnx_ir as ir
import pytest

import finnlite.core.tensors as tensors
from finnlite import Model
from finnlite.core.tensors import DepthwiseWeight, depthwise_matrix, freeze, is_immutable
from streamline.lower_conv import conv_weight_matrix
from tests.core.fixtures import chain_model


def _kernel(c: int = 5, kh: int = 3, kw: int = 2, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(-4, 5, size=(c, kh, kw)).astype(np.float32)


@pytest.mark.parametrize("c, kh, kw", [(5, 3, 2), (1, 3, 3), (8, 1, 1), (3, 5, 5)])
def test_the_dense_matrix_is_the_lowered_depthwise_weight(c, kh, kw):
    kernel = _kernel(c, kh, kw)
    t = DepthwiseWeight(kernel, name="w")
    dense = conv_weight_matrix(kernel[:, None], group=c) if c > 1 else conv_weight_matrix(kernel[:, None], 1)
    assert t.shape == ir.Shape([kh * kw * c, c]) and t.dtype == ir.DataType.FLOAT and t.size == dense.size
    np.testing.assert_array_equal(t.numpy(), dense)
    np.testing.assert_array_equal(depthwise_matrix(kernel), dense)
    assert not t.numpy().flags.writeable
    assert t.tobytes() == dense.tobytes()
    out = io.BytesIO()
    t.tofile(out)
    assert out.getvalue() == dense.tobytes()
    # what the compact form answers without the matrix
    assert set(t.element_values().tolist()) == set(np.unique(dense).tolist())
    np.testing.assert_array_equal(np.abs(t.column_weights()).sum(axis=1), np.abs(dense).sum(axis=0))
    assert t.density() == pytest.approx(np.count_nonzero(dense) / dense.size)
    assert t.channels == c and t.kernel_shape == (kh, kw)


def test_the_kernel_is_a_private_read_only_copy():
    kernel = _kernel()
    t = DepthwiseWeight(kernel)
    kernel[0, 0, 0] = 99
    assert t.kernel[0, 0, 0] != 99 and not t.kernel.flags.writeable
    with pytest.raises(ValueError):
        DepthwiseWeight(np.zeros((2, 3)))


def test_immutability_is_decided_without_reading_the_data():
    assert is_immutable(DepthwiseWeight(_kernel()))
    assert is_immutable(ir.tensor(freeze(np.ones(3, np.float32))))
    assert not is_immutable(ir.tensor(np.ones(3, np.float32)))
    view = freeze(np.ones(4, np.float32)[1:])
    assert is_immutable(ir.tensor(view))
    base = np.ones(4, np.float32)
    assert not is_immutable(ir.tensor(np.frombuffer(memoryview(base), np.float32)))  # writable memory behind it


def test_a_model_keeps_it_compact_and_reads_and_writes_the_dense_matrix(tmp_path, monkeypatch):
    made = []
    real = tensors._dense_tensor
    monkeypatch.setattr(tensors, "_dense_tensor", lambda k: made.append(k) or real(k))  # before the weight binds it
    kernel = _kernel(4, 3, 3)
    dense = depthwise_matrix(kernel)
    model = Model(chain_model(1, width=36))
    x = model.graph.inputs[0]
    w = model.set_initializer("w", DepthwiseWeight(kernel))
    y = ir.Value(name="mm_out")
    model.graph.append(ir.Node("", "MatMul", [x, w], outputs=[y], name="mm"))
    model.graph.outputs.append(y)
    assert isinstance(model.graph.initializers["w"].const_value, DepthwiseWeight)
    assert model.get_tensor_shape("w") == (36, 4) and made == []
    np.testing.assert_array_equal(model.get_initializer("w"), dense)
    assert len(made) == 1  # get_initializer makes the dense matrix (and does not keep it)
    # the same file as with the dense array: streamed block by block, without making the matrix
    twin = Model(model.to_proto())
    twin.set_initializer("w", dense)
    made.clear()
    model.save(tmp_path / "compact.onnx")
    assert made == []
    twin.save(tmp_path / "dense.onnx")
    assert (tmp_path / "compact.onnx").read_bytes() == (tmp_path / "dense.onnx").read_bytes()
    assert model.to_proto().SerializeToString() == twin.to_proto().SerializeToString()
    loaded = onnx.load(str(tmp_path / "compact.onnx"))
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(
        next(t for t in loaded.graph.initializer if t.name == "w")), dense)
    # and a qonnx ModelWrapper sees the dense matrix (FINN's later steps read it)
    np.testing.assert_array_equal(model.to_qonnx().get_initializer("w"), dense)
