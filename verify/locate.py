"""Where a final-check failure starts: the first intermediate tensor that diverges from the original.

The streamlined model and the original share many tensor names (a quantizer's output keeps its name when it becomes
a MultiThreshold), but not their encodings: the original holds ``s·(q − z)``, the streamlined model the integer
``q`` (or an accumulator without its scale and bias), possibly in NHWC layout. For a correct model the original's
value is, per channel, a function of the streamlined integer (an affine map with the channel's scale and bias:
``s_c·q + b_c``, negative ``s_c`` included). So a shared tensor *diverges* when, in some channel, one streamlined
level meets two different original values over the samples and positions compared (float64 execution of the
original, relative tolerance :data:`RTOL` of the channel's magnitude). The first such tensor in the streamlined
model's topological order, and its producer, are reported. Only integer-annotated tensors of the streamlined model
are compared (for a float tensor equal keys are a coincidence), and only where the shapes agree up to the NCHW to
NHWC permutation. A divergence that never meets an equal level twice is not seen; the output is then named alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from custom_ops.subgraph import executor_with_outputs
from finnlite.core.model import Model
from finnlite.core.traverse import constant_tensors, node_label, topo_order
from verify.compare import is_integer_tensor

__all__ = ["Divergence", "first_divergence", "RTOL"]

RTOL = 1e-6


@dataclass
class Divergence:
    """The first diverging tensor, its producer node in the streamlined model and what shows it."""

    tensor: str
    node: str | None
    detail: str

    def describe(self) -> str:
        where = f"node '{self.node}', " if self.node else ""
        return f"first diverging tensor: {where}tensor '{self.tensor}' ({self.detail})"


def _align(s: np.ndarray, o: np.ndarray, nhwc: bool) -> tuple[np.ndarray, np.ndarray] | None:
    """Both as ``[samples, C, rest]`` (channel second), or None if the shapes do not correspond."""
    if o.ndim == 5 and s.ndim == 5 and (nhwc or (s.shape != o.shape and np.moveaxis(o, 2, 4).shape == s.shape)):
        o, nhwc = np.moveaxis(o, 2, 4), True  # [samples, N, C, H, W] vs [samples, N, H, W, C]
    if s.shape != o.shape or s.ndim < 3:
        return None
    chan = s.ndim - 1 if nhwc else 2
    s, o = np.moveaxis(s, chan, 1), np.moveaxis(o, chan, 1)
    return s.reshape(s.shape[0], s.shape[1], -1), o.reshape(o.shape[0], o.shape[1], -1)


def _conflict(s: np.ndarray, o: np.ndarray) -> str | None:
    """Why the original's values ``o`` are not a function of the levels ``s`` per channel (None if they are)."""
    for c in range(s.shape[1]):
        keys, vals = s[:, c].reshape(-1), o[:, c].reshape(-1)
        if keys.size < 2:
            continue
        order = np.argsort(keys, kind="stable")
        k, v = keys[order], vals[order]
        starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
        vmax = np.maximum.reduceat(v, starts)
        vmin = np.minimum.reduceat(v, starts)
        tol = RTOL * max(float(np.max(np.abs(v))), 1e-30)
        bad = np.flatnonzero(vmax - vmin > tol)
        if bad.size:
            g = int(bad[0])
            return (f"channel {c}: level {k[starts[g]]:g} stands for {vmin[g]:.9g} and {vmax[g]:.9g} in the "
                    "original")
    return None


def first_divergence(model: Model, reference: Any, samples: Sequence[int]) -> Divergence | None:
    """The first integer tensor of ``model`` (the streamlined model) shared with the original whose values are not,
    per channel, a function of the streamlined levels over ``samples`` (module docstring); None if none is."""
    samples = list(samples)
    if not samples:
        return None
    const = constant_tensors(model)
    names = [v.name for node in topo_order(list(model.graph)) for v in node.outputs
             if v.name not in const and is_integer_tensor(model, v.name)]
    original = reference.original()
    shared = [n for n in names if original.value(n) is not None]
    if not shared:
        return None
    ex = executor_with_outputs(model, [])
    got = [ex.run(reference.sample(i), return_all=True) for i in samples]
    del ex
    want = [reference.values(i, np.float64) for i in samples]
    producers = {v.name: node for node in model.graph for v in node.outputs}
    for name in shared:
        if any(name not in g or name not in w for g, w in zip(got, want)):
            continue
        layout = model.get_tensor_layout(name)
        nhwc = bool(layout) and list(layout)[-1] == "C" and len(layout) == 4
        s = np.stack([np.asarray(g[name], np.float64) for g in got])
        o = np.stack([np.asarray(w[name], np.float64) for w in want])
        aligned = _align(s, o, nhwc)
        if aligned is None:
            continue
        why = _conflict(*aligned)
        if why is not None:
            return Divergence(name, node_label(producers[name]) if name in producers else None, why)
    return None
