"""Small self-contained SVG charts, for the report and the notebooks (no plotting library needed).

* :func:`bar_chart` — grouped bars: one group per category (a layer, an op), one bar per series;
* :func:`line_chart` — lines or staircases (``step=True``) of y over x, one per series;
* :func:`layer_widths_chart` — the per-layer weight, input, accumulator and output bit widths FINN sizes each MAC
  layer with (:meth:`finnlite.cost.InferenceCost.layers`), as grouped bars.

Each returns the SVG text; in a notebook, :class:`Chart` displays itself (``_repr_svg_``). Every bar and point has a
tooltip (``<title>``) with its exact value.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from finnlite.cost import bits
from finnlite.graphpic import esc

__all__ = ["Chart", "bar_chart", "line_chart", "layer_widths_chart", "COLORS"]

#: series colours, in order
COLORS = ("#2764a8", "#c77c02", "#2f7d32", "#a83232", "#7b4ea3", "#666666")
_FONT = 'font-family="Helvetica, Arial, sans-serif" font-size="11"'


class Chart(str):
    """SVG text that a notebook shows as a picture."""

    def _repr_svg_(self) -> str:
        return str(self)

    def __repr__(self) -> str:  # the text a notebook stores beside the picture: short
        return f"<finnlite chart: SVG, {len(self)} characters>"


def _nice_step(top: float, ticks: int = 5) -> float:
    raw = max(top, 1e-12) / ticks
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)


def _frame(width: float, height: float, left: float, top: float, plot_w: float, plot_h: float, lo: float,
           hi: float, title: str, ylabel: str, series: Sequence[str]) -> list[str]:
    """The SVG head, the title, the y axis with gridlines, and the legend of ``series``."""
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="fl-chart" width="{width:.0f}" height="{height:.0f}" '
           f'viewBox="0 0 {width:.0f} {height:.0f}" {_FONT}>',
           f'<rect width="{width:.0f}" height="{height:.0f}" fill="#ffffff"/>']
    if title:
        out.append(f'<text x="{left:.0f}" y="16" font-size="13" font-weight="bold">{esc(title)}</text>')
    step = _nice_step(hi - lo)
    t = math.ceil(lo / step) * step
    while t <= hi + 1e-9 * step:
        y = top + plot_h - (t - lo) / (hi - lo) * plot_h
        out.append(f'<line x1="{left:.1f}" x2="{left + plot_w:.1f}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e4e4e4"/>'
                   f'<text x="{left - 5:.1f}" y="{y + 4:.1f}" text-anchor="end">{t:g}</text>')
        t += step
    out.append(f'<line x1="{left:.1f}" x2="{left:.1f}" y1="{top:.1f}" y2="{top + plot_h:.1f}" stroke="#888"/>')
    if ylabel:
        out.append(f'<text transform="translate(12,{top + plot_h / 2:.1f}) rotate(-90)" text-anchor="middle">'
                   f'{esc(ylabel)}</text>')
    x = left
    for i, name in enumerate(series):
        out.append(f'<g class="fl-chart-key"><rect x="{x:.1f}" y="24" width="10" height="10" '
                   f'fill="{COLORS[i % len(COLORS)]}"/><text x="{x + 14:.1f}" y="33">{esc(name)}</text></g>')
        x += 24 + 7 * len(name)
    return out


def bar_chart(categories: Sequence[str], series: dict[str, Sequence[float | None]], *, title: str = "",
              ylabel: str = "", labels: Sequence[str] | None = None, tooltips: Sequence[str] | None = None,
              bar_width: float = 7.0) -> Chart:
    """Grouped bars: for each category, one bar per series (None: no bar). ``labels``: the text under each group
    (default: the categories); ``tooltips``: a line per category added to each bar's tooltip."""
    names = list(series)
    values = [v for vs in series.values() for v in vs if v is not None]
    hi = max(values + [1.0])
    hi = _nice_step(hi) * math.ceil(hi / _nice_step(hi))
    group = bar_width * max(len(names), 1) + 6
    left, top, bottom = 44.0, 44.0, 46.0
    plot_w = max(group * len(categories), 200.0)
    plot_h = 180.0
    width, height = left + plot_w + 16, top + plot_h + bottom
    out = _frame(width, height, left, top, plot_w, plot_h, 0.0, hi, title, ylabel, names)
    labels = list(labels) if labels is not None else list(categories)
    every = max(1, math.ceil(len(categories) * 14 / plot_w))  # a label every so many groups, so they do not overlap
    for i, cat in enumerate(categories):
        x0 = left + i * group + 3
        for j, name in enumerate(names):
            v = series[name][i]
            if v is None:
                continue
            h = v / hi * plot_h
            tip = f"{cat}: {name} {v:g}" + (f"\n{tooltips[i]}" if tooltips else "")
            out.append(f'<rect class="fl-chart-bar" x="{x0 + j * bar_width:.1f}" y="{top + plot_h - h:.1f}" '
                       f'width="{bar_width - 1:.1f}" height="{h:.1f}" fill="{COLORS[j % len(COLORS)]}">'
                       f'<title>{esc(tip)}</title></rect>')
        if i % every == 0:
            cx = x0 + bar_width * len(names) / 2
            out.append(f'<text x="{cx:.1f}" y="{top + plot_h + 12:.1f}" text-anchor="end" '
                       f'transform="rotate(-45 {cx:.1f} {top + plot_h + 12:.1f})">{esc(labels[i])}</text>')
    out.append(f'<line x1="{left:.1f}" x2="{left + plot_w:.1f}" y1="{top + plot_h:.1f}" y2="{top + plot_h:.1f}" '
               'stroke="#888"/></svg>')
    return Chart("".join(out))


