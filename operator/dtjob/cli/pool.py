"""`dtjob pool create|scale|delete|ls`: the AKS GPU node pool dtjob jobs run on.

Signs in with DefaultAzureCredential (az login, workload or managed identity). The subscription comes from
--subscription, else $AZURE_SUBSCRIPTION_ID, else the Azure CLI's default subscription. `pool create` first
checks that the subscription's vCPU quota in the cluster's region has room for the pool at its --max.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from dtjob.azure.aks import (
    DEFAULT_TAINT,
    DEFAULT_VM_SIZE,
    GpuPool,
    NodePools,
    PoolError,
    QuotaUnreadable,
    agent_pool_body,
    image_compatibility_note,
)
from dtjob.cli import output
from dtjob.cli.deprecation import Deprecated
from dtjob.cli.subscription import HELP as SUBSCRIPTION_HELP
from dtjob.cli.subscription import NoSubscription, resolve_subscription
from dtjob.contract.transfer_report import ExitCode

DEFAULT_POOL_NAME = "gpu"  # the chart's default for the pool the operator selects

Connect = Callable[[argparse.Namespace], NodePools]


def register(subparsers: Any) -> None:
    pool = subparsers.add_parser("pool", help="manage the AKS GPU node pool")
    commands = pool.add_subparsers(dest="pool_command", required=True, metavar="SUBCOMMAND")
    _register_create(commands)

    scale = commands.add_parser("scale", help="change autoscaler bounds (or pin a fixed count)")
    _cluster_args(scale)
    scale.add_argument("name", metavar="NAME", help="pool name")
    scale.add_argument("--min", type=int, dest="min_count")
    scale.add_argument("--max", type=int, dest="max_count")
    scale.add_argument("--count", type=int, help="fixed node count; turns autoscaling off")
    scale.set_defaults(func=run_scale)

    delete = commands.add_parser("delete", help="delete a pool (its nodes and their pods go with it)")
    _cluster_args(delete)
    delete.add_argument("name", metavar="NAME", help="pool name")
    delete.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    delete.set_defaults(func=run_delete)

    ls = commands.add_parser("ls", help="list the cluster's pools")
    _cluster_args(ls)
    output.add_output_arg(ls, "a table; json and yaml give the full resources", legacy_json=True)
    ls.set_defaults(func=run_ls)


def _register_create(commands: Any) -> None:
    create = commands.add_parser(
        "create",
        help="create a GPU pool that autoscales from zero",
        description="Create a User-mode GPU pool that autoscales from --min to --max. First checks that "
        "the subscription's vCPU quota in the cluster's region (the VM family's and the regional total; "
        "for --spot the regional low-priority total) has room for --max nodes, and says what is missing and "
        "how to ask for it if not.",
    )
    create.add_argument(
        "name", nargs="?", metavar="NAME", help="pool name (default gpu, what the operator selects)"
    )
    _cluster_args(create)
    create.add_argument("--name", dest="name_flag", action=Deprecated, use="the pool name as NAME ({value})")
    create.add_argument("--vm-size", default=DEFAULT_VM_SIZE, help=f"VM size (default {DEFAULT_VM_SIZE})")
    create.add_argument("--min", type=int, default=0, dest="min_count", help="autoscaler minimum (default 0)")
    create.add_argument("--max", type=int, default=4, dest="max_count", help="autoscaler maximum (default 4)")
    create.add_argument("--count", type=int, help="nodes to start with (default --min)")
    create.add_argument("--os-disk-size", type=int, default=256, help="OS disk GB (default 256)")
    create.add_argument("--os-disk-type", default="Managed", help="Managed or Ephemeral (default Managed)")
    create.add_argument("--os-sku", default="Ubuntu", help="Ubuntu or AzureLinux (default Ubuntu)")
    create.add_argument(
        "--taint", action="append", help=f"node taint, repeatable (default {DEFAULT_TAINT}; replaces it)"
    )
    create.add_argument("--label", action="append", default=[], help="node label key=value, repeatable")
    create.add_argument("--zones", nargs="+", default=[], help="availability zones, e.g. 1 2 3")
    create.add_argument("--max-pods", type=int, help="pods per node")
    create.add_argument("--spot", action="store_true", help="Spot VMs (evicted at any time; cheap)")
    create.add_argument(
        "--gpu-driver", default="Install", help="Install, or None if the GPU Operator does it"
    )
    create.add_argument("--kubernetes-version", help="default: the cluster's")
    create.add_argument("--subnet-id", help="VNet subnet resource ID (default: the cluster's)")
    create.add_argument(
        "--skip-quota-check",
        action="store_true",
        help="create the pool even if the vCPU quota has no room for --max nodes (e.g. while an increase "
        "is pending)",
    )
    create.add_argument(
        "--dry-run",
        action="store_true",
        help="print the request body and send no write; the quota is still checked (reads only, unless "
        "--skip-quota-check) and a shortage exits as create would, while a check that cannot be made "
        "(no credentials, no subscription) is only noted",
    )
    create.set_defaults(func=run_create)


def _cluster_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--subscription", help=SUBSCRIPTION_HELP)
    parser.add_argument("--resource-group", "-g", required=True)
    parser.add_argument("--cluster", required=True, help="AKS cluster name")


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def connect(args: argparse.Namespace) -> NodePools:
    try:
        subscription = resolve_subscription(args.subscription)
    except NoSubscription as err:
        raise PoolError(str(err)) from err
    from azure.identity import DefaultAzureCredential

    return NodePools(subscription, args.resource_group, args.cluster, DefaultAzureCredential(), progress=_say)


def _labels(pairs: list[str]) -> dict[str, str]:
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise PoolError(f"--label: expected key=value, got {pair!r}")
        labels[key] = value
    return labels


def pool_name(args: argparse.Namespace) -> str:
    """`pool create [NAME]`'s name: NAME, else the deprecated --name, else gpu."""
    flag = getattr(args, "name_flag", None)
    if flag is not None and args.name is not None and flag != args.name:
        raise PoolError(f"NAME {args.name!r} and --name {flag!r} differ: name the pool once, as NAME")
    return str(args.name or flag or DEFAULT_POOL_NAME)


