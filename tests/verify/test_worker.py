"""verify.worker: versions reach the worker process whole, tensors travel once, and the process is looked after."""

from __future__ import annotations

import gc
import logging
import os
import time

import numpy as np
import onnx_ir as ir
import pytest
from onnx import numpy_helper

from finnlite import Model, PassManager, Stage, Transformation
from finnlite.io import to_proto_without
from finnlite.tensors import DepthwiseWeight
from tests.verify.graphs import add_relu
from tests.verify.test_clone import _annotated
from verify import PassVerificationError, ReferenceData, VerificationHook
from verify.worker import RemoteError, VersionReceiver, VersionSender, Worker, process_supported

pytestmark = pytest.mark.skipif(not process_supported(), reason="no worker process here (not Linux, or one CPU)")


def _rich() -> Model:
    """_annotated's graph plus what travels differently: a depthwise weight, a writable array, a 0-d scalar, an
    int64 vector and a Constant node's tensor attribute."""
    m = _annotated()
    m.set_initializer("dw", DepthwiseWeight(np.arange(12, dtype=np.float32).reshape(3, 2, 2)))
    m.ir.graph.register_initializer(ir.Value(name="writable", const_value=ir.tensor(np.ones((2, 2), np.float32)),
                                             type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2, 2])))
    m.set_initializer("scalar", np.float32(3.5))
    m.set_initializer("shape", np.array([1, -1], np.int64))
    const = ir.Node("", "Constant", [], [ir.AttrTensor("value", ir.tensor(np.float32([1.5, 2.5])))], name="c0",
                    num_outputs=1)
    const.outputs[0].name = "c"
    m.ir.graph.append(const)
    return m


def _arrays(model: Model) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.to_proto().graph.initializer}


def _same_version(sent: Model, got: Model) -> None:
    """The same graph (nodes without metadata, as the worker gets them) and the same initializer values."""
    a, b = to_proto_without(sent.ir, [], node_metadata=False), got.to_proto()
    for part in ("node", "input", "output", "value_info", "quantization_annotation"):
        assert list(getattr(a.graph, part)) == list(getattr(b.graph, part)), part
    want, have = _arrays(sent), _arrays(got)
    assert want.keys() == have.keys()
    for name in want:
        assert want[name].dtype == have[name].dtype and want[name].shape == have[name].shape, name
        assert np.array_equal(want[name], have[name]), name


def _bytes(buffers) -> list[np.ndarray]:
    """The buffers as the worker receives them (its own memory)."""
    return [np.frombuffer(bytes(b), np.uint8).copy() for b in buffers]


def test_a_version_arrives_whole_when_every_tensor_is_sent() -> None:
    m = _rich()
    sender, receiver = VersionSender(), VersionReceiver({})
    message, buffers = sender.encode(m)
    got = receiver.decode(message, _bytes(buffers))
    _same_version(m, got)
    assert got.get_tensor_datatype("q").name == "INT4" and got.get_tensor_datatype("z").name == "UINT3"
    assert isinstance(got.graph.initializers["dw"].const_value, DepthwiseWeight)
    assert got.get_initializer("scalar").shape == ()
    assert "finnlite.note" not in got.ir.graph.node("mt0").metadata_props  # nodes travel without metadata


def test_tensors_travel_once_and_keep_their_identity() -> None:
    m = _rich()
    sender = VersionSender()
    receiver = VersionReceiver(sender.register(m))  # what a forked worker inherits
    message, buffers = sender.encode(m)
    assert message[1] == [] and buffers == []  # nothing new: the worker holds every tensor
    first = receiver.decode(message, [])
    for name, v in m.graph.initializers.items():
        assert first.graph.initializers[name].const_value is v.const_value
    # one weight replaced, the writable one edited in place: those two travel, as new tensors
    m.set_initializer("two", np.float32(4.0))
    m.graph.initializers["writable"].const_value.numpy()[0, 0] = 7.0
    message, buffers = sender.encode(m)
    assert sorted(d[2] for d in message[1]) == ["two", "writable"]
    second = receiver.decode(message, _bytes(buffers))
    _same_version(m, second)
    kept = [n for n in m.graph.initializers if n not in ("two", "writable")]
    assert all(second.graph.initializers[n].const_value is first.graph.initializers[n].const_value for n in kept)
    assert second.get_initializer("writable")[0, 0] == 7.0
    # a tensor attribute is rebuilt each time, but equal contents keep one object (fingerprints go by identity)
    assert second.ir.graph.node("c0").attributes["value"].value is first.ir.graph.node("c0").attributes["value"].value
    # the writable one unchanged: not sent again
    message, _ = sender.encode(m)
    assert message[1] == []


