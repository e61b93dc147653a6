"""Float64 execution of what a model version means: the judge of a one-level difference at a float32 near-tie.

A version the pipeline made stores float32 roundings of exact values: the constants of the Mul/Add nodes that
folded scales (:mod:`streamline.exact`) and the thresholds of MultiThresholds (:mod:`streamline.real_thresholds`:
the least float32 ``T ≥ R``). Run in float64 as stored, such a version still decides each level by a float32
number: a threshold sits up to one float32 step above the real one, which is exactly the zone where float32
rounding decides a level. So its float64 run cannot tell a near-tie from a broken rewrite.

:class:`Real64` runs a structural copy that stores, instead, the float64 roundings of the exact values: every
Mul/Add with an exact constant gets that constant in float64, every MultiThreshold with real thresholds on an input
that is not an integer tensor gets the least float64 ``T ≥ R`` (``> R`` where strict), so that ``x ≥ T`` decides
``x ≥ R`` exactly for every float64 ``x`` (on an integer input the integer thresholds ``⌈R⌉`` already decide it
exactly). Its float64 execution is then what the version means in real arithmetic, up to float64 rounding
(relative ``2^-52``), as float64 execution of the original is. Only the nodes a request needs are converted and
run.
"""

from __future__ import annotations

import logging
from collections import ChainMap
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from finnlite.core.clone import clone_model
from finnlite.core.datatypes import is_integer_type
from finnlite.core.model import Model
from finnlite.core.traverse import constant_tensors, topo_order
from streamline.exact import EXACT_KEY, const_operand, exact_value
from streamline.real_thresholds import encoded_real_thresholds
from verify.region import run_nodes

log = logging.getLogger(__name__)

__all__ = ["Real64"]


def _exact64(values: np.ndarray) -> np.ndarray:
    return np.asarray([float(v) for v in np.asarray(values, dtype=object).ravel()],
                      dtype=np.float64).reshape(np.shape(values))


def _rounds_to(exact: np.ndarray, stored: np.ndarray) -> bool:
    """Whether the float32 roundings of the ``exact`` values are the ``stored`` constant, to one float32 step (the
    rounding through float64 may differ from the direct one by a step)."""
    rounded = _exact64(exact).astype(np.float32).ravel()
    value = np.asarray(stored, np.float32).ravel()
    if rounded.size != value.size:
        if rounded.size != 1 and value.size != 1:
            return False
        rounded, value = np.broadcast_arrays(rounded, value)
    with np.errstate(invalid="ignore"):
        return bool(((rounded == value) | (np.abs(rounded - value) <= np.spacing(np.abs(value)))).all())


class Real64:
    """Float64 execution of what ``model`` means (module docstring), on a copy: later edits of ``model`` do not
    reach it. :meth:`values` runs the nodes some tensors need on one sample."""

    def __init__(self, model: Model) -> None:
        self.copy = clone_model(model)
        self._converted: set[int] = set()
        self._constants: set[str] | None = None

    def _convert(self, node: Any) -> None:
        """Store ``node``'s exact constant, or the float64 form of its real thresholds, as float64 (once)."""
        if id(node) in self._converted:
            return
        self._converted.add(id(node))
        copy = self.copy
        if node.op_type in ("Mul", "Add") and node.metadata_props.get(EXACT_KEY):
            c = const_operand(node)
            if c is None:
                return
            index, value = c
            fractions = exact_value(node, value)
            if not _rounds_to(fractions, value):
                return  # a constant changed without its exact value: run what is stored
            exact = _exact64(fractions)
            if exact.size != np.size(value):
                exact = np.broadcast_to(exact, np.shape(value))
            node.replace_input_with(index, copy.add_initializer(exact.reshape(np.shape(value)),
                                                                prefix=f"{node.name}_exact64"))
        elif node.op_type == "MultiThreshold" and len(node.inputs) > 1 and node.inputs[1] is not None:
            if is_integer_type(copy.get_tensor_datatype(node.inputs[0].name)):
                return  # integer thresholds decide an integer input exactly
            t = copy.get_initializer(node.inputs[1].name)
            rt = encoded_real_thresholds(node, t) if t is not None else None
            if rt is None:
                return  # no real thresholds, or stored ones that are not their float32 form: run what is stored
            rows = np.shape(t)[0]
            t64 = rt.float_thresholds(np.float64)
            if t64.shape[0] != rows:
                t64 = np.broadcast_to(t64, (max(rows, t64.shape[0]), t64.shape[1])).copy()
            node.replace_input_with(1, copy.add_initializer(t64, prefix=f"{node.name}_thr64"))

    def _needed(self, names: Iterable[str], known: Mapping[str, Any]) -> list[Any]:
        """The nodes of the copy that ``names`` depend on and whose outputs are not all ``known``, in topological
        order."""
        todo = [self.copy.find_producer(n) for n in names if n not in known]
        seen: dict[int, Any] = {}
        while todo:
            node = todo.pop()
            if node is None or id(node) in seen or all(o.name in known for o in node.outputs):
                continue
            seen[id(node)] = node
            todo.extend(v.producer() for v in node.inputs if v is not None and v.producer() is not None)
        return topo_order(list(seen.values()))

    def values(self, inputs: Mapping[str, np.ndarray], names: Iterable[str],
               known: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """The float64 values of tensors ``names`` of the copy on one sample's graph ``inputs`` (names the copy
        does not have are left out). ``known``: the float64 values computed before on the same sample (from this
        copy), read instead of computed again; everything computed now is added to it."""
        known = {} if known is None else known
        return self.values_of([inputs], names, [known])[0]

    def values_of(self, samples: Sequence[Mapping[str, np.ndarray]], names: Iterable[str],
                  known: Sequence[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        """:meth:`values` for several samples at once (one executor); ``known[i]`` (one dict per sample, holding
        the same tensors for every sample) is read and extended."""
        names = [n for n in names if self.copy.value(n) is not None]
        nodes = self._needed(names, known[0])
        if nodes:
            for node in nodes:
                self._convert(node)
            if self._constants is None:
                self._constants = constant_tensors(self.copy)
            feeds = [ChainMap({k: np.asarray(v) for k, v in x.items()}, k) for x, k in zip(samples, known)]
            results = run_nodes(self.copy, nodes, feeds, set(), self._constants, np.float64)
            for k, result in zip(known, results):
                # arrays only: an Im2Col's windows stay a recomputation (verify.cache), made again if read
                k.update({name: v for name, v in dict.items(result) if isinstance(v, np.ndarray)})
        return [{n: k[n] for n in names if n in k} for k in known]
