"""An elastic worker's entrypoint hands the pod's SIGTERM to the ranks of its pod (found by their pid files),
waits until they have left, then stops sshd. Run for real, with a stand-in for sshd (a sleep) and for a rank
(a shell that, like the trainers, takes a moment to commit before it exits 75)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from dtjob.contract.training import RANK_LEFT_EXIT
from dtjob.desired.command import elastic_worker_script

RANK = """leave() {{
  echo term > "$OUT/rank-got"; sleep 1; echo left > "$OUT/rank-left"; rm -f "$PIDS/0.pid"
}}
trap 'leave; exit {code}' TERM
echo $$ > "$PIDS/0.pid"
while :; do sleep 0.1; done
"""


def test_sigterm_reaches_the_rank_which_leaves_before_sshd_stops(tmp_path: Path) -> None:
    pids, out = tmp_path / "ranks", tmp_path / "out"
    pids.mkdir()
    out.mkdir()
    script = elastic_worker_script(str(pids))
    before_sshd = script.index("/usr/sbin/sshd -D")
    # sshd's stand-in records when it is stopped; nothing else in the script changes.
    stand_in = f"sh -c 'trap \"echo stopped > {out}/sshd-stopped; exit 0\" TERM; while :; do sleep 0.1; done'"
    script = script[:before_sshd] + stand_in + " &\n" + script[script.index("sshd=$!") :]
    script = script.replace("ssh-keygen -q", "true", 1).replace("mkdir -p /tmp/ssh", f"mkdir -p {out}/ssh")
    env = {**os.environ, "PIDS": str(pids), "OUT": str(out)}
    rank = subprocess.Popen(["sh", "-c", RANK.format(code=RANK_LEFT_EXIT)], env=env)
    entry = subprocess.Popen(["sh", "-c", script], env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not (pids / "0.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        os.kill(entry.pid, signal.SIGTERM)
        assert entry.wait(timeout=15) is not None
        assert rank.wait(timeout=5) == RANK_LEFT_EXIT
        assert (out / "rank-got").exists() and (out / "rank-left").exists()
        assert (out / "sshd-stopped").exists()
        # sshd was stopped only after the rank had left.
        assert (out / "sshd-stopped").stat().st_mtime_ns >= (out / "rank-left").stat().st_mtime_ns
    finally:
        for proc in (rank, entry):
            if proc.poll() is None:
                proc.kill()
