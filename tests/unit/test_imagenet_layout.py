"""The pure side of `dtjob data prepare-imagenet`: label files in each form, their mistakes named by file and
line, the tree's names, and the check of a prepared tree."""

from __future__ import annotations

import re

import pytest
from dtjob.datasets.imagenet_layout import (
    Expected,
    LabelError,
    LabelFormat,
    LayoutError,
    Marker,
    check_labels,
    check_tree,
    class_of_member,
    count_images,
    is_marker,
    parse_val_labels,
    train_marker,
    train_path,
    val_path,
)

VAL = [f"ILSVRC2012_val_{n:08d}.JPEG" for n in (1, 2, 3)]
WNIDS = ["n01751748", "n09193705", "n01751748"]
CLASSES = {"n01751748", "n09193705"}

FORMS = {
    LabelFormat.WNID_PER_LINE: "n01751748\nn09193705\nn01751748\n",
    LabelFormat.KAGGLE_CSV: (
        "ImageId,PredictionString\n"
        "ILSVRC2012_val_00000003,n01751748 1 2 3 4 n01751748 5 6 7 8\n"
        "ILSVRC2012_val_00000001,n01751748 1 2 3 4 \n"
        "ILSVRC2012_val_00000002,n09193705 9 9 9 9\n"
    ),
    LabelFormat.FILENAME_WNID: (
        "ILSVRC2012_val_00000002.JPEG n09193705\n"
        "val/ILSVRC2012_val_00000001.JPEG\tn01751748\n"
        "ILSVRC2012_val_00000003,n01751748\n"
    ),
}


@pytest.mark.parametrize("form", list(FORMS))
def test_each_form_is_detected_and_labels_every_image(form: LabelFormat) -> None:
    labels = parse_val_labels(FORMS[form], "labels.txt")
    assert labels.format is form
    assert check_labels(labels, VAL, CLASSES, "val.tar") == dict(zip(VAL, WNIDS, strict=True))
    # Named explicitly, the same result.
    assert parse_val_labels(FORMS[form], "labels.txt", form) == labels


@pytest.mark.parametrize(
    ("text", "fmt", "message"),
    [
        ("n01751748\n\nn09193705\n", None, "labels.txt line 2: an empty line"),
        ("n01751748\nn0919370\n", None, "labels.txt line 2: 'n0919370' is not a WordNet ID"),
        ("n01751748\nn09193705 x\n", None, "labels.txt line 2: 2 fields"),
        ("ImageId,Prediction\nA,n01751748\n", None, "labels.txt line 1: expected the header"),
        ("ImageId,PredictionString\nILSVRC2012_val_00000001,\n", None, "labels.txt line 2: expected ImageId"),
        ("a.JPEG n01751748\nb.JPEG n01751748 extra\n", None, "labels.txt line 2: expected 'filename wnid'"),
        (
            "a.JPEG n01751748\na.JPEG n09193705\n",
            None,
            "labels.txt line 2: a second label for a (the first is at line 1)",
        ),
        ("65\n970\n", None, "labels.txt line 1: '65' is an ILSVRC2012_ID"),
        ("hello world again\n", None, "labels.txt line 1: cannot tell the label file's form"),
        ("\n\n", None, "labels.txt: empty label file"),
        ("a.JPEG n01751748\n", LabelFormat.WNID_PER_LINE, "labels.txt line 1: 2 fields"),
    ],
)
def test_a_bad_label_file_names_the_file_and_line(text: str, fmt: LabelFormat | None, message: str) -> None:
    with pytest.raises(LabelError) as err:
        parse_val_labels(text, "labels.txt", fmt)
    assert str(err.value).startswith(message), str(err.value)


