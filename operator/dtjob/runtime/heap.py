"""Hands the C heap's free pages back to the system.

CPython's objects live in glibc's malloc heap: after a burst (hundreds of jobs created at once, each watch
event parsed into dicts and dropped), the freed memory stays mapped in the process, and its resident set
stays at the burst's peak although the live data is a fraction of it. malloc_trim(0) returns the free pages
at the top and inside every arena. Elsewhere than on glibc there is no such call, and nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


def _malloc_trim() -> Callable[[], object] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # musl and others have no malloc_trim
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


_TRIM = _malloc_trim()


def give_back_free_heap() -> bool:
    """Whether the C library could be asked to return its free heap pages."""
    if _TRIM is None:
        return False
    _TRIM()
    return True
