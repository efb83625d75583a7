"""The /metrics server: plain HTTP, or HTTPS with every request through the access guard
(dtjob.runtime.metrics_access). It serves the one registry of dtjob.metrics."""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from dtjob.config import load_config
from dtjob.kube.access_reviews import AccessReviews
from dtjob.kube.connect import connect
from dtjob.metrics import REGISTRY
from dtjob.runtime import serving_cert
from dtjob.runtime.metrics_access import MetricsGuard, metrics_path_only

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
# A client that connects and then says nothing is dropped after this long, so it holds one thread at most.
CLIENT_TIMEOUT_SECONDS = 10.0
# How often the mounted certificate is looked at: cert-manager renews it in the Secret, the kubelet swaps the
# mounted files, and the next handshakes present the new one (no restart, no scrape lost to an expired one).
CERT_CHECK_SECONDS = 60.0


class _QuietHandler(WSGIRequestHandler):
    timeout = CLIENT_TIMEOUT_SECONDS

    def log_message(self, format: str, *args: Any) -> None:
        """No line per scrape."""


def serve(
    address: str,
    port: int,
    guard: Callable[[WsgiApp], WsgiApp] | None = None,
    tls: tuple[Path, Path] | None = None,
    cert_check_s: float = CERT_CHECK_SECONDS,
) -> WSGIServer:
    """Serve /metrics (that path only) from REGISTRY on a daemon thread: plain HTTP, or with `tls`
    (certificate, key) HTTPS and every request through `guard` (dtjob.runtime.metrics_access)."""
    app: WsgiApp = make_wsgi_app(REGISTRY)
    app = guard(app) if guard is not None else metrics_path_only(app)

    certificate = ServingCertificate(*tls) if tls is not None else None

    class Server(ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in address else socket.AF_INET

        def get_request(self) -> tuple[socket.socket, Any]:
            """Each connection under the context of the certificate current when it came. The handshake runs
            in the request's thread (on its first read), not in the accepting one, so a client that never
            finishes it cannot stop the others from being served."""
            connection, peer = super().get_request()
            if certificate is None:
                return connection, peer
            try:
                wrapped = certificate.context.wrap_socket(
                    connection, server_side=True, do_handshake_on_connect=False
                )
            except (OSError, ValueError) as err:  # an OSError is what the serving loop skips a client on
                connection.close()
                raise OSError(f"TLS wrap of a connection from {peer}: {err}") from err
            return wrapped, peer

    server = make_server(address, port, app, Server, handler_class=_QuietHandler)
    if certificate is not None:
        threading.Thread(
            target=certificate.follow, args=(cert_check_s,), name="metrics-cert", daemon=True
        ).start()
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server


class ServingCertificate:
    """The TLS context presenting a certificate and key, made anew when their files change. A context is never
    loaded twice: one whose new pair failed to load (a key not matching its certificate) has already dropped
    its old key, and a handshake on another thread could meet it half-changed."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.cert, self.key = cert, key
        self.seen = self._stamp()
        self.context = self._load()

    def _load(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(str(self.cert), str(self.key))
        return context

    def _stamp(self) -> tuple[float, ...]:
        """The files' change times, through the mount's links (the kubelet swaps the link, not the files)."""
        return tuple(p.stat().st_mtime for p in (self.cert, self.key))

    def reload_if_changed(self) -> bool:
        """Whether the files changed and the context took them; a pair it cannot load (a renewal caught
        half-written) leaves the one it had, and is tried again at the next look."""
        try:
            stamp = self._stamp()
            if stamp == self.seen:
                return False
            context = self._load()
        except (OSError, ssl.SSLError) as err:
            logging.getLogger(__name__).warning(
                "metrics certificate not reloaded (keeping the last): %s", err
            )
            return False
        self.context, self.seen = context, stamp
        logging.getLogger(__name__).info("metrics certificate reloaded from %s", self.cert)
        return True

    def follow(self, every_s: float = CERT_CHECK_SECONDS) -> None:
        while True:
            time.sleep(every_s)
            self.reload_if_changed()


def start(address: str, port: int, secure: bool, cert_dir: Path | None) -> None:
    """The /metrics server: plain, or HTTPS with every request's token and access reviewed by the API
    server (dtjob.runtime.metrics_access)."""
    log = logging.getLogger(__name__)
    if not secure:
        serve(address, port)
        log.info("serving metrics on http://%s:%d/metrics (no authentication)", address, port)
        return
    config = load_config()
    api = connect(config.kube_connect_timeout_seconds, config.kube_timeout_seconds, 0)
    reviews = AccessReviews(api)
    guard = MetricsGuard(reviews.authenticate, reviews.may)
    tls = serving_cert.mounted(cert_dir) if cert_dir is not None else serving_cert.self_signed()
    serve(address, port, guard=guard.wrap, tls=tls)
    made = f"certificate from {cert_dir}" if cert_dir is not None else "a self-signed certificate"
    log.info(
        "serving metrics on https://%s:%d/metrics (%s; callers need get on /metrics)", address, port, made
    )
