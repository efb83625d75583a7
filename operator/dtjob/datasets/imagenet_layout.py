"""ILSVRC2012 as the trainers read it: validation label files, the prepared tree's names and completion
markers, and the check of a prepared tree against the expected totals. Pure: no file or network I/O.

The prepared tree is `train/<wnid>/<image>` and `val/<wnid>/<image>`, the layout dtjob_train's scan reads
(it reads only `train/` and `val/`, ignores hidden entries, and needs the same classes in both). Completion
markers live under `_prepare/` beside them, which neither the trainers nor the stager read.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import PurePosixPath

EXPECTED_CLASSES = 1000
EXPECTED_TRAIN = 1_281_167
EXPECTED_VAL = 50_000

SPLITS = ("train", "val")
MARKER_DIR = "_prepare"
VAL_MARKER = f"{MARKER_DIR}/val.json"
IMAGE_SUFFIXES = frozenset({".jpeg", ".jpg", ".png"})  # what the trainers' scan counts as an image

WNID_RE = re.compile(r"^n\d{8}$")
_CLASS_TAR_RE = re.compile(r"^(n\d{8})\.tar$")
_VAL_STEM = "ILSVRC2012_val_{:08d}"


class LabelFormat(StrEnum):
    WNID_PER_LINE = "wnid-per-line"  # imagenet_2012_validation_synset_labels.txt: line i labels image i
    KAGGLE_CSV = "kaggle-csv"  # LOC_val_solution.csv: ImageId,PredictionString (first token the wnid)
    FILENAME_WNID = "filename-wnid"  # `ILSVRC2012_val_00000001.JPEG n01751748`, space or comma separated


class LabelError(ValueError):
    """A label file that cannot label the val tarball; the message names the file and, where it can, the
    line."""


class LayoutError(ValueError):
    """A tarball whose members are not ILSVRC2012's layout."""


@dataclass(frozen=True)
class ValLabel:
    wnid: str
    line: int  # 1-based line of the label file, for messages


@dataclass(frozen=True)
class ValLabels:
    source: str  # the file, as messages name it
    format: LabelFormat
    by_image: Mapping[str, ValLabel]  # image stem (ILSVRC2012_val_00000001) -> its label


@dataclass(frozen=True)
class Marker:
    """What a finished unit (one train class, or val) holds: written only after all of it is committed."""

    images: int
    bytes: int

    def to_json(self) -> str:
        return json.dumps({"images": self.images, "bytes": self.bytes}) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Marker | None:
        """None for a marker that does not parse (then the unit counts as not done)."""
        try:
            raw = json.loads(text)
            return cls(int(raw["images"]), int(raw["bytes"]))
        except (ValueError, KeyError, TypeError):
            return None


def image_stem(name: str) -> str:
    """`val/ILSVRC2012_val_00000001.JPEG` and `ILSVRC2012_val_00000001` both -> `ILSVRC2012_val_00000001`."""
    base = PurePosixPath(name.replace("\\", "/")).name
    return base.rsplit(".", 1)[0] if base.lower().endswith(tuple(IMAGE_SUFFIXES)) else base


def detect_format(first_line: str) -> LabelFormat | None:
    """The form of a label file from its first non-empty line, or None when it is none of them."""
    line = first_line.strip()
    if line.lower().startswith("imageid,"):
        return LabelFormat.KAGGLE_CSV
    fields = line.replace(",", " ").split()
    if len(fields) == 1 and WNID_RE.match(fields[0]):
        return LabelFormat.WNID_PER_LINE
    if len(fields) == 2 and WNID_RE.match(fields[1]):
        return LabelFormat.FILENAME_WNID
    return None


def parse_val_labels(text: str, source: str, fmt: LabelFormat | None = None) -> ValLabels:
    """Parse a validation label file in any of the LabelFormat forms (detected when `fmt` is None)."""
    lines = text.splitlines()
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is None:
        raise LabelError(f"{source}: empty label file")
    if fmt is None:
        fmt = detect_format(lines[first])
        if fmt is None:
            raise LabelError(f"{source} line {first + 1}: {_unknown_form(lines[first])}")
    if fmt is LabelFormat.WNID_PER_LINE:
        labels = _wnid_per_line(lines, source)
    elif fmt is LabelFormat.KAGGLE_CSV:
        labels = _kaggle_csv(lines, source)
    else:
        labels = _filename_wnid(lines, source)
    return ValLabels(source, fmt, labels)


