"""hack/junit_summary.py, the end of `make test`: the JUnit reports of real pytest runs (skips, xfails and
XPASSes as pytest itself writes them) and the allowed list that decides which skips a green run may have."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hack import junit_summary
from hack.junit_summary import ALLOWED, Allowance, Case, load_allowed, node_id, not_allowed

# A small suite with every way a test can end, run by pytest as hack/run-tests.sh runs it.
SUITE = {
    "pkg/test_mixed.py": """
import pytest

def test_passes():
    pass

def test_fails():
    assert False, "boom"

def test_skips():
    pytest.skip("no frobnicator here")

@pytest.mark.skipif(True, reason="needs a GPU")
def test_skipif():
    pass

@pytest.mark.parametrize("x", ["a.b", "c"])
def test_param(x):
    if x == "a.b":
        pytest.skip("param a.b skipped")

class TestGroup:
    def test_in_class(self):
        pytest.skip("class skip")

@pytest.mark.xfail(reason="known bug 12")
def test_xfails():
    assert False

@pytest.mark.xfail(reason="fixed long ago")
def test_xpasses():
    pass
""",
    "pkg/test_whole_module.py": """
import pytest
pytest.skip("module needs a cluster", allow_module_level=True)

def test_never():
    pass
""",
}


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the suite's root, its JUnit report named main.xml)."""
    root = tmp_path_factory.mktemp("suite")
    (root / "pytest.ini").write_text("[pytest]\n")
    for relative, text in SUITE.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)
    xml = root / "main.xml"
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-o", "xfail_strict=true"]
    subprocess.run([*cmd, f"--junitxml={xml}", "pkg"], cwd=root, capture_output=True, check=False)
    return root, xml


def test_every_outcome_is_read_with_its_node_id_and_reason(report: tuple[Path, Path]) -> None:
    root, xml = report
    cases = {case.node_id: (case.outcome, case.message) for case in junit_summary.read_report(xml, root)}
    mixed = "pkg/test_mixed.py::"
    assert cases == {
        mixed + "test_passes": ("passed", ""),
        mixed + "test_fails": ("failed", "AssertionError: boom\nassert False"),
        mixed + "test_skips": ("skipped", "no frobnicator here"),
        mixed + "test_skipif": ("skipped", "needs a GPU"),
        mixed + "test_param[a.b]": ("skipped", "param a.b skipped"),
        mixed + "test_param[c]": ("passed", ""),
        mixed + "TestGroup::test_in_class": ("skipped", "class skip"),
        mixed + "test_xfails": ("xfailed", "known bug 12"),
        mixed + "test_xpasses": ("xpassed", "[XPASS(strict)] fixed long ago"),
        "pkg/test_whole_module.py": ("skipped", "module needs a cluster"),
    }
    assert {case.run for case in junit_summary.read_report(xml, root)} == {"main"}


def test_unallowed_skips_fail_the_summary_naming_test_and_reason(
    report: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, xml = report
    allowed = tmp_path / "allowed.toml"
    allowed.write_text("")
    assert junit_summary.main([str(xml), "--root", str(root), "--allowed", str(allowed)]) == 1
    out = capsys.readouterr().out
    assert "all runs: 2 passed, 1 failed, 5 skipped, 1 xfailed, 1 xpassed" in out
    assert "skipped, NOT allowed (main): pkg/test_mixed.py::test_skips: no frobnicator here" in out
    assert "skipped, NOT allowed (main): pkg/test_whole_module.py: module needs a cluster" in out
    assert "xfailed, NOT allowed (main): pkg/test_mixed.py::test_xfails: known bug 12" in out
    assert "xpassed (main): pkg/test_mixed.py::test_xpasses: [XPASS(strict)] fixed long ago" in out
    assert "7 test(s) did not run as they should" in out


def test_skips_the_list_allows_pass_with_their_reason_but_an_xpass_never_does(
    report: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, xml = report
    allowed = tmp_path / "allowed.toml"
    allowed.write_text(
        '[[allow]]\ntest = "pkg/test_mixed.py::*"\nreason = "the mixed suite skips on purpose"\n'
        '[[allow]]\ntest = "pkg/test_whole_module.py"\nmessage = "*cluster*"\nreason = "no cluster in CI"\n'
        '[[allow]]\ntest = "pkg/test_mixed.py::test_xfails"\noutcome = "xfailed"\nreason = "bug 12"\n'
    )
    assert junit_summary.main([str(xml), "--root", str(root), "--allowed", str(allowed)]) == 1
    out = capsys.readouterr().out
    assert "skipped, allowed (main): pkg/test_mixed.py::test_skips: no frobnicator here" in out
    assert "allowed because: no cluster in CI" in out
    assert "NOT allowed" not in out
    assert "1 test(s) did not run as they should" in out  # the XPASS

    clean = tmp_path / "clean.xml"
    clean.write_text('<testsuites><testsuite><testcase classname="pkg.test_mixed" name="test_passes"/>'
                     "</testsuite></testsuites>")  # fmt: skip
    assert junit_summary.main([str(clean), "--root", str(root), "--allowed", str(allowed)]) == 0


def test_an_entry_allows_only_its_outcome_and_message() -> None:
    skip = Case("tests/e2e/test_a.py::test_b", "skipped", "the real node needs root", "heavy")
    assert Allowance("tests/e2e/*", "r", message="*needs root*").allows(skip)
    assert not Allowance("tests/e2e/*", "r", message="*DALI*").allows(skip)
    assert not Allowance("tests/e2e/*", "r", outcome="xfailed").allows(skip)
    assert not Allowance("tests/unit/*", "r").allows(skip)
    xpass = Case("tests/e2e/test_a.py::test_c", "xpassed", "[XPASS(strict)] r", "heavy")
    assert not_allowed([skip, xpass], [Allowance("tests/e2e/*", "r")]) == [xpass]


def test_a_missing_report_fails_the_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert junit_summary.main([str(tmp_path / "heavy.xml"), "--allowed", str(ALLOWED)]) == 1
    assert "no report in" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('[[allow]]\ntest = "tests/x.py"\n', "needs a test pattern and the reason"),
        ('[[allow]]\ntest = "tests/x.py"\nreason = "  "\n', "needs a test pattern and the reason"),
        ('[[allow]]\ntest = "t"\nreason = "r"\nmesage = "*"\n', "unknown keys ['mesage']"),
        ('[[allow]]\ntest = "t"\nreason = "r"\noutcome = "failed"\n', "outcome is 'skipped' or 'xfailed'"),
    ],
)
def test_an_entry_without_its_reason_or_with_a_typo_is_refused(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=f"entry 1: {error}".replace("[", r"\[").replace("(", r"\(")):
        load_allowed(text)


def test_node_ids_split_module_from_classes_by_the_files_there() -> None:
    is_file = {"tests/unit/test_x.py"}.__contains__
    assert node_id("tests.unit.test_x", "test_y[a.b]", is_file) == "tests/unit/test_x.py::test_y[a.b]"
    assert node_id("tests.unit.test_x.TestK", "test_y", is_file) == "tests/unit/test_x.py::TestK::test_y"
    assert node_id("", "tests.unit.test_x", is_file) == "tests/unit/test_x.py"
    assert node_id("", "tests.integration", is_file) == "tests/integration"
    assert node_id("gone.test_z", "test_w", is_file) == "gone/test_z.py::test_w"


def test_the_repository_list_is_valid_and_gives_every_entry_its_reason() -> None:
    for entry in load_allowed(ALLOWED.read_text()):
        assert entry.reason.strip() and entry.test.startswith("tests/"), entry
