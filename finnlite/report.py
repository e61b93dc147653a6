"""The streamlining report: what a run changed, what it cost, what stayed float, and how it verified.

:class:`StreamlineReport` holds the data (op histograms before and after, per-pass timings, per-pass verification
checks and the final check, the float nodes left, datatypes, inference cost, and a picture of the graph before and
after). :func:`finnlite.build.streamline` returns one; the CLI prints :meth:`StreamlineReport.text` or
:meth:`StreamlineReport.to_dict` (``--json``) and writes :meth:`StreamlineReport.to_html` (``--report``); in a
notebook the report displays itself.

The HTML is one self-contained file (inline CSS and SVG; no script, no external resource). The graph pictures are
drawn here, without graphviz: :class:`GraphPicture` records nodes and edges, assigns layers (longest path from the
graph inputs; constant-only nodes such as weight quantizers sit just above their consumer), places each node at
the mean position of its predecessors (pushed right where boxes would overlap, so a chain stays straight and side
inputs sit beside it), and draws boxes coloured by op family with curved edges. A node's tooltip names it and lists
its tensors with shapes and datatypes.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx

from finnlite.core.model import Model

__all__ = ["GraphPicture", "PassTiming", "CheckRow", "VerificationResult", "StreamlineReport", "pass_timings",
           "json_default"]


# -- graph pictures ------------------------------------------------------------------------------------------------
_BOX_W, _BOX_H, _GAP_X, _GAP_Y, _MARGIN, _LANE_W = 176, 38, 18, 30, 16, 8
_FAMILIES = {
    "quantizer": ({"Quant", "BipolarQuant", "Trunc", "MultiThreshold", "QuantAvgPool2d"}, "#fde2b8", "#c77c02"),
    "mac": ({"Conv", "MatMul", "Gemm", "XnorPopcountMatMul", "ConvTranspose"}, "#cfe3fb", "#2764a8"),
    "float": ({"Mul", "Add", "Sub", "Div", "BatchNormalization", "Relu", "Sigmoid", "Clip", "Round", "Sign",
               "Softmax", "Tanh", "HardTanh"}, "#f6d3d3", "#a83232"),
    "pool": ({"MaxPool", "MaxPoolNHWC", "AveragePool", "GlobalAveragePool", "TopK", "ArgMax"}, "#d6f0d2", "#2f7d32"),
    "move": ({"Reshape", "Flatten", "Transpose", "Im2Col", "Squeeze", "Unsqueeze", "Identity", "Slice", "Gather",
              "Concat", "Split", "Expand", "Pad"}, "#ececec", "#666666"),
}
_IO_FILL, _IO_STROKE = "#3b3b3b", "#3b3b3b"


def _family(op_type: str) -> tuple[str, str]:
    for ops, fill, stroke in _FAMILIES.values():
        if op_type in ops:
            return fill, stroke
    return "#fff7c2", "#8a7a00"


def _esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


@dataclass
class _Box:
    key: str
    title: str
    subtitle: str
    tooltip: str
    kind: str  # "node", "input", "output"
    op_type: str = ""


@dataclass
class GraphPicture:
    """The structure of a graph, captured for drawing: boxes (nodes, graph inputs and outputs) and edges."""

    boxes: list[_Box] = field(default_factory=list)
    edges: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def of(cls, model: Model) -> "GraphPicture":
        """Capture ``model``'s nodes and their wiring (cheap; drawing happens in :meth:`svg`)."""
        pic = cls()
        producer: dict[str, str] = {}
        for v in model.graph.inputs:
            key = f"in:{v.name}"
            pic.boxes.append(_Box(key, "input", _clip(v.name, 28), _tensor_line(model, v.name), "input"))
            producer[v.name] = key
        nodes = list(model.graph)
        for i, node in enumerate(nodes):
            for o in node.outputs:
                if o.name:
                    producer[o.name] = f"n{i}"
        for i, node in enumerate(nodes):
            key = f"n{i}"
            outs = [o.name for o in node.outputs if o.name]
            sub = (_tensor_brief(model, outs[0]) if outs else "") or node.name
            lines = [f"{node.op_type} '{node.name or '(unnamed)'}'"]
            lines += [f"in:  {_tensor_line(model, v.name)}" for v in node.inputs if v is not None and v.name]
            lines += [f"out: {_tensor_line(model, name)}" for name in outs]
            pic.boxes.append(_Box(key, node.op_type, sub, "\n".join(lines), "node", node.op_type))
            seen: set[str] = set()
            for v in node.inputs:
                src = producer.get(v.name) if v is not None and v.name else None
                if src is not None and src not in seen:
                    seen.add(src)
                    pic.edges.append((src, key))
        for v in model.graph.outputs:
            key = f"out:{v.name}"
            pic.boxes.append(_Box(key, "output", _clip(v.name, 28), _tensor_line(model, v.name), "output"))
            if v.name in producer:
                pic.edges.append((producer[v.name], key))
        return pic

    @property
    def node_count(self) -> int:
        return sum(1 for b in self.boxes if b.kind == "node")

    def layout(self) -> "_Layout":
        """Where every box goes, and the lanes of edges that span several layers (module docstring)."""
        g = nx.DiGraph()
        g.add_nodes_from(b.key for b in self.boxes)
        g.add_edges_from(self.edges)
        order = {b.key: i for i, b in enumerate(self.boxes)}
        try:
            topo = list(nx.lexicographical_topological_sort(g, key=lambda k: order[k]))
        except nx.NetworkXUnfeasible:  # a cyclic (broken) graph: draw it in file order
            topo = [b.key for b in self.boxes]
            g = nx.DiGraph()
            g.add_nodes_from(topo)
            g.add_edges_from((a, b) for a, b in self.edges if order[a] < order[b])
        data = {b.key for b in self.boxes if b.kind == "input"}
        for k in topo:
            if any(p in data for p in g.predecessors(k)):
                data.add(k)
        rank: dict[str, int] = {}
        for k in topo:
            if k in data:
                preds = [rank[p] for p in g.predecessors(k) if p in data]
                rank[k] = max(preds) + 1 if preds else 0
        for k in reversed(topo):  # constant-only nodes: just above their first consumer
            if k not in data:
                succ = [rank[s] for s in g.successors(k) if s in rank]
                rank[k] = min(succ) - 1 if succ else 0
        low = min(rank.values(), default=0)
        rank = {k: r - low for k, r in rank.items()}
        layers: dict[int, list[str]] = {}
        for k in topo:
            layers.setdefault(rank[k], []).append(k)
        # an edge spanning several layers runs through a lane (a dummy per layer in between) that boxes avoid
        lanes: dict[tuple[str, str], list[str]] = {}
        chain = nx.DiGraph()
        chain.add_nodes_from(topo)
        width = {k: float(_BOX_W) for k in topo}
        for a, b in dict.fromkeys(self.edges):
            if a not in rank or b not in rank or rank[b] - rank[a] <= 1:
                if a in rank and b in rank:
                    chain.add_edge(a, b)
                continue
            dummies = [f"~{len(lanes)}~{r}" for r in range(rank[a] + 1, rank[b])]
            lanes[(a, b)] = dummies
            for d, r in zip(dummies, range(rank[a] + 1, rank[b])):
                layers[r].append(d)
                width[d] = float(_LANE_W)
                if a in data:
                    data.add(d)
            nx.add_path(chain, [a, *dummies, b])
        x: dict[str, float] = {}
        for r in sorted(layers):  # downwards: follow the data
            want = {}
            for k in layers[r]:  # boxes on the data path decide, then lanes (a join stays under its main input),
                # then anything (a weight quantizer is moved beside its consumer later)
                placed = [p for p in chain.predecessors(k) if p in x]
                preds = [x[p] for p in placed if p in data and p in width and width[p] == _BOX_W] or \
                    [x[p] for p in placed if p in data] or [x[p] for p in placed]
                want[k] = sum(preds) / len(preds) if preds else None
            _place(layers[r], want, x, width)
        for r in sorted(layers, reverse=True):  # upwards: constant-only nodes next to their consumer
            if any(k not in data for k in layers[r]):
                want = {}
                for k in layers[r]:
                    succ = [x[s] for s in chain.successors(k) if s in x]
                    want[k] = x[k] if k in data or not succ else sum(succ) / len(succ)
                _place(layers[r], want, x, width)
        shift = _MARGIN - min((x[k] - width[k] / 2 for k in x), default=0.0)
        centers = {k: (x[k] + shift, _MARGIN + r * (_BOX_H + _GAP_Y)) for r, ks in layers.items() for k in ks}
        return _Layout(centers, lanes, max((c[0] + width[k] / 2 for k, c in centers.items()), default=0.0))

    def svg(self, uid: str = "g") -> str:
        """The picture as an inline SVG element; ``uid`` keeps its ids apart from other SVGs in the same page."""
        lay = self.layout()
        pos = lay.centers
        width = lay.right + _MARGIN
        height = max((p[1] for p in pos.values()), default=0) + _BOX_H + _MARGIN
        marker = f"{uid}-arrow"
        out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="fl-graph" width="{width:.0f}" height="{height:.0f}" '
               f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="Helvetica, Arial, sans-serif">',
               f'<defs><marker id="{marker}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
               'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#777"/></marker></defs>',
               '<g class="fl-edges" fill="none" stroke="#8a8a8a" stroke-width="1.2">']
        for a, b in dict.fromkeys(self.edges):
            if a not in pos or b not in pos:
                continue
            out.append(f'<path d="{_route(pos, a, b, lay.lanes.get((a, b), []))}" marker-end="url(#{marker})"/>')
        out.append("</g>")
        for box in self.boxes:
            if box.key not in pos:
                continue
            cx, top = pos[box.key]
            bx = cx - _BOX_W / 2
            if box.kind == "node":
                fill, stroke = _family(box.op_type)
                rx, color, sub_color = 4.0, "#111", "#444"
            else:
                fill, stroke, rx, color, sub_color = _IO_FILL, _IO_STROKE, _BOX_H / 2, "#fff", "#ddd"
            out.append(f'<g class="fl-{box.kind}"><title>{_esc(box.tooltip)}</title>'
                       f'<rect x="{bx:.1f}" y="{top:.1f}" width="{_BOX_W}" height="{_BOX_H}" rx="{rx:g}" '
                       f'fill="{fill}" stroke="{stroke}"/>'
                       f'<text x="{cx:.1f}" y="{top + 15:.1f}" text-anchor="middle" font-size="12" '
                       f'font-weight="bold" fill="{color}">{_esc(_clip(box.title, 24))}</text>'
                       f'<text x="{cx:.1f}" y="{top + 30:.1f}" text-anchor="middle" font-size="10" '
                       f'fill="{sub_color}">{_esc(_clip(box.subtitle, 30))}</text></g>')
        out.append("</svg>")
        return "".join(out)


