"""Gang schedulers beside the local control plane's own, each as a second scheduler (its own schedulerName;
the default scheduler keeps every other pod): scheduler-plugins' kube-scheduler with its Coscheduling plugin,
and Volcano's scheduler (vc-scheduler), with the gang schedulers' CRDs. Built and cached by
`hack/build-control-plane.sh scheduler_plugins volcano_crds volcano_scheduler` (make gang-schedulers).
Everything listens on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from testbed.cache import cache_root
from testbed.kube_wait import wait_for
from testbed.operator_harness import free_port, kubectl, terminate, wait_established

REPO = Path(__file__).resolve().parents[1]
# The name scheduler-plugins' Helm chart gives its second scheduler, and the operator's default for
# runPolicy.scheduling.gang.scheduler coscheduling.
SCHEDULER_NAME = "scheduler-plugins-scheduler"
COSCHEDULING_CRD = "podgroups.scheduling.x-k8s.io"
UNSCHEDULABLE_FLUSH_S = 10
VOLCANO_CRD = "podgroups.scheduling.volcano.sh"


def pinned(key: str) -> str:
    for line in (REPO / "hack" / "versions.env").read_text().splitlines():
        name, _, value = line.partition("=")
        if name.strip() == key and not line.startswith("#"):
            return value.strip()
    raise KeyError(key)


def scheduler_plugins_dir() -> Path:
    """The cached build: kube-scheduler and crds/ (scheduler-plugins' PodGroup CRD)."""
    return cache_root() / "bin" / f"scheduler-plugins-{pinned('SCHEDULER_PLUGINS_VERSION')}"


def volcano_crd_file() -> Path:
    return (
        cache_root()
        / "crds"
        / f"volcano-{pinned('VOLCANO_VERSION')}"
        / "scheduling.volcano.sh_podgroups.yaml"
    )


def volcano_dir() -> Path:
    """The cached build: vc-scheduler and crds/ (every CRD of Volcano's module)."""
    return cache_root() / "bin" / f"volcano-{pinned('VOLCANO_VERSION')}"


def coscheduling_crd_file() -> Path:
    return scheduler_plugins_dir() / "crds" / "scheduling.x-k8s.io_podgroups.yaml"


def install_crd_file(kubeconfig: str, path: Path, name: str) -> None:
    """Apply a CRD and wait until the API server serves it."""
    done = kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(path))
    assert done.returncode == 0, done.stderr

    wait_established(kubeconfig, name)


def delete_crd(kubeconfig: str, name: str) -> None:
    """Delete a CRD and wait until the API server no longer serves it (its objects go with it)."""
    kubectl(kubeconfig, "delete", f"crd/{name}", "--ignore-not-found", "--wait=true")
    wait_for(
        lambda: kubectl(kubeconfig, "get", f"crd/{name}").returncode != 0,
        timeout=60,
        interval=0.25,
        what=f"CRD {name} deleted",
    )


def scheduler_config(kubeconfig: str) -> str:
    """A KubeSchedulerConfiguration with one profile: the default plugins plus Coscheduling at every
    extension point it implements (its queue sort replacing the default one)."""
    coscheduling = "{enabled: [{name: Coscheduling}]}"
    return f"""apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection: {{leaderElect: false}}
clientConnection: {{kubeconfig: {json.dumps(kubeconfig)}}}
profiles:
  - schedulerName: {SCHEDULER_NAME}
    plugins:
      queueSort: {{enabled: [{{name: Coscheduling}}], disabled: [{{name: "*"}}]}}
      preFilter: {coscheduling}
      postFilter: {coscheduling}
      permit: {coscheduling}
      reserve: {coscheduling}
    pluginConfig:
      - name: Coscheduling
        args: {{permitWaitingTimeSeconds: 60}}
"""


