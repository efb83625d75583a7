"""`make bench` / `python -m bench [NAME [ARG ...]] ...`: run the benchmarks one after another, each in its
own process.

Every benchmark prints its own ratios against a baseline it measures in the same run. Names: input_pipeline,
training_throughput, staging_throughput (Azurite), operator_scale, failover, versus_mpi_operator and
crd_create_cost (the local control plane); default all but versus_mpi_operator, which builds mpi-operator and
needs a larger simulated GPU pool (see its docstring), and crd_create_cost, which takes minutes of creates.
Words after a name, up to the next name, are that benchmark's arguments:
`BENCH="versus_mpi_operator --jobs 500" make bench`.
"""

from __future__ import annotations

import subprocess
import sys

BENCHMARKS = (
    "input_pipeline",
    "training_throughput",
    "staging_throughput",
    "operator_scale",
    "failover",
    "versus_mpi_operator",
    "crd_create_cost",
)
DEFAULT = tuple(name for name in BENCHMARKS if name not in ("versus_mpi_operator", "crd_create_cost"))


def parse(argv: list[str]) -> list[tuple[str, list[str]]]:
    """Benchmark names, each with the arguments that follow it; an argument before any name is an error."""
    chosen: list[tuple[str, list[str]]] = []
    for word in argv:
        if word in BENCHMARKS:
            chosen.append((word, []))
        elif chosen:
            chosen[-1][1].append(word)
        else:
            raise ValueError(f"unknown benchmark: {word}; choose from {', '.join(BENCHMARKS)}")
    return chosen or [(name, []) for name in DEFAULT]


def main(argv: list[str]) -> int:
    try:
        chosen = parse(argv)
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    failed: list[str] = []
    for name, args in chosen:
        print(f"\n=== bench.{name} {' '.join(args)}".rstrip(), flush=True)
        if subprocess.run([sys.executable, "-m", f"bench.{name}", *args]).returncode != 0:
            failed.append(name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
