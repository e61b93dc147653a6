"""A deliberately wrong rule, for the tests of the CLI and the build step: the user module a config adds.

Copied beside a test's config file (the config's folder is importable) and referenced as ``bad_rules:ShiftThresholds``.
"""

from __future__ import annotations

from finnlite import Rule


class ShiftThresholds(Rule):
    """MultiThreshold(x, T) → MultiThreshold(x, T + 3)  (wrong: every level moves up by three input units)."""

    op_types = ("MultiThreshold",)

    def match(self, model, node):
        t = node.inputs[1]
        return node if t is not None and model.is_initializer(t.name) and not t.name.startswith("shifted") else None

    def rewrite(self, model, node):
        shifted = model.get_initializer(node.inputs[1].name) + 3
        node.replace_input_with(1, model.add_initializer(shifted.astype("float32"), prefix="shifted"))


def no_op(model):
    """A plain function pass that changes nothing."""
    return False


class AbsThresholds(Rule):
    """MultiThreshold(x, T) → MultiThreshold(x, |T|)  (wrong where T has negative elements: in the hidden layers of
    the example, not in its first layer, which thresholds the float input)."""

    op_types = ("MultiThreshold",)

    def match(self, model, node):
        t = node.inputs[1]
        return node if t is not None and model.is_initializer(t.name) and not t.name.startswith("abs") else None

    def rewrite(self, model, node):
        t = model.get_initializer(node.inputs[1].name)
        node.replace_input_with(1, model.add_initializer(abs(t), prefix="abs"))


class ShiftOneThreshold(Rule):
    """MultiThreshold(x, T) → MultiThreshold(x, T'), T' a copy of T (exact) — except at the second MultiThreshold of
    the graph, where T' = T + 3 (wrong): a rule that breaks one node of several, for self-healing."""

    op_types = ("MultiThreshold",)

    def match(self, model, node):
        t = node.inputs[1]
        return node if t is not None and model.is_initializer(t.name) and not t.name.startswith("copied") else None

    def rewrite(self, model, node):
        thresholds = [n for n in model.graph if n.op_type == "MultiThreshold"]
        t = model.get_initializer(node.inputs[1].name)
        if thresholds.index(node) == 1:
            t = t + 3
        node.replace_input_with(1, model.add_initializer(t.astype("float32"), prefix="copied"))
