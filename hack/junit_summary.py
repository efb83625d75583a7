"""The end of `make test` (hack/run-tests.sh): one line that sums the pytest runs' JUnit reports, every test
that failed, was skipped or xfailed named with its reason, and a non-zero exit where a test was skipped or
xfailed without an entry in the allowed list (tests/allowed-skips.toml), where an xfail-marked test passed,
or where a report is missing. A green run ran every test it did not say it skipped for a reason.

    python hack/junit_summary.py [--allowed FILE] [--root DIR] REPORT.xml...

An entry of the allowed list:

    [[allow]]
    test = "tests/training/test_dali.py::test_*"  # the node id, a glob (fnmatch: * ? [...])
    message = "*DALI is not installed*"           # optional glob on the skip's reason (default: any)
    outcome = "skipped"                           # or "xfailed" (default "skipped")
    reason = "why a run in CI can meet this skip"
"""

from __future__ import annotations

import argparse
import ast
import sys
import tomllib
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Literal

REPO = Path(__file__).resolve().parents[1]
ALLOWED = REPO / "tests" / "allowed-skips.toml"

Outcome = Literal["passed", "failed", "error", "skipped", "xfailed", "xpassed"]
OUTCOMES: tuple[Outcome, ...] = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
# What pytest's junitxml writes for an xfail-marked test that passed (a non-strict XPASS, seen as a failure)
# and for a strict one (a failure whose message starts so).
_XPASS_MESSAGE = "xfail-marked test passes unexpectedly"
_XPASS_STRICT = "[XPASS(strict)]"


@dataclass(frozen=True)
class Case:
    node_id: str  # tests/unit/test_x.py::TestY::test_z[param]
    outcome: Outcome
    message: str  # the failure's or the skip's reason
    run: str  # the report it came from (main, heavy, waits)


@dataclass(frozen=True)
class Allowance:
    test: str
    reason: str
    message: str = "*"
    outcome: Literal["skipped", "xfailed"] = "skipped"

    def allows(self, case: Case) -> bool:
        return (
            case.outcome == self.outcome
            and fnmatchcase(case.node_id, self.test)
            and fnmatchcase(case.message, self.message)
        )


def node_id(classname: str, name: str, is_file: Callable[[str], bool]) -> str:
    """pytest's node id back from JUnit's dotted classname and name: the longest dotted prefix that names a
    file is the module, the rest its classes. A skipped module or package has no classname: its name is
    the dotted path."""
    parts = classname.split(".") if classname else []
    if not parts:
        path = name.replace(".", "/")
        return f"{path}.py" if is_file(f"{path}.py") else path
    for cut in range(len(parts), 0, -1):
        module = "/".join(parts[:cut]) + ".py"
        if is_file(module):
            return "::".join([module, *parts[cut:], name])
    return "::".join(["/".join(parts) + ".py", name])


def _collection_skip_reason(text: str) -> str:
    """A skipped module's reason: junitxml writes the report's (path, line, 'Skipped: reason') tuple."""
    try:
        _, _, reason = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError):
        return text.strip()
    return str(reason).removeprefix("Skipped: ")


def outcome_of(testcase: ET.Element) -> tuple[Outcome, str]:
    """The outcome of one <testcase> and its message; a setup or teardown error outranks the rest."""
    error, failure, skipped = (testcase.find(tag) for tag in ("error", "failure", "skipped"))
    if error is not None:
        return "error", error.get("message", "")
    if failure is not None:
        message = failure.get("message", "")
        return ("xpassed" if message.startswith(_XPASS_STRICT) else "failed"), message
    if skipped is None:
        return "passed", ""
    message = skipped.get("message", "")
    if message == _XPASS_MESSAGE:
        return "xpassed", message
    if skipped.get("type") == "pytest.xfail":
        return "xfailed", message
    if message == "collection skipped":
        return "skipped", _collection_skip_reason(skipped.text or "")
    return "skipped", message


