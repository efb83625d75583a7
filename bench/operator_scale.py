"""Operator at scale: many jobs against the local control plane, and what observing pods through the watch
cache saves over listing them on every reconcile, measured side by side in one run.

    make cluster-up && python -m bench.operator_scale [--jobs 100]

1. End to end: N one-GPU jobs are created at once with the operator (a subprocess, as deployed) running;
   prints the time until every job has its worker pod and a status, the reconciles that took, and the
   operator's CPU time and memory.
2. Observation cost: with the operator stopped and the cluster settled, every job is reconciled once (a
   no-op, as most reconciles are) in this process, first with its children taken from a cache filled by one
   LIST per kind (what the operator's kopf indices hold; the operator pays not even those), then with its
   pods and launcher Job listed per reconcile (the naive design). Prints reconciles/s of both and the ratio.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

from dtjob import API_GROUP, API_VERSION, PLURAL, names
from dtjob.config import load_config
from dtjob.kube import KubeClient
from dtjob.reconcile import Children, reconcile
from kubernetes import client, config

from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess, install_crd

REPO = Path(__file__).resolve().parents[1]


def kubeconfig_path() -> str:
    if os.environ.get("KUBECONFIG"):
        return os.environ["KUBECONFIG"]
    path = subprocess.run(
        [str(REPO / "hack" / "cluster.sh"), "kubeconfig"], capture_output=True, text=True, check=True
    ).stdout.strip()
    if not Path(path).exists():
        sys.exit("no cluster: run `make cluster-up` first (or set KUBECONFIG)")
    return path


def proc_usage(pid: int) -> tuple[float, float]:
    """(CPU seconds, RSS MiB) of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    rss_pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return cpu, rss_pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def end_to_end(jobs: Jobs, operator: OperatorProcess, count: int) -> None:
    assert operator.proc is not None
    cpu0, _ = proc_usage(operator.proc.pid)
    start = time.monotonic()
    for i in range(count):
        jobs.create(f"scale-{i}", workers=1, gpusPerWorker=1,
                    launcher={"podAnnotations": {"sim.dtjob.io/run-duration": "3600s"}})  # fmt: skip
    created = time.monotonic() - start

    def settled() -> bool:
        listed = jobs.custom.list_namespaced_custom_object(API_GROUP, API_VERSION, jobs.ns, PLURAL)["items"]
        with_status = sum(1 for j in listed if (j.get("status") or {}).get("phase"))
        pods = jobs.core.list_namespaced_pod(jobs.ns, label_selector=f"{names.ROLE_LABEL}=worker").items
        return with_status == count and len(pods) == count

    wait_for(settled, timeout=600, interval=1.0, what=f"{count} jobs with status and worker pods")
    elapsed = time.monotonic() - start
    cpu1, rss = proc_usage(operator.proc.pid)
    reconciles = operator.reconciles()
    phases: dict[str, int] = defaultdict(int)
    for job in jobs.custom.list_namespaced_custom_object(API_GROUP, API_VERSION, jobs.ns, PLURAL)["items"]:
        phases[job["status"]["phase"]] += 1
    print(f"end to end: {count} jobs created in {created:.1f}s; all with a worker pod and a status after "
          f"{elapsed:.1f}s ({count / elapsed:.1f} jobs/s)")  # fmt: skip
    print(f"  phases: {dict(sorted(phases.items()))} (the simulated pool has 16 GPUs)")
    print(f"  operator: {reconciles} reconciles (liveness report, up to 10s old), "
          f"{cpu1 - cpu0:.1f}s CPU, {rss:.0f} MiB RSS")  # fmt: skip


def observation_cost(api: client.ApiClient, namespace: str, count: int, rounds: int) -> None:
    kube = KubeClient(api)
    settings = load_config()
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    keys = [f"scale-{i}" for i in range(count)]

    def cached() -> float:
        start = time.monotonic()
        # One LIST per kind stands in for the watch cache the operator keeps (it pays not even that).
        pods: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for pod in core.list_namespaced_pod(namespace, label_selector=names.JOB_NAME_LABEL).items:
            pods[pod.metadata.labels[names.JOB_NAME_LABEL]].append(api.sanitize_for_serialization(pod))
        launchers = {
            j.metadata.labels[names.JOB_NAME_LABEL]: api.sanitize_for_serialization(j)
            for j in batch.list_namespaced_job(namespace, label_selector=names.JOB_NAME_LABEL).items
        }
        for name in keys:
            reconcile(kube, settings, namespace, name, Children(tuple(pods[name]), launchers.get(name)))
        return time.monotonic() - start

    def listed() -> float:
        start = time.monotonic()
        for name in keys:
            selector = f"{names.JOB_NAME_LABEL}={name}"
            pods = [api.sanitize_for_serialization(p)
                    for p in core.list_namespaced_pod(namespace, label_selector=selector).items]  # fmt: skip
            found = batch.list_namespaced_job(namespace, label_selector=selector).items
            launcher = api.sanitize_for_serialization(found[0]) if found else None
            reconcile(kube, settings, namespace, name, Children(tuple(pods), launcher))
        return time.monotonic() - start

    cached()  # warm connections
    best_cached = min(cached() for _ in range(rounds))
    best_listed = min(listed() for _ in range(rounds))
    print(f"observation cost, {count} no-op reconciles (best of {rounds}):")
    print(f"  watch cache (operator's design): {count / best_cached:7.1f} reconciles/s, 1 API call each")
    print(f"  list per reconcile (baseline):   {count / best_listed:7.1f} reconciles/s, 3 API calls each")
    print(f"  ratio: {best_listed / best_cached:.2f}x faster with the cache")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    kubeconfig = kubeconfig_path()
    install_crd(kubeconfig)
    api = config.new_client_from_config(config_file=kubeconfig)
    core = client.CoreV1Api(api)
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    log = Path(f"/tmp/dtjob-{namespace}-operator.log")
    operator = OperatorProcess(kubeconfig, namespace, log)
    try:
        operator.start()
        end_to_end(Jobs(api, namespace), operator, args.jobs)
        operator.stop()
        observation_cost(api, namespace, args.jobs, args.rounds)
    finally:
        operator.stop()
        core.delete_namespace(namespace, propagation_policy="Background")
    return 0


if __name__ == "__main__":
    sys.exit(main())
