"""spec.managedBy: which jobs this operator reconciles."""

from __future__ import annotations

from typing import Any

import pytest
from dtjob.spec.managed_by import MULTIKUEUE, THIS_OPERATOR, managed_by, reconciled_here


@pytest.mark.parametrize(
    ("job", "controller"),
    [
        ({"spec": {"framework": "pytorch"}}, THIS_OPERATOR),
        ({"spec": {"managedBy": ""}}, THIS_OPERATOR),
        ({"spec": {"managedBy": THIS_OPERATOR}}, THIS_OPERATOR),
        ({"spec": {"managedBy": MULTIKUEUE}}, MULTIKUEUE),
        ({"spec": {"managedBy": "example.com/other"}}, "example.com/other"),
        ({}, THIS_OPERATOR),
        ({"spec": None}, THIS_OPERATOR),
    ],
)
def test_a_job_is_reconciled_here_unless_it_names_another_controller(
    job: dict[str, Any], controller: str
) -> None:
    assert managed_by(job) == controller
    assert reconciled_here(job) == (controller == THIS_OPERATOR)


def test_this_operators_name_is_a_domain_prefixed_path_the_crd_accepts() -> None:
    from tests.crd_contract import spec_schema

    field = spec_schema()["properties"]["managedBy"]
    import re

    for value in (THIS_OPERATOR, MULTIKUEUE):
        assert re.fullmatch(field["pattern"], value) and len(value) <= field["maxLength"], value
    for bad in ("multikueue", "/x", "Kueue.x-k8s.io/multikueue", "a/b/c", "a" * 60 + ".io/x"):
        assert not (re.fullmatch(field["pattern"], bad) and len(bad) <= field["maxLength"]), bad
