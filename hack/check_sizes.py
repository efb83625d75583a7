"""Size limits on the operator's and the trainers' code: a module over MAX_MODULE_LINES lines or a function
over MAX_FUNCTION_LINES lines fails `make lint`, so a file or a function that grows past what a reader holds
at once is split when it grows, not years later.

    python hack/check_sizes.py [ROOT]        (ROOT: the repository, default the current directory)

A function's lines run from its `def` (decorators included) to its last line, blank lines and comments
inside it included; a nested function counts towards its parent too. EXCEPTIONS names what may stay over,
each with its reason.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
CHECKED_DIRS = ("operator/dtjob", "training/dtjob_train")
# "path" for a module, "path::qualified.name" for a function, each with the reason it may stay over.
EXCEPTIONS: dict[str, str] = {}


@dataclass(frozen=True)
class Oversize:
    where: str  # "path" or "path::qualified.name", as EXCEPTIONS spells it
    lines: int
    limit: int

    def __str__(self) -> str:
        return f"{self.where}: {self.lines} lines (limit {self.limit})"


def _functions(tree: ast.AST) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function in `tree`, methods and nested functions too (under `if` or `try` as well), with its
    qualified name."""
    stack: list[tuple[ast.AST, str]] = [(tree, "")]
    while stack:
        node, prefix = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                yield prefix + child.name, child
                stack.append((child, f"{prefix}{child.name}."))
            elif isinstance(child, ast.ClassDef):
                stack.append((child, f"{prefix}{child.name}."))
            else:
                stack.append((child, prefix))


def module_oversizes(path: Path, name: str) -> list[Oversize]:
    """What in one module is over its limit; `name` is the module's path as reports spell it."""
    text = path.read_text(encoding="utf-8")
    found: list[Oversize] = []
    lines = len(text.splitlines())
    if lines > MAX_MODULE_LINES:
        found.append(Oversize(name, lines, MAX_MODULE_LINES))
    for qualified, node in _functions(ast.parse(text, filename=str(path))):
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        length = (node.end_lineno or node.lineno) - first + 1
        if length > MAX_FUNCTION_LINES:
            found.append(Oversize(f"{name}::{qualified}", length, MAX_FUNCTION_LINES))
    return found


def oversizes(root: Path, dirs: tuple[str, ...] = CHECKED_DIRS) -> list[Oversize]:
    """Everything over its limit under `dirs` of `root`, in path order, exceptions included."""
    found: list[Oversize] = []
    for top in dirs:
        for path in sorted((root / top).rglob("*.py")):
            found.extend(module_oversizes(path, path.relative_to(root).as_posix()))
    return found


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path()
    found = oversizes(root)
    failures = [o for o in found if o.where not in EXCEPTIONS]
    stale = sorted(set(EXCEPTIONS) - {o.where for o in found})
    for oversize in failures:
        print(f"check_sizes: {oversize}", file=sys.stderr)
    for where in stale:
        # An exception nothing needs any more would let the next growth there pass unseen.
        print(f"check_sizes: {where} is within its limits: remove it from EXCEPTIONS", file=sys.stderr)
    return 1 if failures or stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
