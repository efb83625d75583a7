"""`status.workers.succeeded`: a torchrun world's workers that exited 0, which the operator reads back from
the job's status to tell a finished world (a gone worker did its part) from a broken one. A tenant who could
set it would keep its own job from restarting over a worker lost mid-training. Acting with each tenant role's
own token, on a real API server: no way in through the status subresource, the job's create or a patch of
the job itself (the status subresource makes the API server drop a status sent there)."""

from __future__ import annotations

from typing import Any, cast

from kubernetes import client

from testbed.operator_harness import GROUP, PLURAL, VERSION
from testbed.tenancy import EDITOR, Tenant

FORGED: dict[str, Any] = {"status": {"workers": {"total": 2, "ready": 2, "succeeded": 2}}}


def test_a_tenant_cannot_count_its_torchrun_workers_as_done(
    tenant_a: Tenant, api_client: client.ApiClient
) -> None:
    ns = tenant_a.namespace
    tenant_a.jobs(EDITOR).create("ddp", torchrun={})
    tenant_a.try_to_write_status("ddp", FORGED)
    spec = {"framework": "pytorch", "workers": 2, "gpusPerWorker": 4, "torchrun": {}}
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "DistributedTrainingJob",
            "metadata": {"name": "ddp-born-done"}, "spec": spec, **FORGED}  # fmt: skip
    client.CustomObjectsApi(tenant_a.api(EDITOR)).create_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, body
    )
    admin = client.CustomObjectsApi(api_client)

    def stored_workers(name: str) -> dict[str, Any]:
        stored = cast(dict[str, Any], admin.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name))
        return cast(dict[str, Any], (stored.get("status") or {}).get("workers") or {})

    for name in ("ddp", "ddp-born-done"):
        assert "succeeded" not in stored_workers(name), name
    # The field is in the CRD's status schema (not pruned): the operator's own write keeps it.
    admin.patch_namespaced_custom_object_status(GROUP, VERSION, ns, PLURAL, "ddp", FORGED)
    assert stored_workers("ddp").get("succeeded") == 2
