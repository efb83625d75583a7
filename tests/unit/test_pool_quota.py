"""`dtjob pool create`'s quota check: the decision (dtjob.azure.quota, pure) and the command on the real
azure-mgmt-compute and azure-mgmt-containerservice clients over the ARM player.

A new subscription has no vCPUs of quota for the GPU families: the pool would be created and never get a
node. The check refuses before any write, saying which quota lacks how many vCPUs and how to ask for them."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest
from dtjob.azure.quota import REGIONAL, SPOT, Usage, VmSku, check_quota, request_command
from dtjob.contract.transfer_report import ExitCode

from tests.azure.arm_player import ArmPlayer, Fault
from tests.azure.compute_arm import (
    A100,
    V100,
    family_usage,
    location_restriction,
    region_skus,
    regional,
    spot,
    vm_sku,
    with_compute,
    zone_restriction,
)
from tests.unit.test_azure_aks import CLUSTER, run

NC96 = VmSku("Standard_NC96ads_A100_v4", A100, 96)
A100_LABEL = "Standard NCADSA100v4 Family vCPUs"


def usages(
    family: tuple[int, int], cores: tuple[int, int] = (0, 1000), low: tuple[int, int] = (0, 0)
) -> list[Usage]:
    """(current, limit) of the A100 family, the regional total and the regional Spot total."""
    return [
        Usage(A100, A100_LABEL, *family),
        Usage(REGIONAL, "Total Regional vCPUs", *cores),
        Usage(SPOT, "Total Regional Low-priority vCPUs", *low),
        Usage(V100, "Standard NCSv3 Family vCPUs", 0, 1000),
    ]


# --- the decision ------------------------------------------------------------------------------------------


def test_a_pool_that_fits_exactly_passes_and_one_vcpu_more_does_not() -> None:
    found = check_quota("Standard_NC96ads_A100_v4", 4, "westeurope", [NC96], usages((16, 400)))
    assert found.ok and found.shortages == ()
    assert [(n.usage.name, n.vcpus, n.missing) for n in found.needs] == [(A100, 384, 0), (REGIONAL, 384, 0)]
    assert found.summary() == (
        "quota in westeurope: up to 4 x Standard_NC96ads_A100_v4 (96 vCPUs each) = 384 vCPUs; "
        f"{A100_LABEL} 384 free of 400, Total Regional vCPUs 1000 free of 1000"
    )
    short = check_quota("Standard_NC96ads_A100_v4", 4, "westeurope", [NC96], usages((17, 400)))
    assert not short.ok
    assert [(n.usage.name, n.missing) for n in short.shortages] == [(A100, 1)]


def test_a_new_subscription_is_told_the_family_the_missing_vcpus_and_how_to_ask() -> None:
    found = check_quota(
        "standard_nc96ads_a100_v4", 2, "westeurope", [NC96], usages((0, 0)), subscription="sub-9"
    )
    assert found.refusal is not None
    assert "up to 2 x standard_nc96ads_a100_v4 (96 vCPUs each, --max) need 192 vCPUs in westeurope" in (
        found.refusal
    )
    assert f"{A100_LABEL} ({A100}): 192 missing, 0 free (0 used of 0)" in found.refusal
    assert (
        f"az quota update --resource-name {A100} --resource-type dedicated "
        "--scope /subscriptions/sub-9/providers/Microsoft.Compute/locations/westeurope "
        "--limit-object value=192"
    ) in found.refusal
    assert "Azure portal -> Quotas -> Compute" in found.refusal
    assert "--skip-quota-check" in found.refusal and "lower --max" in found.refusal
    assert "Total Regional vCPUs" not in found.refusal  # that one has room


def test_the_regional_total_can_be_short_when_the_family_is_not() -> None:
    found = check_quota(
        "Standard_NC96ads_A100_v4", 4, "westeurope", [NC96], usages((0, 400), cores=(10, 100))
    )
    assert [(n.usage.name, n.missing) for n in found.shortages] == [(REGIONAL, 294)]
    assert found.refusal is not None and "Total Regional vCPUs (cores): 294 missing, 90 free" in found.refusal
    # The new limit asked for is what is used already plus what the pool needs.
    assert "--resource-name cores --resource-type dedicated" in found.refusal
    assert "--limit-object value=394" in found.refusal


def test_spot_counts_against_the_low_priority_total_only() -> None:
    found = check_quota(
        "Standard_NC96ads_A100_v4", 4, "westeurope", [NC96], usages((0, 0), low=(0, 400)), spot=True
    )
    assert found.ok
    assert [n.usage.name for n in found.needs] == [SPOT]
    short = check_quota(
        "Standard_NC96ads_A100_v4", 4, "westeurope", [NC96], usages((0, 1000), low=(100, 400)), spot=True
    )
    assert [(n.usage.name, n.missing) for n in short.shortages] == [(SPOT, 84)]
    assert short.refusal is not None
    assert "--resource-name lowPriorityCores --resource-type lowPriority" in short.refusal
    assert "--limit-object value=484" in short.refusal


@pytest.mark.parametrize(
    ("sku", "spot_pool", "zones", "refusal"),
    [
        (
            VmSku("Standard_NC24ads_A100_v4", A100, 24),
            False,
            (),
            "--vm-size: Standard_NC96ads_A100_v4 is not offered in westeurope",
        ),
        (
            VmSku(
                "Standard_NC96ads_A100_v4",
                A100,
                96,
                restricted="not available to this subscription (NotAvailableForSubscription)",
            ),
            False,
            (),
            "--vm-size: Standard_NC96ads_A100_v4 is not available to this subscription",
        ),
        (
            VmSku("Standard_NC96ads_A100_v4", A100, 96, restricted_zones=("2",)),
            False,
            ("1", "2"),
            "--zones: ",
        ),
        (VmSku("Standard_NC96ads_A100_v4", A100, 96, spot_capable=False), True, (), "--spot: "),
    ],
)
def test_a_size_the_region_does_not_offer_is_refused(
    sku: VmSku, spot_pool: bool, zones: tuple[str, ...], refusal: str
) -> None:
    found = check_quota(
        "Standard_NC96ads_A100_v4",
        1,
        "westeurope",
        [sku],
        usages((0, 1000), low=(0, 1000)),
        spot=spot_pool,
        zones=zones,
    )
    assert found.refusal is not None and found.refusal.startswith(refusal)
    assert found.shortages == ()


def test_a_zone_restriction_elsewhere_does_not_matter() -> None:
    sku = VmSku("Standard_NC96ads_A100_v4", A100, 96, restricted_zones=("3",))
    assert check_quota("Standard_NC96ads_A100_v4", 1, "westeurope", [sku], usages((0, 96)), zones=("1",)).ok
    assert check_quota("Standard_NC96ads_A100_v4", 1, "westeurope", [sku], usages((0, 96))).ok


def test_a_family_missing_from_the_usage_list_is_noted_not_refused() -> None:
    rows = [u for u in usages((0, 0)) if u.name != A100]
    found = check_quota("Standard_NC96ads_A100_v4", 1, "westeurope", [NC96], rows)
    assert found.ok
    assert [n.usage.name for n in found.needs] == [REGIONAL]
    assert found.notes == (f"no {A100} quota in westeurope's usage list: not checked",)


def test_request_command_for_the_regional_total() -> None:
    need = check_quota(
        "Standard_NC96ads_A100_v4", 1, "eastus", [NC96], usages((0, 96), cores=(40, 100))
    ).needs[1]
    assert request_command("s", "eastus", need) == (
        "az quota update --resource-name cores --resource-type dedicated "
        "--scope /subscriptions/s/providers/Microsoft.Compute/locations/eastus --limit-object value=136"
    )


# --- the command over ARM ----------------------------------------------------------------------------------


def quota_player(
    family: tuple[int, int],
    cores: tuple[int, int] = (8, 2000),
    low: tuple[int, int] = (0, 0),
    faults: list[Fault] | None = None,
) -> ArmPlayer:
    """Cluster aks-train in westeurope, whose usage list holds the A100 family's, the regional total's and
    the regional Spot total's (current, limit)."""
    rows = [regional(*cores), spot(*low), family_usage(A100, *family), family_usage(V100, 0, 100)]
    return with_compute(ArmPlayer(faults=faults or []), rows)


