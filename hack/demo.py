"""`make demo`: the sample PyTorch ResNet-50 job, end to end, on the local control plane.

Installs the CRD, starts the operator, applies examples/pytorch-synthetic-resnet50.yaml, prints every change
of the job's status until it finishes, then shows the objects the operator created and the final status. The
cluster is simulated (kwok): the demo gives the launcher pod a run time of DEMO_RUN_SECONDS (default 15)
through the job's own spec.launcher.podAnnotations, since no training really runs.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "pytorch-synthetic-resnet50.yaml"
NAMESPACE = os.environ.get("DEMO_NAMESPACE", "dtjob-demo")
TIMEOUT_SECONDS = float(os.environ.get("DEMO_TIMEOUT", "300"))
RUN_SECONDS = os.environ.get("DEMO_RUN_SECONDS", "15")


def kubeconfig() -> str:
    out = subprocess.run(
        [str(REPO / "hack" / "cluster.sh"), "kubeconfig"], check=True, capture_output=True, text=True
    )
    return out.stdout.strip()


def kubectl(*args: str, capture: bool = False, stdin: str | None = None) -> str:
    result = subprocess.run(
        ["kubectl", "--kubeconfig", kubeconfig(), *args],
        input=stdin,
        text=True,
        check=True,
        capture_output=capture,
    )
    return result.stdout if capture else ""


def banner(text: str) -> None:
    print(f"\n=== {text}", flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start_operator(log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    liveness = f"http://127.0.0.1:{free_port()}/healthz"
    env = {**os.environ, "KUBECONFIG": kubeconfig()}
    log = log_path.open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "dtjob", "operator", "--namespace", NAMESPACE, "--liveness", liveness],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the operator exited early (code {process.returncode}); see {log_path}")
        try:
            with urllib.request.urlopen(liveness, timeout=2):
                return process, liveness
        except OSError:
            time.sleep(0.5)
    process.terminate()
    raise SystemExit(f"the operator did not become live within 60s; see {log_path}")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def job_manifest() -> dict[str, Any]:
    manifest: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    launcher = manifest["spec"].setdefault("launcher", {})
    launcher.setdefault("podAnnotations", {})["sim.dtjob.io/run-duration"] = f"{RUN_SECONDS}s"
    return manifest


def summary(job: dict[str, Any]) -> tuple[str, ...]:
    status = job.get("status") or {}
    workers = status.get("workers") or {}
    launcher = status.get("launcher") or {}
    return (
        str(status.get("phase") or "-"),
        f"workers {workers.get('ready', 0)}/{workers.get('total', 0)} ready",
        f"launcher {launcher.get('state', '-')}",
        f"restarts {status.get('restarts', 0)}",
        str(status.get("message") or ""),
    )


def follow(name: str) -> str:
    started = time.monotonic()
    last: tuple[str, ...] = ()
    while time.monotonic() - started < TIMEOUT_SECONDS:
        job = yaml.safe_load(kubectl("get", "dtj", name, "-n", NAMESPACE, "-o", "yaml", capture=True))
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


def main() -> int:
    state_dir = Path(os.environ.get("DTJOB_CACHE", Path.home() / ".cache" / "dtjob")) / "demo"
    state_dir.mkdir(parents=True, exist_ok=True)
    manifest = job_manifest()
    name = manifest["metadata"]["name"]

    banner("installing the DistributedTrainingJob CRD")
    kubectl("apply", "-f", str(REPO / "crds"))
    kubectl("wait", "--for=condition=Established", "crd/distributedtrainingjobs.dtjob.io", "--timeout=60s")
    namespaces = kubectl("get", "namespaces", "-o", "name", capture=True).split()
    if f"namespace/{NAMESPACE}" not in namespaces:
        kubectl("create", "namespace", NAMESPACE)
    kubectl("delete", "dtj", name, "-n", NAMESPACE, "--ignore-not-found", "--wait=true")

    banner(f"starting the operator (log: {state_dir / 'operator.log'})")
    operator, liveness = start_operator(state_dir / "operator.log")
    print(f"operator live at {liveness}")
    try:
        banner(f"applying {EXAMPLE.relative_to(REPO)} (launcher run time {RUN_SECONDS}s in the simulation)")
        kubectl("apply", "-n", NAMESPACE, "-f", "-", stdin=yaml.safe_dump(manifest))
        outcome = follow(name)

        banner("the job")
        kubectl("get", "dtj", "-n", NAMESPACE, "-o", "wide")
        banner("objects the operator created (pods left per runPolicy.cleanPodPolicy)")
        kubectl(
            "get",
            "secrets,configmaps,services,jobs,pods",
            "-n",
            NAMESPACE,
            "-l",
            f"dtjob.io/job-name={name}",
            "-o",
            "wide",
        )
        banner("launcher command")
        launcher = yaml.safe_load(
            kubectl("get", "job", f"{name}-launcher", "-n", NAMESPACE, "-o", "yaml", capture=True)
        )
        container = launcher["spec"]["template"]["spec"]["containers"][0]
        argv = [*container.get("command", []), *container.get("args", [])]
        # The launcher runs a short shell script (ssh client config, then exec horovodrun): print it as is.
        print(argv[2] if argv[:2] == ["/bin/sh", "-c"] else shlex.join(argv))
        banner("final status")
        status = yaml.safe_load(kubectl("get", "dtj", name, "-n", NAMESPACE, "-o", "yaml", capture=True))[
            "status"
        ]
        print(yaml.safe_dump({"status": status}, sort_keys=False))
        banner("events")
        kubectl(
            "get",
            "events",
            "-n",
            NAMESPACE,
            "--field-selector",
            f"involvedObject.name={name}",
            "--sort-by=.metadata.creationTimestamp",
        )
    finally:
        stop(operator)
    print(f"\njob {name}: {outcome}. The cluster keeps running: `make cluster-down` stops it.")
    return 0 if outcome == "Succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
