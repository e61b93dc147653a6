"""FINN's next step on a finnlite output, run by the side environment's python (``tests/finn/setup_env.sh``).

``python handoff.py convert MODEL.onnx... --out DIR`` loads each streamlined model (finnlite's output) as a qonnx
``ModelWrapper`` and runs FINN's own build steps on it with a default ``DataflowBuildConfig``:
``step_convert_to_hw`` (the node-by-node conversion to HW layers), ``step_minimize_bit_width_initial`` (which
FINN runs next), then ``step_create_dataflow_partition`` (its unsupported-layers analysis, then the
partitioning). It prints one JSON object, ``{model file stem: result}``, each result being:

* ``software``: every node not converted to a HW layer (``{name, op_type, where}``), ``where`` being ``head``
  (no HW layer before it), ``tail`` (none after it), ``interior`` (HW layers on both sides) or ``alone`` (none
  at all);
* ``hw``: the HW layers by op type;
* ``float_hw``: the HW layers with a FLOAT32 input or output (those ``step_create_dataflow_partition`` warns of),
  each with its ``side`` (``input``: only layout ops before it; ``output``: only layout ops and Mul/Add after it;
  ``interior``);
* ``unsupported_layers``: FINN's analysis (``ok``; ``node``, the node it names when a software node splits the
  accelerator);
* ``partitions``: the number of ``StreamingDataflowPartition`` nodes FINN's ``CreateDataflowPartition`` makes
  (None when it fails: ``partition_error``);
* ``step_error``: what ``step_create_dataflow_partition`` raises (None when it passes);
* ``convert_error``: what ``step_convert_to_hw`` raises (the rest is then absent).

With ``--infer-upsample``, FINN's ``InferUpsample`` runs first (see :func:`convert`).

``python handoff.py build FOLDER... --out DIR`` runs the Python block of the README's section "In a FINN build" as
it is, in each FOLDER (holding the example's ``model_qonnx.onnx`` and ``input.npy``): FINN's
``build_dataflow_cfg`` with ``finnlite.build.step_streamline`` as the custom step, then FINN's steps up to
``step_create_dataflow_partition``. Its result: ``status`` (``build_dataflow_cfg``'s return), ``software``,
``hw``, ``float_hw`` of the build's ``step_convert_to_hw.onnx``, and the node count and software nodes of the
dataflow partition.

Neither step needs Vivado, but finn-plus 1.6.1's ``finn.builder.build_dataflow_steps`` imports
``finn.xsi.SimEngine`` (the RTL simulator, which needs ``XILINX_VIVADO``) when it is imported; where that is not
available a placeholder that raises on use stands in for it (nothing in these steps uses it).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # the checkout this file belongs to, not whatever finnlite the venv has installed
    sys.path.insert(0, str(REPO))

HW_DOMAIN = "finn.custom_op.fpgadataflow"


class _NoSimEngine:
    """Stands in for ``finn.xsi.SimEngine`` when Vivado's simulator is absent; any use raises."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("RTL simulation (finn.xsi) needs Vivado (XILINX_VIVADO), absent here")


def prepare_finn() -> None:
    """FINN's settings (``initialize_dummy_settings``) and the ``finn.xsi.SimEngine`` placeholder (module
    docstring), before ``finn.builder`` is imported."""
    from finn.util.settings import initialize_dummy_settings

    initialize_dummy_settings()
    import finn.xsi

    if "SimEngine" not in vars(finn.xsi):
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                available = finn.xsi.is_available()
        except Exception:  # noqa: BLE001 - no XILINX_VIVADO, no xsi.so: the simulator is not available
            available = False
        if not available:
            finn.xsi.SimEngine = _NoSimEngine


