"""What a job's status says about its pod logs, and that the CRD's status schema keeps it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from dtjob.machine import with_results
from dtjob.state.decision import LogsUploaded
from dtjob.state.status import JobStatus, status_from_dict

REPO = Path(__file__).resolve().parents[2]
URL = "http://127.0.0.1/acct/results/runs/ns/j/uid/"


def test_truncated_logs_and_the_cap_are_recorded_with_the_upload_and_survive_a_round_trip() -> None:
    cut = LogsUploaded(None, True, URL + "logs/", truncated=("j-worker-3", "j-worker-7"), cap_bytes=2**20)
    status, events = with_results(JobStatus(output_url=URL), [cut])
    output = status.to_dict()["output"]
    assert output["logsTruncated"] == {"pods": ["j-worker-3", "j-worker-7"], "capBytes": 1048576}
    assert status_from_dict(status.to_dict()) == status
    assert events[0].reason == "LogsUploaded"
    assert events[0].message.endswith("(cut to the 1048576-byte cap: j-worker-3, j-worker-7)")
    whole, _ = with_results(JobStatus(output_url=URL), [LogsUploaded(None, True, URL + "logs/")])
    assert "logsTruncated" not in whole.to_dict()["output"]
    # A failed world's logs (before a restart) say it in their event only.
    attempt = LogsUploaded(0, True, URL + "logs/attempt-0/", truncated=("j-worker-1",), cap_bytes=2**20)
    kept, attempt_events = with_results(JobStatus(output_url=URL), [attempt])
    assert (
        kept.logs_truncated is None and "cut to the 1048576-byte cap: j-worker-1" in attempt_events[0].message
    )


def pruned_by_schema(value: Any, schema: dict[str, Any], path: str = "status") -> list[str]:
    """The paths under `value` that the API server would prune: keys of an object with declared properties
    that neither declares them nor preserves unknown fields."""
    if not isinstance(value, dict):
        return []
    if schema.get("x-kubernetes-preserve-unknown-fields") and "properties" not in schema:
        return []
    properties = schema.get("properties") or {}
    pruned = []
    for key, item in value.items():
        if key in properties:
            pruned += pruned_by_schema(item, properties[key], f"{path}.{key}")
        elif not schema.get("x-kubernetes-preserve-unknown-fields"):
            pruned.append(f"{path}.{key}")
    return pruned


def test_the_log_fields_of_status_output_are_in_the_crd_schema() -> None:
    # A status field the schema does not declare is pruned by the API server without a word.
    crd = yaml.safe_load((REPO / "crds" / "dtjob.io_distributedtrainingjobs.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    result = LogsUploaded(
        None, True, URL, missing=("j-worker-1",), truncated=("j-worker-3",), cap_bytes=2**20
    )
    status, _ = with_results(JobStatus(output_url=URL), [result])
    output = status.to_dict()["output"]
    assert {"logsMissing", "logsTruncated"} <= set(output)
    assert pruned_by_schema({"output": output}, schema) == []
    assert pruned_by_schema({"output": {"notDeclared": 1}}, schema) == ["status.output.notDeclared"]
