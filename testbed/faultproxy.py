"""A fault-injecting proxy between a client (the operator) and a real Kubernetes API server, on 127.0.0.1.

The client gets a kubeconfig that points at the proxy. The proxy terminates TLS with a certificate of its own
(a CA it makes at start) and forwards every request to the real API server with the credentials of the
kubeconfig it was made from: the client certificate and key, or the bearer token. Responses, watch streams
included, are copied through as they arrive.

Rules, added and removed while the client runs, pick requests by Kubernetes verb, resource, subresource and
namespace, and answer them with a fault instead:
- ERROR: an HTTP status with a Kubernetes Status body (409 on status patches or creates, 500 on anything);
- HANG: hold the request without an answer until released (the client's own timeout must end it);
- DROP: cut the connection without an answer;
- GONE: a watch gets the API server's in-stream "410 Expired" error, so the client re-lists; any other
  request gets HTTP 410.
A rule with `after=True` forwards the request first and then answers with the fault, so the write happened
but the client never hears of it. Watches in flight can be ended cleanly (the client reconnects where it left
off) or cut, with `end_watches`.

    with FaultProxy(kubeconfig, workdir) as proxy:
        OperatorProcess(str(proxy.kubeconfig), ...)
        proxy.add(Rule(Fault.ERROR, status=409, verbs={"patch"}, subresource="status", times=3))
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import enum
import ipaddress
import json
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp
import yaml
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
     "transfer-encoding", "upgrade", "host", "content-length"}
)  # fmt: skip
REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    410: "Expired",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class Fault(enum.StrEnum):
    ERROR = "error"
    HANG = "hang"
    DROP = "drop"
    GONE = "gone"


@dataclass(frozen=True)
class Request:
    """A request as the API server's authorizer sees it: verb, resource, subresource, namespace, name."""

    method: str
    path: str
    verb: str
    resource: str = ""
    subresource: str = ""
    namespace: str | None = None
    name: str | None = None

    @property
    def watch(self) -> bool:
        return self.verb == "watch"


def parse_request(method: str, path: str, query: Mapping[str, str]) -> Request:
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"]:
        rest = parts[2:]
    elif parts[:1] == ["apis"]:
        rest = parts[3:]
    else:  # /healthz, /version, discovery...
        return Request(method, path, method.lower())
    watch = query.get("watch") in ("true", "1")
    if rest[:1] == ["watch"]:
        watch, rest = True, rest[1:]
    namespace = None
    namespace_subresource = len(rest) == 3 and rest[2] in ("status", "finalize")
    if len(rest) >= 3 and rest[0] == "namespaces" and not namespace_subresource:
        namespace, rest = rest[1], rest[2:]
    resource = rest[0] if rest else ""
    name = rest[1] if len(rest) > 1 else None
    subresource = "/".join(rest[2:])
    verb = {
        "GET": "watch" if watch else ("get" if name else "list"),
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if name else "deletecollection",
    }.get(method, method.lower())
    return Request(method, path, verb, resource, subresource, namespace, name)


@dataclass
class Rule:
    """Which requests get which fault. Empty sets and None match anything; `subresource=""` matches only the
    main resource. `every`: the fault hits every n-th matching request and lets the others through.
    `times`: how many faults it injects before it retires itself (None: until removed)."""

    fault: Fault
    status: int = 500
    verbs: AbstractSet[str] = frozenset()
    resources: AbstractSet[str] = frozenset()
    subresource: str | None = None
    namespace: str | None = None
    names: AbstractSet[str] = frozenset()
    every: int = 1
    times: int | None = None
    after: bool = False
    seen: int = 0  # matching requests
    hits: int = 0  # faults injected

    def __post_init__(self) -> None:
        self.verbs = frozenset(self.verbs)
        self.resources = frozenset(self.resources)
        self.names = frozenset(self.names)

    def matches(self, request: Request) -> bool:
        return (
            (not self.verbs or request.verb in self.verbs)
            and (not self.resources or request.resource in self.resources)
            and (self.subresource is None or request.subresource == self.subresource)
            and (self.namespace is None or request.namespace == self.namespace)
            and (not self.names or request.name in self.names)
        )


