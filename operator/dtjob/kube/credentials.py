"""Where the API server is and how to prove who we are to it: the pod's ServiceAccount, else the kubeconfig.

The operator reads these itself rather than through the official client's loaders: that client's package
brings about 15 MB of model classes into the process with it (kopf loads them too when it can import it), and
the operator never uses one. Read here: a kubeconfig's current context, its cluster's server and CA (file
or data; or TLS verification off), and its user's client certificate and key (file or data), token or
token file, basic auth, or exec credential plugin (kubelogin on AKS). Relative paths are relative to the
kubeconfig's own folder, and $KUBECONFIG may list several files, merged as kubectl merges them (the first of
each name, the first current-context).
"""

from __future__ import annotations

import atexit
import base64
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dtjob.timefmt import parse_time_or_none

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# A token file (the ServiceAccount's, projected and rotated by the kubelet) is read again after this long.
TOKEN_REREAD_S = 60.0
# An exec plugin's token is asked for again this long before the expiry it gave.
EXEC_REFRESH_MARGIN_S = 60.0
EXEC_TIMEOUT_S = 60.0

Json = dict[str, Any]


class CredentialsError(Exception):
    """No usable in-cluster ServiceAccount and no usable kubeconfig: says which file and what is missing."""


@dataclass(frozen=True)
class Credentials:
    """An API server and the means to call it. `token` is asked before each call (it may rotate)."""

    server: str
    ca_file: str | None = None
    ca_data: str | None = None  # PEM
    insecure: bool = False
    tls_server_name: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    token: Callable[[], str | None] = field(default=lambda: None, compare=False)
    basic_auth: tuple[str, str] | None = None
    namespace: str | None = None

    def authorization(self) -> str | None:
        """The Authorization header's value for the next call, if these credentials use one."""
        token = self.token()
        if token:
            return f"Bearer {token}"
        if self.basic_auth is not None:
            pair = ":".join(self.basic_auth).encode()
            return "Basic " + base64.b64encode(pair).decode()
        return None


def load_credentials(environ: Mapping[str, str] | None = None) -> Credentials:
    """The pod's ServiceAccount when running in a cluster, else the kubeconfig ($KUBECONFIG, then
    ~/.kube/config)."""
    env = os.environ if environ is None else environ
    in_cluster = in_cluster_credentials(env)
    if in_cluster is not None:
        return in_cluster
    return kubeconfig_credentials(env)


def in_cluster_credentials(env: Mapping[str, str], folder: Path = SERVICE_ACCOUNT_DIR) -> Credentials | None:
    """The ServiceAccount's token and CA, for the API server the kubelet names in the environment; None
    outside a pod."""
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    token_file = folder / "token"
    if not host or not port or not token_file.is_file():
        return None
    host = f"[{host}]" if ":" in host else host  # IPv6
    namespace_file = folder / "namespace"
    return Credentials(
        server=f"https://{host}:{port}",
        ca_file=str(folder / "ca.crt"),
        token=TokenFile(token_file),
        namespace=namespace_file.read_text().strip() if namespace_file.is_file() else None,
    )


