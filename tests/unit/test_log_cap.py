"""The pure part of the streamed log upload: blocks, the cap (head + tail), the notes."""

from __future__ import annotations

import random
import re
import threading

import pytest
from dtjob.azure.logs import (
    MAX_BLOCK_BYTES,
    NOTE_PREFIX,
    Cancelled,
    CappedLog,
    LogCap,
    LogSummary,
    cut_point,
    omission_marker,
    stop_when,
    truncation_note,
)
from dtjob.config import DEFAULT_LOG_CAP_BYTES, MIN_LOG_CAP_BYTES, load_config

CAP = LogCap(MIN_LOG_CAP_BYTES)  # 64 KiB: 16 KiB head, 4 KiB blocks


def lines_log(size: int, seed: int = 0) -> bytes:
    """A log of about `size` bytes: numbered lines of varied length, some of them non-ASCII."""
    rng = random.Random(seed)
    out: list[bytes] = []
    total = i = 0
    while total < size:
        line = f"line {i:07d} {'é' * rng.randint(0, 3)}{'x' * rng.randint(0, 300)}\n".encode()
        out.append(line)
        total += len(line)
        i += 1
    return b"".join(out)


def run(plan: CappedLog, data: bytes, chunk: int) -> tuple[dict[str, bytes], list[str]]:
    """Feed `data` in chunks as the upload does; returns the staged blocks and the committed block list."""
    staged: dict[str, bytes] = {}
    for start in range(0, len(data), chunk):
        for block in plan.feed(data[start : start + chunk]):
            assert block.block_id not in staged
            staged[block.block_id] = block.data
    for block in plan.finish():
        staged[block.block_id] = block.data
    return staged, plan.block_list()


def committed(data: bytes, cap: LogCap = CAP, chunk: int = 1000) -> tuple[bytes, CappedLog, dict[str, bytes]]:
    plan = CappedLog(cap)
    staged, order = run(plan, data, chunk)
    return b"".join(staged[i] for i in order), plan, staged


def test_cap_splits_a_quarter_head_and_blocks_of_a_sixteenth_up_to_a_mebibyte() -> None:
    assert (CAP.head_bytes, CAP.block_bytes) == (16 * 1024, 4 * 1024)
    default = LogCap(DEFAULT_LOG_CAP_BYTES)
    assert (default.head_bytes, default.block_bytes) == (16 * 2**20, MAX_BLOCK_BYTES)
    with pytest.raises(ValueError, match="at least 65536"):
        LogCap(MIN_LOG_CAP_BYTES - 1)


def test_cut_point_ends_blocks_at_a_line_end_in_their_second_half() -> None:
    assert cut_point(b"aaaa\nbbbbbbbbbbbb", 10) == 10  # the only line end is in the first half
    assert cut_point(b"aaaaaa\nbbbbbbbbbb", 10) == 7
    assert cut_point(b"aaaaaaaaa\nbbbbbbbb", 10) == 10
    assert cut_point(b"a" * 20, 10) == 10


def test_cut_point_never_splits_a_utf8_character() -> None:
    data = "aaaaaaaa€€".encode()  # € is 3 bytes: e2 82 ac at 8..10 and 11..13
    assert cut_point(data, 10) == 8
    assert cut_point(data, 9) == 8
    assert cut_point(data, 11) == 11
    assert data[: cut_point(data, 10)].decode() == "aaaaaaaa"
    assert cut_point(b"\x80" * 20, 10) == 7  # not UTF-8 at all: at most three bytes back


def test_a_log_within_the_cap_is_stored_byte_for_byte() -> None:
    for size in (0, 1, 5000, CAP.cap_bytes - 1):
        data = lines_log(size)[:size]
        stored, plan, staged = committed(data)
        assert stored == data
        assert not plan.summary().truncated
        assert plan.summary().total_bytes == size and plan.summary().omitted_bytes == 0
        assert all(0 < len(block) <= CAP.block_bytes for block in staged.values())


def test_a_log_of_exactly_the_cap_is_not_truncated() -> None:
    data = lines_log(CAP.cap_bytes)[: CAP.cap_bytes]
    stored, plan, _ = committed(data)
    assert stored == data and not plan.summary().truncated


