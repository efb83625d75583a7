"""testbed/pidfile.py: a detached process is found by its pidfile while it runs, and only then; stopping it
removes the pidfile, stale or not, and never signals a process that merely got the same pid."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

from testbed import pidfile

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def test_a_spawned_process_runs_detached_until_stopped(tmp_path: Path) -> None:
    pid_path = tmp_path / "sleeper.pid"
    pid = pidfile.spawn(SLEEPER, pid_path, tmp_path / "sleeper.log")
    try:
        assert pidfile.running(pid_path) == pid
        assert os.getsid(pid) == pid, "not in a session of its own"
    finally:
        assert pidfile.stop(pid_path, timeout_s=10) == pid
    assert _gone(pid)
    assert not pid_path.exists()
    assert pidfile.running(pid_path) is None
    assert pidfile.stop(pid_path) is None


def test_a_stale_pidfile_names_no_process_and_is_removed(tmp_path: Path) -> None:
    pid_path = tmp_path / "quick.pid"
    pid = pidfile.spawn([sys.executable, "-c", "pass"], pid_path, tmp_path / "quick.log")
    deadline = time.monotonic() + 30
    while pidfile.running(pid_path) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pidfile.running(pid_path) is None
    assert pidfile.stop(pid_path) is None
    assert not pid_path.exists()
    # Reaped here, unless subprocess reaped it already (it collects the children of Popen objects it dropped).
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def test_a_pid_given_to_another_process_is_never_signalled(tmp_path: Path) -> None:
    pid_path = tmp_path / "reused.pid"
    # This very process under the recorded pid, but started at another time: not the one the pidfile meant.
    pid_path.write_text(f"{os.getpid()} 1\n")
    assert pidfile.running(pid_path) is None
    assert pidfile.stop(pid_path) is None  # this test would not survive a SIGTERM
    assert not pid_path.exists()


def test_a_garbled_or_missing_pidfile_names_no_process(tmp_path: Path) -> None:
    garbled = tmp_path / "garbled.pid"
    garbled.write_text("not a pid\n")
    assert pidfile.running(garbled) is None
    assert pidfile.running(tmp_path / "missing.pid") is None
    assert pidfile.main(["stop", str(garbled), str(tmp_path / "missing.pid")]) == 0
    assert not garbled.exists()
