"""Pod templates (spec.worker.template, spec.launcher.template): the merge over the operator's pods, and the
refusal, naming the field, of what the operator owns."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from dtjob import desired, names
from dtjob.desired.command import LAUNCHER_DEFAULT_ENV, LAUNCHER_MPI_ENV
from dtjob.desired.common import owner_reference
from dtjob.desired.template import DEFAULT_CONTAINER_ANNOTATION, merge_pod_spec
from dtjob.spec import validators
from dtjob.spec.parse import SpecError, parse_spec
from dtjob.state.observed import pod_state

from tests.unit.operator_fixtures import CONFIG, job_body, job_spec

CRD = Path(__file__).resolve().parents[2] / "crds" / "dtjob.io_distributedtrainingjobs.yaml"
OWNER = owner_reference("rn50", "uid-1")
SIDECAR = {"name": "metrics", "image": "ghcr.io/example/exporter:1.2", "ports": [{"containerPort": 9400}]}
SCRATCH = {"name": "scratch", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}
GROUP = {"kueue.x-k8s.io/pod-group-total-count": "3"}  # the world's Kueue pod group: two workers, a launcher
# What a container the template adds runs under unless its securityContext says otherwise.
HARDENED = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def worker(template: dict[str, Any], index: int = 0, **spec: Any) -> dict[str, Any]:
    spec.setdefault("worker", {})["template"] = template
    return desired.worker_pod(job_spec(**spec), OWNER, index, 0)


def launcher(template: dict[str, Any], **spec: Any) -> dict[str, Any]:
    spec.setdefault("launcher", {})["template"] = template
    pod: dict[str, Any] = desired.launcher_pod(job_spec(**spec), OWNER, 0)
    return pod


def container(pod_spec: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in pod_spec["containers"] if c["name"] == name)
    return found


def test_no_template_builds_the_same_pods() -> None:
    plain = job_spec()
    empty = job_spec(worker={"template": {}}, launcher={"template": {"spec": {}}})
    assert desired.worker_pod(plain, OWNER, 1, 0) == desired.worker_pod(empty, OWNER, 1, 0)
    assert desired.launcher_pod(plain, OWNER, 0) == desired.launcher_pod(empty, OWNER, 0)


def test_a_sidecar_and_a_volume_are_added_after_the_operators() -> None:
    mount = {"name": "scratch", "mountPath": "/scratch"}
    pod = worker({"spec": {"containers": [SIDECAR, {"name": "worker", "volumeMounts": [mount]}],
                           "volumes": [SCRATCH]}})  # fmt: skip
    spec = pod["spec"]
    assert [c["name"] for c in spec["containers"]] == ["worker", "metrics"]
    assert spec["containers"][1] == {**SIDECAR, "securityContext": HARDENED}
    assert [v["name"] for v in spec["volumes"]][-1] == "scratch"
    assert {v["name"] for v in spec["volumes"]} >= {"ssh", "output", "dshm", "scratch"}
    mounts = container(spec, "worker")["volumeMounts"]
    assert mounts[-1] == mount and {"/etc/dtjob/ssh", "/dtjob/output", "/dev/shm"} <= {
        m["mountPath"] for m in mounts
    }
    # More than one container: kubectl logs and exec pick the operator's by default.
    assert pod["metadata"]["annotations"][DEFAULT_CONTAINER_ANNOTATION] == "worker"


def test_added_containers_are_hardened_as_the_operators_unless_they_say_otherwise() -> None:
    root = {"name": "fixer", "image": "busybox:1.36", "securityContext": {
        "runAsUser": 0, "runAsNonRoot": False, "capabilities": {"add": ["CHOWN"]}}}  # fmt: skip
    spec = worker({"spec": {"initContainers": [root], "containers": [SIDECAR]}})["spec"]
    assert container(spec, "metrics")["securityContext"] == HARDENED
    assert spec["initContainers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]},
        "runAsUser": 0, "runAsNonRoot": False,
    }  # fmt: skip


def test_the_operators_container_takes_the_templates_fields() -> None:
    spec = worker({"spec": {"containers": [{
        "name": "worker",
        "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
        "livenessProbe": {"tcpSocket": {"port": 2222}, "periodSeconds": 30},
        "workingDir": "/work",
        "ports": [{"containerPort": 2222}, {"containerPort": 8080, "name": "http"}],
    }]}})["spec"]  # fmt: skip
    main = container(spec, "worker")
    # Objects merge key by key: the capability is added, the operator's hardening stays.
    assert main["securityContext"] == {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]},
    }  # fmt: skip
    assert main["livenessProbe"]["periodSeconds"] == 30 and main["workingDir"] == "/work"
    # Ports are added by port and protocol: sshd's stays as the operator built it.
    assert main["ports"] == [{"name": "ssh", "containerPort": 2222, "protocol": "TCP"},
                             {"containerPort": 8080, "name": "http"}]  # fmt: skip
    assert main["command"][:2] == ["/bin/sh", "-c"] and "sshd" in main["command"][2]
    assert main["readinessProbe"]["tcpSocket"] == {"port": 2222}


def test_env_merges_by_name_and_the_templates_value_wins() -> None:
    spec = worker(
        {"spec": {"containers": [{"name": "worker", "env": [
            {"name": "NCCL_DEBUG", "value": "WARN"},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        ], "envFrom": [{"configMapRef": {"name": "nccl"}}]}]}},
        env=[{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "A", "value": "1"}],
    )["spec"]  # fmt: skip
    env = container(spec, "worker")["env"]
    assert [e["name"] for e in env] == ["DTJOB_EXPECT_GPU", "NCCL_DEBUG", "A", "POD_IP"]
    assert env[1] == {"name": "NCCL_DEBUG", "value": "WARN"}
    assert container(spec, "worker")["envFrom"] == [{"configMapRef": {"name": "nccl"}}]


def test_resources_merge_per_name_over_the_pods_resources_and_the_gpus_stay() -> None:
    spec = worker(
        {"spec": {"containers": [{"name": "worker", "resources": {
            "limits": {"memory": "64Gi", "rdma/hca_shared_devices_a": 1}, "requests": {"cpu": "8"},
        }}]}},
        worker={"resources": {"limits": {"cpu": "16", "memory": "32Gi"}, "requests": {"cpu": "4"}}},
    )["spec"]  # fmt: skip
    resources = container(spec, "worker")["resources"]
    assert resources == {
        "limits": {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "4", "rdma/hca_shared_devices_a": 1},
        "requests": {"cpu": "8"},
    }


def test_the_merge_keeps_what_the_operator_owns_whatever_it_is_given() -> None:
    # The parser refuses these (below); the merge alone still never lets them through.
    built = worker({})["spec"]
    merged = merge_pod_spec(built, {
        "restartPolicy": "Always", "hostname": "x", "subdomain": "y", "nodeSelector": {"a": "b"},
        "containers": [{"name": "worker", "command": ["sleep"], "image": "evil:1", "readinessProbe": {},
                        "resources": {"limits": {"nvidia.com/gpu": "8"}}}],
    }, "worker")  # fmt: skip
    for key in ("restartPolicy", "hostname", "subdomain", "nodeSelector"):
        assert merged[key] == built[key]
    main, mine = container(merged, "worker"), container(built, "worker")
    for key in ("command", "image", "readinessProbe"):
        assert main[key] == mine[key]
    assert main["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert "hostnameOverride" not in merge_pod_spec(built, {"hostnameOverride": "x"}, "worker")


def test_pod_fields_the_operator_leaves_free_come_from_the_template() -> None:
    spread = {
        "maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"team": "vision"}},
    }  # fmt: skip
    spec = worker({"spec": {
        "priorityClassName": "training-high", "serviceAccountName": "trainer", "runtimeClassName": "nvidia",
        "hostIPC": True, "hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet",
        "topologySpreadConstraints": [spread], "securityContext": {"supplementalGroups": [44]},
        "tolerations": [{"key": "rdma", "operator": "Exists"}], "imagePullSecrets": [{"name": "acr"}],
        "automountServiceAccountToken": True,
    }}, imagePullSecrets=[{"name": "acr"}])["spec"]  # fmt: skip
    assert spec["priorityClassName"] == "training-high" and spec["serviceAccountName"] == "trainer"
    assert spec["runtimeClassName"] == "nvidia" and spec["hostIPC"] and spec["hostNetwork"]
    assert spec["topologySpreadConstraints"] == [spread] and spec["automountServiceAccountToken"] is True
    assert (
        spec["securityContext"]["supplementalGroups"] == [44] and spec["securityContext"]["runAsUser"] == 1000
    )
    assert spec["tolerations"][-1] == {"key": "rdma", "operator": "Exists"}
    assert any(t["key"] == "sku" for t in spec["tolerations"])  # the GPU pool's stays
    assert spec["imagePullSecrets"] == [{"name": "acr"}]


def test_a_termination_grace_past_the_bound_is_cut_to_it() -> None:
    """A template's terminationGracePeriodSeconds holds a preempted, suspended or restarted world's GPUs and
    quota until its pods end: past the bound the CRD refuses it, and a job stored before that rule runs with
    its pods' grace cut to the bound."""
    bound = validators.TERMINATION_GRACE_MAX_SECONDS
    year = worker({"spec": {"terminationGracePeriodSeconds": 31_536_000}})["spec"]
    assert year["terminationGracePeriodSeconds"] == bound
    minutes = worker({"spec": {"terminationGracePeriodSeconds": 120}})["spec"]
    assert minutes["terminationGracePeriodSeconds"] == 120
    assert "terminationGracePeriodSeconds" not in worker({"spec": {}})["spec"]  # Kubernetes' 30 s


