"""A SAS Secret is trusted as far as the status vouches for it: its token's digest is recorded when the
operator writes it (status is a subresource namespace editors cannot write), and a Secret whose token has
another digest is minted again. The storage policy check reads every namespace's own lists."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from dtjob.azure.sas import ContainerSas, sas_secret
from dtjob.config import load_config
from dtjob.desired.common import owner_reference
from dtjob.kube.errors import Forbidden
from dtjob.machine import with_results
from dtjob.names import SECRET_TOKEN_KEY, SECRET_URL_KEY, Access
from dtjob.reconcile.act import act
from dtjob.reconcile.storage_observe import observe_sas, storage_allowed, token_sha256
from dtjob.runtime.cached_kube import NAMESPACE_LIST_TTL_S, CachedKube
from dtjob.runtime.ttl_cache import TtlCache
from dtjob.spec.tenancy import ANNOTATION_WRITE_CONTAINERS
from dtjob.state.decision import MintSas, SasMinted
from dtjob.state.status import JobStatus, status_from_dict

from tests.unit.manual_clock import ManualClock
from tests.unit.operator_fixtures import job_spec
from tests.unit.recording_kube import RecordingKube, unused_api

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
ENDPOINT = "http://127.0.0.1:10000/devstoreaccount1"
# Azurite's published development key: nothing secret.
DEV_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
CREDS = {"authMode": "accountKey", "secretRef": {"name": "storage-key"}}
CONFIG = load_config({"DTJOB_ALLOWED_STORAGE_ACCOUNTS": "devstoreaccount1", "DTJOB_WRITE_CONTAINERS": "*"})
OWNER = owner_reference("rn50", "uid-1")
Json = dict[str, Any]


def output_spec(container: str = "results") -> Any:
    return job_spec(output={"endpoint": ENDPOINT, "container": container, "credentials": CREDS})


def cluster(*namespaces: tuple[str, dict[str, str]]) -> RecordingKube:
    """The API server with the job's namespace `ml`, `namespaces` and the account key Secret."""
    kube = RecordingKube()
    for name, set_on_it in [("ml", {}), *namespaces]:
        kube.put({"kind": "Namespace", "metadata": {"name": name, "annotations": set_on_it}})
    kube.put({
        "kind": "Secret",
        "metadata": {"name": "storage-key", "namespace": "ml", "labels": {"dtjob.io/storage-key": "true"}},
        "data": {"azurestorageaccountkey": base64.b64encode(DEV_KEY.encode()).decode()},
    })  # fmt: skip
    return kube


def minted(kube: RecordingKube) -> tuple[Json, JobStatus]:
    """`rn50-sas-out` as the operator mints it now (stored as the API server stores it), and the status once
    the mint is recorded."""
    results = act(kube, CONFIG, output_spec(), OWNER, [MintSas("out")], [], None, NOW)
    status, _ = with_results(JobStatus(), results)
    return store(kube, kube.objects[("Secret", "ml", "rn50-sas-out")]), status


def store(kube: RecordingKube, secret: Json) -> Json:
    """`secret` put as the API server keeps it: its stringData base64-encoded into data."""
    strings = secret.get("stringData") or {}
    data = {
        **(secret.get("data") or {}),
        **{k: base64.b64encode(v.encode()).decode() for k, v in strings.items()},
    }
    return kube.put({**{k: v for k, v in secret.items() if k != "stringData"}, "data": data})


def decoded(secret: Json, key: str) -> str:
    return base64.b64decode(secret["data"][key]).decode()


def test_a_mint_records_the_digest_of_the_token_it_wrote_and_never_the_token() -> None:
    kube = cluster()
    secret, status = minted(kube)
    token = decoded(secret, SECRET_TOKEN_KEY)
    assert status.sas_token_digests == {"out": token_sha256(token)}
    recorded = status.to_dict()
    assert recorded["sasTokenDigests"] == {"out": token_sha256(token)}
    assert token not in str(recorded)
    assert status_from_dict(recorded).sas_token_digests == status.sas_token_digests
    # Another access's digest keeps this one.
    both, _ = with_results(status, [SasMinted("in", "0" * 64)])
    assert both.sas_token_digests == {"out": token_sha256(token), "in": "0" * 64}
    assert status_from_dict({"sasTokenDigests": {"out": 7, "in": "ab"}}).sas_token_digests == {"in": "ab"}


def test_a_token_the_status_does_not_vouch_for_is_minted_again() -> None:
    kube = cluster()
    secret, status = minted(kube)
    observed = observe_sas(kube, output_spec(), status, "uid-1", NOW + timedelta(seconds=5), CONFIG)
    assert observed["out"].mint_needed is False  # the operator's own token, fresh

    # Replaced by a token of the same URL signed elsewhere (wider or longer-lived), annotations kept.
    wider = ContainerSas(decoded(secret, SECRET_URL_KEY), "sv=2024&sp=racwdl&sig=forged", NOW, NOW)
    forged = sas_secret("rn50", "ml", Access.OUTPUT, wider, NOW, OWNER)
    store(kube, {**forged, "metadata": secret["metadata"]})
    altered = observe_sas(kube, output_spec(), status, "uid-1", NOW + timedelta(seconds=5), CONFIG)["out"]
    assert altered.mint_needed and altered.blocked is None
    assert altered.altered == "holds a token the operator did not write"