@dataclass
class _Layout:
    """Box positions (centre x, top y) by key, dummies included; the lane (dummy keys) of each long edge."""

    centers: dict[str, tuple[float, float]]
    lanes: dict[tuple[str, str], list[str]]
    right: float


def _route(pos: dict[str, tuple[float, float]], a: str, b: str, lane: list[str]) -> str:
    """An SVG path from the bottom of box ``a`` to the top of box ``b``, straight down through each lane dummy and
    curved between layers; an edge that does not go down (a cyclic graph) loops around the right side."""
    (xa, ya), (xb, yb) = pos[a], pos[b]
    if yb <= ya:
        x1, y1, x2, y2 = xa + _BOX_W / 2, ya + _BOX_H / 2, xb + _BOX_W / 2, yb + _BOX_H / 2
        bend = _GAP_X + abs(y2 - y1) / 8
        return f"M{x1:.1f},{y1:.1f} C{x1 + bend:.1f},{y1:.1f} {x2 + bend:.1f},{y2:.1f} {x2:.1f},{y2:.1f}"
    points = [(xa, ya + _BOX_H)]
    for d in lane:
        xd, yd = pos[d]
        points += [(xd, yd), (xd, yd + _BOX_H)]
    points.append((xb, yb))
    parts = [f"M{points[0][0]:.1f},{points[0][1]:.1f}"]
    for i in range(1, len(points)):
        (x1, y1), (x2, y2) = points[i - 1], points[i]
        if i % 2 == 1:  # between layers: an S-curve
            c = max((y2 - y1) / 2, 8.0)
            parts.append(f"C{x1:.1f},{y1 + c:.1f} {x2:.1f},{y2 - c:.1f} {x2:.1f},{y2:.1f}")
        else:  # through a lane dummy: straight down
            parts.append(f"L{x2:.1f},{y2:.1f}")
    return " ".join(parts)


