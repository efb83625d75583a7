"""dtjob beside Kubeflow's mpi-operator (v0.8.2, Go) on the same local control plane, with equivalent jobs.

    hack/build-mpi-operator.sh        # once: builds it from its module into $DTJOB_CACHE/bin (cached)
    CLUSTER_APF=1 GPU_POOL_SIZE=50 GPU_VM_SIZE=Standard_ND96isr_H100_v5 make cluster-up   # 400 simulated GPUs
    python -m bench.versus_mpi_operator [--jobs 100] [--raised-qps 500]

Each job is 1 launcher + W workers (--workers, 4), each worker one simulated GPU on the kwok GPU pool
(its taint tolerated), the launcher on the system pool and created only once every worker is Ready (dtjob
always; an MPIJob with launcherCreationPolicy WaitForWorkersReady). kwok turns a scheduled pod Ready after a
second. Four runs, each in a namespace of its own with the operator as a subprocess watching only it:
mpi-operator with its defaults (--kube-api-qps 5 --kube-api-burst 10), mpi-operator with a raised client QPS
(--kube-api-qps/--kube-api-burst, and its queue's rate limit raised alike), mpi-operator fully tuned (QPS
1000, burst 2000, and --threadiness 8, as many workers as dtjob's 8 lanes), then dtjob. All N jobs are
created at once; a watch of the namespace's pods and Jobs, opened before, timestamps what arrives:

- pods: the time until all N x (1 + W) pods exist (the launchers' pods included);
- launchers: the time until all N launcher Jobs exist;
- launcher latency: per job, from the event that showed its last worker Ready to the launcher Job's ADDED
  event, p50 and p99. Two watches see them (pods, Jobs), each on a thread of its own. Under load the pods'
  watch, with five times the events to decode, can fall behind the Jobs'; both operators' figures then come
  out low by the difference (the likely cause of dtjob's p50 below zero at 500 jobs);
- the operator's CPU seconds (utime + stime from /proc) until then, and its peak RSS (VmHWM);
- the operator's API requests per job, writes and reads, as the API server counts them (bench.api_requests:
  each operator runs as one ServiceAccount that FlowSchemas count apart), from the first create until it
  has been quiet for 5 s; its Lease renewals apart.

Prints the table and dtjob's ratios against each mpi-operator run (> 1: dtjob better).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dtjob import names
from dtjob.config import OperatorConfig
from kubernetes import client, config, watch

from bench import api_requests
from bench.operator_scale import kubeconfig_path, proc_usage
from testbed.cache import cache_root
from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess, install_crd, kubectl

REPO = Path(__file__).resolve().parents[1]
# The release compared against (its current one); MPI_OPERATOR_VERSION picks another, for this bench and the
# build script alike.
MPI_OPERATOR_VERSION = os.environ.get("MPI_OPERATOR_VERSION", "v0.8.2")
MPI_JOB_LABEL = "training.kubeflow.org/job-name"
LOCK_NAMESPACE = "mpi-operator"
LAUNCHER_SUFFIX = "-launcher"
KUBE_API_SERIES = "dtjob_kube_api_request_duration_seconds"
RUN_FOREVER = {"sim.dtjob.io/run-duration": "3600s"}  # launchers keep running: nothing finishes mid-run


def mpi_operator_dir() -> Path:
    cache = cache_root()
    env = {**os.environ, "MPI_OPERATOR_VERSION": MPI_OPERATOR_VERSION}
    subprocess.run([str(REPO / "hack" / "build-mpi-operator.sh")], check=True, env=env)
    return cache / "bin" / f"mpi-operator-{MPI_OPERATOR_VERSION}"


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@dataclass
class Watched:
    """What a namespace's watch saw, stamped with time.monotonic() on arrival."""

    job_label: str
    pods: set[str] = field(default_factory=set)
    ready: dict[str, dict[str, float]] = field(default_factory=dict)  # job -> worker -> first Ready
    launchers: dict[str, float] = field(default_factory=dict)  # job -> launcher Job ADDED
    last_pod_at: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def pod(self, body: Any, now: float) -> None:
        labels = body.metadata.labels or {}
        job = labels.get(self.job_label)
        with self.lock:
            if body.metadata.name not in self.pods:
                self.pods.add(body.metadata.name)
                self.last_pod_at = now
            if job is None or "-worker-" not in body.metadata.name:  # both name workers <job>-worker-<i>
                return
            conditions = (body.status and body.status.conditions) or []
            if any(c.type == "Ready" and c.status == "True" for c in conditions):
                self.ready.setdefault(job, {}).setdefault(body.metadata.name, now)

    def job(self, body: Any, now: float) -> None:
        # Both name the launcher <job>-launcher (mpi-operator labels its Job with app=<job> only).
        name: str = body.metadata.name
        if name.endswith(LAUNCHER_SUFFIX):
            with self.lock:
                self.launchers.setdefault(name.removesuffix(LAUNCHER_SUFFIX), now)


