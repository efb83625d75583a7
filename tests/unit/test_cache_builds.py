"""Two builds of the same cache entry at once (two `make` runs side by side): the second waits for the first
and then finds its result, instead of both writing the same files (hack/cache-lock.sh). Real processes, a
real lock and, for hack/build-kstatus.sh, a real Go build into a fresh $DTJOB_CACHE."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HELPER = REPO / "hack" / "cache-lock.sh"

pytestmark = pytest.mark.skipif(shutil.which("flock") is None, reason="flock (util-linux) is not installed")

# A fake builder of the entry NAME: counts its builds, then waits for the gate file before it publishes the
# product under a temporary name renamed into place, the way the real builders do.
FAKE_BUILD = r"""
set -euo pipefail
name=$1 out=$2 gate=$3
source "$HELPER"
log() { echo "[fake-build] $*" >&2; }
if cache_hit "$name" "entry $name" test -f "$out/product"; then
  log "$name cached"
  exit 0
fi
log "building $name"
echo "$name" >>"$out/builds"
until [[ -e $gate ]]; do sleep 0.05; done
echo "whole $name" >"$out/product.tmp.$$"
mv -T "$out/product.tmp.$$" "$out/product"
"""


class Run:
    """A process whose stderr is kept in a file, so the test can wait for a line of it."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        with log.open("w") as err:
            self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err, text=True)

    def said(self, text: str) -> bool:
        return text in self.log.read_text()

    def finish(self, timeout: float = 120) -> str:
        rc = self.proc.wait(timeout=timeout)
        err = self.log.read_text()
        assert rc == 0, f"{self.proc.args!r} exited {rc}:\n{err}"
        return err


@pytest.fixture
def runs() -> Iterator[list[Run]]:
    started: list[Run] = []
    yield started
    for run in started:
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait()


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def fake_build(runs: list[Run], tmp_path: Path, name: str, tag: str) -> Run:
    out = tmp_path / "cache" / "out" / name
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "DTJOB_CACHE": str(tmp_path / "cache"), "HELPER": str(HELPER)}
    argv = ["bash", "-c", FAKE_BUILD, "fake-build", name, str(out), str(tmp_path / f"gate-{name}")]
    run = Run(argv, env, tmp_path / f"{tag}.log")
    runs.append(run)
    return run


def test_two_builds_of_one_entry_build_it_once(runs: list[Run], tmp_path: Path) -> None:
    first, second = fake_build(runs, tmp_path, "entry", "a"), fake_build(runs, tmp_path, "entry", "b")
    # Whichever took the lock builds, and holds it until the gate opens: the other one must be waiting.
    wait_for(lambda: first.said("building") or second.said("building"), "one of them to build")
    builder, waiter = (first, second) if first.said("building") else (second, first)
    wait_for(lambda: waiter.said("another build of entry entry is running; waiting"), "the other to wait")
    (tmp_path / "gate-entry").touch()
    builder_log, waiter_log = builder.finish(), waiter.finish()
    assert "building entry" not in waiter_log and "entry cached" in waiter_log, waiter_log
    assert "waiting" not in builder_log, builder_log
    out = tmp_path / "cache" / "out" / "entry"
    assert (out / "builds").read_text() == "entry\n"
    assert (out / "product").read_text() == "whole entry\n"
    assert sorted(p.name for p in out.iterdir()) == ["builds", "product"]  # no temporary left behind


def test_different_entries_build_side_by_side(runs: list[Run], tmp_path: Path) -> None:
    one = fake_build(runs, tmp_path, "one", "one")
    wait_for(lambda: one.said("building one"), "entry one to build")
    # Entry one's builder holds its lock (its gate is shut); entry two neither waits for it nor is held up.
    (tmp_path / "gate-two").touch()
    two_log = fake_build(runs, tmp_path, "two", "two").finish(timeout=30)
    assert "building two" in two_log and "waiting" not in two_log, two_log
    assert one.proc.poll() is None, "entry one finished before its gate opened"
    (tmp_path / "gate-one").touch()
    one.finish()


