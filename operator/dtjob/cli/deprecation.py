"""Flags kept for one release under a new form: hidden from --help, doing what the new form does, and saying
so on stderr at each use."""

from __future__ import annotations

import argparse
import sys
from typing import Any


class Deprecated(argparse.Action):
    """Stores the flag's value in `dest` (or appends it, with `append`; or stores `const`, taking no value)
    after warning that `use` replaces it; `use` may name the value as {value}."""

    def __init__(
        self,
        option_strings: list[str],
        dest: str,
        use: str,
        append: bool = False,
        const: Any = None,
        **kwargs: Any,
    ) -> None:
        if const is not None:
            kwargs["nargs"] = 0
        kwargs["help"] = argparse.SUPPRESS
        super().__init__(option_strings, dest, const=const, **kwargs)
        self.use, self.append = use, append

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        value = self.const if self.const is not None else values
        print(
            f"{parser.prog}: {option_string} is deprecated and will be removed in the next release: use "
            f"{self.use.format(value=value)}",
            file=sys.stderr,
        )
        if self.append:
            value = [*(getattr(namespace, self.dest, None) or []), value]
        setattr(namespace, self.dest, value)
