"""NFS shares under attack. An inline `nfs` volume names any server and export, and the staging pod mounts the
dataset's share writable, so where a namespace's Pod Security level allows inline NFS an editor could stage
over, or read, any share the nodes can mount. The installer's list (`storagePolicy.nfsShares`) keeps a
namespace to its own exports: tenant A's editor names team B's export on the same server every way a pod can
mount a share (the dataset's volume, the checkpoints', a worker template's `nfs`, a launcher template's
inline NFS CSI volume, its attributes spelled in other cases as the driver reads them or a mount option
that sends the mount elsewhere, a path that climbs out with `..`) and edits a running job's template to add
it before a restart. Every pod and batch Job the API server saw in the namespace is checked: none mounts team
B's export, and the job that asked fails naming the field."""

from __future__ import annotations

import posixpath
from typing import Any

import pytest

from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess
from testbed.tenancy import Tenant
from tests.integration.api_history import ApiHistory, Seen, job_of
from tests.security.test_template_secrets import LONG_RUN, condition, running

SERVER = "10.40.0.4"
TEAM_A = "/export/team-a"
TEAM_B = "/export/team-b"
NFS_SHARE_NOT_ALLOWED = "NfsShareNotAllowed"


@pytest.fixture
def chart_sets() -> tuple[str, ...]:
    return (f"storagePolicy.nfsShares[0]={SERVER}:{TEAM_A}",)


def nfs(path: str) -> dict[str, Any]:
    return {"nfs": {"server": SERVER, "path": path}}


# Each way a pod the operator creates can mount a share, pointed at team B's export, with the field named.
ATTACKS: dict[str, tuple[dict[str, Any], str]] = {
    "dataset": ({"dataset": {"volume": nfs(TEAM_B)}}, "spec.dataset.volume.nfs"),
    "checkpoints": ({"checkpoints": nfs(TEAM_B)}, "spec.checkpoints.nfs"),
    "worker-template": (
        {"worker": {"template": {"spec": {"volumes": [{"name": "b", **nfs(TEAM_B)}]}}}},
        "spec.worker.template.spec.volumes[0].nfs",
    ),
    "launcher-csi": (
        {"launcher": {**LONG_RUN, "template": {"spec": {"volumes": [{"name": "b", "csi": {
            "driver": "nfs.csi.k8s.io", "volumeAttributes": {"server": SERVER, "share": TEAM_B}}}]}}}},
        "spec.launcher.template.spec.volumes[0].csi",
    ),
    "csi-subdir": (  # the driver reads its attributes' keys without case
        {"launcher": {**LONG_RUN, "template": {"spec": {"volumes": [{"name": "b", "csi": {
            "driver": "nfs.csi.k8s.io",
            "volumeAttributes": {"server": SERVER, "share": TEAM_A, "SubDir": "../team-b"}}}]}}}},
        "spec.launcher.template.spec.volumes[0].csi",
    ),
    "csi-twice": (  # which of the two the driver mounts is its map's order
        {"worker": {"template": {"spec": {"volumes": [{"name": "b", "csi": {
            "driver": "nfs.csi.k8s.io",
            "volumeAttributes": {"server": SERVER, "share": TEAM_A, "SHARE": TEAM_B}}}]}}}},
        "spec.worker.template.spec.volumes[0].csi",
    ),
    "csi-dotted-i": (  # Go lowers İ to i, so the driver reads subdİr as subDir
        {"worker": {"template": {"spec": {"volumes": [{"name": "b", "csi": {
            "driver": "nfs.csi.k8s.io",
            "volumeAttributes": {"server": SERVER, "share": TEAM_A, "subdİr": "../team-b"}}}]}}}},
        "spec.worker.template.spec.volumes[0].csi",
    ),
    "csi-mountaddr": (  # an NFSv3 mount asks another host's mountd for the export's handle
        {"worker": {"template": {"spec": {"volumes": [{"name": "b", "csi": {
            "driver": "nfs.csi.k8s.io",
            "volumeAttributes": {"server": SERVER, "share": TEAM_A,
                                 "mountOptions": "nfsvers=3,mountaddr=10.40.0.9"}}}]}}}},
        "spec.worker.template.spec.volumes[0].csi",
    ),
    "climb": (
        {"worker": {"template": {"spec": {"volumes": [{"name": "b", **nfs(f"{TEAM_A}/../team-b")}]}}}},
        "spec.worker.template.spec.volumes[0].nfs",
    ),
}  # fmt: skip


