"""The dtjob CLI's parsers, walked: what the CLI tests read the commands' flags from."""

from __future__ import annotations

import argparse
from collections.abc import Iterator


def subparsers(
    parser: argparse.ArgumentParser, path: str = ""
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every command's parser, by its words (`data upload`); an alias yields its command's parser again."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                words = f"{path} {name}".strip()
                yield words, sub
                yield from subparsers(sub, words)