def _place(keys: list[str], want: dict[str, float | None], x: dict[str, float], width: dict[str, float]) -> None:
    """Set the centre ``x`` of ``keys`` (one layer): each at its wanted position where possible, in the order of
    the wishes, at least a gap apart; keys without a wish go right of everything placed so far."""
    free = max((x[k] + width[k] / 2 for k in x), default=0.0) + _GAP_X
    wished = []
    for i, k in enumerate(keys):
        w = want.get(k)
        if w is None:
            w = free + width[k] / 2
            free += width[k] + _GAP_X
        wished.append((w, i, k))
    wished.sort()
    edge = None
    for w, _, k in wished:
        pos = w if edge is None else max(w, edge + _GAP_X + width[k] / 2)
        x[k] = pos
        edge = pos + width[k] / 2


def _tensor_brief(model: Model, name: str) -> str:
    dt = model.get_tensor_datatype(name).name if model.has_tensor_datatype(name) else ""
    shape = _shape_text(model, name)
    return " ".join(x for x in (dt, shape) if x)


def _shape_text(model: Model, name: str) -> str:
    try:
        shape = model.get_tensor_shape(name)
    except Exception:  # noqa: BLE001 - a picture of a broken graph still draws
        return ""
    return "" if shape is None else "×".join("?" if d is None else str(d) for d in shape)


