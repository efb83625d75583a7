"""Builders for unit tests of the operator's pure layers."""

from __future__ import annotations

from typing import Any

from dtjob.config import OperatorConfig
from dtjob.spec.parse import JobSpec, parse_spec

CONFIG = OperatorConfig()


def job_body(name: str = "rn50", namespace: str = "ml", **spec: Any) -> dict[str, Any]:
    body_spec: dict[str, Any] = {"framework": "pytorch", "workers": 2, "gpusPerWorker": 4}
    body_spec.update(spec)
    return {
        "apiVersion": "dtjob.io/v1alpha1",
        "kind": "DistributedTrainingJob",
        "metadata": {"name": name, "namespace": namespace, "uid": "uid-1", "generation": 1},
        "spec": body_spec,
    }


def job_spec(**spec: Any) -> JobSpec:
    return parse_spec(job_body(**spec), CONFIG)
