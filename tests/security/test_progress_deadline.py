"""runPolicy.progressDeadlineSeconds and `status.lastProgressTime`, which the operator reads back to time it.
A tenant who could set a deadline of a few seconds would have its world torn down and created again in a loop
(API writes and pod starts for the whole cluster to carry); one who could write the time would hold off the
restart of a hung world that keeps its GPUs. Acting with each tenant role's own token, on a real API server:
the schema refuses the short deadline at apply, and no role reaches the time, through the status subresource,
the job's create or a patch of the job itself. (The records the deadline waits on are the job's own log: a
forged record's `updatedAt` moves nothing, tests/unit/test_machine_progress_deadline.py.)"""

from __future__ import annotations

from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from testbed.operator_harness import GROUP, PLURAL, VERSION
from testbed.tenancy import EDITOR, Tenant

HELD_OFF: dict[str, Any] = {"status": {"lastProgressTime": "2099-01-01T00:00:00Z"}}


def test_a_tenant_can_neither_loop_its_world_with_a_short_deadline_nor_hold_one_off_through_status(
    tenant_a: Tenant, api_client: client.ApiClient
) -> None:
    ns = tenant_a.namespace
    editor = tenant_a.jobs(EDITOR)
    try:
        editor.create("loop", runPolicy={"progressDeadlineSeconds": 5})
        raise AssertionError("a 5 s progress deadline was accepted")
    except ApiException as err:
        assert err.status == 422 and "spec.runPolicy.progressDeadlineSeconds" in str(err.body), err.body
    editor.create("hung", runPolicy={"progressDeadlineSeconds": 600})
    tenant_a.try_to_write_status("hung", HELD_OFF)
    spec = {"framework": "pytorch", "workers": 2, "gpusPerWorker": 4,
            "runPolicy": {"progressDeadlineSeconds": 600}}  # fmt: skip
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "DistributedTrainingJob",
            "metadata": {"name": "hung-born-late"}, "spec": spec, **HELD_OFF}  # fmt: skip
    client.CustomObjectsApi(tenant_a.api(EDITOR)).create_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, body
    )
    admin = client.CustomObjectsApi(api_client)

    def stored_time(name: str) -> Any:
        stored = cast(dict[str, Any], admin.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name))
        return (stored.get("status") or {}).get("lastProgressTime")

    for name in ("hung", "hung-born-late"):
        assert stored_time(name) is None, name
    # The field is in the CRD's status schema (not pruned): the operator's own write keeps it.
    admin.patch_namespaced_custom_object_status(GROUP, VERSION, ns, PLURAL, "hung", HELD_OFF)
    assert stored_time("hung") == "2099-01-01T00:00:00Z"
