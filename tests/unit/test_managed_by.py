"""spec.managedBy: which jobs this operator reconciles."""

from __future__ import annotations

from typing import Any

import pytest
from dtjob.spec.managed_by import MULTIKUEUE, THIS_OPERATOR, managed_by, reconciled_here
from dtjob.spec.parse import SpecError

from tests.unit.operator_fixtures import job_spec


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


@pytest.mark.parametrize("value", ["operator", "Example.com/x", "example.com/", "/x", "a.b/" + "x" * 60])
def test_the_parser_refuses_a_controller_name_the_crd_refuses_naming_the_field(value: str) -> None:
    with pytest.raises(SpecError) as err:
        job_spec(managedBy=value)
    assert err.value.path == "spec.managedBy" and "is not a controller name" in err.value.message
    assert job_spec(managedBy=THIS_OPERATOR).name == "rn50"
