"""Write a one-layer OCI image archive (for `ctr images import`) from files on this machine.

    python3 oci_image.py --name localhost/dtjob/pause:3.10 --entrypoint /pause --file pause=/pause OUT.tar

Used for the real node's sandbox image, which no reachable registry serves. The archive is reproducible:
fixed timestamps and owners, so the same inputs give the same digest (and containerd imports nothing new).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path


def _tar_bytes(members: list[tuple[str, bytes, int]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data, mode in members:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime, info.uid, info.gid = len(data), mode, 0, 0, 0
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _blob(data: bytes) -> tuple[str, bytes]:
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


def build(name: str, entrypoint: list[str], files: dict[str, Path], out: Path) -> str:
    layer_tar = _tar_bytes([(dest, src.read_bytes(), 0o755) for dest, src in sorted(files.items())])
    layer_gz = gzip.compress(layer_tar, mtime=0)
    diff_id = "sha256:" + hashlib.sha256(layer_tar).hexdigest()
    layer_digest, _ = _blob(layer_gz)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "User": "65535:65535"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }
    config_digest, config_bytes = _blob(json.dumps(config, sort_keys=True).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": len(config_bytes),
        },
        "layers": [
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                "digest": layer_digest,
                "size": len(layer_gz),
            }
        ],
    }
    manifest_digest, manifest_bytes = _blob(json.dumps(manifest, sort_keys=True).encode())
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest,
                "size": len(manifest_bytes),
                "annotations": {
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1],
                },
            }
        ],
    }
    blobs = [(d, b) for d, b in ((layer_digest, layer_gz), (config_digest, config_bytes),
                                  (manifest_digest, manifest_bytes))]  # fmt: skip
    members = [("oci-layout", b'{"imageLayoutVersion":"1.0.0"}', 0o644)]
    members += [("index.json", json.dumps(index, sort_keys=True).encode(), 0o644)]
    members += [(f"blobs/sha256/{d.removeprefix('sha256:')}", b, 0o644) for d, b in blobs]
    out.write_bytes(_tar_bytes(members))
    return manifest_digest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True)
    parser.add_argument("--entrypoint", required=True, nargs="+")
    parser.add_argument("--file", action="append", default=[], help="DEST=SRC (path inside the image)")
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    files = {dest: Path(src) for dest, src in (f.split("=", 1) for f in args.file)}
    print(build(args.name, args.entrypoint, files, args.out))


if __name__ == "__main__":
    main()
