"""Why a rank failed, from the tail of the launcher's log: the line a user would otherwise have to find there.

horovodrun and mpirun forward every rank's output to the launcher, behind a rank tag under horovodrun
(`[1,0]<stderr>:` with Open MPI, `[0]<stderr>:` with Gloo, sometimes after a timestamp); a torchrun world's
ranks write to their worker's own log, torch.distributed tagging a traceback `[rank1]: `. The most telling
line is, in this order:

1. our own error line: the trainers' `error: ...` (training/dtjob_train: bad input, no GPU visible, an
   undecodable image; the no-GPU one names the pod the rank ran on), the launcher script's `dtjob: ...` or
   the results upload's `upload failed: ...`;
2. the exception line (`SomeError: message`) that ends a rank's Python traceback;
3. the same from output without a rank tag (plain mpirun), leaving out horovodrun's own report that a rank
   exited, which says nothing of why.

Within a tier the first such line wins: the first rank to fail is the cause, and the others' errors (a peer
gone from the allreduce) follow from it. The line is capped, stripped of control sequences (what else acts on
a terminal written out as an escape: dtjob.printable), and never carries a SAS signature or an account key
(dtjob.redaction). Pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from dtjob.printable import printable
from dtjob.redaction import redact

MAX_CHARS = 300

# A rank tag at the start of a line: an optional timestamp (horovodrun --prefix-output-with-timestamp), then
# `[jobid,rank]` (Open MPI's --tag-output) or `[rank]` (horovodrun's Gloo launcher), then the stream; or
# `[rankN]: `, with which torch.distributed tags a rank's traceback once its process group exists.
_TAG = re.compile(r"^[^\[\]]{0,40}\[(?:\d+,)?(\d+)\]<std(?:out|err)>:|^\[rank(\d+)\]: ?")
# mpirun sometimes writes the next line's tag at the end of a line.
_TRAILING_TAG = re.compile(r"\[(?:\d+,)?\d+\]<std(?:out|err)>:$")
# Ours: the trainers' fail(), the launcher script's own, the results upload's (dtjob.stager after horovodrun).
_OWN_ERROR = re.compile(r"^(?:error|dtjob|upload failed): \S")
# The trainers' no-GPU line: `error: <pod hostname> local rank N: ...` (dtjob_train.common.pick_gpu) ...
_HOST_LINE = re.compile(r"^error: ([a-z0-9]([-a-z0-9.]*[a-z0-9])?) local rank \d+: ")
# ... and the undecodable image's: `error: rank N: ...` (dtjob_train.pytorch).
_RANK_LINE = re.compile(r"^error: rank (\d+): ")
_TRACEBACK = "Traceback (most recent call last):"
# The last line of a traceback: the exception's (dotted) class name, alone or with its message.
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(?:: .*)?$")
# horovodrun's and torchrun's own traceback once a rank exited: the rank's line says why, this that it did.
_LAUNCHER_REPORTS = (
    "RuntimeError: Horovod detected that one or more processes exited",
    "RuntimeError: mpirun failed with exit code",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError",  # torchrun's, after a rank's own
)

# Terminal control sequences and C0 controls, dropped before the line is parsed (a tag may follow a colour);
# what else acts on a terminal (C1 codes, bidi overrides) is written out as an escape (dtjob.printable).
_CONTROL = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|[\x00-\x08\x0a-\x1f\x7f]")


@dataclass(frozen=True)
class RankError:
    text: str  # the line as the rank printed it, tag stripped, redacted and capped
    rank: int | None = None  # from the launcher's rank tag, or the line itself; None: not known
    pod: str | None = None  # the pod the line names (the host the rank ran on); None: not named

    def describe(self) -> str:
        """`rank 0 (pod W): error: ...`, for a status message after the launcher pod's reason."""
        if self.rank is not None and self.pod is not None:
            return f"rank {self.rank} (pod {self.pod}): {self.text}"
        if self.rank is not None:
            return f"rank {self.rank}: {self.text}"
        if self.pod is not None:
            return f"pod {self.pod}: {self.text}"
        return self.text


def rank_error(log_text: str) -> RankError | None:
    """The most telling error line of a launcher's log tail, or None when it holds none."""
    own: RankError | None = None
    tagged: RankError | None = None
    untagged: RankError | None = None
    in_traceback: dict[int | None, bool] = {}
    for rank, line in _lines(log_text):
        if own is None and _OWN_ERROR.match(line):
            own = _found(line, rank)
            continue
        if line == _TRACEBACK or line.startswith('  File "'):
            in_traceback[rank] = True
            continue
        if not in_traceback.get(rank):
            continue
        if line[:1].isspace() or not line:
            continue  # a frame, its source line, a caret line
        in_traceback[rank] = False
        if not _EXCEPTION.match(line):
            continue
        if rank is not None and tagged is None:
            tagged = _found(line, rank)
        elif rank is None and untagged is None and not line.startswith(_LAUNCHER_REPORTS):
            untagged = _found(line, rank)
    return own or tagged or untagged


def _lines(log_text: str) -> Iterable[tuple[int | None, str]]:
    """(rank from the tag or None, the line without its tags and trailing space)."""
    for raw in log_text.splitlines():
        raw = _CONTROL.sub("", raw)
        match = _TAG.match(raw)
        rank = int(match.group(1) or match.group(2)) if match else None
        line = raw[match.end() :] if match else raw
        yield rank, _TRAILING_TAG.sub("", line).rstrip()


def _found(line: str, rank: int | None) -> RankError:
    host = _HOST_LINE.match(line)
    named_rank = _RANK_LINE.match(line)
    if rank is None and named_rank is not None:
        rank = int(named_rank.group(1))
    # Cut before redacting (the patterns need not scan a flood of one line), with room for what redaction
    # shortens; a secret cut at that edge still matches, and the cap below drops it anyway.
    text = printable(redact(line[: 4 * MAX_CHARS]), keep_newlines=False)
    if len(text) > MAX_CHARS:
        text = text[: MAX_CHARS - 3].rstrip() + "..."
    return RankError(text, rank, host.group(1) if host else None)