def _unknown_form(line: str) -> str:
    shown = line.strip()[:60]
    if shown.isdigit():
        return (
            f"{shown!r} is an ILSVRC2012_ID (the devkit's ILSVRC2012_validation_ground_truth.txt); mapping "
            "IDs to wnids needs the devkit's meta.mat, which is not read: pass a file of wnids instead "
            "(--val-labels-format: wnid-per-line, kaggle-csv or filename-wnid)"
        )
    return (
        f"cannot tell the label file's form from {shown!r}: expected one wnid per line (n01751748), "
        "Kaggle's LOC_val_solution.csv (ImageId,PredictionString) or 'filename wnid' pairs"
    )


def _check_wnid(wnid: str, source: str, line: int) -> str:
    if not WNID_RE.match(wnid):
        raise LabelError(f"{source} line {line}: {wnid[:40]!r} is not a WordNet ID (n followed by 8 digits)")
    return wnid


def _add(labels: dict[str, ValLabel], stem: str, wnid: str, source: str, line: int) -> None:
    if stem in labels:
        raise LabelError(
            f"{source} line {line}: a second label for {stem} (the first is at line {labels[stem].line})"
        )
    labels[stem] = ValLabel(_check_wnid(wnid, source, line), line)


def _wnid_per_line(lines: Sequence[str], source: str) -> dict[str, ValLabel]:
    # The order is the meaning here, so a blank line inside would shift every label after it.
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    labels: dict[str, ValLabel] = {}
    for number, line in enumerate(lines, start=1):
        fields = line.split()
        if len(fields) != 1:
            what = "an empty line" if not fields else f"{len(fields)} fields"
            raise LabelError(f"{source} line {number}: {what}; expected one wnid per line in val-image order")
        _add(labels, _VAL_STEM.format(number), fields[0], source, number)
    return labels


def _kaggle_csv(lines: Sequence[str], source: str) -> dict[str, ValLabel]:
    rows = csv.reader(lines)
    header = next(rows, [])
    if [h.strip().lower() for h in header[:2]] != ["imageid", "predictionstring"]:
        raise LabelError(f"{source} line 1: expected the header ImageId,PredictionString")
    labels: dict[str, ValLabel] = {}
    for number, row in enumerate(rows, start=2):
        if not row or not "".join(row).strip():
            continue
        if len(row) < 2 or not row[0].strip() or not row[1].split():
            raise LabelError(f"{source} line {number}: expected ImageId,PredictionString")
        _add(labels, image_stem(row[0].strip()), row[1].split()[0], source, number)
    return labels


def _filename_wnid(lines: Sequence[str], source: str) -> dict[str, ValLabel]:
    labels: dict[str, ValLabel] = {}
    for number, line in enumerate(lines, start=1):
        fields = line.replace(",", " ").split()
        if not fields:
            continue
        if len(fields) != 2:
            raise LabelError(f"{source} line {number}: expected 'filename wnid', found {len(fields)} fields")
        _add(labels, image_stem(fields[0]), fields[1], source, number)
    return labels


def check_labels(
    labels: ValLabels, val_images: Sequence[str], train_classes: Collection[str], val_tar: str
) -> dict[str, str]:
    """Val image member name -> wnid, once every image has exactly one label, every label an image, and every
    wnid is one of the train tarball's classes; otherwise a LabelError naming the file and line."""
    stems = {image_stem(name): name for name in val_images}
    for stem, label in sorted(labels.by_image.items(), key=lambda item: item[1].line):
        if stem not in stems:
            raise LabelError(
                f"{labels.source} line {label.line}: labels {stem}, which {val_tar} does not hold "
                f"({len(labels.by_image)} labels for {len(stems)} images)"
            )
        if label.wnid not in train_classes:
            raise LabelError(
                f"{labels.source} line {label.line}: {label.wnid} is not one of the "
                f"{len(train_classes)} classes of the train tarball"
            )
    unlabelled = [name for stem, name in stems.items() if stem not in labels.by_image]
    if unlabelled:
        where = ""
        if labels.format is LabelFormat.WNID_PER_LINE:
            where = f" (the file ends at line {len(labels.by_image)})"
        raise LabelError(
            f"{labels.source}: {len(labels.by_image)} labels for {len(stems)} images in {val_tar}; "
            f"no label for {', '.join(sorted(unlabelled)[:3])}"
            + (f" and {len(unlabelled) - 3} more" if len(unlabelled) > 3 else "")
            + where
        )
    return {name: labels.by_image[stem].wnid for stem, name in stems.items()}