def _tensor_line(model: Model, name: str) -> str:
    extra = _tensor_brief(model, name)
    const = " (constant)" if model.is_initializer(name) else ""
    return f"{name}{' ' + extra if extra else ''}{const}"


# -- report data ---------------------------------------------------------------------------------------------------
@dataclass
class PassTiming:
    """Time spent in one pass of one stage, over all its runs (fixpoint rounds)."""

    stage: str
    name: str
    runs: int
    changed: int
    rewrites: int | None
    seconds: float


def pass_timings(records: list[Any]) -> list[PassTiming]:
    """Aggregate :class:`finnlite.core.passes.PassRecord` objects per (stage, pass), in first-run order."""
    rows: dict[tuple[str, str], PassTiming] = {}
    for r in records:
        row = rows.get((r.stage, r.name))
        if row is None:
            row = rows[(r.stage, r.name)] = PassTiming(r.stage, r.name, 0, 0, None, 0.0)
        row.runs += 1
        row.changed += int(bool(r.changed))
        row.seconds += r.seconds
        if r.rewrites is not None:
            row.rewrites = (row.rewrites or 0) + r.rewrites
    return list(rows.values())


@dataclass
class CheckRow:
    """One per-pass verification check (``mode: each``), or the failing one."""

    pass_name: str
    stage: str | None
    iteration: int | None
    policy: str
    changed_nodes: int | None
    region_nodes: int | None
    near_ties: int
    seconds: float
    ok: bool = True
    message: str = ""


@dataclass
class VerificationResult:
    """How the run was verified: the mode, the reference data, the per-pass checks, the failure (if any) and the
    final check against the original (``final`` is a :class:`verify.FinalCheck`). ``assumed``: the inputs whose
    range no quantizer, datatype or option gave, with the range assumed for them (the result is then verified on
    that range only); ``declined``: the rewrites verification undid (:class:`verify.heal.DeclinedRewrite`);
    ``notes``: what else the run did to verify (a restart)."""

    mode: str
    reference: str | None = None
    samples: int = 0
    checks: list[CheckRow] = field(default_factory=list)
    failure: dict[str, Any] | None = None
    final: Any = None
    seconds: float = 0.0
    assumed: dict[str, tuple[float, float]] = field(default_factory=dict)
    declined: list[Any] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        """``off``, ``failed``, ``verified`` or ``verified on an assumed input range [a, b]``."""
        if self.mode == "off":
            return "off"
        if not self.ok:
            return "failed"
        if self.assumed:
            ranges = sorted({(lo, hi) for lo, hi in self.assumed.values()})
            text = ", ".join(f"[{lo:g}, {hi:g}]" for lo, hi in ranges)
            return f"verified on an assumed input range {text}"
        return "verified"

    def assumed_hint(self) -> str:
        """What to give to be verified on the real input range (empty when nothing was assumed)."""
        if not self.assumed:
            return ""
        names = ", ".join(f"'{k}'" for k in self.assumed)
        return (f"no input quantizer or datatype gives the range of {names}: give the real range (--input-range LO "
                "HI), real inputs (--inputs X.npz) or the input preprocessing (--input-datatype, --input-scale, "
                "--mean, --std) to verify it on that")

    @property
    def ok(self) -> bool | None:
        """True/False when verification ran, None when it was off."""
        if self.mode == "off":
            return None
        return self.failure is None and (self.final is None or self.final.ok)

    def text(self) -> str:
        """A few lines for people."""
        if self.mode == "off":
            return "verification: off"
        head = f"verification ({self.mode}; {self.reference}): "
        if self.failure is not None:
            lines = [head + "FAILED", f"  {self.failure['message']}"]
        elif self.assumed and self.ok:
            lines = [head + "OK, " + self.status, f"  WARNING: {self.assumed_hint()}"]
        else:
            lines = [head + ("OK" if self.ok else "FAILED")]
        for note in self.notes:
            lines.append(f"  {note}")
        if self.declined:
            lines.append(f"  {len(self.declined)} rewrite(s) declined by verification (the model is correct without "
                         "them, and less streamlined):")
            lines += [f"    {d.describe()}" for d in self.declined]
        if self.mode == "each":
            ties = sum(c.near_ties for c in self.checks)
            lines.append(f"  {sum(1 for c in self.checks if c.ok)} per-pass checks passed, {ties} float32 "
                         "near-tie(s) accepted")
        if self.final is not None:
            lines += ["  " + line for line in self.final.summary().splitlines()]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        final = None
        if self.final is not None:
            final = {"ok": self.final.ok, "samples": self.final.samples,
                     "outputs": [{"name": o.name, "compared_as": o.compared_as, "samples": o.samples,
                                  "agree_float64": o.samples - len(o.error_samples), "agree_float32": o.agree32,
                                  "near_tie_samples": o.near_tie_samples, "error_samples": o.error_samples,
                                  "max_error64": o.max_error64, "unit": o.unit} for o in self.final.outputs],
                     "near_tie_sites": [s.describe() for s in self.final.tie_sites]}
        return {"mode": self.mode, "ok": self.ok, "status": self.status, "reference": self.reference,
                "samples": self.samples, "seconds": self.seconds,
                "assumed_input_ranges": {k: list(v) for k, v in self.assumed.items()},
                "declined_rewrites": [d.to_dict() for d in self.declined], "notes": list(self.notes),
                "checks": [vars(c) for c in self.checks], "failure": self.failure, "final": final}


