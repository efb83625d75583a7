"""The metrics server's TLS certificate: the files a Secret mounts (tls.crt and tls.key: the one the chart
makes for the metrics Service, or cert-manager's), or, without one (an operator run by hand), a self-signed
certificate made at start for this process only, which no scraper can verify. The chart's ServiceMonitor
verifies the mounted one against its CA before it sends the bearer token that authenticates the scraper."""

from __future__ import annotations

import ipaddress
import os
import socket
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
SELF_SIGNED_DAYS = 365


def mounted(cert_dir: Path) -> tuple[Path, Path]:
    """(certificate, key) under `cert_dir`; SystemExit naming what is missing."""
    cert, key = cert_dir / CERT_FILE, cert_dir / KEY_FILE
    missing = [str(p) for p in (cert, key) if not p.is_file()]
    if missing:
        raise SystemExit(f"dtjob operator: --metrics-cert-dir: no {' or '.join(missing)}")
    return cert, key


def self_signed(hostnames: list[str] | None = None) -> tuple[Path, Path]:
    """A fresh ECDSA P-256 key and a certificate for it, valid a year for this host's name, localhost and
    127.0.0.1 (and POD_IP when set), written to a private temporary directory."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    names = hostnames if hostnames is not None else [socket.gethostname(), "localhost"]
    addresses = ["127.0.0.1", *([os.environ["POD_IP"]] if os.environ.get("POD_IP") else [])]
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dtjob-operator-metrics")])
    now = datetime.now(UTC)
    alt_names: list[x509.GeneralName] = [x509.DNSName(n) for n in dict.fromkeys(names) if n]
    alt_names += [x509.IPAddress(ipaddress.ip_address(a)) for a in addresses]
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=SELF_SIGNED_DAYS))
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    directory = Path(tempfile.mkdtemp(prefix="dtjob-metrics-tls-"))
    cert_path, key_path = directory / CERT_FILE, directory / KEY_FILE
    key_bytes = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(key_bytes)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path