def line_chart(series: dict[str, tuple[Sequence[float], Sequence[float]]], *, title: str = "", xlabel: str = "",
               ylabel: str = "", step: bool = False, dashed: Sequence[str] = (), points: Sequence[str] = ()) -> Chart:
    """One line per series ``name: (xs, ys)``; ``step``: a staircase (each y holds until the next x); series named
    in ``dashed`` are drawn dashed (to show two that coincide), those in ``points`` as dots (samples)."""
    xs = [x for x_, _ in series.values() for x in x_]
    ys = [y for _, y_ in series.values() for y in y_]
    x_lo, x_hi = (min(xs), max(xs)) if xs else (0.0, 1.0)
    y_lo, y_hi = (min(ys), max(ys)) if ys else (0.0, 1.0)
    if x_hi == x_lo:
        x_hi = x_lo + 1
    pad = (y_hi - y_lo) * 0.05 or 1.0
    y_lo, y_hi = y_lo - pad, y_hi + pad
    left, top, plot_w, plot_h = 48.0, 44.0, 460.0, 220.0
    width, height = left + plot_w + 16, top + plot_h + 40
    out = _frame(width, height, left, top, plot_w, plot_h, y_lo, y_hi, title, ylabel, list(series))
    sx = lambda x: left + (x - x_lo) / (x_hi - x_lo) * plot_w  # noqa: E731
    sy = lambda y: top + plot_h - (y - y_lo) / (y_hi - y_lo) * plot_h  # noqa: E731
    for j, (name, (x_, y_)) in enumerate(series.items()):
        if name in points:
            color = COLORS[j % len(COLORS)]
            out.append(f'<g class="fl-points" fill="{color}"><title>{esc(name)}</title>'
                       + "".join(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5"/>' for x, y in zip(x_, y_))
                       + "</g>")
            continue
        pts: list[tuple[float, float]] = []
        for i, (x, y) in enumerate(zip(x_, y_)):
            if step and i:
                pts.append((sx(x), pts[-1][1]))
            pts.append((sx(x), sy(y)))
        d = " ".join(f"{'M' if i == 0 else 'L'}{px:.1f},{py:.1f}" for i, (px, py) in enumerate(pts))
        dash = ' stroke-dasharray="6 4"' if name in dashed else ""
        out.append(f'<path class="fl-line" d="{d}" fill="none" stroke="{COLORS[j % len(COLORS)]}" stroke-width="2"'
                   f'{dash}><title>{esc(name)}</title></path>')
    step_x = _nice_step(x_hi - x_lo)
    t = math.ceil(x_lo / step_x) * step_x
    while t <= x_hi + 1e-9 * step_x:
        out.append(f'<text x="{sx(t):.1f}" y="{top + plot_h + 14:.1f}" text-anchor="middle">{t:g}</text>')
        t += step_x
    out.append(f'<line x1="{left:.1f}" x2="{left + plot_w:.1f}" y1="{top + plot_h:.1f}" y2="{top + plot_h:.1f}" '
               'stroke="#888"/>')
    if xlabel:
        out.append(f'<text x="{left + plot_w / 2:.1f}" y="{height - 6:.1f}" text-anchor="middle">{esc(xlabel)}</text>')
    out.append("</svg>")
    return Chart("".join(out))


def layer_widths_chart(cost: Any, *, title: str = "Per-layer bit widths (as FINN sizes them)") -> Chart:
    """The weight, input, accumulator and output widths of each MAC layer of ``cost`` (an
    :class:`~finnlite.cost.InferenceCost`) as grouped bars; a width that is not an integer datatype's (float, or
    no accumulator) has no bar, and the tooltip says which datatype it is."""
    layers = list(cost.layers)
    fields = (("weight", "weight_dt"), ("input", "input_dt"), ("accumulator", "acc_dt"), ("output", "finn_output_dt"))
    series = {name: [_int_bits(getattr(c, attr)) for c in layers] for name, attr in fields}
    tips = [f"{c.op_type} '{c.node}': weight {c.weight_dt}, input {c.input_dt}, accumulator {c.acc_dt}, "
            f"output {c.finn_output_dt}" for c in layers]
    return bar_chart([c.node for c in layers], series, title=title, ylabel="bits",
                     labels=[str(i + 1) for i in range(len(layers))], tooltips=tips)


def _int_bits(dt: str) -> int | None:
    if not dt or dt == "-" or dt.startswith("FLOAT"):
        return None
    return bits(dt)
