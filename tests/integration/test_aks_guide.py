"""The README's AKS guide, step by step, against the test bed's real API server: every `kubectl` command it
shows runs as written, in its order; `dtjob fileserver create --apply` is stood in for by the objects it
writes (its Azure side is tested with the ARM protocol player in tests/azure); `helm install` renders with
the guide's values through real helm; the NVIDIA device plugin it applies lands on the simulated GPU pool's
nodes and no other, tolerating what the operator's GPU pods tolerate; and the job the guide applies is
accepted by the CRD and by the operator's own parser. What needs Azure itself (`az`, `dtjob pool`, `dtjob
data`, a registry) cannot run here, and the test says which commands it left out, so a new `kubectl` step is
never skipped silently. Every `az` command the guide shows is parsed by the Azure CLI's own parser instead,
offline (hack/az_check.py, in the azure-cli venv that `make azure-cli` builds and names in AZURE_CLI_VENV)."""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import subprocess
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from dtjob.cli.main import build_parser
from dtjob.config import OperatorConfig, load_config
from dtjob.datasets.fileserver_volume import Share, persistent_volume, persistent_volume_claim
from dtjob.spec.parse import parse_spec
from kubernetes import client

from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs
from tests.tools import REPO, tool

pytestmark = pytest.mark.integration
GUIDE_NAMESPACE = "ml"
DEVICE_PLUGIN = "examples/aks/nvidia-device-plugin.yaml"
ACCELERATOR_LABEL = "kubernetes.azure.com/accelerator"
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


def device_plugin() -> dict[str, Any]:
    return cast(dict[str, Any], yaml.safe_load((REPO / DEVICE_PLUGIN).read_text()))