def test_a_secret_minted_before_digests_were_recorded_is_minted_again_quietly() -> None:
    kube = cluster()
    minted(kube)
    observed = observe_sas(kube, output_spec(), JobStatus(), "uid-1", NOW + timedelta(seconds=5), CONFIG)
    assert observed["out"].mint_needed and observed["out"].altered is None


def test_the_policy_check_reads_every_namespaces_own_write_list() -> None:
    kube = cluster(("team-a", {ANNOTATION_WRITE_CONTAINERS: "team-a-runs"}))
    spec = job_spec(
        dataset={
            "source": "imagenet",
            "volume": {"nfs": {"server": "10.0.0.4", "path": "/exports"}, "mountPath": "/data"},
            "dataDir": "/data/imagenet",
            "stageFrom": {"endpoint": ENDPOINT, "container": "team-a-runs", "credentials": CREDS},
        }
    )
    blocker = storage_allowed(kube, spec, CONFIG)
    assert blocker is not None and blocker.fatal and blocker.reason == "StorageNotAllowed"
    assert blocker.message.startswith("spec.dataset.stageFrom.container: container 'team-a-runs' is written")
    assert ("list", "Namespace", "") in kube.calls

    @dataclass
    class NoNamespaceList(RecordingKube):
        def list(self, kind: str, namespace: str | None, *args: Any, **kwargs: Any) -> list[Json]:
            if kind == "Namespace":
                raise Forbidden("list Namespace refused by the API server: forbidden by the test")
            return super().list(kind, namespace, *args, **kwargs)

    unreadable = storage_allowed(NoNamespaceList(objects=kube.objects), spec, CONFIG)
    assert unreadable is not None and not unreadable.fatal and unreadable.reason == "StoragePolicyUnreadable"


def test_the_namespaces_list_is_reused_for_a_while_with_only_their_dtjob_annotations() -> None:
    kube = cluster(("team-a", {ANNOTATION_WRITE_CONTAINERS: "team-a-runs", "note": "x" * 1000}))
    clock = ManualClock()
    cached = CachedKube(kube, unused_api(),
                        namespace_list=TtlCache(NAMESPACE_LIST_TTL_S, clock))  # fmt: skip
    listed = cached.list("Namespace", None, cached=True)
    team_a = next(n for n in listed if n["metadata"]["name"] == "team-a")
    assert team_a == {
        "metadata": {"name": "team-a", "annotations": {ANNOTATION_WRITE_CONTAINERS: "team-a-runs"}}
    }
    cached.list("Namespace", None, cached=True)
    assert kube.calls.count(("list", "Namespace", "")) == 1
    clock.now += NAMESPACE_LIST_TTL_S
    cached.list("Namespace", None, cached=True)
    assert kube.calls.count(("list", "Namespace", "")) == 2


def test_a_token_that_outlives_a_shortened_deadline_is_minted_again() -> None:
    """A token is minted to expire by the job's deadline at the latest; an edit that brings the deadline
    closer makes the tokens minted before it outlive the job, so they are minted again (by the new one)."""
    kube = cluster()
    started = JobStatus(start_time="2026-03-01T12:00:00Z")
    hour = job_spec(output=hour_output(), runPolicy={"activeDeadlineSeconds": 3600})
    mint = MintSas("out", not_after=NOW + timedelta(hours=1))
    results = act(kube, CONFIG, hour, OWNER, [mint], [], None, NOW)
    status, _ = with_results(started, results)
    store(kube, kube.objects[("Secret", "ml", "rn50-sas-out")])
    later = NOW + timedelta(seconds=5)
    assert observe_sas(kube, hour, status, "uid-1", later, CONFIG)["out"].mint_needed is False
    longer = job_spec(output=hour_output(), runPolicy={"activeDeadlineSeconds": 7200})
    assert observe_sas(kube, longer, status, "uid-1", later, CONFIG)["out"].mint_needed is False
    shorter = job_spec(output=hour_output(), runPolicy={"activeDeadlineSeconds": 60})
    outliving = observe_sas(kube, shorter, status, "uid-1", later, CONFIG)["out"]
    assert outliving.mint_needed and outliving.blocked is None and outliving.altered is None
    # Without a deadline, or before the job started, nothing is minted again for it.
    assert observe_sas(kube, output_spec(), status, "uid-1", later, CONFIG)["out"].mint_needed is False
    assert observe_sas(kube, shorter, JobStatus(sas_token_digests=status.sas_token_digests), "uid-1", later,
                       CONFIG)["out"].mint_needed is False  # fmt: skip


def hour_output() -> Json:
    return {"endpoint": ENDPOINT, "container": "results", "credentials": CREDS}