@dataclass(frozen=True)
class Record:
    """One request the proxy saw, and how it was answered (fault None: forwarded as is)."""

    request: Request
    status: int | None
    fault: Fault | None
    at: float


@dataclass
class Upstream:
    """The real API server and the credentials the kubeconfig's current context uses for it."""

    server: str
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    token: str | None = None
    insecure: bool = False
    user: dict[str, Any] = field(default_factory=dict)  # the kubeconfig's user entry, for the client's copy

    @classmethod
    def from_kubeconfig(cls, path: Path, workdir: Path) -> Upstream:
        config = yaml.safe_load(path.read_text())
        context_name = config["current-context"]
        context = _named(config["contexts"], context_name)["context"]
        cluster = _named(config["clusters"], context["cluster"])["cluster"]
        user = dict(_named(config.get("users") or [], context.get("user", ""), default={"user": {}})["user"])

        def file_of(entry: Mapping[str, Any], key: str, stem: str) -> str | None:
            if entry.get(f"{key}-data"):
                target = workdir / f"upstream-{stem}"
                target.write_bytes(base64.b64decode(entry[f"{key}-data"]))
                target.chmod(0o600)
                return str(target)
            if entry.get(key):
                return str((path.parent / entry[key]).resolve())
            return None

        for key in ("client-certificate", "client-key", "token-file"):
            if user.get(key):
                user[key] = str((path.parent / user[key]).resolve())
        token = user.get("token")
        if not token and user.get("token-file"):
            token = Path(user["token-file"]).read_text().strip()
        return cls(
            server=str(cluster["server"]).rstrip("/"),
            ca_file=file_of(cluster, "certificate-authority", "ca.crt"),
            cert_file=file_of(user, "client-certificate", "client.crt"),
            key_file=file_of(user, "client-key", "client.key"),
            token=token,
            insecure=bool(cluster.get("insecure-skip-tls-verify")),
            user=user,
        )

    def ssl_context(self) -> ssl.SSLContext | bool:
        if not self.server.startswith("https://"):
            return False
        context = ssl.create_default_context(cafile=self.ca_file)
        if self.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.cert_file and self.key_file:
            context.load_cert_chain(self.cert_file, self.key_file)
        return context


def _named(items: Iterable[Mapping[str, Any]], name: str, default: Any = None) -> Any:
    found = next((item for item in items if item.get("name") == name), default)
    if found is None:
        raise ValueError(f"kubeconfig names {name!r} but does not define it")
    return found


@dataclass(eq=False)
class _Flight:
    """A request being answered: watches can be ended, hung requests released."""

    request: Request
    http: web.BaseRequest
    release: asyncio.Event = field(default_factory=asyncio.Event)
    copy: asyncio.Task[None] | None = None
    ending: str | None = None  # "end" or "cut" once end_watches() picked it


