"""`dtjob fileserver create|ls|delete`: the NFS share training data lives on (Azure Files premium, NFS 4.1),
reachable from the AKS nodes' subnets only.

Signs in to Azure with DefaultAzureCredential (az login, workload or managed identity); the subscription comes
from --subscription, else $AZURE_SUBSCRIPTION_ID, else the Azure CLI's default subscription. The Kubernetes
side (--apply, and delete's check of the jobs using the share) uses the kubeconfig like kubectl:
--kubeconfig, $KUBECONFIG or ~/.kube/config, --context.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import yaml

from dtjob.azure.fileserver import FileServers, ShareInfo
from dtjob.azure.fileserver_spec import (
    DEFAULT_SHARE,
    MIN_SIZE_GIB,
    FileServerError,
    file_host,
    is_fileserver,
    validate,
    validate_names,
)
from dtjob.cli import kube_access as kube_cli
from dtjob.cli import output
from dtjob.cli.fileserver_dry_run import dry_run, spec_of
from dtjob.cli.fileserver_kube import apply_volume, delete_volume_objects, jobs_using, kube_exit_code
from dtjob.cli.subscription import HELP as SUBSCRIPTION_HELP
from dtjob.cli.subscription import NoSubscription, find_subscription, resolve_subscription
from dtjob.contract.transfer_report import ExitCode
from dtjob.datasets.fileserver_volume import (
    Share,
    blocking,
    nfs_stanza,
    pvc_stanza,
)

Connect = Callable[[argparse.Namespace], FileServers]
KubeConnect = Callable[[argparse.Namespace], Any]  # -> kubernetes.client.ApiClient


def register(subparsers: Any) -> None:
    fileserver = subparsers.add_parser(
        "fileserver", help="manage the NFS file share for training data (Azure Files premium, NFS 4.1)"
    )
    commands = fileserver.add_subparsers(dest="fileserver_command", required=True, metavar="SUBCOMMAND")
    _register_create(commands)
    _register_ls(commands)
    _register_delete(commands)


def _register_create(commands: Any) -> None:
    create = commands.add_parser(
        "create",
        help="create (or check) the storage account and NFS share; print the job's dataset.volume",
        description="Create a Premium FileStorage account with an NFS 4.1 share, reachable only from the AKS "
        "cluster's node subnets (a Microsoft.Storage service endpoint is added to each subnet that lacks "
        "one). "
        "Idempotent: a second run with the same arguments changes nothing. Prints the spec.dataset.volume "
        "stanza to paste into a job, or, with --apply, writes a PersistentVolume and a bound "
        "PersistentVolumeClaim and prints the stanza that uses the claim.",
    )
    _azure_args(create)
    create.add_argument("--cluster", help="AKS cluster: its node subnets and location are used")
    create.add_argument("--cluster-resource-group", help="the cluster's resource group (default -g)")
    create.add_argument("--account", required=True, help="storage account name (3-24 a-z0-9, global)")
    create.add_argument("--share", default=DEFAULT_SHARE, help=f"NFS share name (default {DEFAULT_SHARE})")
    create.add_argument(
        "--size-gib",
        type=int,
        default=1024,
        help=f"provisioned share size, {MIN_SIZE_GIB}-102400 GiB (default 1024); on premium shares the size "
        "also sets the IOPS and throughput, so size for speed, not just for the data",
    )
    create.add_argument("--location", help="Azure region (default: the cluster's)")
    create.add_argument(
        "--subnet-id",
        action="append",
        default=[],
        help="subnet resource ID allowed to mount the share, repeatable (default: the cluster's node "
        "subnets)",
    )
    create.add_argument(
        "--mount-path", default="/data", help="mountPath in the printed stanza (default /data)"
    )
    create.add_argument(
        "--apply", action="store_true", help="write a PersistentVolume and a bound claim into --namespace"
    )
    create.add_argument("--claim-name", help="the claim's name (default: the share's)")
    kube_cli.add_kube_args(create, "the claim's namespace, with --apply")
    create.add_argument(
        "--dry-run", action="store_true", help="print the requests' bodies as JSON; send nothing"
    )
    create.set_defaults(func=run_create)


def _register_ls(commands: Any) -> None:
    ls = commands.add_parser(
        "ls", help="list the file servers (dtjob-tagged FileStorage accounts) and shares"
    )
    ls.add_argument("--subscription", help=SUBSCRIPTION_HELP)
    ls.add_argument("--resource-group", "-g", help="only this resource group (default: the subscription)")
    output.add_output_arg(ls, legacy_json=True)
    ls.set_defaults(func=run_ls)


def _register_delete(commands: Any) -> None:
    delete = commands.add_parser(
        "delete",
        help="delete a share (and its account once it holds no share); refused while a job uses it",
        description="Delete the NFS share, then the storage account if it holds no other share (unless "
        "--keep-account), then the PersistentVolume and claim that create --apply wrote. Refused while a "
        "DistributedTrainingJob that has not finished mounts the share (inline nfs or through a claim), in "
        "any namespace of the cluster --kubeconfig/--context reach.",
    )
    _azure_args(delete)
    delete.add_argument("--account", required=True)
    delete.add_argument("--share", default=DEFAULT_SHARE, help=f"default {DEFAULT_SHARE}")
    delete.add_argument("--keep-account", action="store_true", help="keep the storage account even if empty")
    delete.add_argument(
        "--force", action="store_true", help="delete even while jobs use the share (or it cannot be checked)"
    )
    delete.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    _kube_args(delete)
    delete.set_defaults(func=run_delete)


def _azure_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--subscription", help=SUBSCRIPTION_HELP)
    parser.add_argument("--resource-group", "-g", required=True, help="the storage account's resource group")


def _kube_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", help="kubeconfig file (default $KUBECONFIG or ~/.kube/config)")
    parser.add_argument("--context", help="kubeconfig context (default: its current one)")


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def connect(args: argparse.Namespace) -> FileServers:
    try:
        subscription = resolve_subscription(args.subscription)
    except NoSubscription as err:
        raise FileServerError(str(err), ExitCode.USAGE) from err
    from azure.identity import DefaultAzureCredential

    return FileServers(subscription, args.resource_group or "", DefaultAzureCredential(), progress=_say)


def connect_kube(args: argparse.Namespace) -> Any:
    from kubernetes import config

    return config.new_client_from_config(config_file=args.kubeconfig, context=args.context)


def _guarded(action: Callable[[], int]) -> int:
    try:
        return action()
    except FileServerError as err:
        print(f"dtjob fileserver: {err}", file=sys.stderr)
        return err.exit_code


def _print_stanza(volume: dict[str, Any], what: str) -> None:
    print(f"# {what}: paste under spec.dataset of a DistributedTrainingJob (or use it as spec.checkpoints)")
    print(yaml.safe_dump({"volume": volume}, sort_keys=False), end="")


# --- create ------------------------------------------------------------------------------------------------


def run_create(
    args: argparse.Namespace, connect: Connect = connect, connect_kube: KubeConnect = connect_kube
) -> int:
    def action() -> int:
        if not args.cluster and not (args.subnet_id and args.location):
            raise FileServerError(
                "--cluster: required unless both --subnet-id and --location are given", ExitCode.USAGE
            )
        validate(spec_of(args, args.location or "", tuple(args.subnet_id)))
        namespace = claim_namespace(args) if args.apply else ""
        if args.dry_run:
            args.subscription = find_subscription(args.subscription)  # the IDs it prints name it
            return dry_run(args, namespace)
        servers = connect(args)
        location, subnets = args.location or "", tuple(args.subnet_id)
        if args.cluster and not (location and subnets):
            cluster_location, cluster_subnets = servers.cluster_network(
                args.cluster, args.cluster_resource_group or ""
            )
            location, subnets = location or cluster_location, subnets or cluster_subnets
        account, changes = servers.create(spec_of(args, location, subnets))
        share = Share(args.account, args.share, file_host(account, args.account), args.size_gib)
        for change in changes:
            _say(change)
        if not changes:
            _say(f"file server {args.account}/{args.share} exists as asked: nothing changed in Azure")
        if not args.apply:
            _print_stanza(nfs_stanza(share, args.mount_path), "an inline NFS volume")
            return 0
        claim = args.claim_name or args.share
        try:
            lines = apply_volume(connect_kube(args), share, namespace, claim)
        except FileServerError:
            raise
        except Exception as err:  # no kubeconfig, no such context, an API server that does not answer
            summary = " ".join(str(err).split())[:300]
            raise FileServerError(
                f"the share is ready, but the PV and claim were not written: {type(err).__name__}: "
                f"{summary}; check --kubeconfig/--context and run create --apply again",
                kube_exit_code(err),
            ) from err
        for line in lines:
            _say(line)
        _print_stanza(pvc_stanza(claim, args.mount_path), f"the claim {namespace}/{claim}")
        return 0

    return _guarded(action)


def claim_namespace(args: argparse.Namespace) -> str:
    """-n/--namespace, else the kubeconfig context's namespace, else default, as for every other command.
    Without a readable kubeconfig, --dry-run plans with default; --apply is refused before Azure is asked."""
    try:
        return kube_cli.namespace(args)
    except kube_cli.KubeFailure as err:
        if args.dry_run:
            _say(f"{err}: the plan puts the claim in namespace default (-n names another)")
            return "default"
        raise FileServerError(f"{err}: --apply needs it to write the claim", err.code) from None


# --- ls ----------------------------------------------------------------------------------------------------


def run_ls(args: argparse.Namespace, connect: Connect = connect) -> int:
    def action() -> int:
        shares = connect(args).list_shares(all_groups=not args.resource_group)
        if args.output != "text":
            print(output.dump([_share_json(s) for s in shares], args.output))
            return 0
        header = ("ACCOUNT", "SHARE", "SIZE", "PROTOCOL", "RESOURCE GROUP", "LOCATION", "ENDPOINT")
        print(_row(*header))
        for s in shares:
            size = f"{s.size_gib}GiB" if s.size_gib is not None else "?"
            print(
                _row(
                    s.account, s.share, size, s.protocol, s.resource_group, s.location, f"{s.server}:{s.path}"
                )
            )
        return 0

    return _guarded(action)


def _row(account: str, share: str, size: str, protocol: str, group: str, location: str, endpoint: str) -> str:
    return f"{account:<24} {share:<20} {size:>9} {protocol:<8} {group:<20} {location:<14} {endpoint}"


def _share_json(share: ShareInfo) -> dict[str, Any]:
    return {
        "account": share.account,
        "resourceGroup": share.resource_group,
        "location": share.location,
        "share": share.share,
        "sizeGiB": share.size_gib,
        "protocol": share.protocol,
        "nfs": {"server": share.server, "path": share.path},
    }


# --- delete ------------------------------------------------------------------------------------------------


def _check_unused(args: argparse.Namespace, server: str, connect_kube: KubeConnect) -> Any:
    """Refuses (unless --force) while an unfinished job mounts the share or that cannot be checked; the
    cluster's API client, None where it could not be reached (with --force)."""
    path = f"/{args.account}/{args.share}"
    try:
        kube = connect_kube(args)
        users = jobs_using(kube, server, path)
    except Exception as err:
        if not args.force:
            raise FileServerError(
                f"cannot check which jobs use {server}:{path} ({type(err).__name__}: "
                f"{' '.join(str(err).split())[:300]}); check --kubeconfig/--context, or --force",
                kube_exit_code(err),
            ) from err
        _say(f"not checked which jobs use the share ({type(err).__name__}); --force")
        return None
    busy = blocking(users)
    if busy and not args.force:
        names = "; ".join(str(use) for use in busy)
        raise FileServerError(
            f"share {args.account}/{args.share} is in use by {len(busy)} unfinished job(s): {names}. "
            f"Delete or wait for them, or pass --force"
        )
    for use in busy:
        _say(f"in use, deleting anyway (--force): {use}")
    return kube