def watch_namespace(api: client.ApiClient, namespace: str, seen: Watched, stop: threading.Event) -> None:
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)

    def loop(list_fn: Any, handle: Any) -> None:
        while not stop.is_set():
            stream = watch.Watch().stream(list_fn, namespace, timeout_seconds=5)  # type: ignore[no-untyped-call]
            for event in stream:
                handle(event["object"], time.monotonic())
                if stop.is_set():
                    return

    for list_fn, handle in ((core.list_namespaced_pod, seen.pod), (batch.list_namespaced_job, seen.job)):
        threading.Thread(target=loop, args=(list_fn, handle), daemon=True).start()


@dataclass
class Result:
    name: str
    pods_s: float
    launchers_s: float
    cpu_s: float
    peak_rss_mib: float
    latency_p50_s: float
    latency_p99_s: float
    requests: api_requests.Requests


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def mpi_job(name: str, workers: int) -> dict[str, Any]:
    container = {"name": "main", "image": "mpi:sim", "command": ["true"]}
    return {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": {"name": name},
        "spec": {
            "slotsPerWorker": 1,
            "launcherCreationPolicy": "WaitForWorkersReady",
            "mpiReplicaSpecs": {
                "Launcher": {
                    "replicas": 1,
                    "template": {
                        "metadata": {"annotations": RUN_FOREVER},
                        "spec": {
                            "containers": [container],
                            "nodeSelector": {"kubernetes.azure.com/agentpool": "system"},
                        },
                    },
                },
                "Worker": {
                    "replicas": workers,
                    "template": {
                        "spec": {
                            "containers": [{**container, "resources": {"limits": {"nvidia.com/gpu": 1}}}],
                            "nodeSelector": {"kubernetes.azure.com/agentpool": "gpu"},
                            "tolerations": [
                                {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
                            ],
                        },
                    },
                },
            },
        },
    }


class MpiOperatorProcess:
    def __init__(self, binary: Path, kubeconfig: str, namespace: str, flags: list[str], log: Path) -> None:
        self.kubeconfig = kubeconfig
        self.args = [str(binary), "--kubeConfig", kubeconfig, "--namespace", namespace,
                     "--lock-namespace", LOCK_NAMESPACE, *flags]  # fmt: skip
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        # Its kubeconfig also as KUBECONFIG: with the bench's own in the environment, some of its clients
        # took that one (the admin's, as the API server's counts showed) over --kubeConfig.
        env = {**os.environ, "KUBECONFIG": self.kubeconfig}
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT, env=env)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def measure(
    api: client.ApiClient, name: str, namespace: str, pid: int, create: Any, count: int, workers: int,
    label: str, admin_kubeconfig: str,
) -> Result:  # fmt: skip
    seen = Watched(label)
    stop = threading.Event()
    watch_namespace(api, namespace, seen, stop)
    time.sleep(1.0)  # the watches open before the first job exists
    cpu0, _ = proc_usage(pid)
    requests0 = api_requests.dispatched(admin_kubeconfig)
    start = time.monotonic()
    for i in range(count):
        create(f"vs-{i}")
    total_pods = count * (1 + workers)

    def done() -> bool:
        with seen.lock:
            return len(seen.launchers) >= count and len(seen.pods) >= total_pods

    try:
        wait_for(done, timeout=900, interval=0.5, what=f"{name}: {count} launchers and {total_pods} pods")
    finally:
        stop.set()
    cpu1, _ = proc_usage(pid)
    requests = api_requests.settled(admin_kubeconfig) - requests0
    latencies = [
        at - max(seen.ready[job].values())
        for job, at in seen.launchers.items()
        if len(seen.ready.get(job, {})) >= workers
    ]
    return Result(
        name,
        pods_s=seen.last_pod_at - start,
        launchers_s=max(seen.launchers.values()) - start,
        cpu_s=cpu1 - cpu0,
        peak_rss_mib=peak_rss_mib(pid),
        latency_p50_s=statistics.median(latencies) if latencies else float("nan"),
        latency_p99_s=percentile(latencies, 0.99),
        requests=requests,
    )


def new_namespace(core: client.CoreV1Api) -> str:
    namespace = f"vs-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    return namespace


def delete_namespace(core: client.CoreV1Api, namespace: str) -> None:
    core.delete_namespace(namespace, propagation_policy="Background")
    wait_for(lambda: namespace not in {n.metadata.name for n in core.list_namespace().items},
             timeout=300, interval=1.0, what=f"namespace {namespace} deleted")  # fmt: skip


