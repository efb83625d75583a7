"""What a pod the operator creates may name, judged on the object about to be created: its pod spec after the
template merge (dtjob.desired.template), so that nothing a template, spec.env or the merge adds is missed, and
the spec as it is at that create (a template edited during staging or mid-run counts from the next pod on:
every world, every elastic replacement, the launcher and the stager). Pure; dtjob.reconcile.pod_trust reads
the Secrets.

A pod may name:
- the job's own Secrets (its SSH key, the SAS tokens its spec asks for): the operator creates them and checks
  they are the job's there (dtjob.reconcile.ensure, dtjob.reconcile.storage_observe);
- another Secret of the namespace once it exists, unless a DistributedTrainingJob other than its own owns it
  (an SSH key, SAS tokens) or it holds a storage account key (labelled dtjob.io/storage-key=true, or named by
  the spec's credentials): only the operator reads those. A Secret that does not exist yet is waited for:
  created later, it could be any of those;
- any ServiceAccount but the operator's own (in the operator's namespace);
- an NFS share its namespace's list admits (dtjob.desired.pod_shares).
Image pull Secrets are left alone: the kubelet pulls with them, nothing of them enters the pod.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dtjob import API_GROUP, KIND, names
from dtjob.desired import pod_origin
from dtjob.desired.pod_shares import refused_shares
from dtjob.names import Access
from dtjob.spec.nfs_shares import NfsShares
from dtjob.spec.parse import JobSpec
from dtjob.state.status import SECRET_NOT_FOUND

SECRET_NOT_ALLOWED = "SecretNotAllowed"
SERVICE_ACCOUNT_NOT_ALLOWED = "ServiceAccountNotAllowed"
NFS_SHARE_NOT_ALLOWED = "NfsShareNotAllowed"
# Where a pod spec names a Secret by a `name` inside these objects: a projected source (`secret`), envFrom
# and the volume plugins that log in with one (`secretRef`: cephfs, rbd, iscsi, flexVolume, cinder, scaleIO,
# storageos), env (`secretKeyRef`), csi (`nodePublishSecretRef`). `secretName` names one itself (a secret
# volume, azureFile). A pod gets what a Secret holds or what it unlocks.
SECRET_REF_KEYS = frozenset({"secret", "secretRef", "secretKeyRef", "nodePublishSecretRef"})
SECRET_NAME_KEY = "secretName"
SERVICE_ACCOUNT_KEYS = ("serviceAccountName", "serviceAccount")  # the second: the deprecated alias


@dataclass(frozen=True)
class SecretReference:
    field: str  # the spec field that named it (a template's, spec.env), else the object's own path
    name: str


@dataclass(frozen=True)
class Untrusted:
    """Why an object may not be created as built; `field` is the spec field that asked for it."""

    reason: str  # fails: SecretNotAllowed, ...NotAllowed; waits: SecretNotFound, NfsSharesUnreadable
    field: str
    message: str
    fatal: bool  # the spec must change; otherwise (a Secret not there yet) the job waits and looks again


def secret_references(pod_spec: Mapping[str, Any], path: str) -> list[tuple[str, str]]:
    """(field, Secret name) of every Secret a pod spec (or a template's fragment of one) at `path` names."""
    return list(_walk(pod_spec, path))


def to_read(spec: JobSpec, objects: Sequence[Mapping[str, Any]]) -> list[str]:
    """The Secrets to read before `objects` (Pods, batch Jobs) may be created: every one they name but the
    job's own, once each."""
    return list(dict.fromkeys(ref.name for obj in objects for ref in foreign_references(spec, obj)))


def judge(
    spec: JobSpec,
    uid: str,
    objects: Sequence[Mapping[str, Any]],
    secrets: Mapping[str, Mapping[str, Any] | None],
    operator_namespace: str | None,
    operator_account: str | None,
    shares: NfsShares,
) -> Untrusted | None:
    """The first reason `objects` may not be created (one that fails the job before one that waits), or None.
    `secrets`: each Secret of to_read() as just read (None: there is none); `uid`: the job's; `shares`: the
    NFS shares the job's namespace may mount."""
    found: list[Untrusted] = [
        Untrusted(NFS_SHARE_NOT_ALLOWED, refused.field, refused.message, fatal=True)
        for refused in refused_shares(spec, objects, shares)
    ]
    keys = _key_secrets(spec)
    for obj in objects:
        found += _service_account(spec, obj, operator_namespace, operator_account)
        for ref in foreign_references(spec, obj):
            verdict = _key_named(ref, keys) or _secret(spec.namespace, uid, ref, secrets.get(ref.name))
            found += [verdict] if verdict is not None else []
    return next((u for u in found if u.fatal), found[0] if found else None)


def foreign_references(spec: JobSpec, obj: Mapping[str, Any]) -> list[SecretReference]:
    """The Secrets `obj` names besides the job's own, each with the spec field that put it there: its
    template's, or spec.env's."""
    own = _own_secrets(spec)
    template_path = pod_origin.template_path(obj)
    template = pod_origin.template_spec(spec, template_path)
    sources = secret_references({"env": list(spec.env)}, "spec")
    if template is not None:
        sources += secret_references(template, f"{template_path}.spec")
    fields: dict[str, str] = {}
    for field, name in sources:
        fields.setdefault(name, field)
    pod_spec, path = pod_origin.pod_spec(obj)
    return [
        SecretReference(fields.get(name, f"{pod_origin.describe(obj)} {field}"), name)
        for field, name in secret_references(pod_spec, path)
        if name not in own
    ]


def _walk(value: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, Mapping):
        for key, item in value.items():
            at = f"{path}.{key}"
            if key == SECRET_NAME_KEY and isinstance(item, str) and item:
                yield at, item
            elif key in SECRET_REF_KEYS and isinstance(item, Mapping) and isinstance(item.get("name"), str):
                yield f"{at}.name", item["name"]
            else:
                yield from _walk(item, at)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _walk(item, f"{path}[{i}]")


def _secret(
    namespace: str, uid: str, ref: SecretReference, secret: Mapping[str, Any] | None
) -> Untrusted | None:
    if secret is None:
        return Untrusted(
            SECRET_NOT_FOUND, ref.field,
            f"Secret {ref.name!r} not found in namespace {namespace}; no pod naming it is created until it "
            "exists (created later, it could be another job's key or an account key)",
            fatal=False,
        )  # fmt: skip
    meta = secret.get("metadata") or {}
    if (meta.get("labels") or {}).get(names.STORAGE_KEY_LABEL) == "true":
        return Untrusted(
            SECRET_NOT_ALLOWED, ref.field,
            f"Secret {ref.name!r} is a storage account key ({names.STORAGE_KEY_LABEL}=true); account keys "
            "never enter a pod, only the operator reads them to sign SAS tokens",
            fatal=True,
        )  # fmt: skip
    for owner in meta.get("ownerReferences") or ():
        a_job = owner.get("kind") == KIND and str(owner.get("apiVersion", "")).startswith(f"{API_GROUP}/")
        if a_job and str(owner.get("uid")) != uid:
            return Untrusted(
                SECRET_NOT_ALLOWED, ref.field,
                f"Secret {ref.name!r} belongs to DistributedTrainingJob {owner.get('name')!r}; a job's pods "
                "may mount only their own job's keys and tokens",
                fatal=True,
            )  # fmt: skip
    return None


def _key_named(ref: SecretReference, keys: Mapping[str, str]) -> Untrusted | None:
    """The account key the spec's own credentials name, labelled for the operator's use or not."""
    if ref.name not in keys:
        return None
    return Untrusted(
        SECRET_NOT_ALLOWED, ref.field,
        f"Secret {ref.name!r} holds the storage account key ({keys[ref.name]}): account keys never enter a "
        "pod, only the operator reads them to sign SAS tokens",
        fatal=True,
    )  # fmt: skip


def _service_account(
    spec: JobSpec, obj: Mapping[str, Any], operator_namespace: str | None, operator_account: str | None
) -> list[Untrusted]:
    if not operator_account or spec.namespace != operator_namespace:
        return []
    pod_spec, path = pod_origin.pod_spec(obj)
    template_path = pod_origin.template_path(obj)
    return [
        Untrusted(
            SERVICE_ACCOUNT_NOT_ALLOWED,
            f"{template_path}.spec.{key}" if template_path else f"{pod_origin.describe(obj)} {path}.{key}",
            f"{operator_account!r} is the operator's own ServiceAccount; a job's pods may not run as the "
            "operator",
            fatal=True,
        )
        for key in SERVICE_ACCOUNT_KEYS
        if pod_spec.get(key) == operator_account
    ]


def _own_secrets(spec: JobSpec) -> frozenset[str]:
    """The Secrets the operator creates for the job: its SSH key always, a SAS Secret for what it stages
    from or writes to."""
    own = {names.ssh_secret_name(spec.name)}
    if spec.dataset.staging is not None:
        own.add(names.sas_secret_name(spec.name, Access.INPUT))
    if spec.output is not None:
        own.add(names.sas_secret_name(spec.name, Access.OUTPUT))
    return frozenset(own)


def _key_secrets(spec: JobSpec) -> dict[str, str]:
    """Secret name -> the field of the spec's credentials that names it."""
    locations = [
        (spec.dataset.staging.source.source if spec.dataset.staging else None, "spec.dataset.stageFrom"),
        (spec.output.target if spec.output else None, "spec.output"),
    ]
    return {
        location.credentials.secret_ref.name: f"{path}.credentials.secretRef.name"
        for location, path in locations
        if location is not None and location.credentials.secret_ref is not None
    }
