"""FINN's and qonnx's transformation names: each that finnlite implements resolves with ``get_pass``, either as the
pass's own name or as an alias of the (possibly more general) rule that does it."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import streamline
from finnlite.core.passes import get_pass, list_aliases, list_passes

for _module in pkgutil.iter_modules(streamline.__path__):  # register every pass of the package
    importlib.import_module(f"streamline.{_module.name}")

#: FINN/qonnx name -> the finnlite pass doing it
FINN_NAMES = {
    "MoveScalarMulPastConv": "MoveMulPastLinear", "MoveMulPastDWConv": "MoveMulPastLinear",
    "ConvertSubToAdd": "SubToAdd", "ConvertDivToMul": "ConvertDivToMul",
    "MoveMulPastMaxPool": "MoveMulPastLinear", "MoveAddPastMul": "MoveAddPastMul",
    "MoveScalarAddPastMatMul": "MoveAddPastMatMul", "MoveScalarMulPastMatMul": "MoveMulPastLinear",
    "MoveAddPastConv": "MoveAddPastConv", "MoveLinearPastFork": "MoveLinearPastFork",
    "MoveAddPastFork": "MoveLinearPastFork", "MoveMulPastFork": "MoveLinearPastFork",
    "CollapseRepeatedMul": "CollapseRepeatedMul", "CollapseRepeatedAdd": "CollapseRepeatedAdd",
    "AbsorbAddIntoMultiThreshold": "AbsorbAddIntoMultiThreshold",
    "AbsorbMulIntoMultiThreshold": "AbsorbMulIntoMultiThreshold",
    "AbsorbSignBiasIntoMultiThreshold": "AbsorbSignBiasIntoMultiThreshold",
    "AbsorbTransposeIntoMultiThreshold": "AbsorbTransposeIntoMultiThreshold",
    "AbsorbConsecutiveTransposes": "AbsorbConsecutiveTransposes",
    "AbsorbScalarMulAddIntoTopK": "AbsorbScalarMulAddIntoTopK",
    "ConvertSignToThres": "ConvertSignToThreshold", "RoundAndClipThresholds": "RoundAndClipThresholds",
    "ConvertQuantActToMultiThreshold": "ConvertQuantActToMultiThreshold", "FoldQuantWeights": "FoldQuantWeights",
    "AvgPoolAndTruncToQuantAvgPool": "AvgPoolAndTruncToQuantAvgPool",
    "ConvertBipolarMatMulToXnorPopcount": "ConvertBipolarMatMulToXnorPopcount",
    "LowerConvsToMatMul": "LowerConvsToMatMul", "MakeMaxPoolNHWC": "MakeMaxPoolNHWC",
    "Change3DTo4DTensors": "Change3DTo4DTensors", "InferDataTypes": "InferDataTypes", "InferShapes": "InferShapes",
    "FoldConstants": "FoldConstants", "BatchNormToAffine": "BatchNormToAffine", "GemmToMatMul": "GemmToMatMul",
    "ExtractBiasFromConv": "ConvBiasToAdd", "FoldTransposeIntoQuantInit": "FoldTransposeIntoQuantInit",
    "QCDQToQuant": "QCDQToQuant", "MoveLinearPastEltwiseAdd": "MoveLinearPastEltwiseAdd",
    "MoveScalarLinearPastInvariants": "MoveLinearPastDataMovement",
    "InferPixelPaddingDeconv": "LowerConvTransposeToMatMul",
    "GiveUniqueNodeNames": "MakeNodeNamesUnique", "RemoveUnusedNodes": "RemoveDeadNodes",
    "RemoveUnusedTensors": "RemoveDeadNodes", "ConvertToChannelsLastAndClean": "ConvertToNHWC",
    "ConvertQONNXtoFINN": "ConvertQONNXtoFINN", "Streamline": "Streamline",  # the stages, as one pass each
}


@pytest.mark.parametrize("finn_name", sorted(FINN_NAMES))
def test_finn_name_resolves_to_the_pass_doing_it(finn_name: str) -> None:
    assert get_pass(finn_name).name == FINN_NAMES[finn_name]


def test_aliases_are_exactly_the_finn_names_finnlite_spells_differently() -> None:
    ours = {k: v for k, v in list_aliases().items() if get_pass(v).__module__.startswith("streamline.")}
    assert ours == {k: v for k, v in sorted(FINN_NAMES.items()) if k != v}
    assert not set(list_aliases()) & {p.name for p in list_passes()}


@pytest.mark.parametrize("name,stages", [("ConvertQONNXtoFINN", ("tidy", "convert")), ("Streamline", ("streamline",))])
def test_a_stage_name_runs_the_stage(name: str, stages: tuple[str, ...]) -> None:
    """FINN's names for whole stages run those stages: the same graph as the stages run by the pass manager."""
    from finnlite.core.model import Model
    from finnlite.core.passes import PassManager, fingerprint
    from finnlite.examples import build_tfc
    from streamline.pipeline import default_stages, select_stages

    by_alias, by_stages = Model(build_tfc()), Model(build_tfc())
    if name == "Streamline":  # the streamline stage takes a converted model
        for m in (by_alias, by_stages):
            m.transform(get_pass("ConvertQONNXtoFINN")())
    assert by_alias.transform(get_pass(name)()) is by_alias
    PassManager(select_stages(default_stages(), stages)).run(by_stages)
    assert fingerprint(by_alias) == fingerprint(by_stages)
    assert by_alias.op_histogram() != Model(build_tfc()).op_histogram()