def mpi_run(
    api: client.ApiClient, kubeconfig: str, binary: Path, name: str, flags: list[str], count: int,
    workers: int, admin_kubeconfig: str,
) -> Result:  # fmt: skip
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    namespace = new_namespace(core)
    log = Path(f"/tmp/{namespace}-mpi-operator.log")
    operator = MpiOperatorProcess(binary, kubeconfig, namespace, flags, log)
    try:
        operator.start()
        assert operator.proc is not None
        time.sleep(3.0)  # its informers sync and it takes the lease before the jobs arrive
        if operator.proc.poll() is not None:
            raise SystemExit(f"mpi-operator exited: see {operator.log}")

        def create(job: str) -> None:
            custom.create_namespaced_custom_object("kubeflow.org", "v2beta1", namespace, "mpijobs",
                                                   mpi_job(job, workers))  # fmt: skip

        return measure(api, name, namespace, operator.proc.pid, create, count, workers, MPI_JOB_LABEL,
                       admin_kubeconfig)  # fmt: skip
    finally:
        operator.stop()
        delete_namespace(core, namespace)


def dtjob_run(
    api: client.ApiClient, kubeconfig: str, count: int, workers: int, admin_kubeconfig: str,
    profile: Path | None = None,
) -> Result:  # fmt: skip
    core = client.CoreV1Api(api)
    namespace = new_namespace(core)
    # As deployed: the chart's log level and resync period (the harness shortens the resync for tests).
    env = {"DTJOB_RESYNC_SECONDS": str(OperatorConfig().resync_seconds)}
    log = Path(f"/tmp/{namespace}-dtjob.log")
    operator = OperatorProcess(kubeconfig, namespace, log, env=env, verbose=False)
    jobs = Jobs(api, namespace)
    try:
        operator.start()
        assert operator.proc is not None
        if profile is not None:  # py-spy samples the operator until it stops (root, or ptrace allowed)
            spied = str(operator.proc.pid)
            spy = ["py-spy", "record", "--pid", spied, "--format", "raw", "--output", str(profile)]
            subprocess.Popen([*spy, "--rate", "100", "--gil", "--nonblocking"], stdout=subprocess.DEVNULL)

        def create(job: str) -> None:
            jobs.create(job, workers=workers, gpusPerWorker=1, launcher={"podAnnotations": RUN_FOREVER})

        pid = operator.proc.pid
        result = measure(api, "dtjob", namespace, pid, create, count, workers, names.JOB_NAME_LABEL,
                         admin_kubeconfig)  # fmt: skip
        # What its liveness endpoint says then, and how long until its queue is empty (every job Running).
        depth = (operator.probes() or {}).get("queue")
        start = time.monotonic()
        wait_for(lambda: (operator.probes() or {}).get("queue") == 0, timeout=300, interval=0.5,
                 what="dtjob's queue empty")  # fmt: skip
        _, rss = proc_usage(pid)
        print(f"dtjob: queue {depth} when the last launcher existed, empty {time.monotonic() - start:.1f}s "
              f"later; RSS then {rss:.0f} MiB", flush=True)  # fmt: skip
        calls = api_calls(operator.metrics_text())
        each = ", ".join(f"{verb} {what} {n / count:.2f}" for (verb, what), n in sorted(calls.items()))
        print(f"dtjob: {sum(calls.values()) / count:.1f} API calls per job: {each}", flush=True)
        return result
    finally:
        operator.stop()
        delete_namespace(core, namespace)


