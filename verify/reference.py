"""Reference data: inputs for a model, and the original model's outputs and intermediates on them, computed once.

:class:`ReferenceData` snapshots the model it is built from (the *original*: later in-place edits by the pipeline do
not reach it), holds N input samples stacked along the batch axis, and caches what the oracle
(:class:`custom_ops.executor.Executor`) computes on them: the outputs in float32 and float64, and, per sample and on
demand, every intermediate tensor. Inputs come from a stated range and seed (:meth:`ReferenceData.random`) or from
the user's ``.npy``/``.npz`` files (:meth:`ReferenceData.load`); user data is validated against the model's inputs
(names, shapes, dtypes, finiteness, integer datatypes) with errors that say what is wrong.

The snapshot shares the model's frozen weight arrays (a weight the pipeline replaces stays alive only through the
snapshot). :meth:`ReferenceData.precompute` computes what the per-pass checks will ask of the original (every tensor on
their samples); later requests share its executor (one at a time: the last dtype asked for), whatever tensors they
ask for (:meth:`ReferenceData.tensors`), and a request that runs every sample also gives the outputs.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np
import onnx

from custom_ops.executor import Executor
from custom_ops.subgraph import handed_over
from finnlite.core.datatypes import BaseDataType, is_integer_type
from finnlite.core.errors import ConfigError
from finnlite.core.io import to_proto_without
from finnlite.core.model import Model, as_model, freeze, is_frozen
from finnlite.core.passes import fingerprint
from verify.cache import SampleValues
from verify.compare import fits_datatype

log = logging.getLogger(__name__)

__all__ = ["ReferenceData", "ReferenceDataError", "InputSpec"]


class ReferenceDataError(ConfigError):
    """Reference inputs that do not fit the model (names, shapes, dtypes, values) or cannot be read."""


class InputSpec:
    """A data input of the model: name, declared shape (None for symbolic dims), numpy dtype, finn datatype."""

    def __init__(self, name: str, shape: tuple[int | None, ...] | None, dtype: np.dtype,
                 datatype: BaseDataType | None) -> None:
        self.name, self.shape, self.dtype, self.datatype = name, shape, np.dtype(dtype), datatype

    @property
    def batch0(self) -> int:
        """The exported batch size (the leading dim; 1 when it is symbolic or the input is a scalar)."""
        return self.shape[0] if self.shape and self.shape[0] is not None else 1

    def shape_text(self) -> str:
        if self.shape is None:
            return "(unknown)"
        return "(" + ", ".join("?" if d is None else str(d) for d in self.shape) + ")"

    def __repr__(self) -> str:
        return f"InputSpec({self.name!r}, {self.shape_text()}, {self.dtype}, {self.datatype})"


def _input_specs(model: Model) -> list[InputSpec]:
    specs = []
    for v in model.graph.inputs:
        dtype = v.dtype.numpy() if v.dtype is not None else np.dtype(np.float32)
        dt = model.get_tensor_datatype(v.name) if model.has_tensor_datatype(v.name) else None
        specs.append(InputSpec(v.name, model.get_tensor_shape(v.name), dtype, dt))
    return specs


def _split(model: Model) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The model as a ModelProto without its large initializers, and those as read-only arrays: the model's own
    frozen arrays where it has them (no copy), else frozen copies. An executor given them as ``constants`` uses them
    as they are, where from a ModelProto it would copy them."""
    import onnx_ir as ir


    large: dict[str, np.ndarray] = {}
    for name, v in model.graph.initializers.items():
        t = v.const_value
        if t is None or not handed_over(t):
            continue
        arr = t.numpy()
        if isinstance(t, ir.serde.TensorProtoTensor):
            large[name] = freeze(arr)  # a fresh array of the proto's bytes
        else:
            large[name] = arr if is_frozen(arr) else freeze(np.array(arr))
    return to_proto_without(model.ir, large, node_metadata=False), large


