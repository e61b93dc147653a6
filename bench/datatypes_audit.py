"""Are a streamlined model's datatype annotations the tightest that hold? ``python -m bench.datatypes_audit [NAME ...]``

Streamlines every zoo model (``$FINNLITE_ZOO``) and committed corpus model (``tests/corpus/models``) with the
default pipeline (no verification) and compares each integer annotation FINN reads with the tightest datatype
(fewest bits; :func:`finnlite.core.datatypes.tightest_datatype`) that holds what can be derived:

* **weight**: an integer-annotated initializer, against its values;
* **thresholds**: a MultiThreshold's integer-annotated thresholds, against their values and the range of the
  node's input datatype (FINN's Thresholding compares the input in the thresholds' type, so that type must hold
  the input's range: finnlite's RoundAndClipThresholds annotates that union);
* **out_dtype**: a MultiThreshold's attribute, against its levels ``out_bias + out_scale·[0..N]`` (the counts
  ``[0..N]`` when the levels are not integers: qonnx then annotates the output FLOAT32);
* **tensor**: any other integer-annotated node output, against its derived range: the pipeline's
  (:func:`streamline.datatypes.infer_ranges`) intersected with the verifier's (:func:`verify.derived_ranges`).

An annotation is *looser* when it has more bits than the tightest, *false* when it does not hold; *float* counts
node outputs annotated FLOAT32 (or not at all) whose range is derived as integer. One row per model, then every
annotation that is not tight.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from finnlite.core.datatypes import BaseDataType, is_integer_type, parse_datatype, tightest_datatype
from finnlite.core.model import Model
from streamline.datatypes import infer_ranges
from streamline.pipeline import streamline_model
from verify.annotations import derived_ranges

ROOT = Path(__file__).resolve().parents[1]


def models() -> Iterator[tuple[str, Path]]:
    """(name, path) of every zoo and committed corpus model."""
    from tests.corpus.check import committed_entries, model_path
    from tests.zoo import ZOO_MODELS, zoo_available, zoo_dir

    if zoo_available():
        for name in ZOO_MODELS:
            yield f"zoo/{name}", zoo_dir() / f"{name}.onnx"
    for name, entry in sorted(committed_entries().items()):
        if "error" not in entry:
            yield f"corpus/{name}", model_path(entry)


def _fits(dt: BaseDataType, lo: float, hi: float, has_zero: bool) -> bool:
    return dt.min() <= lo and hi <= dt.max() and not (dt.name == "BIPOLAR" and has_zero)


def audit(model: Model) -> list[tuple[str, str, str, str, str]]:
    """``[(kind, tensor, annotation, tightest, verdict)]`` for every integer annotation (module docstring); the
    verdict is ``tight``, ``looser`` or ``false``."""
    rows = []

    def judge(kind: str, name: str, dt: BaseDataType, lo: float, hi: float, has_zero: bool) -> None:
        best = tightest_datatype(lo, hi, has_zero)
        verdict = "false" if not _fits(dt, lo, hi, has_zero) else \
            ("looser" if dt.bitwidth() > best.bitwidth() else "tight")
        rows.append((kind, name, dt.name, best.name, verdict))

    thresholded = {}  # threshold initializer -> its MultiThreshold's integer input datatype
    for node in model.graph:
        if node.op_type == "MultiThreshold" and len(node.inputs) > 1 and node.inputs[1] is not None:
            x = node.inputs[0].name
            idt = model.get_tensor_datatype(x) if model.has_tensor_datatype(x) else None
            if is_integer_type(idt):
                thresholded[node.inputs[1].name] = idt
    for name, v in model.graph.initializers.items():
        if v.const_value is None or not model.has_tensor_datatype(name):
            continue
        dt = model.get_tensor_datatype(name)
        if not is_integer_type(dt):
            continue
        arr = np.asarray(v.const_value.numpy(), dtype=np.float64)
        if arr.size and np.array_equal(arr, np.rint(arr)):
            lo, hi, has_zero = float(arr.min()), float(arr.max()), bool((arr == 0).any())
            idt = thresholded.get(name)
            if idt is not None:  # FINN compares the input in the thresholds' type: it must hold the input's range
                lo, hi = min(lo, float(idt.min())), max(hi, float(idt.max()))
                has_zero = has_zero or idt.name != "BIPOLAR"
            judge("thresholds" if idt is not None else "weight", name, dt, lo, hi, has_zero)
        else:
            rows.append(("weight", name, dt.name, "FLOAT32", "false"))
    ours, theirs = infer_ranges(model), derived_ranges(model)
    for node in model.graph:
        if node.op_type == "MultiThreshold" and "out_dtype" in node.attributes:
            dt = parse_datatype(node.attributes["out_dtype"].value)
            n = int(node.inputs[1].const_value.shape[-1])
            scale = node.attributes["out_scale"].value if "out_scale" in node.attributes else 1.0
            bias = node.attributes["out_bias"].value if "out_bias" in node.attributes else 0.0
            levels = bias + scale * np.arange(n + 1, dtype=np.float64)
            if not np.array_equal(levels, np.rint(levels)):
                levels = np.arange(n + 1, dtype=np.float64)
            judge("out_dtype", node.outputs[0].name, dt, float(levels.min()), float(levels.max()),
                  bool((levels == 0).any()))
        for out in node.outputs:
            dt = model.get_tensor_datatype(out.name) if model.has_tensor_datatype(out.name) else None
            bounds = []
            r = ours.get(out.name)
            if r is not None and r.integer and np.isfinite(r.lo) and np.isfinite(r.hi):
                bounds.append((r.lo, r.hi, not r.bipolar))
            d = theirs.get(out.name)
            if d is not None and d[2]:
                bounds.append((d[0], d[1], d[3]))
            if not is_integer_type(dt):  # a float claim where an integer range is derived: FINN sees a float
                if bounds:
                    rows.append(("tensor", out.name, dt.name if dt is not None else "none", "integer", "float"))
                continue
            if not bounds:
                rows.append(("tensor", out.name, dt.name, "?", "underived"))
                continue
            lo, hi = max(b[0] for b in bounds), min(b[1] for b in bounds)
            judge("tensor", out.name, dt, lo, hi, all(b[2] for b in bounds) and lo <= 0 <= hi)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.datatypes_audit", description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", help="only these models (e.g. zoo/tfc_2w2a corpus/act_tanh_ts)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    details: list[str] = []
    totals: dict[str, int] = {}
    kinds = ("weight", "thresholds", "out_dtype", "tensor", "looser", "false", "float", "underived")
    print("| model | " + " | ".join(kinds) + " |")
    print("|---" * (len(kinds) + 1) + "|")
    for name, path in models():
        if args.names and name not in args.names:
            continue
        model = Model(str(path))
        try:
            streamline_model(model)
        except Exception as exc:  # noqa: BLE001 - a model the pipeline rejects is listed, not audited
            print(f"| {name} | pipeline failed: {str(exc)[:80]} |")
            continue
        rows = audit(model)
        count = {k: sum(r[0] == k and r[4] != "float" for r in rows) for k in kinds[:4]}
        count.update({v: sum(r[4] == v for r in rows) for v in kinds[4:]})
        for k, v in count.items():
            totals[k] = totals.get(k, 0) + v
        print(f"| {name} | " + " | ".join(str(count[k]) for k in kinds) + " |", flush=True)
        details += [f"{name}: {kind} {tensor}: {ann}, tightest {best} ({verdict})"
                    for kind, tensor, ann, best, verdict in rows if verdict != "tight"]
    print("| total | " + " | ".join(str(totals.get(k, 0)) for k in kinds) + " |")
    for line in details:
        print(line)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
