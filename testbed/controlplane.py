"""Restart components of the local control plane (kwokctl's binary runtime) in place, for fault tests.

kwokctl can stop and start a whole cluster, but its kwok controller, started again before the API server
answers, does not recover (it stops moving pods). This stops chosen components only and starts each again
with the very command line, working directory and environment it ran with, logging to the same file and
recorded in the same pid file, so `hack/cluster.sh down` still stops it. The scheduler and the
controller-manager exit when an outage outlasts their leader lease (in a real cluster the kubelet starts
them again), so a restart of the API server and etcd restarts them too; kwok, the simulated nodes, rides
the outage out.
"""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Component:
    name: str
    pid: int
    argv: tuple[str, ...]
    cwd: str
    env: dict[str, str]


def component(cluster_dir: Path, name: str) -> Component:
    """The running component `name` (etcd, kube-apiserver, ...) of the cluster in `cluster_dir`."""
    pid = int((cluster_dir / "pids" / f"{name}.pid").read_text().strip())
    proc = Path("/proc") / str(pid)
    argv = tuple(part.decode() for part in (proc / "cmdline").read_bytes().split(b"\0") if part)
    pairs = (item.decode().split("=", 1) for item in (proc / "environ").read_bytes().split(b"\0") if item)
    env = {key: value for key, value in (pair for pair in pairs if len(pair) == 2)}
    return Component(name, pid, argv, str((proc / "cwd").readlink()), env)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers signal 0: it has exited all the same.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ", 1)[-1][:1] != "Z"


def stop(running: Component, timeout: float = 30) -> None:
    os.kill(running.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(running.pid):
        if time.monotonic() > deadline:
            os.kill(running.pid, signal.SIGKILL)
        time.sleep(0.1)


def start(cluster_dir: Path, stopped: Component) -> int:
    """Start the component again as it ran; returns its new pid (also written to its pid file)."""
    with (cluster_dir / "logs" / f"{stopped.name}.log").open("ab") as log:
        process = subprocess.Popen(
            stopped.argv,
            cwd=stopped.cwd,
            env=stopped.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # outlives this test, as the rest of the cluster does
        )
    (cluster_dir / "pids" / f"{stopped.name}.pid").write_text(str(process.pid))
    return process.pid


CONTROL_PLANE = ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd")


def restart(cluster_dir: Path, names: Sequence[str] = CONTROL_PLANE, down_s: float = 5.0) -> dict[str, int]:
    """Stop `names` in that order, wait `down_s`, start them in the reverse order; returns the new pids.

    Under the lock hack/ports-lock.sh takes around every cluster's creation: kwokctl picks a new cluster's
    ports among those nothing listens on, and the stopped components' ports must not be taken meanwhile."""
    stopped = [component(cluster_dir, name) for name in names]
    with _ports_lock():
        for running in stopped:
            stop(running)
        time.sleep(down_s)
        started = {c.name: start(cluster_dir, c) for c in reversed(stopped)}
        # Until the API server listens again its port looks free to a cluster being created: hold the lock.
        for c in stopped:
            port = _flag(c.argv, "--secure-port")
            if c.name == "kube-apiserver" and port is not None:
                _wait_listening(int(port), timeout=120)
        return started


def _flag(argv: Sequence[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
    return None


def _wait_listening(port: int, timeout: float) -> None:
    """Returns once something accepts connections on 127.0.0.1:port, or after `timeout` (the caller's own
    wait then says what never came back)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)


@contextmanager
def _ports_lock() -> Iterator[None]:
    cache = Path(os.environ.get("DTJOB_CACHE") or Path.home() / ".cache" / "dtjob")
    lock = cache / "locks" / "cluster-ports.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    # Python opens it non-inheritable, so the components started under it do not hold the lock.
    with lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        yield