class ReferenceData:
    """N input samples for a model and the cached results of its original version on them.

    ``inputs`` maps each data input to an array holding the samples stacked along axis 0 (N·b0 rows, b0 being the
    exported batch size, usually 1), or to an array with an extra leading sample axis (N, b0, ...). A single
    array is accepted for a single-input model. ``model`` is snapshotted: editing it later does not change the
    reference."""

    def __init__(self, model: Any, inputs: Mapping[str, np.ndarray] | np.ndarray, *, source: str = "arrays") -> None:
        m = as_model(model)
        self.source = source
        self._order = [name for name in m.graph.initializers]
        # the snapshot: the model without its large initializers, and those as read-only arrays shared with the
        # model (the pipeline replaces weights, it never edits them), which the executors use as they are
        self._proto, large = _split(m)
        self._weights = large  # shared with subsets
        self._shared: dict[str, Any] = {}  # the full snapshot, assembled on demand (shared with subsets)
        self._fingerprint = fingerprint(m)
        self.specs = _input_specs(m)
        if not self.specs:
            raise ReferenceDataError("the model has no data inputs")
        self.inputs, self.num_samples = self._validate(inputs)
        self._executors: dict[str, Any] = {}  # by dtype name
        self._outputs: dict[str, dict[str, np.ndarray]] = {}
        self._values: dict[tuple[str, int], dict[str, np.ndarray]] = {}
        #: outputs seen per sample by other runs (tensors), by dtype name: all samples make :meth:`outputs`
        self._seen_outputs: dict[str, dict[int, dict[str, np.ndarray]]] = {}
        self._original: Model | None = None

    # -- construction ------------------------------------------------------------------------------------------
    @classmethod
    def random(cls, model: Any, n: int = 32, seed: int = 0, low: float = -1.0, high: float = 1.0, *,
               ranges: Mapping[str, tuple[float, float]] | None = None,
               shapes: Mapping[str, Sequence[int]] | None = None) -> "ReferenceData":
        """``n`` samples drawn uniformly from ``[low, high)`` (per input from ``ranges``) with ``seed``. Inputs
        with an integer datatype annotation (or an integer dtype) get integers in the range, clipped to the
        datatype's. ``shapes`` gives the shape of inputs whose declared shape has symbolic dims."""
        if n < 1:
            raise ReferenceDataError(f"need at least one sample, got n={n}")
        m = as_model(model)
        rng = np.random.default_rng(seed)
        arrays: dict[str, np.ndarray] = {}
        for spec in _input_specs(m):
            shape = tuple(shapes[spec.name]) if shapes and spec.name in shapes else spec.shape
            if shape is None or any(d is None for d in shape):
                raise ReferenceDataError(f"input shape {spec.shape_text()} has symbolic dims; give its shape with "
                                         f"shapes={{'{spec.name}': [...]}}", tensor=spec.name)
            lo, hi = (ranges or {}).get(spec.name, (low, high))
            if not (np.isfinite(lo) and np.isfinite(hi) and lo <= hi):
                raise ReferenceDataError(f"bad input range [{lo}, {hi}]", tensor=spec.name)
            full = (n * shape[0], *shape[1:]) if shape else (n,)
            dt = spec.datatype
            if (dt is not None and is_integer_type(dt)) or spec.dtype.kind in "iu":
                if dt is not None and dt.name == "BIPOLAR":
                    values = rng.choice(np.array([-1.0, 1.0]), size=full)
                else:
                    ilo, ihi = int(np.ceil(lo)), int(np.floor(hi))
                    if dt is not None and is_integer_type(dt):
                        ilo, ihi = max(ilo, int(dt.min())), min(ihi, int(dt.max()))
                    if ilo > ihi:
                        raise ReferenceDataError(f"range [{lo}, {hi}] holds no value of {dt.name if dt else 'int'}",
                                                 tensor=spec.name)
                    values = rng.integers(ilo, ihi, size=full, endpoint=True)
                arrays[spec.name] = values.astype(spec.dtype)
            else:
                arrays[spec.name] = rng.uniform(lo, hi, size=full).astype(spec.dtype)
        return cls(m, arrays, source=f"random(n={n}, seed={seed})")

    @classmethod
    def load(cls, model: Any, path: str | Path) -> "ReferenceData":
        """Inputs from a ``.npy`` file (single-input models) or an ``.npz`` file keyed by input name (a single
        array of any key for a single-input model)."""
        path = Path(path)
        if not path.is_file():
            raise ReferenceDataError("reference input file not found", file=str(path))
        try:
            loaded = np.load(path, allow_pickle=False)
        except (ValueError, OSError) as exc:
            raise ReferenceDataError(f"cannot read reference inputs: {exc}", file=str(path)) from None
        if isinstance(loaded, np.ndarray):
            arrays: Any = loaded
        else:
            with loaded:
                arrays = {k: loaded[k] for k in loaded.files}
            if not arrays:
                raise ReferenceDataError("the .npz file holds no arrays", file=str(path))
        try:
            return cls(model, arrays, source=str(path))
        except ReferenceDataError as exc:
            if exc.file is None:
                raise ReferenceDataError(exc.message, file=str(path), tensor=exc.tensor) from None
            raise

    def _validate(self, inputs: Mapping[str, np.ndarray] | np.ndarray) -> tuple[dict[str, np.ndarray], int]:
        names = [s.name for s in self.specs]
        if isinstance(inputs, np.ndarray) or not isinstance(inputs, Mapping):
            if len(self.specs) != 1:
                raise ReferenceDataError(f"the model has {len(names)} inputs {names}; give a dict of arrays by name")
            inputs = {names[0]: np.asarray(inputs)}
        elif len(self.specs) == 1 and len(inputs) == 1 and names[0] not in inputs:
            inputs = {names[0]: next(iter(inputs.values()))}
        unknown = sorted(set(inputs) - set(names))
        if unknown:
            raise ReferenceDataError(f"not an input of the model (inputs: {names})", tensor=unknown[0])
        missing = [n for n in names if n not in inputs]
        if missing:
            raise ReferenceDataError(f"no reference values for input(s) {missing}", tensor=missing[0])
        out: dict[str, np.ndarray] = {}
        counts: dict[str, int] = {}
        for spec in self.specs:
            arr = self._fit_dtype(spec, np.asarray(inputs[spec.name]))
            arr, counts[spec.name] = self._fit_shape(spec, arr)
            out[spec.name] = np.ascontiguousarray(arr)
        if len(set(counts.values())) != 1:
            raise ReferenceDataError(f"inputs have different sample counts {counts}")
        return out, next(iter(counts.values()))

    @staticmethod
    def _fit_dtype(spec: InputSpec, arr: np.ndarray) -> np.ndarray:
        if arr.dtype.kind not in "fiu":
            raise ReferenceDataError(f"reference values have dtype {arr.dtype}; need numbers ({spec.dtype})",
                                     tensor=spec.name)
        if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
            raise ReferenceDataError("reference values contain NaN or infinity", tensor=spec.name)
        if spec.dtype.kind in "iu" and arr.dtype.kind == "f" and not np.array_equal(arr, np.round(arr)):
            raise ReferenceDataError(f"the model expects {spec.dtype}; the values are not integers",
                                     tensor=spec.name)
        if spec.datatype is not None and is_integer_type(spec.datatype):
            bad = ~fits_datatype(arr, spec.datatype)
            if bad.any():
                raise ReferenceDataError(f"{int(bad.sum())} value(s) are not {spec.datatype.name} (first: "
                                         f"{arr.reshape(-1)[np.argmax(bad.reshape(-1))]!r})", tensor=spec.name)
        return arr.astype(spec.dtype, copy=False)

    @staticmethod
    def _fit_shape(spec: InputSpec, arr: np.ndarray) -> tuple[np.ndarray, int]:
        shape = spec.shape
        if shape is None:
            return arr, (arr.shape[0] if arr.ndim else 1)
        if len(shape) == 0:
            if arr.ndim == 0:
                return arr, 1
            if arr.ndim == 1:
                return arr, arr.shape[0]
        rest_ok = lambda dims: len(dims) == len(shape) - 1 and all(  # noqa: E731
            d is None or a == d for a, d in zip(dims, shape[1:]))
        if arr.ndim == len(shape) + 1 and rest_ok(arr.shape[2:]) and (shape[0] is None or arr.shape[1] == shape[0]):
            return arr.reshape((arr.shape[0] * arr.shape[1],) + arr.shape[2:]), arr.shape[0]
        if arr.ndim == len(shape) and rest_ok(arr.shape[1:]):
            b0 = spec.batch0
            if arr.shape[0] == 0 or arr.shape[0] % b0:
                raise ReferenceDataError(f"leading dim {arr.shape[0]} is not a multiple of the model's batch {b0} "
                                         f"(input shape {spec.shape_text()})", tensor=spec.name)
            return arr, arr.shape[0] // b0
        raise ReferenceDataError(f"reference values have shape {arr.shape}; the model input is {spec.shape_text()} "
                                 f"(give N samples as (N·batch, ...) or (N, batch, ...))", tensor=spec.name)

    # -- samples -----------------------------------------------------------------------------------------------
    def sample(self, i: int) -> dict[str, np.ndarray]:
        """The inputs of sample ``i`` (each with the model's own batch size)."""
        if not 0 <= i < self.num_samples:
            raise IndexError(f"sample {i} out of range (0..{self.num_samples - 1})")
        out = {}
        for spec in self.specs:
            arr = self.inputs[spec.name]
            if spec.shape is not None and len(spec.shape) == 0:
                out[spec.name] = arr[i]
            else:
                b0 = spec.batch0
                out[spec.name] = arr[i * b0:(i + 1) * b0]
        return out

    # -- the original model and its results ----------------------------------------------------------------------
    def original(self) -> Model:
        """The original model as a :class:`finnlite.Model` (shared; do not modify), holding the snapshot's weight
        arrays as they are (not serialized into a proto and parsed again, which would copy every weight twice)."""
        if self._original is None:
            if "proto" in self._shared:
                self._original = Model(self._shared["proto"], check=False)
            else:
                quiet = logging.getLogger("onnx_ir.serde")  # the large weights' readers dangle until they are set
                level = quiet.level
                quiet.setLevel(logging.ERROR)
                try:
                    self._original = Model(self._proto, check=False)
                finally:
                    quiet.setLevel(level)
                for name in self._order:
                    if name in self._weights:
                        self._original.set_initializer(name, self._weights[name])
        return self._original

    def computes(self, name: str) -> bool:
        """True if ``name`` is an input or a node output of the original model (a tensor :meth:`values` has)."""
        if "names" not in self._shared:
            g = self._proto.graph
            self._shared["names"] = frozenset([v.name for v in g.input] + [o for n in g.node for o in n.output])
        return name in self._shared["names"]

    def describes(self, model: Model) -> bool:
        """True if ``model`` has the structure of the original (same nodes, wiring and initializer shapes)."""
        return fingerprint(model) == self._fingerprint

    def executor(self, dtype: Any = np.float32) -> Any:
        """The oracle for the original model in ``dtype``, kept until one for the other dtype is asked for (then
        it is dropped: never both in memory)."""
        key = np.dtype(dtype).name
        if key not in self._executors:
            self._executors.clear()
            self._executors[key] = Executor(self._proto, dtype=dtype, constants=dict(self._weights))
        return self._executors[key]

    def folded(self, name: str) -> np.ndarray | None:
        """The original's constant tensor ``name`` (e.g. a weight quantizer's output) as its float32 execution
        computes it, if the float32 executor exists and folded it (None otherwise: no executor is made for it)."""
        ex = self._executors.get("float32")
        return ex.folded(name) if ex is not None else None

    def outputs(self, dtype: Any = np.float32) -> dict[str, np.ndarray]:
        """The original model's outputs on all samples (stacked along axis 0), computed once per dtype."""
        key = np.dtype(dtype).name
        if key not in self._outputs:
            seen = self._seen_outputs.pop(key, {})
            if len(seen) == self.num_samples and all(a.ndim for v in seen.values() for a in v.values()):
                # every sample's outputs came with other tensors (:meth:`tensors`): stacked as a run stacks them
                self._outputs[key] = {name: np.concatenate([seen[i][name] for i in range(self.num_samples)])
                                      for name in seen[0]}
            else:
                log.info("computing the reference outputs (%s, %d samples)", key, self.num_samples)
                self._outputs[key] = self.executor(dtype).run(self.inputs)
        return self._outputs[key]

    def values(self, i: int, dtype: Any = np.float32) -> SampleValues:
        """Every tensor of the original model on sample ``i`` (inputs, constants, node outputs), computed once."""
        key = (np.dtype(dtype).name, i)
        if key not in self._values:
            self._values[key] = self._all_tensors(i, dtype)
        return self._values[key]

    def take_values(self, i: int, dtype: Any = np.float32) -> SampleValues:
        """Like :meth:`values`, but the caller takes the dict: it is dropped from the cache (the verifier keeps and
        edits its own, and the original's tensors are then not held twice over a run)."""
        key = (np.dtype(dtype).name, i)
        if key in self._values:
            return self._values.pop(key)
        return self._all_tensors(i, dtype)

    def tensors(self, names: Iterable[str], samples: Iterable[int], dtype: Any = np.float32
                ) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        """``(i, {name: value})`` for each sample ``i`` of ``samples``: the original's tensors ``names`` and its
        outputs, from the executor of :meth:`executor` with a plan that computes only those (much faster than every
        tensor, :meth:`values`)."""
        outs = [o.name for o in self._proto.graph.output]
        wanted = outs + sorted(set(names) - set(outs))
        key = np.dtype(dtype).name
        ex = self.executor(dtype)
        for i in samples:
            got = ex.run(self.sample(i), outputs=wanted)
            if key not in self._outputs:
                self._seen_outputs.setdefault(key, {})[i] = {o: got[o] for o in outs}
            yield i, got

    def _all_tensors(self, i: int, dtype: Any) -> SampleValues:
        return SampleValues(self.executor(dtype).run(self.sample(i), return_all=True))

    def precompute(self, values: int = 0) -> None:
        """Compute now, with the float32 executor of the original, every tensor on the first ``values`` samples
        (for per-pass verification; the outputs on every sample are computed when first asked for, by
        :meth:`outputs` or along with other tensors by :meth:`tensors`). Nothing changes in what the other methods
        return."""
        for i in range(min(values, self.num_samples)):
            self.values(i)

    def __repr__(self) -> str:
        return f"<ReferenceData {self.source}: {self.num_samples} samples of {[s.name for s in self.specs]}>"