def test_dshm_takes_a_size_and_stays_in_memory() -> None:
    volumes = worker({"spec": {"volumes": [{"name": "dshm", "emptyDir": {"sizeLimit": "16Gi"}}]}})["spec"][
        "volumes"
    ]
    assert [v for v in volumes if v["name"] == "dshm"] == [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}
    ]


def test_labels_and_annotations_layer_over_pod_labels_and_under_the_operators() -> None:
    template = {"metadata": {"labels": {"team": "vision", "tier": "gold"}, "annotations": {"a": "2"}}}
    pod = worker(
        template, worker={"podLabels": {"team": "ml", "cost": "x"}, "podAnnotations": {"a": "1", "b": "1"}}
    )
    assert pod["metadata"]["labels"]["team"] == "vision" and pod["metadata"]["labels"]["cost"] == "x"
    assert pod["metadata"]["labels"][names.ROLE_LABEL] == "worker"
    assert pod["metadata"]["annotations"] == {"a": "2", "b": "1", **GROUP}
    job_pod = launcher(template, launcher={"podLabels": {"cost": "y"}})
    assert job_pod["metadata"]["labels"]["tier"] == "gold" and job_pod["metadata"]["labels"]["cost"] == "y"
    assert job_pod["metadata"]["annotations"] == {"a": "2", **GROUP}


