"""Pictures of a graph for the report, drawn here without graphviz, as self-contained SVG.

:class:`GraphPicture` records nodes and edges, assigns layers (longest path from the graph inputs; constant-only
nodes such as weight quantizers sit just above their consumer), places each node at the mean position of its
predecessors (pushed right where boxes would overlap, so a chain stays straight and side inputs sit beside it), and
draws boxes with curved edges. A node's tooltip names it and lists its tensors with shapes and datatypes.

A box's colour says what the node computes, read from its output tensors' datatypes (the annotation, else derived
as :mod:`finnlite.cost` derives it), not from its op type (:data:`KINDS`): integer, scaled integer (a quantizer's
output: integers times a float scale), float, or constant (it reads only constants: weights and their quantizers).
Marks (:data:`MARKS`) come from the streamlining report: every float node left and the first layer on a float
input are ringed in red, the output dequantization (float, allowed) is dashed, the failing node is ringed in black.
The rings keep their width on screen at any zoom (``vector-effect``), so they show on a whole MobileNet at once.

:func:`zoomable` wraps a picture in a pane that a small inline script (:data:`ZOOM_SCRIPT`; nothing loaded from
anywhere) turns into a zoom-and-pan view of the SVG's ``viewBox``: the wheel zooms around the pointer, dragging pans,
buttons fit the whole graph or its width and step through the ringed nodes. Without the script (a notebook viewer
that strips scripts) the picture is shown at full size in a scrolling pane. :func:`legend` draws the colour key.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from finnlite.core.datatypes import is_integer_type
from finnlite.core.model import Model
from finnlite.cost import derived_datatypes

__all__ = ["GraphPicture", "KINDS", "MARKS", "legend", "zoomable", "ZOOM_SCRIPT"]

#: the width of a node box and of a lane between boxes in the picture (pixels)
BOX_W, LANE_W = 176, 8
_BOX_H, _GAP_X, _GAP_Y, _MARGIN = 38, 18, 30, 16
#: what a node computes, from its outputs' datatypes: (fill, stroke, legend text)
KINDS = {
    "int": ("#d6f0d2", "#2f7d32", "integer: every output has an integer datatype (INTn, UINTn, BIPOLAR)"),
    "scaled": ("#dbe6fb", "#2764a8", "scaled integer: a quantizer's output, integers times a float scale"),
    "float": ("#f6d3d3", "#a83232", "float: an output without an integer datatype"),
    "const": ("#ececec", "#8a8a8a", "constant: reads only constants (weights and their quantizers)"),
}
#: marks from the streamlining report: (stroke, dash, legend text); ringed ones are the "highlighted" nodes
MARKS = {
    "float-left": ("#e0001b", "", "float node left after streamlining (ringed)"),
    "first-layer": ("#e0001b", "", "first layer on the float input (ringed: not integer-only)"),
    "dequant": ("#c77c02", "5 3", "output dequantization (float, allowed)"),
    "failing": ("#111111", "", "where verification failed (ringed black)"),
}
_RINGED = ("float-left", "first-layer", "failing")
_IO_FILL = "#3b3b3b"


def esc(text: Any) -> str:
    """``text`` escaped for HTML (quotes included)."""
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
    computes: str = ""  # a key of KINDS (nodes only)
    mark: str = ""  # a key of MARKS, or ""
    name: str = ""


@dataclass
class GraphPicture:
    """The structure of a graph, captured for drawing: boxes (nodes, graph inputs and outputs) and edges."""

    boxes: list[_Box] = field(default_factory=list)
    edges: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def of(cls, model: Model, marks: Mapping[str, str] | None = None) -> "GraphPicture":
        """Capture ``model``'s nodes, their wiring and what each computes (cheap; drawing happens in :meth:`svg`).
        ``marks``: node name -> a key of :data:`MARKS`."""
        marks = marks or {}
        pic = cls()
        datatype = _datatypes(model)
        producer: dict[str, str] = {}
        const = set(model.graph.initializers)
        for v in model.graph.inputs:
            key = f"in:{v.name}"
            pic.boxes.append(_Box(key, "input", _clip(v.name, 28), _tensor_line(model, v.name, datatype), "input"))
            producer[v.name] = key
        nodes = list(model.graph)
        for i, node in enumerate(nodes):
            for o in node.outputs:
                if o.name:
                    producer[o.name] = f"n{i}"
        for i, node in enumerate(nodes):
            key = f"n{i}"
            outs = [o for o in node.outputs if o.name]
            data_in = [v for v in node.inputs if v is not None and v.name and v.name not in const]
            computes = _computes(outs, data_in, datatype)
            if computes == "const":
                const.update(o.name for o in outs)
            mark = marks.get(node.name, "")
            sub = (_tensor_brief(model, outs[0].name, datatype) if outs else "") or node.name
            lines = [f"{node.op_type} '{node.name or '(unnamed)'}': {KINDS[computes][2].split(':')[0]}"
                     + (f"; {MARKS[mark][2]}" if mark else "")]
            lines += [f"in:  {_tensor_line(model, v.name, datatype)}" for v in node.inputs if v is not None and v.name]
            lines += [f"out: {_tensor_line(model, o.name, datatype)}" for o in outs]
            pic.boxes.append(_Box(key, node.op_type, sub, "\n".join(lines), "node", node.op_type, computes, mark,
                                  node.name))
            seen: set[str] = set()
            for v in node.inputs:
                src = producer.get(v.name) if v is not None and v.name else None
                if src is not None and src not in seen:
                    seen.add(src)
                    pic.edges.append((src, key))
        for v in model.graph.outputs:
            key = f"out:{v.name}"
            pic.boxes.append(_Box(key, "output", _clip(v.name, 28), _tensor_line(model, v.name, datatype), "output"))
            if v.name in producer:
                pic.edges.append((producer[v.name], key))
        return pic

    @property
    def node_count(self) -> int:
        return sum(1 for b in self.boxes if b.kind == "node")

    def counts(self) -> dict[str, int]:
        """How many nodes compute each kind (:data:`KINDS`) and carry each mark (:data:`MARKS`)."""
        out: dict[str, int] = {}
        for b in self.boxes:
            for k in (b.computes, b.mark):
                if k:
                    out[k] = out.get(k, 0) + 1
        return out

    def layout(self) -> "_Layout":
        """Where every box goes, and the lanes of edges that span several layers (module docstring)."""
        import networkx as nx  # only pictures need it: not imported with the report

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
        width = {k: float(BOX_W) for k in topo}
        for a, b in dict.fromkeys(self.edges):
            if a not in rank or b not in rank or rank[b] - rank[a] <= 1:
                if a in rank and b in rank:
                    chain.add_edge(a, b)
                continue
            dummies = [f"~{len(lanes)}~{r}" for r in range(rank[a] + 1, rank[b])]
            lanes[(a, b)] = dummies
            for d, r in zip(dummies, range(rank[a] + 1, rank[b])):
                layers[r].append(d)
                width[d] = float(LANE_W)
                if a in data:
                    data.add(d)
            nx.add_path(chain, [a, *dummies, b])
        x: dict[str, float] = {}
        for r in sorted(layers):  # downwards: follow the data
            want = {}
            for k in layers[r]:  # boxes on the data path decide, then lanes (a join stays under its main input),
                # then anything (a weight quantizer is moved beside its consumer later)
                placed = [p for p in chain.predecessors(k) if p in x]
                preds = [x[p] for p in placed if p in data and p in width and width[p] == BOX_W] or \
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
        """The picture as an inline SVG element (its natural size, and a ``viewBox`` the zoom script moves);
        ``uid`` keeps its ids apart from other SVGs in the same page."""
        lay = self.layout()
        pos = lay.centers
        width = lay.right + _MARGIN
        height = max((p[1] for p in pos.values()), default=0) + _BOX_H + _MARGIN
        marker = f"{uid}-arrow"
        out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="fl-graph" id="{uid}-graph" width="{width:.0f}" '
               f'height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" preserveAspectRatio="xMidYMid meet" '
               'font-family="Helvetica, Arial, sans-serif">',
               f'<defs><marker id="{marker}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
               'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#777"/></marker></defs>',
               '<g class="fl-edges" fill="none" stroke="#8a8a8a" stroke-width="1.2">']
        for a, b in dict.fromkeys(self.edges):
            if a not in pos or b not in pos:
                continue
            out.append(f'<path d="{_route(pos, a, b, lay.lanes.get((a, b), []))}" marker-end="url(#{marker})"/>')
        out.append("</g>")
        for box in self.boxes:
            if box.key in pos:
                out.append(_box_svg(box, *pos[box.key]))
        out.append("</svg>")
        return "".join(out)


def _box_svg(box: _Box, cx: float, top: float) -> str:
    bx = cx - BOX_W / 2
    if box.kind != "node":
        return (f'<g class="fl-{box.kind}"><title>{esc(box.tooltip)}</title>'
                f'<rect x="{bx:.1f}" y="{top:.1f}" width="{BOX_W}" height="{_BOX_H}" rx="{_BOX_H / 2:g}" '
                f'fill="{_IO_FILL}" stroke="{_IO_FILL}"/>{_labels(box, cx, top, "#fff", "#ddd")}</g>')
    fill, stroke, _ = KINDS[box.computes]
    classes = ["fl-node", f"fl-{box.computes}"]
    ring = ""
    if box.mark:
        classes.append(f"fl-mark-{box.mark}")
        color, dash, _ = MARKS[box.mark]
        if box.mark in _RINGED:
            classes.append("fl-hl")
            ring = (f'<rect class="fl-ring" x="{bx - 5:.1f}" y="{top - 5:.1f}" width="{BOX_W + 10}" '
                    f'height="{_BOX_H + 10}" rx="8" fill="none" stroke="{color}" stroke-width="4" '
                    'vector-effect="non-scaling-stroke"/>')
        else:
            stroke = color
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
    else:
        dash_attr = ""
    name = f' data-name="{esc(box.name)}"' if box.name else ""
    return (f'<g class="{" ".join(classes)}"{name}><title>{esc(box.tooltip)}</title>{ring}'
            f'<rect x="{bx:.1f}" y="{top:.1f}" width="{BOX_W}" height="{_BOX_H}" rx="4" fill="{fill}" '
            f'stroke="{stroke}" stroke-width="1.5"{dash_attr}/>{_labels(box, cx, top, "#111", "#444")}</g>')


def _labels(box: _Box, cx: float, top: float, color: str, sub_color: str) -> str:
    return (f'<text x="{cx:.1f}" y="{top + 15:.1f}" text-anchor="middle" font-size="12" font-weight="bold" '
            f'fill="{color}">{esc(_clip(box.title, 24))}</text>'
            f'<text x="{cx:.1f}" y="{top + 30:.1f}" text-anchor="middle" font-size="10" '
            f'fill="{sub_color}">{esc(_clip(box.subtitle, 30))}</text>')


def _datatypes(model: Model) -> Callable[[Any], Any]:
    """value -> its datatype (annotation, else derived); None where even that fails (a broken graph)."""
    derive = derived_datatypes(model)

    def datatype(v: Any) -> Any:
        try:
            return derive(v)
        except Exception:  # noqa: BLE001 - a picture of a broken graph still draws
            return None

    return datatype


def _computes(outs: list[Any], data_in: list[Any], datatype: Callable[[Any], Any]) -> str:
    if not data_in:
        return "const"
    dts = [datatype(o) for o in outs]
    if dts and all(dt is not None and is_integer_type(dt) for dt in dts):
        return "int"
    if dts and all(dt is not None and (is_integer_type(dt) or dt.name.startswith("SCALEDINT")) for dt in dts):
        return "scaled"
    return "float"


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
        x1, y1, x2, y2 = xa + BOX_W / 2, ya + _BOX_H / 2, xb + BOX_W / 2, yb + _BOX_H / 2
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


def _tensor_brief(model: Model, name: str, datatype: Callable[[Any], Any]) -> str:
    v = model.value(name)
    dt = model.get_tensor_datatype(name).name if model.has_tensor_datatype(name) else ""
    if not dt and v is not None and not model.is_initializer(name):
        found = datatype(v)
        dt = found.name if found is not None and found.name != "FLOAT32" else ""
    return " ".join(x for x in (dt, _shape_text(model, name)) if x)


def _shape_text(model: Model, name: str) -> str:
    try:
        shape = model.get_tensor_shape(name)
    except Exception:  # noqa: BLE001 - a picture of a broken graph still draws
        return ""
    return "" if shape is None else "×".join("?" if d is None else str(d) for d in shape)


def _tensor_line(model: Model, name: str, datatype: Callable[[Any], Any]) -> str:
    extra = _tensor_brief(model, name, datatype)
    const = " (constant)" if model.is_initializer(name) else ""
    return f"{name}{' ' + extra if extra else ''}{const}"


def quoted_names(labels: list[str]) -> list[str]:
    """The node names in labels such as ``"MatMul 'fc1'"`` (the float report's form)."""
    return [m.group(1) for m in (re.search(r"'(.*)'$", s) for s in labels) if m is not None]


# -- legend and zoom -----------------------------------------------------------------------------------------------
def legend(counts: Mapping[str, int] | None = None) -> str:
    """The colour key as an SVG: every kind of :data:`KINDS` and mark of :data:`MARKS` (with how many nodes of the
    after-graph carry it, when ``counts`` is given)."""
    rows = [(k, fill, stroke, "", text) for k, (fill, stroke, text) in KINDS.items()]
    rows += [(k, "#ffffff", stroke, dash, text) for k, (stroke, dash, text) in MARKS.items()]
    h = 20 * len(rows) + 8
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="fl-legend" width="620" height="{h}" '
           f'viewBox="0 0 620 {h}" font-family="Helvetica, Arial, sans-serif" font-size="12">']
    for i, (key, fill, stroke, dash, text) in enumerate(rows):
        y = 4 + 20 * i
        ringed = key in _RINGED and key in MARKS
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        width = 3 if ringed else 1.5
        n = f" ({counts.get(key, 0)} after)" if counts is not None else ""
        out.append(f'<g class="fl-legend-{key}"><rect x="4" y="{y}" width="34" height="14" rx="3" fill="{fill}" '
                   f'stroke="{stroke}" stroke-width="{width}"{dash_attr}/>'
                   f'<text x="46" y="{y + 11}">{esc(text + n)}</text></g>')
    out.append("</svg>")
    return "".join(out)


