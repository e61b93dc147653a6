"""The configuration file: a strict schema, one-line errors naming the file and the key, and what it configures."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from finnlite import ConfigError, Model
from finnlite.config import Config, ExternalPass, load_config
from finnlite.examples import build_tfc
from streamline.pipeline import stage_names
from tests.surfaces.conftest import HERE
from verify import Tolerance


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _error(tmp_path: Path, text: str) -> str:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path).build_stages()
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"file '{path}': "), message
    return message[len(f"file '{path}': "):]


@pytest.mark.parametrize("text, expected", [
    ("- a\n- b\n", "the configuration must be a mapping with keys stages, modules, passes, verification, preprocessing; got a list"),
    ("stage: [tidy]\n", "key 'stage': unknown key (allowed: stages, modules, passes, verification, preprocessing)"),
    ("verification:\n  mode: final\n  sample: 3\n", "key 'verification.sample': unknown key (allowed in "
     "verification: mode, samples, seed, input_range, inputs, tolerance, near_ties, near_tie_rtol, float_rtol, "
     "save_dir, boundary)"),
    ("verification:\n  tolerance: {rtol: 1e-5, tol: 1}\n", "key 'verification.tolerance.tol': unknown key "
     "(allowed in verification.tolerance: atol, rtol, rtol_max, steps)"),
    ("verification:\n  mode: sometimes\n", "key 'verification.mode': must be one of off, final, each; got "
     "'sometimes'"),
    ("verification:\n  samples: 0\n", "key 'verification.samples': must be >= 1; got 0"),
    ("verification:\n  samples: many\n", "key 'verification.samples': must be an integer; got 'many'"),
    ("verification:\n  seed: true\n", "key 'verification.seed': must be an integer; got True"),
    ("verification:\n  input_range: [1, 0]\n", "key 'verification.input_range': low 1 is above high 0"),
    ("verification:\n  input_range: 1\n", "key 'verification.input_range': must be a list [low, high]; got 1"),
    ("verification:\n  tolerance: {rtol: -1}\n", "key 'verification.tolerance.rtol': must be >= 0; got -1"),
    ("verification:\n  tolerance: {atol: .inf}\n", "key 'verification.tolerance.atol': must be a finite number; "
     "got inf"),
    ("verification:\n  near_ties: maybe\n", "key 'verification.near_ties': must be true or false; got 'maybe'"),
    ("verification: 3\n", "key 'verification': must be a mapping with keys mode, samples, seed, input_range, "
     "inputs, tolerance, near_ties, near_tie_rtol, float_rtol, save_dir, boundary; got 3"),
    ("stages: [tidy, polish]\n", "key 'stages[1]': unknown stage 'polish' (stages: " + ", ".join(stage_names())
     + ")"),
    ("stages: 3\n", "key 'stages': must be a list of names; got 3"),
    ("passes: {pass: X}\n", "key 'passes': must be a list of passes; got a dict"),
    ("passes:\n  - stage: tidy\n", "key 'passes[0].pass': missing"),
    ("passes:\n  - pass: X\n    stage: tidy\n    where: end\n", "key 'passes[0].where': unknown key (allowed in "
     "passes[0]: pass, stage, before, after)"),
    ("passes:\n  - pass: NoSuchPass\n    stage: tidy\n", "key 'passes[0].pass': no pass named 'NoSuchPass' is "
     "registered (use 'module:Name' for a pass that is not registered)"),
    ("passes:\n  - pass: InferDataTypes\n    stage: polish\n", "key 'passes[0].stage': no stage 'polish' (stages: "
     + ", ".join(stage_names()) + ")"),
    ("passes:\n  - pass: InferDataTypes\n    stage: tidy\n    before: Nothing\n", "key 'passes[0].before': stage "
     "'tidy' has no pass 'Nothing'"),
    ("passes:\n  - pass: InferDataTypes\n    stage: tidy\n    before: A\n    after: B\n", "key 'passes[0]': give "
     "'before' or 'after', not both"),
    ("passes:\n  - pass: no_such_module_xyz:Rule\n    stage: tidy\n", "key 'passes[0].pass': cannot import module "
     "'no_such_module_xyz' (ModuleNotFoundError: No module named 'no_such_module_xyz')"),
    ("passes:\n  - pass: 'json:'\n    stage: tidy\n", "key 'passes[0].pass': 'json:' is not of the form "
     "module:Name"),
    ("passes:\n  - pass: json:nothing_here\n    stage: tidy\n", "key 'passes[0].pass': module 'json' has no "
     "attribute 'nothing_here'"),
    ("passes:\n  - pass: json:__version__\n    stage: tidy\n", "key 'passes[0].pass': 'json:__version__' is not a "
     "pass, a qonnx Transformation or a function"),
    ("modules: [no_such_module_xyz]\n", "key 'modules[0]': cannot import module 'no_such_module_xyz' "
     "(ModuleNotFoundError: No module named 'no_such_module_xyz')"),
    ("verification:\n  mode: [final\n", "not valid YAML: line 3: expected ',' or ']', but got '<stream end>'"),
])
def test_errors_name_the_file_and_the_key(tmp_path: Path, text: str, expected: str) -> None:
    assert _error(tmp_path, text) == expected


def test_a_module_failing_at_import_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "broken_rules.py").write_text("raise RuntimeError('boom')\n", encoding="utf-8")
    assert _error(tmp_path, "modules: [broken_rules]\n") == ("key 'modules[0]': importing module 'broken_rules' "
                                                             "failed (RuntimeError: boom)")


def test_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="configuration file not found"):
        load_config(tmp_path / "none.yaml")
    cfg = load_config(_write(tmp_path, ""))  # an empty file is the default configuration
    assert cfg.stages is None and cfg.passes == [] and cfg.verification.mode is None
    assert [s.name for s in cfg.build_stages()] == stage_names()


def test_configured_stages_keep_every_field_of_the_default_ones() -> None:
    from dataclasses import fields

    from streamline.pipeline import default_stages

    def described(stages):
        return [tuple(getattr(s, f.name) for f in fields(s) if f.name != "passes") + (len(s.passes),) for s in stages]

    built = Config().build_stages()
    assert described(built) == described(default_stages())
    assert {s.name: s.check_whole for s in built}["lower"]  # checked once: see streamline.pipeline


def test_a_full_config(tmp_path: Path) -> None:
    shutil.copy(HERE / "bad_rules.py", tmp_path / "bad_rules.py")
    (tmp_path / "ref.npz").write_bytes(b"")
    path = _write(tmp_path, """