def reads(player: ArmPlayer) -> list[str]:
    return [urlsplit(r.url).path.rsplit("/", 1)[-1] for r in player.requests if r.method == "GET"]


def test_enough_quota_creates_the_pool_after_reading_the_clusters_region(
    capsys: pytest.CaptureFixture[str],
) -> None:
    player = quota_player(family=(0, 384))
    assert run(["pool", "create", *CLUSTER], player) == 0
    assert [r.method for r in player.requests][:4] == ["GET", "GET", "GET", "PUT"]
    usage_read = next(r for r in player.requests if r.path.endswith("/usages"))
    assert usage_read.path == "/subscriptions/sub-1/providers/Microsoft.Compute/locations/westeurope/usages"
    sku_read = next(r for r in player.requests if r.path.endswith("/skus"))
    assert parse_qs(urlsplit(sku_read.url).query)["$filter"] == ["location eq 'westeurope'"]
    assert player.pools["gpu"]["properties"]["provisioningState"] == "Succeeded"
    assert f"{A100_LABEL} 384 free of 384" in capsys.readouterr().err


def test_short_quota_is_refused_before_any_pool_put(capsys: pytest.CaptureFixture[str]) -> None:
    player = quota_player(family=(0, 0))
    assert run(["pool", "create", *CLUSTER], player) == ExitCode.STORAGE
    assert player.puts() == [] and player.pools == {}
    assert {r.method for r in player.requests} == {"GET"}
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith("dtjob pool: quota: up to 4 x Standard_NC96ads_A100_v4")
    assert f"{A100_LABEL} ({A100}): 384 missing" in err
    assert f"az quota update --resource-name {A100} --resource-type dedicated" in err
    assert "/subscriptions/sub-1/providers/Microsoft.Compute/locations/westeurope" in err
    assert "Azure portal -> Quotas -> Compute" in err


