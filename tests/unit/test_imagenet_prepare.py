"""`dtjob data prepare-imagenet --to DIR` on a miniature ILSVRC2012 (real JPEGs, nested per-class tars): the
tree the trainers read, a resume that leaves finished classes alone, and clear failures."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from dtjob.cli.main import main
from dtjob_train.data.folder import scan

from tests.imagenet_tarballs import CLASSES, MiniImagenet, generated_images, make_tarballs, tree_files


@pytest.fixture(scope="module")
def mini(tmp_path_factory: pytest.TempPathFactory) -> MiniImagenet:
    return make_tarballs(tmp_path_factory.mktemp("ilsvrc"), generated_images())


def prepare(mini: MiniImagenet, out: Path, *extra: str, labels: str = "wnid-per-line") -> list[str]:
    return [
        "data",
        "prepare-imagenet",
        "--train-tar",
        str(mini.train_tar),
        "--val-tar",
        str(mini.val_tar),
        "--val-labels",
        str(mini.labels[labels]),
        "--to",
        str(out),
        "--concurrency",
        "3",
        *mini.expect_args(),
        *extra,
    ]


def dataset_files(out: Path) -> dict[str, bytes]:
    return {rel: data for rel, data in tree_files(out).items() if not rel.startswith("_prepare/")}


@pytest.mark.parametrize("labels", ["wnid-per-line", "kaggle-csv", "filename-wnid"])
def test_the_tarballs_become_the_tree_the_trainers_read(
    mini: MiniImagenet, tmp_path: Path, labels: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "imagenet"
    assert main(prepare(mini, out, labels=labels)) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert (
        f"prepared 4 class(es) (0 already complete), val prepared: {len(mini.expected)} image(s)" in printed
    )
    assert f"train: 4 classes, {mini.train_images} images" in printed
    assert printed.rstrip().endswith("check: complete")
    assert dataset_files(out) == mini.expected
    markers = sorted(p.relative_to(out).as_posix() for p in (out / "_prepare").rglob("*"))
    assert markers == ["_prepare/train", *(f"_prepare/train/{c}.json" for c in CLASSES), "_prepare/val.json"]
    assert not [p for p in out.rglob("*") if p.name.endswith(".dtjob-part")]
    # What the trainers' own scan makes of it.
    dataset = scan(out)
    assert dataset.train.classes == CLASSES
    assert dataset.val is not None and dataset.val.classes == CLASSES
    assert (len(dataset.train.samples), len(dataset.val.samples)) == (mini.train_images, mini.val_images)


def test_a_rerun_after_a_failure_mid_class_redoes_only_the_unfinished_classes(
    mini: MiniImagenet, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "imagenet"
    # A directory where an image of the third class must go: its write fails mid-class, as a full disk would.
    obstacle = out / "train" / CLASSES[2] / f"{CLASSES[2]}_1003.JPEG"
    obstacle.mkdir(parents=True)
    assert main(prepare(mini, out, "--no-progress")) == 5
    err = capsys.readouterr().err
    assert f"dtjob data: local I/O error {obstacle}" in err, err
    done = sorted(p.name for p in (out / "_prepare" / "train").iterdir())
    assert done == [f"{CLASSES[0]}.json", f"{CLASSES[1]}.json"]
    assert not (out / "_prepare" / "val.json").exists()
    finished = {
        p: (p.stat().st_ino, p.stat().st_mtime_ns)
        for c in CLASSES[:2]
        for p in [*(out / "train" / c).iterdir(), out / "_prepare" / "train" / f"{c}.json"]
    }
    assert len(finished) == 2 * 5 + 2

    obstacle.rmdir()
    assert main(prepare(mini, out)) == 0
    printed = capsys.readouterr().out
    assert "prepared 2 class(es) (2 already complete), val prepared:" in printed
    written = 2 * 5 + mini.val_images
    assert f"{written} image(s) written" in printed, printed
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in finished} == finished
    assert dataset_files(out) == mini.expected

    # A third run has nothing left to do.
    assert main(prepare(mini, out)) == 0
    assert (
        "prepared 0 class(es) (4 already complete), val already complete: 0 image(s)"
        in capsys.readouterr().out
    )


def test_the_check_reports_a_missing_class_and_fails_unless_told_not_to(
    mini: MiniImagenet, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "imagenet"
    assert main(prepare(mini, out)) == 0
    capsys.readouterr()
    # A class lost after it was prepared (its marker kept), so the rerun skips it and the check must see it.
    shutil.rmtree(out / "train" / CLASSES[1])
    assert main(prepare(mini, out)) == 1
    printed = capsys.readouterr().out
    assert f"train: 3 classes, {mini.train_images - 5} images" in printed
    assert "  - train/ has 3 classes, expected 4" in printed
    assert f"  - 1 classes of the train tarball absent from train/: {CLASSES[1]}" in printed
    assert (
        f"  - train/ has {mini.train_images - 5} images, expected {mini.train_images} (5 missing)" in printed
    )
    assert f"  - 1 classes in val/ have no train images: {CLASSES[1]}" in printed
    assert printed.rstrip().endswith("check: FAILED (4 problem(s))")
    assert main(prepare(mini, out, "--no-verify")) == 0
    # The full-size defaults: a miniature is not ImageNet.
    args = prepare(mini, tmp_path / "other")
    assert main(args[: args.index("--expect-classes")]) == 1
    assert "  - train/ has 4 classes, expected 1000" in capsys.readouterr().out


def test_bad_labels_fail_before_anything_is_written(
    mini: MiniImagenet, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "imagenet"
    lines = mini.labels["wnid-per-line"].read_text().splitlines()
    short = tmp_path / "short.txt"
    short.write_text("\n".join(lines[:-1]) + "\n")
    last = f"ILSVRC2012_val_{len(lines):08d}.JPEG"
    assert main(prepare(mini, out, "--val-labels", str(short))) == 2
    assert capsys.readouterr().err.strip() == (
        f"dtjob data: {short}: {len(lines) - 1} labels for {len(lines)} images in ILSVRC2012_img_val.tar; "
        f"no label for {last} (the file ends at line {len(lines) - 1})"
    )
    unknown = tmp_path / "unknown.txt"
    unknown.write_text("\n".join([*lines[:2], "n04592741", *lines[3:]]) + "\n")
    assert main(prepare(mini, out, "--val-labels", str(unknown))) == 2
    assert capsys.readouterr().err.strip() == (
        f"dtjob data: {unknown} line 3: n04592741 is not one of the 4 classes of the train tarball"
    )
    assert main(prepare(mini, out, "--val-labels-format", "kaggle-csv")) == 2
    assert "line 1: expected the header ImageId,PredictionString" in capsys.readouterr().err
    assert not any(out.rglob("*.JPEG"))

    # The tarballs swapped: the val tar holds no per-class tars.
    swapped = prepare(mini, out)
    swapped[swapped.index("--train-tar") + 1] = str(mini.val_tar)
    assert main(swapped) == 2
    assert "is not a per-class tar <wnid>.tar (is this ILSVRC2012_img_train.tar?)" in capsys.readouterr().err
    missing = prepare(mini, out)
    missing[missing.index("--val-tar") + 1] = str(tmp_path / "absent.tar")
    assert main(missing) == 5
    assert f"cannot read {tmp_path / 'absent.tar'}" in capsys.readouterr().err
