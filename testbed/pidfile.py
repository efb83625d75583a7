"""Processes that outlive the command that started them (the demo's operator and Azurite), tracked by a
pidfile.

The pidfile holds the pid and the process's start time (from /proc), so a pid the system has since given to
another process (after a reboot, say) is never signalled: such a pidfile is stale, as is one whose process
has exited. Standard library only: `make demo-down` runs it with the system Python,

    python3 -m testbed.pidfile stop PIDFILE...
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path


def _stat(pid: int) -> tuple[str, str] | None:
    """The process's state letter and start time (clock ticks since boot), or None when there is none."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: the fields after it follow the last ')'.
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], fields[19]


def _alive(pid: int, started: str) -> bool:
    stat = _stat(pid)
    # A zombie has exited: only its parent, which may never reap it, still holds its entry.
    return stat is not None and stat[1] == started and stat[0] not in ("Z", "X")


def write(pidfile: Path, pid: int) -> None:
    stat = _stat(pid)
    if stat is None:
        raise RuntimeError(f"process {pid} exited before its pidfile {pidfile} was written")
    pidfile.parent.mkdir(parents=True, exist_ok=True)
    tmp = pidfile.with_name(f".{pidfile.name}.{os.getpid()}")
    tmp.write_text(f"{pid} {stat[1]}\n")
    tmp.replace(pidfile)


def running(pidfile: Path) -> int | None:
    """The pid the pidfile names while that very process runs; None for a missing or stale pidfile."""
    try:
        pid_text, started = pidfile.read_text().split()
        pid = int(pid_text)
    except (OSError, ValueError):
        return None
    return pid if _alive(pid, started) else None


def spawn(
    argv: Sequence[str], pidfile: Path, log: Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> int:
    """Start `argv` detached: a session of its own (a Ctrl-C of the caller's terminal does not reach it),
    stdin from /dev/null and output to `log` (truncated), so it holds none of the caller's pipes and a caller
    that captures output still sees it end. Returns its pid, written to `pidfile`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
            start_new_session=True,
        )  # fmt: skip
    write(pidfile, proc.pid)
    return proc.pid


def stop(pidfile: Path, timeout_s: float = 30.0) -> int | None:
    """SIGTERM the pidfile's process, SIGKILL it after `timeout_s`, and remove the pidfile (stale or not).
    Returns the pid stopped, or None when none was running."""
    pid = running(pidfile)
    if pid is not None:
        started = pidfile.read_text().split()[1]
        _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while _alive(pid, started) and time.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.1)
        if _alive(pid, started):
            _signal(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while _alive(pid, started) and time.monotonic() < deadline:
                _reap(pid)
                time.sleep(0.1)
        _reap(pid)
    pidfile.unlink(missing_ok=True)
    return pid


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _reap(pid: int) -> None:
    """Collect the exit status when the process is this one's child (started by spawn in this process)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "stop":
        print("usage: python -m testbed.pidfile stop PIDFILE...", file=sys.stderr)
        return 2
    for name in argv[1:]:
        pid = stop(Path(name))
        if pid is not None:
            print(f"stopped {pid} ({name})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
