"""A container registry on 127.0.0.1, for the tests that push images: Debian's build of the CNCF
distribution registry (hack/install-registry.sh, unpacked into the cache, never installed as a service),
plain HTTP, its blobs in a directory of the caller's, stopped when the block ends."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from testbed.azurite import free_port
from testbed.operator_harness import terminate

_REPO = Path(__file__).resolve().parents[1]
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


@dataclass(frozen=True)
class Registry:
    host: str  # 127.0.0.1:<port>, as image references name it

    def tags(self, repository: str) -> list[str]:
        with urllib.request.urlopen(f"http://{self.host}/v2/{repository}/tags/list", timeout=10) as answer:
            tags: list[str] = json.loads(answer.read()).get("tags") or []
            return tags

    def manifest_digest(self, repository: str, tag: str) -> str | None:
        request = urllib.request.Request(
            f"http://{self.host}/v2/{repository}/manifests/{tag}",
            method="HEAD",
            headers={"Accept": OCI_MANIFEST},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                digest: str | None = answer.headers.get("Docker-Content-Digest")
                return digest
        except urllib.error.HTTPError as err:
            if err.code == 404:
                return None
            raise


def registry_binary() -> str:
    done = subprocess.run(
        [str(_REPO / "hack" / "install-registry.sh")], capture_output=True, text=True, check=True, timeout=600
    )
    return done.stdout.strip().splitlines()[-1]


@contextmanager
def run_registry(directory: Path) -> Iterator[Registry]:
    port = free_port()
    config = directory / "config.yml"
    config.write_text(
        "version: 0.1\n"
        f"storage: {{filesystem: {{rootdirectory: {directory / 'data'}}}}}\n"
        f"http: {{addr: '127.0.0.1:{port}'}}\n"
        "log: {level: warn}\n"
    )
    log = (directory / "registry.log").open("wb")
    proc = subprocess.Popen([registry_binary(), "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    registry = Registry(f"127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://{registry.host}/v2/", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    said = (directory / "registry.log").read_text()
                    raise RuntimeError(f"the registry did not start: {said}") from None
                time.sleep(0.2)
        yield registry
    finally:
        terminate(proc, grace_s=10)
        log.close()
