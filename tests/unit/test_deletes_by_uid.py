"""Every delete the operator makes is on the condition of the UID it observed (or listed with its owner
checked): a pod, a legacy launcher Job or a job created again under the same name in between is never deleted
for the one that was. Through act(), against the recording client, which honours UID preconditions as the API
server does (tests/integration/test_kube_contract.py holds the two together)."""

from __future__ import annotations

from datetime import UTC, datetime

from dtjob.desired.common import owner_reference
from dtjob.reconcile.act import act
from dtjob.spec.parse import parse_spec
from dtjob.state.decision import DeleteJob, DeleteLauncher, DeletePod

from tests.unit.operator_fixtures import CONFIG, job_body
from tests.unit.recording_kube import JOB_KIND, RecordingKube

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def setup() -> tuple[RecordingKube, dict[str, str]]:
    kube = RecordingKube()
    job = kube.put({**job_body(), "kind": JOB_KIND})
    return kube, owner_reference("rn50", job["metadata"]["uid"])


def test_a_pod_created_again_under_the_observed_ones_name_stays() -> None:
    kube, owner = setup()
    spec = parse_spec(job_body(), CONFIG)
    seen = kube.put({"kind": "Pod", "metadata": {"name": "rn50-worker-0", "namespace": "ml"}})
    observed_uid = seen["metadata"]["uid"]
    del kube.objects[("Pod", "ml", "rn50-worker-0")]
    kube.put({"kind": "Pod", "metadata": {"name": "rn50-worker-0", "namespace": "ml", "uid": "new-one"}})
    act(kube, CONFIG, spec, owner, [DeletePod("rn50-worker-0", observed_uid)], [], None, NOW)
    assert ("Pod", "ml", "rn50-worker-0") in kube.objects, "the pod created since was deleted"
    act(kube, CONFIG, spec, owner, [DeletePod("rn50-worker-0", "new-one")], [], None, NOW)
    assert ("Pod", "ml", "rn50-worker-0") not in kube.objects
    act(kube, CONFIG, spec, owner, [DeletePod("rn50-worker-1", "")], [], None, NOW)
    assert ("delete", "Pod", "rn50-worker-1") not in kube.calls, "never by name alone"


def test_a_legacy_launcher_job_is_deleted_only_while_the_job_owns_it() -> None:
    """A launcher Job that an earlier release of the operator made (today's launcher is a pod, deleted as
    one)."""
    kube, owner = setup()
    spec = parse_spec(job_body(), CONFIG)
    labels = {"dtjob.io/job-name": "rn50", "dtjob.io/role": "launcher"}
    other = [owner_reference("rn50", "uid-of-another-job")]
    meta = {"name": "rn50-launcher", "namespace": "ml", "labels": labels}
    kube.put({"kind": "Job", "metadata": {**meta, "ownerReferences": other}})
    act(kube, CONFIG, spec, owner, [DeleteLauncher()], [], None, NOW)
    assert ("Job", "ml", "rn50-launcher") in kube.objects, "another owner's launcher Job was deleted"
    kube.put({"kind": "Job", "metadata": {**meta, "ownerReferences": [owner]}})
    act(kube, CONFIG, spec, owner, [DeleteLauncher()], [], None, NOW)
    assert ("Job", "ml", "rn50-launcher") not in kube.objects


def test_the_ttl_deletes_only_the_job_that_finished() -> None:
    kube, owner = setup()
    spec = parse_spec(job_body(), CONFIG)
    del kube.objects[(JOB_KIND, "ml", "rn50")]
    again = job_body()
    again["metadata"]["uid"] = "uid-2"  # applied again: the API server gives it a new UID
    kube.put({**again, "kind": JOB_KIND})
    act(kube, CONFIG, spec, owner, [DeleteJob()], [], None, NOW)
    assert (JOB_KIND, "ml", "rn50") in kube.objects, "the job applied again was deleted by the old one's TTL"
