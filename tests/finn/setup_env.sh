#!/usr/bin/env bash
# The side environment for the FINN hand-off test (tests/finn/test_finn_handoff.py): finn-plus 1.6.1 with its
# pins (onnx 1.21.0, onnxruntime 1.25.1, protobuf 5.29.6, qonnx 1.0.0), in its own venv, beside finnlite's.
#
#   bash tests/finn/setup_env.sh [VENV]        # default VENV: /work/finnenv
#   FINNLITE_FINN_PYTHON=VENV/bin/python make test
#
# finn-plus is installed with --no-deps: its requirements pull brevitas (and with it a torch from the index) and
# cmake, which the conversion steps do not use. What importing finn.builder needs is installed here by name with
# finn-plus' own version bounds. torch is needed all the same (finn.custom_op.fpgadataflow imports LayerNorm,
# which imports torch): the CPU build, never a CUDA one. finnlite itself goes in with --no-deps (its
# dependencies are all among these, at versions it supports); handoff.py imports the checkout it sits in.
set -euo pipefail

VENV="${1:-/work/finnenv}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-python3}"

"$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --quiet)
"${PIP[@]}" --upgrade pip
"${PIP[@]}" --no-deps "finn-plus==1.6.1"
# finn-plus' pins and bounds (its METADATA), less brevitas, cmake and the test extras
"${PIP[@]}" "onnx==1.21.0" "onnxruntime==1.25.1" "protobuf==5.29.6" "qonnx==1.0.0" "numpy>=2.4.6,<2.5.0" \
    "bitstring>=4.3.1,<4.4.0" "click>=8.1.8,<9.0.0" "mashumaro[yaml]>=3.15,<4.0" "pyyaml>=6.0.2,<6.1.0" \
    "rich>=13.9.4,<14.0.0" "termcolor>=2.5.0,<3.0.0" "scipy>=1.17.0,<1.18.0" "pandas>=2.3.1,<2.4.0" \
    "scikit-learn>=1.7.2,<1.8.0" "matplotlib>=3.10.9,<3.11.0" "mip==1.17.0" "pybind11==3.0.1" \
    "onnx-ir>=0.1.15" "onnxscript>=0.7.0" "onnx-passes>=0.4.0" "onnxoptimizer>=0.4.2,<0.5.0" "pydantic>2.0" \
    jinja2 psutil networkx
# the CPU torch (finn.custom_op.fpgadataflow.layernorm imports it), from a local wheel only: PyPI's Linux torch
# pulls the CUDA libraries (GBs). TORCH_WHEELS: a folder with torch-2.13.0+cpu (default /opt/wheels; elsewhere,
# download it from PyTorch's CPU wheel index first)
"${PIP[@]}" filelock fsspec sympy typing_extensions setuptools
"${PIP[@]}" --no-deps --no-index --find-links "${TORCH_WHEELS:-/opt/wheels}" "torch==2.13.0"
"${PIP[@]}" --no-deps -e "$REPO"

# the pins held, and FINN's builder imports (with the stand-ins handoff.py uses)
"$VENV/bin/python" - <<'EOF'
import sys
from importlib.metadata import version

pins = {"onnx": "1.21.0", "onnxruntime": "1.25.1", "protobuf": "5.29.6", "qonnx": "1.0.0", "finn-plus": "1.6.1"}
wrong = {k: version(k) for k, v in pins.items() if version(k) != v}
if wrong:
    sys.exit(f"pins not held: {wrong}")
EOF
cd "$REPO" && "$VENV/bin/python" -c "
import tests.finn.handoff as h
h.prepare_finn()
import finn.builder.build_dataflow, finnlite.build
print('finn-plus side environment ready:', '$VENV/bin/python')"
