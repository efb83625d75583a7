"""The operator's heap trim binds glibc's malloc_trim (the images and this machine run on glibc)."""

from __future__ import annotations

import platform

from dtjob.runtime import heap


def test_free_heap_pages_can_be_given_back_on_glibc() -> None:
    assert platform.libc_ver()[0] == "glibc"
    assert heap.give_back_free_heap() is True
    assert heap.give_back_free_heap() is True  # again: harmless when nothing is free