class FaultProxy:
    """The proxy, served from a thread of its own so that tests drive it from synchronous code."""

    def __init__(self, kubeconfig: str | Path, workdir: Path) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.upstream = Upstream.from_kubeconfig(Path(kubeconfig), workdir)
        self.kubeconfig = workdir / "fault-proxy.kubeconfig"
        self.port = 0
        self.records: list[Record] = []
        self._rules: list[Rule] = []
        self._lock = threading.Lock()
        self._flights: set[_Flight] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    # --- life cycle ----------------------------------------------------------------------------------

    def __enter__(self) -> FaultProxy:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        ca_pem, server_context = _serving_context(self.workdir)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self._thread.start()
        self._call(self._serve(server_context))
        self._write_kubeconfig(ca_pem)

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        with contextlib.suppress(Exception):
            self._call(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
        self._loop = self._thread = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def _write_kubeconfig(self, ca_pem: bytes) -> None:
        _write(self.kubeconfig, _kubeconfig(self.url, ca_pem, self.upstream.user))

    # --- rules ---------------------------------------------------------------------------------------

    def add(self, rule: Rule) -> Rule:
        with self._lock:
            self._rules.append(rule)
        return rule

    def remove(self, rule: Rule) -> None:
        with self._lock:
            if rule in self._rules:
                self._rules.remove(rule)

    def clear(self) -> None:
        """No more faults; hung requests are let go (their connections cut)."""
        with self._lock:
            self._rules.clear()
        self.release_hung()

    def release_hung(self) -> int:
        """Cut the connections of the requests a HANG rule holds; returns how many."""
        return int(self._call(self._release_hung()))

    def end_watches(self, resources: Iterable[str] = (), cut: bool = False) -> int:
        """End the watch streams in flight (of these resources; all when empty): cleanly, as the API server
        ends one at its timeout, or `cut` mid-stream as a network failure does. Returns how many."""
        return int(self._call(self._end_watches(frozenset(resources), cut)))

    def seen(self, predicate: Callable[[Record], bool]) -> list[Record]:
        with self._lock:
            return [r for r in self.records if predicate(r)]

    def injected(self, fault: Fault | None = None) -> list[Record]:
        return self.seen(lambda r: r.fault is not None and (fault is None or r.fault is fault))

    # --- serving -------------------------------------------------------------------------------------

    def _call(self, coroutine: Any) -> Any:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=60)

    async def _serve(self, server_context: ssl.SSLContext) -> None:
        # The upstream pool is unbounded: every watch holds a connection for minutes.
        connector = aiohttp.TCPConnector(ssl=self.upstream.ssl_context(), limit=0)
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=server_context)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def _shutdown(self) -> None:
        await self._release_hung()
        await self._end_watches(frozenset(), cut=True)
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _release_hung(self) -> int:
        hung = [f for f in self._flights if not f.release.is_set()]
        for flight in hung:
            flight.release.set()
        return len(hung)

    async def _end_watches(self, resources: frozenset[str], cut: bool) -> int:
        ended = 0
        for flight in list(self._flights):
            if not flight.request.watch or flight.copy is None or flight.ending is not None:
                continue
            if resources and flight.request.resource not in resources:
                continue
            flight.ending = "cut" if cut else "end"
            flight.copy.cancel()
            ended += 1
        return ended

    def _match(self, request: Request) -> Rule | None:
        """The first rule that faults this request (rules are tried in the order they were added)."""
        with self._lock:
            for rule in list(self._rules):
                if not rule.matches(request):
                    continue
                rule.seen += 1
                if rule.seen % rule.every:
                    continue
                rule.hits += 1
                if rule.times is not None and rule.hits >= rule.times:
                    self._rules.remove(rule)
                return rule
        return None

    def _record(self, request: Request, status: int | None, fault: Fault | None) -> None:
        with self._lock:
            self.records.append(Record(request, status, fault, time.monotonic()))

    async def _handle(self, http: web.Request) -> web.StreamResponse:
        request = parse_request(http.method, http.path, http.query)
        body = await http.read()
        rule = self._match(request)
        flight = _Flight(request, http)
        self._flights.add(flight)
        try:
            if rule is None:
                return await self._forward(flight, body)
            if rule.after:
                await self._forward_and_discard(flight, body)
            return await self._inject(flight, rule)
        finally:
            self._flights.discard(flight)

    async def _inject(self, flight: _Flight, rule: Rule) -> web.StreamResponse:
        request = flight.request
        if rule.fault is Fault.HANG:
            self._record(request, None, rule.fault)
            await flight.release.wait()
            return _cut(flight.http)
        if rule.fault is Fault.DROP:
            self._record(request, None, rule.fault)
            return _cut(flight.http)
        if rule.fault is Fault.GONE and request.watch:
            self._record(request, 200, rule.fault)
            expired = {"type": "ERROR", "object": _status_body(410, request, "too old resource version")}
            return web.Response(status=200, content_type="application/json", text=json.dumps(expired) + "\n")
        status = 410 if rule.fault is Fault.GONE else rule.status
        self._record(request, status, rule.fault)
        return web.json_response(_status_body(status, request), status=status)

    def _upstream_headers(self, http: web.BaseRequest) -> dict[str, str]:
        headers = {k: v for k, v in http.headers.items() if k.lower() not in HOP_BY_HOP}
        if self.upstream.token:
            headers["Authorization"] = f"Bearer {self.upstream.token}"
        return headers

    async def _open_upstream(self, flight: _Flight, body: bytes) -> aiohttp.ClientResponse | None:
        assert self._session is not None
        http = flight.http
        try:
            return await self._session.request(
                http.method,
                self.upstream.server + http.raw_path,
                headers=self._upstream_headers(http),
                data=body or None,
                # Only what the client sent: some clients send a body without a Content-Type, which the
                # API server reads as JSON and would refuse as aiohttp's default application/octet-stream.
                skip_auto_headers=("Content-Type", "User-Agent", "Accept", "Accept-Encoding"),
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            )
        except (aiohttp.ClientError, OSError):
            return None  # the API server is down: the client sees its connection cut, as it would

    async def _forward_and_discard(self, flight: _Flight, body: bytes) -> None:
        upstream = await self._open_upstream(flight, body)
        if upstream is not None:
            async with upstream:
                await upstream.read()

    async def _forward(self, flight: _Flight, body: bytes) -> web.StreamResponse:
        http = flight.http
        upstream = await self._open_upstream(flight, body)
        if upstream is None:
            self._record(flight.request, None, None)
            return _cut(http)
        async with upstream:
            self._record(flight.request, upstream.status, None)
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for key, value in upstream.headers.items():
                if key.lower() not in HOP_BY_HOP:
                    response.headers.add(key, value)
            if upstream.content_length is not None and not flight.request.watch:
                response.content_length = upstream.content_length
            try:
                await response.prepare(http)
                flight.copy = asyncio.ensure_future(_copy(upstream, response))
                await asyncio.wait({flight.copy})
                if flight.ending == "cut":
                    return _cut(http)
                if not flight.copy.cancelled() and flight.copy.exception() is not None:
                    return _cut(http)  # the upstream stream broke: so does the client's
                await response.write_eof()
            except (ConnectionResetError, aiohttp.ClientConnectionError):
                pass  # the client went away
            return response


