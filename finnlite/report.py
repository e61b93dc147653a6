"""The streamlining report: what a run changed, what it cost, what stayed float, and how it verified.

:class:`StreamlineReport` holds the data (op histograms before and after, per-pass timings, per-pass verification
checks and the final check, the float nodes left, datatypes, inference cost, and a picture of the graph before and
after). :func:`finnlite.build.streamline` returns one; the CLI prints :meth:`StreamlineReport.text` or
:meth:`StreamlineReport.to_dict` (``--json``) and writes :meth:`StreamlineReport.to_html` (``--report``); in a
notebook the report displays itself.

*Integer-only* (:attr:`StreamlineReport.integer_only`) is claimed only when no float node is left and no layer
reads a float graph input: a model without an input quantizer keeps its first layer float unless the input
preprocessing is given (``--input-datatype`` ...), and the summary says so. :meth:`StreamlineReport.strict_failures`
lists why ``finnlite streamline --strict`` fails a run (one function per reason in :data:`STRICT_CHECKS`).

The text summary is built from sections (:data:`TEXT_SECTIONS`, one method each), the HTML from the same data: the
verification, the float ops left, the per-layer bit widths (:mod:`finnlite.plots`), the passes that changed the
graph ahead of those that did not, and both graphs (:mod:`finnlite.graphpic`: coloured by datatype, float nodes and
the failing node ringed, zoom and pan by a small inline script). The file is self-contained: inline CSS, SVG and
script, nothing loaded from anywhere.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from finnlite.core.model import Model
from finnlite.graphpic import ZOOM_SCRIPT, GraphPicture, esc, legend, quoted_names, zoomable

__all__ = ["GraphPicture", "PassTiming", "CheckRow", "VerificationResult", "StreamlineReport", "pass_timings",
           "json_default", "STRICT_CHECKS", "QUANTIZER_OPS", "INPUT_HINT"]

#: ops that quantize: a model with none of them has nothing to make integer
QUANTIZER_OPS = frozenset({"Quant", "IntQuant", "BipolarQuant", "Trunc", "QuantizeLinear", "DequantizeLinear",
                           "MultiThreshold", "QuantAvgPool2d"})
#: what to do about a first layer that reads the float input
INPUT_HINT = ("to make it read integers, give the input's datatype and preprocessing: --input-datatype UINT8 "
              "--input-scale 1/255 --mean M.. --std S (the 'preprocessing' key of a config file)")


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
    #: where :meth:`save_html` last wrote the report
    report_path: str | None = None

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

    # -- what the run achieved -------------------------------------------------------------------------------------
    @property
    def first_layer_on_float_input(self) -> list[str]:
        """The layers that read a float graph input (``"MatMul 'name'"``): the model is not integer-only there."""
        return list(self.float_nodes.input_layer) if self.float_nodes is not None else []

    @property
    def has_quantizers(self) -> bool:
        """True if the original model has a quantizer (:data:`QUANTIZER_OPS`)."""
        return any(op in QUANTIZER_OPS for op in self.ops_before)

    @property
    def integer_only(self) -> bool | None:
        """True when no float node is left and no layer reads a float graph input (the output dequantization
        aside); None when the float ops were not computed."""
        if self.float_nodes is None:
            return None
        return not self.float_nodes.nodes and not self.float_nodes.input_layer

    def strict_failures(self) -> list[str]:
        """Why ``--strict`` fails this run: one line per reason (empty: it passes). See :data:`STRICT_CHECKS`."""
        return [reason for check in STRICT_CHECKS for reason in check(self)]

    # -- text and JSON ---------------------------------------------------------------------------------------------
    def to_dict(self, *, pictures: bool = False) -> dict[str, Any]:
        """The report as JSON-compatible data; with ``pictures`` the two SVGs too. ``integer_only`` is the claim
        of :attr:`integer_only`; ``float_ops_left`` the float report (its own ``integer_only`` allows a float
        first layer, listed under ``input_layer``)."""
        data: dict[str, Any] = {
            "input": self.source, "output": self.output, "ok": self.ok, "stages": self.stages,
            "nodes_before": sum(self.ops_before.values()), "nodes_after": sum(self.ops_after.values()),
            "ops_before": self.ops_before, "ops_after": self.ops_after,
            "integer_only": self.integer_only, "has_quantizers": self.has_quantizers,
            "strict_failures": self.strict_failures(),
            "float_ops_left": None if self.float_nodes is None else self.float_nodes.to_dict(),
            "datatypes": self.datatypes,
            "cost_before": None if self.cost_before is None else self.cost_before.to_dict(),
            "cost_after": None if self.cost_after is None else self.cost_after.to_dict(),
            "layers_after": [] if self.cost_after is None else [vars(c) for c in self.cost_after.layers],
            "seconds": {**self.seconds, "stages": self.stage_seconds},
            "passes": [vars(p) for p in self.passes],
            "verification": self.verification.to_dict(),
        }
        if pictures:
            data["svg_before"] = self.svg_before()
            data["svg_after"] = self.svg_after()
        return data

    def to_json(self, **kwargs: Any) -> str:
        """:meth:`to_dict` as indented JSON."""
        return json.dumps(self.to_dict(**kwargs), indent=2, default=json_default)

    def text(self) -> str:
        """The summary the CLI prints: the sections of :data:`TEXT_SECTIONS`, in order."""
        return "\n".join(line for section in TEXT_SECTIONS for line in section(self))

    def _text_stages(self) -> list[str]:
        return [f"stages: {', '.join(self.stages)}" + ("" if self.completed else " (stopped at a failing pass)")]

    def _text_ops(self) -> list[str]:
        return _histogram_lines(self.ops_before, self.ops_after)

    def _text_float(self) -> list[str]:
        fr = self.float_nodes
        if fr is None:
            return []
        first = self.first_layer_on_float_input
        if fr.nodes:
            lines = [f"float ops left: {len(fr.nodes)}" + (" (not counting the first layer)" if first else "")]
            lines += [f"  {n.text()}" for n in fr.nodes]
        elif first:
            lines = ["float ops left: the first layer only (not integer-only)"]
        else:
            lines = ["float ops left: none (integer-only)"]
        if first:
            lines.append(f"  the first layer reads the float input: {', '.join(first)}; {INPUT_HINT}")
        if fr.dequantization:
            lines.append(f"  output dequantization (float, allowed): {', '.join(fr.dequantization)}")
        if not self.has_quantizers:
            lines.append("  the model has no quantizers (Quant, BipolarQuant, Trunc, QuantizeLinear): it is not a "
                         "quantized network, there is nothing to make integer")
        return lines

    def _text_datatypes(self) -> list[str]:
        return [f"datatypes ({kind}): " + ", ".join(f"{k} x{v}" for k, v in hist.items())
                for kind in ("weights", "activations") if (hist := self.datatypes.get(kind))]

    def _text_cost(self) -> list[str]:
        return [] if self.cost_after is None else ["cost: " + self.cost_after.text().splitlines()[0]]

    def _text_time(self) -> list[str]:
        return ["time per stage: " + ", ".join(f"{k} {v:.2f} s" for k, v in self.stage_seconds.items()),
                "time: " + ", ".join(f"{k} {v:.2f} s" for k, v in self.seconds.items())]

    def _text_verification(self) -> list[str]:
        return self.verification.text().splitlines()

    def _text_output(self) -> list[str]:
        return [f"report: {self.report_path}"] if self.report_path else []

    # -- HTML ------------------------------------------------------------------------------------------------------
    def svg_before(self) -> str:
        return self.picture_before.svg("before") if self.picture_before is not None else ""

    def svg_after(self) -> str:
        return self.picture_after.svg("after") if self.picture_after is not None else ""

    def html_fragment(self) -> str:
        """The report as an HTML fragment (styles scoped to it), for embedding and notebooks."""
        v = self.verification
        status = {True: ("ok", "verified"), False: ("bad", "verification FAILED"), None: ("off", "not verified")}[v.ok]
        claim = {True: ("ok", "integer-only"), False: ("bad", "not integer-only"), None: ("off", "")}[
            self.integer_only]
        if v.ok and (v.assumed or v.declined):
            status = ("warn", v.status + (f", {len(v.declined)} rewrite(s) declined" if v.declined else ""))
        parts = [f"<div class='fl-report'><style>{_CSS}</style>",
                 f"<h1>finnlite streamline report <span class='fl-badge fl-{status[0]}'>{status[1]}</span>"
                 + (f" <span class='fl-badge fl-{claim[0]}'>{claim[1]}</span>" if claim[1] else "") + "</h1>",
                 f"<p>{esc(self.source or 'model')}{' → ' + esc(self.output) if self.output else ''}<br>"
                 f"stages: {esc(', '.join(self.stages))}"
                 f"{'' if self.completed else ' <b>(stopped at a failing pass)</b>'}; "
                 f"nodes {sum(self.ops_before.values())} → {sum(self.ops_after.values())}</p>"]
        parts.append("<h2>Verification</h2>" + _verification_html(v))
        parts.append("<h2>Float ops left</h2>" + _float_html(self))
        parts.append("<h2>Op histogram</h2>" + _histogram_html(self.ops_before, self.ops_after))
        parts.append("<h2>Per-layer bit widths</h2>" + _widths_html(self))
        parts.append("<h2>Datatypes and inference cost</h2>" + _cost_html(self))
        parts.append("<h2>Passes</h2>" + _timings_html(self))
        parts.append("<h2>Graph</h2>" + self._graphs_html())
        parts.append(f"<script>{ZOOM_SCRIPT}</script></div>")
        return "".join(parts)

    def _graphs_html(self) -> str:
        after = self.picture_after
        counts = after.counts() if after is not None else None
        ringed = sum((counts or {}).get(k, 0) for k in ("float-left", "first-layer", "failing"))
        pictures = "".join(
            f"<div class='fl-picture'><h3>{label} ({self._count(pic)} nodes)</h3>"
            f"{zoomable(svg, label, ringed if label == 'after' else 0) if pic is not None else '<p>not drawn</p>'}"
            "</div>" for label, pic, svg in (("before", self.picture_before, self.svg_before()),
                                             ("after", after, self.svg_after())))
        note = (f"<p>{ringed} node(s) of the graph after are ringed: float nodes left, the first layer on a float "
                "input, or where verification failed.</p>" if ringed else "")
        return (f"<div class='fl-legend-box'>{legend(counts)}</div>{note}<div class='fl-pictures'>{pictures}</div>"
                "<p class='fl-note'>Colours follow the datatypes of each node's outputs (annotated, or derived as "
                "qonnx derives them), not the op type. Hover over a node for its name, tensors, shapes and "
                "datatypes. With scripts on: the mouse wheel zooms, dragging pans, the buttons fit the graph or step "
                "through the ringed nodes.</p>")

    @staticmethod
    def _count(pic: GraphPicture | None) -> int | str:
        return pic.node_count if pic is not None else "?"

    def to_html(self) -> str:
        """A complete, self-contained HTML document."""
        title = esc(f"finnlite report: {Path(self.source).name if self.source else 'model'}")
        return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>{title}</title></head>"
                f"<body>{self.html_fragment()}</body></html>\n")

    def save_html(self, path: str | Path) -> None:
        """Write :meth:`to_html` to ``path`` atomically (remembered as :attr:`report_path`)."""
        from finnlite.core.io import write_atomic

        html = self.to_html().encode("utf-8")
        write_atomic(path, lambda fh: fh.write(html))
        self.report_path = str(path)

    def _repr_html_(self) -> str:
        return self.html_fragment()

    def __repr__(self) -> str:
        state = {True: "verified", False: "verification FAILED", None: "not verified"}[self.verification.ok]
        claim = {True: ", integer-only", False: ", not integer-only", None: ""}[self.integer_only]
        return (f"<StreamlineReport {self.source or 'model'}: {sum(self.ops_before.values())} -> "
                f"{sum(self.ops_after.values())} nodes, {state}{claim}>")


#: the sections of :meth:`StreamlineReport.text`, in order (a section is a method returning its lines)
TEXT_SECTIONS: tuple[Callable[[StreamlineReport], list[str]], ...] = (
    StreamlineReport._text_stages, StreamlineReport._text_ops, StreamlineReport._text_float,
    StreamlineReport._text_datatypes, StreamlineReport._text_cost, StreamlineReport._text_time,
    StreamlineReport._text_verification, StreamlineReport._text_output)


def _strict_float_nodes(report: StreamlineReport) -> list[str]:
    fr = report.float_nodes
    if fr is None or not fr.nodes:
        return []
    names = ", ".join(f"{n.op_type} '{n.name}'" for n in fr.nodes[:5]) + (" ..." if len(fr.nodes) > 5 else "")
    return [f"{len(fr.nodes)} float op(s) left: {names}"]


def _strict_first_layer(report: StreamlineReport) -> list[str]:
    first = report.first_layer_on_float_input
    return [f"the first layer reads the float input ({', '.join(first)}); {INPUT_HINT}"] if first else []


def _strict_no_quantizers(report: StreamlineReport) -> list[str]:
    return [] if report.has_quantizers else ["the model has no quantizers: it is not a quantized network"]


def _strict_declined(report: StreamlineReport) -> list[str]:
    return [f"rewrite declined by verification: {d.describe()}" for d in report.verification.declined]


def _strict_not_computed(report: StreamlineReport) -> list[str]:
    return ["the float ops left were not computed"] if report.float_nodes is None else []


#: the reasons ``--strict`` fails a run: each function returns its reasons (empty when the run passes it)
STRICT_CHECKS: tuple[Callable[[StreamlineReport], list[str]], ...] = (
    _strict_not_computed, _strict_float_nodes, _strict_first_layer, _strict_no_quantizers, _strict_declined)


def graph_marks(model: Model, float_nodes: Any, failure: dict[str, Any] | None) -> dict[str, str]:
    """The marks of the picture of ``model`` (node name -> a key of :data:`finnlite.graphpic.MARKS`): the float
    nodes left, the first layer on a float input, the output dequantization, and the node where verification
    failed (the failing pass's node, or the producer of the tensor the final check names)."""
    marks: dict[str, str] = {}
    if float_nodes is not None:
        marks.update((name, "dequant") for name in quoted_names(float_nodes.dequantization))
        marks.update((name, "first-layer") for name in quoted_names(float_nodes.input_layer))
        marks.update((n.name, "float-left") for n in float_nodes.nodes)
    if failure:
        node = failure.get("node")
        if not node and failure.get("tensor"):
            producer = model.find_producer(failure["tensor"])
            node = producer.name if producer is not None else None
        if node:
            marks[node] = "failing"
    return marks


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
    rows = "".join(f"<tr><td>{esc(o)}</td><td class='n'>{before.get(o, 0)}</td><td class='n'>{after.get(o, 0)}</td>"
                   f"<td class='fl-bars'>{_bar(before.get(o, 0), top, 'fl-before')}"
                   f"{_bar(after.get(o, 0), top, 'fl-after')}</td></tr>" for o in ops)
    return ("<table class='fl-table fl-histogram'><tr><th>op</th><th>before</th><th>after</th>"
            "<th><span class='fl-key fl-before'></span> before <span class='fl-key fl-after'></span> after</th></tr>"
            f"{rows}<tr class='fl-total'><td>total</td><td class='n'>{sum(before.values())}</td>"
            f"<td class='n'>{sum(after.values())}</td><td></td></tr></table>")


def _verification_html(v: VerificationResult) -> str:
    if v.mode == "off":
        return "<p>Verification was off.</p>"
    out = [f"<p>mode <b>{esc(v.mode)}</b>; reference data: {esc(v.reference)}; {v.seconds:.2f} s</p>"]
    if v.assumed:
        out.append(f"<div class='fl-warning'>{esc(v.status)}: {esc(v.assumed_hint())}</div>")
    for note in v.notes:
        out.append(f"<p class='fl-note'>{esc(note)}</p>")
    if v.declined:
        rows = "".join(f"<tr><td>{esc(d.stage or '')}</td><td>{esc(d.pass_name)}</td><td class='n'>"
                       f"{d.iteration or ''}</td><td>{esc(d.anchor)}</td><td>{esc(d.match or '')}</td>"
                       f"<td>{esc(d.tensor or '')}</td><td>{esc(d.message)}</td></tr>" for d in v.declined)
        out.append(f"<h3>Rewrites declined by verification ({len(v.declined)})</h3><p>Each broke its pass's check; it "
                   "was undone and not performed again, and the model is correct without it.</p><table "
                   "class='fl-table'><tr><th>stage</th><th>pass</th><th>round</th><th>at node</th><th>matched</th>"
                   f"<th>failing tensor</th><th>check</th></tr>{rows}</table>")
    if v.failure is not None:
        f = v.failure
        out.append(f"<div class='fl-failure'><b>{esc(f.get('pass') or 'final check')}</b> failed"
                   f"{' (stage ' + esc(f['stage']) + ')' if f.get('stage') else ''}: {esc(f['message'])}</div>")
    if v.checks:
        rows = "".join(
            f"<tr class='{'' if c.ok else 'fl-fail'}'><td>{esc(c.stage or '')}</td><td>{esc(c.pass_name)}</td>"
            f"<td class='n'>{c.iteration or ''}</td><td>{esc(c.policy)}</td>"
            f"<td class='n'>{'' if c.changed_nodes is None else c.changed_nodes}</td>"
            f"<td class='n'>{'' if c.region_nodes is None else c.region_nodes}</td><td class='n'>{c.near_ties}</td>"
            f"<td class='n'>{c.seconds:.3f}</td><td>{'ok' if c.ok else 'FAILED: ' + esc(c.message)}</td></tr>"
            for c in v.checks)
        out.append("<h3>Per-pass checks</h3><table class='fl-table'><tr><th>stage</th><th>pass</th><th>round</th>"
                   "<th>policy</th><th>changed nodes</th><th>nodes run</th><th>near-ties</th><th>s</th>"
                   f"<th>result</th></tr>{rows}</table>")
    if v.final is not None:
        rows = "".join(
            f"<tr class='{'' if o.ok else 'fl-fail'}'><td>{esc(o.name)}</td><td>{esc(o.compared_as)}</td>"
            f"<td class='n'>{o.samples - len(o.error_samples)}/{o.samples}</td><td class='n'>{o.agree32}/{o.samples}"
            f"</td><td class='n'>{len(o.near_tie_samples)}</td><td class='n'>{o.max_error64:.3g} {esc(o.unit)}</td>"
            "</tr>" for o in v.final.outputs)
        out.append("<h3>Final check against the original</h3><table class='fl-table'><tr><th>output</th>"
                   "<th>compared as</th><th>agrees with float64</th><th>agrees with float32</th>"
                   f"<th>near-tie samples</th><th>max deviation</th></tr>{rows}</table>")
        for site in v.final.tie_sites:
            out.append(f"<p class='fl-note'>near-tie {esc(site.describe())}</p>")
    return "".join(out)


def _float_html(report: StreamlineReport) -> str:
    fr = report.float_nodes
    if fr is None:
        return "<p>not computed</p>"
    first = report.first_layer_on_float_input
    out = []
    if report.integer_only:
        out.append("<p>integer-only: no float node is left.</p>")
    if fr.nodes:
        out.append(f"<p><b>{len(fr.nodes)}</b> float node(s) left:</p><ul>"
                   + "".join(f"<li>{esc(n.text())}</li>" for n in fr.nodes) + "</ul>")
    if first:
        out.append(f"<div class='fl-failure'><b>Not integer-only: the first layer reads the float input</b> "
                   f"({esc(', '.join(first))}). {esc(INPUT_HINT[0].upper() + INPUT_HINT[1:])}.</div>")
    if fr.dequantization:
        out.append(f"<p>output dequantization (float, allowed): {esc(', '.join(fr.dequantization))}</p>")
    if not report.has_quantizers:
        out.append("<div class='fl-failure'>The model has no quantizers: it is not a quantized network, there is "
                   "nothing to make integer.</div>")
    return "".join(out)


def _widths_html(report: StreamlineReport) -> str:
    from finnlite.plots import layer_widths_chart

    cost = report.cost_after
    if cost is None or not cost.layers:
        return "<p>no MAC layer</p>" if cost is not None else "<p>not computed</p>"
    rows = "".join(f"<tr><td class='n'>{i + 1}</td><td>{esc(c.node)}</td><td>{esc(c.op_type)}</td>"
                   f"<td>{esc(c.weight_dt)}</td><td>{esc(c.input_dt)}</td><td>{esc(c.acc_dt)}</td>"
                   f"<td>{esc(c.finn_output_dt)}</td></tr>" for i, c in enumerate(cost.layers))
    return (f"<div class='fl-chart-box'>{layer_widths_chart(cost)}</div>"
            "<p class='fl-note'>The widths FINN builds each MAC layer with: the weights' and the input's datatypes, "
            "the accumulator FINN's MinimizeAccumulatorWidth sizes from the weights and the input range, and the "
            "output (the fused MultiThreshold's). A float width has no bar.</p>"
            "<details><summary>table</summary><table class='fl-table'><tr><th>#</th><th>layer</th><th>op</th>"
            f"<th>weight</th><th>input</th><th>accumulator</th><th>output</th></tr>{rows}</table></details>")


def _cost_html(report: StreamlineReport) -> str:
    out = []
    for kind in ("weights", "activations"):
        hist = report.datatypes.get(kind) or {}
        if hist:
            out.append(f"<p>{kind}: " + ", ".join(f"{esc(k)} ×{v}" for k, v in hist.items()) + "</p>")
    for label, cost in (("before", report.cost_before), ("after", report.cost_after)):
        if cost is not None:
            out.append(f"<h3>Inference cost {label}</h3><pre>{esc(cost.text())}</pre>")
    return "".join(out) or "<p>not computed</p>"


def _timings_html(report: StreamlineReport) -> str:
    top = max([p.seconds for p in report.passes] + [1e-9])

    def table(passes: list[PassTiming]) -> str:
        rows = "".join(f"<tr><td>{esc(p.stage)}</td><td>{esc(p.name)}</td><td class='n'>{p.runs}</td>"
                       f"<td class='n'>{p.changed}</td><td class='n'>{'' if p.rewrites is None else p.rewrites}</td>"
                       f"<td class='n'>{p.seconds:.3f}</td><td class='fl-bars'>{_bar(p.seconds, top, 'fl-after')}"
                       "</td></tr>" for p in passes)
        return ("<table class='fl-table'><tr><th>stage</th><th>pass</th><th>runs</th><th>runs that changed</th>"
                f"<th>rewrites</th><th>s</th><th></th></tr>{rows}</table>")

    changed = [p for p in report.passes if p.changed]
    idle = [p for p in report.passes if not p.changed]
    stages = ", ".join(f"{esc(k)} {v:.2f} s" for k, v in report.stage_seconds.items())
    other = ", ".join(f"{esc(k)} {v:.2f} s" for k, v in report.seconds.items())
    return (f"<p>stages: {stages}<br>{other}</p>"
            f"<h3 class='fl-changed'>{len(changed)} pass(es) changed the graph</h3>{table(changed)}"
            f"<details class='fl-idle'><summary>{len(idle)} pass(es) changed nothing</summary>{table(idle)}"
            "</details>")


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
.fl-scroll.fl-pan{overflow:hidden;height:80vh;cursor:grab;touch-action:none}
.fl-tools{margin:4px 0}.fl-tools button{margin-right:4px}.fl-hint{color:#666;font-size:12px;margin-left:6px}
.fl-chart-box{overflow-x:auto}
.fl-note{color:#666;font-size:12px}
.fl-report pre{background:#f6f6f6;padding:6px}
"""
