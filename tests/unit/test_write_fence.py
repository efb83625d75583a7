"""A leader's write, retries included, stays inside its hold on the Lease: every try starts while it holds it
and is cut off when the hold runs out, so nothing a deposed leader sent is still being tried once another
replica may lead. Against a stand-in API server on loopback that answers 503 or stalls, as an overloaded one
does; the client is the operator's own, connected as the operator connects."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import ClassVar

import pytest
from dtjob.fence import NotLeader
from dtjob.kube.client import KubeClient
from dtjob.kube.connect import connect

from tests.unit.local_server import serving


class Overloaded(BaseHTTPRequestHandler):
    """503 to the first `refusals` requests (then 201), each answer after `stall_s`; notes when each came."""

    protocol_version = "HTTP/1.1"
    arrivals: ClassVar[list[float]] = []
    refusals: ClassVar[int] = 0
    stall_s: ClassVar[float] = 0.0

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        Overloaded.arrivals.append(time.monotonic())
        time.sleep(Overloaded.stall_s)
        refused = len(Overloaded.arrivals) <= Overloaded.refusals
        body = json.dumps({"kind": "Status", "metadata": {"name": "p", "resourceVersion": "1"}}).encode()
        self.send_response(503 if refused else 201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_PATCH = do_PUT = do_DELETE = _answer

    def log_message(self, *_: object) -> None:
        pass


class Hold:
    """A leader's hold on the Lease that runs out `seconds` from now, as dtjob.runtime.lease.Leadership's."""

    def __init__(self, seconds: float) -> None:
        self.until = time.monotonic() + seconds

    def leading(self) -> bool:
        return time.monotonic() < self.until

    def check(self) -> None:
        self.remaining_s()

    def remaining_s(self) -> float:
        left = self.until - time.monotonic()
        if left <= 0:
            raise NotLeader("the hold ran out")
        return left


@pytest.fixture
def server() -> Iterator[str]:
    Overloaded.arrivals, Overloaded.refusals, Overloaded.stall_s = [], 0, 0.0
    with serving(Overloaded) as url:
        yield url


@pytest.fixture
def operator_client(
    server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[[Hold, int], KubeClient]:
    """The operator's client, connected as dtjob.kube.connect connects it (its retries and deadlines of 5 s
    to connect and 20 s to read), through a kubeconfig naming the stand-in."""
    kubeconfig = {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }  # fmt: skip
    (tmp_path / "kubeconfig").write_text(json.dumps(kubeconfig))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return lambda fence, retries: KubeClient(connect(5.0, 20.0, retries), fence)


POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"}}


Connected = Callable[[Hold, int], KubeClient]


def test_a_refused_write_is_tried_again_while_the_hold_lasts(operator_client: Connected) -> None:
    Overloaded.refusals = 2
    kube = operator_client(Hold(60), 3)
    assert kube.create(POD) is not None
    assert len(Overloaded.arrivals) == 3


def test_no_try_starts_after_the_hold_runs_out(operator_client: Connected) -> None:
    """Ten retries of 0.2 s, 0.4 s, 0.8 s... would go on for seconds: the hold ends after one."""
    Overloaded.refusals = 1000
    hold = Hold(1.0)
    kube = operator_client(hold, 10)
    started = time.monotonic()
    with pytest.raises(NotLeader):
        kube.create(POD)
    # What matters is the next line: no try starts after the hold. The call ends soon after the hold, where
    # the tries' own schedule would run on for minutes: 2 s of slack over the hold, for a busy machine.
    assert time.monotonic() - started < 1.0 + 2.0
    assert Overloaded.arrivals and max(Overloaded.arrivals) < hold.until, "a try after the hold ended"


def test_a_stalled_answer_is_cut_off_when_the_hold_runs_out(operator_client: Connected) -> None:
    """The read deadline is 20 s; the hold has one left: the write ends within it, not 20 s later."""
    # An answer 10 s late: ending at the hold (1 s) and ending at the answer stay far apart however busy the
    # machine is.
    Overloaded.stall_s = 10.0
    hold = Hold(1.0)
    kube = operator_client(hold, 3)
    started = time.monotonic()
    with pytest.raises(Exception):  # noqa: B017  the read timed out, then the hold had run out
        kube.delete("Pod", "ns", "p", uid="u-1")
    assert time.monotonic() - started < 1.0 + 4.0
    assert max(Overloaded.arrivals) < hold.until
