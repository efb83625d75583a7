"""A multi-tenant cluster as an installer sets one up, for the attack suite (tests/security/).

The chart is rendered by real helm; its ServiceAccount and RBAC objects are applied to the real API server;
the operator runs with a token of that ServiceAccount (never the admin's kubeconfig) and with the environment
the chart's Deployment gives it. Each tenant is a namespace and ServiceAccounts bound there to the roles a
platform team hands out: `editor`, the chart's `<release>-edit` ClusterRole only (DistributedTrainingJobs,
no Secrets, no pods), and `admin`, Kubernetes' built-in `admin` role (which aggregates the chart's). Tests act
with those tokens and check with the admin's.
"""

from __future__ import annotations

import base64
import functools
import subprocess
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from testbed.operator_harness import GROUP, PLURAL, REPO, VERSION, Jobs, OperatorProcess

CHART = REPO / "charts" / "dtjob"
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
# The chart's admission policy that binds the operator's own ServiceAccount (its guard): every attack runs the
# operator under them. The policy on tenants' jobs (the NFS shares') is its own test's to apply.
POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
OPERATOR_POLICY_SUFFIX = "-operator-guard"
EDITOR, ADMIN = "editor", "admin"
TOKEN_SECONDS = 3600
Json = dict[str, Any]


def render_chart(helm: str, release: str, namespace: str, sets: tuple[str, ...] = ()) -> list[Json]:
    """The chart as real helm renders it for `release` in `namespace`."""
    args = [helm, "template", release, str(CHART), "--namespace", namespace]
    for value in sets:
        args += ["--set", value]
    out = subprocess.run(args, check=True, capture_output=True, text=True, timeout=120).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def refused(call: Callable[[], Any]) -> bool:
    """Whether the API server refuses the call as forbidden (403); any other outcome is not a refusal."""
    try:
        call()
    except ApiException as err:
        return bool(err.status == 403)
    return False


def token_kubeconfig(admin_kubeconfig: str, token: str, path: Path) -> str:
    """A kubeconfig for the admin's API server (its address and CA) that authenticates with `token` only."""
    admin = yaml.safe_load(Path(admin_kubeconfig).read_text())
    current = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
    cluster = next(c for c in admin["clusters"] if c["name"] == current["cluster"])["cluster"]
    if "certificate-authority" in cluster:  # inline it: the file stays valid wherever it is read
        ca = Path(cluster["certificate-authority"]).read_bytes()
        cluster = {k: v for k, v in cluster.items() if k != "certificate-authority"}
        cluster["certificate-authority-data"] = base64.b64encode(ca).decode()
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }
    path.write_text(yaml.safe_dump(doc))
    path.chmod(0o600)
    return str(path)


def service_account_token(core: client.CoreV1Api, namespace: str, account: str) -> str:
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=TOKEN_SECONDS)
    )
    answer = core.create_namespaced_service_account_token(account, namespace, request)
    assert answer.status is not None
    return str(answer.status.token)


@dataclass
class Tenant:
    """A namespace and the clients of its people, each with their own token."""

    namespace: str
    kubeconfigs: dict[str, str]  # role (EDITOR, ADMIN) -> kubeconfig path
    tokens: dict[str, str]  # role -> its ServiceAccount's token (what any pod running as it holds)
    clients: dict[str, client.ApiClient] = field(default_factory=dict)

    def api(self, role: str = EDITOR) -> client.ApiClient:
        if role not in self.clients:
            self.clients[role] = config.new_client_from_config(config_file=self.kubeconfigs[role])
        return self.clients[role]

    def jobs(self, role: str = EDITOR) -> Jobs:
        """Job access with this tenant's own token: what it may do, and nothing else."""
        return Jobs(self.api(role), self.namespace)

    def core(self, role: str = EDITOR) -> client.CoreV1Api:
        return client.CoreV1Api(self.api(role))

    def try_to_write_status(self, job: str, forged: Json) -> None:
        """Each role tries to write `forged` (`{"status": ...}`) into the job: the status subresource refuses
        it; a patch of the job itself is taken, and the API server drops its status (a test then checks,
        with the admin's client, that nothing of it was stored)."""
        for role in (EDITOR, ADMIN):
            custom = client.CustomObjectsApi(self.api(role))
            args = (GROUP, VERSION, self.namespace, PLURAL, job, forged)
            forge = functools.partial(custom.patch_namespaced_custom_object_status, *args)
            assert refused(forge), f"the {role} role writes the status subresource"
            custom.patch_namespaced_custom_object(*args)


