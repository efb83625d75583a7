"""hack/check_sizes.py, the size limits `make lint` enforces, on a tree of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from hack import check_sizes
from hack.check_sizes import MAX_FUNCTION_LINES, MAX_MODULE_LINES


def _function(name: str, lines: int, indent: str = "") -> str:
    """A function of exactly `lines` lines, its `def` included."""
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(lines - 2))
    return f"{indent}def {name}() -> None:\n{body}{indent}    return None\n"


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_modules_and_functions_at_their_limits_pass(tmp_path: Path) -> None:
    at_limit = _function("f", MAX_FUNCTION_LINES)
    filler = "\n" * (MAX_MODULE_LINES - len(at_limit.splitlines()))
    root = _tree(tmp_path, {"operator/dtjob/a.py": at_limit + filler, "training/dtjob_train/b.py": at_limit})
    assert len((root / "operator/dtjob/a.py").read_text().splitlines()) == MAX_MODULE_LINES
    assert check_sizes.oversizes(root) == []
    assert check_sizes.main([str(root)]) == 0


def test_one_line_over_either_limit_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    long_module = "x = 1\n" * (MAX_MODULE_LINES + 1)
    root = _tree(tmp_path, {
        "operator/dtjob/pkg/long.py": long_module,
        "training/dtjob_train/f.py": _function("long_one", MAX_FUNCTION_LINES + 1),
    })  # fmt: skip
    found = {o.where: o.lines for o in check_sizes.oversizes(root)}
    assert found == {
        "operator/dtjob/pkg/long.py": MAX_MODULE_LINES + 1,
        "training/dtjob_train/f.py::long_one": MAX_FUNCTION_LINES + 1,
    }
    assert check_sizes.main([str(root)]) == 1
    err = capsys.readouterr().err
    assert "operator/dtjob/pkg/long.py: 401 lines (limit 400)" in err
    assert "training/dtjob_train/f.py::long_one: 61 lines (limit 60)" in err


def test_methods_nested_functions_and_decorators_count(tmp_path: Path) -> None:
    method = "class C:\n    @staticmethod\n" + _function("m", MAX_FUNCTION_LINES, indent="    ")
    nested = "def outer() -> None:\n" + _function("inner", MAX_FUNCTION_LINES, indent="    ")
    guarded = "if True:\n" + _function("g", MAX_FUNCTION_LINES + 1, indent="    ")
    root = _tree(tmp_path, {"operator/dtjob/m.py": method + nested + guarded})
    assert {o.where for o in check_sizes.oversizes(root)} == {
        "operator/dtjob/m.py::C.m",  # 60 lines and its decorator
        "operator/dtjob/m.py::outer",  # its own line and the 60 of the function it holds (within)
        "operator/dtjob/m.py::g",
    }


def test_only_the_operators_and_the_trainers_code_is_checked(tmp_path: Path) -> None:
    long_module = "x = 1\n" * (MAX_MODULE_LINES + 1)
    root = _tree(tmp_path, {"tests/long.py": long_module, "operator/other/long.py": long_module})
    assert check_sizes.oversizes(root) == []


def test_an_exception_lets_one_oversize_pass_and_must_stay_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _tree(tmp_path, {"operator/dtjob/f.py": _function("f", MAX_FUNCTION_LINES + 1)})
    monkeypatch.setattr(check_sizes, "EXCEPTIONS", {"operator/dtjob/f.py::f": "a reason"})
    assert check_sizes.main([str(root)]) == 0
    (root / "operator/dtjob/f.py").write_text(_function("f", MAX_FUNCTION_LINES))
    assert check_sizes.main([str(root)]) == 1
    assert "operator/dtjob/f.py::f is within its limits" in capsys.readouterr().err


def test_every_exception_gives_its_reason() -> None:
    for where, reason in check_sizes.EXCEPTIONS.items():
        assert reason.strip(), where
