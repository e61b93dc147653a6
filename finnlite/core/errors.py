"""One exception hierarchy for finnlite.

Every error a user can cause derives from :class:`FinnliteError`; its message is one line that names the file,
node or tensor concerned. The CLI prints ``str(error)`` and exits with ``error.exit_code`` (2 for bad input or
usage, 1 for a failed verification) instead of showing a traceback.
"""

from __future__ import annotations


class FinnliteError(Exception):
    """Base class of all finnlite errors. ``exit_code`` is what the CLI returns for it."""

    exit_code = 2

    def __init__(self, message: str, *, file: str | None = None, node: str | None = None,
                 tensor: str | None = None) -> None:
        self.file = file
        self.node = node
        self.tensor = tensor
        where = []
        if file:
            where.append(f"file '{file}'")
        if node:
            where.append(f"node '{node}'")
        if tensor:
            where.append(f"tensor '{tensor}'")
        self.message = message
        text = f"{', '.join(where)}: {message}" if where else message
        super().__init__(" ".join(text.split("\n")))


class ModelLoadError(FinnliteError):
    """The model could not be read: missing, not a file, truncated, not ONNX, bad external data."""


class GraphError(FinnliteError):
    """The graph is malformed: a cycle, a tensor produced twice, an input nothing produces, bad shapes."""


class OpError(FinnliteError):
    """A node cannot be executed or inferred: unknown custom op, bad attribute, missing input."""


class DataTypeError(FinnliteError):
    """An unknown datatype name or a value that does not fit its annotation."""


class PassError(FinnliteError):
    """A pass failed or the pass manager could not reach a fixpoint."""


class FixpointError(PassError):
    """A stage did not converge within its iteration cap; the message names the oscillating passes."""


class ConfigError(FinnliteError):
    """A configuration file or option is invalid."""


class VerificationError(FinnliteError):
    """A model does not compute what its reference computes."""

    exit_code = 1
