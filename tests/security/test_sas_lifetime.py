"""A token's life under attack: a SAS cannot be revoked, so whatever a job's code copies of its own token
reaches storage until the token expires, deleted job or not. Tenant A's editor asks for the longest life the
CRD allows (7 days) in an install whose storage policy caps tokens at an hour: the token the operator signs,
read with the admin's rights and checked by Azurite's own signature, lives an hour."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs

import pytest
from azure.storage.blob import BlobServiceClient, ContainerClient
from dtjob.azure.sas import ANNOTATION_EXPIRES
from dtjob.timefmt import parse_time
from kubernetes import client

from testbed.azurite import DEV_ACCOUNT_NAME, Azurite
from testbed.operator_harness import Jobs, OperatorProcess
from testbed.tenancy import Tenant
from tests.azure.conftest import azurite  # noqa: F401  (the fixture)
from tests.security.test_storage_tenancy import location, provision_key

pytestmark = pytest.mark.azure

CAP_S = 3600
WEEK_S = 7 * 24 * 3600


@pytest.fixture
def chart_sets() -> tuple[str, ...]:
    return (
        f"storagePolicy.accounts[0]={DEV_ACCOUNT_NAME}",
        "storagePolicy.writeContainers[0]=results-{namespace}",
        f"storagePolicy.maxSasLifetimeSeconds={CAP_S}",
    )


def test_a_job_asking_a_week_long_token_gets_one_no_longer_than_the_installers_cap(
    operator: OperatorProcess,
    tenant_a: Tenant,
    api_client: client.ApiClient,
    azurite: Azurite,  # noqa: F811
) -> None:
    ns = tenant_a.namespace
    results = f"results-{ns}"
    BlobServiceClient(azurite.endpoint, credential=azurite.account_key).create_container(results)
    provision_key(api_client, ns, azurite)
    asked = datetime.now(UTC)
    tenant_a.jobs().create(
        "long", output={**location(azurite, results), "sasLifetimeSeconds": WEEK_S},
        launcher={"podAnnotations": {"sim.dtjob.io/run-duration": "600s"}},
    )  # fmt: skip
    Jobs(api_client, ns).wait_phase("long", "Running", timeout=90)
    secret = client.CoreV1Api(api_client).read_namespaced_secret("long-sas-out", ns)
    token = base64.b64decode(secret.data["sas-token"]).decode()
    url = base64.b64decode(secret.data["container-url"]).decode()
    expires = parse_time(parse_qs(token)["se"][0])
    assert asked < expires <= asked + timedelta(seconds=CAP_S + 60), expires
    assert parse_time(secret.metadata.annotations[ANNOTATION_EXPIRES]) == expires
    # The token is the one Azurite signed: it writes now, as rank 0 would.
    with ContainerClient.from_container_url(url, credential=token) as container:
        container.upload_blob("runs/probe", b"ok", overwrite=True)
