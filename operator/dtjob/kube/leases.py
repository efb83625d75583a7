"""The leader Lease (coordination.k8s.io/v1) of the operator's replicas: read, created, replaced under its
resourceVersion, and the Event that tells of a new holder."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from dtjob.kube.connect import ApiClient
from dtjob.kube.errors import ApiError, Conflict
from dtjob.kube.events import post_event, reference
from dtjob.kube.rest import Json, api_call, json_or_none, read_json

LEASE_VERSION = "coordination.k8s.io/v1"


class LeaseClient:
    """Not fenced: these writes are how a replica gets to write at all. Its own client, with deadlines of the
    election's retry period and no retries of its own, so that a slow API server costs one round of the
    election loop, not its renew deadline."""

    def __init__(self, api_client: ApiClient, namespace: str, name: str) -> None:
        self.namespace = namespace
        self.name = name
        self.api_client = api_client

    def read(self) -> Json | None:
        return json_or_none(lambda: api_call(self.api_client, "get", "Lease", self.namespace, self.name))

    def create(self, spec: Json) -> Json | None:
        """The Lease created with `spec`; None when one exists already (another replica was first)."""
        try:
            return read_json(
                api_call(self.api_client, "create", "Lease", self.namespace, body=self._body(spec))
            )
        except ApiError as err:
            if err.status == 409:
                return None
            raise

    def replace(self, spec: Json, resource_version: str) -> Json:
        """The Lease with `spec`, only if it is still at `resource_version`; Conflict if it moved on."""
        body = self._body(spec)
        body["metadata"]["resourceVersion"] = resource_version
        try:
            return read_json(api_call(self.api_client, "update", "Lease", self.namespace, self.name, body))
        except ApiError as err:
            if err.status == 409:
                raise Conflict(f"Lease {self.namespace}/{self.name} changed since it was read") from err
            raise

    def announce(
        self, lease: Mapping[str, Any], reason: str, message: str, now: datetime, instance: str
    ) -> None:
        involved = reference(lease, LEASE_VERSION, "Lease")
        post_event(self.api_client, involved, "Normal", reason, message, now, instance)

    def _body(self, spec: Json) -> Json:
        meta = {"name": self.name, "namespace": self.namespace}
        return {"apiVersion": LEASE_VERSION, "kind": "Lease", "metadata": meta, "spec": spec}
