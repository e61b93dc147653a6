"""The corpus of Brevitas exports (``tests/corpus/export.py``): where its models are, and one check of a model.

Models live in ``tests/corpus/models/`` (committed, < 1 MB each) and in ``$FINNLITE_CORPUS`` (default
``~/.cache/finnlite/corpus``, the larger ones); each directory has a ``manifest.json``. :func:`check_model` runs
the default pipeline (:func:`finnlite.build.streamline`, what the CLI runs, with its default per-pass checks) and
measures what the corpus test asserts and the corpus report (``python -m bench.corpus``) prints:

* integer-only: no interior float node (:func:`finnlite.float_report.float_report`), no Quant / BipolarQuant / Trunc /
  BatchNormalization left, and each output's dequantization at most one Mul and one Add (and shape ops);
* at most one Transpose per image or sequence (4-D or 3-D) graph input (one at least), and one per such graph
  output (its way back to NCHW/NCW at the tail);
* exact: agreement with float64 execution of the original on 32 inputs drawn from the manifest's input range (the
  input quantizer's), through :func:`verify.final_check` (the CLI's final check).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
COMMITTED = HERE / "models"
#: ops that must not survive the pipeline
LEFTOVER_OPS = ("Quant", "BipolarQuant", "Trunc", "BatchNormalization")
_SHAPE_OPS = ("Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity")


def cache_dir() -> Path:
    """``$FINNLITE_CORPUS`` or ``~/.cache/finnlite/corpus``."""
    return Path(os.environ.get("FINNLITE_CORPUS", Path.home() / ".cache" / "finnlite" / "corpus"))


def _manifest(directory: Path) -> dict[str, dict[str, Any]]:
    path = directory / "manifest.json"
    if not path.is_file():
        return {}
    with open(path, encoding="utf-8") as f:
        entries = json.load(f)
    for entry in entries.values():
        entry["dir"] = str(directory)
    return entries


def manifest_entries(directory: Path) -> dict[str, dict[str, Any]]:
    """The entries of ``directory/manifest.json`` (with ``dir``); empty when it is absent."""
    return _manifest(directory)


def committed_entries(subdir: str | None = None) -> dict[str, dict[str, Any]]:
    """The committed models' manifest entries (with ``dir``): the corpus of ``tests/corpus/models``, or with
    ``subdir`` a recipe folder of it (``recipes_layout``: ``tests/corpus/export_recipes_layout.py``)."""
    return {k: e for k, e in _manifest(_folder(COMMITTED, subdir)).items() if not e.get("cached")}


def corpus_names(subdir: str | None = None) -> set[str]:
    """Every model of the corpus (or recipe folder), committed or cached (the committed manifest lists both)."""
    return set(_manifest(_folder(COMMITTED, subdir)))


def cached_entries(subdir: str | None = None) -> dict[str, dict[str, Any]]:
    """The cache directory's manifest entries (with ``dir``); empty when the cache is absent. With ``subdir``:
    the recipe folder's, in the cache's folder of that name."""
    return _manifest(_folder(cache_dir(), subdir))


def _folder(base: Path, subdir: str | None) -> Path:
    return base / subdir if subdir else base


def model_path(entry: dict[str, Any]) -> Path:
    return Path(entry["dir"]) / entry["file"]


@dataclass
class CorpusResult:
    """What the pipeline made of one corpus model."""

    name: str
    nodes_before: int = 0
    nodes_after: int = 0
    float_nodes: list[str] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)
    tail: list[str] = field(default_factory=list)
    #: the output dequantization of each graph output (op types), when the outputs are several
    tails: list[list[str]] = field(default_factory=list)
    transposes: int = 0
    #: Transposes allowed: one per image or sequence (3-D or 4-D, channels on axis 1) graph input, at least one, and
    #: one per such graph output (computed channels-last, an NCHW/NCW output needs its Transpose back, at the tail,
    #: as such an input at the head)
    transposes_allowed: int = 1
    exact: bool | None = None
    mismatch: str = ""
    seconds: float = 0.0
    #: the op histogram of the result
    ops: dict[str, int] = field(default_factory=dict)
    crash: str = ""
    verification: str = ""

    @property
    def tail_ok(self) -> bool:
        """At most one Mul and one Add (and shape ops) dequantize each graph output."""
        for ops in self.tails or [[t.split(" ", 1)[0] for t in self.tail]]:
            arithmetic = [o for o in ops if o not in _SHAPE_OPS]
            if not all(o in ("Mul", "Add") for o in arithmetic) or ops.count("Mul") > 1 or ops.count("Add") > 1:
                return False
        return True

    def problems(self) -> list[str]:
        """Every requirement the result misses, one line each (empty: the model passes)."""
        if self.crash:
            return [f"pipeline crashed: {self.crash}"]
        out = []
        if self.verification:
            out.append(f"the pipeline's verification failed: {self.verification}")
        if self.float_nodes:
            out.append(f"{len(self.float_nodes)} float node(s) left: {', '.join(self.float_nodes[:4])}")
        if self.leftovers:
            out.append(f"left over: {', '.join(self.leftovers)}")
        if not self.tail_ok:
            out.append(f"output dequantization is more than one Mul and one Add: {', '.join(self.tail)}")
        if self.transposes > self.transposes_allowed:
            out.append(f"{self.transposes} Transposes (at most {self.transposes_allowed}: one per image or sequence "
                       "input and output)")
        if self.exact is False:
            out.append(f"differs from float64 execution of the original: {self.mismatch}")
        return out


def input_ranges(model: Any, entry: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """The manifest's input range of each graph input, by name: one ``[lo, hi]`` for a model with one input, one
    range per input (in the graph's input order) for a model with several."""
    names = [v.name for v in model.graph.inputs]
    ranges = entry["input_range"]
    if not isinstance(ranges[0], (list, tuple)):
        ranges = [ranges] * len(names)
    if len(ranges) != len(names):
        raise ValueError(f"the manifest gives {len(ranges)} input ranges for the {len(names)} inputs {names}")
    return {name: (float(lo), float(hi)) for name, (lo, hi) in zip(names, ranges)}


def check_model(name: str, entry: dict[str, Any], samples: int = 32, seed: int = 0,
                verify: str = "each", inputs: Any = None) -> CorpusResult:
    """Run the default pipeline on the corpus model ``entry`` and measure it (module docstring). ``verify``: the
    pipeline's own verification mode (the CLI's default, per-pass checks, unless told otherwise); its failure is
    a problem like the others. ``inputs``: the reference inputs of the final comparison (an array of samples for
    the model's one input, e.g. a test set) instead of ``samples`` random ones over the manifest's input range."""
    from finnlite import Model
    from finnlite.build import streamline
    from verify import ReferenceData, final_check

    result = CorpusResult(name)
    model = Model(model_path(entry))
    result.nodes_before = len(model)
    images = [sum(1 for v in values if v.shape is not None and len(v.shape) in (3, 4))
              for values in (model.graph.inputs, model.graph.outputs)]
    result.transposes_allowed = max(1, images[0]) + images[1]
    if inputs is not None:
        reference = ReferenceData(model, inputs, source=f"{len(inputs)} given inputs")
    else:
        reference = ReferenceData.random(model, n=samples, seed=seed, ranges=input_ranges(model, entry))
    t0 = time.perf_counter()
    try:
        report = streamline(model, verify=verify, extras=False)
    except Exception as exc:  # noqa: BLE001 - a crash is a result the corpus records
        result.seconds = time.perf_counter() - t0
        result.crash = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        return result
    result.seconds = time.perf_counter() - t0
    if report.error is not None:
        result.verification = " ".join(str(report.error).split())[:300]
    elif report.verification.declined:  # healing must never hide a wrong rewrite from the corpus
        result.verification = "declined: " + "; ".join(d.describe() for d in report.verification.declined)[:300]
    result.nodes_after = len(model)
    floats = report.float_nodes
    if floats is not None:
        result.float_nodes = [f"{n.op_type} '{n.name}'" for n in floats.nodes]
        result.tail = list(floats.dequantization)
    if len(model.graph.outputs) > 1:
        from verify.final import integer_tail

        for out in model.graph.outputs:
            found = integer_tail(model, out.name)
            result.tails.append([n.op_type for n in found[1]] if found is not None else ["(no integer tensor)"])
    ops = model.op_histogram()
    result.ops = dict(ops)
    result.leftovers = [f"{ops[o]} {o}" for o in LEFTOVER_OPS if ops.get(o)]
    result.transposes = ops.get("Transpose", 0)
    try:
        final = final_check(reference, model)
    except Exception as exc:  # noqa: BLE001 - recorded as a mismatch
        result.exact = False
        result.mismatch = f"final check failed to run: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
        return result
    result.exact = final.ok
    if not final.ok:
        worst = [o for o in final.outputs if o.error_samples]
        result.mismatch = "; ".join(f"{len(o.error_samples)}/{o.samples} samples, max {o.max_error64:.3g} {o.unit}"
                                    for o in worst) or (final.float64_error or "")
    return result
