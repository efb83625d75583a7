"""A real Kueue (sigs.k8s.io/kueue's manager, built by hack/build-kueue.sh) next to the local control plane.

Everything on loopback: Kueue's webhook server listens on 127.0.0.1, and the API server reaches it through
webhook configurations and CRD conversion webhooks that name `https://127.0.0.1:<port>/...`. Kueue's own
certificate management mints a certificate for its Service DNS name only, which does not match that URL; so
its Secret is filled in advance with a CA and a certificate for both the DNS name and 127.0.0.1, which it
keeps (they are valid) and injects as CA bundle; the files the webhook server reads are written where a
pod would have the Secret mounted. (With the certificate management off, Kueue v0.15 reads its metrics
certificate from a fixed /etc path.) Only the `pod` integration is enabled, and Kueue's pod webhooks see
only the namespaces `namespace_labels` select, so nothing else that shares the control plane is gated, or
refused while Kueue is down.

Two releases run: the pinned one (KUEUE_VERSION, whose Kubernetes libraries match the control plane's) and
the newest the Go module proxy serves (KUEUE_NEWEST_VERSION), with kueue.x-k8s.io/v1beta1 no longer served
by its CRDs, as from Kueue v0.20 on. The tests speak v1beta2 to both (served since v0.15).
"""

from __future__ import annotations

import base64
import copy
import datetime
import ipaddress
import json
import os
import ssl
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from testbed.cache import cache_root
from testbed.kube_wait import wait_for
from testbed.operator_harness import free_port, kubectl, terminate

# The Kueue CRDs whose versions (v1beta1 and v1beta2) convert through Kueue's /convert webhook.
GROUP = "kueue.x-k8s.io"
# The version the tests write Kueue's objects in, as (group, version) for the typed client's custom calls.
KUEUE = (GROUP, "v1beta2")
API_VERSION = "/".join(KUEUE)
CONVERTED = ("localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters")
# The webhooks kept from Kueue's manifest: those for pods and for Kueue's own kinds. The others are for
# integrations left disabled; the manager serves no path for them, and a Fail policy would refuse every Job.
KEPT_PATHS = ("/mutate--v1-pod", "/validate--v1-pod", "-kueue-x-k8s-io-")
NAMESPACE = "kueue-system"
# Kueue's certificate management (internal, the default) keeps its certificates in this Secret, checks the
# server certificate against this DNS name, and injects the CA into these webhook configurations.
SECRET_NAME = "kueue-webhook-server-cert"
SERVICE_DNS_NAME = f"kueue-webhook-service.{NAMESPACE}.svc"
CA_NAME = "kueue-ca"
WEBHOOK_CONFIG_NAMES = {
    "MutatingWebhookConfiguration": "kueue-mutating-webhook-configuration",
    "ValidatingWebhookConfiguration": "kueue-validating-webhook-configuration",
}


@dataclass(frozen=True)
class KueueRelease:
    """A Kueue release the tests run, and whether its CRDs still serve kueue.x-k8s.io/v1beta1."""

    version: str
    serves_v1beta1: bool = True

    def __str__(self) -> str:
        return self.version if self.serves_v1beta1 else f"{self.version}-v1beta2-only"

    @property
    def names_prebuilt_in_annotation(self) -> bool:
        """MultiKueue names a copy's Workload in an annotation, not a label: from v0.18 (its
        WorkloadIdentifierAnnotations gate, on by default)."""
        major, minor = (int(part) for part in self.version.lstrip("v").split(".")[:2])
        return (major, minor) >= (0, 18)


def releases() -> tuple[KueueRelease, ...]:
    """The pinned release, and the newest one with v1beta1 unserved (as Kueue v0.20 does)."""
    pinned = os.environ.get("KUEUE_VERSION") or _pinned("KUEUE_VERSION")
    newest = os.environ.get("KUEUE_NEWEST_VERSION") or _pinned("KUEUE_NEWEST_VERSION")
    return KueueRelease(pinned), KueueRelease(newest, serves_v1beta1=False)


def kueue_dir(release: KueueRelease) -> Path:
    """Where hack/build-kueue.sh put the manager, its CRDs and its webhook manifest."""
    return cache_root() / "bin" / f"kueue-{release.version}"


