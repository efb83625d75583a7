"""Storage under attack: tenants act with their own tokens, the operator runs with the chart's
ServiceAccount and its storage policy, and Azurite checks every token it signs.

The install: Azurite's account allowed, any container readable (`*`), each namespace writing
`results-{namespace}`, and every namespace that uses the cluster-wide write list writing SHARED. The account
key Secret each tenant's jobs sign with is provisioned by the cluster admin, as a platform team does: the
tenants' editors cannot read Secrets, so the operator's signature is their only way into storage.
"""

from __future__ import annotations

import base64
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs

import pytest
from azure.storage.blob import BlobServiceClient, ContainerSasPermissions, generate_container_sas
from dtjob import names
from dtjob.names import STORAGE_KEY_LABEL
from dtjob.reconcile.storage_observe import token_sha256
from dtjob.spec.tenancy import ANNOTATION_WRITE_CONTAINERS
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from testbed.azurite import DEV_ACCOUNT_NAME, Azurite
from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess
from testbed.tenancy import ADMIN, Tenant
from tests.azure.conftest import azurite  # noqa: F401  (the fixture)

pytestmark = pytest.mark.azure

KEY_SECRET = "storage-key"
SHARED = f"shared-{uuid.uuid4().hex[:12]}"  # named literally by the cluster-wide write list
RESYNC_S = 5


@pytest.fixture
def chart_sets() -> tuple[str, ...]:
    return (
        f"storagePolicy.accounts[0]={DEV_ACCOUNT_NAME}",
        "storagePolicy.readContainers[0]=*",
        "storagePolicy.writeContainers[0]=results-{namespace}",
        f"storagePolicy.writeContainers[1]={SHARED}",
    )


@pytest.fixture
def operator_env() -> dict[str, str]:
    # A tenant's edit of a Secret is no watch event: the resync is the operator's next look at it.
    return {"DTJOB_RESYNC_SECONDS": str(RESYNC_S)}


@pytest.fixture
def blob(azurite: Azurite) -> BlobServiceClient:  # noqa: F811
    return BlobServiceClient(azurite.endpoint, credential=azurite.account_key)


def provision_key(api_client: client.ApiClient, namespace: str, azurite: Azurite) -> None:  # noqa: F811
    """The platform team's account key Secret in a tenant's namespace, opted in for the operator's use."""
    secret = client.V1Secret(
        metadata=client.V1ObjectMeta(name=KEY_SECRET, labels={STORAGE_KEY_LABEL: "true"}),
        string_data={"azurestorageaccountkey": azurite.account_key},
    )
    client.CoreV1Api(api_client).create_namespaced_secret(namespace, secret)


def annotate(api_client: client.ApiClient, namespace: str, annotations: dict[str, str]) -> None:
    """As the cluster admin: tenants cannot annotate their own Namespace."""
    client.CoreV1Api(api_client).patch_namespace(namespace, {"metadata": {"annotations": annotations}})


def location(azurite: Azurite, container: str) -> dict[str, Any]:  # noqa: F811
    return {
        "endpoint": azurite.endpoint,
        "container": container,
        "prefix": "runs",
        "credentials": {"authMode": "accountKey", "secretRef": {"name": KEY_SECRET}},
    }


def staging_from(azurite: Azurite, container: str) -> dict[str, Any]:  # noqa: F811
    return {
        "dataset": {
            "source": "imagenet",
            "volume": {"nfs": {"server": "10.0.0.4", "path": "/exports/imagenet"}, "mountPath": "/data"},
            "dataDir": "/data/imagenet",
            "stageFrom": location(azurite, container),
        }
    }


def blobs(blob: BlobServiceClient, container: str) -> dict[str, str]:
    """Every blob of `container` with its ETag, read with the account key."""
    return {b.name: str(b.etag) for b in blob.get_container_client(container).list_blobs()}


def secret_data(api_client: client.ApiClient, namespace: str, name: str, key: str) -> str | None:
    try:
        secret = client.CoreV1Api(api_client).read_namespaced_secret(name, namespace)
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    value = (secret.data or {}).get(key)
    return base64.b64decode(value).decode() if value else None


