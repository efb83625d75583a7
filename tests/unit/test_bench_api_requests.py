"""bench.api_requests' pure parts: the counters it reads from the API server's metrics page, the line it
prints, and the kubeconfig it writes for the counted account (its real counting: tests/integration)."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml

from bench import api_requests
from bench.api_requests import Requests

SERIES = "apiserver_flowcontrol_dispatched_requests_total"
LEVEL = 'priority_level="bench-operator"'
PAGE = "\n".join([
    f"# TYPE {SERIES} counter",
    f'{SERIES}{{flow_schema="bench-operator-writes",{LEVEL}}} 40',
    f'{SERIES}{{flow_schema="bench-operator-reads",{LEVEL}}} 7',
    f'{SERIES}{{flow_schema="bench-operator-leases",{LEVEL}}} 3',
    f'{SERIES}{{flow_schema="exempt",priority_level="exempt"}} 90000',
    f'apiserver_flowcontrol_current_executing_requests{{flow_schema="bench-operator-writes",{LEVEL}}} 2',
])  # fmt: skip


def test_the_counters_are_the_accounts_schemas_and_nothing_else() -> None:
    assert api_requests.counted(PAGE) == Requests(writes=40, reads=7, leases=3)
    assert api_requests.counted("") == Requests(0, 0, 0)
    assert Requests(50, 9, 4) - Requests(40, 7, 3) == Requests(10, 2, 1)


def test_the_line_per_job() -> None:
    line = api_requests.per_job(Requests(writes=1540, reads=12, leases=30), 100)
    assert line == "15.40 writes, 0.12 reads per job (and 30 of its Lease)"
    assert api_requests.per_job(Requests(writes=900, reads=0), 100) == "9.00 writes, 0.00 reads per job"


def test_the_accounts_kubeconfig_stands_alone(tmp_path: Path) -> None:
    """The admin's server and CA (a file's read inline), the token as its only user."""
    ca = tmp_path / "ca.crt"
    ca.write_bytes(b"-----BEGIN CERTIFICATE-----\n")
    admin = {
        "current-context": "admin",
        "contexts": [{"name": "admin", "context": {"cluster": "local", "user": "admin"}}],
        "clusters": [
            {
                "name": "local",
                "cluster": {"server": "https://127.0.0.1:6443", "certificate-authority": str(ca)},
            }
        ],
        "users": [{"name": "admin", "user": {"client-key": "/secret/admin.key"}}],
    }
    (tmp_path / "admin.yaml").write_text(yaml.safe_dump(admin))
    written = api_requests.kubeconfig_as(str(tmp_path / "admin.yaml"), "t0ken")
    try:
        config = yaml.safe_load(written.read_text())
        cluster = config["clusters"][0]["cluster"]
        assert cluster["server"] == "https://127.0.0.1:6443" and "certificate-authority" not in cluster
        assert base64.b64decode(cluster["certificate-authority-data"]) == ca.read_bytes()
        assert config["users"] == [{"name": api_requests.IDENTITY, "user": {"token": "t0ken"}}]
        assert "admin.key" not in written.read_text()
    finally:
        written.unlink()