def _pinned(key: str) -> str:
    env = Path(__file__).resolve().parents[1] / "hack" / "versions.env"
    for line in env.read_text().splitlines():
        if line.startswith(f"{key}="):
            return line.split("=", 1)[1].strip()
    raise KeyError(key)


def certificates(host: str = "127.0.0.1") -> dict[str, bytes]:
    """The Secret Kueue's certificate management reads, filled in advance: a CA (named as Kueue names its own)
    and a server certificate signed by it for Kueue's Service DNS name and for `host`. Valid for a year, past
    the 90 days ahead that certificate management checks, so it keeps them instead of minting its own."""
    now = datetime.datetime.now(datetime.UTC)
    begin, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=365)
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_NAME)])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(begin)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(CA_NAME)]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, True, False, False, True, False, False, False), critical=True
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    sans = [x509.DNSName(SERVICE_DNS_NAME), x509.IPAddress(ipaddress.ip_address(host))]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, SERVICE_DNS_NAME)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(begin)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(sans), False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
        .sign(ca_key, hashes.SHA256())
    )

    def pem_key(k: rsa.RSAPrivateKey) -> bytes:  # PKCS #1: the only form its certificate management parses
        return k.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )

    return {
        "ca.crt": ca.public_bytes(serialization.Encoding.PEM),
        "ca.key": pem_key(ca_key),
        "tls.crt": cert.public_bytes(serialization.Encoding.PEM),
        "tls.key": pem_key(key),
    }


def configuration(
    webhook_port: int, health_port: int, cert_dir: Path, selector: dict[str, str]
) -> dict[str, Any]:
    """Kueue's Configuration: the pod integration on, for the selected namespaces only, on loopback."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": True},
        "manageJobsWithoutQueueName": False,
        "managedJobsNamespaceSelector": {"matchLabels": selector},
        "integrations": {"frameworks": ["pod"]},
    }


def webhook_configurations(
    manifest: str, url: str, ca: bytes, selector: dict[str, str]
) -> list[dict[str, Any]]:
    """Kueue's Mutating/ValidatingWebhookConfigurations, pointed at `url`, narrowed to what the tests use."""
    bundle = _b64(ca)
    out = []
    for doc in yaml.safe_load_all(manifest):
        if not doc:
            continue
        config = copy.deepcopy(doc)
        config["metadata"] = {"name": WEBHOOK_CONFIG_NAMES[doc["kind"]]}
        hooks = []
        for hook in doc.get("webhooks") or []:
            path = hook["clientConfig"]["service"]["path"]
            if not any(k in path for k in KEPT_PATHS):
                continue
            hook = copy.deepcopy(hook)
            hook["clientConfig"] = {"url": f"{url}{path}", "caBundle": bundle}
            if path.endswith("-v1-pod"):
                hook["namespaceSelector"] = {"matchLabels": selector}
            hooks.append(hook)
        config["webhooks"] = hooks
        out.append(config)
    return out


