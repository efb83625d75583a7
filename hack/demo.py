"""`make demo`: a real PyTorch ResNet-50 job, end to end, on the local real node, then a playground.

Starts the real-node cluster (hack/realnode.sh: a control plane, a GPU-pool node and a system node that run
containers for real, cluster DNS, kube-proxy), imports the locally built training image, starts Azurite on the
node's address and the operator, and applies the sample job, shrunk to fit this machine: 2 workers x 1 slot,
a few steps at a small image size. Workers run sshd, the launcher starts horovodrun over SSH, the ranks
train, rank 0 uploads its results and the operator every pod's log to Azurite. The demo prints each change
of the job's status (real progress from rank 0), then downloads what was uploaded and says where to look.

Everything runs inside the network namespace the Makefile gives it (hack/netns.sh), which outlives the demo,
and so do the cluster, Azurite and the operator (detached, tracked by pidfiles in the demo's state dir,
testbed/pidfile.py): `make kubectl ARGS="..."` reaches the cluster, a second example can be applied, and
`make demo-down` stops all of it. A second `make demo` reuses the cluster and Azurite (what it holds stays)
and restarts the operator (this checkout's code, this run's settings).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from azure.storage.blob import BlobServiceClient

from hack.demo_common import banner, follow, kubectl_runner, start_operator_detached, wait_established
from hack.demo_job import DEFAULT_STEPS, EXAMPLE, demo_job
from testbed.azurite import start_azurite_detached
from testbed.cache import cache_root

REPO = Path(__file__).resolve().parents[1]
NAMESPACE = os.environ.get("DEMO_NAMESPACE", "dtjob-demo")
TIMEOUT_SECONDS = float(os.environ.get("DEMO_TIMEOUT", "900"))
STEPS = int(os.environ.get("DEMO_STEPS", str(DEFAULT_STEPS)))
NODE_IP = "10.224.0.1"
IMAGE = f"localhost/dtjob/horovod-pytorch:{os.environ.get('DTJOB_IMAGE_TAG', 'dev')}"
KEY_SECRET = "demo-storage-key"
CONTAINER = "demo"
# Azurite's own default port: an endpoint that stays the same from one run to the next.
AZURITE_PORT = 10000
# The Makefile's names for the demo's network namespace and cluster, and where the demo keeps its pidfiles,
# logs and downloads (DEMO_NETNS, DEMO_CLUSTER, DEMO_STATE there).
MAKE_DEFAULT_NAME = "dtjob-demo"
NETNS = os.environ.get("DEMO_NETNS", MAKE_DEFAULT_NAME)
CLUSTER = os.environ.get("REAL_CLUSTER_NAME", MAKE_DEFAULT_NAME)
STATE_DIR = Path(os.environ.get("DEMO_STATE") or cache_root() / "demo" / CLUSTER)
# The second example the demo offers: the user's own Horovod script on CPU workers, applied as it is.
PLAYGROUND_EXAMPLE = REPO / "examples" / "custom-script-cpu.yaml"


def realnode(*args: str) -> str:
    done = subprocess.run(
        [str(REPO / "hack" / "realnode.sh"), *args], check=True, stdout=subprocess.PIPE, text=True
    )
    return done.stdout.strip()


def job_manifest(endpoint: str) -> dict[str, Any]:
    """The demo's job (hack/demo_job.py), writing to the demo's container in Azurite."""
    return demo_job(
        {
            "endpoint": endpoint,
            "container": CONTAINER,
            "prefix": "runs",
            "credentials": {"authMode": "accountKey", "secretRef": {"name": KEY_SECRET}},
        },
        steps=STEPS,
    )


def playground_job(path: Path) -> dict[str, Any]:
    docs = yaml.safe_load_all(path.read_text())
    return next(d for d in docs if d and d.get("kind") == "DistributedTrainingJob")


def example_image(path: Path) -> str:
    """The image the example's job names (framework custom names its own)."""
    return str(playground_job(path)["spec"]["image"])


def make_command(target: str, args: str | None = None) -> str:
    """`make TARGET` as a user types it for this demo: the Makefile's variables only where they differ."""
    names = [f"DEMO_NETNS={NETNS}"] if NETNS != MAKE_DEFAULT_NAME else []
    names += [f"DEMO_CLUSTER={CLUSTER}"] if CLUSTER != MAKE_DEFAULT_NAME else []
    default_state = cache_root() / "demo" / CLUSTER
    if default_state != STATE_DIR:
        names.append(f"DEMO_STATE={STATE_DIR}")
    return " ".join(["make", target, *names, *([f'ARGS="{args}"'] if args is not None else [])])


