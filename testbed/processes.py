"""The processes of this machine whose command line names a path: what a cluster of the test bed started,
found by its working directory or cache, to check that stopping it left none behind."""

from __future__ import annotations

from pathlib import Path


def processes_of(path: Path) -> dict[int, str]:
    """pid -> command line of every process whose command line contains `path`."""
    found: dict[int, str] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(path) in cmdline:
            found[int(proc.name)] = cmdline
    return found
