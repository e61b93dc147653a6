"""The corpus report: ``python -m bench.corpus [NAME ...]``.

Runs the default pipeline on every model of the Brevitas export corpus (``tests/corpus/models`` and, when present,
``$FINNLITE_CORPUS``; see ``tests/corpus/check.py``) and prints one row per model: nodes before/after, float nodes
left, Transposes, whether it agrees with float64 execution of the original on 32 inputs (exact), the pipeline's
time, and what keeps it from passing. Exporter failures recorded in the manifests are listed after the table.
``--set NAME`` reports a sub-corpus instead (``tests/corpus/models/NAME`` and ``$FINNLITE_CORPUS/NAME``, e.g.
``recipes_ptq``); a model with a test set (``test_set`` in its entry) is compared on every test image.
"""

from __future__ import annotations

import argparse
import logging
import sys

import numpy as np

from tests.corpus.check import COMMITTED, cache_dir, cached_entries, check_model, committed_entries, manifest_entries


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.corpus", description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", help="only these models (default: all)")
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--width", type=int, default=160, help="characters of the problem column")
    ap.add_argument("--verify", default="each", choices=("each", "final", "off"),
                    help="the pipeline's own verification (default: each pass, as the CLI)")
    ap.add_argument("--set", default=None, help="a sub-corpus: tests/corpus/models/SET and $FINNLITE_CORPUS/SET")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    if args.set:
        small = {k: e for k, e in manifest_entries(COMMITTED / args.set).items() if not e.get("cached")}
        cached = manifest_entries(cache_dir() / args.set)
    else:
        small, cached = committed_entries(), cached_entries()
    entries = {**small, **cached}
    if not cached:
        print("(no cache directory manifest: the models over 1 MB are not included; see tests/corpus/export*.py)")
    names = args.names or sorted(entries)
    failed_exports = {n: e for n, e in entries.items() if "error" in e and n in names}
    header = f"| {'model':28} | before | after | float ops | Transposes | exact | time (s) | problem"
    print(header)
    print("|" + "|".join("-" * len(c) for c in header.split("|")[1:]))
    passing = 0
    for name in names:
        entry = entries.get(name)
        if entry is None:
            print(f"unknown model {name}", file=sys.stderr)
            return 2
        if "error" in entry:
            continue
        inputs = None
        if entry.get("test_set"):
            inputs = np.load(f"{entry['dir']}/{entry['test_set']}")["x"].astype(np.float32)
        r = check_model(name, entry, samples=args.samples, inputs=inputs, verify=args.verify)
        problems = r.problems()
        passing += not problems
        exact = "crash" if r.crash else ("yes" if r.exact else "no")
        print(f"| {name:28} | {r.nodes_before:6} | {r.nodes_after:5} | {len(r.float_nodes):9} | {r.transposes:10} | "
              f"{exact:5} | {r.seconds:8.2f} | {'; '.join(problems)[:args.width]}", flush=True)
    total = len([n for n in names if "error" not in entries[n]])
    print(f"\n{passing} of {total} models pass every requirement")
    for name, entry in failed_exports.items():
        print(f"export failed: {name}: {entry['error'][:200]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