@dataclass
class StreamlineReport:
    """Everything about one streamlining run (module docstring). ``model`` is the streamlined model (left at the
    failing pass when per-pass verification stopped the run); ``error`` the verification error, if any."""

    source: str | None
    stages: list[str]
    ops_before: dict[str, int]
    ops_after: dict[str, int]
    passes: list[PassTiming]
    stage_seconds: dict[str, float]
    verification: VerificationResult
    seconds: dict[str, float] = field(default_factory=dict)
    datatypes: dict[str, dict[str, int]] = field(default_factory=dict)
    float_nodes: Any = None
    cost_before: Any = None
    cost_after: Any = None
    picture_before: GraphPicture | None = None
    picture_after: GraphPicture | None = None
    model: Model | None = None
    error: Exception | None = None
    output: str | None = None

    @property
    def ok(self) -> bool:
        """False if verification failed."""
        return self.verification.ok is not False

    @property
    def completed(self) -> bool:
        """True if every stage ran (a failing per-pass check stops the run)."""
        return not (self.verification.failure and self.verification.failure.get("during") == "pipeline")

    def raise_for_errors(self) -> None:
        """Raise the verification error, if there was one."""
        if self.error is not None:
            raise self.error

    def strict_reasons(self) -> list[str]:
        """Why ``--strict`` rejects this result (empty if it does not): each rewrite verification declined."""
        return [f"rewrite declined by verification: {d.describe()}" for d in self.verification.declined]

    # -- text and JSON ---------------------------------------------------------------------------------------------
    def to_dict(self, *, pictures: bool = False) -> dict[str, Any]:
        """The report as JSON-compatible data; with ``pictures`` the two SVGs too."""
        data: dict[str, Any] = {
            "input": self.source, "output": self.output, "ok": self.ok, "stages": self.stages,
            "nodes_before": sum(self.ops_before.values()), "nodes_after": sum(self.ops_after.values()),
            "ops_before": self.ops_before, "ops_after": self.ops_after,
            "float_ops_left": None if self.float_nodes is None else self.float_nodes.to_dict(),
            "datatypes": self.datatypes,
            "cost_before": None if self.cost_before is None else self.cost_before.to_dict(),
            "cost_after": None if self.cost_after is None else self.cost_after.to_dict(),
            "seconds": {**self.seconds, "stages": self.stage_seconds},
            "passes": [vars(p) for p in self.passes],
            "verification": self.verification.to_dict(),
            "strict_reasons": self.strict_reasons(),
        }
        if pictures:
            data["svg_before"] = self.svg_before()
            data["svg_after"] = self.svg_after()
        return data

    def to_json(self, **kwargs: Any) -> str:
        """:meth:`to_dict` as indented JSON."""
        return json.dumps(self.to_dict(**kwargs), indent=2, default=json_default)

    def text(self) -> str:
        """The summary the CLI prints."""
        lines = [f"stages: {', '.join(self.stages)}" + ("" if self.completed else " (stopped at a failing pass)")]
        lines += _histogram_lines(self.ops_before, self.ops_after)
        if self.float_nodes is not None:
            fr = self.float_nodes
            head = "float ops left: none (integer-only)" if fr.integer_only else \
                f"float ops left: {len(fr.nodes)}"
            lines.append(head)
            lines += [f"  {n.text()}" for n in fr.nodes]
            if fr.dequantization:
                lines.append(f"  output dequantization (float, allowed): {', '.join(fr.dequantization)}")
        for kind in ("weights", "activations"):
            hist = self.datatypes.get(kind) or {}
            if hist:
                lines.append(f"datatypes ({kind}): " + ", ".join(f"{k} x{v}" for k, v in hist.items()))
        if self.cost_after is not None:
            lines.append("cost: " + self.cost_after.text().splitlines()[0])
        lines.append("time per stage: " + ", ".join(f"{k} {v:.2f} s" for k, v in self.stage_seconds.items()))
        lines.append("time: " + ", ".join(f"{k} {v:.2f} s" for k, v in self.seconds.items()))
        lines.append(self.verification.text())
        return "\n".join(lines)

    # -- HTML ------------------------------------------------------------------------------------------------------
    def svg_before(self) -> str:
        return self.picture_before.svg("before") if self.picture_before is not None else ""

    def svg_after(self) -> str:
        return self.picture_after.svg("after") if self.picture_after is not None else ""

    def html_fragment(self) -> str:
        """The report as an HTML fragment (styles scoped to it), for embedding and notebooks."""
        v = self.verification
        status = {True: ("ok", "verified"), False: ("bad", "verification FAILED"), None: ("off", "not verified")}[v.ok]
        if v.ok and (v.assumed or v.declined):
            status = ("warn", v.status + (f", {len(v.declined)} rewrite(s) declined" if v.declined else ""))
        parts = [f"<div class='fl-report'><style>{_CSS}</style>",
                 f"<h1>finnlite streamline report <span class='fl-badge fl-{status[0]}'>{status[1]}</span></h1>",
                 f"<p>{_esc(self.source or 'model')}{' → ' + _esc(self.output) if self.output else ''}<br>"
                 f"stages: {_esc(', '.join(self.stages))}"
                 f"{'' if self.completed else ' <b>(stopped at a failing pass)</b>'}; "
                 f"nodes {sum(self.ops_before.values())} → {sum(self.ops_after.values())}</p>"]
        parts.append("<h2>Op histogram</h2>" + _histogram_html(self.ops_before, self.ops_after))
        parts.append("<h2>Verification</h2>" + _verification_html(v))
        parts.append("<h2>Float ops left</h2>" + _float_html(self.float_nodes))
        parts.append("<h2>Datatypes and inference cost</h2>" + _cost_html(self))
        parts.append("<h2>Time per pass</h2>" + _timings_html(self))
        parts.append("<h2>Graph</h2><div class='fl-pictures'>"
                     f"<div class='fl-picture'><h3>before ({self._count(self.picture_before)} nodes)</h3>"
                     f"<div class='fl-scroll'>{self.svg_before()}</div></div>"
                     f"<div class='fl-picture'><h3>after ({self._count(self.picture_after)} nodes)</h3>"
                     f"<div class='fl-scroll'>{self.svg_after()}</div></div></div>"
                     "<p class='fl-note'>Hover over a node for its name, tensors, shapes and datatypes.</p>")
        parts.append("</div>")
        return "".join(parts)

    @staticmethod
    def _count(pic: GraphPicture | None) -> int | str:
        return pic.node_count if pic is not None else "?"

    def to_html(self) -> str:
        """A complete, self-contained HTML document."""
        title = _esc(f"finnlite report: {Path(self.source).name if self.source else 'model'}")
        return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>{title}</title></head>"
                f"<body>{self.html_fragment()}</body></html>\n")

    def save_html(self, path: str | Path) -> None:
        """Write :meth:`to_html` to ``path``."""
        Path(path).write_text(self.to_html(), encoding="utf-8")

    def _repr_html_(self) -> str:
        return self.html_fragment()


