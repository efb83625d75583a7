"""Pod logs streamed into block blobs in bounded memory, cut to a cap that keeps their head and tail.

A pod's log arrives from the API server as a byte stream of unknown length. `CappedLog` cuts it into blocks
(at most `LogCap.block_bytes` each, ending at a line end when the block's second half holds one) that are
staged on the blob as they arrive, so the operator holds about one block per log in flight, whatever the log's
size. The blob is then committed with one Put Block List:

- a log within the cap: every block in order, so the blob is the log byte for byte;
- a longer log: a note line at the top, the head (a quarter of the cap: the launch, framework versions, the
  host and rank layout), a marker line saying how many bytes are left out, and the tail (the rest of the
  cap: the last epochs and the error that ended the run). The blocks in between were staged but are left
  out of the list, and Blob Storage discards uncommitted blocks at the commit.

Why the middle is still read and staged: pods/log starts either at the beginning or a number of lines from
the end (tailLines), never a number of bytes from the end, and `limitBytes` cuts from the start; the only
byte-exact tail is the end of a full read. Holding the tail in memory instead would cost up to the cap per
log; staging costs only upload bandwidth for the bytes beyond the cap, and the kubelet serves just the
current log file (rotated at its containerLogMaxSize), which bounds that.

The pure part (`LogCap`, `cut_point`, `CappedLog`, the note texts) does no I/O; `upload_log` drives it
against a ContainerClient.
"""

from __future__ import annotations

import threading
import uuid
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dtjob.config import MIN_LOG_CAP_BYTES

if TYPE_CHECKING:
    from azure.storage.blob import ContainerClient

MAX_BLOCK_BYTES = 2**20
# Logs one upload streams at once; each holds about one block in memory.
LOG_UPLOAD_CONCURRENCY = 4
LOG_CONTENT_TYPE = "text/plain; charset=utf-8"
NOTE_PREFIX = "[dtjob]"
# Block IDs are this many characters before base64 (the SDK's own uploads use 32 too; every block ID of one
# blob must have the same length): a random prefix per upload, so a retry never reuses a stale block, and
# the block's index.
_NONCE_CHARS = 24
_INDEX_DIGITS = 8


