"""Probes of every bound the CRD's spec schema sets, for comparing it with the operator's parser.

The schema is walked leaf by leaf; each constrained leaf (minimum, maximum, enum, pattern, length, or a CEL
rule about it) gets values on and beyond its bounds, set one at a time into a full, valid job. Rules that
tie fields together are probed in further bases (CROSS), and rules about an object's presence by setting
it whole (PRESENT). The unit test
judges each probe by the schema's keywords and the parser (tests/unit/test_crd_contract.py); the integration
test by the real API server, CEL rules included, and the parser (tests/integration/test_crd_contract_api.py).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from dtjob.spec import validators

CRD = Path(__file__).resolve().parents[1] / "crds" / "dtjob.io_distributedtrainingjobs.yaml"
Json = dict[str, Any]
Path_ = tuple[str | int, ...]
MAP_KEY = "k"  # the key under which map values are probed

UUID = "0b7f7c3e-1234-4abc-8def-0123456789ab"
_COMMON: Json = {
    "framework": "pytorch",
    "workers": 2,
    "gpusPerWorker": 4,
    "slotsPerWorker": 4,
    "appendTrainingFlags": True,
    "image": "ghcr.io/dtjob/horovod-pytorch:0.1.0",
    "imagePullPolicy": "IfNotPresent",
    "imagePullSecrets": [{"name": "acr"}],
    "command": ["python", "-m", "dtjob_train.pytorch"],
    "args": ["--epochs", "1"],
    "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
    "worker": {"podAnnotations": {MAP_KEY: "v"}, "podLabels": {MAP_KEY: "v"},
               "resources": {"limits": {"cpu": "2"}, "requests": {"cpu": "1"}},
               "template": {"metadata": {"labels": {MAP_KEY: "v"}, "annotations": {MAP_KEY: "v"}},
                            "spec": {"containers": [{"name": "worker", "env": [{"name": "A", "value": "1"}]},
                                                    {"name": "sidecar", "image": "busybox:1.36"}],
                                     "volumes": [{"name": "scratch", "emptyDir": {}}]}}},
    "hyperparameters": {"batchSizePerGpu": 8, "epochs": 1, "stepsPerEpoch": 5, "learningRate": 0.1,
                        "warmupEpochs": 1, "momentum": 0.9, "weightDecay": 0.0001, "labelSmoothing": 0.1,
                        "amp": True, "ampDtype": "bf16", "fp16Allreduce": True, "channelsLast": True,
                        "xla": False, "dataLoader": "pytorch", "imageSize": 32,
                        "logInterval": 1, "seed": 7},
    "placement": {
        "nodePool": "gpu",
        "nodeSelector": {MAP_KEY: "v"},
        "tolerations": [{"key": "spot", "operator": "Equal", "value": "true", "effect": "NoExecute",
                         "tolerationSeconds": 30}],
        "affinity": {},
        "launcher": {"nodePool": "system", "nodeSelector": {MAP_KEY: "v"},
                     "tolerations": [{"key": "spot", "operator": "Exists"}]},
    },
    "launcher": {"runner": "horovodrun", "runAsWorker": False, "mpiArgs": ["-v"],
                 "mpiImplementation": "MPICH",
                 "podAnnotations": {MAP_KEY: "v"}, "podLabels": {MAP_KEY: "v"},
                 "resources": {"limits": {"cpu": "1"}, "requests": {"memory": "1Gi"}},
                 "template": {"metadata": {"labels": {MAP_KEY: "v"}, "annotations": {MAP_KEY: "v"}},
                              "spec": {"priorityClassName": "high"}}},
    "runPolicy": {"backoffLimit": 1, "activeDeadlineSeconds": 600, "ttlSecondsAfterFinished": 60,
                  "cleanPodPolicy": "Running", "suspend": False, "startupDeadlineSeconds": 600,
                  "progressDeadlineSeconds": 600,
                  "restartPolicy": "ExitCode", "permanentExitCodes": "1-127,255",
                  "scheduling": {"schedulerName": "sched", "queueName": "queue", "podGroup": "group",
                                 "topology": {"key": "team.example/rack", "mode": "required"}}},
}  # fmt: skip
_NFS = {"server": "files.example.net", "path": "/share"}
_IDENTITY = {"authMode": "workloadIdentity", "clientId": UUID}
_KEY = {"authMode": "accountKey", "secretRef": {"name": "storage-key", "key": "azurestorageaccountkey"}}


def _stage(credentials: Json) -> Json:
    return {"account": "acct1", "container": "datasets", "prefix": "in", "destination": "/data/imagenet",
            "concurrency": 4, "sasLifetimeSeconds": 3600, "credentials": credentials,
            "podAnnotations": {MAP_KEY: "v"}}  # fmt: skip


def _output(credentials: Json) -> Json:
    return {"account": "acct1", "container": "results", "prefix": "runs", "sasLifetimeSeconds": 3600,
            "credentials": credentials}  # fmt: skip


def _with(base: Json, **fields: Any) -> Json:
    """`base` with the top-level `fields` replaced; None leaves one out."""
    out = {k: v for k, v in base.items() if k not in fields}
    out.update({k: v for k, v in fields.items() if v is not None})
    return out


# A torchrun (torch.distributed) world: no launcher and no launcher placement, no Horovod Elastic, and
# slotsPerWorker left out (it may only repeat processesPerWorker: CROSS probes that).
_TORCHRUN: Json = _with(
    _COMMON, launcher=None, slotsPerWorker=None,
    placement={k: v for k, v in _COMMON["placement"].items() if k != "launcher"},
    torchrun={"processesPerWorker": 4, "rendezvousTimeoutSeconds": 900},
)  # fmt: skip


# Full, valid jobs; between them every field of the schema appears (nfs and PVC variants, both auth modes).
BASES: tuple[Json, ...] = (
    {**_COMMON,
     "dataset": {"source": "imagenet", "dataDir": "/data/imagenet", "stageFrom": _stage(_IDENTITY),
                 "volume": {"mountPath": "/data", "nfs": {**_NFS, "readOnly": True}}},
     "output": _output(_KEY),
     "checkpoints": {"mountPath": "/checkpoints", "nfs": {**_NFS, "readOnly": False}}},
    {**_COMMON,
     "dataset": {"source": "imagenet", "dataDir": "/data/imagenet", "stageFrom": _stage(_KEY),
                 "volume": {"mountPath": "/data",
                            "persistentVolumeClaim": {"claimName": "imagenet", "readOnly": False}}},
     "output": _output(_IDENTITY),
     "checkpoints": {"mountPath": "/checkpoints",
                     "persistentVolumeClaim": {"claimName": "ckpt", "readOnly": False}},
     # gang and podGroup exclude each other: the gang fields are probed here.
     "runPolicy": {**_COMMON["runPolicy"],
                   "scheduling": {"schedulerName": "sched", "queueName": "queue",
                                  "gang": {"scheduler": "volcano", "scheduleTimeoutSeconds": 120,
                                           "queue": "research"}}}},
    # Horovod Elastic runs on horovodrun's Gloo: a launcher without MPI's settings.
    {**_COMMON, "elastic": {"minWorkers": 1, "maxWorkers": 4, "timeoutSeconds": 300,
                             "commitEverySteps": 50},
     "launcher": {"runner": "horovodrun", "runAsWorker": False}},
    _TORCHRUN,
)  # fmt: skip

# Leaves that a CEL rule ties to other fields, probed again in another base (the walk probes each leaf in the
# first base that holds it only): (path, base, what the base is, for the probe's name). Their probe values
# include the one each base accepts (2, or 1 and 0 for gpusPerWorker), so a rule refusing too much shows.
CROSS: tuple[tuple[Path_, Json, str], ...] = (
    # spec.slotsPerWorker must be torchrun's processesPerWorker: given, or defaulted from gpusPerWorker.
    (("slotsPerWorker",), _with(_TORCHRUN, torchrun={"processesPerWorker": 2}),
     "torchrun.processesPerWorker 2, gpusPerWorker 4"),
    (("slotsPerWorker",), _with(_TORCHRUN, torchrun={}, gpusPerWorker=2), "torchrun {}, gpusPerWorker 2"),
    (("slotsPerWorker",), _with(_TORCHRUN, torchrun={}, gpusPerWorker=0), "torchrun {}, gpusPerWorker 0"),
    (("slotsPerWorker",), _with(_TORCHRUN, torchrun={}, gpusPerWorker=None), "torchrun {}, no gpusPerWorker"),
    (("gpusPerWorker",), _with(_TORCHRUN, torchrun={}, slotsPerWorker=1), "torchrun {}, slotsPerWorker 1"),
    (("torchrun", "processesPerWorker"), _with(_TORCHRUN, slotsPerWorker=2), "slotsPerWorker 2"),
    # torchrun starts PyTorch processes: framework pytorch or custom.
    (("framework",), _TORCHRUN, "torchrun"),
)  # fmt: skip

# Objects whose presence a CEL rule decides, set whole into a base: (path, value, base, what the base is).
PRESENT: tuple[tuple[Path_, Any, Json, str], ...] = (
    # A torchrun job has no launcher and is not elastic.
    (("launcher",), {}, _TORCHRUN, "torchrun"),
    (("launcher",), {"runner": "horovodrun"}, _TORCHRUN, "torchrun"),
    (("placement", "launcher"), {}, _TORCHRUN, "torchrun"),
    (("placement", "launcher"), {"nodePool": "system"}, _TORCHRUN, "torchrun"),
    (("elastic",), {"minWorkers": 1, "maxWorkers": 4}, _TORCHRUN, "torchrun"),
    (("torchrun",), {}, _with(_TORCHRUN, torchrun=None, slotsPerWorker=4), "no torchrun, slotsPerWorker 4"),
    (("torchrun",), {}, BASES[0], "a launcher"),
)  # fmt: skip

# Decided by the operator's configuration, not by the schema: which emulator hosts may serve plain http.
OPERATOR_CONFIG_FIELDS = {"endpoint"}
# Kubernetes' own PodSpec (hack/gen_pod_template_schema.py renders it): the API server checks it when it
# creates the pods, the parser only what the operator owns of it (tests/unit/test_pod_template.py).
GENERATED = {("worker", "template", "spec"), ("launcher", "template", "spec")}

# Strings tried on every string field besides its length bounds: the edges of every pattern the schema uses.
STRINGS = (
    "", "a", "A", "0", "-a", "a-", "a_b", "a.b", "a b", "a\n", "é", "a/b", "a//b", "/", "/a", "/a/", "/a/b",
    "//a", "/a/../b", "/a/./b", "/..", "/..a", "..", "a/../b", "/etc", "/etc/mpi", "/etc/dtjob/ssh", "/dev",
    "/dev/shm/x", "/proc", "/dtjob", "/dtjobs", "/var/run/dtjob/sas-in", "/data", "/data/x", "/data2",
    "/checkpoints", "ghcr.io/a/b:1", "A/b", "a:1", "a:", "a@sha256:" + "0" * 64, "10.0.0.4", "fd00::4",
    "host:2049", "x" * 13, "gpu", "gpu1", "1gpu", "spot", "team.example/key", "key/", "imagenet", "synthetic",
    "Exists", "Equal", "NoSchedule", "NoExecute", "accountKey", "workloadIdentity", "Running", "horovodrun",
    "IfNotPresent", UUID, "acct1", "datasets", "OpenMPI", "MPICH", "custom", "1-127", "127-1", "1-127,255",
    "0", "256", "1,", "ExitCode",
)  # fmt: skip
# Keys tried on every map whose keys a CEL rule checks.
KEYS = ("k", "team.example/k", "a/b/c", "-k", "k-", "k k", "x" * 63, "x" * 64, "a" * 253 + "/k",
        "a" * 254 + "/k", "/k", "Example.com/k", "kueue.x-k8s.io/queue-name",
        "kueue.x-k8s.io/priority-class")  # fmt: skip


# The maps of a pod's labels and annotations, under spec.worker and spec.launcher.
POD_KEY_MAPS = (("podLabels",), ("podAnnotations",), ("template", "metadata", "labels"),
                ("template", "metadata", "annotations"))  # fmt: skip


def refused_at_apply_only(probe: Probe) -> bool:
    """A value a CEL rule refuses that the parser accepts on purpose, so that a job stored before the rule
    keeps running: Kueue's keys on a job's pods, which the operator drops from them instead (its own test)."""
    on_pods = probe.path[:1] in (("worker",), ("launcher",)) and probe.path[1:] in POD_KEY_MAPS
    keys = probe.value if isinstance(probe.value, dict) else {}
    return on_pods and any(validators.kueue_key_the_operator_sets(k) for k in keys)


@dataclass(frozen=True)
class Probe:
    path: Path_
    value: Any
    body: Json  # the whole spec with the value set
    keywords_ok: bool  # what the schema's keywords (not its CEL rules) say
    cel: bool  # a CEL rule may decide this field too
    where: str = ""  # the base, for a probe of CROSS or PRESENT (a leaf's own probes need no word)

    @property
    def field(self) -> str:
        text = "spec"
        for part in self.path:
            text += f"[{part}]" if isinstance(part, int) else f".{part}"
        return text

    @property
    def name(self) -> str:
        where = f" (in a base with {self.where})" if self.where else ""
        return f"{self.field}={_short(self.value)}{where}"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)})"


def spec_schema() -> Json:
    crd: Json = yaml.safe_load(CRD.read_text())
    spec: Json = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return spec


def keyword_ok(schema: Json, value: Any) -> bool:
    """The schema's own keywords, as the API server applies them (its regexes are RE2, where `$` matches
    only at the very end)."""
    kind = schema.get("type")
    if kind == "integer" and (isinstance(value, bool) or not isinstance(value, int)):
        return False
    if kind == "number" and (isinstance(value, bool) or not isinstance(value, int | float)):
        return False
    if kind == "string" and not isinstance(value, str):
        return False
    if kind == "boolean" and not isinstance(value, bool):
        return False
    if "enum" in schema and value not in schema["enum"]:
        return False
    if isinstance(value, int | float) and not isinstance(value, bool):  # bounds apply to numbers only
        if "minimum" in schema and value < schema["minimum"]:
            return False
        if "maximum" in schema:
            top = schema["maximum"]
            if value >= top if schema.get("exclusiveMaximum") else value > top:
                return False
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0) or len(value) > schema.get("maxLength", len(value)):
            return False
        pattern = schema.get("pattern")
        if pattern is not None and re.search(pattern.replace("$", r"\Z"), value) is None:
            return False
    return True


def _values(schema: Json, sample: Any) -> list[Any]:
    kind = schema.get("type")
    values: list[Any] = []
    if "enum" in schema:
        values += [*schema["enum"], "Bogus", ""]
    if kind in ("integer", "number"):
        values += [0, 1]
        step = 1 if kind == "integer" else 0.001
        for bound in (schema.get("minimum"), schema.get("maximum")):
            if bound is not None:
                values += [bound - step, bound, bound + step]
    if kind == "boolean":
        values += [True, False]
    if schema.get("x-kubernetes-int-or-string"):
        values += [0, 1, -1, 2**40, "1", "500m", "16Gi", "1.5e3", "+1", "-1", "1Gb", "lots", "", " 1"]
    if kind == "string" and "enum" not in schema:
        values += list(STRINGS)
        base = sample if isinstance(sample, str) else ""
        for length in (schema.get("maxLength"), schema.get("minLength")):
            if length is not None:
                values += [(base + "a" * n)[:n] for n in (length - 1, length, length + 1) if n >= 0]
    unique: list[Any] = []
    for v in values:
        if not any(type(v) is type(u) and v == u for u in unique):
            unique.append(v)
    return unique


def _constrained(schema: Json) -> bool:
    keys = {"enum", "minimum", "maximum", "pattern", "minLength", "maxLength", "x-kubernetes-validations"}
    return bool(keys & set(schema))


def _get(body: Any, path: Path_) -> Any:
    for part in path:
        if isinstance(part, int):
            if not isinstance(body, list) or part >= len(body):
                return _MISSING
            body = body[part]
        else:
            if not isinstance(body, dict) or part not in body:
                return _MISSING
            body = body[part]
    return body


_MISSING = object()


def _set(body: Json, path: Path_, value: Any) -> Json:
    out = copy.deepcopy(body)
    target: Any = out
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return out


def _rename_key(body: Json, path: Path_, key: str) -> Json:
    out = copy.deepcopy(body)
    target: Any = out
    for part in path:
        target = target[part]
    target[key] = target.pop(next(iter(target)))
    return out


def leaves(schema: Json, path: Path_ = (), rules: tuple[str, ...] = ()) -> Iterator[tuple[Path_, Json, bool]]:
    """(path, schema, a CEL rule may decide it) of every constrained scalar; maps as (path, schema) too."""
    if path in GENERATED:
        return
    own = tuple(r["rule"] for r in schema.get("x-kubernetes-validations", ()))
    kind = schema.get("type")
    if kind == "object" and "properties" in schema:
        for key, child in schema["properties"].items():
            yield from leaves(child, (*path, key), rules + own)
        return
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        yield path, schema, bool(own)
        yield from leaves(schema["additionalProperties"], (*path, MAP_KEY), rules)
        return
    if kind == "array" and isinstance(schema.get("items"), dict):
        if "maxItems" in schema:
            yield path, schema, bool(own)
        yield from leaves(schema["items"], (*path, 0), rules + own)
        return
    if kind in ("string", "integer", "number", "boolean") or schema.get("x-kubernetes-int-or-string"):
        name = str(path[-1]) if path else ""
        cel = bool(own) or any(f".{name}" in rule for rule in rules)
        if _constrained(schema) or cel:
            yield path, schema, cel


def probes() -> Iterator[Probe]:
    schema = spec_schema()
    found: dict[Path_, tuple[Json, bool]] = {}
    for path, node, cel in leaves(schema):
        found[path] = (node, cel)
        if str(path[-1]) in OPERATOR_CONFIG_FIELDS:
            continue
        base = next((b for b in BASES if _get(b, path) is not _MISSING), None)
        base = base or next((b for b in BASES if isinstance(_get(b, path[:-1]), dict)), None)
        if base is None:
            raise AssertionError(f"no base job holds {path}: add it to tests/crd_contract.py BASES")
        yield from _leaf_probes(path, node, cel, base)
    for path, base, where in CROSS:
        if path not in found:
            raise AssertionError(f"CROSS names {path}, which is no constrained leaf of the schema")
        node, cel = found[path]
        yield from _leaf_probes(path, node, cel, base, where)
    for path, value, base, where in PRESENT:
        yield Probe(path, value, _set(base, path, value), True, True, where)


def _leaf_probes(path: Path_, node: Json, cel: bool, base: Json, where: str = "") -> Iterator[Probe]:
    sample = _get(base, path)
    kind = node.get("type")
    if kind == "object":  # a map: its keys, which only CEL checks
        if "x-kubernetes-validations" in node:
            for key in KEYS:
                yield Probe(path, {key: "v"}, _rename_key(base, path, key), True, True, where)
        if "maxProperties" in node:
            for n in (node["maxProperties"], node["maxProperties"] + 1):
                many = {f"k{i}": "v" for i in range(n)}
                yield Probe(path, many, _set(base, path, many), keyword_ok_size(node, n), bool(cel), where)
        return
    if kind == "array":
        for n in (node["maxItems"], node["maxItems"] + 1):
            items = [copy.deepcopy(sample[0]) for _ in range(n)]
            yield Probe(path, items, _set(base, path, items), n <= node["maxItems"], cel, where)
        return
    for value in _values(node, sample):
        yield Probe(path, value, _set(base, path, value), keyword_ok(node, value), cel, where)


def keyword_ok_size(node: Json, n: int) -> bool:
    limit: int = node.get("maxProperties", n)
    return n <= limit


def job(spec: Json, name: str = "probe", namespace: str = "ml") -> Json:
    return {
        "apiVersion": "dtjob.io/v1alpha1",
        "kind": "DistributedTrainingJob",
        "metadata": {"name": name, "namespace": namespace, "uid": "uid-1", "generation": 1},
        "spec": spec,
    }
