"""The model class on a synthetic 5,000-node Add/Mul chain, beside qonnx's ModelWrapper doing the same work.

Work: load, query every tensor's producer, consumers and shape, give every node a unique name, sort
topologically, save. qonnx's ModelWrapper is quadratic here (its constructor and every ``find_producer`` scan the
graph), so by default it is measured on smaller chains; ``FINNLITE_BENCH_FULL=1`` measures it at 5,000 nodes too.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from finnlite.core.compat import make_model


def chain(n: int, width: int = 16) -> onnx.ModelProto:
    """x -> Add -> Mul -> Add ... (n nodes), each with its own constant, unsorted names."""
    nodes, inits, prev = [], [], "x"
    for i in range(n):
        c = f"c{i}"
        inits.append(numpy_helper.from_array(np.full([width], 1.0 + (i % 7) / 8, np.float32), c))
        out = "y" if i == n - 1 else f"t{i}"
        nodes.append(helper.make_node("Add" if i % 2 == 0 else "Mul", [prev, c], [out], name=""))
        prev = out
    vi = [helper.make_tensor_value_info(f"t{i}", TensorProto.FLOAT, [1, width]) for i in range(n - 1)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])],
                              initializer=inits, value_info=vi)
    return make_model(graph, custom_opset=None)


def finnlite_work(path: Path, out: Path) -> float:
    from finnlite import Model

    t0 = time.perf_counter()
    m = Model(path)
    for name in m.get_all_tensor_names():
        m.find_producer(name)
        m.find_consumers(name)
        m.get_tensor_shape(name)
    m.give_unique_node_names()
    m.topological_sort()
    m.save(out)
    return time.perf_counter() - t0


def qonnx_work(path: Path, out: Path) -> float:
    from qonnx.core.modelwrapper import ModelWrapper
    from qonnx.transformation.general import GiveUniqueNodeNames, SortGraph

    t0 = time.perf_counter()
    m = ModelWrapper(str(path))
    for name in m.get_all_tensor_names():
        m.find_producer(name)
        m.find_consumers(name)
        m.get_tensor_shape(name)
    m = m.transform(GiveUniqueNodeNames())
    m = m.transform(SortGraph())
    m.save(str(out))
    return time.perf_counter() - t0


def main() -> None:
    full = os.environ.get("FINNLITE_BENCH_FULL") == "1"
    print("== model class: load, query every tensor, unique names, sort, save (synthetic Add/Mul chain)")
    print(f"  {'nodes':>6}  {'finnlite s':>10}  {'qonnx s':>10}  {'ratio':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in (500, 1000, 2000, 5000):
            path = Path(tmp) / f"chain{n}.onnx"
            onnx.save(chain(n), path)
            ours = min(finnlite_work(path, Path(tmp) / "ours.onnx") for _ in range(3))
            if n <= 1000 or full:
                theirs = qonnx_work(path, Path(tmp) / "theirs.onnx")
                print(f"  {n:>6}  {ours:>10.3f}  {theirs:>10.2f}  {theirs / ours:>6.0f}x")
            else:
                print(f"  {n:>6}  {ours:>10.3f}  {'(skipped)':>10}  {'':>7}   qonnx is quadratic here; "
                      f"FINNLITE_BENCH_FULL=1 measures it")
    print("  target: 5,000 nodes under 2 s")


if __name__ == "__main__":
    main()
