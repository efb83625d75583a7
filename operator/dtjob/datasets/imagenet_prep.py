"""Prepare ILSVRC2012's tarballs as the `train/<wnid>/` and `val/<wnid>/` tree the trainers read, streamed
into a sink: a local directory (LocalSink, here) or a Blob Storage prefix (dtjob.azure.imagenet_sink).

The train tarball is read once, in tarfile's stream mode (`r|`): each per-class tar is read from the outer
stream as it passes, and each image goes to the sink as soon as it is read, a bounded number of images in
flight (never a whole class in memory). A class is a unit of work: its marker (`_prepare/train/<wnid>.json`)
is written only after all its images are committed, so a rerun skips the classes that have one and redoes
the rest. Val is one unit, with `_prepare/val.json`.

Before any image is written, the tarballs' headers are listed (tarfile seeks over member data, so this reads
about 1,000 + 50,000 headers, not the images) to check the val labels against the val images and the train
classes: a bad label file fails in seconds, not after the hours the train tarball takes.
"""

from __future__ import annotations

import os
import tarfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

from dtjob.azure.errors import StorageFailure
from dtjob.azure.parallel import run_bounded
from dtjob.azure.progress import Progress
from dtjob.contract.transfer_report import ExitCode
from dtjob.datasets.imagenet_layout import (
    MARKER_DIR,
    SPLITS,
    VAL_MARKER,
    Expected,
    LayoutError,
    Marker,
    ValLabels,
    check_labels,
    class_of_member,
    count_images,
    train_marker,
    train_path,
    val_path,
)

PART_SUFFIX = ".dtjob-part"


class Sink(Protocol):
    """Where the prepared tree goes. `put` and `mark` are called from several threads at once and must be
    atomic: a name either holds its whole content or does not exist."""

    concurrency: int

    @property
    def location(self) -> str:
        """Where, for messages: a directory, or a container URL and prefix."""
        ...

    def markers(self) -> dict[str, Marker]: ...
    def begin(self, unit_dir: str) -> None: ...
    def put(self, rel: str, data: bytes) -> None: ...
    def mark(self, rel: str, marker: Marker) -> None: ...
    def counts(self) -> dict[str, dict[str, int]]: ...


@dataclass(frozen=True)
class Outcome:
    classes_done: int
    classes_skipped: int
    val_done: bool
    train_classes: tuple[str, ...]


@dataclass
class Preparation:
    train_tar: Path
    val_tar: Path
    labels: ValLabels
    sink: Sink
    progress: Progress
    expected: Expected  # the image totals the progress counts towards
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def run(self) -> Outcome:
        train_classes = self._list_train_classes()
        val_images = _list_members(self.val_tar)
        wnid_of = check_labels(self.labels, val_images, train_classes, self.val_tar.name)
        done = self.sink.markers()
        self.progress.planned(
            self.expected.train + self.expected.val, _size(self.train_tar) + _size(self.val_tar)
        )
        self.progress.set_phase("transferring")
        if all(train_marker(wnid) in done for wnid in train_classes):
            # Nothing left in the train tarball: a rerun after a finished train pass does not read it again.
            images = sum(done[train_marker(wnid)].images for wnid in train_classes)
            self.progress.skipped_files(images, _size(self.train_tar))
            prepared, skipped = 0, len(train_classes)
        else:
            prepared, skipped = self._train(done)
        val_done = self._val(wnid_of, done)
        self.progress.set_phase("done")
        return Outcome(prepared, skipped, val_done, tuple(train_classes))

    def _list_train_classes(self) -> list[str]:
        classes = [class_of_member(name, self.train_tar.name) for name in _list_members(self.train_tar)]
        if not classes:
            raise LayoutError(f"{self.train_tar}: no per-class tars inside")
        return classes

    def _train(self, done: dict[str, Marker]) -> tuple[int, int]:
        prepared = skipped = 0
        consumed = 0
        with _open_stream(self.train_tar) as outer:
            for member in outer:
                if not member.isfile():
                    continue
                wnid = class_of_member(member.name, self.train_tar.name)
                marker = done.get(train_marker(wnid))
                if marker is not None:
                    self.progress.skipped_files(marker.images, member.size)
                    skipped += 1
                else:
                    source = outer.extractfile(member)
                    assert source is not None
                    images = self._write_unit(
                        _class_images(source, wnid, member.name), f"train/{wnid}", train_marker(wnid)
                    )
                    self.progress.add_bytes(member.size - images.bytes)
                    prepared += 1
                consumed += member.size
        self.progress.add_bytes(max(_size(self.train_tar) - consumed, 0))
        return prepared, skipped

    def _val(self, wnid_of: dict[str, str], done: dict[str, Marker]) -> bool:
        size = _size(self.val_tar)
        marker = done.get(VAL_MARKER)
        if marker is not None:
            self.progress.skipped_files(marker.images, size)
            return False
        archive = self.val_tar.name

        def images() -> Iterator[tuple[str, bytes]]:
            with _open_stream(self.val_tar) as tar:
                for member in tar:
                    if member.isfile():
                        yield val_path(wnid_of[member.name], member.name, archive), _read(tar, member)

        written = self._write_unit(images(), "val", VAL_MARKER)
        self.progress.add_bytes(size - written.bytes)
        return True

    def _write_unit(self, images: Iterator[tuple[str, bytes]], unit_dir: str, marker_name: str) -> Marker:
        """Put every image of one unit (in parallel, a bounded number in flight), then its marker."""
        self.sink.begin(unit_dir)
        count = total = 0

        def put(item: tuple[str, bytes], cancel: threading.Event) -> None:
            nonlocal count, total
            if cancel.is_set():
                return
            rel, data = item
            self.sink.put(rel, data)
            self.progress.add_bytes(len(data))
            self.progress.file_done()
            with self._lock:
                count += 1
                total += len(data)

        run_bounded(images, put, self.sink.concurrency, "prepare")
        marker = Marker(count, total)
        self.sink.mark(marker_name, marker)
        return marker