def json_default(value: Any) -> Any:
    """For ``json.dumps``: numpy scalars and arrays as numbers and lists, paths and anything else as text."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def _histogram_lines(before: dict[str, int], after: dict[str, int]) -> list[str]:
    ops = sorted(set(before) | set(after), key=lambda o: (-after.get(o, 0), -before.get(o, 0), o))
    width = max([len(o) for o in ops] + [7])
    lines = [f"  {'op':<{width}}  before  after"]
    lines += [f"  {o:<{width}}  {before.get(o, 0):>6}  {after.get(o, 0):>5}" for o in ops]
    lines.append(f"  {'total':<{width}}  {sum(before.values()):>6}  {sum(after.values()):>5}")
    return lines


def _bar(value: float, top: float, cls: str) -> str:
    pct = 0.0 if top <= 0 else 100.0 * value / top
    return f"<div class='fl-bar {cls}' style='width:{pct:.1f}%'></div>"


def _histogram_html(before: dict[str, int], after: dict[str, int]) -> str:
    ops = sorted(set(before) | set(after), key=lambda o: (-after.get(o, 0), -before.get(o, 0), o))
    top = max(list(before.values()) + list(after.values()) + [1])
    rows = "".join(f"<tr><td>{_esc(o)}</td><td class='n'>{before.get(o, 0)}</td><td class='n'>{after.get(o, 0)}</td>"
                   f"<td class='fl-bars'>{_bar(before.get(o, 0), top, 'fl-before')}"
                   f"{_bar(after.get(o, 0), top, 'fl-after')}</td></tr>" for o in ops)
    return ("<table class='fl-table fl-histogram'><tr><th>op</th><th>before</th><th>after</th>"
            "<th><span class='fl-key fl-before'></span> before <span class='fl-key fl-after'></span> after</th></tr>"
            f"{rows}<tr class='fl-total'><td>total</td><td class='n'>{sum(before.values())}</td>"
            f"<td class='n'>{sum(after.values())}</td><td></td></tr></table>")


def _verification_html(v: VerificationResult) -> str:
    if v.mode == "off":
        return "<p>Verification was off.</p>"
    out = [f"<p>mode <b>{_esc(v.mode)}</b>; reference data: {_esc(v.reference)}; {v.seconds:.2f} s</p>"]
    if v.assumed:
        out.append(f"<div class='fl-warning'>{_esc(v.status)}: {_esc(v.assumed_hint())}</div>")
    for note in v.notes:
        out.append(f"<p class='fl-note'>{_esc(note)}</p>")
    if v.declined:
        rows = "".join(f"<tr><td>{_esc(d.stage or '')}</td><td>{_esc(d.pass_name)}</td><td class='n'>"
                       f"{d.iteration or ''}</td><td>{_esc(d.anchor)}</td><td>{_esc(d.match or '')}</td>"
                       f"<td>{_esc(d.tensor or '')}</td><td>{_esc(d.message)}</td></tr>" for d in v.declined)
        out.append(f"<h3>Rewrites declined by verification ({len(v.declined)})</h3><p>Each broke its pass's check; it "
                   "was undone and not performed again, and the model is correct without it.</p><table "
                   "class='fl-table'><tr><th>stage</th><th>pass</th><th>round</th><th>at node</th><th>matched</th>"
                   f"<th>failing tensor</th><th>check</th></tr>{rows}</table>")
    if v.failure is not None:
        f = v.failure
        out.append(f"<div class='fl-failure'><b>{_esc(f.get('pass') or 'final check')}</b> failed"
                   f"{' (stage ' + _esc(f['stage']) + ')' if f.get('stage') else ''}: {_esc(f['message'])}</div>")
    if v.checks:
        rows = "".join(
            f"<tr class='{'' if c.ok else 'fl-fail'}'><td>{_esc(c.stage or '')}</td><td>{_esc(c.pass_name)}</td>"
            f"<td class='n'>{c.iteration or ''}</td><td>{_esc(c.policy)}</td>"
            f"<td class='n'>{'' if c.changed_nodes is None else c.changed_nodes}</td>"
            f"<td class='n'>{'' if c.region_nodes is None else c.region_nodes}</td><td class='n'>{c.near_ties}</td>"
            f"<td class='n'>{c.seconds:.3f}</td><td>{'ok' if c.ok else 'FAILED: ' + _esc(c.message)}</td></tr>"
            for c in v.checks)
        out.append("<h3>Per-pass checks</h3><table class='fl-table'><tr><th>stage</th><th>pass</th><th>round</th>"
                   "<th>policy</th><th>changed nodes</th><th>nodes run</th><th>near-ties</th><th>s</th>"
                   f"<th>result</th></tr>{rows}</table>")
    if v.final is not None:
        rows = "".join(
            f"<tr class='{'' if o.ok else 'fl-fail'}'><td>{_esc(o.name)}</td><td>{_esc(o.compared_as)}</td>"
            f"<td class='n'>{o.samples - len(o.error_samples)}/{o.samples}</td><td class='n'>{o.agree32}/{o.samples}"
            f"</td><td class='n'>{len(o.near_tie_samples)}</td><td class='n'>{o.max_error64:.3g} {_esc(o.unit)}</td>"
            "</tr>" for o in v.final.outputs)
        out.append("<h3>Final check against the original</h3><table class='fl-table'><tr><th>output</th>"
                   "<th>compared as</th><th>agrees with float64</th><th>agrees with float32</th>"
                   f"<th>near-tie samples</th><th>max deviation</th></tr>{rows}</table>")
        for site in v.final.tie_sites:
            out.append(f"<p class='fl-note'>near-tie {_esc(site.describe())}</p>")
    return "".join(out)


def _float_html(fr: Any) -> str:
    if fr is None:
        return "<p>not computed</p>"
    out = ["<p>integer-only: no float node is left.</p>" if fr.integer_only else
           f"<p><b>{len(fr.nodes)}</b> float node(s) left:</p><ul>"
           + "".join(f"<li>{_esc(n.text())}</li>" for n in fr.nodes) + "</ul>"]
    if fr.dequantization:
        out.append(f"<p>output dequantization (float, allowed): {_esc(', '.join(fr.dequantization))}</p>")
    return "".join(out)


def _cost_html(report: StreamlineReport) -> str:
    out = []
    for kind in ("weights", "activations"):
        hist = report.datatypes.get(kind) or {}
        if hist:
            out.append(f"<p>{kind}: " + ", ".join(f"{_esc(k)} ×{v}" for k, v in hist.items()) + "</p>")
    for label, cost in (("before", report.cost_before), ("after", report.cost_after)):
        if cost is not None:
            out.append(f"<h3>Inference cost {label}</h3><pre>{_esc(cost.text())}</pre>")
    return "".join(out) or "<p>not computed</p>"


def _timings_html(report: StreamlineReport) -> str:
    top = max([p.seconds for p in report.passes] + [1e-9])
    rows = "".join(f"<tr><td>{_esc(p.stage)}</td><td>{_esc(p.name)}</td><td class='n'>{p.runs}</td>"
                   f"<td class='n'>{p.changed}</td><td class='n'>{'' if p.rewrites is None else p.rewrites}</td>"
                   f"<td class='n'>{p.seconds:.3f}</td><td class='fl-bars'>{_bar(p.seconds, top, 'fl-after')}</td>"
                   "</tr>" for p in report.passes)
    stages = ", ".join(f"{_esc(k)} {v:.2f} s" for k, v in report.stage_seconds.items())
    other = ", ".join(f"{_esc(k)} {v:.2f} s" for k, v in report.seconds.items())
    return (f"<p>stages: {stages}<br>{other}</p><table class='fl-table'><tr><th>stage</th><th>pass</th><th>runs</th>"
            f"<th>changed</th><th>rewrites</th><th>s</th><th></th></tr>{rows}</table>")


_CSS = """
.fl-report{font-family:Helvetica,Arial,sans-serif;font-size:14px;color:#222;max-width:1400px}
.fl-report h1{font-size:20px}.fl-report h2{font-size:17px;margin-top:1.4em;border-bottom:1px solid #ddd}
.fl-report h3{font-size:14px}
.fl-badge{font-size:13px;padding:2px 8px;border-radius:10px;vertical-align:middle}
.fl-ok{background:#d6f0d2;color:#1d5e20}.fl-bad{background:#f6d3d3;color:#8a1c1c}.fl-off{background:#eee;color:#555}
.fl-table{border-collapse:collapse;margin:.5em 0}
.fl-table td,.fl-table th{border:1px solid #ddd;padding:2px 8px;text-align:left}
.fl-table td.n{text-align:right;font-variant-numeric:tabular-nums}
.fl-table tr.fl-fail td{background:#fbe4e4}.fl-table tr.fl-total td{font-weight:bold}
.fl-bars{width:260px}.fl-bar{height:7px;margin:1px 0}
.fl-before{background:#b9b9b9}.fl-after{background:#2764a8}
.fl-key{display:inline-block;width:10px;height:10px}
.fl-failure{background:#fbe4e4;border-left:4px solid #a83232;padding:6px 10px;margin:.5em 0}
.fl-warning{background:#fdf3d8;border-left:4px solid #c77c02;padding:6px 10px;margin:.5em 0}
.fl-warn{background:#fdf3d8;color:#7a4b00}
.fl-pictures{display:flex;gap:16px;align-items:flex-start}
.fl-picture{flex:1 1 0;min-width:0}
.fl-scroll{overflow:auto;max-height:85vh;border:1px solid #ddd;background:#fcfcfc}
.fl-note{color:#666;font-size:12px}
.fl-report pre{background:#f6f6f6;padding:6px}
"""
