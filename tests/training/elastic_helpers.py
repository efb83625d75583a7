"""A real elastic Horovod world on loopback for the tests: horovodrun with --min-np/--max-np and a host
discovery script that prints a file the test rewrites, so hosts leave and join while the job trains.

Horovod runs a host's ranks without ssh when its name resolves to an address of this machine: `localhost`,
`127.0.0.1` and a third name are three distinct hosts to its driver, all local. The third name resolves
through an /etc/hosts of the world's own (a private mount namespace around horovodrun and its ranks), so the
tests run alike wherever they run, whatever this machine's name and resolver say.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.training.training_helpers import BIN, REPO, run_env

_RANK_TAG = re.compile(r"^\[\d+\]<std(?:out|err)>:")


# The world's third host: a name only the world's own /etc/hosts knows, for 127.0.0.1.
THIRD_HOST = "dtjob-elastic-host"


def world_hosts_file() -> str:
    """The world's /etc/hosts: loopback for its three hosts, and for this machine's own name, which Horovod
    0.28.1's Gloo looks up for every process set's context, whatever interface it was given."""
    names = dict.fromkeys(["localhost", THIRD_HOST, socket.gethostname()])
    return f"127.0.0.1 {' '.join(names)}\n::1 localhost ip6-localhost\n"


def local_host_names() -> tuple[str, str, str]:
    """Three names of this machine the elastic driver treats as three local hosts (ElasticWorld resolves the
    third); skips where no private /etc/hosts can be given (it needs root and util-linux unshare)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("an elastic world's own /etc/hosts needs root and unshare (make test runs as root)")
    return "localhost", "127.0.0.1", THIRD_HOST


def with_own_hosts_file(hosts_file: Path, argv: list[str]) -> list[str]:
    """argv in a private mount namespace whose /etc/hosts is `hosts_file` (bound over it, seen by argv and
    every process it starts, nowhere else)."""
    hosts_file.write_text(world_hosts_file())
    bind = 'mount --bind "$0" /etc/hosts && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", bind, str(hosts_file), *argv]


class ElasticWorld:
    """horovodrun --host-discovery-script over `hosts` (host -> slots), its output read line by line."""

    def __init__(self, tmp: Path, hosts: dict[str, int], *, min_np: int, max_np: int) -> None:
        self.hosts_file, self.script = tmp / "hosts", tmp / "discover.sh"
        self.set_hosts(hosts)
        self.script.write_text(f"#!/bin/sh\ncat {self.hosts_file}\n")
        self.script.chmod(0o755)
        self.min_np, self.max_np, self.np = min_np, max_np, sum(hosts.values())
        self.lines: list[str] = []
        self.started = time.monotonic()
        self.proc: subprocess.Popen[str] | None = None

    def set_hosts(self, hosts: dict[str, int]) -> None:
        tmp = self.hosts_file.with_suffix(".tmp")
        tmp.write_text("".join(f"{host}:{slots}\n" for host, slots in hosts.items()))
        tmp.replace(self.hosts_file)

    def start(self, train: list[str], pid_dir: Path, env: dict[str, str] | None = None) -> None:
        """Runs `python -m <train>`; every host's ranks write their pid files under pid_dir/<host>/ (on a
        cluster each host is a pod with a /tmp of its own; here all hosts share one)."""
        cmd = [str(BIN / "horovodrun"), "-np", str(self.np), "--min-np", str(self.min_np)]
        cmd += ["--max-np", str(self.max_np), "--host-discovery-script", str(self.script)]
        trainer = " ".join([sys.executable, "-m", *train])
        per_host = f"DTJOB_RANK_PID_DIR={pid_dir}/$HOROVOD_HOSTNAME exec {trainer}"
        cmd += ["--gloo", "--network-interface", "lo", "sh", "-c", per_host]
        env = run_env() | (env or {})
        if os.geteuid() == 0 and shutil.which("unshare"):
            cmd = with_own_hosts_file(self.hosts_file.with_name("etc-hosts"), cmd)
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(f"{time.monotonic() - self.started:8.2f} {_RANK_TAG.sub('', line.rstrip())}")

    def progress(self) -> list[tuple[float, dict[str, Any]]]:
        """(seconds since start, record) of every DTJOB_PROGRESS line so far."""
        found = []
        for line in list(self.lines):
            seconds, _, text = line.strip().partition(" ")
            if text.startswith("DTJOB_PROGRESS "):
                found.append((float(seconds), json.loads(text.removeprefix("DTJOB_PROGRESS "))))
        return found

    def wait_for(self, what: str, done: Callable[[], bool], timeout: float) -> float:
        """Polls until done(); the seconds since start. Fails with the log so far on a timeout or an exit."""
        deadline = time.monotonic() + timeout
        while not done():
            assert self.proc is not None
            if self.proc.poll() is not None and not done():
                time.sleep(0.5)  # the reader may not have caught up with the last lines
                if not done():
                    pytest.fail(f"the job ended before {what}:\n" + self.log())
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} within {timeout} s:\n" + self.log())
            time.sleep(0.1)
        return time.monotonic() - self.started

    def finish(self, timeout: float) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"the job did not finish within {timeout} s:\n" + self.log())

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def log(self) -> str:
        return "\n".join(self.lines)


def rank_pid(host: str, pid_dir: Path, timeout: float = 30) -> int:
    """The pid of the trainer on `host`'s first slot, from the pid file it wrote (<dir>/<host>/0.pid)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return int((pid_dir / host / "0.pid").read_text())
        except (OSError, ValueError):
            time.sleep(0.2)
    pytest.fail(f"no pid file of the rank on {host} in {pid_dir}")


def sigterm(pid: int) -> None:
    os.kill(pid, signal.SIGTERM)