def test_the_launcher_template_reaches_the_jobs_pod() -> None:
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["1"]}]}]}}}  # fmt: skip
    native_sidecar = {"name": "proxy", "image": "envoy:1", "restartPolicy": "Always"}
    main = {"name": "launcher", "env": [{"name": "X", "value": "1"}]}
    pod = launcher({"spec": {"affinity": affinity, "initContainers": [native_sidecar], "containers": [main]}})
    assert pod["spec"]["affinity"] == affinity
    assert pod["spec"]["initContainers"] == [{**native_sidecar, "securityContext": HARDENED}]
    assert pod["spec"]["restartPolicy"] == "Never"
    env = container(pod["spec"], "launcher")["env"]
    assert env[-1] == {"name": "X", "value": "1"}
    assert [e["name"] for e in env[:2]] == [name for name, _ in LAUNCHER_MPI_ENV]


def test_pods_share_nothing_with_the_spec() -> None:
    spec = job_spec(worker={"template": {"spec": {"volumes": [SCRATCH], "containers": [SIDECAR]}}})
    first = desired.worker_pod(spec, OWNER, 0, 0)
    first["spec"]["volumes"][-1]["emptyDir"]["sizeLimit"] = "99Gi"
    first["spec"]["containers"][1]["ports"].append({"containerPort": 1})
    second = desired.worker_pod(spec, OWNER, 1, 0)
    assert second["spec"]["volumes"][-1] == SCRATCH
    assert second["spec"]["containers"][1] == {**SIDECAR, "securityContext": HARDENED}


