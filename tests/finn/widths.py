"""FINN's own widths for finnlite's outputs, run by the side environment's python (``tests/finn/setup_env.sh``).

``python widths.py MODEL.onnx... --out DIR`` runs FINN's ``step_convert_to_hw`` and
``step_minimize_bit_width_initial`` (MinimizeWeightBitWidth, MinimizeAccumulatorWidth) on each model and prints
one JSON object, ``{model file stem: [[op_type, inputDataType, weightDataType, accDataType, outputDataType], ...]}``,
one row per MVAU / VVAU in graph order (``{"error": ...}`` for a model FINN's steps reject).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from handoff import _config, _message, prepare_finn  # noqa: E402

_ATTRS = ("inputDataType", "weightDataType", "accDataType", "outputDataType")


def widths(path: Path, out: Path) -> list[list[str]] | dict[str, str]:
    from finn.builder.build_dataflow_steps import step_convert_to_hw, step_minimize_bit_width_initial
    from qonnx.core.modelwrapper import ModelWrapper
    from qonnx.custom_op.registry import getCustomOp

    cfg = _config(out / path.stem)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            model = step_convert_to_hw(ModelWrapper(str(path)), cfg)
            model = step_minimize_bit_width_initial(model, cfg)
    except Exception as exc:  # noqa: BLE001 - reported, the test says which model
        return {"error": _message(exc)}
    rows = []
    for node in model.graph.node:
        if node.op_type.startswith(("MVAU", "VVAU")):
            inst = getCustomOp(node)
            rows.append([node.op_type.split("_")[0], *(inst.get_nodeattr(a) for a in _ATTRS)])
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    prepare_finn()
    print(json.dumps({p.stem: widths(p, args.out) for p in args.models}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
