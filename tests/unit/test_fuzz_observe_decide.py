"""Property-based: the pure observe -> decide path never raises on what a user's objects can hold.

Random specs (valid ones with fields replaced by anything JSON can say), random statuses (as an edit of the
status subresource can leave them), and random child objects (pods, the launcher and staging Jobs, the
account key Secret's data) with fields missing or odd. The only exceptions allowed are the documented ones:
SpecError for a spec the operator cannot run (it becomes the Failed condition) and StorageRefused for an
account key it cannot use (it becomes a blocker). Derandomized with a bounded number of examples: the same
inputs on every run, in a few seconds.
"""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from dtjob import names
from dtjob.machine import decide, invalid_spec
from dtjob.reconcile.storage_observe import StorageRefused, _decoded_key
from dtjob.spec.parse import SpecError, parse_spec
from dtjob.state.observed import observe_children
from dtjob.state.staging import staging_outcome
from dtjob.state.status import status_from_dict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.operator_fixtures import CONFIG, job_body

NOW = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
UID = "uid-1"
FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Strings a user or a misbehaving client can write: empty, huge, control and non-BMP characters, lone
# surrogates as JSON can carry them, and the shapes the operator parses (times, numbers).
odd_text = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["", " ", "0", "-1", "1e9", "NaN", "9" * 40, "x" * 5000, "\x00", "\ud800", "é\u202e"]),
    st.sampled_from(
        ["2026-01-02T03:04:05Z", "2026-01-02T03:04:05", "2026-01-02T03:04", "2026-13-45T99:99:99Z"]
    ),
)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70), st.floats(), odd_text
)
junk: st.SearchStrategy[Any] = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def maybe(value: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A plausible value, anything at all, or nothing."""
    return st.one_of(value, junk, st.none())


VALID_SPECS = [
    {},
    {"runPolicy": {"activeDeadlineSeconds": 600, "ttlSecondsAfterFinished": 60, "backoffLimit": 2}},
    {
        "dataset": {
            "source": "imagenet",
            "volume": {"nfs": {"server": "10.0.0.4", "path": "/exports"}, "mountPath": "/data"},
            "stageFrom": {
                "account": "acct1",
                "container": "datasets",
                "credentials": {"authMode": "accountKey", "secretRef": {"name": "key"}},
            },
        },
        "output": {"account": "acct1", "container": "runs", "credentials": {"authMode": "workloadIdentity"}},
    },
]
SPEC_KEYS = [
    "workers",
    "gpusPerWorker",
    "framework",
    "runPolicy",
    "dataset",
    "output",
    "worker",
    "launcher",
    "placement",
    "image",
    "command",
    "args",
    "env",
    "gangScheduling",
    "suspend",
]


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = json.loads(json.dumps(draw(st.sampled_from(VALID_SPECS))))
    for key in draw(st.lists(st.sampled_from(SPEC_KEYS), max_size=3, unique=True)):
        spec[key] = draw(junk)
    for _ in range(draw(st.integers(0, 2))):  # and a field deeper down, e.g. spec.dataset.stageFrom.container
        node = spec
        while True:
            key = draw(st.sampled_from(sorted(node))) if node else "x"
            if not isinstance(node.get(key), dict) or not node[key] or draw(st.booleans()):
                node[key] = draw(junk)
                break
            node = node[key]
    return spec


times = st.sampled_from(["2026-03-04T05:00:00Z", "2026-03-04T05:06:07+01:00", "1970-01-01T00:00:00Z"])
PHASES = ["Pending", "Staging", "Starting", "Running", "Restarting", "Succeeded", "Failed", "Suspended"]
condition = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["Created", "Staged", "Running", "Succeeded", "Failed", "Ready"]),
        "status": st.sampled_from(["True", "False", "Unknown"]),
    },
    optional={"reason": maybe(odd_text), "message": maybe(odd_text), "lastTransitionTime": maybe(times)},
)
statuses = st.fixed_dictionaries(
    {},
    optional={
        "phase": maybe(st.sampled_from(PHASES)),
        "conditions": maybe(st.lists(maybe(condition), max_size=4)),
        "restarts": maybe(st.integers(0, 10)),
        "startTime": maybe(times),
        "completionTime": maybe(times),
        "observedGeneration": maybe(st.integers(0, 3)),
        "workers": maybe(
            st.fixed_dictionaries(
                {}, optional={"total": maybe(st.integers(0, 4)), "ready": maybe(st.integers(0, 4))}
            )
        ),
        "gpus": maybe(st.integers(0, 32)),
        "launcher": maybe(
            st.fixed_dictionaries({}, optional={"state": maybe(odd_text), "pod": maybe(odd_text)})
        ),
        "staging": junk,
        "progress": junk,
        "output": maybe(
            st.fixed_dictionaries(
                {},
                optional={
                    "url": junk,
                    "logsUploaded": junk,
                    "logsMissing": junk,
                    "logsError": junk,
                    "logsTruncated": junk,
                },
            )
        ),
        "sasSecretsDeleted": junk,
        "sasTokenDigests": junk,
    },
)

# Child objects as the API server returns them: the types it enforces, any values, fields left out.
labels = st.fixed_dictionaries(
    {},
    optional={
        names.ROLE_LABEL: st.one_of(
            st.sampled_from([names.ROLE_WORKER, names.ROLE_LAUNCHER, names.ROLE_STAGER]), odd_text
        ),
        names.ATTEMPT_LABEL: st.one_of(st.sampled_from(["0", "1"]), odd_text),
        names.WORKER_INDEX_LABEL: st.one_of(st.sampled_from(["0", "1"]), odd_text),
        names.WORLD_SIZE_LABEL: st.one_of(st.sampled_from(["2"]), odd_text),
    },
)
owner_refs = st.lists(
    st.fixed_dictionaries({"uid": st.sampled_from([UID, "other", "launcher-uid"])}), max_size=2
)
metadata = st.fixed_dictionaries(
    {
        "name": st.sampled_from(
            ["rn50-worker-0", "rn50-worker-1", "rn50-launcher", "rn50-launcher-x", "rn50-stage-y"]
        )
    },
    optional={
        "uid": st.sampled_from([UID, "launcher-uid", "pod-uid"]),
        "labels": labels,
        "annotations": st.dictionaries(odd_text, odd_text, max_size=3),
        "ownerReferences": owner_refs,
        "deletionTimestamp": st.one_of(times, odd_text),
        "creationTimestamp": st.one_of(times, odd_text),
        "finalizers": st.lists(odd_text, max_size=2),
    },
)
container_state: st.SearchStrategy[dict[str, Any]] = st.one_of(
    st.fixed_dictionaries(
        {"waiting": st.fixed_dictionaries({}, optional={"reason": odd_text, "message": odd_text})}
    ),
    st.fixed_dictionaries({"running": st.fixed_dictionaries({}, optional={"startedAt": times})}),
    st.fixed_dictionaries(
        {
            "terminated": st.fixed_dictionaries(
                {"exitCode": st.integers(-(2**31), 2**31 - 1)},
                optional={
                    "reason": odd_text,
                    "message": st.one_of(odd_text, junk.map(json.dumps)),
                    "finishedAt": times,
                },
            )
        }
    ),
    st.just({}),
)
container_status = st.fixed_dictionaries(
    {
        "name": st.sampled_from(
            [names.WORKER_CONTAINER, names.LAUNCHER_CONTAINER, names.STAGER_CONTAINER, "side"]
        )
    },
    optional={
        "state": container_state,
        "lastState": container_state,
        "ready": st.booleans(),
        "restartCount": st.integers(0, 2**31 - 1),
    },
)
pod_condition = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["Ready", "PodScheduled", "DisruptionTarget", "TerminationTarget"]),
        "status": st.sampled_from(["True", "False", "Unknown"]),
    },
    optional={"reason": odd_text, "message": odd_text},
)
pods = st.fixed_dictionaries(
    {"metadata": metadata},
    optional={
        "spec": st.fixed_dictionaries(
            {},
            optional={
                "schedulingGates": st.lists(st.fixed_dictionaries({"name": odd_text}), max_size=2),
                "nodeName": odd_text,
            },
        ),
        "status": st.fixed_dictionaries(
            {},
            optional={
                "phase": st.one_of(
                    st.sampled_from(["Pending", "Running", "Succeeded", "Failed", "Unknown"]), odd_text
                ),
                "reason": odd_text,
                "message": odd_text,
                "conditions": st.lists(pod_condition, max_size=3),
                "containerStatuses": st.lists(container_status, max_size=2),
                "initContainerStatuses": st.lists(container_status, max_size=1),
            },
        ),
    },
)
job_condition = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["Complete", "Failed", "Suspended"]),
        "status": st.sampled_from(["True", "False"]),
    },
    optional={"reason": odd_text, "message": odd_text},
)
jobs = st.fixed_dictionaries(
    {"metadata": metadata},
    optional={
        "status": st.fixed_dictionaries(
            {},
            optional={
                "conditions": st.lists(job_condition, max_size=2),
                "active": st.integers(0, 3),
                "ready": st.integers(0, 3),
                "succeeded": st.integers(0, 3),
                "failed": st.integers(0, 3),
            },
        )
    },
)
key_data = st.one_of(
    odd_text,
    st.binary(max_size=40).map(lambda b: base64.b64encode(b).decode()),
    st.text(max_size=40).map(lambda t: base64.b64encode(t.encode("utf-8", "surrogatepass")).decode()),
    junk,
)


@FUZZ
@given(
    spec=specs(),
    status=st.one_of(statuses, junk),
    child_pods=st.lists(pods, max_size=4),
    launcher=st.one_of(st.none(), jobs),
    stager=st.one_of(st.none(), jobs),
    generation=st.one_of(st.none(), st.integers(1, 5)),
)
def test_observe_and_decide_never_raise_on_a_users_objects(
    spec: dict[str, Any],
    status: Any,
    child_pods: list[dict[str, Any]],
    launcher: dict[str, Any] | None,
    stager: dict[str, Any] | None,
    generation: int | None,
) -> None:
    body = {**job_body(**spec), "status": status}
    prev = status_from_dict(status if isinstance(status, dict) else None)
    # The launcher: the pod of its name, or a legacy launcher Job's (an earlier release's) when one is there.
    seen = observe_children(child_pods, launcher, UID, "rn50-launcher")
    staging = staging_outcome(stager, child_pods) if stager is not None else None
    observed = replace(seen, generation=generation, uid=UID, staging=staging)
    try:
        parsed = parse_spec(body, CONFIG)
    except SpecError as err:
        decision = invalid_spec(prev, err.path, err.message, NOW, generation)
    else:
        decision = decide(parsed, observed, prev, NOW)
    json.dumps(decision.status.to_dict())  # what is recorded must serialize


INVALID_KEY_MESSAGE = (
    "spec.output.credentials.secretRef.key: key 'azurestorageaccountkey' of Secret 'storage-key' is not a "
    "base64 storage account key (as `az storage account keys list` prints it); "
    "waiting for the Secret to be fixed"
)


@FUZZ
@given(encoded=key_data)
def test_an_account_key_is_read_or_refused_naming_the_secret(encoded: Any) -> None:
    try:
        key = _decoded_key(encoded, "storage-key", "azurestorageaccountkey", "spec.output.credentials")
    except StorageRefused as refused:
        assert refused.blocker.reason == "StorageCredentialsInvalid"
        assert "'storage-key'" in refused.blocker.message
        # The same words whatever the value: the key is never shown.
        assert refused.blocker.message == INVALID_KEY_MESSAGE
    else:
        assert base64.b64decode(key, validate=True)
