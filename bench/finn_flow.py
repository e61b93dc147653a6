"""FINN's own streamlining of a QONNX file, timed: run by the finn-plus side environment's python
(``tests/finn/setup_env.sh``; ``$FINNLITE_FINN_PYTHON``), never by finnlite's.

``python bench/finn_flow.py MODEL.onnx`` loads the model as a qonnx ``ModelWrapper`` and runs the three build
steps that ``finnlite.build.step_streamline`` replaces, with a default ``DataflowBuildConfig`` (no verification):
``step_qonnx_to_finn`` (qonnx cleanup, ``ConvertQONNXtoFINN``), ``step_tidy_up`` and ``step_streamline``. It prints
one JSON object: ``seconds`` (load and the three steps; the interpreter's start-up and FINN's imports are not
counted), ``nodes`` and the op histogram of the result.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main(path: str) -> dict:
    from tests.finn.handoff import prepare_finn

    prepare_finn()
    import finn.builder.build_dataflow_config as build_cfg
    from finn.builder.build_dataflow_steps import step_qonnx_to_finn, step_streamline, step_tidy_up
    from qonnx.core.modelwrapper import ModelWrapper

    cfg = build_cfg.DataflowBuildConfig(output_dir="/tmp/finnlite-bench-finn", synth_clk_period_ns=10.0,
                                        generate_outputs=[], verify_steps=[])
    t0 = time.perf_counter()
    model = ModelWrapper(path)
    for step in (step_qonnx_to_finn, step_tidy_up, step_streamline):
        model = step(model, cfg)
    seconds = time.perf_counter() - t0
    ops = Counter(n.op_type for n in model.graph.node)
    return {"seconds": seconds, "nodes": len(model.graph.node), "ops": dict(ops)}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
