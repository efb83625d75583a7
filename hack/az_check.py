"""Whether the Azure CLI would accept each command line, judged by its own command table and argument parser,
without running any command and without the network: run by the python of the Azure CLI's venv
(hack/azure-cli-venv.sh), for the AKS guide's test (tests/integration/test_aks_guide.py).

    AZURE_CONFIG_DIR=$(mktemp -d) <venv>/bin/python hack/az_check.py < commands.json

stdin: a JSON list of argument lists (each without the leading `az`). stdout: a JSON list, one entry each:
null when the CLI parses the line (the command exists, every option is one of its own and spelled out in
full, enum values and required options hold), else why not. The steps are those of `az` itself up to its parse
(azure.cli.core.commands.AzCliCommandInvoker.execute): the command table (the modules the command index
names), the command's arguments, the events that add the global ones (--subscription, --ids), the parser.
The validators that run after parsing, and the command itself, never run.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import sys
from typing import Any

from azure.cli.core import get_default_cli
from azure.cli.core.commands import _pre_command_table_create
from azure.cli.core.commands.events import (
    EVENT_INVOKER_POST_LOAD_ARGUMENTS,
    EVENT_INVOKER_PRE_LOAD_ARGUMENTS,
)

# knack, the CLI framework under azure-cli, is only in the Azure CLI's venv (and has no type stubs).
knack_events: Any = importlib.import_module("knack.events")


def refusal(argv: list[str]) -> str | None:
    """Why the CLI would refuse `az ARGV` (None: it parses). A fresh CLI each time: loading a command's
    arguments changes the loader's state."""
    cli: Any = get_default_cli()
    invocation = cli.invocation_cls(
        cli_ctx=cli,
        parser_cls=cli.parser_cls,
        commands_loader_cls=cli.commands_loader_cls,
        help_cls=cli.help_cls,
    )
    cli.invocation = invocation
    args = _pre_command_table_create(cli, argv)
    cli.raise_event(knack_events.EVENT_INVOKER_PRE_CMD_TBL_CREATE, args=args)
    loader = invocation.commands_loader
    loader.load_command_table(args)
    command = invocation._rudimentary_get_command(args)
    if command not in loader.command_table:
        asked = " ".join(argv[: len(command.split()) + 1])
        return f"no command {asked!r} (the longest known prefix: {command!r})"
    invocation.data["command_string"] = command
    loader.command_table = {command: loader.command_table[command]}
    loader.command_name = command
    cli.raise_event(EVENT_INVOKER_PRE_LOAD_ARGUMENTS, commands_loader=loader)
    loader.load_arguments(command)
    cli.raise_event(EVENT_INVOKER_POST_LOAD_ARGUMENTS, commands_loader=loader)
    cli.raise_event(knack_events.EVENT_INVOKER_POST_CMD_TBL_CREATE, commands_loader=loader)
    invocation.parser.cli_ctx = cli
    invocation.parser.load_command_table(loader)
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(said):
            invocation.parser.parse_args(args)
    except SystemExit:
        return said.getvalue().strip().splitlines()[0] if said.getvalue().strip() else "refused"
    # argparse takes an unambiguous prefix of an option too: a guide should spell each one out.
    known = set(invocation.parser.subparser_map[command]._option_string_actions)
    abbreviated = [a.split("=", 1)[0] for a in args if a.startswith("--") and a.split("=", 1)[0] not in known]
    return f"not options of az {command} as written: {' '.join(abbreviated)}" if abbreviated else None


def main() -> None:
    commands: list[list[str]] = json.load(sys.stdin)
    json.dump([refusal(argv) for argv in commands], sys.stdout)


if __name__ == "__main__":
    main()
