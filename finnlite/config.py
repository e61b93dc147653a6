"""The configuration file of ``finnlite streamline`` and of the build step (YAML, loaded with ``yaml.safe_load``).

Every key is optional; an unknown key, a wrong type or a bad value is a :class:`~finnlite.core.errors.ConfigError` whose
one-line message names the file and the key. Relative paths are relative to the file's folder, and that folder is
put on ``sys.path`` so that a rules module beside the config can be imported::

    stages: [tidy, convert, streamline, lower, restreamline, finalize]   # run these default stages (pipeline order)
    modules: [my_rules]                 # imported first: modules that register passes with @register_pass
    passes:                             # user passes added to stages
      - pass: my_rules:FoldMyPattern    # "module:attribute", or the name of a registered pass
        stage: streamline               # the stage to add it to
        before: InferDataTypes          # optional: before or after a pass of the stage (default: at the end)
    verification:
      mode: each                        # off | final (compare the result with the original) | each (every pass, the default)
      samples: 8                        # random reference samples (default: fewer for large inputs)
      seed: 0
      input_range: [0.0, 1.0]           # range of the random inputs (default: the input quantizer's range)
      inputs: reference.npz             # reference inputs instead of random ones (.npy, or .npz keyed by input)
      boundary: false                   # boundary-seeking samples: first-layer pre-activations on/next to thresholds
      tolerance: {rtol: 1.0e-5, rtol_max: 1.0e-4, atol: 0.0, steps: 0}   # default policy of passes declaring none
      near_ties: true                   # accept one-step differences at float32 near-ties
      near_tie_rtol: 1.0e-6
      float_rtol: 1.0e-5                # final check of float outputs: relative to the output's magnitude
      save_dir: failures                # where the models around a failing pass are written
    preprocessing:                      # the input becomes integers; (x*scale - mean)/std goes in front
      input_datatype: UINT8             # default UINT8
      scale: 1/255                      # a number or a fraction
      mean: [0.485, 0.456, 0.406]       # one value or one per channel (axis 1)
      std: 0.226                        # one value or one per channel
      input: x                          # optional: which graph input (default: the only one)

A pass given as ``module:attribute`` may be a finnlite :class:`~finnlite.core.passes.Pass` class or instance, a qonnx
``Transformation`` (class or instance) or a function ``f(model) -> bool`` (see :func:`finnlite.core.passes.run_pass`).
"""

from __future__ import annotations

import importlib
import math
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from finnlite.core.errors import ConfigError, PassError
from finnlite.core.modes import DEFAULT_VERIFY_MODE, VERIFY_MODES  # noqa: F401 - re-exported
from finnlite.core.passes import Pass, Transformation, get_pass, run_pass
from finnlite.core.policies import DEFAULT_POLICY, Tolerance
from streamline.pipeline import default_stages, select_stages, stage_names
from streamline.preprocess import Preprocessing, parse_number

__all__ = ["Config", "PassSpec", "VerificationConfig", "ExternalPass", "load_config", "VERIFY_MODES"]


_TOP_KEYS = ("stages", "modules", "passes", "verification", "preprocessing")
_PREPROCESSING_KEYS = ("input_datatype", "scale", "mean", "std", "input")
_PASS_KEYS = ("pass", "stage", "before", "after")
_VERIFY_KEYS = ("mode", "samples", "seed", "input_range", "inputs", "tolerance", "near_ties", "near_tie_rtol",
                "float_rtol", "save_dir", "boundary")
_TOLERANCE_KEYS = ("atol", "rtol", "rtol_max", "steps")


@dataclass
class PassSpec:
    """A user pass to add: ``ref`` (``module:attribute`` or a registered name), the ``stage`` to add it to, and
    optionally the pass of that stage to put it ``before`` or ``after`` (default: at the end)."""

    ref: str
    stage: str
    before: str | None = None
    after: str | None = None
    key: str = "passes"


