"""What a pod group's pods request together (a Volcano PodGroup's minResources): Kubernetes quantities summed
and multiplied without losing their suffix where they share one. And what each container of a pod requests,
in base units (a copy's world against the Workload that admitted it). Pure."""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

# A quantity: a decimal number, then a suffix (Ki.., n..E, or an exponent e3).
_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?$")


def min_resources(pod: Mapping[str, Any], count: int) -> dict[str, str]:
    """What `count` copies of `pod` request: its containers' requests (a limit stands in for a missing
    request, as the API server defaults it), summed, times `count`; init containers, which run before them,
    are left out. Quantities keep their suffix when every container uses the same one (16Gi x 4 = 64Gi),
    else are summed in base units."""
    found: dict[str, list[tuple[Decimal, str]]] = {}
    for container in (pod.get("spec") or {}).get("containers") or ():
        for resource, quantity in _wanted(container).items():
            found.setdefault(resource, []).append(_parse(str(quantity)))
    total: dict[str, str] = {}
    for resource, parts in sorted(found.items()):
        suffixes = {suffix for _, suffix in parts}
        if len(suffixes) == 1:
            total[resource] = _format(sum((n for n, _ in parts), Decimal(0)) * count) + suffixes.pop()
        else:
            total[resource] = _format(sum((n * _UNITS[suffix] for n, suffix in parts), Decimal(0)) * count)
    return total


def container_requests(pod: Mapping[str, Any]) -> tuple[tuple[str, dict[str, Decimal]], ...]:
    """Each container's name and what it requests (a limit stands in for a missing request), init containers
    first, in base units: two pods compare equal whatever form their quantities take (Kueue's conversion
    webhook writes 1000m back as 1). ValueError for a quantity that is none."""
    spec = pod.get("spec") or {}
    containers = [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]
    return tuple(
        (str(c.get("name")), {r: _base(_parse(str(q))) for r, q in _wanted(c).items()}) for c in containers
    )


def _wanted(container: Mapping[str, Any]) -> dict[str, Any]:
    resources = container.get("resources") or {}
    return {**(resources.get("limits") or {}), **(resources.get("requests") or {})}


def _base(parsed: tuple[Decimal, str]) -> Decimal:
    number, suffix = parsed
    return number * _UNITS[suffix]


_UNITS = {
    "": Decimal(1), "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "k": Decimal("1e3"),
    "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"), "P": Decimal("1e15"),
    "E": Decimal("1e18"), "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30),
    "Ti": Decimal(2**40), "Pi": Decimal(2**50), "Ei": Decimal(2**60),
}  # fmt: skip


def _parse(quantity: str) -> tuple[Decimal, str]:
    """(number, suffix) of a quantity; an exponent is folded into the number."""
    match = _QUANTITY.match(quantity.strip())
    if match is None:
        raise ValueError(f"{quantity!r} is not a quantity")
    number, suffix = Decimal(match[1]), match[2] or ""
    if suffix[:1] in ("e", "E"):
        return number.scaleb(int(suffix[1:])), ""
    return number, suffix


def _format(number: Decimal) -> str:
    return format(number.normalize(), "f")
