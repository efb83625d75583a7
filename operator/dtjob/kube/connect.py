"""The connection to the API server: auth from the pod's ServiceAccount (or the kubeconfig), a deadline on
every call, bounded retries, and each call's latency and failure recorded (dtjob.metrics).

HTTP over urllib3 directly, with the operator's own credentials (dtjob.kube.credentials): every call is
already plain JSON (dtjob.kube.rest), so the official client's package would add only its import, about 15 MB
of the operator's memory."""

from __future__ import annotations

import ssl
import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

import urllib3
from urllib3.util.retry import Retry

from dtjob import metrics
from dtjob.kube import wire
from dtjob.kube.credentials import Credentials, load_credentials

# Answers worth another try: the API server's "try again" (429, with Retry-After) and its transient failures.
# Every write the operator makes is safe to repeat: creates of fixed names (409 means it exists), status
# patches guarded by resourceVersion (409 means retry from a fresh read), deletes (404 means gone).
RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})
USER_AGENT = "dtjob-operator"


class ApiClient:
    """Calls to one API server: `timeout` (connect, read) unless a call names its own, so that an API server
    that never answers cannot hold a reconcile's thread forever, and `retries` (urllib3's, or False: the
    first failure is raised, an answer returned as it is). Every call passes here, so here its latency and
    failure are recorded (dtjob.metrics), once for all call sites."""

    def __init__(
        self,
        credentials: Credentials,
        timeout: tuple[float, float],
        retries: Retry | bool,
        pool_size: int | None = None,
    ) -> None:
        self.credentials = credentials
        self.timeout = timeout
        self.retries = retries
        self.pool_size = pool_size
        self.pool = urllib3.PoolManager(
            num_pools=4,
            maxsize=pool_size or 4,  # one kept-alive connection per thread that calls: no handshake per call
            cert_reqs=ssl.CERT_NONE if credentials.insecure else ssl.CERT_REQUIRED,
            ca_certs=None if credentials.insecure else credentials.ca_file,
            ca_cert_data=None if credentials.insecure else credentials.ca_data,
            cert_file=credentials.cert_file,
            key_file=credentials.key_file,
            server_hostname=credentials.tls_server_name,
            assert_hostname=False if credentials.insecure else None,
        )

    def request(
        self,
        method: str,
        path: str,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout: tuple[float, float] | None = None,
    ) -> urllib3.BaseHTTPResponse:
        """`method` on `path` (`body` sent as JSON), the answer unread, whatever its status."""
        url = self.credentials.server + path + (f"?{urlencode(list(query))}" if query else "")
        sent = {"User-Agent": USER_AGENT, **(headers or {})}
        authorization = self.credentials.authorization()
        if authorization:
            sent["Authorization"] = authorization
        data = None if body is None else wire.dumps(body)
        connect_s, read_s = timeout or self.timeout
        start = time.perf_counter()
        try:
            response = self.pool.request(
                method, url, body=data, headers=sent, retries=self.retries, preload_content=False,
                timeout=urllib3.Timeout(connect=connect_s, read=read_s),
            )  # fmt: skip
        except Exception as error:
            metrics.api_call_done(method, url, time.perf_counter() - start, None, error)
            raise
        metrics.api_call_done(method, url, time.perf_counter() - start, response.status, None)
        return response


def connect(
    connect_timeout: float,
    read_timeout: float,
    retries: int,
    pool_size: int | None = None,
    credentials: Credentials | None = None,
) -> ApiClient:
    """A client for the in-cluster API server (or the kubeconfig's), with a deadline on every call and
    bounded retries: `retries` for connection failures and 429/5xx answers, one for a read that timed out
    (so a hung call ends after twice the read timeout), backing off 0.2 s, 0.4 s, 0.8 s..."""
    retry = Retry(
        total=retries + 1,
        connect=retries,
        read=min(retries, 1),
        status=retries,
        other=0,
        allowed_methods=None,  # every verb: see RETRIED_STATUSES
        status_forcelist=RETRIED_STATUSES,
        backoff_factor=0.2,
        backoff_max=5,
        raise_on_status=False,  # the last answer reaches the caller as an ApiError
    )
    found = credentials or load_credentials()
    return ApiClient(found, (connect_timeout, read_timeout), retry, pool_size)


def single_try(api_client: ApiClient) -> ApiClient:
    """A client of the same API server, credentials and deadlines as `api_client`, whose calls are tried
    once: its caller retries them itself, deciding before each try whether it may still make one (the
    leader's writes, dtjob.kube.client)."""
    return ApiClient(api_client.credentials, api_client.timeout, False, api_client.pool_size)


def retries_of(api_client: ApiClient) -> int:
    """How many times `api_client` tries a call again after a failed answer (connect()'s `retries`)."""
    retry = api_client.retries
    return int(retry.status or 0) if isinstance(retry, Retry) else 0
