"""The benchmarks. Run from a checkout (`python -m bench.gpu_throughput ...`, as on a GPU machine), they
import the operator's and the trainer's packages from it, as `make` puts them on PYTHONPATH; each benchmark
gives its child processes the same path."""

from __future__ import annotations

import sys
from pathlib import Path

_REPO = Path(__file__).resolve().parents[1]
for _code in (_REPO / "training", _REPO / "operator"):
    if str(_code) not in sys.path:
        sys.path.append(str(_code))
