"""The Azure subscription `dtjob pool` and `dtjob fileserver` work in: --subscription, else
$AZURE_SUBSCRIPTION_ID, else the Azure CLI's default subscription (the one `az account show` prints).

The last is read from the Azure CLI's own profile, so a workstation where `az login` was run needs nothing
more; the credential (DefaultAzureCredential) then signs in through the same Azure CLI login.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

ENV = "AZURE_SUBSCRIPTION_ID"
HELP = f"default: ${ENV}, else the Azure CLI's default subscription (az account show)"


class NoSubscription(Exception):
    """No subscription was named and the Azure CLI has no default one; `str()` says the three ways."""


def profile_path(environ: Mapping[str, str] = os.environ) -> Path:
    """The Azure CLI's profile: $AZURE_CONFIG_DIR/azureProfile.json, by default under ~/.azure."""
    config_dir = environ.get("AZURE_CONFIG_DIR") or str(Path.home() / ".azure")
    return Path(config_dir).expanduser() / "azureProfile.json"


def cli_default(environ: Mapping[str, str] = os.environ) -> str | None:
    """The id of the subscription marked isDefault in the Azure CLI's profile, or None (no profile, no
    default, or a file that cannot be read)."""
    try:
        # The Azure CLI writes the file with a UTF-8 byte order mark.
        profile = json.loads(profile_path(environ).read_text(encoding="utf-8-sig"))
    except (OSError, ValueError):
        return None
    entries = profile.get("subscriptions") if isinstance(profile, dict) else None
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and entry.get("isDefault") is True and entry.get("id"):
            return str(entry["id"])
    return None


def find_subscription(flag: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """--subscription, else $AZURE_SUBSCRIPTION_ID, else the Azure CLI's default; None when none is set."""
    return flag or environ.get(ENV) or cli_default(environ)


def resolve_subscription(flag: str | None, environ: Mapping[str, str] = os.environ) -> str:
    """As find_subscription, raising NoSubscription when none is set."""
    found = find_subscription(flag, environ)
    if not found:
        raise NoSubscription(
            f"no Azure subscription: pass --subscription, set {ENV}, or sign in with `az login` (and pick "
            f"one with `az account set --subscription ID`) so that {profile_path(environ)} names a default"
        )
    return found