@pytest.fixture
def clean_namespace(core_v1: client.CoreV1Api) -> Iterator[None]:
    """The guide's namespace, share volume and device plugin absent before and removed after (the guide
    creates them)."""
    share = guide_share()
    apps = client.AppsV1Api(core_v1.api_client)
    plugin = device_plugin()["metadata"]

    def remove() -> None:
        calls: list[Callable[[], object]] = [
            lambda: core_v1.delete_namespace(GUIDE_NAMESPACE),
            lambda: core_v1.delete_persistent_volume(f"dtjob-{share.account}-{share.name}"),
            lambda: apps.delete_namespaced_daemon_set(plugin["name"], plugin["namespace"]),
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
    operator_config: OperatorConfig | None = None
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
            # The operator on the system pool (a default cluster's nodepool1), never on a GPU node.
            assert pod["nodeSelector"] == {"kubernetes.azure.com/mode": "system"}
            container = pod["containers"][0]
            assert container["image"].startswith("mlregistry.azurecr.io/dtjob/operator:")
            environment = {e["name"]: e["value"] for e in container["env"] if "value" in e}
            assert environment["DTJOB_CPU_POOL"] == ""  # CPU pods select no pool: nodepool1 takes them
            assert environment["DTJOB_WRITE_CONTAINERS"] == "results"
            assert environment["DTJOB_NFS_SHARES"] == ""  # the guide's jobs mount the share by its claim
            assert environment["DTJOB_STAGER_IMAGE"].startswith("mlregistry.azurecr.io/dtjob/stager:")
            operator_config = load_config(environment)
            ran.append(command)
        else:
            assert command.startswith((*NEEDS_AZURE, "dtjob fileserver ", "helm upgrade ")), command
            left_out.append(command)
    applied = [c for c in ran if c.startswith("kubectl apply -f examples/")]
    assert applied == [f"kubectl apply -f {DEVICE_PLUGIN}",
                       "kubectl apply -f examples/aks/fileserver-init.yaml",
                       "kubectl apply -f examples/aks/resnet50-imagenet.yaml"], ran  # fmt: skip
    assert operator_config is not None, "the guide installs no chart"
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
    spec = parse_spec(job, operator_config)
    assert spec.dataset.volume is not None and spec.run_policy.startup_deadline_seconds
    # Where its pods go with the chart's defaults: workers to pools.gpu, tolerating gpuTaint, which the device
    # plugin tolerates too; the launcher and the stager to no pool in particular.
    assert spec.placement.node_selector == {"kubernetes.azure.com/agentpool": operator_config.gpu_pool}
    assert spec.placement.launcher_node_selector == {}
    gpu_toleration = spec.placement.tolerations[0]
    assert (gpu_toleration["key"], gpu_toleration["value"]) == ("sku", "gpu")
    assert_device_plugin_serves_the_gpu_pool(jobs, simulated_pool, gpu_toleration)
    assert spec.dataset.staging is not None and spec.output is not None
    for location in (spec.dataset.staging.source.source, spec.output.target):
        ref = location.credentials.secret_ref
        assert ref is not None and ref.name == "storage-key" and location.account_name == "mlstore"
    print(f"ran {len(ran)} guide commands; left out (need Azure): {left_out}")


def tolerates(tolerations: list[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """Whether one of the tolerations matches the taint (Kubernetes' rule: key, effect, and the value unless
    the operator is Exists; an empty key with Exists matches every taint)."""
    for t in tolerations:
        if t.get("effect") not in (None, "", taint.get("effect")):
            continue
        if t.get("operator") == "Exists" and not t.get("key"):
            return True
        if t.get("key") != taint.get("key"):
            continue
        if t.get("operator") == "Exists" or t.get("value", "") == taint.get("value", ""):
            return True
    return False


def assert_device_plugin_serves_the_gpu_pool(
    jobs: Jobs, gpu_nodes: list[client.V1Node], gpu_toleration: Mapping[str, Any]
) -> None:
    """The device plugin the guide applied: it tolerates the taint the operator's GPU workers tolerate,
    selects the label AKS puts on GPU nodes, and the DaemonSet controller places it on every node of the
    simulated GPU pool (shaped like AKS's: hack/sim_nodes.py) and on no node without that label."""
    manifest = device_plugin()
    pod = manifest["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {ACCELERATOR_LABEL: "nvidia"}
    assert pod["priorityClassName"] == "system-node-critical"
    assert tolerates(pod["tolerations"], gpu_toleration), pod["tolerations"]
    for node in gpu_nodes:
        assert node.metadata.labels.get(ACCELERATOR_LABEL) == "nvidia", node.metadata.name
        for taint in node.spec.taints or []:
            assert tolerates(pod["tolerations"], {"key": taint.key, "value": taint.value,
                                                  "effect": taint.effect}), taint  # fmt: skip
    core = client.CoreV1Api(jobs.custom.api_client)
    meta = manifest["metadata"]
    selector = ",".join(f"{k}={v}" for k, v in manifest["spec"]["selector"]["matchLabels"].items())

    def placed() -> set[str] | None:
        pods = core.list_namespaced_pod(meta["namespace"], label_selector=selector).items
        nodes = {p.spec.node_name for p in pods if p.spec.node_name}
        return nodes if {n.metadata.name for n in gpu_nodes} <= nodes else None

    nodes = wait_for(placed, timeout=120, what="the device plugin on every simulated GPU node")
    # Other tests add and remove GPU nodes of their own meanwhile: judge the nodes that are still there.
    labels = {n.metadata.name: n.metadata.labels or {} for n in core.list_node().items}
    assert all(labels[n].get(ACCELERATOR_LABEL) == "nvidia" for n in nodes if n in labels), nodes


# Commands of Azure CLI extensions, which PyPI's azure-cli lacks (an extension installs from Microsoft's own
# index on first use): the options each declares, from its source (Azure/azure-cli-extensions, src/quota,
# azext_quota/aaz/latest/quota/_update.py), with the CLI's global ones.
EXTENSION_OPTIONS = {
    ("quota", "update"): {"--resource-name", "--scope", "--limit-object", "--resource-type", "--properties",
                          "--name", "--no-wait"},
}  # fmt: skip
GLOBAL_OPTIONS = {"--output", "-o", "--query", "--debug", "--verbose", "--only-show-errors", "--help", "-h"}
# What the guide's shell variables and `$(az ...)` substitutions stand for while its lines are replayed.
REPLAY_ENV = {"AZURE_SUBSCRIPTION_ID": "00000000-0000-0000-0000-000000000000", "AZURE_STORAGE_KEY": "a2V5"}
# No telemetry, survey, colour, upgrade check or extension download: the namespace has no route out.
AZ_OFFLINE_ENV = {
    "AZURE_CORE_COLLECT_TELEMETRY": "no",
    "AZURE_CORE_SURVEY_MESSAGE": "no",
    "AZURE_CORE_NO_COLOR": "yes",
    "AZURE_CORE_ONLY_SHOW_ERRORS": "yes",
    "AZURE_EXTENSION_USE_DYNAMIC_INSTALL": "no",
}


def az_calls(tmp_path: Path) -> list[list[str]]:
    """Every `az` call of the guide's lines, with its arguments as the shell hands them over: each line that
    calls `az` is run by bash with `az` a function that records its arguments and prints a placeholder, so
    quoting, `&&` and `$(az ...)` substitutions are bash's own. Lines that call `az` start with `az` or
    `export` (a variable set from its output): nothing else on them runs."""
    record = tmp_path / "az-calls"
    record.touch()
    shim = 'az() { printf "%s\\0" "$#" "$@" >>"$AZ_RECORD"; echo placeholder; }'
    for command in guide_commands():
        if not re.search(r"(^|[\s($;&|])az\s", command):
            continue
        assert command.startswith(("az ", "export ")), f"an `az` call on a line of another program: {command}"
        done = subprocess.run(
            ["bash", "-c", f"{shim}\n{command}"], env={"PATH": os.environ["PATH"], "AZ_RECORD": str(record),
            **REPLAY_ENV}, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert done.returncode == 0, f"{command}\n{done.stderr}"
    fields = record.read_text().split("\0")[:-1]
    calls: list[list[str]] = []
    while fields:
        count = int(fields[0])
        calls.append(fields[1 : 1 + count])
        fields = fields[1 + count :]
    return calls


def extension_refusal(argv: list[str]) -> str | None:
    options = EXTENSION_OPTIONS.get((argv[0], argv[1]) if len(argv) > 1 else (argv[0], ""))
    if options is None:
        return None
    unknown = [a.split("=", 1)[0] for a in argv if a.startswith("-") and a.split("=", 1)[0] not in options]
    unknown = [a for a in unknown if a not in GLOBAL_OPTIONS]
    return f"unrecognized arguments: {' '.join(unknown)}" if unknown else None


def test_every_az_command_in_the_guide_is_one_the_azure_cli_parses(tmp_path: Path) -> None:
    """Each `az` call the guide shows, parsed by the Azure CLI's own parser (its command table, its options,
    its enum values and required options), pinned and offline: a renamed command or flag fails here."""
    venv = os.environ.get("AZURE_CLI_VENV", "")
    assert venv and Path(venv, ".ready").exists(), (
        "run it through make (`make azure-cli` sets AZURE_CLI_VENV)"
    )
    calls = az_calls(tmp_path)
    named = {" ".join(c[:2]) for c in calls}
    assert named >= {"login", "aks create", "group delete", "vm list-usage", "quota update"}, named
    core = [c for c in calls if (c[0], c[1] if len(c) > 1 else "") not in EXTENSION_OPTIONS]
    config = tmp_path / "azure-config"
    config.mkdir()
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "AZURE_CONFIG_DIR": str(config),
        **AZ_OFFLINE_ENV,
    }
    done = subprocess.run(
        [str(Path(venv, "bin", "python")), "-I", str(REPO / "hack" / "az_check.py")],
        input=json.dumps(core), env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    refusals = dict(zip(map(" ".join, core), json.loads(done.stdout), strict=True))
    refusals.update({" ".join(c): extension_refusal(c) for c in calls if c not in core})
    refused = {f"az {call}": why for call, why in refusals.items() if why is not None}
    assert not refused, refused
    print(f"{len(core)} az calls parsed by azure-cli, {len(calls) - len(core)} checked against an extension")
