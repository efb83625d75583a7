"""What both demos share: a kubectl runner, the operator as a local process, the CRD wait, and a line per
change of the job's status."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from testbed import pidfile

CRD_NAME = "distributedtrainingjobs.dtjob.io"
CRD_TIMEOUT_SECONDS = 60.0

Kubectl = Callable[..., str]


def kubectl_runner(kubeconfig: str) -> Kubectl:
    """kubectl against `kubeconfig`: prints its output, or returns it with capture=True."""

    def run(*args: str, capture: bool = False, stdin: str | None = None) -> str:
        result = subprocess.run(
            ["kubectl", "--kubeconfig", kubeconfig, *args],
            input=stdin,
            text=True,
            check=True,
            capture_output=capture,
        )
        return result.stdout if capture else ""

    return run


def banner(text: str) -> None:
    print(f"\n=== {text}", flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _operator_argv(namespace: str, liveness: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "dtjob",
        "operator",
        "--watch-namespace",
        namespace,
        "--liveness",
        liveness,
        "--metrics-address",
        "127.0.0.1",
        "--metrics-port",
        str(free_port()),
    ]


def _operator_env(kubeconfig: str, extra_env: dict[str, str] | None) -> dict[str, str]:
    return {**os.environ, "KUBECONFIG": kubeconfig, "DTJOB_PROGRESS_SECONDS": "2", **(extra_env or {})}


def _wait_live(liveness: str, exited: Callable[[], str | None], log_path: Path) -> bool:
    """Whether the operator's liveness endpoint answered within 60s; `exited` says how the operator ended, or
    None while it runs (the demo exits then)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        how = exited()
        if how is not None:
            raise SystemExit(f"the operator exited early ({how}); see {log_path}")
        try:
            with urllib.request.urlopen(liveness, timeout=2):
                print(f"operator live at {liveness}")
                return True
        except OSError:
            time.sleep(0.5)
    return False


def start_operator(
    kubeconfig: str, namespace: str, log_path: Path, extra_env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """`python -m dtjob operator` watching `namespace`, returned once its liveness endpoint answers."""
    liveness = f"http://127.0.0.1:{free_port()}/healthz"
    log = log_path.open("wb")
    process = subprocess.Popen(
        _operator_argv(namespace, liveness),
        stdout=log,
        stderr=subprocess.STDOUT,
        env=_operator_env(kubeconfig, extra_env),
    )

    def exited() -> str | None:
        return None if process.poll() is None else f"code {process.returncode}"

    if _wait_live(liveness, exited, log_path):
        return process
    process.terminate()
    raise SystemExit(f"the operator did not become live within 60s; see {log_path}")


def start_operator_detached(
    kubeconfig: str,
    namespace: str,
    pidfile_path: Path,
    log_path: Path,
    extra_env: dict[str, str] | None = None,
) -> int:
    """The operator as start_operator runs it, but outliving this process (testbed.pidfile): the one an
    earlier run left (tracked by `pidfile_path`) is stopped first, so a second run starts this checkout's
    code with this run's settings. Returns its pid once it is live; pidfile.stop(pidfile_path) stops it."""
    if pidfile.stop(pidfile_path) is not None:
        print("stopped the operator an earlier run left")
    liveness = f"http://127.0.0.1:{free_port()}/healthz"
    pid = pidfile.spawn(
        _operator_argv(namespace, liveness), pidfile_path, log_path, env=_operator_env(kubeconfig, extra_env)
    )

    def exited() -> str | None:
        return None if pidfile.running(pidfile_path) == pid else "it is gone"

    if _wait_live(liveness, exited, log_path):
        return pid
    pidfile.stop(pidfile_path)
    raise SystemExit(f"the operator did not become live within 60s; see {log_path}")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_established(run: Kubectl, crd: str = CRD_NAME, timeout: float = CRD_TIMEOUT_SECONDS) -> None:
    """Poll (through `run`, a kubectl runner) until the CRD's Established condition is True. Not `kubectl
    wait --for=condition=Established`: on a CRD created a moment ago it fails at once (".status.conditions
    accessor error: <nil>") when the API server has not yet written any status."""
    deadline = time.monotonic() + timeout
    conditions: list[dict[str, Any]] = []
    while True:
        found = json.loads(run("get", "crd", crd, "-o", "json", capture=True))
        conditions = (found.get("status") or {}).get("conditions") or []
        if any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
            return
        if time.monotonic() > deadline:
            shown = json.dumps(conditions)
            raise SystemExit(f"demo: CRD {crd} is not Established after {timeout:.0f}s; conditions: {shown}")
        time.sleep(0.25)


def summary(job: dict[str, Any]) -> tuple[str, ...]:
    status = job.get("status") or {}
    workers = status.get("workers") or {}
    launcher = status.get("launcher") or {}
    progress = status.get("progress") or {}
    return (
        str(status.get("phase") or "-"),
        f"workers {workers.get('ready', 0)}/{workers.get('total', 0)} ready",
        f"launcher {launcher.get('state', '-')}",
        f"restarts {status.get('restarts', 0)}",
        str(progress.get("summary") or ""),
        str(status.get("message") or ""),
    )


def follow(run: Kubectl, namespace: str, name: str, timeout: float) -> str:
    """Print a line for every change of the job's status until it finishes; returns its final phase."""
    started = time.monotonic()
    last: tuple[str, ...] = ()
    while time.monotonic() - started < timeout:
        job = yaml.safe_load(run("get", "dtj", name, "-n", namespace, "-o", "yaml", capture=True))
        current = summary(job)
        if current != last:
            print(
                f"[{time.monotonic() - started:6.1f}s] " + " | ".join(part for part in current if part),
                flush=True,
            )
            last = current
        if current[0] in ("Succeeded", "Failed"):
            return current[0]
        time.sleep(0.5)
    return "TimedOut"
