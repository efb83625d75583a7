"""The README's AKS guide, step by step, against the test bed's real API server: every `kubectl` command it
shows runs as written, in its order; `dtjob fileserver create --apply` is stood in for by the objects it
writes (its Azure side is tested with the ARM protocol player in tests/azure); `helm install` renders with
the guide's values through real helm; and the job the guide applies is accepted by the CRD and by the
operator's own parser. What needs Azure itself (`az`, `dtjob pool`, `dtjob data`, a registry) cannot run
here, and the test says which commands it left out, so a new `kubectl` step is never skipped silently."""

from __future__ import annotations

import base64
import os
import re
import shlex
import subprocess
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest
import yaml
from dtjob.cli.main import build_parser
from dtjob.config import OperatorConfig
from dtjob.datasets.fileserver_volume import Share, persistent_volume, persistent_volume_claim
from dtjob.spec.parse import parse_spec
from kubernetes import client

from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs
from tests.tools import REPO, tool

pytestmark = pytest.mark.integration
GUIDE_NAMESPACE = "ml"
# Commands the guide shows that need Azure (or a registry, or a finished job) and cannot run here.
NEEDS_AZURE = (
    "az ",
    "dtjob pool ",
    "dtjob data ",
    "dtjob results ",
    "dtjob status ",
    "dtjob logs ",
    "export ",
    "make push-images ",  # a registry: tests/e2e/test_push_images.py pushes to one
)


def guide_commands() -> list[str]:
    """The `$ ...` commands of the README's AKS guide, in order, continuation lines joined."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Running on a real AKS cluster", 1)[1].split("\n## ", 1)[0]
    commands: list[str] = []
    for block in re.findall(r"```console\n(.*?)```", section, flags=re.S):
        current: list[str] = []
        for raw in block.splitlines():
            line = raw.strip()
            if line.startswith("$ "):
                current = [line[2:]]
            elif current:
                current.append(line)
            else:
                continue
            if not line.endswith("\\"):
                commands.append(" ".join(part.rstrip("\\").strip() for part in current))
                current = []
    return commands


def run(command: str, kubeconfig: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", command],
        cwd=REPO,
        env={**os.environ, **env, "KUBECONFIG": kubeconfig},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def clean_namespace(core_v1: client.CoreV1Api) -> Iterator[None]:
    """The guide's namespace and share volume absent before and removed after (the guide creates them)."""
    share = guide_share()

    def remove() -> None:
        calls: list[Callable[[], object]] = [
            lambda: core_v1.delete_namespace(GUIDE_NAMESPACE),
            lambda: core_v1.delete_persistent_volume(f"dtjob-{share.account}-{share.name}"),
        ]
        for call in calls:
            try:
                call()
            except client.ApiException as err:
                if err.status != 404:
                    raise

    remove()
    wait_for(
        lambda: all(n.metadata.name != GUIDE_NAMESPACE for n in core_v1.list_namespace().items),
        timeout=120, what=f"namespace {GUIDE_NAMESPACE} gone",
    )  # fmt: skip
    yield
    remove()


def guide_share() -> Share:
    return Share("mlfiles", "datasets", "mlfiles.file.core.windows.net", 1024)