def assert_refused_before_anything_is_signed(
    api_client: client.ApiClient, tenant: Tenant, job: str, message: str
) -> None:
    """The job failed with StorageNotAllowed and `message`; no SAS Secret, stager or pod exists for it."""
    checked = Jobs(api_client, tenant.namespace)
    status = checked.wait_phase(job, "Failed", "Staging", "Starting", "Running", timeout=90)
    failed = checked.condition(job, "Failed")
    assert failed and failed["reason"] == "StorageNotAllowed", status
    assert failed["message"] == message
    for access in ("in", "out"):
        assert secret_data(api_client, tenant.namespace, f"{job}-sas-{access}", "sas-token") is None
    assert not checked.pods(job) and not checked.batch.list_namespaced_job(tenant.namespace).items


def test_a_star_never_reads_a_container_another_namespaces_own_write_list_names(
    operator: OperatorProcess,
    tenant_a: Tenant,
    tenant_b: Tenant,
    api_client: client.ApiClient,
    azurite: Azurite,  # noqa: F811
    blob: BlobServiceClient,
) -> None:
    """Team A writes its results to a container named only in its Namespace's write list. Team B's editor
    stages from it: before, B's read list `*` reached it, and the operator signed B a read+list token for
    team A's results."""
    theirs = f"team-a-runs-{uuid.uuid4().hex[:10]}"
    blob.create_container(theirs).upload_blob("runs/model.pt", b"team a's weights")
    before = blobs(blob, theirs)
    annotate(api_client, tenant_a.namespace, {ANNOTATION_WRITE_CONTAINERS: theirs})
    provision_key(api_client, tenant_b.namespace, azurite)

    tenant_b.jobs().create("steal", **staging_from(azurite, theirs))

    assert_refused_before_anything_is_signed(api_client, tenant_b, "steal", (
        f"spec.dataset.stageFrom.container: container {theirs!r} is written by another namespace (another "
        f"namespace's own write list names it), so a `*` in the read list does not reach it from namespace "
        f"{tenant_b.namespace}; name it in the read list to allow that (allowed: * (operator setting "
        "DTJOB_READ_CONTAINERS))"
    ))  # fmt: skip
    assert blobs(blob, theirs) == before


def test_a_namespace_with_its_own_write_list_never_reads_what_the_cluster_write_list_names(
    operator: OperatorProcess,
    tenant_a: Tenant,
    tenant_b: Tenant,
    api_client: client.ApiClient,
    azurite: Azurite,  # noqa: F811
    blob: BlobServiceClient,
) -> None:
    """SHARED is written by every namespace that uses the cluster-wide write list. Team B's Namespace has a
    write list of its own, so B is none of SHARED's writers: before, its read list `*` reached SHARED anyway.
    Team A, which uses the cluster-wide list, still reads it."""
    blob.create_container(SHARED).upload_blob("runs/a/model.pt", b"a writer's weights")
    before = blobs(blob, SHARED)
    annotate(api_client, tenant_b.namespace, {ANNOTATION_WRITE_CONTAINERS: f"b-runs-{uuid.uuid4().hex[:10]}"})
    for tenant in (tenant_a, tenant_b):
        provision_key(api_client, tenant.namespace, azurite)

    tenant_b.jobs().create("peek", **staging_from(azurite, SHARED))
    tenant_a.jobs().create("own", **staging_from(azurite, SHARED))

    assert_refused_before_anything_is_signed(api_client, tenant_b, "peek", (
        f"spec.dataset.stageFrom.container: container {SHARED!r} is written by another namespace (operator "
        "setting DTJOB_WRITE_CONTAINERS names it, for every namespace without a write list of its own), so a "
        f"`*` in the read list does not reach it from namespace {tenant_b.namespace}; name it in the read "
        "list to allow that (allowed: * (operator setting DTJOB_READ_CONTAINERS))"
    ))  # fmt: skip
    Jobs(api_client, tenant_a.namespace).wait_phase("own", "Staging", timeout=90)
    # The status records intent first; the SAS is minted by the same reconcile right after.
    token = wait_for(
        lambda: secret_data(api_client, tenant_a.namespace, "own-sas-in", "sas-token"),
        timeout=30, what="own-sas-in minted",
    )  # fmt: skip
    assert permissions(token) == "rl"
    assert blobs(blob, SHARED) == before


def permissions(token: str) -> str:
    return parse_qs(token)["sp"][0]


