"""`dtjob fileserver create --dry-run`: the requests create would send, printed as JSON, and nothing sent."""

from __future__ import annotations

import argparse
import json
from typing import Any

from dtjob.azure.fileserver_spec import FILE_SUFFIX, FileServerSpec, account_body, share_body, validate
from dtjob.datasets.fileserver_volume import Share, persistent_volume, persistent_volume_claim


def spec_of(args: argparse.Namespace, location: str, subnets: tuple[str, ...]) -> FileServerSpec:
    return FileServerSpec(args.account, args.share, args.size_gib, location, subnets)


def dry_run(args: argparse.Namespace, namespace: str) -> int:
    """The requests create would send to a subscription where nothing exists yet, and nothing sent: where
    the cluster would be read for the location or subnets, a placeholder says so."""
    subnets = tuple(args.subnet_id)
    location = args.location or f"<location of cluster {args.cluster}>"
    spec = spec_of(args, location, subnets)
    validate(spec)
    account = account_body(spec)
    if not subnets:
        rule = {"id": f"<each node pool subnet of cluster {args.cluster}>", "action": "Allow"}
        account["properties"]["networkAcls"]["virtualNetworkRules"] = [rule]
    storage = (
        f"/subscriptions/{args.subscription or '<subscription>'}/resourceGroups/{args.resource_group}"
        f"/providers/Microsoft.Storage/storageAccounts/{args.account}"
    )
    requests: list[dict[str, Any]] = [
        {
            "method": "PUT",
            "url": subnet,
            "body": "the subnet as it is, with serviceEndpoints + {'service': 'Microsoft.Storage'}",
            "when": "the subnet lacks the Microsoft.Storage service endpoint",
        }
        for subnet in (subnets or (f"<each node pool subnet of cluster {args.cluster}>",))
    ]
    requests.append(
        {
            "method": "PUT",
            "url": storage,
            "body": account,
            "when": "the account does not exist (else a PATCH of what differs)",
        }
    )
    requests.append(
        {
            "method": "PUT",
            "url": f"{storage}/fileServices/default/shares/{args.share}",
            "body": share_body(spec),
            "when": "the share does not exist (else a PATCH of what differs)",
        }
    )
    plan: dict[str, Any] = {"azure": requests}
    if args.apply:
        share = Share(args.account, args.share, f"{args.account}.{FILE_SUFFIX}", args.size_gib)
        claim = args.claim_name or args.share
        plan["kubernetes"] = [
            persistent_volume(share, namespace, claim),
            persistent_volume_claim(share, namespace, claim),
        ]
    print(json.dumps(plan, indent=2))
    return 0
