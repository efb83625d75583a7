"""The operator's memory at scale and at rest, beside its own empty start and mpi-operator's at that scale.

    GPU_POOL_SIZE=50 GPU_VM_SIZE=Standard_ND96isr_H100_v5 make cluster-up   # 400 simulated GPUs
    python -m bench.operator_memory [--jobs 1000] [--finished 100] [--no-mpi-operator]

Two measurements, each in a namespace of its own with a fresh operator process:

- at rest: `--finished` jobs (1 launcher + W workers each) run to Succeeded (kwok ends each launcher after
  2 s; cleanPodPolicy Running then deletes the workers) and stay in the cluster; once the operator's queue is
  empty and a settle period passed, its resident set (VmRSS) is read. The baseline is the same process's
  VmRSS before the first job existed;
- at scale: `--jobs` jobs created at once, their launchers running for an hour; when every worker pod exists
  and the queue is empty, the peak resident set (VmHWM), and VmRSS once a settle period passed. Jobs
  beyond the pool's GPUs stay with Pending workers, which the operator watches all the same. The baseline is
  mpi-operator (v0.8.2, client QPS raised) with the same number of equivalent MPIJobs, in the same run.

dtjob runs as the chart deploys it (log level info, the default resync period).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dtjob import names
from dtjob.config import OperatorConfig
from kubernetes import client, config

from bench.operator_scale import kubeconfig_path, proc_usage
from bench.versus_mpi_operator import (
    LOCK_NAMESPACE,
    MPI_JOB_LABEL,
    RUN_FOREVER,
    MpiOperatorProcess,
    delete_namespace,
    mpi_job,
    mpi_operator_dir,
    new_namespace,
    peak_rss_mib,
)
from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess, install_crd, kubectl

ENDS_SOON = {"sim.dtjob.io/run-duration": "2s"}
SETTLE_S = 40.0  # longer than the operator's heap trim period (30 s)


EXTRA_ENV: dict[str, str] = {}  # --dtjob-env: e.g. allocator settings to compare


@contextmanager
def dtjob_in_new_namespace(api: client.ApiClient, kubeconfig: str) -> Iterator[tuple[OperatorProcess, Jobs]]:
    """A fresh operator process watching a namespace of its own (its liveness answered), both gone after."""
    core = client.CoreV1Api(api)
    namespace = new_namespace(core)
    env = {"DTJOB_RESYNC_SECONDS": str(OperatorConfig().resync_seconds), **EXTRA_ENV}
    operator = OperatorProcess(kubeconfig, namespace, Path(f"/tmp/{namespace}-dtjob.log"), env=env,
                               metrics=False, verbose=False)  # fmt: skip
    try:
        operator.start()
        yield operator, Jobs(api, namespace)
    finally:
        operator.stop()
        delete_namespace(core, namespace)


def queue_empty(operator: OperatorProcess, timeout: float) -> None:
    wait_for(lambda: (operator.probes() or {}).get("queue") == 0, timeout=timeout, interval=1.0,
             what="dtjob's queue empty")  # fmt: skip


def pods_with_label(core: client.CoreV1Api, namespace: str, label: str) -> int:
    listed: Any = core.list_namespaced_pod(namespace, label_selector=label, _preload_content=False)
    return len(json.loads(listed.data).get("items") or [])


def at_rest(api: client.ApiClient, kubeconfig: str, finished: int, workers: int) -> tuple[float, float]:
    """(VmRSS before any job, VmRSS with `finished` Succeeded jobs kept), MiB."""
    with dtjob_in_new_namespace(api, kubeconfig) as (operator, jobs):
        assert operator.proc is not None
        pid = operator.proc.pid
        time.sleep(SETTLE_S)
        _, empty = proc_usage(pid)
        for i in range(finished):
            launcher = {"podAnnotations": ENDS_SOON}
            jobs.create(f"done-{i}", workers=workers, gpusPerWorker=1, launcher=launcher,
                        runPolicy={"cleanPodPolicy": "Running"})  # fmt: skip

        def all_succeeded() -> bool:
            listed = jobs.custom.list_namespaced_custom_object("dtjob.io", "v1alpha1", jobs.ns,
                                                               "distributedtrainingjobs")  # fmt: skip
            phases = [(j.get("status") or {}).get("phase") for j in listed["items"]]
            return phases.count("Succeeded") == finished

        wait_for(all_succeeded, timeout=900, interval=2.0, what=f"{finished} jobs Succeeded")
        queue_empty(operator, 300)
        time.sleep(SETTLE_S)
        _, kept = proc_usage(pid)
        print(f"at rest: {empty:.0f} MiB empty, {kept:.0f} MiB with {finished} finished jobs "
              f"(peak {peak_rss_mib(pid):.0f} MiB meanwhile)", flush=True)  # fmt: skip
        return empty, kept


def dtjob_at_scale(
    api: client.ApiClient, kubeconfig: str, count: int, workers: int
) -> tuple[float, float, float]:
    """(peak RSS MiB, seconds until every worker pod existed and the queue was empty, settled RSS MiB)."""
    core = client.CoreV1Api(api)
    with dtjob_in_new_namespace(api, kubeconfig) as (operator, jobs):
        assert operator.proc is not None
        start = time.monotonic()
        for i in range(count):
            jobs.create(f"m-{i}", workers=workers, gpusPerWorker=1, launcher={"podAnnotations": RUN_FOREVER})
        selector = f"{names.ROLE_LABEL}=worker"
        wait_for(lambda: pods_with_label(core, jobs.ns, selector) >= count * workers, timeout=1800,
                 interval=5.0, what=f"{count * workers} worker pods")  # fmt: skip
        queue_empty(operator, 600)
        took = time.monotonic() - start
        time.sleep(SETTLE_S)
        peak = peak_rss_mib(operator.proc.pid)
        _, settled = proc_usage(operator.proc.pid)
        print(f"dtjob at {count} jobs: peak RSS {peak:.0f} MiB, {settled:.0f} MiB settled, {took:.0f}s",
              flush=True)  # fmt: skip
        return peak, took, settled


def mpi_operator_at_scale(
    api: client.ApiClient, kubeconfig: str, count: int, workers: int, qps: int
) -> tuple[float, float]:
    binary = mpi_operator_dir()
    kubectl(kubeconfig, "apply", "--server-side", "-f", str(binary / "kubeflow.org_mpijobs.yaml"))
    kubectl(kubeconfig, "create", "namespace", LOCK_NAMESPACE)  # its leader-election lock; may exist
    kubectl(kubeconfig, "wait", "--for=condition=Established", "crd/mpijobs.kubeflow.org", "--timeout=60s")
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    namespace = new_namespace(core)
    flags = ["--kube-api-qps", str(qps), "--kube-api-burst", str(2 * qps),
             "--controller-queue-rate-limit", str(qps), "--controller-queue-burst", str(2 * qps)]  # fmt: skip
    operator = MpiOperatorProcess(binary / "mpi-operator", kubeconfig, namespace, flags,
                                  Path(f"/tmp/{namespace}-mpi-operator.log"))  # fmt: skip
    try:
        operator.start_as_leader(api)
        assert operator.proc is not None
        start = time.monotonic()
        for i in range(count):
            custom.create_namespaced_custom_object("kubeflow.org", "v2beta1", namespace, "mpijobs",
                                                   mpi_job(f"m-{i}", workers))  # fmt: skip
        # Its workers carry the MPIJob's label and are named <job>-worker-<i>.
        wait_for(lambda: pods_with_label(core, namespace, MPI_JOB_LABEL) >= count * workers, timeout=1800,
                 interval=5.0, what=f"{count * workers} MPIJob worker pods")  # fmt: skip
        time.sleep(SETTLE_S)
        took = time.monotonic() - start
        peak = peak_rss_mib(operator.proc.pid)
        print(f"mpi-operator at {count} jobs: peak RSS {peak:.0f} MiB, {took:.0f}s", flush=True)
        return peak, took
    finally:
        operator.stop()
        delete_namespace(core, namespace)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--finished", type=int, default=100)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--raised-qps", type=int, default=500, help="mpi-operator's --kube-api-qps")
    parser.add_argument("--no-mpi-operator", action="store_true", help="skip mpi-operator's run")
    parser.add_argument("--dtjob-env", action="append", default=[], metavar="NAME=VALUE",
                        help="environment of dtjob's process (repeatable)")  # fmt: skip
    args = parser.parse_args()
    EXTRA_ENV.update(item.split("=", 1) for item in args.dtjob_env)
    kubeconfig = kubeconfig_path()
    api = config.new_client_from_config(config_file=kubeconfig)
    install_crd(kubeconfig)
    empty, kept = at_rest(api, kubeconfig, args.finished, args.workers)
    peak, took, settled = dtjob_at_scale(api, kubeconfig, args.jobs, args.workers)
    print(f"\ndtjob's resident memory (jobs of 1 launcher + {args.workers} workers):")
    print(f"  empty, just started          {empty:6.0f} MiB")
    print(f"  {args.finished:4d} finished jobs kept      {kept:6.0f} MiB  ({kept / empty:.2f}x empty)")
    print(f"  peak with {args.jobs:5d} jobs         {peak:6.0f} MiB  "
          f"({peak / empty:.2f}x empty, {took:.0f}s)")  # fmt: skip
    print(f"  {args.jobs:5d} jobs, once settled       {settled:6.0f} MiB  ({settled / empty:.2f}x empty)")
    if not args.no_mpi_operator:
        theirs, their_took = mpi_operator_at_scale(api, kubeconfig, args.jobs, args.workers, args.raised_qps)
        print(f"  mpi-operator, {args.jobs:5d} jobs    {theirs:6.0f} MiB  "
              f"(dtjob {peak / theirs:.2f}x as much; {their_took:.0f}s)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