def class_of_member(member_name: str, train_tar: str) -> str:
    """`n01440764.tar` (a member of the train tarball) -> `n01440764`."""
    match = _CLASS_TAR_RE.match(PurePosixPath(member_name).name)
    if match is None:
        raise LayoutError(
            f"{train_tar}: member {member_name[:80]!r} is not a per-class tar <wnid>.tar "
            "(is this ILSVRC2012_img_train.tar?)"
        )
    return match.group(1)


def _safe_name(member_name: str, archive: str) -> str:
    name = PurePosixPath(member_name).name
    if not name or name.startswith(".") or "\\" in name or "\0" in name:
        raise LayoutError(f"{archive}: member {member_name[:80]!r} has no usable file name")
    return name


def train_path(wnid: str, member_name: str, archive: str) -> str:
    return f"train/{wnid}/{_safe_name(member_name, archive)}"


def val_path(wnid: str, member_name: str, archive: str) -> str:
    return f"val/{wnid}/{_safe_name(member_name, archive)}"


def train_marker(wnid: str) -> str:
    return f"{MARKER_DIR}/train/{wnid}.json"


def is_marker(rel: str) -> bool:
    """A completion marker (a path under the prepared tree), which is not part of the dataset."""
    return rel.startswith(f"{MARKER_DIR}/")


def split_and_class(rel: str) -> tuple[str, str] | None:
    """`train/n01440764/x.JPEG` -> ("train", "n01440764"); None for anything the trainers do not count."""
    parts = rel.split("/")
    if len(parts) != 3 or parts[0] not in SPLITS or parts[1].startswith(".") or parts[2].startswith("."):
        return None
    if PurePosixPath(parts[2]).suffix.lower() not in IMAGE_SUFFIXES:
        return None
    return parts[0], parts[1]


def count_images(paths: Iterable[str]) -> dict[str, dict[str, int]]:
    """Images per split and class from the tree's relative paths."""
    counts: dict[str, dict[str, int]] = {split: {} for split in SPLITS}
    for rel in paths:
        found = split_and_class(rel)
        if found is not None:
            split, wnid = found
            counts[split][wnid] = counts[split].get(wnid, 0) + 1
    return counts


@dataclass(frozen=True)
class Expected:
    classes: int = EXPECTED_CLASSES
    train: int = EXPECTED_TRAIN
    val: int = EXPECTED_VAL


@dataclass(frozen=True)
class Report:
    summary: tuple[str, ...]
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    def lines(self) -> list[str]:
        verdict = ["check: complete"] if self.ok else [f"check: FAILED ({len(self.problems)} problem(s))"]
        return [*self.summary, *(f"  - {p}" for p in self.problems), *verdict]


def _some(names: Iterable[str], limit: int = 10) -> str:
    ordered = sorted(names)
    more = f" and {len(ordered) - limit} more" if len(ordered) > limit else ""
    return ", ".join(ordered[:limit]) + more


def check_tree(
    counts: Mapping[str, Mapping[str, int]], expected: Expected, train_classes: Collection[str] = ()
) -> Report:
    """Compare a prepared tree's image counts with the expected totals. `train_classes` (the train
    tarball's classes, when known) names the classes that are absent."""
    train = {wnid: n for wnid, n in counts.get("train", {}).items() if n}
    val = {wnid: n for wnid, n in counts.get("val", {}).items() if n}
    train_images, val_images = sum(train.values()), sum(val.values())
    summary = (
        f"train: {len(train)} classes, {train_images} images (expected {expected.classes}, {expected.train})",
        f"val: {len(val)} classes, {val_images} images (expected {expected.classes}, {expected.val})",
    )
    problems: list[str] = []
    if len(train) != expected.classes:
        problems.append(f"train/ has {len(train)} classes, expected {expected.classes}")
    absent = set(train_classes) - set(train)
    if absent:
        problems.append(f"{len(absent)} classes of the train tarball absent from train/: {_some(absent)}")
    for split, found, wanted in (("train", train_images, expected.train), ("val", val_images, expected.val)):
        if found != wanted:
            problems.append(f"{split}/ has {found} images, expected {wanted} ({_diff(found, wanted)})")
    without_val = set(train) - set(val)
    if without_val:
        problems.append(
            f"{len(without_val)} classes have no val images (the trainers need the same classes in train/ "
            f"and val/): {_some(without_val)}"
        )
    only_val = set(val) - set(train)
    if only_val:
        problems.append(f"{len(only_val)} classes in val/ have no train images: {_some(only_val)}")
    return Report(summary, tuple(problems))


def _diff(found: int, expected: int) -> str:
    return f"{expected - found} missing" if found < expected else f"{found - expected} more"
