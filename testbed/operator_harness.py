"""Integration helpers for the operator: install the CRD, run the operator as a subprocess, poll jobs."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from dtjob.kube.connect import ApiClient, connect
from dtjob.kube.credentials import kubeconfig_credentials
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from testbed.kube_wait import wait_for

REPO = Path(__file__).resolve().parents[1]
CRD_FILE = REPO / "crds" / "dtjob.io_distributedtrainingjobs.yaml"
GROUP, VERSION, PLURAL = "dtjob.io", "v1alpha1", "distributedtrainingjobs"


def kubectl(kubeconfig: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", "--kubeconfig", kubeconfig, *args],
        input=stdin,
        text=True,
        capture_output=True,
        timeout=60,
    )


def operator_client(kubeconfig: str) -> ApiClient:
    """The operator's own client (dtjob.kube.connect) for the cluster of `kubeconfig`, as the operator
    connects: its deadlines and retries, its reading of the kubeconfig."""
    return connect(10.0, 30.0, 3, credentials=kubeconfig_credentials({"KUBECONFIG": kubeconfig}))


def install_crd(kubeconfig: str) -> None:
    done = kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    assert done.returncode == 0, done.stderr

    wait_established(kubeconfig, "distributedtrainingjobs.dtjob.io")


def wait_established(kubeconfig: str, crd: str) -> None:
    """Until the API server serves the CRD named `crd`. Polled, not `kubectl wait
    --for=condition=Established`: that fails at once on a CRD whose status the API server has not written yet
    (".status.conditions accessor error: <nil>")."""

    def established() -> bool:
        found = kubectl(kubeconfig, "get", f"crd/{crd}", "-o", "json")
        conditions = json.loads(found.stdout or "{}").get("status", {}).get("conditions") or []
        return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)

    wait_for(established, timeout=60, interval=0.25, what=f"CRD {crd} Established")


_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on, never one this process handed out before: once its socket closes,
    bind(0) may give the same port again, and two servers of one operator (liveness, metrics) then collide."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def terminate(proc: subprocess.Popen[Any] | None, grace_s: float = 30) -> None:
    """SIGTERM a test bed process that may still run; SIGKILL it if it has not ended within grace_s."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


