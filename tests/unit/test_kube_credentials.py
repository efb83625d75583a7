"""The operator's own reading of where the API server is and who it is to it (dtjob.kube.credentials): the
kubeconfig shapes kubectl reads, the pod's ServiceAccount, and the operator's process free of the official
client's package."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from dtjob.kube import credentials as creds
from dtjob.kube.credentials import (
    CredentialsError,
    from_kubeconfig,
    in_cluster_credentials,
    kubeconfig_credentials,
    load_credentials,
)


def kubeconfig(cluster: dict[str, Any], user: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
    context: dict[str, Any] = {"cluster": "c", "user": "u", **({"namespace": namespace} if namespace else {})}
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": "ctx",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "ctx", "context": context}],
    }  # fmt: skip


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(doc))
    return path


def test_relative_certificate_paths_are_read_from_the_kubeconfigs_folder(tmp_path: Path) -> None:
    (tmp_path / "pki").mkdir()
    doc = kubeconfig(
        {"server": "https://127.0.0.1:6443/", "certificate-authority": "pki/ca.crt"},
        {"client-certificate": "pki/admin.crt", "client-key": "/abs/admin.key"},
        namespace="ml",
    )
    found = kubeconfig_credentials({"KUBECONFIG": str(write(tmp_path / "config", doc))})
    assert found.server == "https://127.0.0.1:6443"
    assert found.ca_file == str(tmp_path / "pki/ca.crt")
    assert (found.cert_file, found.key_file) == (str(tmp_path / "pki/admin.crt"), "/abs/admin.key")
    assert found.authorization() is None and found.namespace == "ml"


def test_inline_certificates_are_written_to_files_only_the_user_can_read(tmp_path: Path) -> None:
    pem = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    encoded = base64.b64encode(pem).decode()
    doc = kubeconfig(
        {"server": "https://k", "certificate-authority-data": encoded},
        {"client-certificate-data": encoded, "client-key-data": base64.b64encode(b"key").decode()},
    )
    found = from_kubeconfig([(tmp_path / "config", doc)])
    assert found.ca_data == pem.decode()
    assert found.cert_file is not None and found.key_file is not None
    assert Path(found.cert_file).read_bytes() == pem and Path(found.key_file).read_bytes() == b"key"
    assert Path(found.key_file).stat().st_mode & 0o077 == 0


def test_a_token_file_is_read_again_once_it_may_have_rotated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    found = from_kubeconfig(
        [(tmp_path / "config", kubeconfig({"server": "https://k"}, {"tokenFile": "token"}))]
    )
    clock = [1000.0]
    monkeypatch.setattr("dtjob.kube.credentials.time.monotonic", lambda: clock[0])
    assert found.authorization() == "Bearer first"
    token.write_text("second\n")
    clock[0] += creds.TOKEN_REREAD_S - 1
    assert found.authorization() == "Bearer first"
    clock[0] += 1
    assert found.authorization() == "Bearer second"


def test_several_kubeconfig_files_merge_as_kubectl_merges_them(tmp_path: Path) -> None:
    first = {
        "current-context": "ctx",
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
    }
    second = kubeconfig({"server": "https://second"}, {"token": "t2", "username": "a", "password": "b"})
    second["current-context"] = "other"
    paths = os.pathsep.join(str(write(tmp_path / n, d)) for n, d in (("a", first), ("b", second)))
    found = kubeconfig_credentials({"KUBECONFIG": paths + os.pathsep + str(tmp_path / "missing")})
    assert found.server == "https://second" and found.authorization() == "Bearer t2"
    assert found.basic_auth == ("a", "b")


def test_basic_auth_when_there_is_no_token(tmp_path: Path) -> None:
    doc = kubeconfig(
        {"server": "https://k", "insecure-skip-tls-verify": True}, {"username": "a", "password": "b"}
    )
    found = from_kubeconfig([(tmp_path / "config", doc)])
    assert found.insecure and found.authorization() == "Basic " + base64.b64encode(b"a:b").decode()


def test_an_exec_plugins_token_is_asked_for_again_only_near_its_expiry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = tmp_path / "calls"
    plugin = tmp_path / "plugin"
    plugin.write_text(
        textwrap.dedent(f"""\
        #!{sys.executable}
        import json, os, sys
        asked = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
        with open({str(calls)!r}, "a") as out:
            out.write(asked["kind"] + " " + os.environ["TENANT"] + " " + sys.argv[1] + "\\n")
        print(json.dumps({{"kind": "ExecCredential", "status": {{
            "token": "tok", "expirationTimestamp": "2030-01-01T00:00:00Z"}}}}))
        """)
    )
    plugin.chmod(0o755)
    user = {"exec": {
        "apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin), "args": ["--x"],
        "env": [{"name": "TENANT", "value": "t1"}],
    }}  # fmt: skip
    found = from_kubeconfig([(tmp_path / "config", kubeconfig({"server": "https://k"}, user))])
    assert found.authorization() == "Bearer tok" and found.authorization() == "Bearer tok"
    assert calls.read_text().splitlines() == ["ExecCredential t1 --x"]
    expiry = datetime(2030, 1, 1, tzinfo=UTC)
    monkeypatch.setattr(
        "dtjob.kube.credentials.time.time", lambda: expiry.timestamp() - creds.EXEC_REFRESH_MARGIN_S + 1
    )
    assert found.authorization() == "Bearer tok"
    assert len(calls.read_text().splitlines()) == 2


def test_an_exec_plugin_that_fails_says_which(tmp_path: Path) -> None:
    user = {"exec": {"command": str(tmp_path / "absent")}}
    found = from_kubeconfig([(tmp_path / "config", kubeconfig({"server": "https://k"}, user))])
    with pytest.raises(CredentialsError, match=r"exec plugin .*absent"):
        found.authorization()


def test_in_a_pod_the_service_account_is_used(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("sa-token")
    (tmp_path / "namespace").write_text("dtjob-system")
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    found = in_cluster_credentials(env, tmp_path)
    assert found is not None and found.server == "https://[fd00::1]:443"
    assert found.ca_file == str(tmp_path / "ca.crt") and found.namespace == "dtjob-system"
    assert found.authorization() == "Bearer sa-token"
    assert in_cluster_credentials({}, tmp_path) is None  # not in a pod: the kubeconfig is read


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ({}, "no current-context"),
        (kubeconfig({"server": "https://k"}, {}) | {"current-context": "gone"}, "no context named 'gone'"),
        (kubeconfig({}, {}), "cluster 'c' has no server"),
    ],
)
def test_an_unusable_kubeconfig_is_named_with_what_it_lacks(
    tmp_path: Path, doc: dict[str, Any], says: str
) -> None:
    path = write(tmp_path / "config", doc)
    with pytest.raises(CredentialsError, match=f"{path}.*{says}"):
        load_credentials({"KUBECONFIG": str(path)})
    with pytest.raises(CredentialsError, match="no kubeconfig at"):
        load_credentials({"KUBECONFIG": str(tmp_path / "missing")})


def test_the_operators_process_runs_without_the_official_clients_package() -> None:
    """What `dtjob operator` loads before kopf runs, with that package hidden as the command hides it: an
    operator module that imported it would fail here (kopf, which would load it when it can, loads none)."""
    script = textwrap.dedent("""\
        import json, sys
        sys.modules.setdefault("kubernetes", None)
        import kopf
        import dtjob.runtime.handlers
        from dtjob.runtime import metrics_server
        from dtjob.cli import operator
        loaded = sorted(m for m in sys.modules if m.split(".")[0] == "kubernetes" and sys.modules[m])
        print(json.dumps({"loaded": loaded}))
        """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    found = json.loads(done.stdout)
    assert found["loaded"] == [], found