def test_the_aks_guide_runs_in_order(
    kubeconfig: str, jobs: Jobs, core_v1: client.CoreV1Api, simulated_pool: Any, clean_namespace: None
) -> None:
    parser = build_parser()
    for command in guide_commands():  # every dtjob command as the guide spells it: no stale flag
        if command.startswith("dtjob "):
            try:
                parser.parse_args(shlex.split(command)[1:])
            except SystemExit as refused:
                raise AssertionError(f"the guide's {command!r} does not parse") from refused
    key = base64.b64encode(b"k" * 64).decode()
    env = {"AZURE_STORAGE_KEY": key}
    ran: list[str] = []
    left_out: list[str] = []
    for command in guide_commands():
        if command.startswith("kubectl ") and " -w" in f"{command} ":
            left_out.append(command)  # a watch never ends
        elif command.startswith("kubectl "):
            done = run(command, kubeconfig, env)
            assert done.returncode == 0, f"{command}\n{done.stdout}{done.stderr}"
            ran.append(command)
            if "agentpool=gpu" in command:
                gpus = [line.split()[-1] for line in done.stdout.splitlines()[1:]]
                assert gpus and all(g.isdigit() and int(g) > 0 for g in gpus), done.stdout
        elif command.startswith("dtjob fileserver create") and "--apply" in command:
            args = shlex.split(command)
            assert args[args.index("-n") + 1] == GUIDE_NAMESPACE and "mlfiles" in args, command
            share = guide_share()
            for obj in (
                persistent_volume(share, GUIDE_NAMESPACE, "datasets"),
                persistent_volume_claim(share, GUIDE_NAMESPACE, "datasets"),
            ):
                done = subprocess.run(
                    [tool("kubectl"), "--kubeconfig", kubeconfig, "apply", "-f", "-"],
                    input=yaml.safe_dump(obj), capture_output=True, text=True, timeout=60,
                )  # fmt: skip
                assert done.returncode == 0, done.stderr
            ran.append(command)
        elif command.startswith("helm install "):
            args = shlex.split(command)
            rendered = subprocess.run(
                [tool("helm"), "template", *args[2:]], cwd=REPO, capture_output=True, text=True, timeout=120
            )
            assert rendered.returncode == 0, rendered.stderr
            docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
            deployment = next(d for d in docs if d["kind"] == "Deployment")
            pod = deployment["spec"]["template"]["spec"]
            assert pod["nodeSelector"] == {"kubernetes.azure.com/agentpool": "cpu"}
            container = pod["containers"][0]
            assert container["image"].startswith("mlregistry.azurecr.io/dtjob/operator:")
            environment = {e["name"]: e.get("value") for e in container["env"]}
            assert environment["DTJOB_CPU_POOL"] == "cpu"
            assert environment["DTJOB_WRITE_CONTAINERS"] == "results"
            assert environment["DTJOB_STAGER_IMAGE"].startswith("mlregistry.azurecr.io/dtjob/stager:")
            ran.append(command)
        else:
            assert command.startswith((*NEEDS_AZURE, "dtjob fileserver ", "helm upgrade ")), command
            left_out.append(command)
    applied = [c for c in ran if c.startswith("kubectl apply -f examples/")]
    assert applied == ["kubectl apply -f examples/aks/fileserver-init.yaml",
                       "kubectl apply -f examples/aks/resnet50-imagenet.yaml"], ran  # fmt: skip
    secret = core_v1.read_namespaced_secret("storage-key", GUIDE_NAMESPACE)
    assert secret.metadata.labels["dtjob.io/storage-key"] == "true"
    assert base64.b64decode(secret.data["azurestorageaccountkey"]).decode() == key
    claim = core_v1.read_namespaced_persistent_volume_claim("datasets", GUIDE_NAMESPACE)
    assert claim.spec.volume_name == "dtjob-mlfiles-datasets"
    # The job the guide applies, as the operator would read it: every name it uses is one a step made.
    job = cast(
        dict[str, Any],
        jobs.custom.get_namespaced_custom_object(
            "dtjob.io", "v1alpha1", GUIDE_NAMESPACE, "distributedtrainingjobs", "resnet50-imagenet"
        ),
    )
    spec = parse_spec(job, OperatorConfig())
    assert spec.dataset.volume is not None and spec.run_policy.startup_deadline_seconds
    assert spec.dataset.staging is not None and spec.output is not None
    for location in (spec.dataset.staging.source.source, spec.output.target):
        ref = location.credentials.secret_ref
        assert ref is not None and ref.name == "storage-key" and location.account_name == "mlstore"
    print(f"ran {len(ran)} guide commands; left out (need Azure): {left_out}")
