"""Operator at scale: many jobs against the local control plane, what observing pods through the watch
cache saves over listing them on every reconcile, and what the Prometheus metrics cost, measured side by side
in one run.

    make cluster-up && python -m bench.operator_scale [--jobs 100] [--pairs 1] [--scrape-seconds 1]

1. End to end, metrics off and on: N one-GPU jobs are created at once with the operator (a subprocess, as
   deployed) running, once with its metrics server off (--metrics-port 0) and once with it on and scraped
   every --scrape-seconds (1 s: far more often than a Prometheus would, an upper bound), each in a namespace
   of its own; --pairs repeats the pair, in alternating order. Prints, per run, the time until every job has
   its worker pod and a status, the reconciles that took, the operator's CPU time and memory, and its CPU over
   --steady-seconds afterwards with every job running; then the on/off ratios of the totals.
2. Observation cost: with the operator stopped and the cluster settled, every job is reconciled once (a
   no-op, as most reconciles are) in this process, first with its children taken from a cache filled by one
   LIST per kind (what the operator's kopf indices hold; the operator pays not even those), then with its
   pods (its launcher's among them) listed per reconcile (the naive design). Prints reconciles/s of both and
   the ratio.
3. Recording cost: what the metrics cost where they are recorded whether or not they are served (one API
   call's latency and labels, one reconcile's duration), in microseconds per call, beside the cost of a no-op
   reconcile measured in 2.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dtjob import API_GROUP, API_VERSION, PLURAL, metrics, names
from dtjob.config import load_config
from dtjob.kube.client import KubeClient
from dtjob.reconcile.job import Children, reconcile
from dtjob.runtime.cached_kube import CachedKube
from kubernetes import client, config

from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess, install_crd, operator_client

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


@dataclass
class Run:
    metrics: bool
    wall_s: float  # until every job had its worker pod and a status
    cpu_s: float  # the operator's CPU meanwhile
    steady_cpu_s: float  # the operator's CPU over the steady period afterwards
    rss_mib: float
    scrapes: int = 0
    page_bytes: int = 0  # the last /metrics page


class Scraper:
    """Fetches the operator's /metrics every `interval` seconds on a thread, as a Prometheus would."""

    def __init__(self, operator: OperatorProcess, interval: float) -> None:
        self.operator = operator
        self.interval = interval
        self.scrapes = 0
        self.page_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.page_bytes = len(self.operator.metrics_text())
            self.scrapes += 1


def end_to_end(jobs: Jobs, operator: OperatorProcess, count: int, steady_s: float) -> Run:
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
    time.sleep(steady_s)  # a period of running jobs: resyncs, progress reads (and scrapes)
    cpu2, rss = proc_usage(operator.proc.pid)
    served = "on" if operator.metrics_port else "off"
    print(f"end to end, metrics {served}: {count} jobs created in {created:.1f}s; all with a worker pod "
          f"and a status after {elapsed:.1f}s ({count / elapsed:.1f} jobs/s)")  # fmt: skip
    print(f"  phases: {dict(sorted(phases.items()))} (the simulated pool has 16 GPUs)")
    print(f"  operator: {reconciles} reconciles (liveness report, up to 10s old), {cpu1 - cpu0:.2f}s CPU, "
          f"then {cpu2 - cpu1:.2f}s CPU in {steady_s:.0f}s steady, {rss:.0f} MiB RSS")  # fmt: skip
    return Run(bool(operator.metrics_port), elapsed, cpu1 - cpu0, cpu2 - cpu1, rss)


def metrics_run(
    api: client.ApiClient, kubeconfig: str, count: int, served: bool, scrape_s: float, steady_s: float
) -> tuple[Run, str]:
    """One end-to-end run in a namespace of its own; returns it and the namespace (its jobs still there)."""
    core = client.CoreV1Api(api)
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    log = Path(f"/tmp/dtjob-{namespace}-operator.log")
    operator = OperatorProcess(kubeconfig, namespace, log, metrics=served)
    try:
        operator.start()
        if not served:
            return end_to_end(Jobs(api, namespace), operator, count, steady_s), namespace
        with Scraper(operator, scrape_s) as scraper:
            run = end_to_end(Jobs(api, namespace), operator, count, steady_s)
        run.scrapes, run.page_bytes = scraper.scrapes, scraper.page_bytes
        print(f"  {scraper.scrapes} scrapes, the last /metrics page {scraper.page_bytes / 1024:.1f} KiB")
        scrape_cost(operator)
        return run, namespace
    finally:
        operator.stop()


def scrape_cost(operator: OperatorProcess, scrapes: int = 200) -> None:
    """The operator's CPU per scrape, from back-to-back scrapes (its idle work meanwhile included)."""
    assert operator.proc is not None
    cpu0, _ = proc_usage(operator.proc.pid)
    start = time.monotonic()
    for _ in range(scrapes):
        operator.metrics_text()
    elapsed = time.monotonic() - start
    cpu1, _ = proc_usage(operator.proc.pid)
    per_scrape = (cpu1 - cpu0) / scrapes
    print(f"  {scrapes} scrapes back to back in {elapsed:.1f}s: {per_scrape * 1e3:.1f} ms operator CPU each, "
          f"{per_scrape / 30 * 100:.3f}% of a core at a 30s scrape interval")  # fmt: skip