def read_report(path: Path, root: Path) -> list[Case]:
    """Every test case of one JUnit report. Raises OSError or ET.ParseError where there is none."""
    run = path.stem

    def is_file(relative: str) -> bool:
        return (root / relative).is_file()

    cases = []
    for testcase in ET.parse(path).getroot().iter("testcase"):
        outcome, message = outcome_of(testcase)
        where = node_id(testcase.get("classname", ""), testcase.get("name", ""), is_file)
        cases.append(Case(where, outcome, message, run))
    return cases


def load_allowed(text: str) -> list[Allowance]:
    """The allowed list's entries. Raises ValueError on an entry without its test and reason or with an
    unknown key, so a typo cannot allow what it did not mean to."""
    entries: list[Any] = tomllib.loads(text).get("allow", [])
    allowed = []
    for i, entry in enumerate(entries):
        unknown = set(entry) - {"test", "reason", "message", "outcome"}
        if unknown:
            raise ValueError(f"entry {i + 1}: unknown keys {sorted(unknown)}")
        if not entry.get("test") or not str(entry.get("reason", "")).strip():
            raise ValueError(f"entry {i + 1}: needs a test pattern and the reason CI may skip it")
        if entry.get("outcome", "skipped") not in ("skipped", "xfailed"):
            raise ValueError(f"entry {i + 1}: outcome is 'skipped' or 'xfailed', not {entry['outcome']!r}")
        allowed.append(Allowance(**entry))
    return allowed


def not_allowed(cases: Iterable[Case], allowed: list[Allowance]) -> list[Case]:
    """The skips and xfails no entry allows, and every XPASS (no entry can allow one)."""
    found = []
    for case in cases:
        if case.outcome == "xpassed" or (
            case.outcome in ("skipped", "xfailed") and not any(a.allows(case) for a in allowed)
        ):
            found.append(case)
    return found


def summary_line(cases: list[Case]) -> str:
    counts = Counter(case.outcome for case in cases)
    line = f"all runs: {counts['passed']} passed, {counts['failed'] + counts['error']} failed, "
    line += f"{counts['skipped']} skipped"
    for extra in ("xfailed", "xpassed"):
        if counts[extra]:
            line += f", {counts[extra]} {extra}"
    return line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument("--allowed", type=Path, default=ALLOWED)
    parser.add_argument("--root", type=Path, default=REPO, help="where the node ids' paths start")
    args = parser.parse_args(argv)
    try:
        allowed = load_allowed(args.allowed.read_text())
    except (OSError, ValueError) as err:  # tomllib.TOMLDecodeError is a ValueError
        print(f"[tests] the allowed skips in {args.allowed} cannot be read: {err}")
        return 1
    cases: list[Case] = []
    missing = 0
    for path in args.reports:
        try:
            cases += read_report(path, args.root)
        except (OSError, ET.ParseError) as err:
            print(f"[tests] no report in {path}: {err}")
            missing += 1
    print(summary_line(cases))
    for case in cases:
        if case.outcome in ("failed", "error", "xpassed"):
            print(f"[tests] {case.outcome} ({case.run}): {case.node_id}: {case.message}")
    for case in cases:
        allowance = next((a for a in allowed if a.allows(case)), None)
        if allowance is not None:
            print(f"[tests] {case.outcome}, allowed ({case.run}): {case.node_id}: {case.message}")
            print(f"[tests]     allowed because: {allowance.reason}")
    bad = not_allowed(cases, allowed)
    for case in bad:
        if case.outcome != "xpassed":  # named with the failures above
            print(f"[tests] {case.outcome}, NOT allowed ({case.run}): {case.node_id}: {case.message}")
    if bad:
        listed = args.allowed.relative_to(REPO) if args.allowed.is_relative_to(REPO) else args.allowed
        print(
            f"[tests] {len(bad)} test(s) did not run as they should: a skip or xfail fails `make test` "
            f"unless {listed} allows it with its reason, and an XPASS always does"
        )
    return 1 if bad or missing else 0


if __name__ == "__main__":
    sys.exit(main())
