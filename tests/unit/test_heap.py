"""The operator's heap binds glibc (the images and this machine run on glibc): malloc_trim hands free pages
back, and mallopt limits the arenas its threads spread the heap over."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest
from dtjob.runtime import heap


def test_free_heap_pages_can_be_given_back_on_glibc() -> None:
    assert platform.libc_ver()[0] == "glibc"
    assert heap.give_back_free_heap() is True
    assert heap.give_back_free_heap() is True  # again: harmless when nothing is free


# A child that has threads call malloc at once (ctypes lets go of the GIL during the call, as the operator's
# threads do while they read answers), then counts its arenas in glibc's malloc_stats().
ARENAS = """
import ctypes, ctypes.util, sys, threading
from dtjob.runtime import heap
if sys.argv[1] == "limited":
    assert heap.limit_arenas()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def churn():
    for i in range(20000):
        libc.free(libc.malloc(1024 + i % 64 * 1024))
threads = [threading.Thread(target=churn) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
libc.malloc_stats()
"""


def arenas(mode: str) -> int:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    done = subprocess.run(
        [sys.executable, "-c", ARENAS, mode], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    return done.stderr.count("Arena ")


def test_the_operator_keeps_glibc_to_two_arenas_however_many_threads_allocate_at_once() -> None:
    assert arenas("limited") <= heap.MAX_ARENAS
    assert arenas("default") > heap.MAX_ARENAS, (
        "the threads never met in malloc: the check would prove nothing"
    )


def test_the_environment_decides_when_it_sets_the_arena_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert heap.limit_arenas() is False
