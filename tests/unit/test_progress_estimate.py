"""Percent done and the ETA in status.progress: from rank 0's record alone, honest across restarts and
resizes."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from dtjob.contract.training_progress import estimate, latest_progress, measured_steps_per_sec, without_eta
from dtjob.timefmt import format_span

# A ResNet-50 run: 90 epochs of 1251 steps.
RECORD: dict[str, Any] = {
    "epoch": 2, "epochs": 90, "step": 120, "stepsPerEpoch": 1251, "imagesPerSec": 2874.456, "loss": 5.1,
    "updatedAt": "2026-11-22T03:00:00Z", "worldSize": 8, "globalBatch": 1024, "stepsPerSec": 2.5,
}  # fmt: skip
PLANNED = 90 * 1251


def progress_of(record: dict[str, Any]) -> dict[str, Any]:
    progress = latest_progress(f"[1,0]<stdout>:DTJOB_PROGRESS {json.dumps(record)}")
    assert progress is not None
    return progress


def test_steps_done_count_whole_epochs_before_the_current_one() -> None:
    done = 1251 + 120
    percent, eta = estimate(2, 90, 120, 1251, 2.5)
    assert percent == math.floor(1000 * done / PLANNED) / 10 == 1.2
    assert eta == math.ceil((PLANNED - done) / 2.5) == 44488


def test_a_record_carries_percent_eta_and_what_they_rest_on_and_the_summary_ends_with_them() -> None:
    progress = progress_of(RECORD)
    assert (progress["percent"], progress["etaSeconds"], progress["eta"]) == (1.2, 44488, "12h21m")
    assert (progress["stepsPerSec"], progress["worldSize"], progress["globalBatch"]) == (2.5, 8, 1024)
    assert progress["summary"] == "epoch 2/90 step 120/1251 2874 img/s loss 5.100 1.2% ETA 12h21m"


def test_the_first_record_has_a_percent_but_no_eta_until_a_pace_is_measured() -> None:
    # The trainers write a null pace until they measure one; their imagesPerSec (the first interval's, a
    # warm-up) is then no pace either.
    progress = progress_of({**RECORD, "epoch": 1, "step": 10, "stepsPerSec": None})
    assert progress["percent"] == 0.0 and progress["globalBatch"] == 1024
    assert "etaSeconds" not in progress and "eta" not in progress and "stepsPerSec" not in progress
    assert progress["summary"].endswith("loss 5.100 0.0%")


@pytest.mark.parametrize(
    "rate", [float("nan"), float("inf"), float("-inf"), 0, -1.5, "fast", True, None, 10**400]
)
def test_a_rate_that_is_not_a_pace_gives_no_eta_and_still_a_record(rate: Any) -> None:
    # json writes NaN and Infinity as Python does; a huge integer is a plain number to json.
    progress = progress_of({**RECORD, "stepsPerSec": rate})
    assert progress["percent"] == 1.2
    assert "etaSeconds" not in progress and "stepsPerSec" not in progress
    assert "ETA" not in progress["summary"]


def test_without_its_own_pace_a_trainer_is_timed_by_images_per_sec_over_the_global_batch() -> None:
    record = {k: v for k, v in RECORD.items() if k != "stepsPerSec"}
    assert measured_steps_per_sec(record) == pytest.approx(2874.456 / 1024)
    assert progress_of(record)["etaSeconds"] == math.ceil((PLANNED - 1371) / (2874.456 / 1024))
    assert measured_steps_per_sec({**record, "imagesPerSec": float("nan")}) is None
    assert measured_steps_per_sec({**record, "globalBatch": 0}) is None


def test_a_finished_run_is_100_percent_with_nothing_left_even_without_a_pace() -> None:
    assert estimate(90, 90, 1251, 1251, 2.5) == (100.0, 0)
    assert estimate(90, 90, 1251, 1251, None) == (100.0, 0)
    progress = progress_of({**RECORD, "epoch": 90, "step": 1251})
    assert (progress["percent"], progress["etaSeconds"]) == (100.0, 0)
    assert progress["summary"].endswith(" 100.0% ETA 0s")


def test_100_percent_means_finished_a_last_step_short_is_99_9() -> None:
    assert estimate(90, 90, 1250, 1251, 2.5) == (99.9, 1)
    assert estimate(1, 1, 9999, 10000, None) == (99.9, None)


def test_a_step_past_its_epoch_or_an_epoch_past_the_plan_never_goes_beyond_100_percent() -> None:
    assert estimate(2, 2, 80, 50, 1.0) == (100.0, 0)
    assert estimate(5, 2, 10, 50, 1.0) == (100.0, 0)


def test_nothing_planned_has_no_percent() -> None:
    assert estimate(1, 0, 0, 1251, 2.5) == (None, None)
    assert estimate(1, 90, 0, 0, 2.5) == (None, None)
    assert "percent" not in progress_of({**RECORD, "stepsPerEpoch": 0})


def test_a_pace_too_slow_to_count_gives_no_eta() -> None:
    assert estimate(1, 2**62, 0, 2**62, 1e-300) == (0.0, None)


def test_a_run_resumed_at_epoch_k_counts_from_its_checkpoint_at_its_new_pace() -> None:
    # The first world did 30 epochs at 2.5 steps/s and was lost; the second resumed from the epoch-30
    # checkpoint, and its trainer times only its own steps: 200 steps in, at 2.0 steps/s.
    resumed = progress_of({**RECORD, "epoch": 31, "step": 200, "stepsPerSec": 2.0})
    done = 30 * 1251 + 200
    assert resumed["percent"] == math.floor(1000 * done / PLANNED) / 10 == 33.5
    assert resumed["etaSeconds"] == math.ceil((PLANNED - done) / 2.0)


def test_a_world_of_another_size_is_timed_at_its_own_pace() -> None:
    eight = progress_of(RECORD)
    four = progress_of({**RECORD, "worldSize": 4, "globalBatch": 512, "stepsPerSec": 2.6})
    assert (four["worldSize"], four["percent"]) == (4, eight["percent"])
    assert four["etaSeconds"] == math.ceil((PLANNED - 1371) / 2.6) < eight["etaSeconds"]


@pytest.mark.parametrize("value", [0, -4, 2.5, True, "8", 2**63])
def test_a_world_size_or_batch_that_is_no_count_is_left_out(value: Any) -> None:
    progress = progress_of({**RECORD, "worldSize": value, "globalBatch": value})
    assert "worldSize" not in progress and "globalBatch" not in progress
    assert progress["etaSeconds"] == 44488


def test_without_eta_keeps_the_rest_and_says_no_eta() -> None:
    progress = progress_of(RECORD)
    kept = without_eta(progress)
    assert kept == {k: v for k, v in progress.items() if k not in ("etaSeconds", "eta", "summary")} | {
        "summary": "epoch 2/90 step 120/1251 2874 img/s loss 5.100 1.2%"
    }
    assert without_eta(kept) == kept


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (45, "45s"), (60, "1m"), (750, "12m30s"), (3600, "1h"), (4320, "1h12m"), (4379, "1h12m"),
     (86400 * 3 + 4 * 3600 + 59, "3d4h"), (-5, "0s")],
)  # fmt: skip
def test_spans_read_in_their_two_largest_units(seconds: int, text: str) -> None:
    assert format_span(seconds) == text
