"""The report: its data (the notebook API), its self-contained HTML with both graph pictures, and the layout."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from finnlite import Model, VerificationError
from finnlite.build import streamline
from finnlite.core.compat import QONNX_DOMAIN, make_model
from finnlite.config import Config
from finnlite.examples import build_tfc
from finnlite.graphpic import BOX_W, LANE_W, GraphPicture
from finnlite.report import StreamlineReport
from tests.surfaces.conftest import HERE

SVG_NS = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def report() -> StreamlineReport:
    return streamline(Model(build_tfc()), verify="each")


def _svgs(html: str, cls: str = "fl-graph") -> list[ET.Element]:
    """The SVG elements of class ``cls`` in ``html`` (the two graph pictures by default)."""
    found = [ET.fromstring(s) for s in re.findall(r"<svg\b.*?</svg>", html, re.S)]  # well-formed XML, or this raises
    return [s for s in found if s.get("class") == cls]


def _classes(el: ET.Element) -> list[str]:
    return (el.get("class") or "").split()


def _node_groups(svg: ET.Element) -> list[ET.Element]:
    return [g for g in svg.iter(f"{SVG_NS}g") if "fl-node" in _classes(g)]


def _box_titles(svg: ET.Element) -> list[str]:
    return [g.findall(f"{SVG_NS}text")[0].text for g in _node_groups(svg)]


def test_the_data(report: StreamlineReport) -> None:
    assert report.ok and report.completed and report.error is None
    assert report.ops_before["Quant"] == 8 and report.ops_after["MultiThreshold"] == 4
    assert report.stages == ["tidy", "convert", "streamline", "lower", "restreamline", "finalize"]
    assert set(report.stage_seconds) == set(report.stages)
    timed = {(p.stage, p.name) for p in report.passes}
    assert ("streamline", "MaterializeThresholds") in timed and ("tidy", "GemmToMatMul") in timed
    assert all(p.runs >= 1 and p.seconds >= 0 for p in report.passes)
    v = report.verification
    assert v.mode == "each" and v.ok and v.samples == 8 and v.final.ok
    # every pass that changed the model is covered by a check (the lower stage is checked as a whole; passes
    # checked together while the checks ran behind share one row)
    covered = {(c.stage, n) for c in v.checks for n in c.pass_name.split(", ")}
    changers = {(p.stage, p.name) for p in report.passes if p.changed and p.stage != "lower"}
    assert changers and changers <= covered and ("lower", "lower") in covered
    assert all(c.ok and c.policy for c in v.checks)
    assert report.float_nodes.integer_only
    assert report.cost_before.total_macs == report.cost_after.total_macs == 6236
    assert report.datatypes["weights"]["INT2"] == 4
    data = json.loads(report.to_json())
    assert data["verification"]["checks"][0]["pass_name"] == v.checks[0].pass_name
    assert "svg_before" not in data and report.to_dict(pictures=True)["svg_after"].startswith("<svg")


def test_the_html_is_self_contained_with_both_pictures(report: StreamlineReport, tmp_path: Path) -> None:
    path = tmp_path / "r.html"
    report.save_html(path)
    html = path.read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    external = r"<link|<img|<iframe|@import|\bsrc=|href=['\"]?(https?:|//)|url\((?!#)|fetch\(|XMLHttpRequest|import\("
    assert not re.search(external, html, re.I)  # url(#id): the arrow marker; the one script is inline
    assert html.count("<script>") == 1 and "<script " not in html
    before, after = _svgs(html)
    titles_before, titles_after = _box_titles(before), _box_titles(after)
    assert titles_before.count("Quant") == 8 and titles_before.count("Gemm") == 4
    assert titles_after.count("MultiThreshold") == 4 and "Quant" not in titles_after
    assert len(titles_after) == sum(report.ops_after.values())
    assert len(before.findall(f".//{SVG_NS}path")) >= 18  # edges (and the arrow marker)
    # op histogram, timings, verification per pass
    assert "<h2>Op histogram</h2>" in html and re.search(r"<td>Quant</td><td class='n'>8</td><td class='n'>0</td>",
                                                         html)
    assert "<h2>Passes</h2>" in html and "<td>MaterializeThresholds</td>" in html
    assert "Per-pass checks" in html and html.count("<td>ok</td>") == len(report.verification.checks)
    assert "Final check against the original" in html and "verified</span>" in html
    assert report._repr_html_() == report.html_fragment() and report.html_fragment() in html


def test_a_failing_run_reports_the_pass(tmp_path: Path) -> None:
    (tmp_path / "bad_rules.py").write_text((HERE / "bad_rules.py").read_text(encoding="utf-8"), encoding="utf-8")
    cfg = Config.from_dict({"passes": [{"pass": "bad_rules:ShiftThresholds", "stage": "streamline"}]},
                           base_dir=tmp_path)
    rep = streamline(Model(build_tfc()), cfg, verify="each", heal=False)
    assert not rep.ok and not rep.completed
    f = rep.verification.failure
    assert f["pass"] == "ShiftThresholds" and f["stage"] == "streamline" and f["tensor"]
    assert Path(f["before_path"]).is_file() and Path(f["after_path"]).is_file()
    assert rep.verification.checks[-1].ok is False
    html = rep.to_html()
    assert "verification FAILED" in html and "<b>ShiftThresholds</b> failed" in html and "fl-fail" in html
    assert len(_svgs(html)) == 2
    with pytest.raises(VerificationError, match="pass 'ShiftThresholds'"):
        rep.raise_for_errors()


@pytest.mark.declines
def test_declined_rewrites_are_reported(tmp_path: Path) -> None:
    """Healing (the default): the wrong rule's rewrites are declined, the report lists them (text, JSON, HTML) and
    the result verifies."""
    (tmp_path / "bad_rules.py").write_text((HERE / "bad_rules.py").read_text(encoding="utf-8"), encoding="utf-8")
    cfg = Config.from_dict({"passes": [{"pass": "bad_rules:ShiftOneThreshold", "stage": "streamline"}]},
                           base_dir=tmp_path)
    rep = streamline(Model(build_tfc()), cfg, verify="each")
    assert rep.ok and rep.completed and rep.verification.final.ok
    declined = rep.verification.declined
    assert len(declined) == 1 and declined[0].pass_name == "ShiftOneThreshold" and declined[0].tensor
    assert "1 rewrite(s) declined by verification" in rep.text() and declined[0].describe() in rep.text()
    data = rep.to_dict()
    assert data["verification"]["declined_rewrites"][0]["anchor"] == declined[0].anchor
    assert data["strict_failures"] == [f"rewrite declined by verification: {declined[0].describe()}"]
    html = rep.to_html()
    assert "Rewrites declined by verification (1)" in html and "1 rewrite(s) declined</span>" in html


def test_a_wrong_hidden_layer_fails_the_final_check(tmp_path: Path) -> None:
    """A bug behind the float first layer is an error, whatever near-ties that first layer meets."""
    (tmp_path / "bad_rules.py").write_text((HERE / "bad_rules.py").read_text(encoding="utf-8"), encoding="utf-8")
    cfg = Config.from_dict({"passes": [{"pass": "bad_rules:AbsThresholds", "stage": "finalize"}]}, base_dir=tmp_path)
    rep = streamline(Model(build_tfc()), cfg, verify="final")
    assert rep.completed and not rep.ok, rep.verification.text()
    assert rep.verification.failure["during"] == "final" and rep.verification.final.outputs[0].error_samples


def _big_graph(blocks: int = 30) -> Model:
    """A graph of about 150 nodes: residual blocks (a skip edge over three layers) with weight quantizers."""
    nodes, inits = [], []
    x = "x"
    for i in range(blocks):
        w = f"w{i}"
        inits += [numpy_helper.from_array(np.eye(8, dtype=np.float32), w),
                  numpy_helper.from_array(np.float32(0.5), f"s{i}"), numpy_helper.from_array(np.float32(0), f"z{i}"),
                  numpy_helper.from_array(np.float32(4), f"b{i}")]
        nodes += [helper.make_node("Quant", [w, f"s{i}", f"z{i}", f"b{i}"], [f"wq{i}"], f"wquant{i}",
                                   domain=QONNX_DOMAIN, signed=1, narrow=0, rounding_mode="ROUND"),
                  helper.make_node("MatMul", [x, f"wq{i}"], [f"m{i}"], f"matmul{i}"),
                  helper.make_node("Relu", [f"m{i}"], [f"r{i}"], f"relu{i}"),
                  helper.make_node("Mul", [f"r{i}", f"s{i}"], [f"p{i}"], f"mul{i}"),
                  helper.make_node("Add", [f"p{i}", x], [f"y{i}"], f"add{i}")]
        x = f"y{i}"
    graph = helper.make_graph(nodes, "residual", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 8])], initializer=inits)
    return Model(make_model(graph))


def test_the_layout_of_a_150_node_graph_is_readable() -> None:
    model = _big_graph()
    assert len(model) == 150
    pic = GraphPicture.of(model)
    lay = pic.layout()
    svg = pic.svg()
    ET.fromstring(svg)
    boxes = {b.key for b in pic.boxes}
    width = {k: (BOX_W if k in boxes else LANE_W) for k in lay.centers}
    rows: dict[float, list[tuple[float, float]]] = {}
    for k, (cx, top) in lay.centers.items():
        rows.setdefault(top, []).append((cx - width[k] / 2, cx + width[k] / 2))
    for spans in rows.values():  # nothing overlaps within a layer (boxes and edge lanes)
        spans.sort()
        assert all(a[1] < b[0] for a, b in zip(spans, spans[1:])), spans
    for a, b in pic.edges:  # every edge points down
        assert lay.centers[a][1] < lay.centers[b][1]
    # the main chain stays in one column: the graph is at most three boxes wide
    assert lay.right < 3 * (BOX_W + 20) + 40
    # each skip edge runs through a lane (one dummy per layer it crosses), not behind the boxes it passes
    skips = [(a, b) for a, b in pic.edges if lay.centers[b][1] - lay.centers[a][1] > 100]
    assert len(skips) == 30 and all(len(lay.lanes[e]) >= 2 for e in skips)
    # a weight quantizer sits beside the data node of its layer, right above its MatMul
    quant = next(b.key for b in pic.boxes if b.title == "Quant")
    matmul = next(b for a, b in pic.edges if a == quant)
    assert lay.centers[matmul][1] - lay.centers[quant][1] < 100


def test_a_cyclic_graph_still_draws() -> None:
    pic = GraphPicture.of(Model(build_tfc()))
    first, last = pic.boxes[1].key, pic.boxes[-2].key
    pic.edges.append((last, first))  # a back edge, as a broken rewrite might leave
    ET.fromstring(pic.svg())


def test_the_per_pass_checks_are_counted() -> None:
    from finnlite.report import CheckRow, VerificationResult

    result = VerificationResult("each", checks=[CheckRow("A", "s", None, "equality", 2, 2, 0, 0.01),
                                                CheckRow("C", "s", 1, "equality", 1, 1, 1, 0.01)])
    assert "2 per-pass checks passed, 1 float32 near-tie(s) accepted" in result.text()
    alone = VerificationResult("each", checks=[CheckRow("C", "s", 1, "equality", 1, 1, 0, 0.01)])
    assert "1 per-pass checks passed, 0 float32" in alone.text()


# -- the report at scale: legend, colours by datatype, ringed nodes, zoom, passes, bit widths ----------------------
def _graph_nodes(svg: ET.Element) -> dict[str, list[str]]:
    """node name -> the classes of its group."""
    return {g.get("data-name"): _classes(g) for g in _node_groups(svg)}


def test_the_report_legend_rings_and_zoomable_view_box() -> None:
    from finnlite.graphpic import KINDS, MARKS
    from tests.surfaces.conftest import float_input_model

    rep = streamline(Model(float_input_model()))
    html = rep.to_html()
    legend, = _svgs(html, "fl-legend")
    texts = [t.text for t in legend.iter(f"{SVG_NS}text")]
    for _, _, label in [*KINDS.values(), *MARKS.values()]:
        assert any(t.startswith(label) for t in texts), label
    assert any(t.startswith(MARKS["first-layer"][2]) and t.endswith("(1 after)") for t in texts)
    before, after = _svgs(html)
    for svg in (before, after):  # a zoomable viewBox: the whole picture, at its natural size
        box = [float(v) for v in svg.get("viewBox").split()]
        assert box == [0, 0, float(svg.get("width")), float(svg.get("height"))] and box[3] > 0
    nodes = _graph_nodes(after)
    # the first layer reads the float input: float, ringed (with a ring that keeps its width when zoomed out)
    assert {"fl-float", "fl-hl", "fl-mark-first-layer"} <= set(nodes["fc1"])
    ring = next(g for g in _node_groups(after) if g.get("data-name") == "fc1").find(f"{SVG_NS}rect")
    assert ring.get("class") == "fl-ring" and ring.get("vector-effect") == "non-scaling-stroke"
    # colours follow the datatypes, not the op type: the thresholds and the second MatMul compute integers,
    # the output Mul (the dequantization, allowed) is float, dashed, not ringed
    assert "fl-int" in nodes[next(n for n in nodes if "MultiThreshold" in n or n.startswith("act"))]
    assert "fl-int" in nodes["fc2"]
    mul = next(n for n, c in nodes.items() if "fl-mark-dequant" in c)
    assert "fl-float" in nodes[mul] and "fl-hl" not in nodes[mul]
    assert sum("fl-hl" in c for c in nodes.values()) == 1
    # before: a quantizer's output is a scaled integer, a weight quantizer a constant
    before_nodes = _graph_nodes(before)
    assert "fl-scaled" in before_nodes["act_quant"] and "fl-const" in before_nodes["w1_quant"]
    assert not any("fl-hl" in c for c in before_nodes.values())
    # the zoom: a pane per picture, the inline script that moves the viewBox, a button through the ringed nodes
    assert html.count("class='fl-zoom'") == 2 and "setAttribute('viewBox'" in html
    assert "next ringed node (1)" in html


def test_a_failing_node_is_ringed_black(tmp_path: Path) -> None:
    (tmp_path / "bad_rules.py").write_text((HERE / "bad_rules.py").read_text(encoding="utf-8"), encoding="utf-8")
    cfg = Config.from_dict({"passes": [{"pass": "bad_rules:ShiftThresholds", "stage": "streamline"}]},
                           base_dir=tmp_path)
    rep = streamline(Model(build_tfc()), cfg, verify="each", heal=False)
    failing = rep.verification.failure["node"]
    _, after = _svgs(rep.to_html())
    assert failing and {"fl-mark-failing", "fl-hl"} <= set(_graph_nodes(after)[failing])


def test_the_passes_that_changed_come_first_and_the_bit_widths_are_drawn(report: StreamlineReport) -> None:
    html = report.to_html()
    changed = html.index("class='fl-changed'")
    idle = html.index("<details class='fl-idle'>")
    assert changed < idle
    table = html[changed:idle]
    assert all(f"<td>{p.name}</td>" in table for p in report.passes if p.changed)
    assert f"{sum(1 for p in report.passes if not p.changed)} pass(es) changed nothing" in html
    chart, = _svgs(html, "fl-chart")
    bars = [r for r in chart.iter(f"{SVG_NS}rect") if r.get("class") == "fl-chart-bar"]
    assert len(bars) == 4 * len(report.cost_after.layers)  # weight, input, accumulator, output of each layer
    tips = [r.find(f"{SVG_NS}title").text for r in bars]
    first = report.cost_after.layers[0]
    assert any(t.startswith(f"{first.node}: accumulator {int(first.acc_dt[3:])}") for t in tips)