stages: [tidy, convert, streamline, finalize]
modules: [bad_rules]
passes:
  - pass: bad_rules:ShiftThresholds
    stage: streamline
    before: MaterializeThresholds
  - pass: bad_rules:no_op
    stage: tidy
    after: FoldConstants
  - pass: qonnx.transformation.general:GiveUniqueNodeNames
    stage: finalize
verification:
  mode: off
  samples: 3
  seed: 5
  input_range: [0, 1.5]
  inputs: ref.npz
  tolerance: {rtol: 1e-6, steps: 1}
  near_ties: false
  near_tie_rtol: 1.0e-7
  float_rtol: 0.001
  save_dir: failures
""")
    cfg = load_config(path)
    v = cfg.verification
    assert v.mode == "off" and v.samples == 3 and v.seed == 5 and v.input_range == (0.0, 1.5)
    assert v.inputs == tmp_path / "ref.npz" and v.save_dir == tmp_path / "failures" and v.float_rtol == 1e-3
    assert v.policy() == Tolerance(rtol=1e-6, steps=1, near_ties=False)
    assert v.hook_options()["near_tie_rtol"] == 1e-7
    stages = cfg.build_stages()
    assert [s.name for s in stages] == ["tidy", "convert", "streamline", "finalize"]
    names = {s.name: [p if isinstance(p, str) else p.name for p in s.passes] for s in stages}
    i = names["streamline"].index("ShiftThresholds")
    assert names["streamline"][i + 1] == "MaterializeThresholds"
    assert names["finalize"][-1] == "GiveUniqueNodeNames"
    assert names["tidy"][names["tidy"].index("FoldConstants") + 1] == "no_op"
    assert [s.name for s in cfg.build_stages(["tidy"])] == ["tidy"]
    # the defaults' stages are copies: the config does not leak into the default pipeline
    assert "ShiftThresholds" not in [p if isinstance(p, str) else p.name for s in Config().build_stages()
                                     for p in s.passes]


def test_external_passes_run(tmp_path: Path) -> None:
    """A qonnx Transformation and a plain function given by module:Name run as passes."""
    cfg = Config.from_dict({"stages": ["tidy"], "passes": [
        {"pass": "qonnx.transformation.general:GiveUniqueNodeNames", "stage": "tidy"}]})
    stage = cfg.build_stages()[0]
    p = stage.passes[-1]
    assert isinstance(p, ExternalPass) and p.name == "GiveUniqueNodeNames"
    model = Model(build_tfc())
    assert p.apply(model) is True
    assert sorted(n.name for n in model.graph)[0] == "BatchNormalization_0"


def test_yaml_off_and_float_spellings(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, "verification:\n  mode: off\n  float_rtol: 1e-3\n"))
    assert cfg.verification.mode == "off" and cfg.verification.float_rtol == 1e-3