async def _copy(upstream: aiohttp.ClientResponse, response: web.StreamResponse) -> None:
    async for chunk in upstream.content.iter_any():
        await response.write(chunk)


def _cut(http: web.BaseRequest) -> web.StreamResponse:
    if http.transport is not None:
        http.transport.abort()
    return web.Response(status=599)  # never sent: the connection is gone


def _status_body(code: int, request: Request, message: str | None = None) -> dict[str, Any]:
    reason = REASONS.get(code, "InternalError")
    if code == 409 and request.verb == "create":
        reason = "AlreadyExists"
    text = message or f"{reason}: injected by the test bed's fault proxy ({request.verb} {request.path})"
    details: dict[str, Any] = {"kind": request.resource}
    if request.name:
        details["name"] = request.name
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": text,
            "reason": reason, "details": details, "code": code}  # fmt: skip


def _serving_context(workdir: Path) -> tuple[bytes, ssl.SSLContext]:
    """A fresh CA and a certificate for 127.0.0.1 signed by it: the CA's PEM and the server's TLS context."""
    now = datetime.now(UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dtjob test bed fault proxy CA")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_pem = ca.public_bytes(serialization.Encoding.PEM)
    cert_file, key_file = workdir / "fault-proxy.crt", workdir / "fault-proxy.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM) + ca_pem)
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    key_file.chmod(0o600)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    return ca_pem, context


def _kubeconfig(server: str, ca_pem: bytes, user: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fault-proxy", "cluster": {
            "server": server, "certificate-authority-data": base64.b64encode(ca_pem).decode()}}],
        "users": [{"name": "fault-proxy", "user": dict(user)}],
        "contexts": [{"name": "fault-proxy", "context": {"cluster": "fault-proxy", "user": "fault-proxy"}}],
        "current-context": "fault-proxy",
    }  # fmt: skip


def _write(path: Path, config: Mapping[str, Any]) -> None:
    path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
    path.chmod(0o600)
