"""The Blob Storage sink of `dtjob data prepare-imagenet`: the prepared tree straight under a prefix.

A blob exists only once its upload commits, so every put is atomic. Images are stored with Content-MD5, as
`dtjob data upload` stores them, so the stager verifies each download. The completion markers are small blobs
under `<prefix>/_prepare/` carrying their counts as metadata too, so one listing reads them all; the stager
leaves `_prepare/` out of what it stages (dtjob.azure.download).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dtjob.datasets.imagenet_layout import MARKER_DIR, SPLITS, Marker, count_images
from dtjob.names import directory_prefix

if TYPE_CHECKING:
    from azure.storage.blob import ContainerClient


@dataclass
class BlobSink:
    client: Callable[[], ContainerClient]
    prefix: str
    location: str  # e.g. "container datasets, prefix imagenet/"
    concurrency: int = 16

    def markers(self) -> dict[str, Marker]:
        base = directory_prefix(self.prefix)
        found: dict[str, Marker] = {}
        listing = self.client().list_blobs(name_starts_with=f"{base}{MARKER_DIR}/", include=["metadata"])
        for blob in listing:
            meta = blob.metadata or {}
            try:
                marker = Marker(int(meta["images"]), int(meta["bytes"]))
            except (KeyError, ValueError):
                continue  # not one of ours, or damaged: the unit is redone
            found[blob.name[len(base) :]] = marker
        return found

    def begin(self, unit_dir: str) -> None:
        """Nothing to sweep: an interrupted upload leaves no blob (uncommitted blocks expire on their own)."""

    def put(self, rel: str, data: bytes) -> None:
        from azure.storage.blob import ContentSettings

        self.client().upload_blob(
            self._name(rel),
            data,
            length=len(data),
            overwrite=True,
            content_settings=ContentSettings(content_type="image/jpeg", content_md5=_md5(data)),
        )

    def mark(self, rel: str, marker: Marker) -> None:
        from azure.storage.blob import ContentSettings

        body = marker.to_json().encode()
        self.client().upload_blob(
            self._name(rel),
            body,
            overwrite=True,
            metadata={"images": str(marker.images), "bytes": str(marker.bytes)},
            content_settings=ContentSettings(content_type="application/json", content_md5=_md5(body)),
        )

    def counts(self) -> dict[str, dict[str, int]]:
        return count_images(self._names())

    def _names(self) -> Iterator[str]:
        base = directory_prefix(self.prefix)
        for split in SPLITS:
            for name in self.client().list_blob_names(name_starts_with=f"{base}{split}/"):
                yield name[len(base) :]

    def _name(self, rel: str) -> str:
        return directory_prefix(self.prefix) + rel


def _md5(data: bytes) -> bytearray:
    return bytearray(hashlib.md5(data, usedforsecurity=False).digest())
