"""`make demo-sim`: the sample PyTorch ResNet-50 job, end to end, on the simulated (kwok) control plane.

Installs the CRD, starts the operator, applies examples/pytorch-synthetic-resnet50.yaml, prints every change
of the job's status until it finishes, then shows the objects the operator created and the final status. The
cluster is simulated (kwok): the demo gives the launcher pod a run time of DEMO_RUN_SECONDS (default 15)
through the job's own spec.launcher.podAnnotations, since no training really runs, and feeds the launcher's
log with the progress lines rank 0 would print (its first line says so), which the operator turns into
status.progress exactly as it would on AKS.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import config as kube_config

from hack.demo_common import banner, follow, kubectl_runner, start_operator, stop, wait_established
from testbed.cache import cache_root
from testbed.sim_logs import append_log, serve_pod_log

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "pytorch-synthetic-resnet50.yaml"
NAMESPACE = os.environ.get("DEMO_NAMESPACE", "dtjob-demo")
TIMEOUT_SECONDS = float(os.environ.get("DEMO_TIMEOUT", "300"))
RUN_SECONDS = os.environ.get("DEMO_RUN_SECONDS", "15")


@functools.cache
def kubeconfig() -> str:
    out = subprocess.run(
        [str(REPO / "hack" / "cluster.sh"), "kubeconfig"], check=True, capture_output=True, text=True
    )
    return out.stdout.strip()


def kubectl(*args: str, capture: bool = False, stdin: str | None = None) -> str:
    return kubectl_runner(kubeconfig())(*args, capture=capture, stdin=stdin)


def job_manifest() -> dict[str, Any]:
    manifest: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    launcher = manifest["spec"].setdefault("launcher", {})
    launcher.setdefault("podAnnotations", {})["sim.dtjob.io/run-duration"] = f"{RUN_SECONDS}s"
    return manifest


def simulate_training_log(manifest: dict[str, Any], log_path: Path, done: threading.Event) -> None:
    """Once the launcher pod exists, make its log grow the way rank 0's progress lines would."""
    name = manifest["metadata"]["name"]
    spec = manifest["spec"]
    hyper = spec["hyperparameters"]
    steps, ranks = int(hyper["stepsPerEpoch"]), int(spec["workers"]) * int(spec["gpusPerWorker"])
    selector = f"dtjob.io/job-name={name},dtjob.io/role=launcher"
    pod = ""
    while not pod and not done.is_set():
        pod = kubectl("get", "pods", "-n", NAMESPACE, "-l", selector, "-o", "name", capture=True).strip()
        time.sleep(0.5)
    if done.is_set():
        return
    log_path.write_text("")
    append_log(log_path, f"[simulated] horovodrun -np {ranks}: ResNet-50, synthetic data")
    api_client = kube_config.new_client_from_config(kubeconfig())
    serve_pod_log(api_client, NAMESPACE, pod.split("/")[1], "launcher", log_path)
    intervals = 10
    wait = float(RUN_SECONDS) / (intervals + 1)
    for i in range(1, intervals + 1):
        if done.wait(wait):
            return
        step = steps * i // intervals
        # The trainers' pace: none in the first record, then an interval's steps over its seconds.
        pace = None if i == 1 else round(steps / intervals / wait, 6)
        record = {"epoch": 1, "epochs": int(hyper["epochs"]), "step": step, "stepsPerEpoch": steps,
                  "imagesPerSec": 1300.0 * ranks, "loss": round(6.9 - 0.02 * step, 4),
                  "updatedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "worldSize": ranks,
                  "stepsPerSec": pace}  # fmt: skip
        append_log(log_path, f"[0]<stdout>:DTJOB_PROGRESS {json.dumps(record)}")


def main() -> int:
    state_dir = cache_root() / "demo"
    state_dir.mkdir(parents=True, exist_ok=True)
    manifest = job_manifest()
    name = manifest["metadata"]["name"]

    banner("installing the DistributedTrainingJob CRD")
    kubectl("apply", "-f", str(REPO / "crds"))
    wait_established(kubectl)
    namespaces = kubectl("get", "namespaces", "-o", "name", capture=True).split()
    if f"namespace/{NAMESPACE}" not in namespaces:
        kubectl("create", "namespace", NAMESPACE)
    kubectl("delete", "dtj", name, "-n", NAMESPACE, "--ignore-not-found", "--wait=true")

    banner(f"starting the operator (log: {state_dir / 'operator.log'})")
    operator = start_operator(kubeconfig(), NAMESPACE, state_dir / "operator.log")
    try:
        banner(
            f"applying {EXAMPLE.relative_to(REPO)} (simulated cluster: the launcher runs {RUN_SECONDS}s and "
            "its log is fed made-up progress lines, which the operator reads as it would on AKS)"
        )
        done = threading.Event()
        feeder = threading.Thread(
            target=simulate_training_log, args=(manifest, state_dir / "launcher.log", done), daemon=True
        )
        feeder.start()
        kubectl("apply", "-n", NAMESPACE, "-f", "-", stdin=yaml.safe_dump(manifest))
        try:
            outcome = follow(kubectl, NAMESPACE, name, TIMEOUT_SECONDS)
        finally:
            done.set()
            feeder.join(timeout=10)

        banner("the job")
        kubectl("get", "dtj", "-n", NAMESPACE, "-o", "wide")
        banner("objects the operator created (pods left per runPolicy.cleanPodPolicy)")
        kubectl(
            "get",
            "secrets,configmaps,services,jobs,pods",
            "-n",
            NAMESPACE,
            "-l",
            f"dtjob.io/job-name={name}",
            "-o",
            "wide",
        )
        banner("launcher command")
        launcher = yaml.safe_load(
            kubectl("get", "pod", f"{name}-launcher", "-n", NAMESPACE, "-o", "yaml", capture=True)
        )
        container = launcher["spec"]["containers"][0]
        argv = [*container.get("command", []), *container.get("args", [])]
        # The launcher runs a short shell script (ssh client config, then exec horovodrun): print it as is.
        print(argv[2] if argv[:2] == ["/bin/sh", "-c"] else shlex.join(argv))
        banner("final status")
        status = yaml.safe_load(kubectl("get", "dtj", name, "-n", NAMESPACE, "-o", "yaml", capture=True))[
            "status"
        ]
        print(yaml.safe_dump({"status": status}, sort_keys=False))
        banner("events")
        kubectl(
            "get",
            "events",
            "-n",
            NAMESPACE,
            "--field-selector",
            f"involvedObject.name={name}",
            "--sort-by=.metadata.creationTimestamp",
        )
    finally:
        stop(operator)
    print(f"\njob {name}: {outcome}. The cluster keeps running: `make cluster-down` stops it.")
    return 0 if outcome == "Succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