def test_labels_that_do_not_match_the_val_images_or_the_classes_are_refused() -> None:
    short = parse_val_labels("n01751748\nn09193705\n", "synsets.txt")
    with pytest.raises(
        LabelError,
        match=r"^synsets.txt: 2 labels for 3 images in val.tar; no label for "
        r"ILSVRC2012_val_00000003.JPEG \(the file ends at line 2\)",
    ):
        check_labels(short, VAL, CLASSES, "val.tar")

    long = parse_val_labels("n01751748\nn09193705\nn01751748\nn01751748\n", "synsets.txt")
    with pytest.raises(
        LabelError,
        match=r"^synsets.txt line 4: labels ILSVRC2012_val_00000004, which val.tar "
        r"does not hold \(4 labels for 3 images\)",
    ):
        check_labels(long, VAL, CLASSES, "val.tar")

    unknown = parse_val_labels("n01751748\nn09193705\nn04592741\n", "synsets.txt")
    with pytest.raises(LabelError, match=r"^synsets.txt line 3: n04592741 is not one of the 2 classes"):
        check_labels(unknown, VAL, CLASSES, "val.tar")


def test_names_of_the_tree_and_its_markers() -> None:
    assert class_of_member("n01440764.tar", "train.tar") == "n01440764"
    assert class_of_member("./n01440764.tar", "train.tar") == "n01440764"
    with pytest.raises(
        LayoutError, match=re.escape("train.tar: member 'ILSVRC2012_val_00000001.JPEG' is not a per-class")
    ):
        class_of_member("ILSVRC2012_val_00000001.JPEG", "train.tar")
    assert train_path("n01440764", "n01440764_10026.JPEG", "x") == "train/n01440764/n01440764_10026.JPEG"
    # Members can only name a file inside their class directory.
    assert train_path("n01440764", "../../etc/n01440764_1.JPEG", "x") == "train/n01440764/n01440764_1.JPEG"
    with pytest.raises(LayoutError):
        val_path("n01440764", "../.hidden", "val.tar")
    assert is_marker(train_marker("n01440764")) and not is_marker("train/n01440764/x.JPEG")
    assert Marker.from_json(Marker(3, 99).to_json()) == Marker(3, 99)
    assert Marker.from_json('{"images": 3') is None


def test_counts_keep_to_what_the_trainers_scan() -> None:
    counts = count_images(
        [
            "train/n1/a.JPEG",
            "train/n1/b.jpg",
            "train/n1/.a.JPEG.dtjob-part",
            "train/n1/notes.txt",
            "train/n2/c.png",
            "val/n1/d.JPEG",
            "_prepare/train/n1.json",
            "train/n1/deeper/e.JPEG",
        ]
    )
    assert counts == {"train": {"n1": 2, "n2": 1}, "val": {"n1": 1}}


def test_the_check_passes_a_complete_tree_and_names_what_is_missing() -> None:
    complete = {"train": {"n1": 3, "n2": 3}, "val": {"n1": 1, "n2": 1}}
    report = check_tree(complete, Expected(2, 6, 2), ["n1", "n2"])
    assert report.ok, report.lines()
    assert report.lines()[-1] == "check: complete"

    missing = {"train": {"n1": 3}, "val": {"n1": 1, "n3": 1}}
    report = check_tree(missing, Expected(3, 9, 3), ["n1", "n2", "n3"])
    assert not report.ok
    assert report.problems == (
        "train/ has 1 classes, expected 3",
        "2 classes of the train tarball absent from train/: n2, n3",
        "train/ has 3 images, expected 9 (6 missing)",
        "val/ has 2 images, expected 3 (1 missing)",
        "1 classes in val/ have no train images: n3",
    )
    assert report.lines()[-1] == "check: FAILED (5 problem(s))"

    no_val = check_tree({"train": {"n1": 3, "n2": 3}, "val": {"n1": 2}}, Expected(2, 6, 2))
    assert no_val.problems == (
        "1 classes have no val images (the trainers need the same classes in train/ and val/): n2",
    )
    assert check_tree({"train": {"n1": 5}, "val": {"n1": 2}}, Expected(1, 4, 2)).problems == (
        "train/ has 5 images, expected 4 (1 more)",
    )