W = "spec.worker.template"
L = "spec.launcher.template"
REFUSED = [
    ("worker", {"spec": {"restartPolicy": "Always"}}, f"{W}.spec.restartPolicy", "runPolicy"),
    ("launcher", {"spec": {"restartPolicy": "OnFailure"}}, f"{L}.spec.restartPolicy", "Never"),
    ("worker", {"spec": {"hostname": "a"}}, f"{W}.spec.hostname", "headless Service"),
    ("worker", {"spec": {"subdomain": "a"}}, f"{W}.spec.subdomain", "headless Service"),
    ("worker", {"spec": {"hostnameOverride": "a"}}, f"{W}.spec.hostnameOverride", "headless Service"),
    ("worker", {"spec": {"nodeSelector": {"a": "b"}}}, f"{W}.spec.nodeSelector", "placement.nodeSelector"),
    ("worker", {"spec": {"ephemeralContainers": [{"name": "d"}]}}, f"{W}.spec.ephemeralContainers", "create"),
    ("worker", {"spec": {"containers": [{"name": "worker", "command": ["sh"]}]}},
     f"{W}.spec.containers[0].command", "spec.command"),
    ("worker", {"spec": {"containers": [SIDECAR, {"name": "worker", "args": ["-x"]}]}},
     f"{W}.spec.containers[1].args", "spec.args"),
    ("launcher", {"spec": {"containers": [{"name": "launcher", "image": "mine:1"}]}},
     f"{L}.spec.containers[0].image", "spec.image"),
    ("worker", {"spec": {"containers": [{"name": "worker", "readinessProbe": {"exec": {}}}]}},
     f"{W}.spec.containers[0].readinessProbe", "sshd"),
    ("worker", {"spec": {"containers": [{"name": "worker", "resources": {"limits": {"nvidia.com/gpu": 2}}}]}},
     f"{W}.spec.containers[0].resources.limits[nvidia.com/gpu]", "spec.gpusPerWorker"),
    ("launcher", {"spec": {"containers": [{"name": "launcher", "env": [
        {"name": "OMPI_MCA_plm_rsh_no_tree_spawn", "value": "false"}]}]}},
     f"{L}.spec.containers[0].env[0]", "MPI settings"),
    ("worker", {"spec": {"containers": [{"name": "worker", "volumeMounts": [
        {"name": "x", "mountPath": "/etc/mpi/mine"}]}]}},
     f"{W}.spec.containers[0].volumeMounts[0].mountPath", "/etc/mpi"),
    ("worker", {"spec": {"containers": [{"name": "metrics"}]}}, f"{W}.spec.containers[0].image", "required"),
    ("worker", {"spec": {"containers": [{"image": "x:1"}]}}, f"{W}.spec.containers[0].name", "required"),
    ("worker", {"spec": {"containers": [SIDECAR, SIDECAR]}}, f"{W}.spec.containers[1].name", "twice"),
    ("worker", {"spec": {"initContainers": [{"name": "worker", "image": "x:1"}]}},
     f"{W}.spec.initContainers[0].name", "already"),
    ("launcher", {"spec": {"containers": [SIDECAR]}}, f"{L}.spec.containers[0]",
     "initContainers with restartPolicy: Always"),
    ("worker", {"spec": {"volumes": [{"name": "ssh", "emptyDir": {}}]}}, f"{W}.spec.volumes[0].name",
     "the operator's volumes are named"),
    ("launcher", {"spec": {"volumes": [{"name": "data", "emptyDir": {}}]}}, f"{L}.spec.volumes[0].name",
     "the operator's volumes are named"),
    ("worker", {"spec": {"volumes": [{"name": "dshm", "hostPath": {"path": "/dev/shm"}}]}},
     f"{W}.spec.volumes[0]", "only its sizeLimit"),
    ("worker", {"spec": {"volumes": [{"name": "dshm", "emptyDir": {"medium": ""}}]}},
     f"{W}.spec.volumes[0].emptyDir.medium", "Memory"),
    ("worker", {"metadata": {"labels": {"dtjob.io/role": "launcher"}}}, f"{W}.metadata.labels[dtjob.io/role]",
     "set by the operator"),
    ("launcher", {"metadata": {"labels": {"app.kubernetes.io/managed-by": "me"}}},
     f"{L}.metadata.labels[app.kubernetes.io/managed-by]", "set by the operator"),
    ("worker", {"metadata": {"labels": {"team": "a b"}}}, f"{W}.metadata.labels[team]", "label value"),
    ("worker", {"metadata": {"name": "x"}}, f"{W}.metadata.name", "only labels and annotations"),
    ("worker", {"kind": "Pod"}, f"{W}.kind", "metadata and spec"),
]  # fmt: skip


