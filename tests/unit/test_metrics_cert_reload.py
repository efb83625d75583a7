"""The metrics server presents the certificate its Secret holds now: cert-manager renews it in the Secret, the
kubelet swaps the mounted files, and the next handshakes get the new one, with no restart (read once at start,
the old one was served until it expired and every scrape failed). A pair caught half-written is not taken,
and the last one is served meanwhile."""

from __future__ import annotations

import shutil
import socket
import ssl
import time
from pathlib import Path

from dtjob.runtime import serving_cert
from dtjob.runtime.metrics_server import serve


def presented(port: int) -> bytes:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, context.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def pem_to_der(path: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(path.read_text())


def replace(mounted: Path, source: tuple[Path, Path]) -> None:
    """As the kubelet does: the new pair written beside, then moved over the old names."""
    for name, new in zip((serving_cert.CERT_FILE, serving_cert.KEY_FILE), source, strict=True):
        shutil.copy(new, mounted / f".{name}.new")
        (mounted / f".{name}.new").replace(mounted / name)


def test_a_renewed_certificate_is_presented_without_a_restart(tmp_path: Path) -> None:
    first, second = serving_cert.self_signed(["first.test"]), serving_cert.self_signed(["second.test"])
    mounted = tmp_path / "tls"
    mounted.mkdir()
    replace(mounted, first)
    cert, key = serving_cert.mounted(mounted)
    server = serve("127.0.0.1", 0, tls=(cert, key), cert_check_s=0.1)
    port = server.server_address[1]
    try:
        assert presented(port) == pem_to_der(first[0])
        # Caught half-written: the new certificate beside the old key (loaded into the serving context, the
        # certificate went in and the old key was dropped: every handshake failed), then no key at all.
        shutil.copy(second[0], mounted / serving_cert.CERT_FILE)
        time.sleep(0.5)
        assert presented(port) == pem_to_der(first[0]), "a pair that cannot load leaves the last one"
        (mounted / serving_cert.KEY_FILE).write_text("not a key")
        time.sleep(0.5)
        assert presented(port) == pem_to_der(first[0])
        replace(mounted, second)
        deadline = time.monotonic() + 10
        while presented(port) != pem_to_der(second[0]):
            assert time.monotonic() < deadline, "the renewed certificate was never presented"
            time.sleep(0.1)
    finally:
        server.shutdown()
