"""Running the pipeline with verification and a report, from Python, the CLI, or FINN's ``build_dataflow``.

:func:`streamline` is the one entry point the faces share: it runs the default pipeline (as configured) on a model
in place, verifies it (``off``; ``final``: the result against the original on reference data; ``each``: every pass,
then the final check) and returns a :class:`finnlite.report.StreamlineReport`. A failed verification does not
raise here: the report says so (``report.ok``, ``report.error``,
:meth:`~finnlite.report.StreamlineReport.raise_for_errors`).

:func:`step_streamline` is a FINN build step: ``(qonnx ModelWrapper, DataflowBuildConfig) -> ModelWrapper``. Put it
in ``cfg.steps`` in place of FINN's ``step_qonnx_to_finn``, ``step_tidy_up`` and ``step_streamline``. From the FINN
config it reads ``verify_steps`` (verification runs when it lists ``"streamlined_python"``, and by default when
``verify_steps`` is not set), ``verify_input_npy`` (reference inputs, when the file exists) and ``output_dir``
(the HTML report goes to ``<output_dir>/report/finnlite_streamline.html``). :func:`make_step_streamline` binds a
finnlite configuration (YAML file, dict or :class:`~finnlite.config.Config`) to such a step.

Reference data are drawn, unless given, from the range of the model's input quantizer (the first Quant reached from
a graph input through data-movement ops and scalar Mul/Div/Add/Sub by constants, widened by one quantization step on
each side and mapped back through those scalar ops), else from the input's integer datatype, else from an *assumed*
range, :data:`ASSUMED_INPUT_RANGE` (the normalized-image range [-3, 3]); a result verified on an assumed range says
so (``VerificationResult.assumed``). Boundary-seeking samples (:mod:`verify.boundary`) stay opt-in (``boundary``):
on a large network, placing the samples and checking them cost more than the whole rest of the verification.

With ``verify="each"`` the pipeline heals itself: a rewrite that fails its per-pass check is undone and declined
(:mod:`verify.heal`), and the run goes on; the report lists each declined rewrite with the failing tensor
(``VerificationResult.declined``; ``finnlite streamline --strict`` makes any of them an error). When a check fails
on a difference an earlier check accepted as a float32 near-tie (:class:`verify.hook.InheritedDeviation`), the
pipeline runs again from the start with those near-ties rejected, so that the earlier pass's rewrite is declined.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from custom_ops.quant import max_int, min_int
from finnlite.config import DEFAULT_VERIFY_MODE, VERIFY_MODES, Config, load_config
from finnlite.core.clone import clone_model
from finnlite.core.datatypes import is_integer_type
from finnlite.core.errors import ConfigError, VerificationError
from finnlite.core.io import check_input_names
from finnlite.core.model import Model
from finnlite.core.passes import PassManager
from finnlite.core.shapes import const_array
from finnlite.core.validate import validate_model
from finnlite.cost import datatype_histogram, inference_cost
from finnlite.float_report import float_report
from finnlite.report import (CheckRow, GraphPicture, StreamlineReport, VerificationResult, graph_marks,
                             pass_timings)
from streamline.preprocess import insert_preprocessing
from verify import PassVerificationError, ReferenceData, VerificationHook, bisect_pipeline, final_check
from verify.boundary import boundary_check, boundary_reference
from verify.hook import InheritedDeviation, probe_samples
from verify.verifier import tie_key

log = logging.getLogger(__name__)

__all__ = ["streamline", "step_streamline", "make_step_streamline", "input_ranges", "default_samples",
           "resolve_config", "make_reference", "check_reference_memory", "bisect", "STREAMLINED_PYTHON",
           "ASSUMED_INPUT_RANGE", "MAX_RESTARTS"]

#: FINN's ``VerificationStepType.STREAMLINED_PYTHON``: verify after streamlining
STREAMLINED_PYTHON = "streamlined_python"
_DATA_MOVEMENT = ("Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity")

Progress = Callable[[str], None]


def resolve_config(config: Config | str | Path | Mapping[str, Any] | None) -> Config:
    """A :class:`Config` from a Config, a YAML path, a dict (validated like a file) or None (defaults)."""
    if config is None:
        return Config()
    if isinstance(config, Config):
        return config
    if isinstance(config, (str, Path)):
        return load_config(config)
    if isinstance(config, Mapping):
        return Config.from_dict(dict(config), source="<config dict>")
    raise ConfigError(f"a configuration must be a YAML path, a dict or a finnlite.config.Config, not "
                      f"{type(config).__name__}")


# -- reference data ------------------------------------------------------------------------------------------------
#: the range of a float input that no input quantizer, datatype, preprocessing or option gives: normalized images
#: (mean 0, std 1 per channel) stay within it
ASSUMED_INPUT_RANGE = (-3.0, 3.0)
#: the source of an input range that is assumed (see :func:`input_ranges`)
ASSUMED = "assumed"
#: how many times a run starts again from the original model after an earlier near-tie was found not to hold
MAX_RESTARTS = 4

#: the least number of random reference samples of the final check, on every model: a fault that shows on one
#: input in eight (one threshold or weight element off) needs that many to be seen at all
MIN_SAMPLES = 8


def default_samples(model: Model) -> int:
    """How many random reference samples to draw: :data:`MIN_SAMPLES` (8), whatever the input size. (Fewer for
    large inputs, as before, let faults that show on one input in eight through; the per-pass checks draw their
    own few from these, see :func:`verify.hook.probe_samples`.)"""
    return MIN_SAMPLES


def input_ranges(model: Model) -> dict[str, tuple[float, float, str]]:
    """For each graph input: the range to draw reference inputs from and where it comes from (module docstring)."""
    out: dict[str, tuple[float, float, str]] = {}
    for v in model.graph.inputs:
        found = _quantizer_range(model, v.name)
        if found is not None:
            out[v.name] = found
        elif model.has_tensor_datatype(v.name) and is_integer_type(model.get_tensor_datatype(v.name)):
            dt = model.get_tensor_datatype(v.name)
            out[v.name] = (float(dt.min()), float(dt.max()), f"datatype {dt.name}")
        else:
            out[v.name] = (*ASSUMED_INPUT_RANGE, ASSUMED)
    return out


def _quantizer_range(model: Model, name: str) -> tuple[float, float, str] | None:
    """The input range that covers the quantizer reached from input ``name`` through data-movement ops and
    element-wise scalar Mul/Div/Add/Sub by constants (a preprocessing such as ``2·x − 1``), mapped back through
    those; None if no such quantizer is found."""
    affine: list[tuple[str, float]] = []  # the scalar ops on the way, in order
    for _ in range(16):
        consumers = model.find_consumers(name)
        if len(consumers) != 1:
            return None
        node = consumers[0]
        first = node.inputs[0] if node.inputs else None
        if first is None or first.name != name:
            return None
        if node.op_type in _DATA_MOVEMENT:
            name = node.outputs[0].name
            continue
        if node.op_type in ("Mul", "Div", "Add", "Sub") and len(node.inputs) == 2:
            c = const_array(node.inputs[1])
            if c is None or c.size != 1 or (node.op_type in ("Mul", "Div") and float(c.reshape(-1)[0]) == 0):
                return None
            affine.append((node.op_type, float(c.reshape(-1)[0])))
            name = node.outputs[0].name
            continue
        if node.op_type == "BipolarQuant":
            lo, hi, what = -1.0, 1.0, "bipolar input quantizer"
        elif node.op_type == "Quant" and len(node.inputs) >= 4:
            scale, zeropt, bits = (const_array(node.inputs[i]) for i in (1, 2, 3))
            if scale is None or zeropt is None or bits is None or bits.size != 1:
                return None
            attrs = {k: a.value for k, a in node.attributes.items()}
            signed, narrow, b = bool(attrs.get("signed", 1)), bool(attrs.get("narrow", 0)), int(bits.reshape(-1)[0])
            lo = float(np.min(scale.astype(np.float64) * (min_int(signed, narrow, b) - zeropt - 1)))
            hi = float(np.max(scale.astype(np.float64) * (max_int(signed, narrow, b) - zeropt + 1)))
            what = "input quantizer"
        else:
            return None
        for op, c in reversed(affine):  # undo the preprocessing
            inverse = {"Mul": lambda v: v / c, "Div": lambda v: v * c, "Add": lambda v: v - c,
                       "Sub": lambda v: v + c}[op]
            lo, hi = sorted((inverse(lo), inverse(hi)))
        return lo, hi, f"{what} '{node.name}'" + (f" through {len(affine)} scalar op(s)" if affine else "")
    return None


def make_reference(model: Model, config: Config, *, inputs: str | Path | None = None,
                   input_range: tuple[float, float] | None = None, samples: int | None = None,
                   seed: int | None = None, boundary: bool | None = None) -> tuple[Any, str]:
    """The reference data for ``model`` and a description of them: the ``inputs`` file (else the config's), or
    random samples in ``input_range`` (else the config's, else the inferred range, see :func:`input_ranges`).
    ``boundary`` (else the config's ``verification.boundary``): the random samples are made boundary-seeking
    (:func:`verify.boundary.boundary_reference`; its plan is ``reference.boundary_plan``). ``reference.assumed``
    maps each input whose range was assumed to that range. Checked before anything is allocated: the input file's
    arrays are named after the model's inputs (:func:`finnlite.core.io.check_input_names`), and random samples fit
    in the memory available (:func:`check_reference_memory`)."""
    vc = config.verification
    path = inputs if inputs is not None else vc.inputs
    if path is not None:
        check_input_names(path, model.input_names)
        ref = ReferenceData.load(model, path)
        ref.assumed = {}
        return ref, f"{ref.num_samples} samples from {path}"
    n = samples or vc.samples or default_samples(model)
    seed = seed if seed is not None else vc.seed
    check_reference_memory(model, n)
    fixed = input_range if input_range is not None else vc.input_range
    ranges = {name: (fixed[0], fixed[1], "given") for name in model.input_names} if fixed is not None \
        else input_ranges(model)
    plain = {k: (lo, hi) for k, (lo, hi, _) in ranges.items()}
    assumed = {k: (lo, hi) for k, (lo, hi, src) in ranges.items() if src == ASSUMED}
    boundary = boundary if boundary is not None else bool(vc.boundary)
    if boundary:
        ref, plan = boundary_reference(model, n=n, seed=seed, ranges=plain)
    else:
        ref = ReferenceData.random(model, n=n, seed=seed, ranges=plain)
    ref.assumed = assumed
    where = "; ".join(f"{k} in [{lo:.4g}, {hi:.4g}] ({src})" for k, (lo, hi, src) in ranges.items())
    kind = "boundary-seeking" if boundary else "random"
    return ref, f"{n} {kind} sample{'s' if n != 1 else ''} (seed {seed}), {where}"


#: bytes per input element that drawing random reference data holds at its peak (float64 draws, then the
#: model's float32 copy, then the float64 copy of the float64 reference run)
_BYTES_PER_SAMPLE_ELEMENT = 20


def check_reference_memory(model: Model, samples: int, available: int | None = None) -> None:
    """Raise a :class:`ConfigError` when ``samples`` random reference samples of ``model``'s inputs would need
    more memory than is ``available`` (default: what the system reports as available), before allocating any:
    a model declaring an enormous input is a clear error, not a MemoryError after a long wait."""
    total, parts = 0, []
    for v in model.graph.inputs:
        shape = model.get_tensor_shape(v.name)
        if not shape or any(d is None for d in shape):
            continue
        elements = samples * int(np.prod([int(d) for d in shape], dtype=object))
        total += elements * _BYTES_PER_SAMPLE_ELEMENT
        parts.append(f"{v.name} {'x'.join(str(d) for d in shape)}")
    free = available if available is not None else available_memory()
    if free is not None and total > free:
        raise ConfigError(f"the reference data need about {_gigabytes(total)} ({samples} samples of "
                          f"{', '.join(parts)}) but {_gigabytes(free)} of memory are available: give fewer "
                          "--samples, a smaller input, or --verify off")


def available_memory() -> int | None:
    """The memory available to this process in bytes (Linux ``MemAvailable``, else physical pages), or None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _gigabytes(n: int) -> str:
    return f"{n / 2 ** 30:.3g} GB" if n >= 2 ** 28 else f"{n / 2 ** 20:.3g} MB"


# -- the run -------------------------------------------------------------------------------------------------------
class _Progress:
    """A pass-manager hook printing one line when a stage starts and one when it ends."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self._t0 = 0.0

    def before_stage(self, stage: Any, model: Model) -> None:
        self._t0 = time.perf_counter()
        self.progress(f"[{stage.name}] {len(model)} nodes ...")

    def after_stage(self, stage: Any, model: Model) -> None:
        self.progress(f"[{stage.name}] done in {time.perf_counter() - self._t0:.2f} s, {len(model)} nodes")


class _PassLog:
    """A pass-manager hook logging every pass run (at INFO, logger ``finnlite.passes``; ``finnlite -v`` shows
    them): stage, round, pass, whether it changed the graph, its rewrites and the node count."""

    def after_pass(self, p: Any, model: Model, stage: Any, record: Any) -> None:
        if not _pass_log.isEnabledFor(logging.INFO):
            return
        rewrites = "" if record.rewrites is None else f", {record.rewrites} rewrite(s)"
        rnd = f" round {record.iteration}" if record.iteration else ""
        _pass_log.info("[%s%s] %s: %s%s, %d -> %d nodes, %.3f s", stage.name, rnd, record.name,
                       "changed" if record.changed else "no change", rewrites, record.nodes_before,
                       record.nodes_after, record.seconds)


_pass_log = logging.getLogger("finnlite.passes")


def _safe(what: str, fn: Callable[[], Any]) -> Any:
    """``fn()``, or None with a warning: the parts of a report that are a bonus must not stop a run."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - cost and pictures are extras; the run and its verification stand
        log.warning("could not compute the %s: %s", what, exc)
        return None


def _run_pipeline(m: Model, stage_list: list[Any], hook: VerificationHook | None, reference: Any, heal: bool,
                  options: dict[str, Any], result: VerificationResult, progress: Progress | None
                  ) -> tuple[PassManager, VerificationHook | None, PassVerificationError | None]:
    """Run the stages on ``m`` with ``hook``; with ``heal``, again from the original (at most
    :data:`MAX_RESTARTS` times) when a check fails on an earlier pass's near-ties, with those rejected (module
    docstring). Returns the last manager, the hook and the error that stopped the run (None if it went through)."""
    declined_keys: set[tuple[str, str]] = set()
    error: PassVerificationError | None = None
    for attempt in range(MAX_RESTARTS + 1):
        hooks = [h for h in (_Progress(progress) if progress is not None else None, _PassLog(), hook) if h is not None]
        manager = PassManager(stage_list, hooks, declined=declined_keys)
        try:
            manager.run(m)
        except InheritedDeviation as err:
            if hook is None or reference is None or not heal or not err.ties or attempt == MAX_RESTARTS:
                error = err
            else:  # the earlier pass's near-ties do not hold: run again with them rejected, to decline its rewrite
                note = (f"run {attempt + 2}: pass '{err.checked_pass}' failed on a difference that pass "
                        f"'{err.pass_name}' accepted as {len(err.ties)} float32 near-tie(s); ran the pipeline again "
                        "with them rejected")
                result.notes.append(note)
                if progress is not None:
                    progress(note)
                reject = hook.reject_ties | {tie_key(t) for t in err.ties}
                declined, seconds_before = hook.declined, hook.seconds
                m.replace_ir(clone_model(reference.original()).ir)  # the model the pipeline started from
                hook.close()
                hook = VerificationHook(reference, heal=True, reject_ties=reject, **options)
                hook.declined, hook.setup_seconds = declined, seconds_before
                continue
        except PassVerificationError as err:
            error = err
        break
    if error is not None:
        err = error
        result.failure = {"during": "pipeline", "pass": err.pass_name, "stage": err.stage, "iteration": err.iteration,
                          "node": err.node, "tensor": err.tensor, "max_error": err.max_error, "sample": err.sample,
                          "before_path": err.before_path, "after_path": err.after_path, "message": str(err)}
    return manager, hook, error


def _record_checks(result: VerificationResult, hook: VerificationHook, error: Exception | None) -> None:
    """The per-pass checks, the declined rewrites and the time into ``result``; the hook's cache is freed."""
    result.checks = [CheckRow(r.pass_name or r.label, r.stage, r.iteration,
                              r.policy, r.changed_nodes, r.region_nodes, len(r.near_ties), r.seconds)
                     for r in hook.records]
    result.declined = list(hook.declined)
    result.seconds += hook.seconds
    hook.close()  # the cached tensor values are not needed by the final check: free them before it runs
    if error is not None:
        f = result.failure or {}
        result.checks.append(CheckRow(f.get("pass") or "?", f.get("stage"), f.get("iteration"), "", None, None,
                                      0, 0.0, ok=False, message=str(error)))


def _final_check(m: Model, reference: Any, cfg: Config, result: VerificationResult, seconds: dict[str, float],
                 progress: Progress | None) -> VerificationError | None:
    """The final check of ``m`` against the original (with the first-layer comparison on boundary samples) into
    ``result``; its error, if it fails."""
    if progress is not None:
        progress(f"final check against the original on {reference.num_samples} samples ...")
    t0 = time.perf_counter()
    plan = getattr(reference, "boundary_plan", None)
    if plan is not None:
        result.final = boundary_check(reference, m, plan, float_rtol=cfg.verification.float_rtol)
    else:
        result.final = final_check(reference, m, float_rtol=cfg.verification.float_rtol)
    dt = time.perf_counter() - t0
    result.seconds += dt
    seconds["final check"] = dt
    try:
        result.final.raise_for_errors()
    except VerificationError as err:
        result.failure = {"during": "final", "pass": None, "stage": None, "tensor": err.tensor,
                          "message": str(err)}
        return err
    return None


def streamline(model: Any, config: Config | str | Path | Mapping[str, Any] | None = None, *,
               verify: str | None = None, inputs: str | Path | None = None,
               input_range: tuple[float, float] | None = None, samples: int | None = None, seed: int | None = None,
               stages: Sequence[str] | None = None, progress: Progress | None = None,
               extras: bool = True, preprocessing: Any = None, boundary: bool | None = None,
               heal: bool = True) -> StreamlineReport:
    """Run the configured pipeline on ``model`` (a :class:`finnlite.Model`, edited in place; anything else is
    loaded) with verification, and return the report (module docstring). Keyword arguments override the config:
    ``verify`` (``off``, ``final`` or ``each`` — the default), ``inputs`` (a .npy/.npz file), ``input_range``,
    ``samples``, ``seed``, ``stages`` (names). ``progress`` receives one line per stage and per long step;
    ``extras=False`` skips the graph pictures and the inference cost. ``preprocessing`` (else the config's): a
    :class:`streamline.preprocess.Preprocessing` put in front of the model first; the model with it is the
    reference. ``boundary`` (else the config's ``verification.boundary``): boundary-seeking reference samples, and
    the final check adds the first-layer comparison (:mod:`verify.boundary`). ``heal`` (with ``verify="each"``): a
    rewrite that fails its check is undone and declined, and the run goes on (module docstring); without it the
    first failing check stops the run."""
    cfg = resolve_config(config)
    mode = verify or cfg.verification.mode or DEFAULT_VERIFY_MODE
    if mode not in VERIFY_MODES:
        raise ConfigError(f"verification mode must be one of {', '.join(VERIFY_MODES)}, not '{mode}'")
    m = model if isinstance(model, Model) else Model(model)
    validate_model(m)  # a malformed graph or a bad quantizer parameter: one error naming the node, before any run
    pre = preprocessing if preprocessing is not None else cfg.preprocessing
    if pre is not None:
        insert_preprocessing(m, pre)
        if progress is not None:
            progress(f"preprocessing: {pre.describe()}")
    source = m.path
    stage_list = cfg.build_stages(list(stages) if stages is not None else None)
    seconds: dict[str, float] = {}

    result = VerificationResult(mode)
    reference = None
    if mode != "off":
        t0 = time.perf_counter()
        reference, result.reference = make_reference(
            m, cfg, inputs=inputs, input_range=input_range, samples=samples, seed=seed, boundary=boundary)
        result.samples = reference.num_samples
        reference.precompute(values=probe_samples(reference) if mode == "each" else 0)
        seconds["reference"] = time.perf_counter() - t0
        if progress is not None:
            progress(f"reference data: {result.reference}")
    ops_before = m.op_histogram()
    picture_before = _safe("graph picture", lambda: GraphPicture.of(m)) if extras else None
    cost_before = _safe("inference cost", lambda: inference_cost(m)) if extras else None

    result.assumed = dict(getattr(reference, "assumed", None) or {})
    options = cfg.verification.hook_options()
    hook = VerificationHook(reference, heal=heal, **options) if mode == "each" else None
    t0 = time.perf_counter()
    manager, hook, error = _run_pipeline(m, stage_list, hook, reference, heal, options, result, progress)
    seconds["pipeline"] = time.perf_counter() - t0
    run_report = manager.report
    if hook is not None:
        _record_checks(result, hook, error)
    if error is None and reference is not None:
        error = _final_check(m, reference, cfg, result, seconds, progress)
    floats = float_report(m, run_report)
    marks = graph_marks(m, floats, result.failure)
    report = StreamlineReport(
        source=source, stages=[s.name for s in stage_list], ops_before=ops_before, ops_after=m.op_histogram(),
        passes=pass_timings(run_report.records), stage_seconds=dict(run_report.stage_seconds),
        verification=result, seconds=seconds, datatypes=datatype_histogram(m),
        float_nodes=floats, cost_before=cost_before,
        cost_after=_safe("inference cost", lambda: inference_cost(m)) if extras else None,
        picture_before=picture_before,
        picture_after=_safe("graph picture", lambda: GraphPicture.of(m, marks)) if extras else None,
        model=m, error=error)
    return report


def bisect(model: Any, config: Config | str | Path | Mapping[str, Any] | None = None, *,
           inputs: str | Path | None = None, input_range: tuple[float, float] | None = None,
           samples: int | None = None, seed: int | None = None, stages: Sequence[str] | None = None) -> Any:
    """Find the first pass, and the first rewrite of it, that breaks equivalence (what ``finnlite bisect`` runs):
    the configured pipeline is replayed on a copy of ``model`` (not modified) with per-pass verification on
    reference data (as :func:`streamline` makes them), and the failing pass replayed one rewrite at a time.
    Returns a :class:`verify.bisect.BisectResult` (``ok``, ``pass_name``, ``stage``, ``rewrite``, ``match``,
    ``text()``); its ``reference`` attribute describes the reference data."""
    cfg = resolve_config(config)
    m = model if isinstance(model, Model) else Model(model)
    validate_model(m)
    stage_list = cfg.build_stages(list(stages) if stages is not None else None)
    reference, described = make_reference(m, cfg, inputs=inputs, input_range=input_range, samples=samples,
                                          seed=seed)
    options = cfg.verification.hook_options()
    kwargs = {"policy": options["policy"]}
    if "near_tie_rtol" in options:
        kwargs["near_tie_rtol"] = options["near_tie_rtol"]
    result = bisect_pipeline(m, stage_list, reference, samples=reference.num_samples, **kwargs)
    result.reference = described
    return result


# -- FINN build step -----------------------------------------------------------------------------------------------
def _finn_verify_mode(cfg: Any) -> str | None:
    """The verification mode FINN's config asks for: None when ``verify_steps`` is not set (finnlite's default
    applies, as it does when it lists ``streamlined_python``), ``off`` when it does not list it."""
    steps = getattr(cfg, "verify_steps", None)
    if steps is None:
        return None
    names = {getattr(s, "value", s) for s in steps}
    return DEFAULT_VERIFY_MODE if STREAMLINED_PYTHON in names else "off"


def _run_step(model: Any, cfg: Any, config: Config | str | Path | Mapping[str, Any] | None) -> Any:
    conf = resolve_config(config)
    mode = conf.verification.mode or _finn_verify_mode(cfg) or DEFAULT_VERIFY_MODE
    inputs = None
    npy = getattr(cfg, "verify_input_npy", None)
    if mode != "off" and conf.verification.inputs is None and npy and Path(npy).is_file():
        inputs = npy
    m = Model(model)
    report = streamline(m, conf, verify=mode, inputs=inputs,
                        progress=lambda line: log.info("finnlite: %s", line))
    out_dir = getattr(cfg, "output_dir", None)
    if out_dir:
        path = Path(out_dir) / "report" / "finnlite_streamline.html"
        path.parent.mkdir(parents=True, exist_ok=True)
        report.save_html(path)
        log.info("finnlite: report written to %s", path)
    report.raise_for_errors()
    return m.to_qonnx()


def step_streamline(model: Any, cfg: Any) -> Any:
    """FINN build step: streamline a QONNX ``ModelWrapper`` and return the FINN-ONNX ``ModelWrapper`` (module
    docstring). Raises :class:`~finnlite.core.errors.VerificationError` when verification fails."""
    return _run_step(model, cfg, None)


def make_step_streamline(config: Config | str | Path | Mapping[str, Any] | None) -> Callable[[Any, Any], Any]:
    """A build step like :func:`step_streamline` using a finnlite configuration (its verification mode and
    inputs, when set, take precedence over FINN's). The config is validated now."""
    conf = resolve_config(config)

    def step_streamline(model: Any, cfg: Any) -> Any:  # FINN names steps by __name__
        return _run_step(model, cfg, conf)

    step_streamline.__doc__ = f"finnlite streamlining with configuration {conf.source or 'defaults'}"
    return step_streamline