def test_a_sas_token_a_namespace_admin_replaces_is_minted_again(
    operator: OperatorProcess,
    tenant_a: Tenant,
    api_client: client.ApiClient,
    azurite: Azurite,  # noqa: F811
    blob: BlobServiceClient,
) -> None:
    """Team A's admin (the built-in admin role edits Secrets) swaps the token in `<job>-sas-out` for one of
    the same container with every permission and a week's life, and keeps the URL and the annotations. Before,
    the operator checked only that a token was there: rank 0 went on with the forged one as the operator's."""
    ns = tenant_a.namespace
    results = f"results-{ns}"
    blob.create_container(results)
    provision_key(api_client, ns, azurite)
    tenant_a.jobs().create(
        "swap",
        output=location(azurite, results),
        launcher={"podAnnotations": {"sim.dtjob.io/run-duration": "600s"}},
    )
    Jobs(api_client, ns).wait_phase("swap", "Running", timeout=90)
    minted = secret_data(api_client, ns, "swap-sas-out", "sas-token")
    assert minted is not None and permissions(minted) == "cw"

    everything = ContainerSasPermissions(read=True, add=True, create=True, write=True, delete=True, list=True)
    forged = generate_container_sas(
        DEV_ACCOUNT_NAME, results, account_key=azurite.account_key, permission=everything,
        expiry=datetime.now(UTC) + timedelta(days=7),
    )  # fmt: skip
    assert permissions(forged) == "racwdl"
    encoded = base64.b64encode(forged.encode()).decode()
    tenant_a.core(ADMIN).patch_namespaced_secret("swap-sas-out", ns, {"data": {"sas-token": encoded}})
    assert secret_data(api_client, ns, "swap-sas-out", "sas-token") == forged

    def reminted() -> str | None:
        token = secret_data(api_client, ns, "swap-sas-out", "sas-token")
        return token if token not in (None, forged) else None

    token = wait_for(
        reminted, timeout=6 * RESYNC_S + 30, what="the operator's own token back in swap-sas-out"
    )
    assert permissions(token) == "cw"
    checked = Jobs(api_client, ns)
    # The Secret is written first, then the status that records its digest, then the event.
    wait_for(
        lambda: (checked.status("swap").get("sasTokenDigests") or {}).get("out") == token_sha256(token),
        timeout=30, what="the new token's digest in status",
    )  # fmt: skip
    checked.wait_event("swap", "SasSecretAltered")
    altered = [e.message for e in checked.events("swap") if e.reason == "SasSecretAltered"]
    assert altered == [
        "the out SAS Secret holds a token the operator did not write: replaced with a fresh token and the "
        "spec's URL"
    ]
    signature = parse_qs(forged)["sig"][0]
    assert signature not in str(checked.status("swap")) + operator.log_path.read_text(errors="replace")


def test_an_output_edited_mid_run_to_another_teams_container_gets_nothing_signed_for_it(
    operator: OperatorProcess,
    tenant_a: Tenant,
    tenant_b: Tenant,
    api_client: client.ApiClient,
    azurite: Azurite,  # noqa: F811
    blob: BlobServiceClient,
) -> None:
    """Team B's editor points a running job's output at team A's results container. Before, the operator's
    own upload of the pods' logs at the end signed for whatever spec.output said then, with no policy check:
    B's logs were written into A's container with the operator's signature."""
    ours, theirs = f"results-{tenant_b.namespace}", f"results-{tenant_a.namespace}"
    for container in (ours, theirs):
        blob.create_container(container)
    blob.get_container_client(theirs).upload_blob("runs/model.pt", b"team a's weights")
    before = blobs(blob, theirs)
    provision_key(api_client, tenant_b.namespace, azurite)
    editor = tenant_b.jobs()
    editor.create(
        "redirect", output=location(azurite, ours),
        launcher={"podAnnotations": {"sim.dtjob.io/run-duration": "20s"}},
    )  # fmt: skip
    checked = Jobs(api_client, tenant_b.namespace)
    checked.wait_phase("redirect", "Running", timeout=90)
    editor.patch_spec("redirect", {"output": {"container": theirs}})

    status = checked.wait_phase("redirect", "Succeeded", "Failed", timeout=120)
    error = wait_for(
        lambda: (checked.status("redirect").get("output") or {}).get("logsError"),
        timeout=60, what="the log upload's refusal in status",
    )  # fmt: skip
    assert error.startswith("spec.output.container: ") and repr(theirs) in error, (status, error)
    assert blobs(blob, theirs) == before, "something was written into team A's container"