def kubeconfig_credentials(env: Mapping[str, str]) -> Credentials:
    paths = [Path(p).expanduser() for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    paths = paths or [Path("~/.kube/config").expanduser()]
    docs = [(path, yaml.safe_load(path.read_text()) or {}) for path in paths if path.is_file()]
    if not docs:
        raise CredentialsError(f"not in a cluster, and no kubeconfig at {os.pathsep.join(map(str, paths))}")
    return from_kubeconfig(docs)


def from_kubeconfig(docs: list[tuple[Path, Json]]) -> Credentials:
    """Credentials of the current context of the merged kubeconfig files `docs` (path, parsed)."""
    where = ", ".join(str(path) for path, _ in docs)
    current = next((str(doc["current-context"]) for _, doc in docs if doc.get("current-context")), "")
    if not current:
        raise CredentialsError(f"{where}: no current-context")
    context, _ = _named(docs, "contexts", "context", current, where)
    cluster, cluster_dir = _named(docs, "clusters", "cluster", str(context.get("cluster") or ""), where)
    user, user_dir = _named(docs, "users", "user", str(context.get("user") or ""), where, required=False)
    server = str(cluster.get("server") or "")
    if not server:
        raise CredentialsError(f"{where}: cluster {context.get('cluster')!r} has no server")
    ca_data = cluster.get("certificate-authority-data")
    username, password = user.get("username"), user.get("password")
    return Credentials(
        server=server.rstrip("/"),
        ca_file=_path(cluster.get("certificate-authority"), cluster_dir),
        ca_data=base64.b64decode(ca_data).decode() if ca_data else None,
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        tls_server_name=cluster.get("tls-server-name") or None,
        cert_file=_path(user.get("client-certificate"), user_dir)
        or _data_file(user.get("client-certificate-data")),
        key_file=_path(user.get("client-key"), user_dir) or _data_file(user.get("client-key-data")),
        token=_token_source(user, user_dir),
        basic_auth=(str(username), str(password)) if username and password else None,
        namespace=context.get("namespace") or None,
    )


def _named(
    docs: list[tuple[Path, Json]], section: str, key: str, name: str, where: str, required: bool = True
) -> tuple[Json, Path]:
    """The first entry named `name` of `section` across the files, and the folder of the file it is in."""
    for path, doc in docs:
        for entry in doc.get(section) or ():
            if entry.get("name") == name:
                return dict(entry.get(key) or {}), path.parent
    if required:
        raise CredentialsError(f"{where}: no {key} named {name!r}")
    return {}, docs[0][0].parent


def _path(value: Any, folder: Path) -> str | None:
    if not value:
        return None
    path = Path(str(value)).expanduser()
    return str(path if path.is_absolute() else folder / path)


_data_dir: list[str] = []
_data_lock = threading.Lock()


def _data_file(data: Any) -> str | None:
    """A base64 `-data` field written to a file only this user can read (the TLS library reads certificates
    and keys from files), removed when the process exits."""
    if not data:
        return None
    with _data_lock:
        if not _data_dir:
            _data_dir.append(tempfile.mkdtemp(prefix="dtjob-kube-"))
            atexit.register(shutil.rmtree, _data_dir[0], True)
    fd, name = tempfile.mkstemp(dir=_data_dir[0])
    with os.fdopen(fd, "wb") as out:
        out.write(base64.b64decode(data))
    return name


def _token_source(user: Json, folder: Path) -> Callable[[], str | None]:
    if user.get("token"):
        token = str(user["token"])
        return lambda: token
    token_file = _path(user.get("tokenFile") or user.get("token-file"), folder)
    if token_file:
        return TokenFile(Path(token_file))
    if user.get("exec"):
        return ExecToken(dict(user["exec"]))
    return lambda: None


class TokenFile:
    """A token read from a file, and read again every TOKEN_REREAD_S (the kubelet rotates a projected one)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._token: str | None = None
        self._read_at = 0.0
        self._lock = threading.Lock()

    def __call__(self) -> str | None:
        with self._lock:
            now = time.monotonic()
            if self._token is None or now - self._read_at >= TOKEN_REREAD_S:
                self._token, self._read_at = self.path.read_text().strip(), now
            return self._token


class ExecToken:
    """A token from a client-go exec credential plugin (kubelogin on AKS), asked for again before it
    expires."""

    def __init__(self, spec: Json) -> None:
        self.spec = spec
        self._token: str | None = None
        self._expires_at: float | None = None
        self._lock = threading.Lock()

    def __call__(self) -> str | None:
        with self._lock:
            fresh = self._expires_at is None or time.time() < self._expires_at - EXEC_REFRESH_MARGIN_S
            if self._token is None or not fresh:
                self._token, self._expires_at = self._run()
            return self._token

    def _run(self) -> tuple[str, float | None]:
        command = [str(self.spec.get("command") or ""), *map(str, self.spec.get("args") or ())]
        env = dict(os.environ)
        env.update({str(e["name"]): str(e["value"]) for e in self.spec.get("env") or ()})
        request: Json = {"apiVersion": self.spec.get("apiVersion"), "kind": "ExecCredential", "spec": {}}
        env["KUBERNETES_EXEC_INFO"] = json.dumps(request)
        try:
            done = subprocess.run(
                command, env=env, capture_output=True, text=True, timeout=EXEC_TIMEOUT_S, check=True
            )
            status = json.loads(done.stdout).get("status") or {}
        except (OSError, subprocess.SubprocessError, ValueError) as err:
            raise CredentialsError(f"the kubeconfig's exec plugin {command[0]!r} failed: {err}") from err
        token = status.get("token")
        if not token:
            raise CredentialsError(f"the kubeconfig's exec plugin {command[0]!r} returned no token")
        expiry = parse_time_or_none(status.get("expirationTimestamp"))
        return str(token), expiry.timestamp() if expiry is not None else None