def test_a_lower_max_fits_where_the_default_does_not() -> None:
    player = quota_player(family=(0, 200))
    assert run(["pool", "create", *CLUSTER], player) == ExitCode.STORAGE
    assert run(["pool", "create", *CLUSTER, "--max", "2"], player) == 0
    assert len(player.puts()) == 1


def test_spot_pools_use_the_low_priority_quota(capsys: pytest.CaptureFixture[str]) -> None:
    player = quota_player(family=(0, 0), low=(0, 384))
    assert run(["pool", "create", "spot", *CLUSTER, "--spot"], player) == 0
    assert "Total Regional Low-priority vCPUs 384 free of 384" in capsys.readouterr().err
    player = quota_player(family=(0, 1000), low=(0, 96))
    assert run(["pool", "create", "spot", *CLUSTER, "--spot"], player) == ExitCode.STORAGE
    assert player.puts() == []
    err = capsys.readouterr().err
    assert "Total Regional Low-priority vCPUs (lowPriorityCores): 288 missing" in err
    assert "--resource-type lowPriority" in err


def test_a_short_regional_total_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    player = quota_player(family=(0, 1000), cores=(100, 200))
    assert run(["pool", "create", *CLUSTER], player) == ExitCode.STORAGE
    assert player.puts() == []
    err = capsys.readouterr().err
    assert "Total Regional vCPUs (cores): 284 missing, 100 free (100 used of 200)" in err
    assert A100_LABEL not in err


def test_skip_quota_check_creates_the_pool_without_reading_the_quota() -> None:
    player = quota_player(family=(0, 0))
    assert run(["pool", "create", *CLUSTER, "--skip-quota-check"], player) == 0
    assert len(player.puts()) == 1
    assert not any(r.path.endswith(("/usages", "/skus")) for r in player.requests)


