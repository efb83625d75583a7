"""`make bench` / `python -m bench [NAME ...]`: run the benchmarks one after another, each in its own process.

Every benchmark prints its own ratios against a baseline it measures in the same run. Names: input_pipeline,
training_throughput, staging_throughput (Azurite), operator_scale and failover (the local control plane);
default all.
"""

from __future__ import annotations

import subprocess
import sys

BENCHMARKS = ("input_pipeline", "training_throughput", "staging_throughput", "operator_scale", "failover")


def main(argv: list[str]) -> int:
    chosen = argv or list(BENCHMARKS)
    unknown = sorted(set(chosen) - set(BENCHMARKS))
    if unknown:
        choices = ", ".join(BENCHMARKS)
        print(f"unknown benchmark(s): {', '.join(unknown)}; choose from {choices}", file=sys.stderr)
        return 2
    failed: list[str] = []
    for name in chosen:
        print(f"\n=== bench.{name}", flush=True)
        if subprocess.run([sys.executable, "-m", f"bench.{name}"]).returncode != 0:
            failed.append(name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
