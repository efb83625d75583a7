"""`python -m bench` hands the words after a benchmark's name to that benchmark."""

from __future__ import annotations

import pytest

from bench.__main__ import DEFAULT, parse


def test_words_after_a_name_are_its_arguments() -> None:
    assert parse(["versus_mpi_operator", "--jobs", "500", "failover", "--runs", "3"]) == [
        ("versus_mpi_operator", ["--jobs", "500"]),
        ("failover", ["--runs", "3"]),
    ]
    assert parse([]) == [(name, []) for name in DEFAULT]


def test_an_argument_before_any_name_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown benchmark: --jobs"):
        parse(["--jobs", "5"])
