"""What a job's code, a tenant or a storage writer puts into text the operator shows (status, Events, the
command-line tool) is shown, never acted on by the reader's terminal: escape sequences that write the
clipboard (OSC 52), hide a link (OSC 8) or move the cursor over earlier lines, 8-bit C1 codes, bidi overrides,
lone surrogates. Each path by which such text reaches a status or an Event is checked here."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from dtjob.cli.job_view import render
from dtjob.client.status import JobStatus, progress_line
from dtjob.contract.results_upload import latest_report
from dtjob.contract.training_progress import latest_progress
from dtjob.contract.transfer_report import ProgressSnapshot
from dtjob.printable import printable
from dtjob.state.failed_create import failed_create_view, newest_failed_create
from dtjob.state.pod_state import container_reason, pod_reason
from dtjob.state.rank_error import rank_error

CLIPBOARD = "\x1b]52;c;cm0gLXJmIH4K\x07"  # OSC 52: put `rm -rf ~` on the reader's clipboard
LINK = "\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\"  # OSC 8: a link that hides where it goes
HIDE = "\x1b[2A\x1b[2K"  # up two lines, erase: a Warning above is gone
C1 = "\x9b2A\x9d52;c;eA==\x07"  # the same in 8-bit controls
BIDI = "\u202etxt.exe"  # shown reversed
ATTACKS = (CLIPBOARD, LINK, HIDE, C1, BIDI, "\ud800", "a\u2028b", "\x00\x7f")
ACTING = ("\x1b", "\x9b", "\x9d", "\x07", "\u202e", "\ud800", "\u2028", "\x00", "\x7f")


def shown(text: str) -> bool:
    """Whether nothing in `text` acts on a terminal (it survives JSON as it is: no lone surrogate either)."""
    return not any(char in text for char in ACTING) and json.loads(json.dumps(text)) == text


@pytest.mark.parametrize("attack", ATTACKS)
def test_every_character_that_acts_on_a_terminal_is_written_out(attack: str) -> None:
    out = printable(f"before {attack} after")
    assert shown(out), out
    assert out.startswith("before ") and out.endswith(" after")


def test_text_that_only_shows_is_left_as_it_is_colours_dropped_tabs_spaced() -> None:
    for text in ("plain ascii: exit code 1", "café 中文 ü — ok", "a\nb"):
        assert printable(text) == text
    assert printable("a\tb") == "a b"
    assert printable("\x1b[31mred\x1b[0m") == "red"
    assert printable("a\nb", keep_newlines=False) == "a\\x0ab"
    assert printable(CLIPBOARD) == "\\x1b]52;c;cm0gLXJmIH4K\\x07"  # still there to read


def terminated(message: str) -> dict[str, Any]:
    return {
        "name": "launcher",
        "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": message}},
    }


@pytest.mark.parametrize("attack", ATTACKS)
def test_a_containers_termination_message_and_a_waiting_message_reach_the_status_printable(
    attack: str,
) -> None:
    reason = container_reason(terminated(f"boom {attack}"))
    assert reason is not None and reason.startswith("Error, exit code 1: boom") and shown(reason)
    waiting = {"name": "w", "state": {"waiting": {"reason": "ErrImagePull", "message": f"pull {attack}"}}}
    reason = container_reason(waiting)
    assert reason is not None and shown(reason)
    pod = {"status": {"phase": "Failed", "reason": "Evicted", "message": attack}}
    reason = pod_reason(pod)
    assert reason is not None and shown(reason)


@pytest.mark.parametrize("attack", ATTACKS)
def test_the_stagers_report_the_upload_line_a_rank_line_a_failed_create_and_progress_are_printable(
    attack: str,
) -> None:
    counts: dict[str, float] = dict.fromkeys(("files_total", "files_done", "files_skipped", "bytes_total"), 1)
    counts.update(bytes_done=1, bytes_skipped=0, elapsed_s=1.0, bytes_per_s=1.0)
    snapshot = ProgressSnapshot.from_json(
        json.dumps({"phase": f"x{attack}", "reason": f"{attack} md5", **counts})
    )
    assert shown(snapshot.reason) and shown(snapshot.phase)
    report = latest_report(f"dtjob results upload: failed after 3 tries in 9 s on pod p-0: {attack}\n")
    assert report is not None and shown(report.message)
    error = rank_error(f"[1,0]<stderr>:error: boom {attack}\n")
    assert error is not None and shown(error.text), error
    newest = newest_failed_create([failed_create_view({"message": f"pods is forbidden: {attack}" * 200})])
    assert newest is not None and shown(newest)
    assert newest == newest_failed_create([{"message": f"pods is forbidden: {attack}" * 200}])  # either read
    record = {"epoch": 1, "epochs": 2, "step": 3, "stepsPerEpoch": 4, "imagesPerSec": 5, "loss": 1.0}
    progress = latest_progress(f"DTJOB_PROGRESS {json.dumps({**record, 'updatedAt': attack})}\n")
    assert progress is not None and shown(progress["updatedAt"]), progress


def test_the_status_screen_and_the_progress_line_show_any_event_or_message_as_text() -> None:
    """A second layer in the command-line tool: Events are anyone's in the namespace to post, and a status
    written by an older operator may still hold raw controls."""
    attack = "".join(ATTACKS[:5])
    job = {
        "metadata": {"name": "rn50", "namespace": "team-a"},
        "spec": {"framework": "pytorch"},
        "status": {"phase": "Failed", "message": f"launcher: {attack}", "workers": {"total": 1, "ready": 0}},
    }
    event = {"type": "Warning", "reason": "Forged", "message": f"{attack}\nPhase:      Succeeded"}
    screen = render(job, [event], datetime(2026, 1, 1, tzinfo=UTC))
    assert shown(screen.replace("\n", "")), screen
    assert "Phase:      Succeeded" not in screen.splitlines()  # a message's newline starts no line of its own
    line = progress_line(JobStatus.from_job(job))
    assert shown(line) and "\n" not in line