@dataclass
class VerificationConfig:
    """Verification settings; None means "not set" (the caller's default applies)."""

    mode: str | None = None
    samples: int | None = None
    seed: int = 0
    input_range: tuple[float, float] | None = None
    inputs: Path | None = None
    tolerance: dict[str, float] | None = None
    near_ties: bool = True
    near_tie_rtol: float | None = None
    float_rtol: float = 1e-5
    save_dir: Path | None = None
    #: boundary-seeking reference samples (:mod:`verify.boundary`)
    boundary: bool = False

    def policy(self) -> Any:
        """The default verification policy for passes that declare none (verify's default if not configured)."""
        if self.tolerance is None:
            return replace(DEFAULT_POLICY, near_ties=self.near_ties)
        return Tolerance(near_ties=self.near_ties, **self.tolerance)

    def hook_options(self) -> dict[str, Any]:
        """Keyword arguments for :class:`verify.VerificationHook`."""
        options: dict[str, Any] = {"policy": self.policy(), "save_dir": self.save_dir}
        if self.near_tie_rtol is not None:
            options["near_tie_rtol"] = self.near_tie_rtol
        return options


@dataclass
class Config:
    """A loaded configuration (module docstring). ``source`` names where it came from, for error messages."""

    source: str | None = None
    stages: list[str] | None = None
    modules: list[str] = field(default_factory=list)
    passes: list[PassSpec] = field(default_factory=list)
    verification: VerificationConfig = field(default_factory=VerificationConfig)
    base_dir: Path = field(default_factory=Path.cwd)
    #: a :class:`streamline.preprocess.Preprocessing` to put in front of the model, or None
    preprocessing: Any = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, *, source: str | None = None,
                  base_dir: str | Path | None = None) -> "Config":
        """Validate ``data`` (the parsed YAML) strictly; paths are relative to ``base_dir`` (default: cwd)."""
        return _Parser(source, Path(base_dir) if base_dir is not None else Path.cwd()).config(data)

    def error(self, key: str, message: str) -> ConfigError:
        """A :class:`ConfigError` naming this config's file and ``key``."""
        return ConfigError(f"key '{key}': {message}", file=self.source)

    def import_modules(self) -> None:
        """Import ``modules`` (with the config's folder importable)."""
        for i, name in enumerate(self.modules):
            _import(self, name, f"modules[{i}]")

    def build_stages(self, only: list[str] | None = None) -> list[Any]:
        """The default stages, restricted to ``only`` (else to ``stages``) and with the user passes added. Imports
        ``modules`` first. A :class:`ConfigError` names the key of any reference that does not resolve."""
        self.import_modules()
        stages = [replace(s, passes=list(s.passes)) for s in default_stages()]  # every field kept
        by_name = {s.name: s for s in stages}
        for spec in self.passes:
            stage = by_name.get(spec.stage)
            if stage is None:
                raise self.error(f"{spec.key}.stage", f"no stage '{spec.stage}' (stages: {', '.join(by_name)})")
            p = _resolve_pass(self, spec)
            names = [_pass_name(x) for x in stage.passes]
            anchor = spec.before or spec.after
            if anchor is None:
                index = len(names)
            elif anchor not in names:
                raise self.error(f"{spec.key}.{'before' if spec.before else 'after'}",
                                 f"stage '{stage.name}' has no pass '{anchor}'")
            else:
                index = names.index(anchor) + (0 if spec.before else 1)
            stage.passes.insert(index, p)
        try:
            return select_stages(stages, only if only is not None else self.stages)
        except ConfigError as exc:
            raise self.error("stages", exc.message) from None