@pytest.mark.parametrize(("role", "template", "path", "words"), REFUSED, ids=[r[2] for r in REFUSED])
def test_what_the_operator_owns_is_refused_naming_the_field(
    role: str, template: dict[str, Any], path: str, words: str
) -> None:
    with pytest.raises(SpecError) as err:
        job_spec(**{role: {"template": template}})
    assert err.value.path == path
    assert words in err.value.message


def test_a_template_mount_on_the_jobs_data_path_is_refused() -> None:
    mount = {"name": "scratch", "mountPath": "/data"}
    with pytest.raises(SpecError) as err:
        job_spec(dataset={"source": "imagenet", "volume": {"persistentVolumeClaim": {"claimName": "c"}}},
                 worker={"template": {"spec": {"volumes": [SCRATCH], "containers": [
                     {"name": "worker", "volumeMounts": [mount]}]}}})  # fmt: skip
    assert err.value.path == f"{W}.spec.containers[0].volumeMounts[0].mountPath"
    # A sidecar mounts where it likes, and a launcher not running ranks has no data volume.
    job_spec(worker={"template": {"spec": {"volumes": [SCRATCH], "containers": [
        {**SIDECAR, "volumeMounts": [mount]}]}}})  # fmt: skip


def test_what_the_launcher_may_set_that_a_worker_may_not() -> None:
    probe = {"exec": {"command": ["true"]}}
    pod = launcher({"spec": {"containers": [{"name": "launcher", "readinessProbe": probe}]}})
    assert container(pod["spec"], "launcher")["readinessProbe"] == probe


def expected_rules(main: str) -> list[tuple[str, str, str]]:
    """(rule, fieldPath, message) of each CEL rule a template of the pod whose own container is `main` must
    carry, from the very lists and words the parser refuses with (dtjob.spec.validators)."""
    grace = "self.spec.terminationGracePeriodSeconds"
    bound = f"!has(self.spec) || !has({grace}) || {grace} <= {validators.TERMINATION_GRACE_MAX_SECONDS}"
    found = [(bound, ".spec.terminationGracePeriodSeconds", validators.TERMINATION_GRACE_WHY)]
    pod_fields = validators.TEMPLATE_OWNED_POD_FIELDS | validators.TEMPLATE_SCHEDULER_POD_FIELDS
    found += [(f"!has(self.spec) || !has(self.spec.{f})", f".spec.{f}", why)
              for f, why in pod_fields.items()]  # fmt: skip
    theirs = [n for n in validators.OPERATOR_VOLUMES if n != validators.SHARED_MEMORY_VOLUME]
    volumes = "!has(self.spec) || !has(self.spec.volumes) || self.spec.volumes.all(v, "
    listed = ", ".join(f"'{n}'" for n in theirs)
    found.append((f"{volumes}!(v.name in [{listed}]))", ".spec.volumes",
                  f"a name is taken: {validators.OPERATOR_VOLUME_WHY}"))  # fmt: skip
    in_memory = "(!has(v.emptyDir.medium) || v.emptyDir.medium == 'Memory')"
    found.append((f"{volumes}v.name != 'dshm' || (has(v.emptyDir) && {in_memory}))", ".spec.volumes",
                  validators.SHARED_MEMORY_WHY))  # fmt: skip
    owned = dict(validators.TEMPLATE_OWNED_CONTAINER_FIELDS)
    if main == names.WORKER_CONTAINER:
        owned.update(validators.TEMPLATE_OWNED_WORKER_FIELDS)
    each = "!has(self.spec) || !has(self.spec.containers) || self.spec.containers.all(c, "
    for field, why in owned.items():
        found.append((f"{each}c.name != '{main}' || !has(c.{field}))", ".spec.containers",
                      f"the {main} container's {field} {why}"))  # fmt: skip
    gpu = "'nvidia.com/gpu'"
    no_gpu = (f"(!has(c.resources.limits) || !({gpu} in c.resources.limits)) && "
              f"(!has(c.resources.requests) || !({gpu} in c.resources.requests))")  # fmt: skip
    found.append((f"{each}c.name != '{main}' || !has(c.resources) || ({no_gpu}))", ".spec.containers",
                  f"the {main} container's {validators.GPU_RESOURCE} {validators.GPU_WHY}"))  # fmt: skip
    if main == names.WORKER_CONTAINER:
        found.append((f"{each}c.name == 'worker' || has(c.image))", ".spec.containers",
                      f"image {validators.IMAGE_REQUIRED_WHY}"))  # fmt: skip
    else:
        found.append((f"{each}c.name == 'launcher')", ".spec.containers", validators.LAUNCHER_ALONE_WHY))
    init = "!has(self.spec) || !has(self.spec.initContainers) || self.spec.initContainers.all(c, "
    found.append((f"{init}has(c.image))", ".spec.initContainers", f"image {validators.IMAGE_REQUIRED_WHY}"))
    found.append((f"{init}c.name != '{main}')", ".spec.initContainers",
                  f"{main} is the name of the operator's container"))  # fmt: skip
    return found


