"""Giving memory back: the shared onnxruntime arena shrinks and glibc's heap is trimmed (custom_ops.plan.release_memory,
finnlite.memory.trim_heap). Resident memory is read from /proc, so these run on Linux only."""

import platform
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper

import custom_ops.plan as plan
from custom_ops.executor import Executor
from finnlite.compat import make_model
from finnlite.memory import trim_heap

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads resident memory from /proc")

MB = 1 << 20


def _resident() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _chain(n: int) -> Executor:
    """Relu → Neg → Abs on n floats: two intermediates of n floats each in the region's arena."""
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="r"), helper.make_node("Neg", ["a"], ["b"], name="n"),
             helper.make_node("Abs", ["b"], ["y"], name="ab")]
    graph = helper.make_graph(nodes, "chain", [vi("x", TensorProto.FLOAT, [n])], [vi("y", TensorProto.FLOAT, [n])])
    return Executor(make_model(graph))


def test_release_memory_shrinks_the_shared_arena_and_keeps_results():
    n = 16 * MB  # 64 MB a tensor
    x = np.linspace(-1, 1, n, dtype=np.float32)
    _chain(4).run({"x": x[:4]})  # the arena's first region, which onnxruntime never shrinks, is a small one
    ex = _chain(n)
    first = ex.run({"x": x})["y"]
    del ex
    if not plan._SHARED_ARENA:
        pytest.skip("this onnxruntime has no process-wide arena to shrink")
    before = _resident()
    plan.release_memory()
    released = before - _resident()
    # the run's intermediates (64 MB: Neg and Abs reuse Relu's buffer) came from the shared arena, which keeps them
    # until shrunk; the output stays (the returned array lives in the arena)
    assert released >= 48 * MB, f"released {released / MB:.0f} MB"
    again = _chain(n).run({"x": x})["y"]  # the arena grows again as needed
    assert np.array_equal(first, again) and np.array_equal(again, np.abs(np.maximum(x, 0)))


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_trim_heap_returns_freed_heap_pages():
    # blocks below glibc's mmap threshold come from the heap; freeing every other one leaves holes between live
    # blocks, which free() cannot give back (only the top of the heap shrinks by itself) and malloc_trim can
    blocks = [np.ones(8 << 10, np.float64) for _ in range(2048)]  # 2048 x 64 KB
    holes = blocks[::2]
    blocks = blocks[1::2]
    del holes
    before = _resident()
    assert trim_heap() is True
    released = before - _resident()
    assert released >= 32 * MB, f"released {released / MB:.0f} MB of 64 MB in holes"
    assert all(b[0] == 1.0 and b[-1] == 1.0 for b in blocks)  # what is alive is untouched


def test_trim_heap_is_a_no_op_off_glibc(monkeypatch):
    import finnlite.memory as memory

    monkeypatch.setattr(memory, "_TRIM", False)
    assert memory.trim_heap() is False


def test_anonymous_memory_counts_what_the_process_writes_not_the_libraries_it_maps():
    """anonymous_memory grows by a new array's pages once they are written, and not by reading a file mapped in."""
    import mmap
    import tempfile

    from finnlite.memory import anonymous_memory

    before = anonymous_memory()
    arr = np.ones(16 * MB // 4, dtype=np.float32)  # 16 MB, written
    grown = anonymous_memory() - before
    assert 15 * MB <= grown <= 18 * MB
    with tempfile.TemporaryFile() as f:
        f.write(b"\1" * (16 * MB))
        f.flush()
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            before = anonymous_memory()
            assert sum(m[i] for i in range(0, len(m), 4096)) == 4096  # every page read
            assert anonymous_memory() - before < 2 * MB  # file-backed: not counted
    del arr
