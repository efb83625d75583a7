"""What the operator keeps of objects it LISTs that others write: a namespace admin's pods and Events may be
as large as 1.5 MiB each, so each LIST keeps, page by page, only what is read of them
(dtjob.kube.client.Keep)."""

from __future__ import annotations

import json
from typing import Any

from dtjob.kube.client import identity_of
from dtjob.reconcile import reads
from dtjob.reconcile.deletes import delete_pods
from dtjob.state.failed_create import FAILED_CREATE_MESSAGE_CHARS, failed_create_view

from tests.unit.recording_kube import RecordingKube

PAD = {f"pad.example.com/a{i}": "x" * 200 for i in range(2_000)}


def pod(name: str, owner: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "annotations": PAD,
                     "labels": {"dtjob.io/job-name": "rn50"}, "ownerReferences": [{"uid": owner}]},
        "status": {"containerStatuses": [{"message": "m" * 100_000}]},
    }  # fmt: skip


def test_a_delete_by_uid_keeps_of_each_listed_pod_its_name_uid_and_owners() -> None:
    kept = identity_of(pod("rn50-worker-0", "job-uid"))
    assert kept == {"metadata": {"name": "rn50-worker-0", "namespace": "ml", "uid": "uid-rn50-worker-0",
                                 "ownerReferences": [{"uid": "job-uid"}]}}  # fmt: skip
    kube = RecordingKube()
    for name, owner in (("rn50-worker-0", "job-uid"), ("rn50-worker-1", "job-uid"), ("look-alike", "other")):
        kube.objects[("Pod", "ml", name)] = pod(name, owner)
    delete_pods(kube, "ml", "dtjob.io/job-name=rn50", "job-uid")
    deleted = sorted(name for verb, _, name in kube.writes() if verb == "delete")
    assert deleted == ["rn50-worker-0", "rn50-worker-1"]


def test_a_failed_create_event_is_kept_with_its_message_cut() -> None:
    event = {"message": "denied: " + "y" * 1_000_000, "lastTimestamp": "2026-12-07T10:00:00Z", "pad": PAD}
    kept = failed_create_view(event)
    assert len(json.dumps(kept)) < FAILED_CREATE_MESSAGE_CHARS + 100
    assert kept["lastTimestamp"] == "2026-12-07T10:00:00Z"
    kube = RecordingKube(failed_creates={"launcher-uid": "denied: " + "y" * 1_000_000})
    said = reads.failed_create(kube, "ml", "launcher-uid")
    assert said is not None and said.startswith("denied: ") and len(said) == FAILED_CREATE_MESSAGE_CHARS
