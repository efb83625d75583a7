"""dtjob.kube.wire: what goes to the API server and comes back is the JSON the standard library reads and
writes, compact, with read-only mappings written as objects."""

from __future__ import annotations

import json
from types import MappingProxyType

import pytest
from dtjob.kube import wire


def test_what_it_writes_the_standard_library_reads_back_and_the_reverse() -> None:
    labels = MappingProxyType({"dtjob.io/role": "worker"})
    args: list[object] = ["--lr", 0.1, 256, True, None, "é ✓"]
    pod = {"kind": "Pod", "metadata": {"name": "rn50-worker-0", "labels": labels}, "spec": {"args": args}}
    written = wire.dumps(pod)
    assert isinstance(written, bytes) and b'{"kind":"Pod","metadata":{"name":"rn50-worker-0",' in written
    plain = {
        "kind": "Pod",
        "metadata": {"name": "rn50-worker-0", "labels": dict(labels)},
        "spec": {"args": args},
    }
    assert json.loads(written) == plain
    text = json.dumps(json.loads(written))
    assert wire.loads(text) == wire.loads(written) == json.loads(text)


def test_a_value_json_has_no_form_for_is_refused() -> None:
    with pytest.raises(TypeError):
        wire.dumps({"when": object()})