@dataclass(frozen=True)
class LogCap:
    """At most `cap_bytes` of a pod's log are kept: the first `head_bytes` and the rest from the end."""

    cap_bytes: int

    def __post_init__(self) -> None:
        if self.cap_bytes < MIN_LOG_CAP_BYTES:
            raise ValueError(f"the log cap must be at least {MIN_LOG_CAP_BYTES} bytes, got {self.cap_bytes}")

    @property
    def head_bytes(self) -> int:
        return self.cap_bytes // 4

    @property
    def block_bytes(self) -> int:
        # A sixteenth of the cap at most, so the tail loses little of its budget to whole-block granularity.
        return min(MAX_BLOCK_BYTES, self.cap_bytes // 16)


@dataclass(frozen=True)
class Block:
    block_id: str
    data: bytes


@dataclass(frozen=True)
class LogSummary:
    """What one pod's blob holds: the log's length, and how much of its start and end were kept."""

    total_bytes: int
    head_bytes: int
    tail_bytes: int

    @property
    def omitted_bytes(self) -> int:
        return self.total_bytes - self.head_bytes - self.tail_bytes

    @property
    def truncated(self) -> bool:
        return self.omitted_bytes > 0


def cut_point(buffer: bytes | bytearray, limit: int) -> int:
    """Where a block of at most `limit` bytes from the start of `buffer` should end (len(buffer) > limit):
    after the last line end in its second half; else at `limit`, moved back off UTF-8 continuation bytes so
    that no character is split between two blocks (and so between the head and the omission marker)."""
    newline = buffer.rfind(b"\n", 0, limit)
    if newline >= limit // 2:
        return newline + 1
    cut = limit
    for _ in range(3):  # a UTF-8 character has at most three continuation bytes
        if cut > 1 and cut < len(buffer) and 0x80 <= buffer[cut] < 0xC0:
            cut -= 1
        else:
            break
    return cut


def truncation_note(summary: LogSummary, cap_bytes: int) -> str:
    """The first line of a truncated log's blob."""
    return (
        f"{NOTE_PREFIX} This log was {summary.total_bytes} bytes, more than the operator's log cap of "
        f"{cap_bytes} bytes (DTJOB_LOG_CAP_BYTES): below are its first {summary.head_bytes} bytes and its "
        f"last {summary.tail_bytes} bytes; the {summary.omitted_bytes} bytes between them are left out at "
        f"the line that starts with '{NOTE_PREFIX} ...'.\n"
    )


def omission_marker(omitted_bytes: int, head_ends_line: bool) -> str:
    """The line between the head and the tail of a truncated log (on a line of its own)."""
    start = "" if head_ends_line else "\n"
    return f"{start}{NOTE_PREFIX} ... {omitted_bytes} bytes of this log left out here ...\n"


class CappedLog:
    """Cuts a log's byte stream into blocks to stage, and says which to commit and in what order.

    `feed` each chunk as it arrives and stage the blocks it returns; then stage what `finish` returns and
    commit `block_list()`. Memory: the unfinished block (under `block_bytes` plus one chunk) and the IDs."""

    def __init__(self, cap: LogCap, nonce: str | None = None) -> None:
        self.cap = cap
        self._nonce = (nonce or uuid.uuid4().hex)[:_NONCE_CHARS].rjust(_NONCE_CHARS, "0")
        self._buffer = bytearray()
        self._count = 0
        self._total = 0
        self._in_head = True
        self._head: list[str] = []
        self._head_size = 0
        self._head_ends_line = True
        self._tail: deque[tuple[str, int]] = deque()
        self._tail_size = 0
        self._notes: list[str] = []
        self._finished = False

    @property
    def total_bytes(self) -> int:
        return self._total

    @property
    def buffered_bytes(self) -> int:
        """Bytes fed but not yet returned in a block."""
        return len(self._buffer)

    def feed(self, chunk: bytes) -> list[Block]:
        assert not self._finished, "feed after finish"
        self._total += len(chunk)
        self._buffer += chunk
        blocks: list[Block] = []
        while True:
            head_left = self.cap.head_bytes - self._head_size
            limit = min(self.cap.block_bytes, head_left) if self._in_head else self.cap.block_bytes
            if len(self._buffer) <= limit:  # wait for the byte after the block: is it mid-character?
                return blocks
            if not (self._in_head and head_left <= self.cap.block_bytes):
                blocks.append(self._take(cut_point(self._buffer, limit), ends_head=False))
                continue
            # The head's last block: it ends at the last line end within the budget, however early.
            newline = self._buffer.rfind(b"\n", 0, limit)
            if newline >= 0:
                blocks.append(self._take(newline + 1, ends_head=True))
            elif self._head_size and self._head_ends_line:
                self._in_head = False  # the line would cross the budget: the head ends before it
            else:
                blocks.append(self._take(cut_point(self._buffer, limit), ends_head=True))

    def finish(self) -> list[Block]:
        """The last partial block, and the note and marker blocks when the log is longer than the cap."""
        assert not self._finished, "finish twice"
        blocks = [self._take(len(self._buffer), ends_head=False)] if self._buffer else []
        self._finished = True
        summary = self.summary()
        if summary.truncated:
            note = truncation_note(summary, self.cap.cap_bytes)
            marker = omission_marker(summary.omitted_bytes, self._head_ends_line)
            blocks += [Block(self._next_id(), note.encode()), Block(self._next_id(), marker.encode())]
            self._notes = [blocks[-2].block_id, blocks[-1].block_id]
        return blocks

    def block_list(self) -> list[str]:
        """The IDs to commit, in order."""
        assert self._finished, "block_list before finish"
        tail = [block_id for block_id, _ in self._tail]
        if not self._notes:
            return self._head + tail
        note, marker = self._notes
        return [note, *self._head, marker, *tail]

    def summary(self) -> LogSummary:
        return LogSummary(self._total, self._head_size, self._tail_size)

    def _next_id(self) -> str:
        block_id = f"{self._nonce}{self._count:0{_INDEX_DIGITS}d}"
        self._count += 1
        return block_id

    def _take(self, size: int, ends_head: bool) -> Block:
        with memoryview(self._buffer) as view:
            data = bytes(view[:size])
        del self._buffer[:size]
        block = Block(self._next_id(), data)
        if self._in_head:
            self._head.append(block.block_id)
            self._head_size += size
            self._head_ends_line = data.endswith(b"\n")
            self._in_head = not ends_head
            return block
        self._tail.append((block.block_id, size))
        self._tail_size += size
        # The tail gets what the head left of the cap; the oldest blocks drop out of the window.
        while self._tail_size > self.cap.cap_bytes - self._head_size:
            _, dropped = self._tail.popleft()
            self._tail_size -= dropped
        return block


def upload_log(client: ContainerClient, blob_name: str, chunks: Iterable[bytes], cap: LogCap) -> LogSummary:
    """Stream `chunks` (one pod's log) into the block blob `blob_name`, cut to `cap`; overwrites, so a retried
    upload stores the fuller log. An exception from `chunks` leaves the blob as it was (nothing committed)."""
    from azure.storage.blob import BlobBlock, ContentSettings

    blob = client.get_blob_client(blob_name)
    plan = CappedLog(cap)
    for chunk in chunks:
        for block in plan.feed(chunk):
            blob.stage_block(block.block_id, block.data, length=len(block.data))
    for block in plan.finish():
        blob.stage_block(block.block_id, block.data, length=len(block.data))
    blob.commit_block_list(
        [BlobBlock(block_id) for block_id in plan.block_list()],
        content_settings=ContentSettings(content_type=LOG_CONTENT_TYPE),
    )
    return plan.summary()


class Cancelled(Exception):
    """Another log's upload failed, so this one stops too (its blob is left as it was)."""


def stop_when(cancel: threading.Event, chunks: Iterable[bytes]) -> Iterator[bytes]:
    """`chunks`, until `cancel` is set: then Cancelled, so a log half read is never committed."""
    for chunk in chunks:
        if cancel.is_set():
            raise Cancelled("cancelled after another log's upload failed")
        yield chunk
