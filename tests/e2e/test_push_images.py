"""`make push-images REGISTRY=...` (hack/push-images.sh) against a real registry on 127.0.0.1: the images land
under the names the Helm chart gives the operator and the jobs, `<registry>/dtjob/<name>:<appVersion>`, each
byte for byte the image built. The test pushes the images this machine built (DTJOB_PUSH_FROM=testbed); the
build the command runs by default pulls its bases from a registry this test bed cannot reach (the same
Dockerfiles, on debian:bookworm-slim where the test bed has a local Debian base). The small images only: the
Horovod ones are gigabytes of the same path."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from testbed.registry import run_registry
from tests.tools import REPO, tool

pytestmark = pytest.mark.e2e
NAMES = ("operator", "stager", "mpi")


def built_digest(name: str) -> str:
    layout = subprocess.run(
        [str(REPO / "hack" / "build-images.sh"), "layout", name], capture_output=True, text=True, check=True
    ).stdout.strip()
    return Path(f"{layout}.digest").read_text().strip()


def test_push_images_lands_every_image_under_the_names_the_chart_uses(tmp_path: Path) -> None:
    app_version = yaml.safe_load((REPO / "charts" / "dtjob" / "Chart.yaml").read_text())["appVersion"]
    with run_registry(tmp_path) as registry:
        env = {**os.environ, "DTJOB_PUSH_FROM": "testbed", "DTJOB_PUSH_NAMES": " ".join(NAMES),
               "DTJOB_PUSH_TLS_VERIFY": "false"}  # fmt: skip
        done = subprocess.run(
            ["make", "--no-print-directory", "push-images", f"REGISTRY={registry.host}"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        pushed = [f"{registry.host}/dtjob/{name}:{app_version}" for name in NAMES]
        assert done.stdout.split() == pushed, done.stdout
        for name in NAMES:
            assert registry.tags(f"dtjob/{name}") == [app_version]
            assert registry.manifest_digest(f"dtjob/{name}", app_version) == built_digest(name), name
        # The chart, given the registry, names exactly what was pushed, for the operator and for the jobs.
        rendered = subprocess.run(
            [tool("helm"), "template", "dtjob", str(REPO / "charts" / "dtjob"), "--set",
             f"global.imageRegistry={registry.host}"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        deployment = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Deployment")
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        env_of = {e["name"]: e.get("value") for e in container["env"]}
        assert container["image"] == pushed[0] and env_of["DTJOB_STAGER_IMAGE"] == pushed[1]
        refused = subprocess.run(
            [str(REPO / "hack" / "push-images.sh"), "not a registry"], capture_output=True, text=True
        )
        assert refused.returncode != 0 and "REGISTRY must be a registry host" in refused.stderr