def without_descriptions(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: without_descriptions(v) for k, v in schema.items() if k != "description"}
    if isinstance(schema, list):
        return [without_descriptions(v) for v in schema]
    return schema


@pytest.mark.parametrize("main", [names.WORKER_CONTAINER, names.LAUNCHER_CONTAINER])
def test_the_crds_rules_say_what_the_parser_says(main: str) -> None:
    crd = yaml.safe_load(CRD.read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    template = spec[main]["properties"]["template"]
    rules = [(r["rule"], r["fieldPath"], r["message"]) for r in template["x-kubernetes-validations"]]
    assert rules == expected_rules(main)
    reasons = [r["reason"] for r in template["x-kubernetes-validations"]]
    assert reasons == ["FieldValueInvalid"] + ["FieldValueForbidden"] * (len(reasons) - 1), reasons
    worker = spec["worker"]["properties"]["template"]["properties"]
    assert template["properties"]["metadata"] == worker["metadata"]
    # The launcher's spec is the worker's schema without Kubernetes' descriptions.
    assert without_descriptions(template["properties"]["spec"]) == without_descriptions(worker["spec"])
    labels = template["properties"]["metadata"]["properties"]["labels"]["x-kubernetes-validations"]
    owned = labels[1]["rule"]
    assert f"'{validators.OWNED_LABEL_PREFIX}'" in owned
    assert re.findall(r"'(app\.kubernetes\.io/[^']+)'", owned) == list(validators.OWNED_LABELS)
    assert labels[0] == spec["worker"]["properties"]["podLabels"]["x-kubernetes-validations"][0]


@pytest.mark.parametrize("role", ["worker", "launcher"])
def test_the_crd_refuses_kueues_keys_on_the_pods_but_the_priority_class(role: str) -> None:
    crd = yaml.safe_load(CRD.read_text())
    extras = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][role]
    metadata = extras["properties"]["template"]["properties"]["metadata"]["properties"]
    maps = [extras["properties"]["podLabels"], extras["properties"]["podAnnotations"]]
    maps += [metadata["labels"], metadata["annotations"]]
    allowed = ", ".join(f"'{k}'" for k in validators.KUEUE_KEYS_THE_JOB_SETS)
    rule = f"self.all(k, !k.startsWith('{validators.KUEUE_KEY_PREFIX}') || k in [{allowed}])"
    for schema in maps:
        kueue = [r for r in schema["x-kubernetes-validations"] if validators.KUEUE_KEY_PREFIX in r["rule"]]
        assert kueue == [{"rule": rule, "message": validators.KUEUE_KEY_WHY, "reason": "FieldValueForbidden"}]


