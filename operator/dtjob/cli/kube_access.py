"""The Kubernetes side of the `dtjob` commands for people following their jobs: kubectl's connection flags
(--kubeconfig, --context, -n/--namespace), reading a DistributedTrainingJob, its events and pods, annotating
it, and running a command in one of its pods (as `kubectl exec`, with the caller's own rights)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from dtjob import API_GROUP, API_VERSION, KIND, PLURAL
from dtjob.contract.transfer_report import ExitCode


@dataclass
class KubeFailure(Exception):
    code: ExitCode
    reason: str

    def __str__(self) -> str:
        return self.reason


def add_kube_args(parser: argparse.ArgumentParser, what: str = "the job's namespace") -> None:
    """kubectl's connection flags; -n/--namespace is always a namespace, defaulting to the context's."""
    parser.add_argument("-n", "--namespace", help=f"{what} (default: the context's, or default)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default $KUBECONFIG, then ~/.kube/config)")
    parser.add_argument("--context", help="kubeconfig context (default: the current one)")


@dataclass
class Cluster:
    api: Any  # kubernetes.client.ApiClient
    namespace: str

    def read_job(self, name: str) -> dict[str, Any]:
        from kubernetes import client

        job = self.call(
            f"reading job {name}",
            lambda: client.CustomObjectsApi(self.api).get_namespaced_custom_object(
                API_GROUP, API_VERSION, self.namespace, PLURAL, name
            ),
            missing=f"no DistributedTrainingJob {name!r} in namespace {self.namespace}",
        )
        return cast(dict[str, Any], job)

    def create_job(self, body: dict[str, Any]) -> dict[str, Any]:
        from kubernetes import client

        name = (body.get("metadata") or {}).get("name")
        job = self.call(
            f"creating job {name}",
            lambda: client.CustomObjectsApi(self.api).create_namespaced_custom_object(
                API_GROUP, API_VERSION, self.namespace, PLURAL, body
            ),
        )
        return cast(dict[str, Any], job)

    def delete_job(self, name: str) -> None:
        """Delete the job; its children go with it (they are owned by it: garbage collection)."""
        from kubernetes import client

        self.call(
            f"deleting job {name}",
            lambda: client.CustomObjectsApi(self.api).delete_namespaced_custom_object(
                API_GROUP, API_VERSION, self.namespace, PLURAL, name
            ),
            missing=f"no DistributedTrainingJob {name!r} in namespace {self.namespace}",
        )

    def job_events(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        """The events about this job (this UID: not those of an earlier job with the same name)."""
        from kubernetes import client

        meta = job["metadata"]
        selector = (
            f"involvedObject.kind={KIND},involvedObject.name={meta['name']},involvedObject.uid={meta['uid']}"
        )
        events = self.call(
            f"listing the events of job {meta['name']}",
            lambda: client.CoreV1Api(self.api).list_namespaced_event(self.namespace, field_selector=selector),
        )
        return [self.api.sanitize_for_serialization(e) for e in events.items]

    def read_pod(self, name: str) -> dict[str, Any]:
        from kubernetes import client

        pod = self.call(
            f"reading pod {name}",
            lambda: client.CoreV1Api(self.api).read_namespaced_pod(name, self.namespace),
            missing=f"no pod {name!r} in namespace {self.namespace}",
        )
        return cast(dict[str, Any], self.api.sanitize_for_serialization(pod))

    def annotate_job(self, name: str, key: str, value: str) -> None:
        from kubernetes import client

        patch = {"metadata": {"annotations": {key: value}}}
        self.call(
            f"annotating job {name}",
            lambda: client.CustomObjectsApi(self.api).patch_namespaced_custom_object(
                API_GROUP, API_VERSION, self.namespace, PLURAL, name, patch
            ),
            missing=f"no DistributedTrainingJob {name!r} in namespace {self.namespace}",
        )

    def exec_in_pod(
        self,
        pod: str,
        container: str,
        command: list[str],
        stdin: str,
        output: Callable[[str], None],
        deadline_s: float,
    ) -> int:
        """Run `command` in the pod's container as `kubectl exec -i` does: `stdin` written to it, its stdout
        and stderr passed to `output` as they come. Its exit status; KubeFailure once it ran `deadline_s`
        (what runs there is the pod's image, which need not ever end)."""
        from kubernetes import client
        from kubernetes.stream import stream

        core = client.CoreV1Api(self.api)
        session = self.call(
            f"running a command in pod {pod}",
            lambda: stream(
                core.connect_get_namespaced_pod_exec,
                pod,
                self.namespace,
                container=container,
                command=command,
                stdin=True,
                stdout=True,
                stderr=True,
                tty=False,
                _preload_content=False,
            ),
            missing=f"no pod {pod!r} in namespace {self.namespace}",
        )
        ends = time.monotonic() + deadline_s
        try:
            session.write_stdin(stdin)
            while session.is_open():
                if time.monotonic() > ends:
                    raise KubeFailure(
                        ExitCode.STORAGE, f"the command in pod {pod} ran past {deadline_s:.0f} s; stopped"
                    )
                session.update(timeout=1)
                for read, peek in (
                    (session.read_stdout, session.peek_stdout),
                    (session.read_stderr, session.peek_stderr),
                ):
                    if peek():
                        output(read())
        finally:
            session.close()
        code = session.returncode
        return int(code) if code is not None else int(ExitCode.STORAGE)

    def call(self, what: str, call: Any, missing: str | None = None) -> Any:
        """`call()`, its API errors turned into one KubeFailure naming `what` (`missing` for a 404)."""
        from kubernetes.client.exceptions import ApiException

        try:
            return call()
        except ApiException as err:
            raise api_failure(err, what, missing) from None
        except Exception as err:
            failure = unreachable(err, what)
            if failure is None:
                raise
            raise failure from None


def api_failure(err: Any, what: str, missing: str | None = None) -> KubeFailure:
    """The KubeFailure of an ApiException: 404 not found (when `missing` says what), 401/403 denied, any
    other answer a failure of the API server."""
    if err.status == 404 and missing:
        return KubeFailure(ExitCode.NOT_FOUND, missing)
    code = ExitCode.DENIED if err.status in (401, 403) else ExitCode.STORAGE
    return KubeFailure(code, f"{what}: {err.status} {err.reason}")


def unreachable(err: Exception, what: str) -> KubeFailure | None:
    """The KubeFailure of an API server that could not be reached or broke off (urllib3 gives up after its
    retries with an error that is not an OSError), or None for any other exception."""
    import urllib3

    if not isinstance(err, (OSError, urllib3.exceptions.HTTPError)):
        return None
    reason = getattr(err, "reason", None) or err
    return KubeFailure(
        ExitCode.STORAGE, f"{what}: cannot reach the API server ({' '.join(str(reason).split())})"
    )


def connect(args: argparse.Namespace) -> Cluster:
    """An API client and the namespace to use, picked as kubectl picks them."""
    return connect_to(args.kubeconfig, args.context, args.namespace)


def connect_to(kubeconfig: str | None, context: str | None, namespace_name: str | None) -> Cluster:
    """connect() without argparse: the kubeconfig file ($KUBECONFIG, then ~/.kube/config when None), its
    context (the current one when None) and the namespace (the context's, else default, when None)."""
    from kubernetes import config
    from kubernetes.config.config_exception import ConfigException

    try:
        api = config.new_client_from_config(config_file=kubeconfig, context=context)
    except (ConfigException, OSError) as err:
        raise KubeFailure(ExitCode.USAGE, f"cannot load the kubeconfig: {err}") from None
    chosen = argparse.Namespace(kubeconfig=kubeconfig, context=context, namespace=namespace_name)
    return Cluster(api, namespace(chosen))


def namespace(args: argparse.Namespace) -> str:
    """-n/--namespace, else the namespace of the kubeconfig's context (--context, or the current one), else
    default: kubectl's choice. KubeFailure(USAGE) when the kubeconfig cannot be read."""
    if args.namespace:
        return str(args.namespace)
    from kubernetes import config
    from kubernetes.config.config_exception import ConfigException

    try:
        contexts, current = config.list_kube_config_contexts(config_file=args.kubeconfig)
    except (ConfigException, OSError) as err:
        raise KubeFailure(ExitCode.USAGE, f"cannot load the kubeconfig: {err}") from None
    chosen = next((c for c in contexts if c["name"] == args.context), current) if args.context else current
    return str(((chosen or {}).get("context") or {}).get("namespace") or "default")
