"""`-o/--output json|yaml` for every command that lists or shows something (each `ls`, `status`), as
kubectl's: text for people by default, the same data for scripts on request."""

from __future__ import annotations

import argparse
import json
from typing import Any

from dtjob.cli.deprecation import Deprecated

FORMATS = ("text", "json", "yaml")


def add_output_arg(parser: argparse.ArgumentParser, text: str = "a table", legacy_json: bool = False) -> None:
    parser.add_argument(
        "-o", "--output", choices=FORMATS, default="text", help=f"text ({text}; the default), json or yaml"
    )
    if legacy_json:
        parser.add_argument("--json", dest="output", action=Deprecated, const="json", use="-o json")


def dump(data: Any, fmt: str) -> str:
    """`data` as JSON or YAML (`fmt`, not text)."""
    if fmt == "json":
        return json.dumps(data, indent=2)
    import yaml

    return str(yaml.safe_dump(data, sort_keys=False)).rstrip()