def crds(crd_dir: Path, url: str, ca: bytes, serve_v1beta1: bool = True) -> list[dict[str, Any]]:
    """Kueue's CRDs; the multi-version ones convert through Kueue's webhook at `url`. Without
    `serve_v1beta1`, that version is no longer served (its objects stay readable in v1beta2)."""
    out = []
    for path in sorted(crd_dir.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        for version in crd["spec"]["versions"]:
            if version["name"] == "v1beta1" and not serve_v1beta1:
                version["served"] = False
        if crd["spec"]["names"]["plural"] in CONVERTED:
            crd["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {
                    "clientConfig": {"url": f"{url}/convert", "caBundle": _b64(ca)},
                    "conversionReviewVersions": ["v1"],
                },
            }
        out.append(crd)
    return out


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class KueueProcess:
    """Kueue's manager as a process of the test, with its CRDs and webhooks registered while it runs."""

    def __init__(
        self,
        kubeconfig: str,
        workdir: Path,
        namespace_labels: dict[str, str],
        extra_config: dict[str, Any] | None = None,
        release: KueueRelease | None = None,
    ) -> None:
        """`extra_config`: more of Kueue's Configuration (e.g. `multiKueue`), over configuration()'s;
        `release`: the pinned one unless named."""
        self.release = release or releases()[0]
        self.kubeconfig = kubeconfig
        self.extra_config = dict(extra_config or {})
        self.workdir = workdir
        self.selector = dict(namespace_labels)
        self.webhook_port = free_port()
        self.health_port = free_port()
        self.log_path = workdir / "kueue.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def _apply(self, objects: list[dict[str, Any]]) -> None:
        text = "\n---\n".join(json.dumps(o) for o in objects)
        done = kubectl(self.kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=text)
        assert done.returncode == 0, done.stderr

    def start(self) -> None:
        home = kueue_dir(self.release)
        binary = home / "kueue"
        assert binary.exists(), f"{binary} missing: run hack/build-kueue.sh"
        cert_dir = self.workdir / "kueue-certs"
        cert_dir.mkdir(parents=True, exist_ok=True)
        certs = certificates()
        self.ca = certs["ca.crt"]
        # What a pod would see of the Secret mounted as a volume: certificate management waits for the file.
        for name in ("tls.crt", "tls.key"):
            (cert_dir / name).write_bytes(certs[name])
        url = f"https://127.0.0.1:{self.webhook_port}"
        # Before the manager starts: its certificate management waits for the Secret's namespace, and
        # injects the CA into the CRDs and webhook configurations, which must exist.
        self._apply(crds(home / "crds", url, self.ca, self.release.serves_v1beta1))
        manifest = (home / "webhook-manifests.yaml").read_text()
        self._apply(webhook_configurations(manifest, url, self.ca, self.selector))
        secret = {
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": SECRET_NAME, "namespace": NAMESPACE},
            "data": {k: base64.b64encode(v).decode() for k, v in certs.items()},
        }  # fmt: skip
        self._apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}, secret])
        config_path = self.workdir / "kueue-config.yaml"
        config = configuration(self.webhook_port, self.health_port, cert_dir, self.selector)
        config.update(self.extra_config)
        config_path.write_text(yaml.safe_dump(config))
        env = dict(os.environ, KUBECONFIG=self.kubeconfig)
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            # The visibility API server authenticates through the in-cluster configuration, which a process
            # outside the cluster lacks; nothing here uses it.
            [str(binary), f"--config={config_path}", "--zap-log-level=3",
             "--feature-gates=VisibilityOnDemand=false"],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        wait_for(self._ready, timeout=120, what=f"Kueue ready (log: {self.log_path})")
        wait_for(self._serving, timeout=60, what="Kueue's webhook server serving on loopback")

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"kueue exited with {self.proc.returncode}:\n{self.log_tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/readyz", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def _serving(self) -> bool:
        context = ssl.create_default_context(cadata=self.ca.decode())
        try:
            urllib.request.urlopen(
                f"https://127.0.0.1:{self.webhook_port}/convert", timeout=2, context=context
            )
        except urllib.error.HTTPError:
            return True  # it answered over TLS with our certificate
        except OSError:
            return False
        return True

    def stop(self) -> None:
        # First, so that no pod is refused by a webhook whose server is gone.
        for kind, name in WEBHOOK_CONFIG_NAMES.items():
            kubectl(self.kubeconfig, "delete", kind.lower(), name, "--ignore-not-found")
        try:
            terminate(self.proc)
        finally:
            self._unhook_conversion()

    def _unhook_conversion(self) -> None:
        """Kueue's CRDs stay (objects of the test may still hold them), but without the conversion webhook
        whose server is gone: otherwise every namespace deletion in the cluster fails listing those kinds,
        and the pods of every later test's namespace stay, holding the simulated pool's GPUs."""
        patch = json.dumps({"spec": {"conversion": {"strategy": "None", "webhook": None}}})
        for plural in CONVERTED:
            done = kubectl(self.kubeconfig, "patch", "crd", f"{plural}.{GROUP}", "--type=merge", "-p", patch)
            assert done.returncode == 0 or "NotFound" in done.stderr, done.stderr

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])
