"""`dtjob operator`: run the kopf operator (also what `python -m dtjob operator` and the image run)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import secrets
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dtjob.cli.deprecation import Deprecated

DEFAULT_LIVENESS = "http://0.0.0.0:8080/healthz"
# The Prometheus /metrics server (dtjob.runtime.metrics_server).
DEFAULT_METRICS_PORT = 8081
DEFAULT_METRICS_ADDRESS = "0.0.0.0"
# Where a pod finds its own namespace when the downward API does not set POD_NAMESPACE.
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "operator", help="run the DistributedTrainingJob operator", description=__doc__
    )
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "--watch-namespace", action="append", dest="namespaces", metavar="NS",
        help="watch this namespace (repeatable; globs allowed); default: the whole cluster",
    )  # fmt: skip
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace (default)")
    # -n/--namespace names one namespace in every other command (kubectl's meaning); here it was the watch
    # list. Kept for one release, hidden, saying so; it adds to --watch-namespace's list.
    parser.add_argument(
        "-n", "--namespace", action=Deprecated, dest="namespaces", append=True,
        use="--watch-namespace {value}",
    )  # fmt: skip
    parser.add_argument(
        "--liveness", default=DEFAULT_LIVENESS, metavar="URL",
        help=f"liveness endpoint served by the operator (default {DEFAULT_LIVENESS}), readiness at /readyz "
             "on the same port; 'none' disables both",
    )  # fmt: skip
    parser.add_argument(
        "--leader-elect", action=argparse.BooleanOptionalAction, default=None,
        help="run as one of several replicas: only the holder of a Lease in the operator's namespace writes "
             "(default: on in a cluster, or when POD_NAMESPACE is set; off otherwise)",
    )  # fmt: skip
    parser.add_argument(
        "--lease-namespace", metavar="NS",
        help="the Lease's namespace (default: POD_NAMESPACE, else the pod's own namespace)",
    )  # fmt: skip
    parser.add_argument(
        "--metrics-port", type=_port, metavar="PORT",
        help="serve Prometheus metrics at /metrics on this port (default: $DTJOB_METRICS_PORT, else "
        f"{DEFAULT_METRICS_PORT}); 0 disables it",
    )  # fmt: skip
    parser.add_argument(
        "--metrics-address", metavar="ADDR",
        help=f"address the metrics server binds (default: $DTJOB_METRICS_ADDRESS, else "
        f"{DEFAULT_METRICS_ADDRESS})",
    )  # fmt: skip
    parser.add_argument(
        "--metrics-secure", action=argparse.BooleanOptionalAction, default=None,
        help="serve /metrics over HTTPS, only to callers whose bearer token the API server accepts and whose "
             "user may get the non-resource URL /metrics (default: $DTJOB_METRICS_SECURE, else off)",
    )  # fmt: skip
    parser.add_argument(
        "--metrics-cert-dir", type=Path, metavar="DIR",
        help="the secure metrics server's tls.crt and tls.key (default: $DTJOB_METRICS_CERT_DIR, else a "
        "self-signed one made at start)",
    )  # fmt: skip
    parser.add_argument("-v", "--verbose", action="store_true", help="log every reconcile decision")
    parser.add_argument("--debug", action="store_true", help="log kopf internals too")
    parser.set_defaults(func=run)


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port number from 0 to 65535, not {text!r}")
    return port


def metrics_endpoint(args: argparse.Namespace) -> tuple[str, int]:
    """(address, port) of the metrics server: the flags, else the environment, else the defaults."""
    port = args.metrics_port
    if port is None:
        try:
            port = _port(os.environ.get("DTJOB_METRICS_PORT", str(DEFAULT_METRICS_PORT)))
        except argparse.ArgumentTypeError as err:
            raise SystemExit(f"dtjob operator: DTJOB_METRICS_PORT: {err}") from None
    address = args.metrics_address or os.environ.get("DTJOB_METRICS_ADDRESS") or DEFAULT_METRICS_ADDRESS
    return address, port


def metrics_secure(args: argparse.Namespace, env: Mapping[str, str]) -> bool:
    if args.metrics_secure is not None:
        return bool(args.metrics_secure)
    value = env.get("DTJOB_METRICS_SECURE", "").strip().lower()
    if value not in ("", "true", "false", "1", "0"):
        raise SystemExit(f"dtjob operator: DTJOB_METRICS_SECURE: true or false, not {value!r}")
    return value in ("true", "1")


def metrics_cert_dir(args: argparse.Namespace, env: Mapping[str, str]) -> Path | None:
    cert_dir: Path | None = args.metrics_cert_dir
    return cert_dir or (Path(env["DTJOB_METRICS_CERT_DIR"]) if env.get("DTJOB_METRICS_CERT_DIR") else None)


def _redact_signatures(record: logging.LogRecord) -> bool:
    from dtjob.azure.sas import redact

    message = record.getMessage()
    if "sig=" in message.lower():
        record.msg, record.args = redact(message), None
    return True


def lease_namespace(
    args: argparse.Namespace, env: Mapping[str, str], sa_namespace: Path = SERVICE_ACCOUNT_NAMESPACE
) -> str | None:
    """The namespace of the leader Lease, or None without leader election. By default leader election is on
    in a cluster (a pod, where replicas may run side by side) and off outside one (`make demo`, the tests),
    unless POD_NAMESPACE says where the Lease goes."""
    in_cluster = bool(env.get("KUBERNETES_SERVICE_HOST"))
    namespace = args.lease_namespace or env.get("POD_NAMESPACE")
    if not namespace and in_cluster and sa_namespace.exists():
        namespace = sa_namespace.read_text().strip()
    enabled = args.leader_elect if args.leader_elect is not None else bool(in_cluster or namespace)
    if not enabled:
        return None
    if not namespace:
        raise SystemExit("--leader-elect needs the Lease's namespace: set POD_NAMESPACE or --lease-namespace")
    return namespace


def identity(env: Mapping[str, str]) -> str:
    """This replica's name in the Lease: the pod's name and a random suffix (a restarted container of the
    same pod is another replica)."""
    return f"{env.get('POD_NAME') or socket.gethostname()}_{secrets.token_hex(4)}"


def watched_namespaces(args: argparse.Namespace) -> list[str]:
    """The watch list (empty: the whole cluster)."""
    if args.all_namespaces and args.namespaces:
        raise SystemExit(
            "dtjob operator: -A/--all-namespaces and --watch-namespace (or --namespace) exclude each other"
        )
    return list(args.namespaces or [])


def run(args: argparse.Namespace) -> int:
    # The operator calls the API server through its own client (dtjob.kube.connect), never the official one,
    # whose package (the CLI's) kopf would import only because it is installed: about 15 MB of model classes
    # in every replica. Hidden from this process, kopf logs in through dtjob.runtime.handlers.login.
    sys.modules.setdefault("kubernetes", None)  # type: ignore[arg-type]
    from dtjob.runtime import heap

    heap.limit_arenas()  # before any thread starts
    import kopf

    import dtjob.runtime.handlers  # registers the handlers with kopf's default registry
    from dtjob.runtime import metrics_server

    kopf.configure(verbose=args.verbose, debug=args.debug)
    # The Azure SDK logs every request at INFO and urllib3 every URL (a SAS among them) at DEBUG; the
    # operator's own lines say what it did with storage, so both stay at warnings, even with --debug, and
    # every handler blanks SAS signatures in whatever still gets through.
    for noisy in ("azure", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    for handler in logging.getLogger().handlers:
        handler.addFilter(_redact_signatures)
    namespaces = watched_namespaces(args)
    address, port = metrics_endpoint(args)
    if port:
        secure, cert_dir = metrics_secure(args, os.environ), metrics_cert_dir(args, os.environ)
        metrics_server.start(address, port, secure, cert_dir)
    options = dtjob.runtime.handlers.RunOptions(
        liveness=None if args.liveness == "none" else args.liveness,
        lease_namespace=lease_namespace(args, os.environ),
        identity=identity(os.environ),
        namespaces=tuple(namespaces),
    )
    asyncio.run(
        kopf.operator(
            # No kopf peering: with it, a standby would pause its watches and take over cold. Every replica
            # watches; the Lease (dtjob.runtime.election) decides which one writes.
            standalone=True,
            clusterwide=not namespaces,
            namespaces=namespaces,
            liveness_endpoint=None,  # dtjob.runtime.health serves it, with readiness, beside the controller
            memo=kopf.Memo(options=options),
        )
    )
    return 0
