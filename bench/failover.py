"""Failover of the operator's replicas: how long a job waits when its operator goes away mid-job, with a warm
standby (leader election, the chart's default lease timings) and, side by side, with one replica started
again at once (the best case without a standby: a kubelet restart that costs nothing).

    make cluster-up && python -m bench.failover [--runs 3]

Each run starts the replicas in a fresh namespace and creates a job whose workers never turn Ready (a job in
flight). Once its second worker exists, at a random moment of the leader's renewal cycle (0 to 5 s later), the
leader is stopped and a second job is created:
- kill: SIGKILL (an OOM kill, a lost node): the standby takes over once the Lease has gone unrenewed for a
  lease duration;
- term: SIGTERM (a rolling update, a drain): the leader releases the Lease and the standby takes it at its
  next look;
- restart: one replica without leader election, SIGKILLed and started again at once.
Measured from the signal: until the survivor says it leads (its /readyz), until the second job has a status
(the survivor's first write) and until its first worker pod exists (its first progress). Prints each run,
the medians, and the ratios.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dtjob.config import ElectionTimings
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from bench.operator_scale import kubeconfig_path
from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess, install_crd

POLL_S = 0.05
IN_FLIGHT, AFTER = "inflight", "after"


@dataclass(frozen=True)
class Run:
    mode: str
    leading_s: float  # signal -> the survivor leads
    write_s: float  # signal -> the job created at the signal has a status
    progress_s: float  # signal -> its first worker pod exists


def worker_exists(jobs: Jobs, job: str, index: int) -> bool:
    try:
        jobs.core.read_namespaced_pod(f"{job}-worker-{index}", jobs.ns)
    except ApiException as err:
        if err.status == 404:
            return False
        raise
    return True


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
            wait_for(lambda: worker_exists(jobs, IN_FLIGHT, 1), timeout=60, interval=POLL_S, what="workers")
            time.sleep(random.uniform(0, ElectionTimings().renew_interval_s))  # where in the renewal cycle
            signalled.append(time.monotonic())
            if mode == "term":
                assert leader.proc is not None
                leader.proc.terminate()
            else:
                leader.kill()
            stopped.set()

        watcher = threading.Thread(target=stop_at_the_second_worker, daemon=True)
        watcher.start()
        jobs.create(IN_FLIGHT, worker={"podAnnotations": {"sim.dtjob.io/ready-after": "600s"}})
        assert stopped.wait(70), "the leader was never stopped"
        started = signalled[0]
        jobs.create(AFTER)
        if mode == "restart":
            procs.append(replica("a2"))  # its start (imports, kopf, the first LIST) is part of the time
            survivor = procs[-1]
        else:
            survivor = procs[1]
        leading = stopwatch(started, survivor.leading, 60, "the survivor leading")
        write = stopwatch(started, lambda: bool(jobs.status(AFTER)), 60, "a status")
        progress = stopwatch(started, lambda: worker_exists(jobs, AFTER, 0), 60, "a worker")
        run = Run(mode, leading, write, progress)
        print(f"  {mode:<8} run {number}: leading {run.leading_s:5.1f} s, first write {run.write_s:5.1f} s, "
              f"first worker {run.progress_s:5.1f} s", flush=True)  # fmt: skip
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
    print(f"medians of {args.runs} runs, from the signal (min-max of the first write):")
    median: dict[str, float] = {}
    for mode, done in runs.items():
        median[mode] = statistics.median(r.write_s for r in done)
        leading = statistics.median(r.leading_s for r in done)
        progress = statistics.median(r.progress_s for r in done)
        low, high = min(r.write_s for r in done), max(r.write_s for r in done)
        print(f"  {mode:<8} leading {leading:5.1f} s, first write {median[mode]:5.1f} s "
              f"({low:.1f}-{high:.1f}), first worker {progress:5.1f} s")  # fmt: skip
    restart = median["restart"]
    kill, term = median["kill"] / restart, median["term"] / restart
    print(f"ratios of the wait for a first write to a cold restart of one replica ({restart:.1f} s, the best "
          f"case of a restart): SIGKILL {kill:.2f}x, SIGTERM {term:.2f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
