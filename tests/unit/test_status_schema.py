"""Everything the operator writes into a job's status survives the API server's structural pruning: every
field, nested ones included, is declared in the CRD's status schema (or sits where unknown fields are kept).
A field the schema lacks is dropped without an error, so the status would silently say less than it should."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from dtjob.contract.training_progress import latest_progress
from dtjob.contract.transfer_report import ProgressSnapshot
from dtjob.state.status import Condition, JobStatus

CRD = Path(__file__).resolve().parents[2] / "crds" / "dtjob.io_distributedtrainingjobs.yaml"


def status_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    return schema


def pruned(value: Any, schema: dict[str, Any]) -> Any:
    """What the API server keeps of `value` (structural pruning of unknown fields)."""
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        keep_unknown = schema.get("x-kubernetes-preserve-unknown-fields", False)
        return {
            key: pruned(item, properties[key]) if key in properties else item
            for key, item in value.items()
            if key in properties or keep_unknown
        }
    if isinstance(value, list):
        return [pruned(item, schema.get("items") or {}) for item in value]
    return value


def fullest_status() -> dict[str, Any]:
    """A status with every optional part the operator writes set."""
    record = {"epoch": 2, "epochs": 90, "step": 120, "stepsPerEpoch": 1251, "imagesPerSec": 28.0,
              "loss": 5.1, "updatedAt": "2026-11-22T03:00:00Z", "worldSize": 2, "globalBatch": 64,
              "stepsPerSec": 0.4375}  # fmt: skip
    status = replace(
        JobStatus(
            phase="Succeeded", message="done", restarts=1, launcher_state="Succeeded", launcher_pod="p"
        ),
        conditions=(Condition("Succeeded", "True", "LauncherSucceeded", "ok", "2026-11-23T00:00:00Z"),),
        start_time="2026-11-23T00:00:00Z",
        completion_time="2026-11-23T01:00:00Z",
        observed_generation=2,
        staging=ProgressSnapshot("failed", 3, 1, 1, 30, 10, 10, 2.0, 10.0, "denied").to_status(),
        output_url="https://acct.blob.core.windows.net/results/runs/ns/job/uid/",
        output_sas_scope="Directory",
        logs_missing=("job-worker-1",),
        logs_error="ServiceResponseTimeoutError: read timed out",
        logs_truncated={"pods": ["job-launcher-x"], "capBytes": 65536},
        sas_secrets_deleted=True,
        results_state="Failed",
        results_message="failed after 9 tries in 600 s: storage refused",
        results_pod="job-worker-0",
        results_pod_uid="6d5c1f0e-7a1b-4c2d-9e3f-0a1b2c3d4e5f",
        training_progress=latest_progress(f"DTJOB_PROGRESS {json.dumps(record)}"),
    )
    return status.to_dict()


def test_every_status_field_the_operator_writes_is_kept_by_the_api_server() -> None:
    written = fullest_status()
    assert written["output"]["logsError"] and written["output"]["logsMissing"] and written["progress"]
    assert {"percent", "etaSeconds", "eta", "stepsPerSec", "worldSize", "globalBatch"} <= set(
        written["progress"]
    )
    assert pruned(written, status_schema()) == written


def printer_columns() -> dict[str, dict[str, Any]]:
    crd = yaml.safe_load(CRD.read_text())
    return {c["name"]: c for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]}


def test_every_status_printer_column_shows_a_declared_field_of_its_type() -> None:
    # A column whose path the schema lacks shows <none> forever, without an error anywhere.
    schema, checked = status_schema(), 0
    for column in printer_columns().values():
        path = column["jsonPath"].split(".")[1:]
        if path[0] != "status":
            continue
        field = schema
        for key in path[1:]:
            field = field["properties"][key]
        assert field["type"] == column["type"], column
        checked += 1
    assert checked >= 6


def test_wide_output_has_percent_done_and_the_eta() -> None:
    columns = printer_columns()
    assert columns["Percent"]["jsonPath"] == ".status.progress.percent"
    assert columns["ETA"]["jsonPath"] == ".status.progress.eta"
    assert columns["Percent"]["priority"] == columns["ETA"]["priority"] == 1
    # The wide columns read left to right: the summary, then what a person plans with, then the message.
    names = list(columns)
    assert names.index("Progress") + 1 == names.index("Percent") == names.index("ETA") - 1
