"""The corpus report: ``python -m bench.corpus [NAME ...]``.

Runs the default pipeline on every model of the Brevitas export corpus (``tests/corpus/models`` and, when present,
``$FINNLITE_CORPUS``; see ``tests/corpus/check.py``) and prints one row per model: nodes before/after, float nodes
left, Transposes, whether it agrees with float64 execution of the original on 32 inputs (exact), the pipeline's
time, and what keeps it from passing. Exporter failures recorded in the manifests are listed after the table.
"""

from __future__ import annotations

import argparse
import logging
import sys

from tests.corpus.check import cached_entries, check_model, committed_entries


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.corpus", description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", help="only these models (default: all)")
    ap.add_argument("--samples", type=int, default=32)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    entries = {**committed_entries(), **cached_entries()}
    if not cached_entries():
        print("(no cache directory manifest: the models over 1 MB are not included; see tests/corpus/export.py)")
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
        r = check_model(name, entry, samples=args.samples)
        problems = r.problems()
        passing += not problems
        exact = "crash" if r.crash else ("yes" if r.exact else "no")
        print(f"| {name:28} | {r.nodes_before:6} | {r.nodes_after:5} | {len(r.float_nodes):9} | {r.transposes:10} | "
              f"{exact:5} | {r.seconds:8.2f} | {'; '.join(problems)[:160]}", flush=True)
    total = len([n for n in names if "error" not in entries[n]])
    print(f"\n{passing} of {total} models pass every requirement")
    for name, entry in failed_exports.items():
        print(f"export failed: {name}: {entry['error'][:200]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