def run_delete(
    args: argparse.Namespace,
    connect: Connect = connect,
    connect_kube: KubeConnect = connect_kube,
    confirm: Callable[[str], str] = input,
) -> int:
    def action() -> int:
        validate_names(args.account, args.share)
        servers = connect(args)
        account = servers.get_account(args.account)
        if account is None:
            _say(f"no storage account {args.account} in {args.resource_group}: nothing to delete")
            return 0
        if not is_fileserver(account) and not args.force:
            raise FileServerError(
                f"storage account {args.account} is not a dtjob file server (no dtjob-fileserver tag); "
                f"--force deletes its share anyway"
            )
        kube = _check_unused(args, file_host(account, args.account), connect_kube)
        if not args.yes:
            answer = confirm(f"Delete share {args.account}/{args.share} and all data on it? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                _say("not deleted")
                return 1
        if servers.get_share(args.account, args.share) is None:
            _say(f"share {args.account}/{args.share}: already gone")
        else:
            servers.delete_share(args.account, args.share)
            print(f"deleted share {args.account}/{args.share}")
        remaining = servers.share_names(args.account)
        if remaining or args.keep_account:
            why = f"it holds {', '.join(remaining)}" if remaining else "--keep-account"
            _say(f"storage account {args.account} kept ({why})")
        else:
            servers.delete_account(args.account)
            print(f"deleted storage account {args.account}")
        if kube is not None:
            for line in delete_volume_objects(kube, args.account, args.share):
                _say(line)
        return 0

    return _guarded(action)
