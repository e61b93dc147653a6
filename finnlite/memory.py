"""Giving freed memory back to the operating system where a run's working set has just shrunk.

glibc's ``malloc`` keeps what a process frees for reuse: large blocks it first maps on their own, but after the
first such block is freed it raises its threshold (up to 32 MB) and serves later ones from the heap, where freed
pages stay resident until ``malloc_trim``. A streamlining run frees a lot at a few points — the original's folded
weights and activations after the reference outputs are computed, each weight a pass replaces, the final check's
executor — and without a trim that memory stays in the peak of everything that follows (the pass manager trims
after each stage and after passes that wrote a megabyte of new weights: ``finnlite.passes.TRIM_AFTER_BYTES``).
Measured on MobileNet-v1 (``--verify final``): 25-30 MB resident but free after the tidy and convert stages, which a
trim returns in about a millisecond. :func:`trim_heap` is a no-op where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import platform
from typing import Any

__all__ = ["trim_heap", "anonymous_memory", "status_bytes"]

#: glibc's malloc_trim, looked up once (False: not glibc, or not found)
_TRIM: Any = None


def _malloc_trim() -> Any:
    global _TRIM
    if _TRIM is None:
        _TRIM = False
        if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
            try:
                _TRIM = ctypes.CDLL(None).malloc_trim
                _TRIM.argtypes, _TRIM.restype = [ctypes.c_size_t], ctypes.c_int
            except (OSError, AttributeError):
                _TRIM = False
    return _TRIM


def trim_heap() -> bool:
    """Return the free pages of the C heap to the operating system (glibc's ``malloc_trim(0)``). Memory only:
    nothing allocated moves or changes. Returns whether memory was released (False where this is not glibc)."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim else False


def status_bytes(field: str) -> int | None:
    """A memory figure of this process from ``/proc/self/status`` (``VmRSS``, ``VmHWM``, ``RssAnon``, ...), in
    bytes; None where it cannot be read."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return None


def anonymous_memory() -> int:
    """The process's resident memory that no file backs (``RssAnon``), in bytes, or 0 where that cannot be read.
    Unlike the resident set it does not grow when the process first runs library code it shares with others (a
    forked process faults those pages in as it goes)."""
    return status_bytes("RssAnon") or 0