def test_a_size_not_offered_to_the_subscription_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    player = ArmPlayer(
        skus=[vm_sku("Standard_NC96ads_A100_v4", A100, 96, 4, restrictions=[location_restriction()])]
    )
    assert run(["pool", "create", *CLUSTER], with_compute(player)) == ExitCode.USAGE
    assert player.puts() == []
    assert (
        "is not available to this subscription (NotAvailableForSubscription) in westeurope"
        in capsys.readouterr().err
    )
    player = ArmPlayer(
        skus=[vm_sku("Standard_NC96ads_A100_v4", A100, 96, 4, restrictions=[zone_restriction(["3"])])]
    )
    assert run(["pool", "create", *CLUSTER, "--zones", "1", "3"], with_compute(player)) == ExitCode.USAGE
    assert run(["pool", "create", *CLUSTER, "--zones", "1", "2"], player) == 0


def test_every_page_of_the_lists_is_read() -> None:
    # The pool's size is the last SKU of the region: with one item a page, on the last page.
    skus = [s for s in region_skus() if s["name"] != "Standard_NC96ads_A100_v4"]
    skus.append(vm_sku("Standard_NC96ads_A100_v4", A100, 96, 4))
    player = with_compute(ArmPlayer(skus=skus, page_size=1))
    assert run(["pool", "create", *CLUSTER], player) == 0
    sku_pages = [parse_qs(urlsplit(r.url).query) for r in player.requests if r.path.endswith("/skus")]
    assert len(sku_pages) == len([s for s in skus if "westeurope" in s["locations"]])
    assert all(q["$filter"] == ["location eq 'westeurope'"] and "api-version" in q for q in sku_pages)
    assert len([r for r in player.requests if r.path.endswith("/usages")]) == len(player.usages["westeurope"])


def test_a_denied_quota_read_is_noted_and_the_pool_still_created(capsys: pytest.CaptureFixture[str]) -> None:
    player = quota_player(family=(0, 0), faults=[Fault("GET", "/usages", 403, "AuthorizationFailed")])
    assert run(["pool", "create", *CLUSTER], player) == 0
    assert len(player.puts()) == 1
    err = capsys.readouterr().err
    assert (
        "note: quota not checked: read the compute quota of westeurope: denied (AuthorizationFailed)" in err
    )
    assert "Reader on the subscription" in err
    # A cluster the identity may not read is no quota question: create stops there.
    player = quota_player(
        family=(0, 1000), faults=[Fault("GET", "/managedClusters/aks-train", 403, "AuthorizationFailed")]
    )
    assert run(["pool", "create", *CLUSTER], player) == ExitCode.DENIED
    assert player.puts() == []
    assert "quota not checked" not in capsys.readouterr().err


def test_a_missing_cluster_fails_create_and_is_noted_by_a_dry_run(capsys: pytest.CaptureFixture[str]) -> None:
    player = quota_player(family=(0, 0))
    other = ["--subscription", "sub-1", "-g", "ml-rg", "--cluster", "nope"]
    assert run(["pool", "create", *other], player) == ExitCode.NOT_FOUND
    assert "read cluster ml-rg/nope: 404 ResourceNotFound" in capsys.readouterr().err
    assert run(["pool", "create", *other, "--dry-run"], player) == 0
    captured = capsys.readouterr()
    assert '"vmSize": "Standard_NC96ads_A100_v4"' in captured.out
    assert "note: quota not checked: read cluster ml-rg/nope" in captured.err
    assert player.puts() == []


def test_a_dry_run_with_short_quota_prints_the_body_and_fails_as_create_would(
    capsys: pytest.CaptureFixture[str],
) -> None:
    player = quota_player(family=(0, 0))
    assert run(["pool", "create", *CLUSTER, "--dry-run"], player) == ExitCode.STORAGE
    captured = capsys.readouterr()
    assert '"maxCount": 4' in captured.out
    assert "384 missing" in captured.err
    assert player.puts() == []
    assert reads(player) == ["aks-train", "skus", "usages"]