class TenantCluster:
    """The chart's RBAC under a release of its own, tenants, and the operator as the chart runs it."""

    def __init__(self, admin_kubeconfig: str, api_client: client.ApiClient, helm: str, workdir: Path) -> None:
        self.admin_kubeconfig = admin_kubeconfig
        self.admin = api_client
        self.core = client.CoreV1Api(api_client)
        self.rbac = client.RbacAuthorizationV1Api(api_client)
        self.helm = helm
        self.workdir = workdir
        suffix = uuid.uuid4().hex[:8]
        # Named with the chart's name, the chart names its objects after the release (dtjob.fullname), so the
        # edit role is `<release>-edit`.
        self.release = f"dtjob-sec-{suffix}"
        self.release_ns = f"sec-sys-{suffix}"
        self.docs: list[Json] = []
        # Cluster-scoped objects of the install and of the tests (deleted at the end), as (kind, name).
        self.cluster_scoped: list[tuple[str, str]] = []
        self._namespaces: list[str] = []

    @property
    def service_account(self) -> str:
        return str(next(d["metadata"]["name"] for d in self.docs if d["kind"] == "ServiceAccount"))

    def cluster_role(self, suffix: str) -> str:
        """The name of the chart's ClusterRole `<fullname>-<suffix>` (edit, view, metrics-reader...)."""
        roles = [str(d["metadata"]["name"]) for d in self.docs if d["kind"] == "ClusterRole"]
        return next(name for name in roles if name.endswith(f"-{suffix}"))

    def install(self, *sets: str) -> None:
        """The chart's ServiceAccount and RBAC, rendered with `sets`, applied as the cluster admin would."""
        self._create_namespace(self.release_ns)
        self.docs = render_chart(self.helm, self.release, self.release_ns, sets)
        objects = [d for d in self.docs if d["kind"] in RBAC_KINDS or _operator_policy(d)]
        for doc in objects:
            if doc["kind"] in ("ClusterRole", "ClusterRoleBinding", *POLICY_KINDS):
                self.cluster_scoped.append((doc["kind"], doc["metadata"]["name"]))
            elif doc["kind"] in ("Role", "RoleBinding"):
                self._create_namespace(doc["metadata"]["namespace"])
        applied = subprocess.run(
            ["kubectl", "--kubeconfig", self.admin_kubeconfig, "apply", "-f", "-"],
            input=yaml.safe_dump_all(objects), text=True, capture_output=True, timeout=120,
        )  # fmt: skip
        assert applied.returncode == 0, applied.stderr

    def tenant(self, namespace: str | None = None) -> Tenant:
        """A fresh namespace with an editor (the chart's edit role) and an admin (built-in admin)."""
        name = namespace or f"tenant-{uuid.uuid4().hex[:8]}"
        self._create_namespace(name)
        kubeconfigs: dict[str, str] = {}
        tokens: dict[str, str] = {}
        for role, cluster_role in ((EDITOR, self.cluster_role("edit")), (ADMIN, "admin")):
            account = f"{role}-{uuid.uuid4().hex[:6]}"
            self.core.create_namespaced_service_account(
                name, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=account))
            )
            self.rbac.create_namespaced_role_binding(
                name,
                client.V1RoleBinding(
                    metadata=client.V1ObjectMeta(name=account),
                    role_ref=client.V1RoleRef(
                        api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=cluster_role
                    ),
                    subjects=[client.RbacV1Subject(kind="ServiceAccount", name=account, namespace=name)],
                ),
            )
            token = tokens[role] = service_account_token(self.core, name, account)
            kubeconfigs[role] = token_kubeconfig(
                self.admin_kubeconfig, token, self.workdir / f"{name}-{role}.kubeconfig"
            )
        return Tenant(name, kubeconfigs, tokens)

    def operator_env(self) -> dict[str, str]:
        """The operator container's environment as the chart's Deployment sets it, its downward-API values
        filled in as the kubelet would; the chart's --metrics-secure as the variable the flag defaults to."""
        deployment = next(d for d in self.docs if d["kind"] == "Deployment")
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        secure = "--metrics-secure" in (container.get("args") or [])
        fields = {
            "metadata.name": f"{self.release}-operator-0",
            "metadata.namespace": self.release_ns,
            "spec.serviceAccountName": self.service_account,
        }
        env: dict[str, str] = {}
        for var in container.get("env") or []:
            if "value" in var:
                env[var["name"]] = str(var["value"])
            else:
                env[var["name"]] = fields[var["valueFrom"]["fieldRef"]["fieldPath"]]
        env["DTJOB_METRICS_SECURE"] = "true" if secure else "false"
        return env

    def operator(
        self, namespaces: list[str], log_path: Path, env: dict[str, str] | None = None
    ) -> OperatorProcess:
        """The operator, as the chart runs it, with its ServiceAccount's token, watching `namespaces` (never
        the whole cluster: other tests' jobs are not its to touch). Not started."""
        token = service_account_token(self.core, self.release_ns, self.service_account)
        kubeconfig = token_kubeconfig(self.admin_kubeconfig, token, self.workdir / "operator.kubeconfig")
        leader = self.operator_env().get("DTJOB_LEASE_NAME") is not None
        return OperatorProcess(
            kubeconfig, namespaces[0], log_path, env={**self.operator_env(), **(env or {})},
            leader_elect=leader, extra_namespaces=namespaces[1:],
        )  # fmt: skip

    def uninstall(self) -> None:
        for kind, name in reversed(self.cluster_scoped):
            if kind in POLICY_KINDS:
                subprocess.run(
                    ["kubectl", "--kubeconfig", self.admin_kubeconfig, "delete", "--ignore-not-found",
                     kind.lower(), name], capture_output=True, timeout=60,
                )  # fmt: skip
                continue
            delete = (
                self.rbac.delete_cluster_role_binding
                if kind == "ClusterRoleBinding"
                else self.rbac.delete_cluster_role
            )
            try:
                delete(name)
            except ApiException as err:
                if err.status != 404:
                    raise
        for namespace in self._namespaces:
            try:
                self.core.delete_namespace(namespace, propagation_policy="Background")
            except ApiException as err:
                if err.status != 404:
                    raise

    def _create_namespace(self, name: str) -> None:
        if name in self._namespaces:
            return
        meta = client.V1ObjectMeta(name=name, labels={"dtjob.io/test": "true"})
        try:
            self.core.create_namespace(client.V1Namespace(metadata=meta))
        except ApiException as err:
            if err.status != 409:
                raise
        self._namespaces.append(name)


def _operator_policy(doc: Json) -> bool:
    return doc["kind"] in POLICY_KINDS and str(doc["metadata"]["name"]).endswith(OPERATOR_POLICY_SUFFIX)


@contextmanager
def tenant_cluster(
    admin_kubeconfig: str, api_client: client.ApiClient, helm: str, workdir: Path, *sets: str
) -> Iterator[TenantCluster]:
    cluster = TenantCluster(admin_kubeconfig, api_client, helm, workdir)
    try:
        cluster.install(*sets)
        yield cluster
    finally:
        cluster.uninstall()