def mounting_team_b(history: ApiHistory) -> list[str]:
    """`Kind name` of every pod and batch Job seen whose volumes name the server outside team A's export."""

    def mounts_b(seen: Seen) -> bool:
        spec = seen.obj.get("spec") or {}
        if seen.kind == "Job":
            spec = (spec.get("template") or {}).get("spec") or {}
        for volume in spec.get("volumes") or ():
            if "nfs" in volume:
                server, path = volume["nfs"].get("server"), volume["nfs"].get("path", "")
            elif (volume.get("csi") or {}).get("driver") == "nfs.csi.k8s.io":
                given = volume["csi"].get("volumeAttributes") or {}
                attributes = {key.lower(): value for key, value in given.items()}
                if not judged_as_the_driver_reads(given, attributes):
                    return True  # what it mounts is not known here: team B's, say
                server = attributes.get("server")
                path = posixpath.join(attributes.get("share", ""), attributes.get("subdir", ""))
            else:
                continue
            path = posixpath.normpath(path)
            if server == SERVER and not f"{path}/".startswith(f"{TEAM_A}/"):
                return True
        return False

    found = history.of("Pod", mounts_b) + history.of("Job", mounts_b)
    return sorted({f"{seen.kind} {seen.name}" for seen in found})


def judged_as_the_driver_reads(given: dict[str, Any], attributes: dict[str, Any]) -> bool:
    """Whether what an NFS CSI volume mounts can be told from server, share and subDir alone: plain ASCII
    keys once each, nothing the driver fills in, no option that moves the mount."""
    plain = all(key.isascii() for key in given) and len(attributes) == len(given)
    known = set(attributes) <= {"server", "share", "subdir", "mountoptions"}
    moved = any(option.split("=")[0] in ("mountaddr", "mounthost", "port", "mountport")
                for option in str(attributes.get("mountoptions", "")).split(","))  # fmt: skip
    return plain and known and not moved and "${" not in str(attributes.get("subdir", ""))


def failed_or_mounted(jobs: Jobs, history: ApiHistory, name: str) -> dict[str, Any]:
    """The job's status once it failed, or as soon as any pod mounts team B's export (the attack worked)."""

    def settled() -> dict[str, Any] | None:
        status = jobs.status(name)
        return status if status.get("phase") == "Failed" or mounting_team_b(history) else None

    return dict(wait_for(settled, timeout=120, what=f"{name} failed, or a pod mounting team B's export"))


def test_an_editor_mounts_no_share_but_its_own_through_any_volume_or_a_mid_run_edit(
    tenant_a: Tenant, admin_jobs: Jobs, operator: OperatorProcess, history: ApiHistory
) -> None:
    editor = tenant_a.jobs()
    editor.create("own", dataset={"volume": nfs(f"{TEAM_A}/imagenet")}, launcher=LONG_RUN)
    for name, (spec, _) in ATTACKS.items():
        editor.create(name, **({"launcher": LONG_RUN} | spec))

    for name, (_, field) in ATTACKS.items():
        status = failed_or_mounted(admin_jobs, history, name)
        assert mounting_team_b(history) == [], f"{name}: a pod mounted team B's export"
        assert condition(status, "Failed")["reason"] == NFS_SHARE_NOT_ALLOWED, status
        assert status["message"].startswith(f"{field}: NFS "), status["message"]
        assert f"{SERVER}:{TEAM_A}" in status["message"]  # the list that refused it, for the user to read
        assert not history.of("Pod", job_of(name)), f"{name}: a pod was created"

    # The control: the job on its own export runs. Then its editor adds team B's export to the workers'
    # template, and a worker's crash makes the operator build the world again from the edited spec.
    wait_for(lambda: running(admin_jobs, "own"), timeout=120, what="own running with 2 workers Ready")
    mounted = [seen.name for seen in history.of("Pod") if "own-worker" in seen.name]
    assert mounted, "the job on its own export made no workers"
    volumes = [{"name": "b", **nfs(TEAM_B)}]
    editor.patch_spec("own", {"worker": {"template": {"spec": {"volumes": volumes}}}})
    admin_jobs.annotate_pod("own-worker-1", {"sim.dtjob.io/outcome": "Failed"})
    status = failed_or_mounted(admin_jobs, history, "own")
    assert mounting_team_b(history) == [], "a rebuilt world mounted team B's export"
    assert condition(status, "Failed")["reason"] == NFS_SHARE_NOT_ALLOWED, status
    assert status["message"].startswith("spec.worker.template.spec.volumes[0].nfs: NFS share ")
