"""The verification modes, named once for the CLI, the configuration file and the build step.

``off`` checks nothing; ``final`` compares the result with the original; ``each`` checks every pass as it runs,
then compares the result with the original. This module imports nothing, so the CLI can offer the choices
without loading the pipeline.
"""

#: the verification modes: none, the final check against the original, per-pass verification (and the final check)
VERIFY_MODES = ("off", "final", "each")
#: what runs when nothing asks otherwise: every pass is checked as it runs, then the result against the original
DEFAULT_VERIFY_MODE = "each"