class OperatorProcess:
    """`python -m dtjob operator` watching one namespace, liveness, readiness and metrics on loopback ports
    (`metrics` False: no metrics server).

    Without leader election by default (one operator per test, whatever the machine the tests run on); with
    `leader_elect`, one of several replicas named `name`, whose Lease lives in the watched namespace.
    `verbose` False: logging as deployed (the chart's default), for benchmarks. `extra_namespaces`: more
    namespaces it watches."""

    def __init__(
        self,
        kubeconfig: str,
        namespace: str,
        log_path: Path,
        env: dict[str, str] | None = None,
        metrics: bool = True,
        leader_elect: bool = False,
        name: str = "operator",
        verbose: bool = True,
        extra_namespaces: list[str] | None = None,
    ) -> None:
        self.extra_env = dict(env or {})
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.log_path = log_path
        self.leader_elect = leader_elect
        self.name = name
        self.verbose = verbose
        self.extra_namespaces = list(extra_namespaces or [])
        self.port = free_port()
        self.metrics_port = free_port() if metrics else 0
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = dict(os.environ)
        env["KUBECONFIG"] = self.kubeconfig
        env["PYTHONPATH"] = os.pathsep.join([str(REPO / "operator"), str(REPO), env.get("PYTHONPATH", "")])
        env["DTJOB_RESYNC_SECONDS"] = "20"
        if self.leader_elect:
            env.update({"POD_NAMESPACE": self.namespace, "POD_NAME": self.name})
        env.update(self.extra_env)
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dtjob", "operator", "--watch-namespace", self.namespace,
             *(arg for ns in self.extra_namespaces for arg in ("--watch-namespace", ns)),
             *(["--verbose"] if self.verbose else []),
             "--liveness", f"http://127.0.0.1:{self.port}/healthz",
             "--metrics-address", "127.0.0.1", "--metrics-port", str(self.metrics_port),
             "--leader-elect" if self.leader_elect else "--no-leader-elect"],
            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
        )  # fmt: skip
        wait_for(self.probes, timeout=60, what=f"operator liveness (log: {self.log_path})")

    def probes(self) -> dict[str, Any] | None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"operator exited with {self.proc.returncode}:\n{self.log_tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2) as response:
                data: dict[str, Any] = json.loads(response.read())
                return data
        except OSError:
            return None

    def metrics_text(self) -> str:
        """The operator's /metrics page, as Prometheus scrapes it."""
        assert self.metrics_port, "started without metrics"
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            text: str = response.read().decode()
            return text

    def reconciles(self) -> int:
        return int((self.probes() or {}).get("reconciles", 0))

    def readiness(self) -> dict[str, Any] | None:
        """/readyz's body (ready or not: `ready`, `leader`, `identity`, `holder`...), None if it does not
        answer."""
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"operator exited with {self.proc.returncode}:\n{self.log_tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as response:
                data: dict[str, Any] = json.loads(response.read())
        except urllib.error.HTTPError as err:  # 503: not ready, with the same body
            data = json.loads(err.read())
        except OSError:
            return None
        return data

    def leading(self) -> bool:
        return bool((self.readiness() or {}).get("leader"))

    @property
    def identity(self) -> str:
        """This replica's name in the Lease (its `name` and a random suffix)."""
        return str((self.readiness() or {})["identity"])

    def stop(self) -> None:
        terminate(self.proc)

    def kill(self) -> None:
        """SIGKILL, as the OOM killer or a lost node ends it: no handler runs, requests are cut mid-flight."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


class Jobs:
    """DistributedTrainingJob and child access for one namespace."""

    def __init__(self, api_client: client.ApiClient, namespace: str) -> None:
        self.ns = namespace
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)

    def create(self, name: str, **spec: Any) -> dict[str, Any]:
        return self.create_labelled(name, {}, **spec)

    def create_labelled(self, name: str, labels: Mapping[str, str], **spec: Any) -> dict[str, Any]:
        body_spec: dict[str, Any] = {"framework": "pytorch", "workers": 2, "gpusPerWorker": 4}
        body_spec.update(spec)
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "DistributedTrainingJob",
                "metadata": {"name": name, "labels": dict(labels)}, "spec": body_spec}  # fmt: skip
        created = self.custom.create_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, body)
        return cast(dict[str, Any], created)

    def get(self, name: str) -> dict[str, Any] | None:
        try:
            job = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name)
            return cast(dict[str, Any], job)
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    def status(self, name: str) -> dict[str, Any]:
        job = self.get(name) or {}
        status: dict[str, Any] = job.get("status") or {}
        return status

    def patch_spec(self, name: str, spec: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name, {"spec": spec})

    def delete(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name)

    def wait_phase(self, name: str, *phases: str, timeout: float = 90) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            status = self.status(name)
            return status if status.get("phase") in phases else None

        try:
            return wait_for(reached, timeout=timeout, interval=0.5, what=f"{name} phase in {phases}")
        except AssertionError as err:
            raise AssertionError(f"{err}\nlast status: {json.dumps(self.status(name), indent=1)}") from None

    def pods(self, name: str, role: str | None = None) -> list[client.V1Pod]:
        selector = f"dtjob.io/job-name={name}" + (f",dtjob.io/role={role}" if role else "")
        return list(self.core.list_namespaced_pod(self.ns, label_selector=selector).items)

    def live_workers(self, name: str) -> list[client.V1Pod]:
        return [p for p in self.pods(name, "worker") if p.metadata and p.metadata.deletion_timestamp is None]

    def launcher(self, name: str) -> client.V1Pod | None:
        """The job's launcher pod, which the operator makes itself, named after the job."""
        try:
            return self.core.read_namespaced_pod(f"{name}-launcher", self.ns)
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    def annotate_pod(self, pod: str, annotations: dict[str, str]) -> None:
        self.core.patch_namespaced_pod(pod, self.ns, {"metadata": {"annotations": annotations}})

    def events(self, name: str) -> list[client.CoreV1Event]:
        selector = f"involvedObject.name={name},involvedObject.kind=DistributedTrainingJob"
        return list(self.core.list_namespaced_event(self.ns, field_selector=selector).items)

    def wait_event(self, name: str, reason: str, timeout: float = 15) -> client.CoreV1Event:
        """The job's first event of `reason`. Waited for: the operator posts a reconcile's events after the
        status patch they go with, so a test that has just seen the status may list the events before them."""

        def posted() -> client.CoreV1Event | None:
            return next((e for e in self.events(name) if e.reason == reason), None)

        return wait_for(posted, timeout=timeout, interval=0.25, what=f"event {reason}")

    def condition(self, name: str, kind: str) -> dict[str, Any] | None:
        return next((c for c in self.status(name).get("conditions") or [] if c["type"] == kind), None)
