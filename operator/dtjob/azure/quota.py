"""The vCPU quota a GPU pool needs, against what the subscription has free in the cluster's region: the
decision (pure: `check_quota`) and the reads that feed it (azure-mgmt-compute: Usage - List and
Resource Skus - List, `read_compute`).

A new subscription has 0 vCPUs of quota for the GPU VM families. AKS still creates an autoscaled pool there,
and the autoscaler then never gets a node: jobs stay Pending with nothing in any log that says why. Checking
before the pool is created turns that stall into one line naming the quota, the vCPUs missing and how to ask
for them. Azure counts a pool's VMs against the quota of their VM family and against the region's total;
Spot VMs count against the region's low-priority total instead, whatever their family.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

REGIONAL = "cores"  # "Total Regional vCPUs"
SPOT = "lowPriorityCores"  # "Total Regional Low-priority vCPUs": every Spot VM of the region, any family
PORTAL = "Azure portal -> Quotas -> Compute"


@dataclass(frozen=True)
class Usage:
    """One row of Usage - List: `name` is what ARM and `az quota` call it (standardNCADSA100v4Family),
    `label` what the portal shows (Standard NCADSA100v4 Family vCPUs)."""

    name: str
    label: str
    current: int
    limit: int

    @property
    def free(self) -> int:
        return max(self.limit - self.current, 0)


@dataclass(frozen=True)
class VmSku:
    """A VM size as Resource Skus - List describes it in one region."""

    name: str
    family: str
    vcpus: int
    spot_capable: bool = True
    # Why this subscription may not deploy the size in the region at all (a Location restriction), if so.
    restricted: str | None = None
    restricted_zones: tuple[str, ...] = ()


@dataclass(frozen=True)
class Need:
    usage: Usage
    vcpus: int

    @property
    def missing(self) -> int:
        return max(self.vcpus - self.usage.free, 0)


@dataclass(frozen=True)
class QuotaFinding:
    """What `check_quota` found. `refusal` is set when the pool could not get its nodes; `notes` say what
    could not be checked."""

    location: str
    vm_size: str
    nodes: int
    vcpus_per_node: int = 0
    needs: tuple[Need, ...] = ()
    refusal: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.refusal is None

    @property
    def shortages(self) -> tuple[Need, ...]:
        return tuple(need for need in self.needs if need.missing)

    def summary(self) -> str:
        """One line for a pool that fits."""
        free = ", ".join(f"{n.usage.label} {n.usage.free} free of {n.usage.limit}" for n in self.needs)
        return (
            f"quota in {self.location}: up to {self.nodes} x {self.vm_size} ({self.vcpus_per_node} vCPUs "
            f"each) = {self.nodes * self.vcpus_per_node} vCPUs; {free}"
        )


def _same(a: str, b: str) -> bool:
    return a.lower() == b.lower()


def _find_usage(usages: Iterable[Usage], name: str) -> Usage | None:
    return next((u for u in usages if _same(u.name, name)), None)


def request_command(subscription: str, location: str, need: Need) -> str:
    """The `az quota` command (the quota extension) that raises a quota to what `need` asks for."""
    kind = "lowPriority" if _same(need.usage.name, SPOT) else "dedicated"
    scope = f"/subscriptions/{subscription}/providers/Microsoft.Compute/locations/{location}"
    value = need.usage.current + need.vcpus
    return (
        f"az quota update --resource-name {need.usage.name} --resource-type {kind} --scope {scope} "
        f"--limit-object value={value}"
    )


def _refusal(finding: QuotaFinding, subscription: str) -> str:
    missing = "; ".join(
        f"{n.usage.label} ({n.usage.name}): {n.missing} missing, {n.usage.free} free "
        f"({n.usage.current} used of {n.usage.limit})"
        for n in finding.shortages
    )
    asks = "; ".join(request_command(subscription, finding.location, n) for n in finding.shortages)
    return (
        f"quota: up to {finding.nodes} x {finding.vm_size} ({finding.vcpus_per_node} vCPUs each, --max) "
        f"need {finding.nodes * finding.vcpus_per_node} vCPUs in {finding.location}, more than the "
        f"subscription has free: {missing}. Ask for more with `{asks}` (az extension add --name quota) or "
        f"in the {PORTAL}; or lower --max; --skip-quota-check creates the pool anyway"
    )


def check_quota(
    vm_size: str,
    max_nodes: int,
    location: str,
    skus: Iterable[VmSku],
    usages: Iterable[Usage],
    *,
    spot: bool = False,
    zones: tuple[str, ...] = (),
    subscription: str = "<subscription>",
) -> QuotaFinding:
    """Whether `max_nodes` VMs of `vm_size` fit in the free quota of `location`: the family's and the
    regional total for regular VMs, the regional low-priority total for Spot."""
    usages = list(usages)
    sku = next((s for s in skus if _same(s.name, vm_size)), None)
    base = QuotaFinding(location=location, vm_size=vm_size, nodes=max_nodes)
    if sku is None:
        return _with(base, refusal=f"--vm-size: {vm_size} is not offered in {location}, the cluster's region")
    base = _with(base, vcpus_per_node=sku.vcpus)
    if sku.restricted:
        return _with(base, refusal=f"--vm-size: {vm_size} is {sku.restricted} in {location}")
    if blocked := sorted(set(zones) & set(sku.restricted_zones)):
        return _with(
            base, refusal=f"--zones: {vm_size} is not available to this subscription in zone(s) {blocked}"
        )
    if spot and not sku.spot_capable:
        return _with(base, refusal=f"--spot: {vm_size} is not offered as a Spot VM")
    if sku.vcpus <= 0:
        return _with(base, notes=(f"{vm_size} states no vCPU count in {location}: quota not checked",))
    names = [SPOT] if spot else [sku.family, REGIONAL]
    needs, notes = [], []
    for name in names:
        usage = _find_usage(usages, name)
        if usage is None:
            notes.append(f"no {name} quota in {location}'s usage list: not checked")
        else:
            needs.append(Need(usage, max_nodes * sku.vcpus))
    found = _with(base, needs=tuple(needs), notes=tuple(notes))
    return _with(found, refusal=_refusal(found, subscription)) if found.shortages else found


def _with(finding: QuotaFinding, **changes: Any) -> QuotaFinding:
    return replace(finding, **changes)


# --- the reads (azure-mgmt-compute) --------------------------------------------------------------------


def _text(value: Any) -> str:
    """An SDK string field that may come as an enum member."""
    return str(getattr(value, "value", value) or "")


def vm_sku_of(sku: Any, location: str) -> VmSku | None:
    """A VmSku from a ResourceSku model; None for SKUs that are not VM sizes (disks, availability sets)."""
    if _text(getattr(sku, "resource_type", "")) != "virtualMachines":
        return None
    capabilities = {_text(c.name): _text(c.value) for c in getattr(sku, "capabilities", None) or []}
    try:
        vcpus = int(capabilities.get("vCPUs", "0"))
    except ValueError:
        vcpus = 0
    restricted, zones = None, []
    for restriction in getattr(sku, "restrictions", None) or []:
        info = getattr(restriction, "restriction_info", None)
        places = [p.lower() for p in getattr(info, "locations", None) or []]
        if places and location.lower() not in places:
            continue
        kind, reason = _text(restriction.type), _text(getattr(restriction, "reason_code", ""))
        if kind == "Location":
            restricted = f"not available to this subscription ({reason or 'restricted'})"
        elif kind == "Zone":
            zones += list(getattr(info, "zones", None) or [])
    return VmSku(
        name=_text(sku.name),
        family=_text(getattr(sku, "family", "")),
        vcpus=vcpus,
        spot_capable=capabilities.get("LowPriorityCapable", "True").lower() != "false",
        restricted=restricted,
        restricted_zones=tuple(zones),
    )


def read_compute(client: Any, location: str) -> tuple[list[VmSku], list[Usage]]:
    """The VM sizes offered in `location` and the subscription's compute usage there. `client` is a
    ComputeManagementClient; both lists are paged, and every page is read."""
    skus = [
        found
        for sku in client.resource_skus.list(filter=f"location eq '{location}'")
        if (found := vm_sku_of(sku, location)) is not None
    ]
    usages = [
        Usage(
            name=_text(u.name.value),
            label=_text(u.name.localized_value) or _text(u.name.value),
            current=int(u.current_value or 0),
            limit=int(u.limit or 0),
        )
        for u in client.usage.list(location)
    ]
    return skus, usages