def test_a_longer_log_keeps_a_note_its_head_a_marker_and_its_tail() -> None:
    data = lines_log(10 * CAP.cap_bytes, seed=3)
    stored, plan, _ = committed(data)
    summary = plan.summary()
    assert summary.truncated and summary.total_bytes == len(data)
    assert summary.head_bytes + summary.tail_bytes <= CAP.cap_bytes
    # Whole-block granularity: the head fills its quarter and the tail its share, less a block at most.
    assert CAP.head_bytes - CAP.block_bytes < summary.head_bytes <= CAP.head_bytes
    assert summary.tail_bytes > CAP.cap_bytes - summary.head_bytes - CAP.block_bytes
    note = truncation_note(summary, CAP.cap_bytes).encode()
    marker = omission_marker(summary.omitted_bytes, head_ends_line=True).encode()
    head, tail = data[: summary.head_bytes], data[len(data) - summary.tail_bytes :]
    assert stored == note + head + marker + tail
    # Both cuts fall on line ends, so the marker stands on a line of its own.
    assert head.endswith(b"\n") and data[len(data) - summary.tail_bytes - 1 :].startswith(b"\n")
    assert [line[:12] for line in stored.decode().splitlines() if line.startswith(NOTE_PREFIX)] == [
        f"{NOTE_PREFIX} This",
        f"{NOTE_PREFIX} ... ",
    ]
    assert len(stored) <= CAP.cap_bytes + len(note) + len(marker)


def test_a_log_without_line_ends_is_cut_at_exact_sizes_and_the_marker_starts_a_line() -> None:
    printable = bytes(0x20 + b % 0x5F for b in range(256))
    data = random.Random(1).randbytes(5 * CAP.cap_bytes).translate(printable)
    stored, plan, _ = committed(data, chunk=777)
    summary = plan.summary()
    assert summary.head_bytes == CAP.head_bytes
    marker = omission_marker(summary.omitted_bytes, head_ends_line=False)
    assert marker.startswith(f"\n{NOTE_PREFIX} ...")
    assert stored.endswith(data[-summary.tail_bytes :])
    assert marker.encode() + data[-summary.tail_bytes :] in stored


def test_blocks_do_not_depend_on_how_the_stream_is_chunked() -> None:
    data = lines_log(3 * CAP.cap_bytes, seed=7)
    expected, _, _ = committed(data, chunk=len(data))
    for chunk in (1, 3, 4096, 4097, 65536):
        assert committed(data, chunk=chunk)[0] == expected


def test_memory_stays_at_one_block_whatever_the_log_size() -> None:
    cap = LogCap(2**20)  # 64 KiB blocks
    chunk = 64 * 1024
    plan = CappedLog(cap)
    line = b"y" * 199 + b"\n"
    piece = line * (chunk // len(line))
    most = ids = 0
    for _ in range(20 * 2**20 // len(piece)):  # a 20 MiB log
        plan.feed(piece)
        most = max(most, plan.buffered_bytes)
    plan.finish()
    ids = len(plan.block_list())
    assert most <= cap.block_bytes + chunk
    assert ids <= 2 * cap.cap_bytes // cap.block_bytes + 2  # blocks are at least half full, plus 2 notes
    assert plan.summary().total_bytes == 20 * 2**20 // len(piece) * len(piece)


def test_block_ids_have_one_length_and_differ_between_uploads() -> None:
    first, second = CappedLog(CAP), CappedLog(CAP)
    staged_a, order_a = run(first, lines_log(3 * CAP.cap_bytes), 5000)
    staged_b, _ = run(second, lines_log(3 * CAP.cap_bytes), 5000)
    assert {len(i) for i in staged_a} == {32}
    assert set(order_a) <= set(staged_a) and not set(staged_a) & set(staged_b)
    assert CappedLog(CAP, nonce="abc")._next_id() == "0" * 21 + "abc" + "00000000"


def test_the_note_says_sizes_and_the_setting() -> None:
    summary = LogSummary(total_bytes=10_000_000, head_bytes=1000, tail_bytes=3000)
    note = truncation_note(summary, 4096)
    assert note.startswith(f"{NOTE_PREFIX} This log was 10000000 bytes")
    assert "log cap of 4096 bytes (DTJOB_LOG_CAP_BYTES)" in note
    assert re.search(r"first 1000 bytes and its last 3000 bytes; the 9996000 bytes", note)
    assert note.endswith("\n") and note.count("\n") == 1
    marker = f"{NOTE_PREFIX} ... 9996000 bytes of this log left out here ...\n"
    assert omission_marker(9_996_000, True) == marker
    assert omission_marker(9_996_000, False) == "\n" + marker


def test_a_cancelled_upload_stops_reading() -> None:
    cancel = threading.Event()
    chunks = stop_when(cancel, iter([b"a", b"b", b"c"]))
    assert next(chunks) == b"a"
    cancel.set()
    with pytest.raises(Cancelled):
        next(chunks)


def test_the_cap_is_an_operator_setting() -> None:
    assert load_config({}).log_cap_bytes == 64 * 2**20
    assert load_config({"DTJOB_LOG_CAP_BYTES": "1048576"}).log_cap_bytes == 2**20
    with pytest.raises(ValueError, match="DTJOB_LOG_CAP_BYTES must be at least 65536"):
        load_config({"DTJOB_LOG_CAP_BYTES": "1000"})
    with pytest.raises(ValueError, match="whole number of bytes, got '64Mi'"):
        load_config({"DTJOB_LOG_CAP_BYTES": "64Mi"})
