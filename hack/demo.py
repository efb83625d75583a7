"""`make demo`: a real PyTorch ResNet-50 job, end to end, on the local real node.

Starts the real-node cluster (hack/realnode.sh: a control plane, a GPU-pool node and a system node that run
containers for real, cluster DNS, kube-proxy), imports the locally built training image, starts Azurite on the
node's address and the operator, and applies the sample job, shrunk to fit this machine: 2 workers x 1 slot,
a few steps at a small image size. Workers run sshd, the launcher starts horovodrun over SSH, the ranks
train, rank 0 uploads its results and the operator every pod's log to Azurite. The demo prints each change
of the job's status (real progress from rank 0), then downloads what was uploaded and says where to look.

Everything runs inside the network namespace the Makefile gives it (hack/netns.sh), which outlives the demo:
`make demo-down` stops the cluster.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from azure.storage.blob import BlobServiceClient

from hack.demo_common import banner, follow, kubectl_runner, start_operator, stop, wait_established
from hack.demo_job import DEFAULT_STEPS, EXAMPLE, demo_job
from testbed.azurite import run_azurite
from testbed.cache import cache_root

REPO = Path(__file__).resolve().parents[1]
NAMESPACE = os.environ.get("DEMO_NAMESPACE", "dtjob-demo")
TIMEOUT_SECONDS = float(os.environ.get("DEMO_TIMEOUT", "900"))
STEPS = int(os.environ.get("DEMO_STEPS", str(DEFAULT_STEPS)))
NODE_IP = "10.224.0.1"
IMAGE = f"localhost/dtjob/horovod-pytorch:{os.environ.get('DTJOB_IMAGE_TAG', 'dev')}"
KEY_SECRET = "demo-storage-key"
CONTAINER = "demo"


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


def main() -> int:
    state_dir = cache_root() / "demo"
    state_dir.mkdir(parents=True, exist_ok=True)

    banner(
        "starting the real-node cluster (control plane, a GPU-pool node and a system node, DNS, kube-proxy)"
    )
    realnode("up")
    realnode("import-images", IMAGE)
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

    with run_azurite(state_dir / "azurite", host=NODE_IP) as azurite:
        service = BlobServiceClient(azurite.endpoint, credential=azurite.shared_key)
        service.create_container(CONTAINER)
        kubectl("delete", "secret", KEY_SECRET, "-n", NAMESPACE, "--ignore-not-found")
        kubectl("create", "secret", "generic", KEY_SECRET, "-n", NAMESPACE,
                f"--from-literal=azurestorageaccountkey={azurite.account_key}")  # fmt: skip
        # The operator signs with an account key only from a Secret labelled for it.
        kubectl("label", "secret", KEY_SECRET, "-n", NAMESPACE, "dtjob.io/storage-key=true")
        manifest = job_manifest(azurite.endpoint)
        name = manifest["metadata"]["name"]
        kubectl("delete", "dtj", name, "-n", NAMESPACE, "--ignore-not-found", "--wait=true")

        env = {
            "DTJOB_IMAGE_PYTORCH": IMAGE,
            "DTJOB_EMULATOR_HOSTS": NODE_IP,
            "DTJOB_ALLOWED_STORAGE_ACCOUNTS": azurite.account_name,
            "DTJOB_WRITE_CONTAINERS": CONTAINER,
            "DTJOB_PROGRESS_SECONDS": "2",
        }
        banner(f"starting the operator (log: {state_dir / 'operator.log'})")
        operator = start_operator(kubeconfig, NAMESPACE, state_dir / "operator.log", env)
        try:
            banner(
                f"applying {EXAMPLE.relative_to(REPO)}, shrunk to this machine: 2 workers x 1 slot, "
                f"{STEPS} steps of ResNet-50 at 64x64 on CPU (real pods, real Horovod ranks)"
            )
            kubectl("apply", "-n", NAMESPACE, "-f", "-", stdin=yaml.safe_dump(manifest))
            outcome = follow(kubectl, NAMESPACE, name, TIMEOUT_SECONDS)
        finally:
            stop(operator)

        banner("the job")
        kubectl("get", "dtj", "-n", NAMESPACE, "-o", "wide")
        uid = kubectl("get", "dtj", name, "-n", NAMESPACE, "-o", "jsonpath={.metadata.uid}", capture=True)
        run_prefix = f"runs/{NAMESPACE}/{name}/{uid}/"
        out_dir = state_dir / "output" / f"{name}-{uid[:8]}"
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
    kubectl_path = shutil.which("kubectl") or "kubectl"
    in_ns = f"hack/netns.sh exec dtjob-demo {kubectl_path} --kubeconfig {shlex.quote(kubeconfig)}"
    banner("where to look")
    print(f"  {in_ns} get dtj -n {NAMESPACE} -o wide")
    print(f"  {in_ns} get pods,jobs,svc,secrets,cm -n {NAMESPACE} -l dtjob.io/job-name={name}")
    print(f"  results and logs: {out_dir}")
    print("  make demo-down   stops the cluster")
    print(f"\nresult: {outcome}")
    return 0 if outcome == "Succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
