"""Failover of the operator's replicas: how long a job waits when its operator goes away mid-job, with a warm
standby (leader election, the chart's default lease timings) and, side by side, with one replica started
again at once (the best case without a standby: a kubelet restart that costs nothing).

    make cluster-up && python -m bench.failover [--runs 3]

Each run starts the replicas in a fresh namespace, creates a job whose workers turn Ready 3 s after they are
created, and stops the leader the moment its second worker exists, before it could create the launcher:
- kill: SIGKILL (an OOM kill, a lost node): the standby takes over once the Lease has gone unrenewed for a
  lease duration;
- term: SIGTERM (a rolling update, a drain): the leader releases the Lease and the standby takes it at its
  next look;
- restart: one replica without leader election, SIGKILLed and started again at once.
Measured from the signal: until the survivor says it leads (its /readyz), and until the launcher Job exists
(the job's first progress, written by the survivor). Prints each run, the medians, and the ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dtjob.leader import ElectionTimings
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from bench.operator_scale import kubeconfig_path
from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess, install_crd

POLL_S = 0.05
JOB = "failover"


@dataclass(frozen=True)
class Run:
    mode: str
    leading_s: float  # signal -> the survivor leads
    progress_s: float  # signal -> the launcher Job exists


def launcher_exists(jobs: Jobs) -> bool:
    try:
        jobs.batch.read_namespaced_job(f"{JOB}-launcher", jobs.ns)
    except ApiException as err:
        if err.status == 404:
            return False
        raise
    return True


def second_worker_exists(jobs: Jobs) -> bool:
    return any(p.metadata.name == f"{JOB}-worker-1" for p in jobs.pods(JOB, "worker"))


def stopwatch(started: float, done: Callable[[], bool], timeout: float, what: str) -> float:
    """Seconds from `started` (monotonic) until `done()`, polled every POLL_S."""
    wait_for(done, timeout=timeout, interval=POLL_S, what=what)
    return time.monotonic() - started


def one_run(kubeconfig: str, api: client.ApiClient, mode: str, number: int) -> Run:
    core = client.CoreV1Api(api)
    namespace = f"bench-failover-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    jobs = Jobs(api, namespace)
    elect = mode != "restart"
    logs = Path(f"/tmp/dtjob-{namespace}")

    def replica(name: str) -> OperatorProcess:
        proc = OperatorProcess(
            kubeconfig, namespace, Path(f"{logs}-{name}.log"), leader_elect=elect, name=name
        )
        proc.start()
        return proc

    procs = [replica("a")]
    try:
        leader = procs[0]
        if elect:
            wait_for(leader.leading, timeout=30, what="a leading")
            procs.append(replica("b"))
            wait_for(lambda: (procs[1].readiness() or {}).get("holder") == leader.identity, timeout=30,
                     what="b standing by")  # fmt: skip
        stopped = threading.Event()
        signalled: list[float] = []

        def stop_at_the_second_worker() -> None:
            wait_for(lambda: second_worker_exists(jobs), timeout=60, interval=POLL_S, what="two workers")
            signalled.append(time.monotonic())
            if mode == "term":
                assert leader.proc is not None
                leader.proc.terminate()
            else:
                leader.kill()
            stopped.set()

        watcher = threading.Thread(target=stop_at_the_second_worker, daemon=True)
        watcher.start()
        jobs.create(
            JOB,
            worker={"podAnnotations": {"sim.dtjob.io/ready-after": "3s"}},
            launcher={"podAnnotations": {"sim.dtjob.io/run-duration": "600s"}},
        )
        assert stopped.wait(60), "the leader was never stopped"
        started = signalled[0]
        assert not launcher_exists(jobs), "the leader created the launcher before it was stopped"
        if mode == "restart":
            procs.append(replica("a2"))  # its start (imports, kopf, the first LIST) is part of the time
            survivor = procs[-1]
        else:
            survivor = procs[1]
        leading = stopwatch(started, survivor.leading, 60, "the survivor leading")
        progress = stopwatch(started, lambda: launcher_exists(jobs), 60, "the launcher created")
        run = Run(mode, leading, progress)
        print(f"  {mode:<8} run {number}: leading after {run.leading_s:5.1f} s, launcher after "
              f"{run.progress_s:5.1f} s", flush=True)  # fmt: skip
        return run
    finally:
        for proc in procs:
            proc.stop()
        core.delete_namespace(namespace, propagation_policy="Background")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    kubeconfig = kubeconfig_path()
    install_crd(kubeconfig)
    api = config.new_client_from_config(config_file=kubeconfig)
    timings = ElectionTimings()
    print(f"lease {timings.lease_duration_s:g} s, renew deadline {timings.renew_deadline_s:g} s, renewals "
          f"every {timings.renew_interval_s:g} s, retry {timings.retry_period_s:g} s")  # fmt: skip
    runs = {mode: [one_run(kubeconfig, api, mode, n + 1) for n in range(args.runs)]
            for mode in ("kill", "term", "restart")}  # fmt: skip
    median = {mode: (statistics.median(r.leading_s for r in rs), statistics.median(r.progress_s for r in rs))
              for mode, rs in runs.items()}  # fmt: skip
    print(f"medians of {args.runs} runs, from the signal:")
    for mode, (leading, progress) in median.items():
        spread = ", ".join(f"{r.progress_s:.1f}" for r in runs[mode])
        print(f"  {mode:<8} leading {leading:5.1f} s, launcher {progress:5.1f} s (runs: {spread})")
    restart = median["restart"][1]
    print(
        f"ratios of the job's wait to a cold restart of one replica ({restart:.1f} s, the best case of a "
        f"restart): SIGKILL {median['kill'][1] / restart:.2f}x, SIGTERM {median['term'][1] / restart:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