def load_config(path: str | Path) -> Config:
    """Read and validate a YAML configuration file (module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError("configuration file not found", file=str(path))
    import yaml  # here, not at the top: a run without a configuration file does not load it

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"not valid YAML: {where}{problem}", file=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the configuration: {exc}", file=str(path)) from None
    return Config.from_dict(data, source=str(path), base_dir=path.resolve().parent)


class ExternalPass(Transformation):
    """A qonnx ``Transformation`` or a function ``f(model) -> bool`` run as a finnlite pass (with
    :func:`finnlite.core.passes.run_pass`) under the name of the object it wraps."""

    group = "user"

    def __init__(self, target: Any, name: str) -> None:
        self.target = target
        self.name = name  # type: ignore[misc]  # per instance: the wrapped object's name

    def apply(self, model: Any) -> bool:
        return run_pass(model, self.target)


# -- parsing -------------------------------------------------------------------------------------------------------
class _Parser:
    def __init__(self, source: str | None, base_dir: Path) -> None:
        self.source = source
        self.base_dir = base_dir

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"key '{key}': {message}", file=self.source)

    def mapping(self, value: Any, key: str, allowed: tuple[str, ...]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.error(key, f"must be a mapping with keys {', '.join(allowed)}; got {_kind(value)}")
        for k in value:
            if k not in allowed:
                full = f"{key}.{k}" if key else str(k)
                raise self.error(full, f"unknown key (allowed{' in ' + key if key else ''}: {', '.join(allowed)})")
        return value

    def config(self, data: Any) -> Config:
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(f"the configuration must be a mapping with keys {', '.join(_TOP_KEYS)}; got "
                              f"{_kind(data)}", file=self.source)
        self.mapping(data, "", _TOP_KEYS)
        cfg = Config(source=self.source, base_dir=self.base_dir)
        if "stages" in data:
            cfg.stages = self.names(data["stages"], "stages")
            known = stage_names()
            for i, name in enumerate(cfg.stages):
                if name not in known:
                    raise self.error(f"stages[{i}]", f"unknown stage '{name}' (stages: {', '.join(known)})")
        if "modules" in data:
            cfg.modules = self.names(data["modules"], "modules")
        if "passes" in data:
            if not isinstance(data["passes"], list):
                raise self.error("passes", f"must be a list of passes; got {_kind(data['passes'])}")
            cfg.passes = [self.pass_spec(item, f"passes[{i}]") for i, item in enumerate(data["passes"])]
        if "verification" in data:
            cfg.verification = self.verification(data["verification"])
        if "preprocessing" in data:
            cfg.preprocessing = self.preprocessing(data["preprocessing"])
        return cfg

    def preprocessing(self, data: Any) -> Any:

        key = "preprocessing"
        data = self.mapping(data, key, _PREPROCESSING_KEYS)

        def numbers(k: str) -> tuple[float, ...] | None:
            if k not in data:
                return None
            values = data[k] if isinstance(data[k], list) else [data[k]]
            try:
                return tuple(parse_number(v, f"{key}.{k}") for v in values)
            except ConfigError as exc:
                raise self.error(f"{key}.{k}", exc.message.split(": ", 1)[-1]) from None

        try:
            return Preprocessing(self.string(str(data.get("input_datatype", "UINT8")), f"{key}.input_datatype"),
                                 numbers("scale")[0] if "scale" in data else 1.0, numbers("mean"), numbers("std"),
                                 self.string(data["input"], f"{key}.input") if "input" in data else None)
        except ConfigError as exc:
            if exc.file:
                raise
            raise ConfigError(exc.message, file=self.source) from None

    def names(self, value: Any, key: str) -> list[str]:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(x, str) and x for x in value):
            raise self.error(key, f"must be a list of names; got {_kind(value)}")
        return list(value)

    def string(self, value: Any, key: str) -> str:
        if not isinstance(value, str) or not value:
            raise self.error(key, f"must be a non-empty string; got {_kind(value)}")
        return value

    def number(self, value: Any, key: str, *, minimum: float | None = None) -> float:
        if isinstance(value, str):  # YAML 1.1 reads 1e-5 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.error(key, f"must be a finite number; got {_kind(value)}")
        if minimum is not None and value < minimum:
            raise self.error(key, f"must be >= {minimum:g}; got {value:g}")
        return float(value)

    def integer(self, value: Any, key: str, *, minimum: int | None = None) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, f"must be an integer; got {_kind(value)}")
        if minimum is not None and value < minimum:
            raise self.error(key, f"must be >= {minimum}; got {value}")
        return value

    def path(self, value: Any, key: str) -> Path:
        p = Path(self.string(value, key)).expanduser()
        return p if p.is_absolute() else self.base_dir / p

    def pass_spec(self, item: Any, key: str) -> PassSpec:
        item = self.mapping(item, key, _PASS_KEYS)
        for required in ("pass", "stage"):
            if required not in item:
                raise self.error(f"{key}.{required}", "missing")
        if "before" in item and "after" in item:
            raise self.error(key, "give 'before' or 'after', not both")
        return PassSpec(self.string(item["pass"], f"{key}.pass"), self.string(item["stage"], f"{key}.stage"),
                        self.string(item["before"], f"{key}.before") if "before" in item else None,
                        self.string(item["after"], f"{key}.after") if "after" in item else None, key)

    def verification(self, data: Any) -> VerificationConfig:
        data = self.mapping(data, "verification", _VERIFY_KEYS)
        v = VerificationConfig()
        key = "verification"
        if "mode" in data:
            mode = data["mode"]
            if mode is False:  # YAML 1.1 reads an unquoted off as false
                mode = "off"
            if mode not in VERIFY_MODES:
                raise self.error(f"{key}.mode", f"must be one of {', '.join(VERIFY_MODES)}; got {_kind(mode)}")
            v.mode = mode
        if "samples" in data:
            v.samples = self.integer(data["samples"], f"{key}.samples", minimum=1)
        if "seed" in data:
            v.seed = self.integer(data["seed"], f"{key}.seed", minimum=0)
        if "input_range" in data:
            r = data["input_range"]
            if not isinstance(r, list) or len(r) != 2:
                raise self.error(f"{key}.input_range", f"must be a list [low, high]; got {_kind(r)}")
            lo, hi = (self.number(x, f"{key}.input_range") for x in r)
            if lo > hi:
                raise self.error(f"{key}.input_range", f"low {lo:g} is above high {hi:g}")
            v.input_range = (lo, hi)
        if "inputs" in data:
            v.inputs = self.path(data["inputs"], f"{key}.inputs")
        if "tolerance" in data:
            tol = self.mapping(data["tolerance"], f"{key}.tolerance", _TOLERANCE_KEYS)
            v.tolerance = {k: self.number(x, f"{key}.tolerance.{k}", minimum=0.0) for k, x in tol.items()}
        if "near_ties" in data:
            if not isinstance(data["near_ties"], bool):
                raise self.error(f"{key}.near_ties", f"must be true or false; got {_kind(data['near_ties'])}")
            v.near_ties = data["near_ties"]
        if "near_tie_rtol" in data:
            v.near_tie_rtol = self.number(data["near_tie_rtol"], f"{key}.near_tie_rtol", minimum=0.0)
        if "float_rtol" in data:
            v.float_rtol = self.number(data["float_rtol"], f"{key}.float_rtol", minimum=0.0)
        if "save_dir" in data:
            v.save_dir = self.path(data["save_dir"], f"{key}.save_dir")
        if "boundary" in data:
            if not isinstance(data["boundary"], bool):
                raise self.error(f"{key}.boundary", f"must be true or false; got {_kind(data['boundary'])}")
            v.boundary = data["boundary"]
        return v


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, (dict, list)):
        return f"a {type(value).__name__}"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _pass_name(p: Any) -> str:
    return p if isinstance(p, str) else getattr(p, "name", None) or type(p).__name__


def _import(cfg: Config, module: str, key: str) -> Any:
    folder = str(cfg.base_dir)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise cfg.error(key, f"cannot import module '{module}' ({type(exc).__name__}: {exc})") from None
    except Exception as exc:  # noqa: BLE001 - a user module failing at import: report it on one line
        raise cfg.error(key, f"importing module '{module}' failed ({type(exc).__name__}: {exc})") from None


def _resolve_pass(cfg: Config, spec: PassSpec) -> Any:
    key = f"{spec.key}.pass"
    if ":" not in spec.ref:
        try:
            return get_pass(spec.ref)
        except PassError:
            raise cfg.error(key, f"no pass named '{spec.ref}' is registered (use 'module:Name' for a pass that "
                                 "is not registered)") from None
    module_name, _, attr = spec.ref.partition(":")
    if not module_name or not attr:
        raise cfg.error(key, f"'{spec.ref}' is not of the form module:Name")
    target: Any = _import(cfg, module_name, key)
    for part in attr.split("."):
        if not hasattr(target, part):
            raise cfg.error(key, f"module '{module_name}' has no attribute '{attr}'")
        target = getattr(target, part)
    if isinstance(target, type) and issubclass(target, Pass):
        if not issubclass(target, Transformation):
            raise cfg.error(key, f"'{spec.ref}' is an analysis, not a transformation")
        return target
    if isinstance(target, Transformation):
        return target
    if isinstance(target, Pass):
        raise cfg.error(key, f"'{spec.ref}' is an analysis, not a transformation")
    if _is_qonnx_transformation(target) or callable(target):
        name = getattr(target, "__name__", None) or type(target).__name__
        return ExternalPass(target, name)
    raise cfg.error(key, f"'{spec.ref}' is not a pass, a qonnx Transformation or a function")


def _is_qonnx_transformation(target: Any) -> bool:
    try:
        from qonnx.transformation.base import Transformation as QonnxTransformation
    except ImportError:  # pragma: no cover - qonnx is a dependency
        return False
    return isinstance(target, QonnxTransformation) or (isinstance(target, type) and
                                                       issubclass(target, QonnxTransformation))
