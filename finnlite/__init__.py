"""finnlite: a FINN-style streamlining frontend for QONNX models.

``import finnlite`` gives the core: :class:`Model`, the datatypes, the errors and the pass machinery. The faces
(CLI, build step, report) live in their own modules and are not imported here, so this import stays cheap.
"""

from finnlite.datatypes import BaseDataType, DataType
from finnlite.errors import (ConfigError, DataTypeError, FinnliteError, FixpointError, GraphError, ModelLoadError,
                             OpError, PassError, VerificationError)
from finnlite.model import Model
from finnlite.passes import (AnalysisPass, Miss, Pass, PassManager, Rule, Stage, Transformation, get_pass,
                             list_passes, register_pass)

__version__ = "0.1.0"

__all__ = ["Model", "DataType", "BaseDataType", "FinnliteError", "ModelLoadError", "GraphError", "OpError",
           "DataTypeError", "PassError", "FixpointError", "ConfigError", "VerificationError", "Pass",
           "Transformation", "AnalysisPass", "Rule", "Miss", "Stage", "PassManager", "register_pass", "get_pass",
           "list_passes", "__version__"]
