"""The streamlining stages and their rules (see :mod:`streamline.pipeline` for the default pipeline).

Every module that defines a pass is imported here, so ``import streamline`` registers all of them
(:func:`finnlite.core.registry.get_pass` finds each by name), whatever is imported first.
"""

from streamline import (absorb, absorb_monotone, algebra, border, channel_gather, collapse, convert, convert_acts,
                        convert_qcdq, convert_trunc, convert_weights, datatypes, finn_pool, finn_tail, join, join_conv,
                        layout, lower, lower_1d, lower_conv, lower_deconv, lower_pool, lower_space, monotone_movement,
                        move, pipeline, pool_sign, preprocess, reduce, reorder, round_thresholds, squeeze_pool, tidy,
                        topk, xnor)
from streamline.pipeline import default_stages, select_stages, stage_names, streamline_model

__all__ = ["default_stages", "select_stages", "stage_names", "streamline_model", "absorb", "absorb_monotone",
           "algebra", "border", "channel_gather", "collapse", "convert", "convert_acts", "convert_qcdq",
           "convert_trunc", "convert_weights", "datatypes", "finn_pool", "finn_tail", "join", "join_conv", "layout",
           "lower", "lower_1d", "lower_conv", "lower_deconv", "lower_pool", "lower_space", "monotone_movement", "move",
           "pipeline", "pool_sign", "preprocess", "reduce", "reorder", "round_thresholds", "squeeze_pool", "tidy",
           "topk", "xnor"]