def main() -> int:
    STATE_DIR.mkdir(parents=True, exist_ok=True)

    banner(
        "starting the real-node cluster (control plane, a GPU-pool node and a system node, DNS, kube-proxy)"
    )
    realnode("up")
    realnode("import-images", IMAGE)
    # The playground's example names the PyTorch image as published (the chart's default); the nodes reach no
    # registry, so they hold the local build under that name too.
    published = example_image(PLAYGROUND_EXAMPLE)
    realnode("tag-image", IMAGE, published)
    kubeconfig = realnode("kubeconfig")
    kubectl = kubectl_runner(kubeconfig)
    kubectl("get", "nodes", "-o", "wide", "-L", "kubernetes.azure.com/agentpool")

    banner("installing the DistributedTrainingJob CRD")
    kubectl("apply", "-f", str(REPO / "crds"))
    wait_established(kubectl)
    if f"namespace/{NAMESPACE}" not in kubectl("get", "namespaces", "-o", "name", capture=True).split():
        kubectl("create", "namespace", NAMESPACE)
    # The namespace enforces the restricted Pod Security Standard: every pod the operator creates meets it.
    kubectl("label", "namespace", NAMESPACE, "--overwrite", "pod-security.kubernetes.io/enforce=restricted")

    azurite_log = STATE_DIR / "azurite" / "azurite.log"
    banner(f"Azurite on {NODE_IP}:{AZURITE_PORT}, in memory, kept running (log: {azurite_log})")
    azurite = start_azurite_detached(
        STATE_DIR / "azurite", STATE_DIR / "azurite.pid", host=NODE_IP, port=AZURITE_PORT
    )
    service = BlobServiceClient(azurite.endpoint, credential=azurite.shared_key)
    if not service.get_container_client(CONTAINER).exists():
        service.create_container(CONTAINER)
    kubectl("delete", "secret", KEY_SECRET, "-n", NAMESPACE, "--ignore-not-found")
    kubectl("create", "secret", "generic", KEY_SECRET, "-n", NAMESPACE,
            f"--from-literal=azurestorageaccountkey={azurite.account_key}")  # fmt: skip
    # The operator signs with an account key only from a Secret labelled for it.
    kubectl("label", "secret", KEY_SECRET, "-n", NAMESPACE, "dtjob.io/storage-key=true")

    env = {
        "DTJOB_IMAGE_PYTORCH": IMAGE,
        "DTJOB_EMULATOR_HOSTS": NODE_IP,
        "DTJOB_ALLOWED_STORAGE_ACCOUNTS": azurite.account_name,
        "DTJOB_WRITE_CONTAINERS": CONTAINER,
        "DTJOB_PROGRESS_SECONDS": "2",
    }
    operator_log = STATE_DIR / "operator.log"
    banner(f"starting the operator, kept running (log: {operator_log})")
    operator_pid = start_operator_detached(
        kubeconfig, NAMESPACE, STATE_DIR / "operator.pid", operator_log, env
    )

    manifest = job_manifest(azurite.endpoint)
    name = manifest["metadata"]["name"]
    # An earlier run's job goes first, while the operator runs to take its finalizer off.
    kubectl("delete", "dtj", name, "-n", NAMESPACE, "--ignore-not-found", "--wait=true")
    banner(
        f"applying {EXAMPLE.relative_to(REPO)}, shrunk to this machine: 2 workers x 1 slot, "
        f"{STEPS} steps of ResNet-50 at 64x64 on CPU (real pods, real Horovod ranks)"
    )
    kubectl("apply", "-n", NAMESPACE, "-f", "-", stdin=yaml.safe_dump(manifest))
    outcome = follow(kubectl, NAMESPACE, name, TIMEOUT_SECONDS)

    banner("the job")
    kubectl("get", "dtj", "-n", NAMESPACE, "-o", "wide")
    uid = kubectl("get", "dtj", name, "-n", NAMESPACE, "-o", "jsonpath={.metadata.uid}", capture=True)
    run_prefix = f"runs/{NAMESPACE}/{name}/{uid}/"
    out_dir = STATE_DIR / "output" / f"{name}-{uid[:8]}"
    banner(f"uploaded to Azurite under {CONTAINER}/{run_prefix} (copied to {out_dir})")
    for blob in service.get_container_client(CONTAINER).list_blobs(name_starts_with=run_prefix):
        local = out_dir / blob.name.removeprefix(run_prefix)
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(service.get_blob_client(CONTAINER, blob.name).download_blob().readall())
        print(f"  {blob.name}  ({blob.size} bytes)")

    launcher_logs = sorted((out_dir / "logs").glob(f"{name}-launcher*.log"))
    if launcher_logs:
        banner(f"the launcher's log, last lines ({launcher_logs[0]})")
        print("\n".join(launcher_logs[0].read_text(errors="replace").splitlines()[-12:]))
    print_where_to_look(name, out_dir, operator_pid, azurite.endpoint, published)
    print(f"\nresult: {outcome}")
    return 0 if outcome == "Succeeded" else 1


def print_where_to_look(name: str, out_dir: Path, operator_pid: int, endpoint: str, published: str) -> None:
    example = PLAYGROUND_EXAMPLE.relative_to(REPO)
    playground = playground_job(PLAYGROUND_EXAMPLE)["metadata"]["name"]
    ns = f"-n {NAMESPACE}"
    banner("where to look (the cluster, the operator and Azurite keep running)")
    print(f"  {make_command('kubectl', f'get dtj {ns} -o wide')}")
    print(f"  {make_command('kubectl', f'get pods,jobs,svc {ns} -l dtjob.io/job-name={name}')}")
    print(f"  {make_command('kubectl', f'logs {ns} {name}-launcher')}")
    print(f"  results and logs: {out_dir}")
    print(f"  the operator (pid {operator_pid}, watching {NAMESPACE}): {STATE_DIR / 'operator.log'}")
    print(f"  Azurite: {endpoint} (in the network namespace {NETNS})")
    print(f"\n  a second example, your own Horovod script on CPU workers ({published} is the local build):")
    print(f"  {make_command('kubectl', f'apply {ns} -f {example}')}")
    print(f"  {make_command('kubectl', f'get dtj {playground} {ns} -w')}")
    print(f"  {make_command('kubectl', f'logs {ns} {playground}-launcher')}")
    print(f"\n  {make_command('demo-down')}   stops all of it: the operator, Azurite, the cluster")


if __name__ == "__main__":
    sys.exit(main())