def zoomable(svg: str, uid: str, highlighted: int) -> str:
    """``svg`` in a pane the zoom script (:data:`ZOOM_SCRIPT`) makes zoomable; its toolbar shows only when the
    script runs."""
    step = (f"<button type='button' data-act='next'>next ringed node ({highlighted})</button>"
            if highlighted else "")
    return (f"<div class='fl-zoom' id='{uid}-zoom'><div class='fl-tools' style='display:none'>"
            "<button type='button' data-act='fit'>whole graph</button>"
            "<button type='button' data-act='width'>fit width</button>"
            "<button type='button' data-act='in'>+</button><button type='button' data-act='out'>&#8722;</button>"
            f"{step}<span class='fl-hint'>wheel: zoom, drag: pan</span></div>"
            f"<div class='fl-scroll'>{svg}</div></div>")


#: the zoom-and-pan script (inline, no library): moves each ``.fl-zoom`` pane's SVG ``viewBox``
ZOOM_SCRIPT = """
(function(){
function setup(z){
  if(z.getAttribute('data-ready'))return; z.setAttribute('data-ready','1');
  var pane=z.querySelector('.fl-scroll'), svg=pane&&pane.querySelector('svg'); if(!svg)return;
  var W=+svg.getAttribute('width'), H=+svg.getAttribute('height'), v={x:0,y:0,w:W,h:H};
  z.querySelector('.fl-tools').style.display=''; pane.classList.add('fl-pan');
  svg.setAttribute('width','100%'); svg.setAttribute('height','100%');
  function ratio(){return Math.max(pane.clientHeight,1)/Math.max(pane.clientWidth,1);}
  function show(){svg.setAttribute('viewBox',[v.x,v.y,v.w,v.h].join(' '));}
  function fit(all){var r=ratio(); v.w=Math.max(W,pane.clientWidth); v.h=v.w*r;
    if(all&&v.h<H){v.h=H; v.w=H/r;} v.x=(W-v.w)/2; v.y=all?(H-v.h)/2:0; show();}
  function zoom(f,cx,cy){v.x=cx-(cx-v.x)*f; v.y=cy-(cy-v.y)*f; v.w*=f; v.h*=f; show();}
  function at(e){var b=pane.getBoundingClientRect();
    return [v.x+(e.clientX-b.left)/b.width*v.w, v.y+(e.clientY-b.top)/b.height*v.h];}
  pane.addEventListener('wheel',function(e){e.preventDefault(); var p=at(e);
    zoom(Math.exp(Math.max(-50,Math.min(50,e.deltaY))*0.004),p[0],p[1]);},{passive:false});
  var drag=null;
  pane.addEventListener('pointerdown',function(e){drag=[e.clientX,e.clientY];});
  window.addEventListener('pointerup',function(){drag=null;});
  pane.addEventListener('pointermove',function(e){if(!drag)return; var b=pane.getBoundingClientRect();
    v.x-=(e.clientX-drag[0])/b.width*v.w; v.y-=(e.clientY-drag[1])/b.height*v.h; drag=[e.clientX,e.clientY];
    show();});
  var rings=svg.querySelectorAll('.fl-hl'), k=-1;
  z.querySelectorAll('button').forEach(function(btn){btn.addEventListener('click',function(){
    var a=btn.getAttribute('data-act');
    if(a==='fit')fit(true); else if(a==='width')fit(false);
    else if(a==='in')zoom(0.8,v.x+v.w/2,v.y+v.h/2); else if(a==='out')zoom(1.25,v.x+v.w/2,v.y+v.h/2);
    else if(a==='next'&&rings.length){k=(k+1)%rings.length; var r=rings[k].querySelector('rect');
      var cx=+r.getAttribute('x')+(+r.getAttribute('width'))/2, cy=+r.getAttribute('y')+(+r.getAttribute('height'))/2;
      v.w=pane.clientWidth; v.h=pane.clientHeight; v.x=cx-v.w/2; v.y=cy-v.h/2; show();}
  });});
  fit(false);
}
document.querySelectorAll('.fl-zoom').forEach(setup);
})();
"""