def _echo(request, buffers):
    kind = request[0]
    if kind == "fail":
        raise ValueError("bad request")
    if kind == "unpicklable":
        class Local(Exception):
            pass
        raise Local("cannot travel")
    if kind == "die":
        os._exit(3)
    if kind == "log":
        logging.getLogger("finnlite.test_worker").warning("from the worker: %s", request[1])
    return ("ok", request, [int(b.sum()) for b in buffers])


def test_the_worker_answers_in_order_and_carries_errors_back(caplog: pytest.LogCaptureFixture) -> None:
    w = Worker(_echo)
    data = np.arange(10, dtype=np.uint8)
    w.send(("a",), [memoryview(data)])
    w.send(("fail",))
    w.send(("unpicklable",))
    with caplog.at_level(logging.WARNING, logger="finnlite.test_worker"):
        w.send(("log", 42))
        replies = w.replies(block=True)
        for _, logs in replies:
            from verify.worker import replay_logs
            replay_logs(logs)
    assert replies[0][0] == ("ok", ("a",), [45])
    kind, exc = replies[1][0]
    assert kind == "error" and isinstance(exc, ValueError) and "bad request" in str(exc)
    kind, exc = replies[2][0]
    assert kind == "error" and isinstance(exc, RemoteError) and "cannot travel" in str(exc)
    assert "from the worker: 42" in caplog.text
    assert isinstance(w.stop(), int)
    with pytest.raises(RemoteError, match="stopped"):
        w.send(("a",))


def test_a_dead_worker_is_reported_not_waited_for() -> None:
    w = Worker(_echo)
    w.send(("die",))
    with pytest.raises(RemoteError, match="died .*exit status 3"):
        w.replies(block=True)


def test_a_dropped_worker_is_killed() -> None:
    w = Worker(_echo)
    pid = w.pid
    del w
    gc.collect()
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)
    pytest.fail(f"the worker {pid} outlived its owner")


# -- the hook with a worker process ----------------------------------------------------------------------------------
def test_without_a_worker_process_the_checks_run_on_a_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    import verify.hook

    monkeypatch.setattr(verify.hook, "process_supported", lambda: False)
    model = add_relu()
    hook = VerificationHook(ReferenceData.random(model, n=2))
    assert not hook.in_process
    from tests.verify.test_hook import CommuteAdd
    PassManager([Stage("s", [CommuteAdd])], [hook]).run(model)
    assert hook.verifier is not None and len(hook.records) == 1


def test_the_worker_process_checks_and_reports_its_memory() -> None:
    from tests.verify.test_hook import CommuteAdd, RenameNodes

    model = add_relu()
    hook = VerificationHook(ReferenceData.random(model, n=2), background="process")
    PassManager([Stage("s", [CommuteAdd, RenameNodes])], [hook]).run(model)
    assert hook.in_process and hook.verifier is None  # the cache is in the worker
    assert [r.label for r in hook.records] == ["pass 'CommuteAdd'", "pass 'RenameNodes'"]
    hook.close()
    assert isinstance(hook.worker_memory, int) and hook.worker_memory >= 0


def test_a_stage_whose_passes_cannot_travel_still_fails_naming_the_stage(caplog: pytest.LogCaptureFixture) -> None:
    from tests.verify.test_wrong_rewrites import AddSelf

    class Local(Transformation):  # defined here: it does not pickle
        def apply(self, model):
            return False

    model = add_relu()
    hook = VerificationHook(ReferenceData.random(model, n=2), background="process", granularity="stage")
    with caplog.at_level(logging.WARNING), pytest.raises(PassVerificationError, match=r"stage 'bad'") as info:
        PassManager([Stage("bad", [Local, AddSelf])], [hook]).run(model)
    assert info.value.pass_name == "bad"
    assert "cannot be sent to the verification worker" in caplog.text
    hook.close()


def test_an_interrupt_ends_the_worker_at_once() -> None:
    from tests.verify.test_hook import CommuteAdd

    class Interrupt(Transformation):
        def apply(self, model):
            raise KeyboardInterrupt

    model = add_relu()
    hook = VerificationHook(ReferenceData.random(model, n=2), background="process")
    with pytest.raises(KeyboardInterrupt):
        PassManager([Stage("s", [CommuteAdd, Interrupt])], [hook]).run(model)
    assert hook._worker is None