def pool_from_args(args: argparse.Namespace) -> GpuPool:
    return GpuPool(
        name=pool_name(args),
        vm_size=args.vm_size,
        min_count=args.min_count,
        max_count=args.max_count,
        count=args.count,
        os_disk_size_gb=args.os_disk_size,
        os_disk_type=args.os_disk_type,
        os_sku=args.os_sku,
        taints=tuple(args.taint) if args.taint else (DEFAULT_TAINT,),
        labels=_labels(args.label),
        zones=tuple(args.zones),
        max_pods=args.max_pods,
        spot=args.spot,
        gpu_driver=args.gpu_driver,
        kubernetes_version=args.kubernetes_version,
        subnet_id=args.subnet_id,
    )


def _guarded(action: Callable[[], int]) -> int:
    try:
        return action()
    except PoolError as err:
        print(f"dtjob pool: {err}", file=sys.stderr)
        return err.exit_code


def _summary(resource: dict[str, Any]) -> str:
    props = resource.get("properties") or {}
    if props.get("enableAutoScaling"):
        size = f"autoscale {props.get('minCount')}-{props.get('maxCount')} (now {props.get('count')})"
    else:
        size = f"fixed {props.get('count')}"
    taints = ",".join(props.get("nodeTaints") or []) or "-"
    state = props.get("provisioningState", "?")
    name, mode, vm_size = resource.get("name", "?"), props.get("mode", "?"), props.get("vmSize", "?")
    return f"{name:<12} {mode:<6} {vm_size:<22} {size:<28} {taints:<24} {state}"


def run_create(args: argparse.Namespace, connect: Connect = connect) -> int:
    def action() -> int:
        pool = pool_from_args(args)
        body = agent_pool_body(pool)
        note = image_compatibility_note(pool.vm_size)
        if note:
            _say(f"dtjob pool: note: {note}")
        if args.dry_run:
            print(json.dumps(body, indent=2))
            return 0 if args.skip_quota_check else _dry_run_quota(args, pool, connect)
        pools = connect(args)
        if not args.skip_quota_check:
            _check_quota(pools, pool)
        print(_summary(pools.create(pool)))
        return 0

    return _guarded(action)


class QuotaRefused(PoolError):
    """The quota check's verdict that the pool cannot get its nodes (not a failure to make the check)."""


def _check_quota(pools: NodePools, pool: GpuPool) -> None:
    """Report the quota finding; raise QuotaRefused, before any write, when the pool cannot get its nodes.
    An identity that may create pools but not read the subscription's usage is told so, and goes on."""
    try:
        finding = pools.check_quota(pool)
    except QuotaUnreadable as err:
        _say(f"dtjob pool: note: quota not checked: {err}")
        return
    for note in finding.notes:
        _say(f"dtjob pool: note: {note}")
    if finding.refusal is not None:
        # A shortage is Azure's "no quota", as ARM's QuotaExceeded would be; a size the region does not
        # offer this subscription is a bad --vm-size, --zones or --spot.
        code = ExitCode.STORAGE if finding.shortages else ExitCode.USAGE
        raise QuotaRefused(finding.refusal, exit_code=code)
    if finding.needs:
        _say(f"dtjob pool: {finding.summary()}")


def _dry_run_quota(args: argparse.Namespace, pool: GpuPool, connect: Connect) -> int:
    """A dry run's quota check: a refusal fails as create would; a check that cannot be made (no
    subscription, no credentials, no answer) is only noted, since the request body is what a dry run is
    for and it is printed already."""
    try:
        _check_quota(connect(args), pool)
    except QuotaRefused:
        raise
    except PoolError as err:
        _say(f"dtjob pool: note: quota not checked: {err}")
    return 0


def run_scale(args: argparse.Namespace, connect: Connect = connect) -> int:
    def action() -> int:
        print(_summary(connect(args).scale(args.name, args.min_count, args.max_count, args.count)))
        return 0

    return _guarded(action)


def run_delete(
    args: argparse.Namespace, connect: Connect = connect, confirm: Callable[[str], str] = input
) -> int:
    def action() -> int:
        if not args.yes:
            answer = confirm(f"Delete pool {args.name} of {args.resource_group}/{args.cluster}? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                print("not deleted", file=sys.stderr)
                return 1
        connect(args).delete(args.name)
        print(f"deleted pool {args.name}")
        return 0

    return _guarded(action)


def run_ls(args: argparse.Namespace, connect: Connect = connect) -> int:
    def action() -> int:
        pools = connect(args).list()
        if args.output != "text":
            print(output.dump(pools, args.output))
            return 0
        print(f"{'NAME':<12} {'MODE':<6} {'VM SIZE':<22} {'NODES':<28} {'TAINTS':<24} STATE")
        for resource in sorted(pools, key=lambda r: str(r.get("name"))):
            print(_summary(resource))
        return 0

    return _guarded(action)
