"""Who is behind a bearer token (a TokenReview) and whether that user may use a non-resource URL (a
SubjectAccessReview): the API server's own answers, for dtjob.runtime.metrics_access."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from dtjob.kube.connect import ApiClient
from dtjob.kube.rest import Json, api_call, read_json


@dataclass(frozen=True)
class Identity:
    """The user a TokenReview found behind a token, as a SubjectAccessReview asks about it."""

    user: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


class AccessReviews:
    """Needs `create` on tokenreviews (authentication.k8s.io) and subjectaccessreviews
    (authorization.k8s.io)."""

    def __init__(self, api_client: ApiClient) -> None:
        self.api_client = api_client

    def authenticate(self, token: str) -> Identity | None:
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        review = read_json(api_call(self.api_client, "create", "TokenReview", None, body=body))
        status = review.get("status") or {}
        user = status.get("user") or {}
        if not status.get("authenticated") or not user.get("username"):
            return None
        extra = {str(k): tuple(str(v) for v in vs or ()) for k, vs in (user.get("extra") or {}).items()}
        groups = tuple(str(g) for g in user.get("groups") or ())
        return Identity(str(user["username"]), str(user.get("uid") or ""), groups, extra)

    def may(self, who: Identity, verb: str, path: str) -> bool:
        spec: Json = {
            "user": who.user,
            "groups": list(who.groups),
            "nonResourceAttributes": {"path": path, "verb": verb},
        }
        if who.uid:
            spec["uid"] = who.uid
        if who.extra:
            spec["extra"] = {k: list(v) for k, v in who.extra.items()}
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
        review = read_json(api_call(self.api_client, "create", "SubjectAccessReview", None, body=body))
        return bool((review.get("status") or {}).get("allowed"))