def test_a_graph_with_a_subgraph_travels_as_a_proto() -> None:
    from onnx import TensorProto, helper

    from finnlite.compat import make_model

    def branch(name: str, value: float):
        out = helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [2])
        node = helper.make_node("Constant", [], [f"{name}_y"], value=numpy_helper.from_array(np.float32([value] * 2)))
        return helper.make_graph([node], name, [], [out])

    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], name="if0", then_branch=branch("then", 1.0),
                          else_branch=branch("else", 2.0))],
        "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.arange(4, dtype=np.float32), "w")])
    m = Model(make_model(graph, opset=13, custom_opset=None))
    sender = VersionSender()
    receiver = VersionReceiver(sender.register(m))
    message, buffers = sender.encode(m)
    assert message[0][0] == "proto" and buffers == []
    got = receiver.decode(message, [])
    assert got.graph.initializers["w"].const_value is m.graph.initializers["w"].const_value
    _same_version(m, got)


def test_the_check_libraries_are_imported_before_the_worker_is_forked():
    """A worker forked from a process that has not run the executor would import onnxruntime and the executor at
    each start (about 60 ms per pipeline run): the hook imports them in the parent first. Run in a fresh
    interpreter, where nothing has imported them yet."""
    import subprocess
    import sys
    from pathlib import Path

    script = (
        "import sys\n"
        "from tests.verify.graphs import add_relu\n"
        "from verify import ReferenceData, VerificationHook\n"
        "model = add_relu()\n"
        "before = 'onnxruntime' in sys.modules or 'custom_ops.executor' in sys.modules\n"
        "hook = VerificationHook(ReferenceData.random(model, n=2), background='process')\n"
        "hook.start(model)\n"
        "after = 'onnxruntime' in sys.modules and 'custom_ops.executor' in sys.modules\n"
        "forked = not hook.in_process or hook._worker is not None\n"
        "hook.close()\n"
        "print(before, after, forked)\n")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "True"]


def test_a_stopped_worker_is_reaped_in_the_background() -> None:
    w = Worker(_echo)
    pid = w.pid
    assert isinstance(w.stop(), int)  # returns once the child said it leaves, not after its exit
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)  # succeeds while the child runs or is a zombie nobody reaped
        except ProcessLookupError:
            return
        time.sleep(0.01)
    pytest.fail(f"worker {pid} was not reaped")


@pytest.mark.parametrize("growth, releases", [(1, 3), (0, 0)])
def test_the_worker_gives_memory_back_once_it_grew(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
                                                  growth: int, releases: int) -> None:
    """After its set-up and after each check the worker gives memory back if its anonymous memory grew by
    RELEASE_BYTES since it last did (here: by that much at every look, or never)."""
    import itertools

    import verify.hook
    from tests.verify.test_hook import CommuteAdd, RenameNodes

    released = logging.getLogger("finnlite.test_worker.release")
    # inherited by the fork; the log comes back from the worker with its pid
    monkeypatch.setattr(verify.hook, "release_memory", lambda: released.warning("released in %d", os.getpid()))
    looks = itertools.count()
    monkeypatch.setattr(verify.hook, "anonymous_memory", lambda: next(looks) * growth * verify.hook.RELEASE_BYTES)
    model = add_relu()
    hook = VerificationHook(ReferenceData.random(model, n=2), background="process", coalesce=False)
    with caplog.at_level(logging.WARNING, logger="finnlite.test_worker.release"):
        PassManager([Stage("s", [CommuteAdd, RenameNodes])], [hook]).run(model)
        hook.wait()
    assert len(hook.records) == 2
    in_worker = [r for r in caplog.messages if r.startswith("released in") and r != f"released in {os.getpid()}"]
    assert len(in_worker) == releases  # after the set-up and after each check, or never
    hook.close()


def test_this_process_drops_the_precomputed_values_the_worker_took() -> None:
    from tests.verify.test_hook import CommuteAdd

    model = add_relu()
    reference = ReferenceData.random(model, n=2)
    reference.precompute(values=2, spill=False)
    assert len(reference._values) == 2
    hook = VerificationHook(reference, background="process")
    PassManager([Stage("s", [CommuteAdd])], [hook]).run(model)
    assert reference._values == {}  # forgotten here once the worker was forked with them
    assert [r.label for r in hook.records] == ["pass 'CommuteAdd'"]  # the worker checked against them
    hook.close()
    assert sorted(reference.values(0)) == sorted(reference.values(1))  # asked again: computed again
