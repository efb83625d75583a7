"""Progress lines from the launcher's log, as rank 0 prints them and as MPI launchers forward them."""

from __future__ import annotations

import json

import pytest
from dtjob.contract.training_progress import latest_progress

RECORD = {
    "epoch": 2,
    "epochs": 90,
    "step": 120,
    "stepsPerEpoch": 1251,
    "imagesPerSec": 2874.456,
    "loss": 5.123456,
    "updatedAt": "2026-11-22T03:00:00Z",
}


def line(record: dict[str, object], prefix: str = "") -> str:
    return f"{prefix}DTJOB_PROGRESS {json.dumps(record)}"


def test_the_newest_record_wins_and_gets_a_summary() -> None:
    older = {**RECORD, "step": 110}
    log = "\n".join(["starting", line(older), "epoch 2/90 step 120/1251 loss 5.1235", line(RECORD), "tail"])
    assert latest_progress(log) == {
        "epoch": 2,
        "epochs": 90,
        "step": 120,
        "stepsPerEpoch": 1251,
        "imagesPerSec": 2874.5,
        "loss": 5.1235,
        "updatedAt": "2026-11-22T03:00:00Z",
        "percent": 1.2,  # (1 x 1251 + 120) / (90 x 1251) steps, floored to 0.1
        "summary": "epoch 2/90 step 120/1251 2874 img/s loss 5.123 1.2%",
    }


@pytest.mark.parametrize("prefix", ["[1,0]<stdout>:", "[0]<stdout>:", "Tue Nov 22 03:00:00 2026[0]<stdout>:"])
def test_rank_tags_of_mpirun_and_horovodrun_are_ignored(prefix: str) -> None:
    progress = latest_progress(line(RECORD, prefix))
    assert progress is not None and progress["step"] == 120


@pytest.mark.parametrize(
    "bad",
    [
        'DTJOB_PROGRESS {"epoch": 3, "epochs": 90, "step": 1',  # cut by the log tail
        'DTJOB_PROGRESS {"epoch": "three", "epochs": 9, "step": 1, "stepsPerEpoch": 2, '
        '"imagesPerSec": 1, "loss": 1}',
        'DTJOB_PROGRESS ["not", "an", "object"]',
        'DTJOB_PROGRESS {"epoch": 3}',
    ],
)
def test_a_malformed_newest_line_falls_back_to_the_last_good_one(bad: str) -> None:
    progress = latest_progress(line(RECORD) + "\n" + bad)
    assert progress is not None and progress["epoch"] == 2


def test_no_progress_yet() -> None:
    assert latest_progress("") is None
    assert latest_progress("sshd ready\nhorovodrun starting 8 ranks\n") is None


def test_a_diverged_loss_never_reaches_status_as_a_number_json_cannot_hold() -> None:
    # Rank 0 prints Python's json, which writes NaN; the API server refuses a status patch holding one, and
    # the job stayed Running forever on the real node.
    progress = latest_progress(line({**RECORD, "loss": float("nan")}))
    assert progress is not None
    assert "loss" not in progress
    assert progress["summary"].endswith("loss nan 1.2%")
    json.dumps(progress, allow_nan=False)  # raises on any NaN or Infinity left


def test_a_record_followed_by_the_next_rank_tag_on_the_same_line_is_read() -> None:
    # As mpirun --tag-output wrote it on the real node: the next line's tag glued after the record.
    log = line(RECORD, prefix="[1,0]<stdout>:") + "[1,0]<stdout>:\n[1,0]<stdout>:Img/sec per worker: 1.1"
    progress = latest_progress(log)
    assert progress is not None and progress["step"] == RECORD["step"]


@pytest.mark.parametrize(
    ("field", "text"),
    [("loss", "Infinity"), ("loss", "-Infinity"), ("imagesPerSec", "NaN"), ("imagesPerSec", "Infinity")],
)
def test_every_non_finite_float_is_left_out_of_status(field: str, text: str) -> None:
    raw = json.dumps({**RECORD, field: 0.5}).replace("0.5", text)
    progress = latest_progress(f"DTJOB_PROGRESS {raw}")
    assert progress is not None and field not in progress
    json.dumps(progress, allow_nan=False)


@pytest.mark.parametrize("number", ["Infinity", "NaN", "1e999", str(2**63), "1" * 5000, "-3"])
def test_a_counter_no_status_can_hold_skips_the_record_instead_of_failing_the_reconcile(number: str) -> None:
    # int(Infinity) raised OverflowError, and a 5000-digit integer a ValueError json.loads does not wrap:
    # either failed every reconcile of the job while that line was the newest.
    bad = json.dumps({**RECORD, "step": 7}).replace('"step": 7', f'"step": {number}')
    progress = latest_progress(line(RECORD) + "\nDTJOB_PROGRESS " + bad)
    assert progress is not None and progress["step"] == RECORD["step"]


def test_a_long_updated_at_is_cut_not_copied_into_status_whole() -> None:
    progress = latest_progress(line({**RECORD, "updatedAt": "2026-11-22T03:00:00Z" + "x" * 60_000}))
    assert progress is not None and progress["updatedAt"] == ("2026-11-22T03:00:00Z" + "x" * 60_000)[:40]
