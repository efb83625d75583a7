"""Operator settings: every unset variable falls back to the one default on OperatorConfig."""

from __future__ import annotations

import pytest
from dtjob.config import OperatorConfig, load_config


def test_no_variables_give_the_dataclass_defaults() -> None:
    assert load_config({}) == OperatorConfig()


def test_variables_override_the_defaults() -> None:
    config = load_config(
        {
            "DTJOB_GPU_POOL": "a100",
            "DTJOB_RECONCILE_WORKERS": "2",
            "DTJOB_SAS_ROTATE_FRACTION": "0.5",
            "DTJOB_NETWORK_POLICY": "True",
            "DTJOB_IMAGE_KERAS": "example.com/keras:1",
        }
    )
    assert (config.gpu_pool, config.reconcile_workers, config.sas_rotate_fraction) == ("a100", 2, 0.5)
    assert config.network_policy
    assert config.image_for("keras") == "example.com/keras:1"
    assert config.image_for("pytorch") == OperatorConfig().image_for("pytorch")


def test_the_progress_reads_budget_may_be_lifted_but_not_negative() -> None:
    assert load_config({"DTJOB_PROGRESS_READS_PER_SECOND": "0"}).progress_reads_per_second == 0.0
    assert load_config({"DTJOB_PROGRESS_READS_PER_SECOND": "2.5"}).progress_reads_per_second == 2.5
    with pytest.raises(ValueError, match="DTJOB_PROGRESS_READS_PER_SECOND"):
        load_config({"DTJOB_PROGRESS_READS_PER_SECOND": "-1"})


def test_the_sas_lifetime_cap_is_off_or_at_least_the_shortest_lifetime_a_job_may_ask() -> None:
    assert OperatorConfig().sas_lifetime_max_seconds == 0
    assert load_config({"DTJOB_SAS_LIFETIME_MAX_SECONDS": "3600"}).sas_lifetime_max_seconds == 3600
    with pytest.raises(ValueError, match="DTJOB_SAS_LIFETIME_MAX_SECONDS"):
        load_config({"DTJOB_SAS_LIFETIME_MAX_SECONDS": "60"})


def test_a_rotation_fraction_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(ValueError, match="DTJOB_SAS_ROTATE_FRACTION"):
        load_config({"DTJOB_SAS_ROTATE_FRACTION": "1"})