def _message(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def _config(out: Path, **extra: Any) -> Any:
    from finn.builder.build_dataflow_config import DataflowBuildConfig

    return DataflowBuildConfig(output_dir=str(out), synth_clk_period_ns=10.0, fpga_part="xc7z020clg400-1",
                               generate_outputs=[], **extra)


def _reached(node: Any, step: Any) -> Any:
    """Every node reached from ``node`` by ``step`` (``find_direct_predecessors`` or ``_successors``), once each."""
    seen, todo = set(), list(step(node) or [])
    while todo:
        n = todo.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        yield n
        todo.extend(step(n) or [])


def where(model: Any, node: Any) -> str:
    """``head``, ``tail``, ``interior`` or ``alone``: is there a HW layer upstream of ``node``, downstream, both?"""
    before = any(n.domain.startswith(HW_DOMAIN) for n in _reached(node, model.find_direct_predecessors))
    after = any(n.domain.startswith(HW_DOMAIN) for n in _reached(node, model.find_direct_successors))
    return {(False, True): "head", (True, False): "tail", (True, True): "interior"}.get((before, after), "alone")


LAYOUT_OPS = ("Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Shuffle")
TAIL_OPS = LAYOUT_OPS + ("Mul", "Add", "ElementwiseMul", "ElementwiseAdd")


def _only(model: Any, node: Any, step: Any, ops: tuple[str, ...]) -> bool:
    """True if every node reached from ``node`` by ``step`` (predecessors or successors) is one of ``ops``."""
    return all(n.op_type in ops for n in _reached(node, step))


def float_hw(model: Any) -> list[dict[str, Any]]:
    """The HW layers with a FLOAT32 input or output, as ``step_create_dataflow_partition`` warns of them, with
    ``side``: ``input`` (only layout ops between the graph input and it), ``output`` (only layout ops and Mul/Add
    after it) or ``interior``."""
    from finn.util.basic import getHWCustomOp
    from qonnx.core.datatype import DataType

    def dtypes(op: Any, get: Any, n: int) -> list[str | None]:
        out = []
        for i in range(n):
            try:
                out.append(get(i).name)
            except Exception:  # noqa: BLE001 - FINN: "some inputs currently do not have types assigned"
                out.append(None)
        return out

    rows = []
    for node in model.graph.node:
        if not node.domain.startswith(HW_DOMAIN):
            continue
        op = getHWCustomOp(node)
        ins = dtypes(op, op.get_input_datatype, len(node.input))
        outs = dtypes(op, op.get_output_datatype, len(node.output))
        flt = DataType["FLOAT32"].name
        if flt not in ins and flt not in outs:
            continue
        side = ("input" if _only(model, node, model.find_direct_predecessors, LAYOUT_OPS) else
                "output" if _only(model, node, model.find_direct_successors, TAIL_OPS) else "interior")
        rows.append({"name": node.name, "op_type": node.op_type, "float_in": flt in ins, "float_out": flt in outs,
                     "side": side})
    return rows


def describe(model: Any) -> dict[str, Any]:
    """The software nodes (with where they are), the HW layers by op type and the float HW layers of a converted
    model."""
    software = [{"name": n.name, "op_type": n.op_type, "where": where(model, n)}
                for n in model.graph.node if not n.domain.startswith(HW_DOMAIN)]
    hw = Counter(n.op_type for n in model.graph.node if n.domain.startswith(HW_DOMAIN))
    return {"software": software, "hw": dict(sorted(hw.items())), "float_hw": float_hw(model)}


def convert(path: Path, out: Path, infer_upsample: bool = False) -> dict[str, Any]:
    """FINN's ``step_convert_to_hw`` and ``step_create_dataflow_partition`` on ``path`` (module docstring); with
    ``infer_upsample``, FINN's ``InferUpsample`` first (finn-plus 1.6.1's step runs it only when the model has an
    ``Upsample`` node, not for ``Resize``)."""
    prepare_finn()
    from finn.analysis.fpgadataflow.unsupported_layers import unsupported_layers
    from finn.builder.build_dataflow_steps import (step_convert_to_hw, step_create_dataflow_partition,
                                                   step_minimize_bit_width_initial)
    from finn.transformation.fpgadataflow.create_dataflow_partition import CreateDataflowPartition
    from qonnx.core.modelwrapper import ModelWrapper

    out.mkdir(parents=True, exist_ok=True)
    cfg = _config(out)
    model = ModelWrapper(str(path))
    result: dict[str, Any] = {"model": str(path)}
    try:
        with contextlib.redirect_stdout(sys.stderr):  # FINN prints progress; stdout carries only the JSON
            if infer_upsample:
                from finn.transformation.fpgadataflow.convert_to_hw.upsample import InferUpsample

                model = model.transform(InferUpsample())
            model = step_convert_to_hw(model, cfg)
            model = step_minimize_bit_width_initial(model, cfg)
    except Exception as exc:  # noqa: BLE001 - FINN's refusal is the result
        result["convert_error"] = _message(exc)
        return result
    model.save(str(out / "converted.onnx"))
    result.update(describe(model))
    ok, node = model.analysis(unsupported_layers)
    result["unsupported_layers"] = {"ok": bool(ok), "node": None if node is None else
                                    {"name": node.name, "op_type": node.op_type}}
    try:
        parent = model.transform(CreateDataflowPartition(partition_model_dir=str(out / "partitions")))
        result["partitions"] = len(parent.get_nodes_by_op_type("StreamingDataflowPartition"))
        result["partition_error"] = None
    except Exception as exc:  # noqa: BLE001
        result["partitions"] = None
        result["partition_error"] = _message(exc)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            dataflow = step_create_dataflow_partition(ModelWrapper(str(out / "converted.onnx")), cfg)
        result["step_error"] = None
        result["dataflow_nodes"] = len(dataflow.graph.node)
    except Exception as exc:  # noqa: BLE001
        result["step_error"] = _message(exc)
    return result


def readme_example(readme: Path = REPO / "README.md") -> str:
    """The Python block of the README's section "In a FINN build"."""
    text = readme.read_text(encoding="utf-8")
    section = text.index("### In a FINN build")
    begin = text.index("```python\n", section) + len("```python\n")
    return text[begin:text.index("```", begin)]


def build(folder: Path, out: Path) -> dict[str, Any]:
    """The README's FINN example, run as it is in ``folder`` (which holds its ``model_qonnx.onnx`` and
    ``input.npy``); ``out`` is unused (the example names its output folder, ``build``)."""
    import os

    prepare_finn()
    # finn-plus 1.6.1's build_dataflow_cfg reads XILINX_VIVADO when it writes its metadata at the end (the tool
    # version): without Vivado it is set empty, as for the conversion no Vivado is needed
    os.environ.setdefault("XILINX_VIVADO", "")
    from qonnx.core.modelwrapper import ModelWrapper

    code = readme_example()
    namespace: dict[str, Any] = {"__name__": "readme_example"}
    cwd = Path.cwd()
    os.chdir(folder)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            exec(compile(code, str(REPO / "README.md"), "exec"), namespace)  # noqa: S102 - the README's example
    finally:
        os.chdir(cwd)
    out_dir = folder / str(namespace["cfg"].output_dir)
    result: dict[str, Any] = {"status": namespace.get("status"), "output_dir": str(out_dir)}
    models = out_dir / "intermediate_models"
    result["intermediate_models"] = sorted(p.name for p in models.glob("*.onnx")) if models.is_dir() else []
    converted = models / "step_convert_to_hw.onnx"
    if converted.is_file():
        result.update(describe(ModelWrapper(str(converted))))
    partition = models / "step_create_dataflow_partition.onnx"
    if partition.is_file():
        dataflow = ModelWrapper(str(partition))
        result["dataflow_nodes"] = len(dataflow.graph.node)
        result["dataflow_software"] = [n.op_type for n in dataflow.graph.node if not n.domain.startswith(HW_DOMAIN)]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("mode", choices=("convert", "build"))
    parser.add_argument("models", type=Path, nargs="+", help="models (convert) or folders (build)")
    parser.add_argument("--out", type=Path, required=True, help="working directory (FINN's output_dir is a "
                        "folder in it named after the model)")
    parser.add_argument("--infer-upsample", action="store_true", help="convert: FINN's InferUpsample first")
    args = parser.parse_args(argv)
    results = {}
    for path in args.models:
        if args.mode == "convert":
            results[path.stem] = convert(path, args.out / path.stem, args.infer_upsample)
        else:
            results[path.stem] = build(path, args.out / path.stem)
        print(f"handoff: {path.stem} done", file=sys.stderr, flush=True)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
