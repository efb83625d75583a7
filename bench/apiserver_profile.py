"""Where kube-apiserver spends a create's CPU: its pprof CPU profile (/debug/pprof/profile, on by default)
taken while one kind is created over and over, each sample counted to the parts of the create path its stack
passes through (`go tool pprof -traces`), divided by the creates made meanwhile.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# A sample counts to every part its stack passes through, so the parts overlap (CEL is within validate).
PARTS = {
    "create handler": r"crdHandler\).serveResource.CreateResource",
    "decode": r"schemaCoercingDecoder",  # the body's JSON into an object, unknown fields pruned
    "validate": r"customResourceStrategy\.Validate$",
    "CEL": r"apiserver/schema/cel\.|google/cel-go",
    # Within CEL: each field access asks the schema adapter for the level's properties, a fresh copy of all.
    "CEL field lookup": r"schema/cel/model\.\(\*Structural\)\.Properties$",
    "OpenAPI schema": r"kube-openapi/pkg/validation/validate\.",
    "prune+default": r"apiserver/schema/(pruning|defaulting)\.",
    "managed fields": r"util/managedfields|handlers/fieldmanager",
    "smd type compare": r"structured-merge-diff/v\d+/schema\..*Equals",  # walks the schema's types
    "etcd": r"storage/etcd3\.",
    "GC": r"runtime\.gcBgMarkWorker",  # the background collector: what the creates' garbage costs later
}
UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "mins": 60.0, "hrs": 3600.0}
SEPARATOR = "-----------+"


def seconds(text: str) -> float:
    """pprof's duration ("10ms", "1.20s") in seconds."""
    found = re.fullmatch(r"([\d.]+)([a-zµ]*)", text)
    if found is None:
        raise ValueError(f"not a pprof duration: {text!r}")
    return float(found[1]) * UNITS[found[2] or "s"]


def traces(text: str) -> list[tuple[float, list[str]]]:
    """(CPU seconds, stack from leaf to root) of each distinct stack in `go tool pprof -traces` output."""
    stacks: list[tuple[float, list[str]]] = []
    for chunk in text.split(SEPARATOR)[1:]:
        lines = [line for line in chunk.splitlines()[1:] if line.strip()]
        if not lines:
            continue
        value, leaf = lines[0].split(None, 1)
        stacks.append((seconds(value), [leaf.strip(), *(line.strip() for line in lines[1:])]))
    return stacks


def by_part(stacks: list[tuple[float, list[str]]]) -> dict[str, float]:
    """CPU seconds per part of PARTS, and "total"."""
    totals = {part: 0.0 for part in PARTS}
    totals["total"] = sum(value for value, _ in stacks)
    for value, frames in stacks:
        for part, pattern in PARTS.items():
            if any(re.search(pattern, frame) for frame in frames):
                totals[part] += value
    return totals


def profile(
    kubectl: list[str], out: Path, duration_s: int, create: Callable[[str], object], prefix: str, threads: int
) -> tuple[dict[str, float], int]:
    """CPU seconds per part (see by_part) while `create` runs from `threads` threads for about duration_s,
    and how many creates it made; `kubectl` is the command up to its verb."""
    query = f"/debug/pprof/profile?seconds={duration_s}"
    with out.open("wb") as sink:
        taking = subprocess.Popen([*kubectl, "get", "--raw", query], stdout=sink)
    made = 0
    deadline = time.monotonic() + duration_s - 0.5  # ends within the profile's window
    with ThreadPoolExecutor(threads) as pool:
        while time.monotonic() < deadline:
            list(pool.map(create, [f"{prefix}-{made + i}" for i in range(threads * 5)]))
            made += threads * 5
    if taking.wait(timeout=duration_s + 30) != 0:
        raise RuntimeError(f"kubectl get --raw {query} failed")
    go = shutil.which("go") or "go"
    shown = subprocess.run(
        [go, "tool", "pprof", "-traces", str(out)], capture_output=True, text=True, check=True
    )
    return by_part(traces(shown.stdout)), made