def _class_images(source: IO[bytes], wnid: str, member_name: str) -> Iterator[tuple[str, bytes]]:
    """The images of one per-class tar, read from the outer stream as it passes."""
    archive = f"{member_name} (in the train tarball)"
    with tarfile.open(fileobj=source, mode="r|") as inner:
        for member in inner:
            if member.isfile():
                yield train_path(wnid, member.name, archive), _read(inner, member)


def _read(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    extracted = tar.extractfile(member)
    assert extracted is not None  # a regular file
    return extracted.read()


def _open_stream(path: Path) -> tarfile.TarFile:
    try:
        return tarfile.open(path, mode="r|")
    except (tarfile.TarError, OSError) as err:
        raise _input_failure(path, err) from err


def _list_members(path: Path) -> list[str]:
    """Member names from the headers alone: in seekable mode tarfile seeks over each member's data."""
    try:
        with tarfile.open(path, mode="r:") as tar:
            return [member.name for member in tar if member.isfile()]
    except (tarfile.TarError, OSError) as err:
        raise _input_failure(path, err) from err


def _input_failure(path: Path, err: Exception) -> StorageFailure:
    if isinstance(err, OSError):
        return StorageFailure(ExitCode.LOCAL_IO, f"cannot read {path}: {err.strerror or err}")
    return StorageFailure(ExitCode.USAGE, f"{path}: not a readable tar archive ({err})")


def _size(path: Path) -> int:
    return path.stat().st_size


@dataclass
class LocalSink:
    """A local (or NFS) directory: each file written to a hidden temp name beside it, fsynced, renamed."""

    root: Path
    concurrency: int = 8
    fsync: bool = True

    @property
    def location(self) -> str:
        return str(self.root)

    def markers(self) -> dict[str, Marker]:
        found: dict[str, Marker] = {}
        marker_root = self.root / MARKER_DIR
        for path in marker_root.rglob("*.json") if marker_root.is_dir() else ():
            marker = Marker.from_json(path.read_text())
            if marker is not None:
                found[path.relative_to(self.root).as_posix()] = marker
        return found

    def begin(self, unit_dir: str) -> None:
        """Sweep the temp files a killed run left in a unit about to be redone."""
        unit = self.root / unit_dir
        if unit.is_dir():
            for leftover in unit.glob(f".*{PART_SUFFIX}"):
                leftover.unlink(missing_ok=True)

    def put(self, rel: str, data: bytes) -> None:
        self._write(self.root / rel, data)

    def mark(self, rel: str, marker: Marker) -> None:
        self._write(self.root / rel, marker.to_json().encode())

    def counts(self) -> dict[str, dict[str, int]]:
        return count_images(self._paths())

    def _paths(self) -> Iterator[str]:
        for split in SPLITS:
            top = self.root / split
            if not top.is_dir():
                continue
            for class_dir in os.scandir(top):
                if class_dir.is_dir():
                    for entry in os.scandir(class_dir.path):
                        if entry.is_file():
                            yield f"{split}/{class_dir.name}/{entry.name}"

    def _write(self, final: Path, data: bytes) -> None:
        final.parent.mkdir(parents=True, exist_ok=True)
        part = final.with_name(f".{final.name}{PART_SUFFIX}")
        try:
            with part.open("wb") as out:
                out.write(data)
                if self.fsync:
                    out.flush()
                    os.fsync(out.fileno())
            part.replace(final)
        except OSError as err:
            # Name the file the tree lacks, not its temp name.
            raise OSError(err.errno, err.strerror, str(final)) from err
        finally:
            part.unlink(missing_ok=True)
