"""dtjob beside Kubeflow's mpi-operator (v0.8.2, Go) on the same local control plane, with equivalent jobs.

    hack/build-mpi-operator.sh        # once: builds it from its module into $DTJOB_CACHE/bin (cached)
    CLUSTER_APF=1 GPU_POOL_SIZE=50 GPU_VM_SIZE=Standard_ND96isr_H100_v5 make cluster-up   # 400 simulated GPUs
    python -m bench.versus_mpi_operator [--jobs 100] [--raised-qps 500]
    # 1,000 jobs: GPU_POOL_SIZE=500 SYSTEM_POOL_SIZE=12 (the launchers need the system pool's pod room)

Each job is 1 launcher + W workers (--workers, 4), each worker one simulated GPU on the kwok GPU pool (its
taint tolerated), the launcher on the system pool and started only once every worker is Ready (dtjob always:
its launcher pod is made by the operator with the world and held by a scheduling gate until then; an MPIJob
with launcherCreationPolicy WaitForWorkersReady, whose launcher Job is made then and its pod by
kube-controller-manager's Job controller). kwok turns a scheduled pod Ready
after a second. Four runs, each in a namespace of its own with the operator as a subprocess watching only it:
mpi-operator with its defaults (--kube-api-qps 5 --kube-api-burst 10), mpi-operator with a raised client QPS
(--kube-api-qps/--kube-api-burst, and its queue's rate limit raised alike), mpi-operator fully tuned (QPS
1000, burst 2000, and --threadiness 8, as many workers as dtjob's 8 lanes), then dtjob. All N jobs are
created at once; a watch of the namespace's pods and Jobs, opened before, timestamps what arrives:

- pods: the time until all N x (1 + W) pods exist (the launchers' pods included);
- launchers: the time until all N launchers exist (mpi-operator's launcher Jobs, dtjob's launcher pods);
- launcher latency: per job, from the event that showed its last worker Ready to its launch: the launcher
  Job's ADDED event (mpi-operator), the event that showed its held pod without the gate (dtjob), p50 and p99.
  Two watches see them (pods, Jobs), each on a thread of its own. Under load the pods' watch, with five times
  the events to decode, can fall behind the Jobs'; both operators' figures then come out low by the difference
  (the likely cause of dtjob's p50 below zero at 500 jobs);
- the operator's CPU seconds (utime + stime from /proc) until then, and its peak RSS (VmHWM);
- all Running: the time until every pod runs, the launches done, and the operator's CPU seconds until then
  (dtjob's launcher pods exist before their launch, so all pods alone would leave its releases out);
- where the pods waited: from first seen to first seen on a node (the scheduler), and from there to Running
  (the node), p50 of all pods;
- job start: per job, from just before its create call to the event that showed the last of its pods
  (launcher and workers) Running, p50 and p99. The creates go one after the other, so a late job's figure
  includes its wait behind the creates before it, as a user's `kubectl apply` of many jobs would;
- where a job's start went (bench.job_stages): six stages, from its workers' creation to its launcher's pod
  running, the median of each over every job beside its mean over the slowest 1%, and where those came in
  the order of the creates;
- the operator's API requests per job, writes and reads, as the API server counts them (bench.api_requests:
  each operator runs as one ServiceAccount that FlowSchemas count apart), from the first create until it
  has been quiet for 5 s; its Lease renewals apart.

Prints the table and dtjob's ratios against each mpi-operator run (> 1: dtjob better). `--hold SECONDS` then
measures what dtjob costs the cluster once every job runs: its API calls a second (the progress reads of the
launchers' logs among them, which the API server's flow control does not count), reconciles and CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dtjob import names
from dtjob.config import OperatorConfig
from kubernetes import client, config

from bench import api_requests, job_stages
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
LOCK_NAME = "mpi-operator"  # its Lease, in LOCK_NAMESPACE
LAUNCHER_SUFFIX = "-launcher"
POOL_LABEL = "kubernetes.azure.com/agentpool"
SYSTEM_PODS_SPARE = 20  # the system pool's own pods (DNS, the bench's) beside the launchers
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
    pods: dict[str, float] = field(default_factory=dict)  # pod -> first seen
    bound: dict[str, float] = field(default_factory=dict)  # pod -> first seen on a node
    ready: dict[str, dict[str, float]] = field(default_factory=dict)  # job -> worker -> first Ready
    # job -> its launcher made: mpi-operator's launcher Job ADDED, dtjob's launcher pod first seen
    launchers: dict[str, float] = field(default_factory=dict)
    held: set[str] = field(default_factory=set)  # launcher pods seen with dtjob's gate on
    released: dict[str, float] = field(
        default_factory=dict
    )  # job -> its held launcher pod first seen ungated
    running: dict[str, dict[str, float]] = field(default_factory=dict)  # job -> pod -> first Running
    members: dict[str, set[str]] = field(default_factory=dict)  # job -> its pods
    last_pod_at: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def pod(self, body: dict[str, Any], now: float) -> None:
        meta, spec, status = body["metadata"], body.get("spec") or {}, body.get("status") or {}
        name: str = meta["name"]
        job = (meta.get("labels") or {}).get(self.job_label)
        with self.lock:
            if name not in self.pods:
                self.pods[name] = now
                self.last_pod_at = now
            if spec.get("nodeName"):
                self.bound.setdefault(name, now)
            if job is None:
                return
            self.members.setdefault(job, set()).add(name)
            if status.get("phase") == "Running":  # both label launcher and worker pods
                self.running.setdefault(job, {}).setdefault(name, now)
            if "-worker-" not in name:  # both name workers <job>-worker-<i>
                if name == f"{job}{LAUNCHER_SUFFIX}":  # dtjob's own launcher pod (a Job's has a suffix)
                    self.launchers.setdefault(job, now)
                gates = {g.get("name") for g in spec.get("schedulingGates") or ()}
                if names.LAUNCH_GATE in gates:
                    self.held.add(name)
                elif name in self.held:
                    self.released.setdefault(job, now)
                return
            conditions = status.get("conditions") or []
            if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
                self.ready.setdefault(job, {}).setdefault(name, now)

    def launches(self) -> dict[str, float]:
        """job -> when its launch began: its held launcher pod released (dtjob, whose launcher pod comes with
        the world), else its launcher Job made (mpi-operator's, once every worker is Ready)."""
        with self.lock:
            return {**self.launchers, **self.released}

    def job(self, body: dict[str, Any], now: float) -> None:
        # mpi-operator names its launcher Job <job>-launcher (and labels it with app=<job> only).
        name: str = body["metadata"]["name"]
        if name.endswith(LAUNCHER_SUFFIX):
            with self.lock:
                self.launchers.setdefault(name.removesuffix(LAUNCHER_SUFFIX), now)


def watch_namespace(api: client.ApiClient, namespace: str, seen: Watched, stop: threading.Event) -> None:
    """Two watches (pods, Jobs), each on a thread, as plain JSON: at 1,000 jobs decoding every pod event
    into the client's models took the bench more CPU than the events' arrival left it. Each watch resumes
    from the last resourceVersion it saw, so a reconnect sends no event twice."""
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)

    def loop(list_fn: Any, handle: Any) -> None:
        version: str | None = None
        while not stop.is_set():
            resp = list_fn(namespace, watch=True, resource_version=version, timeout_seconds=30,
                           allow_watch_bookmarks=True, _preload_content=False)  # fmt: skip
            try:
                for line in resp:  # urllib3 yields the response line by line: one event each
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    body = event["object"]
                    if event["type"] == "ERROR":  # 410 Gone: the version is too old; list again
                        version = None
                        break
                    version = body["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK":
                        handle(body, time.monotonic())
                    if stop.is_set():
                        return
            finally:
                resp.release_conn()

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
    start_p50_s: float
    start_p99_s: float
    scheduler_p50_s: float
    node_p50_s: float
    requests: api_requests.Requests
    creates_s: float  # the bench's own creates of every job, one after another
    stages: list[str] = field(repr=False)
    # Until every pod ran: the launches done (dtjob makes its launchers' pods before, and releases them then).
    running_s: float = float("nan")
    cpu_running_s: float = float("nan")


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


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

    def start_as_leader(self, api: client.ApiClient, timeout_s: float = 60.0) -> None:
        """Starts it on a lock no earlier process holds, and returns once it leads.

        client-go's leader election counts a held Lease's duration from when the candidate first saw it, not
        from the holder's last renewal, and mpi-operator does not release its Lease on exit: a process
        started on the Lease of the previous run's process idled 15 s before it reconciled anything, inside
        the measured time. The previous process has stopped, so deleting its Lease is what a release would
        have done.
        """
        leases = client.CoordinationV1Api(api)
        try:
            leases.delete_namespaced_lease(LOCK_NAME, LOCK_NAMESPACE)
        except client.ApiException as e:
            if e.status != 404:
                raise
        self.start()
        assert self.proc is not None
        proc = self.proc

        def leads() -> bool:
            if proc.poll() is not None:
                raise SystemExit(f"mpi-operator exited: see {self.log}")
            try:
                return bool(leases.read_namespaced_lease(LOCK_NAME, LOCK_NAMESPACE).spec.holder_identity)
            except client.ApiException as e:
                if e.status == 404:
                    return False
                raise

        wait_for(leads, timeout=timeout_s, interval=0.2, what="mpi-operator holding its Lease")
        time.sleep(1.0)  # its informers sync on an empty namespace before the jobs arrive

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

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
    label: str, admin_kubeconfig: str, alive: Callable[[], bool] | None = None,
) -> Result:  # fmt: skip
    seen = Watched(label)
    stop = threading.Event()
    watch_namespace(api, namespace, seen, stop)
    time.sleep(1.0)  # the watches open before the first job exists
    cpu0, _ = proc_usage(pid)
    requests0 = api_requests.dispatched(admin_kubeconfig)
    start = time.monotonic()
    created: dict[str, float] = {}
    for i in range(count):
        created[f"vs-{i}"] = time.monotonic()
        create(f"vs-{i}")
    creates_s = time.monotonic() - start
    total_pods = count * (1 + workers)

    def done() -> bool:
        # An operator that exits mid-run (mpi-operator does when it misses a Lease renewal) fails the run
        # at once, rather than after the wait's 15 minutes.
        if alive is not None and not alive():
            raise SystemExit(f"{name} exited during the run")
        with seen.lock:
            return len(seen.launchers) >= count and len(seen.pods) >= total_pods

    def all_running() -> bool:
        with seen.lock:
            return sum(len(pods) for pods in seen.running.values()) >= total_pods

    try:
        wait_for(done, timeout=900, interval=0.5, what=f"{name}: {count} launchers and {total_pods} pods")
        cpu1, _ = proc_usage(pid)  # the CPU figure stops where the pods' does
        wait_for(all_running, timeout=600, interval=0.5, what=f"{name}: {total_pods} pods Running")
        cpu2, _ = proc_usage(pid)
    finally:
        stop.set()
    requests = api_requests.settled(admin_kubeconfig) - requests0
    launches = seen.launches()
    latencies = [
        at - max(seen.ready[job].values())
        for job, at in launches.items()
        if len(seen.ready.get(job, {})) >= workers
    ]
    starts = [max(seen.running[job].values()) - created[job] for job in created if job in seen.running]
    running = {pod: at for pods in seen.running.values() for pod, at in pods.items()}
    scheduler = [seen.bound[pod] - at for pod, at in seen.pods.items() if pod in seen.bound]
    node = [running[pod] - at for pod, at in seen.bound.items() if pod in running]
    timelines = job_stages.timelines(created, seen.members, seen.pods, seen.bound, seen.ready, launches,
                                     seen.running, workers, origin=start)  # fmt: skip
    return Result(
        name,
        pods_s=seen.last_pod_at - start,
        launchers_s=max(seen.launchers.values()) - start,
        cpu_s=cpu1 - cpu0,
        peak_rss_mib=peak_rss_mib(pid),
        latency_p50_s=median(latencies),
        latency_p99_s=percentile(latencies, 0.99),
        start_p50_s=median(starts),
        start_p99_s=percentile(starts, 0.99),
        scheduler_p50_s=median(scheduler),
        node_p50_s=median(node),
        requests=requests,
        creates_s=creates_s,
        stages=job_stages.report(timelines),
        running_s=max(running.values()) - start,
        cpu_running_s=cpu2 - cpu0,
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
        operator.start_as_leader(api)
        assert operator.proc is not None

        def create(job: str) -> None:
            custom.create_namespaced_custom_object("kubeflow.org", "v2beta1", namespace, "mpijobs",
                                                   mpi_job(job, workers))  # fmt: skip

        return measure(api, name, namespace, operator.proc.pid, create, count, workers, MPI_JOB_LABEL,
                       admin_kubeconfig, alive=operator.alive)  # fmt: skip
    finally:
        operator.stop()
        delete_namespace(core, namespace)


def dtjob_run(
    api: client.ApiClient, kubeconfig: str, count: int, workers: int, admin_kubeconfig: str,
    profile: Path | None = None, hold_s: float = 0.0,
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
        proc = operator.proc
        result = measure(api, "dtjob", namespace, pid, create, count, workers, names.JOB_NAME_LABEL,
                         admin_kubeconfig, alive=lambda: proc.poll() is None)  # fmt: skip
        # What its liveness endpoint says then, and how long until its queue is empty (every job Running).
        depth = (operator.probes() or {}).get("queue")
        start = time.monotonic()
        wait_for(lambda: (operator.probes() or {}).get("queue") == 0, timeout=300, interval=0.5,
                 what="dtjob's queue empty")  # fmt: skip
        _, rss = proc_usage(pid)
        reconciles = (operator.probes() or {}).get("reconciles", 0)
        print(f"dtjob: queue {depth} when the last launcher existed, empty {time.monotonic() - start:.1f}s "
              f"later; RSS then {rss:.0f} MiB; {reconciles / count:.2f} reconciles per job",
              flush=True)  # fmt: skip
        calls = api_calls(operator.metrics_text())
        each = ", ".join(f"{verb} {what} {n / count:.2f}" for (verb, what), n in sorted(calls.items()))
        print(f"dtjob: {sum(calls.values()) / count:.1f} API calls per job: {each}", flush=True)
        if hold_s > 0:
            steady(operator, pid, count, hold_s)
        return result
    finally:
        operator.stop()
        delete_namespace(core, namespace)


def steady(operator: OperatorProcess, pid: int, count: int, hold_s: float) -> None:
    """What the operator costs the cluster once every job runs: its API calls a second (progress reads of
    the launchers' logs among them), reconciles and CPU, over `hold_s`."""
    calls0, probes0, (cpu0, _) = api_calls(operator.metrics_text()), operator.probes() or {}, proc_usage(pid)
    time.sleep(hold_s)
    calls1, probes1, (cpu1, _) = api_calls(operator.metrics_text()), operator.probes() or {}, proc_usage(pid)
    rate = {key: (n - calls0.get(key, 0.0)) / hold_s for key, n in calls1.items()}
    logs = rate.get(("get", "pods/log"), 0.0)
    reconciles = (probes1.get("reconciles", 0) - probes0.get("reconciles", 0)) / hold_s
    print(f"dtjob: {count} jobs running, over {hold_s:.0f}s: {sum(rate.values()):.1f} API calls a second, "
          f"{logs:.1f} of them progress reads (pods/log); {reconciles:.1f} reconciles a second; CPU "
          f"{(cpu1 - cpu0) / hold_s * 100:.1f}% of a core", flush=True)  # fmt: skip


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
          f"{'peak RSS':>9s} {'latency p50':>12s} {'p99':>7s} {'start p50':>10s} {'p99':>7s}")  # fmt: skip
    for r in results:
        print(f"{r.name:28s} {r.pods_s:8.1f}s {r.launchers_s:9.1f}s {r.cpu_s:7.2f}s "
              f"{r.cpu_s / count * 1e3:6.1f}ms {r.peak_rss_mib:6.0f}MiB {r.latency_p50_s:11.2f}s "
              f"{r.latency_p99_s:6.2f}s {r.start_p50_s:9.1f}s {r.start_p99_s:6.1f}s")  # fmt: skip
    print("Until every pod ran (the launches done):")
    for r in results:
        print(f"  {r.name:28s} {r.running_s:.1f}s, CPU {r.cpu_running_s:.2f}s")
    print("The bench's creates of the jobs, one after another, took:")
    for r in results:
        print(f"  {r.name:28s} {r.creates_s:.1f}s")
    print("Where the pods waited (p50 of all pods):")
    for r in results:
        print(f"  {r.name:28s} scheduler {r.scheduler_p50_s:.2f}s, node {r.node_p50_s:.2f}s")
    for r in results:
        print(f"Where {r.name}'s jobs waited to start:")
        for line in r.stages:
            print(f"  {line}")
    print("API requests, as the API server counted them:")
    for r in results:
        print(f"  {r.name:28s} {api_requests.per_job(r.requests, count)}")
    ours = results[-1]
    for other in results[:-1]:
        print(f"dtjob vs {other.name} (> 1: dtjob better): all pods {other.pods_s / ours.pods_s:.2f}x, all "
              f"Running {other.running_s / ours.running_s:.2f}x (CPU until then "
              f"{ours.cpu_running_s / other.cpu_running_s:.2f}x as much), "
              f"launchers {other.launchers_s / ours.launchers_s:.2f}x, job start p50 "
              f"{other.start_p50_s / ours.start_p50_s:.2f}x, p99 "
              f"{other.start_p99_s / ours.start_p99_s:.2f}x, CPU {ours.cpu_s / other.cpu_s:.2f}x "
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
    parser.add_argument("--hold", type=float, default=0.0, metavar="SECONDS",
                        help="once every job runs, measure dtjob's steady cost for this long")  # fmt: skip
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
    # Every launcher runs on the system pool, whose nodes take a bounded number of pods each (110 on AKS).
    system, room = 0, 0
    for node in nodes:
        if (node.metadata.labels or {}).get(POOL_LABEL) == "system":
            system += 1
            room += int((node.status.allocatable or {}).get("pods", 0))
    per_node = room // system if system else 110
    if room < args.jobs + SYSTEM_PODS_SPARE:
        sys.exit(f"the simulated system pool takes {room} pods, {args.jobs} launchers (and its own pods) "
                 f"need more: restart the cluster with SYSTEM_POOL_SIZE="
                 f"{-(-(args.jobs + SYSTEM_PODS_SPARE) // per_node)}")  # fmt: skip
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
        results.append(
            dtjob_run(api, kubeconfig, args.jobs, args.workers, admin_kubeconfig, args.profile, args.hold)
        )
        print(results[-1], flush=True)
    report(results, args.jobs, args.workers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