def delete_namespace(core: client.CoreV1Api, namespace: str) -> None:
    """Delete it and wait until it is gone, so that the next run starts on an empty pool."""
    core.delete_namespace(namespace, propagation_policy="Background")

    def gone() -> bool:
        return not [n for n in core.list_namespace().items if n.metadata.name == namespace]

    wait_for(gone, timeout=300, interval=1.0, what=f"namespace {namespace} deleted")


def metrics_overhead(runs: list[Run], scrape_s: float) -> None:
    off = [r for r in runs if not r.metrics]
    on = [r for r in runs if r.metrics]

    def total(rs: list[Run], field: str) -> float:
        return float(sum(getattr(r, field) for r in rs))

    print(f"metrics overhead, {len(on)} run(s) each, on = served and scraped every {scrape_s:g}s:")
    for field, what in (("wall_s", "wall time to settle"), ("cpu_s", "operator CPU while settling"),
                        ("steady_cpu_s", "operator CPU while steady")):  # fmt: skip
        a, b = total(off, field), total(on, field)
        print(f"  {what:28s} off {a:7.2f}s  on {b:7.2f}s  ratio on/off {b / a if a else float('nan'):.3f}")


def observation_cost(api: client.ApiClient, kubeconfig: str, namespace: str, count: int, rounds: int) -> None:
    ours = operator_client(kubeconfig)
    kube = CachedKube(KubeClient(ours), ours)  # as the operator hands it to reconciles: with its caches
    settings = load_config()
    core = client.CoreV1Api(api)
    keys = [f"scale-{i}" for i in range(count)]

    def cached() -> float:
        start = time.monotonic()
        # One LIST per kind stands in for the watch cache the operator keeps (it pays not even that).
        pods: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for pod in core.list_namespaced_pod(namespace, label_selector=names.JOB_NAME_LABEL).items:
            pods[pod.metadata.labels[names.JOB_NAME_LABEL]].append(api.sanitize_for_serialization(pod))
        for name in keys:
            reconcile(kube, settings, namespace, name, Children(tuple(pods[name])))
        return time.monotonic() - start

    def listed() -> float:
        start = time.monotonic()
        for name in keys:
            selector = f"{names.JOB_NAME_LABEL}={name}"
            pods = [api.sanitize_for_serialization(p)
                    for p in core.list_namespaced_pod(namespace, label_selector=selector).items]  # fmt: skip
            reconcile(kube, settings, namespace, name, Children(tuple(pods)))
        return time.monotonic() - start

    cached()  # warm connections
    best_cached = min(cached() for _ in range(rounds))
    best_listed = min(listed() for _ in range(rounds))
    print(f"observation cost, {count} no-op reconciles (best of {rounds}):")
    print(f"  watch cache (operator's design): {count / best_cached:7.1f} reconciles/s, 1 API call each")
    print(f"  list per reconcile (baseline):   {count / best_listed:7.1f} reconciles/s, 2 API calls each")
    print(f"  ratio: {best_listed / best_cached:.2f}x faster with the cache")


def recording_cost(calls: int = 200_000) -> None:
    url = "https://10.0.0.1:443/api/v1/namespaces/ml/pods/rn50-worker-0"
    start = time.perf_counter()
    for _ in range(calls):
        metrics.api_call_done("GET", url, 0.003, 200, None)
    per_call = (time.perf_counter() - start) / calls
    start = time.perf_counter()
    for _ in range(calls):
        metrics.RECONCILE_DURATION.observe(0.02)
    per_reconcile = (time.perf_counter() - start) / calls
    print(f"recording cost: {per_call * 1e6:.1f} us per API call (labels parsed from the URL, histogram), "
          f"{per_reconcile * 1e6:.1f} us per reconcile (histogram)")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the observation-cost measurement")
    parser.add_argument("--pairs", type=int, default=1, help="metrics off/on pairs of end-to-end runs")
    parser.add_argument("--scrape-seconds", type=float, default=1.0, help="scrape interval with metrics on")
    parser.add_argument("--steady-seconds", type=float, default=30.0, help="steady period measured per run")
    args = parser.parse_args()
    kubeconfig = kubeconfig_path()
    install_crd(kubeconfig)
    api = config.new_client_from_config(config_file=kubeconfig)
    core = client.CoreV1Api(api)
    runs: list[Run] = []
    namespace = None
    try:
        for pair in range(args.pairs):
            for served in (False, True) if pair % 2 == 0 else (True, False):
                if namespace is not None:
                    delete_namespace(core, namespace)
                run, namespace = metrics_run(
                    api, kubeconfig, args.jobs, served, args.scrape_seconds, args.steady_seconds
                )
                runs.append(run)
        metrics_overhead(runs, args.scrape_seconds)
        assert namespace is not None
        observation_cost(api, kubeconfig, namespace, args.jobs, args.rounds)
        recording_cost()
    finally:
        if namespace is not None:
            core.delete_namespace(namespace, propagation_policy="Background")
    return 0


if __name__ == "__main__":
    sys.exit(main())
