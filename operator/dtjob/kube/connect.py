"""The connection to the API server: auth from the pod's ServiceAccount (or the kubeconfig), a deadline on
every call, bounded retries, and each call's latency and failure recorded (dtjob.metrics)."""

from __future__ import annotations

import copy
import time
from typing import Any

from kubernetes import client
from kubernetes import config as k8s_config
from urllib3.util.retry import Retry

from dtjob import metrics

# Answers worth another try: the API server's "try again" (429, with Retry-After) and its transient failures.
# Every write the operator makes is safe to repeat: creates of fixed names (409 means it exists), status
# patches guarded by resourceVersion (409 means retry from a fresh read), deletes (404 means gone).
RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})


class DeadlineApiClient(client.ApiClient):
    """An ApiClient whose every call has a deadline: `timeout` (connect, read) unless the call names its own,
    so that an API server that never answers cannot hold a reconcile's thread forever. Every call passes
    here, so here its latency and failure are recorded (dtjob.metrics), once for all call sites."""

    def __init__(self, configuration: client.Configuration, timeout: tuple[float, float]) -> None:
        super().__init__(configuration)
        self.timeout = timeout

    def call_api(
        self,
        method: str,
        url: str,
        header_params: Any = None,
        body: Any = None,
        post_params: Any = None,
        _request_timeout: Any = None,
    ) -> Any:
        timeout = _request_timeout or self.timeout
        start = time.perf_counter()
        try:
            response = super().call_api(
                method, url, header_params, body, post_params, _request_timeout=timeout
            )
        except Exception as error:
            metrics.api_call_done(method, url, time.perf_counter() - start, None, error)
            raise
        metrics.api_call_done(method, url, time.perf_counter() - start, response.status, None)
        return response


def connect(
    connect_timeout: float, read_timeout: float, retries: int, pool_size: int | None = None
) -> client.ApiClient:
    """A client for the in-cluster API server (or the kubeconfig's), with a deadline on every call and
    bounded retries: `retries` for connection failures and 429/5xx answers, one for a read that timed out
    (so a hung call ends after twice the read timeout), backing off 0.2 s, 0.4 s, 0.8 s..."""
    configuration = client.Configuration()
    if pool_size is not None:  # one kept-alive connection per thread that calls: no handshake per call
        configuration.connection_pool_maxsize = pool_size
    try:
        k8s_config.load_incluster_config(client_configuration=configuration)
    except k8s_config.ConfigException:
        k8s_config.load_kube_config(client_configuration=configuration)
    configuration.retries = Retry(
        total=retries + 1,
        connect=retries,
        read=min(retries, 1),
        status=retries,
        other=0,
        allowed_methods=None,  # every verb: see RETRIED_STATUSES
        status_forcelist=RETRIED_STATUSES,
        backoff_factor=0.2,
        backoff_max=5,
        raise_on_status=False,  # the last answer reaches the caller as an ApiException
    )
    return DeadlineApiClient(configuration, (connect_timeout, read_timeout))


def single_try(api_client: client.ApiClient) -> DeadlineApiClient:
    """A client of the same API server, credentials and deadlines as `api_client`, whose calls are tried
    once: its caller retries them itself, deciding before each try whether it may still make one (the
    leader's writes, dtjob.kube.client)."""
    configuration = copy.copy(api_client.configuration)
    configuration.retries = False  # urllib3 raises the first failure; an answer is returned as it is
    timeout = api_client.timeout if isinstance(api_client, DeadlineApiClient) else (10.0, 20.0)
    return DeadlineApiClient(configuration, timeout)


def retries_of(api_client: client.ApiClient) -> int:
    """How many times `api_client` tries a call again after a failed answer (connect()'s `retries`)."""
    retry = api_client.configuration.retries
    return int(retry.status or 0) if isinstance(retry, Retry) else 0