def test_a_completed_job_under_the_staging_jobs_name_does_not_stand_in_for_the_jobs_staging(
    operator: OperatorProcess,
    tenant_a: Tenant,
    api_client: client.ApiClient,
    azurite: Azurite,  # noqa: F811
    blob: BlobServiceClient,
) -> None:
    """Team A's admin runs a batch Job named `mine-stage`, labelled as the stager of job `mine`, to completion
    before the job is made (a job deleted with --cascade=orphan leaves one too). Before, the operator took
    its Complete for the job's staging and started the world on a dataset nobody staged. The job now waits
    for the name, as for any child another owner holds, and starts no worker."""
    data = f"data-{uuid.uuid4().hex[:10]}"
    blob.create_container(data).upload_blob("runs/train/x.bin", b"a dataset")
    provision_key(api_client, tenant_a.namespace, azurite)
    labels = names.labels("mine", "staging", names.ROLE_STAGER)
    restricted = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    lookalike: Any = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": names.staging_job_name("mine"), "labels": labels},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {"type": "kwok"},
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": names.STAGER_CONTAINER, "image": "busybox",
                                    "securityContext": restricted}],
                },
            },
        },
    }  # fmt: skip
    batch = client.BatchV1Api(api_client)
    client.BatchV1Api(tenant_a.api(ADMIN)).create_namespaced_job(tenant_a.namespace, lookalike)

    def completed() -> bool:
        job = batch.read_namespaced_job(names.staging_job_name("mine"), tenant_a.namespace)
        return any(c.type == "Complete" and c.status == "True" for c in job.status.conditions or ())

    wait_for(completed, timeout=90, what="the look-alike staging Job complete")
    tenant_a.jobs().create("mine", **staging_from(azurite, data))
    mine = Jobs(api_client, tenant_a.namespace)

    def waiting() -> dict[str, Any] | None:
        conditions = mine.status("mine").get("conditions") or ()
        return next((c for c in conditions if c.get("reason") == "ChildNotOwned"), None)

    held = wait_for(waiting, timeout=90, what="the job waiting for the staging Job's name")
    assert f"Job {names.staging_job_name('mine')}" in held["message"], held
    time.sleep(RESYNC_S)  # a resync's pass more, in which nothing of the world may appear either
    assert not mine.pods("mine", "worker")
    staged = mine.condition("mine", "Staged")
    assert not staged or staged["status"] != "True", staged
    # Pending or Staging, by whether the pass that met the name had recorded the job's staging yet.
    assert mine.status("mine")["phase"] in ("Pending", "Staging"), mine.status("mine")


def test_an_editor_naming_a_key_secret_its_admins_did_not_opt_in_gets_nothing_signed(
    operator: OperatorProcess,
    tenant_a: Tenant,
    api_client: client.ApiClient,
    azurite: Azurite,  # noqa: F811
    blob: BlobServiceClient,
) -> None:
    """Tenant A's namespace holds an account key in a Secret of another app's (not labelled
    dtjob.io/storage-key=true). Its editor, who cannot read Secrets, names it in a job's credentials: the
    operator signs nothing with it, and the job waits, naming the field, with no token Secret and no pod."""
    ns = tenant_a.namespace
    results = f"results-{ns}"
    blob.create_container(results)
    other_app = client.V1Secret(
        metadata=client.V1ObjectMeta(name="billing-storage"),
        string_data={"azurestorageaccountkey": azurite.account_key},
    )
    client.CoreV1Api(api_client).create_namespaced_secret(ns, other_app)
    output = location(azurite, results)
    output["credentials"] = {"authMode": "accountKey", "secretRef": {"name": "billing-storage"}}
    tenant_a.jobs().create("borrow", output=output)
    checked = Jobs(api_client, ns)
    status = checked.wait_phase("borrow", "Pending", timeout=60)
    created = wait_for(lambda: checked.condition("borrow", "Created"), timeout=30, what="Created")
    assert created["reason"] == "StorageCredentialsNotAllowed", status
    field = "spec.output.credentials.secretRef"
    expected = f"{field}: Secret 'billing-storage' is not labelled {STORAGE_KEY_LABEL}=true"
    assert created["message"].startswith(expected), created
    time.sleep(RESYNC_S + 1)  # a resync later, still nothing
    assert secret_data(api_client, ns, "borrow-sas-out", "sas-token") is None
    assert not checked.pods("borrow") and blobs(blob, results) == {}