class SchedulerProcess:
    """A second scheduler as a process of the test: its binary from the cache (make gang-schedulers), its
    log in `work_dir`, up once its health check answers on a loopback port."""

    name = ""  # for messages
    log_name = ""

    def __init__(self, kubeconfig: str, work_dir: Path) -> None:
        self.kubeconfig = kubeconfig
        self.work_dir = work_dir
        self.port = free_port()
        self.log_path = work_dir / self.log_name
        self.proc: subprocess.Popen[bytes] | None = None

    def _spawn(self, binary: Path, args: list[str], env: dict[str, str] | None = None) -> None:
        if not binary.is_file():
            raise FileNotFoundError(f"{binary} is not built: run `make gang-schedulers`")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [str(binary), *args], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
        wait_for(self._healthy, timeout=60, interval=0.25, what=f"{self.name} healthy")

    def _healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited ({self.proc.returncode}):\n{self.log_tail()}")
        try:
            with self._healthz():
                return True
        except (urllib.error.URLError, OSError):
            return False

    def _healthz(self) -> Any:
        """The answer of its health check (raises while it does not answer)."""
        raise NotImplementedError

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        terminate(self.proc)


class CoschedulingScheduler(SchedulerProcess):
    """scheduler-plugins' kube-scheduler, serving /healthz over TLS on a loopback port."""

    name = "scheduler-plugins' kube-scheduler"
    log_name = "scheduler-plugins.log"

    def start(self) -> None:
        config = self.work_dir / "scheduler-config.yaml"
        self.work_dir.mkdir(parents=True, exist_ok=True)
        config.write_text(scheduler_config(self.kubeconfig))
        self._spawn(
            scheduler_plugins_dir() / "kube-scheduler",
            [
                f"--config={config}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.port}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                f"--cert-dir={self.work_dir / 'certs'}",
                # Coscheduling retries a gang it turned away when a pod is added or a PodGroup changes, not
                # when a pod elsewhere is deleted: the periodic flush of unschedulable pods (every 30 s, of
                # those waiting longer than this; 5 minutes by default) is what sees the freed GPUs.
                f"--pod-max-in-unschedulable-pods-duration={UNSCHEDULABLE_FLUSH_S}s",
                "--v=3",
            ],
        )

    def _healthz(self) -> Any:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # its own self-signed serving certificate, on loopback
        return urllib.request.urlopen(f"https://127.0.0.1:{self.port}/healthz", context=context, timeout=2)


# Volcano's scheduler configuration as its chart ships it: enqueue (a PodGroup leaves Pending only when its
# queue and the cluster have room for its minResources), allocate and backfill; gang (all of minMember or
# none), proportion (each queue's share and capability) and the predicates of kube-scheduler.
VOLCANO_CONF = """actions: "enqueue, allocate, backfill"
tiers:
- plugins:
  - name: priority
  - name: gang
    enablePreemptable: false
  - name: conformance
- plugins:
  - name: overcommit
  - name: drf
    enablePreemptable: false
  - name: predicates
  - name: proportion
  - name: nodeorder
  - name: binpack
"""
VOLCANO_SCHEDULER_NAME = "volcano"


class VolcanoScheduler(SchedulerProcess):
    """Volcano's vc-scheduler: no leader election, its health check on a loopback port, its metrics off. It
    creates Volcano's `default` Queue when it starts."""

    name = "Volcano's scheduler"
    log_name = "vc-scheduler.log"

    def start(self) -> None:
        config = self.work_dir / "volcano-scheduler.conf"
        self.work_dir.mkdir(parents=True, exist_ok=True)
        config.write_text(VOLCANO_CONF)
        self._spawn(
            volcano_dir() / "vc-scheduler",
            [
                f"--kubeconfig={self.kubeconfig}",
                f"--scheduler-conf={config}",
                f"--scheduler-name={VOLCANO_SCHEDULER_NAME}",
                "--schedule-period=1s",
                "--leader-elect=false",
                "--enable-healthz=true",
                f"--healthz-address=127.0.0.1:{self.port}",
                "--listen-address=127.0.0.1:0",
                f"--cache-dump-dir={self.work_dir}",
                "--v=3",
            ],
            # A plugin of its (HAMi vGPU) reads $HOME/.kube/config at start; the test's cluster is elsewhere.
            env={**os.environ, "KUBECONFIG": self.kubeconfig, "HOME": str(self.work_dir)},
        )

    def _healthz(self) -> Any:
        return urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2)
