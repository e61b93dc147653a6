"""``finnlite streamline`` on the real Brevitas exports, as a user runs it: a valid model, the summary, and an HTML
report with both graph pictures. Reference inputs come from each model's input range in the zoo manifest."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import onnx
import pytest

from finnlite import Model
from tests.surfaces.conftest import run_cli
from tests.zoo import ZOO_MODELS, manifest, zoo_model_path

_SLOW = {"cnv_1w1a", "cnv_2w2a", "resnet18_4w4a_ts", "mobilenet_v1_4b"}


@pytest.mark.zoo
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in _SLOW else n
                                  for n in ZOO_MODELS])
def test_streamline_zoo_model(name: str, tmp_path: Path) -> None:
    path = zoo_model_path(name)
    lo, hi = manifest()[name]["input_range"]
    out, report = tmp_path / f"{name}.onnx", tmp_path / f"{name}.html"
    res = run_cli(["streamline", path, "-o", out, "--report", report, "--input-range", lo, hi])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "declined by verification" not in res.stdout, res.stdout  # no rewrite was undone to verify
    # a valid model: checker-clean, loadable, quantizers gone, every MAC layer integer
    onnx.checker.check_model(onnx.load(str(out)))
    model = Model(out)
    ops = model.op_histogram()
    assert not {"Quant", "BipolarQuant", "Trunc", "BatchNormalization", "Conv", "Gemm"} & set(ops), ops
    assert ops["MultiThreshold"] > 0
    # the summary
    text = res.stdout
    assert f"-> {out}" in text and "stages: tidy, convert, streamline, lower, restreamline, finalize" in text
    assert re.search(r"^  total\s+\d+\s+\d+$", text, re.M) and "float ops left:" in text
    assert "datatypes (weights):" in text and "time per stage:" in text
    assert f" in [{lo:g}, {hi:g}] (given)): OK" in text
    # the report: self-contained HTML with the two pictures, each a box per node
    html = report.read_text(encoding="utf-8")
    svgs = [s for s in re.findall(r"<svg\b.*?</svg>", html, re.S) if 'class="fl-graph"' in s]
    assert len(svgs) == 2
    nodes = [sum(1 for g in ET.fromstring(s).iter("{http://www.w3.org/2000/svg}g")
                 if "fl-node" in (g.get("class") or "").split()) for s in svgs]
    assert nodes == [manifest()[name]["nodes"], len(model)]
    assert "verified</span>" in html and "<h2>Passes</h2>" in html
