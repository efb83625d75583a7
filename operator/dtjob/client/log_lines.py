"""A job's log as an iterator of lines, read by `dtjob logs`'s own follower (live from the pod, across world
restarts with `follow`, else the copy the operator uploaded) in a thread that hands its lines over a queue."""

from __future__ import annotations

import argparse
import queue
import threading
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, BinaryIO, cast

from dtjob.cli.kube_access import Cluster
from dtjob.cli.log_target import LogTarget
from dtjob.cli.logs import Follower

_END = object()


class Closed(Exception):
    """The reader stopped iterating: the follower stops at its next line."""


@dataclass(frozen=True)
class LogOptions:
    worker: int | None = None  # None: the launcher (every rank's output)
    follow: bool = False
    attempt: int | None = None
    container: str | None = None
    tail: int | None = None
    since_seconds: int | None = None
    timestamps: bool = False
    sas: str | None = None
    account_key: str | None = None

    def as_args(self) -> argparse.Namespace:
        """The options as `dtjob logs` parses its flags."""
        return argparse.Namespace(
            follow=self.follow, attempt=self.attempt, container=self.container,
            tail=-1 if self.tail is None else self.tail, since=self.since_seconds,
            timestamps=self.timestamps, sas=self.sas, account_key=self.account_key,
        )  # fmt: skip


class LineSink:
    """The follower's binary output: whole lines go to the queue, decoded (bad UTF-8 replaced)."""

    def __init__(self, lines: queue.Queue[Any], closed: threading.Event) -> None:
        self.lines = lines
        self.closed = closed
        self.pending = b""

    def write(self, data: bytes) -> int:
        *whole, self.pending = (self.pending + data).split(b"\n")
        for line in whole:
            self.put(line.decode(errors="replace"))
        return len(data)

    def put(self, item: Any) -> None:
        """Queue `item`, waiting while the reader is behind; Closed once the reader has stopped."""
        while not self.closed.is_set():
            try:
                self.lines.put(item, timeout=0.5)
                return
            except queue.Full:
                continue
        raise Closed

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def finish(self) -> None:
        """The end of the log: a last line without its newline is a line too."""
        if self.pending:
            self.put(self.pending.decode(errors="replace"))
            self.pending = b""

    def flush(self) -> None:
        pass


def log_lines(cluster: Cluster, job: str, options: LogOptions) -> Iterator[str]:
    """The log's lines without their newlines. Raises what the follower raises (KubeFailure, StorageFailure),
    at the point of the iteration where it happened."""
    if (options.worker or 0) < 0 or (options.attempt or 0) < 0 or (options.tail or 0) < 0:
        raise ValueError("worker, attempt and tail are 0 or more")
    lines: queue.Queue[Any] = queue.Queue(maxsize=10000)
    closed = threading.Event()
    sink = LineSink(lines, closed)
    failure: list[BaseException] = []

    def follow() -> None:
        try:
            Follower(cluster, LogTarget(job, options.worker), options.as_args(), cast(BinaryIO, sink)).run()
            sink.finish()
        except Closed:
            return
        except Exception as err:
            failure.append(err)
        with suppress(Closed):
            sink.put(_END)

    threading.Thread(target=follow, name=f"dtjob-logs-{job}", daemon=True).start()
    try:
        while (line := lines.get()) is not _END:
            yield line
    finally:
        closed.set()
    if failure:
        raise failure[0]
