"""Keeps the C heap small: few arenas, and free pages handed back to the system.

CPython's objects live in glibc's malloc heap: after a burst (hundreds of jobs created at once, each watch
event parsed into dicts and dropped), the freed memory stays mapped in the process, and its resident set
stays at the burst's peak although the live data is a fraction of it. malloc_trim(0) returns the free pages
at the top and inside every arena. Elsewhere than on glibc there is no such call, and nothing is done.

glibc also gives each thread that finds the heap busy an arena of its own (up to eight per core), and each
keeps its own free pages: the reconcile threads' arenas held 3 MiB more at the peak of 100 jobs created at
once than two shared arenas did (78 MiB against 75), for the same CPU. The operator limits them to
MAX_ARENAS before its threads start; MALLOC_ARENA_MAX in the environment still wins.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


def _libc(function: str) -> Any | None:
    """A function of the C library, or None where it has none of that name (musl and others)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return getattr(ctypes.CDLL(name), function)
    except (OSError, AttributeError):
        return None


def _malloc_trim() -> Callable[[], object] | None:
    trim = _libc("malloc_trim")
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


_TRIM = _malloc_trim()
# mallopt's parameter for the most arenas (glibc's malloc.h).
_M_ARENA_MAX = -8
MAX_ARENAS = 2


def limit_arenas(count: int = MAX_ARENAS) -> bool:
    """Whether glibc took the limit on its arenas; call it before any thread starts. Nothing is done when
    MALLOC_ARENA_MAX is set (the operator's environment decides) or the C library is not glibc."""
    mallopt = None if "MALLOC_ARENA_MAX" in os.environ else _libc("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_ARENA_MAX, count))


def give_back_free_heap() -> bool:
    """Whether the C library could be asked to return its free heap pages."""
    if _TRIM is None:
        return False
    _TRIM()
    return True