def test_the_owned_lists_are_what_the_operator_builds() -> None:
    # Every volume and label the operator builds, and every variable it sets on the launcher itself, is owned.
    body = job_body(dataset={"source": "imagenet", "volume": {"persistentVolumeClaim": {"claimName": "c"}}},
                    checkpoints={"persistentVolumeClaim": {"claimName": "k"}},
                    output={"account": "acct1", "container": "out",
                            "credentials": {"authMode": "workloadIdentity"}})  # fmt: skip
    for spec in (parse_spec(body, CONFIG), job_spec(launcher={"runAsWorker": True})):
        pods = [
            desired.worker_pod(spec, OWNER, 0, 0),
            desired.launcher_pod(spec, OWNER, 0),
        ]
        for pod in pods:
            assert {v["name"] for v in pod["spec"]["volumes"]} <= set(validators.OPERATOR_VOLUMES)
            assert all(validators.owned_label(k) for k in pod["metadata"]["labels"]
                       if not k.startswith(("kueue.x-k8s.io/", "scheduling.x-k8s.io/")))  # fmt: skip
    plain = job_spec(env=[{"name": "A", "value": "1"}])
    env = container(desired.launcher_pod(plain, OWNER, 0)["spec"], "launcher")["env"]
    own = {e["name"] for e in env} - {"A", "DTJOB_EXPECT_GPU"} - {name for name, _ in LAUNCHER_DEFAULT_ENV}
    assert own == set(validators.LAUNCHER_OWNED_ENV)


def test_the_launchers_start_timeout_is_a_default_the_jobs_env_overrides() -> None:
    def launcher_env(spec: Any) -> list[tuple[str, str]]:
        pod = desired.launcher_pod(spec, OWNER, 0)["spec"]
        return [(e["name"], e.get("value", "")) for e in container(pod, "launcher")["env"]]

    assert ("HOROVOD_START_TIMEOUT", "120") in launcher_env(job_spec())
    own = launcher_env(job_spec(env=[{"name": "HOROVOD_START_TIMEOUT", "value": "600"}]))
    assert [value for name, value in own if name == "HOROVOD_START_TIMEOUT"] == ["600"]


def test_a_template_does_not_change_the_parsed_body() -> None:
    template = {"spec": {"containers": [{"name": "worker", "env": [{"name": "A", "value": "1"}]}]}}
    body = job_body(worker={"template": template})
    before = copy.deepcopy(body)
    desired.worker_pod(parse_spec(body, CONFIG), OWNER, 0, 0)
    assert body == before


def test_a_templates_containers_are_observed_too() -> None:
    # An init container that cannot pull its image holds the pod back: the startup deadline must see it.
    stuck = {"metadata": {"name": "rn50-worker-0", "labels": {names.ROLE_LABEL: "worker"}},
             "status": {"phase": "Pending",
                        "initContainerStatuses": [{"name": "fetch", "state": {"waiting": {
                            "reason": "ImagePullBackOff", "message": "no such image"}}}],
                        "containerStatuses": [{"name": "worker", "state": {"waiting": {
                            "reason": "PodInitializing"}}}]}}  # fmt: skip
    state = pod_state(stuck)
    assert state.waiting == "ImagePullBackOff" and state.reason == "ImagePullBackOff: no such image"
    # The restart policy judges the launcher's own exit code, not a sidecar's.
    ended = {"metadata": {"name": "rn50-launcher-x", "labels": {names.ROLE_LABEL: "launcher"}},
             "status": {"phase": "Failed",
                        "initContainerStatuses": [{"name": "proxy", "state": {"terminated": {
                            "exitCode": 143}}}],
                        "containerStatuses": [{"name": "launcher", "state": {"terminated": {
                            "exitCode": 2, "reason": "Error"}}}]}}  # fmt: skip
    assert pod_state(ended).exit_code == 2


def test_a_node_name_stored_before_the_crd_refused_it_is_dropped_from_the_pods() -> None:
    """Bound by name, a worker skipped the nodes the operator keeps it off: on a node whose condition says it
    cannot keep workers, its world restarted there without end, counted against no backoffLimit. The CRD
    refuses a template's nodeName now; a job stored before runs on, its pods placed by the scheduler."""
    pinned = {"template": {"spec": {"nodeName": "aks-gpu-3"}}}
    spec = job_spec(worker=pinned, launcher=pinned)
    for pod in (desired.worker_pod(spec, OWNER, 0, 0), desired.launcher_pod(spec, OWNER, 0)):
        assert "nodeName" not in pod["spec"], pod["spec"]