def test_a_finished_entry_is_read_while_its_lock_is_held(runs: list[Run], tmp_path: Path) -> None:
    out = tmp_path / "cache" / "out" / "entry"
    out.mkdir(parents=True)
    (out / "product").write_text("whole entry\n")
    with held_lock(tmp_path / "cache" / "locks" / "entry.lock"):
        log = fake_build(runs, tmp_path, "entry", "reader").finish(timeout=30)
    assert "entry cached" in log and "waiting" not in log, log


@contextmanager
def held_lock(path: Path) -> Iterator[None]:
    """The lock a builder of that entry would hold (flock(2), as flock(1) takes it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def go_env() -> dict[str, str]:
    # Offline: the module below needs nothing but the standard library.
    return {**os.environ, "GOPROXY": "off", "GOFLAGS": "-mod=readonly", "GOTOOLCHAIN": "local"}


# A module of the standard library alone in hack/kstatus's place: the script, its locks and Go are real, and a
# cold build takes seconds, not the minutes kstatus's Kubernetes dependencies take to compile.
TINY_GO_MOD = "module kstatus\n\ngo 1.22\n"
TINY_MAIN = """package main

import "os"

func main() { os.Stdout.WriteString("built from the test's sources\\n") }
"""


def script_beside_tiny_sources(root: Path) -> tuple[Path, str]:
    """hack/build-kstatus.sh and the scripts it sources, linked into ROOT/hack beside a tiny kstatus module
    (the script finds both beside itself); returns the script and its cache key, computed as it does."""
    hack = root / "hack"
    (hack / "kstatus").mkdir(parents=True)
    for name in ("build-kstatus.sh", "go-scratch.sh", "cache-lock.sh"):
        (hack / name).symlink_to(REPO / "hack" / name)
    sources = {"go.mod": TINY_GO_MOD, "go.sum": "", "main.go": TINY_MAIN}
    for name, text in sources.items():
        (hack / "kstatus" / name).write_text(text)
    key = hashlib.sha256("".join(sources.values()).encode()).hexdigest()[:12]
    return hack / "build-kstatus.sh", key


@pytest.mark.skipif(shutil.which("go") is None, reason="go is not installed")
def test_two_cold_kstatus_builds_at_once_build_it_once(runs: list[Run], tmp_path: Path) -> None:
    script, key_hex = script_beside_tiny_sources(tmp_path / "src")
    cache = tmp_path / "cache"
    env = {**go_env(), "DTJOB_CACHE": str(cache)}
    # Both start while the entry's lock is busy, so both find it taken whatever the machine's load: then one
    # builds and the other waits for it and finds kstatus built.
    with held_lock(cache / "locks" / f"kstatus-{key_hex}.lock"):
        first = Run([str(script)], env, tmp_path / "a.log")
        second = Run([str(script)], env, tmp_path / "b.log")
        runs += [first, second]
        waiting = f"another build of kstatus {key_hex} is running; waiting"
        wait_for(lambda: first.said(waiting) and second.said(waiting), "both builds to wait")
    logs = [first.finish(timeout=300), second.finish(timeout=300)]
    builders = [log for log in logs if f"building kstatus {key_hex}" in log]
    assert len(builders) == 1, logs
    assert sum(f"kstatus {key_hex} cached" in log for log in logs) == 1, logs
    out = cache / "bin" / f"kstatus-{key_hex}"
    assert sorted(p.name for p in out.iterdir()) == ["kstatus"]  # no temporary left behind
    done = subprocess.run([str(out / "kstatus")], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "built from the test's sources\n"
    # Go's own caches went with the run (hack/go-scratch.sh): only the modules and the binary stay.
    assert sorted(p.name for p in (cache / "go-scratch").iterdir()) == []