def api_calls(metrics_text: str) -> dict[tuple[str, str], float]:
    """(verb, resource) -> how many API calls the operator made, from its /metrics page."""
    calls: dict[tuple[str, str], float] = {}
    for line in metrics_text.splitlines():
        if line.startswith(f"{KUBE_API_SERIES}_count{{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
            calls[labels["verb"], labels["resource"]] = float(line.rsplit(" ", 1)[1])
    return calls


def report(results: list[Result], count: int, workers: int) -> None:
    print(f"\n{count} jobs x (1 launcher + {workers} workers), created at once:")
    print(f"{'operator':28s} {'all pods':>9s} {'launchers':>10s} {'CPU':>8s} {'CPU/job':>8s} "
          f"{'peak RSS':>9s} {'latency p50':>12s} {'p99':>7s}")  # fmt: skip
    for r in results:
        print(f"{r.name:28s} {r.pods_s:8.1f}s {r.launchers_s:9.1f}s {r.cpu_s:7.2f}s "
              f"{r.cpu_s / count * 1e3:6.1f}ms {r.peak_rss_mib:6.0f}MiB {r.latency_p50_s:11.2f}s "
              f"{r.latency_p99_s:6.2f}s")  # fmt: skip
    print("API requests, as the API server counted them:")
    for r in results:
        print(f"  {r.name:28s} {api_requests.per_job(r.requests, count)}")
    ours = results[-1]
    for other in results[:-1]:
        print(f"dtjob vs {other.name} (> 1: dtjob better): all pods {other.pods_s / ours.pods_s:.2f}x, "
              f"launchers {other.launchers_s / ours.launchers_s:.2f}x, CPU {ours.cpu_s / other.cpu_s:.2f}x "
              f"as much, peak RSS {ours.peak_rss_mib / other.peak_rss_mib:.2f}x as much, writes "
              f"{_ratio(ours.requests.writes, other.requests.writes)} as many, reads "
              f"{_ratio(ours.requests.reads, other.requests.reads)} as many")  # fmt: skip


def _ratio(ours: float, theirs: float) -> str:
    return f"{ours / theirs:.2f}x" if theirs else "n/a"


def mpi_rate_flags(qps: int) -> list[str]:
    """mpi-operator's client QPS and its queue's rate limit at `qps`, each burst twice that."""
    burst = str(2 * qps)
    return ["--kube-api-qps", str(qps), "--kube-api-burst", burst,
            "--controller-queue-rate-limit", str(qps), "--controller-queue-burst", burst]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--raised-qps", type=int, default=500, help="mpi-operator's raised --kube-api-qps")
    parser.add_argument("--tuned-threads", type=int, default=8, help="mpi-operator's tuned --threadiness")
    choices = ("mpi-default", "mpi-raised", "mpi-tuned", "dtjob")
    parser.add_argument("--only", action="append", choices=choices,
                        help="run only these (repeatable); default all four")  # fmt: skip
    parser.add_argument("--profile", type=Path, help="py-spy's raw samples of dtjob's run, written here")
    args = parser.parse_args()
    admin_kubeconfig = kubeconfig_path()
    only = set(args.only or choices)
    api = config.new_client_from_config(config_file=admin_kubeconfig)
    if not api_requests.counting(admin_kubeconfig):
        sys.exit("the API server counts no requests (API Priority and Fairness is off): restart the cluster "
                 "with CLUSTER_APF=1")  # fmt: skip
    # The operators act as one ServiceAccount whose requests the API server counts apart; the bench is admin.
    as_operator = api_requests.set_up(api, admin_kubeconfig)
    try:
        return _run(api, admin_kubeconfig, str(as_operator), only, args)
    finally:
        api_requests.tear_down(api, as_operator)


def _run(
    api: client.ApiClient, admin_kubeconfig: str, kubeconfig: str, only: set[str], args: argparse.Namespace
) -> int:
    nodes = client.CoreV1Api(api).list_node().items
    gpus = 0
    for node in nodes:
        gpus += int((node.status.allocatable or {}).get("nvidia.com/gpu", 0))
    needed = args.jobs * args.workers
    if gpus < needed:
        sys.exit(f"the simulated GPU pool has {gpus} GPUs, {needed} needed: restart the cluster with "
                 f"GPU_POOL_SIZE={-(-needed // 8)} GPU_VM_SIZE=Standard_ND96isr_H100_v5")  # fmt: skip
    results: list[Result] = []
    if only - {"dtjob"}:
        binary = mpi_operator_dir()
        kubectl(admin_kubeconfig, "apply", "--server-side", "-f", str(binary / "kubeflow.org_mpijobs.yaml"))
        # Its leader-election lock's namespace (may exist).
        kubectl(admin_kubeconfig, "create", "namespace", LOCK_NAMESPACE)
        established = "--for=condition=Established"
        kubectl(admin_kubeconfig, "wait", established, "crd/mpijobs.kubeflow.org", "--timeout=60s")
        qps = args.raised_qps
        tuned = [*mpi_rate_flags(1000), "--threadiness", str(args.tuned_threads)]
        runs = {
            "mpi-default": ("mpi-operator (defaults)", []),
            "mpi-raised": (f"mpi-operator (QPS {qps})", mpi_rate_flags(qps)),
            "mpi-tuned": (f"mpi-operator (QPS 1000, {args.tuned_threads} threads)", tuned),
        }
        for key, (name, flags) in runs.items():
            if key in only:
                results.append(mpi_run(api, kubeconfig, binary / "mpi-operator", name, flags, args.jobs,
                                       args.workers, admin_kubeconfig))  # fmt: skip
                print(results[-1], flush=True)
    if "dtjob" in only:
        install_crd(admin_kubeconfig)
        results.append(dtjob_run(api, kubeconfig, args.jobs, args.workers, admin_kubeconfig, args.profile))
        print(results[-1], flush=True)
    report(results, args.jobs, args.workers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
