"""`dtjob logs` prints lines as they arrive: a line longer than the bound is cut with a marker, and the reader
never holds more of it than the bound, however long the pod keeps printing without a newline."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator

from dtjob.cli.logs import CUT_MARKER, MAX_LINE_BYTES, _lines

CHUNK = 64 * 1024


def test_a_gigabyte_without_a_newline_is_cut_and_never_held() -> None:
    max_line = 1024 * 1024

    def endless() -> Iterator[bytes]:
        block = b"x" * CHUNK
        for _ in range((1 << 30) // CHUNK):  # 1 GiB of one line
            yield block
        yield b"tail\nnext line\n"

    tracemalloc.start()
    try:
        out = list(_lines(endless(), max_line))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * max_line
    assert out[0] == b"x" * max_line + CUT_MARKER + b"\n"
    assert out[1:] == [b"next line\n"]


def test_the_default_bound_cuts_a_long_line() -> None:
    chunks = [b"y" * CHUNK] * (8 * MAX_LINE_BYTES // CHUNK) + [b"\n", b"after\n"]
    assert list(_lines(chunks)) == [b"y" * MAX_LINE_BYTES + CUT_MARKER + b"\n", b"after\n"]


def test_the_lines_around_a_cut_one_are_whole() -> None:
    chunks = [b"a\nb", b"b" * 20, b"b\nc\n", b"d" * 10, b"\n", b"e" * 11]
    assert list(_lines(chunks, 10)) == [
        b"a\n",
        b"b" * 10 + CUT_MARKER + b"\n",
        b"c\n",
        b"d" * 10 + b"\n",
        b"e" * 10 + CUT_MARKER + b"\n",
    ]


def test_short_lines_pass_as_they_are() -> None:
    assert list(_lines([b"one\ntw", b"o\n", b"\nthree"], 10)) == [b"one\n", b"two\n", b"\n", b"three"]
