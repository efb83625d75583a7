"""A miniature ILSVRC2012 for the tests of `dtjob data prepare-imagenet`: real small JPEGs packed exactly as
the real tarballs are (a train tar of per-class tars `<wnid>.tar`, a flat val tar of
`ILSVRC2012_val_<8 digits>.JPEG`), with the val labels written in each of the forms the command reads."""

from __future__ import annotations

import io
import random
import tarfile
from dataclasses import dataclass
from pathlib import Path

CLASSES = ("n01440764", "n01443537", "n01484850", "n01491361")


@dataclass(frozen=True)
class MiniImagenet:
    train_tar: Path
    val_tar: Path
    labels: dict[str, Path]  # label form (wnid-per-line, kaggle-csv, filename-wnid) -> file
    expected: dict[str, bytes]  # the prepared tree: relative path -> content
    classes: tuple[str, ...]

    @property
    def train_images(self) -> int:
        return sum(rel.startswith("train/") for rel in self.expected)

    @property
    def val_images(self) -> int:
        return sum(rel.startswith("val/") for rel in self.expected)

    def expect_args(self) -> list[str]:
        return [
            "--expect-classes",
            str(len(self.classes)),
            "--expect-train",
            str(self.train_images),
            "--expect-val",
            str(self.val_images),
        ]


def jpeg(rng: random.Random, channel: int, size: int = 32) -> bytes:
    """A small real JPEG of noise with one colour channel raised (so classes differ at a glance)."""
    from PIL import Image

    pixels = bytearray(rng.randrange(0, 90) for _ in range(size * size * 3))
    for p in range(channel, len(pixels), 3):
        pixels[p] = rng.randrange(170, 256)
    out = io.BytesIO()
    Image.frombytes("RGB", (size, size), bytes(pixels)).save(out, format="JPEG", quality=90)
    return out.getvalue()


def images_of_tree(tree: Path) -> dict[str, dict[str, list[tuple[str, bytes]]]]:
    """split -> class -> [(file name, bytes)] of an ImageNet-layout tree (train/<wnid>/, val/<wnid>/)."""
    found: dict[str, dict[str, list[tuple[str, bytes]]]] = {"train": {}, "val": {}}
    for split in found:
        for class_dir in sorted((tree / split).iterdir()):
            found[split][class_dir.name] = [(p.name, p.read_bytes()) for p in sorted(class_dir.iterdir())]
    return found


def generated_images(
    classes: tuple[str, ...] = CLASSES, train: int = 5, val: int = 2, seed: int = 0
) -> dict[str, dict[str, list[tuple[str, bytes]]]]:
    rng = random.Random(seed)
    return {
        "train": {
            wnid: [(f"{wnid}_{1000 + i}.JPEG", jpeg(rng, n % 3)) for i in range(train)]
            for n, wnid in enumerate(classes)
        },
        "val": {wnid: [("", jpeg(rng, n % 3)) for _ in range(val)] for n, wnid in enumerate(classes)},
    }


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 1_340_000_000
    tar.addfile(info, io.BytesIO(data))


def make_tarballs(root: Path, images: dict[str, dict[str, list[tuple[str, bytes]]]]) -> MiniImagenet:
    """Pack `images` as ILSVRC2012's tarballs under `root`. The val images are interleaved across classes
    and numbered from 1 in tar order, as the real ones are (their names say nothing of their class)."""
    root.mkdir(parents=True, exist_ok=True)
    expected: dict[str, bytes] = {}
    train_tar = root / "ILSVRC2012_img_train.tar"
    with tarfile.open(train_tar, "w") as outer:
        for wnid, files in images["train"].items():
            inner = io.BytesIO()
            with tarfile.open(fileobj=inner, mode="w") as class_tar:
                for name, data in files:
                    _add(class_tar, name, data)
                    expected[f"train/{wnid}/{name}"] = data
            _add(outer, f"{wnid}.tar", inner.getvalue())

    queues = {wnid: list(files) for wnid, files in images["val"].items()}
    order: list[tuple[str, bytes]] = []
    while any(queues.values()):
        for wnid, queue in queues.items():
            if queue:
                order.append((wnid, queue.pop(0)[1]))
    val_tar = root / "ILSVRC2012_img_val.tar"
    wnids: list[str] = []
    with tarfile.open(val_tar, "w") as tar:
        for number, (wnid, data) in enumerate(order, start=1):
            name = f"ILSVRC2012_val_{number:08d}.JPEG"
            _add(tar, name, data)
            expected[f"val/{wnid}/{name}"] = data
            wnids.append(wnid)

    labels = {
        "wnid-per-line": root / "imagenet_2012_validation_synset_labels.txt",
        "kaggle-csv": root / "LOC_val_solution.csv",
        "filename-wnid": root / "val_labels.txt",
    }
    numbered = list(enumerate(wnids, start=1))
    labels["wnid-per-line"].write_text("".join(f"{w}\n" for w in wnids))
    # Kaggle's rows are not in image order, and carry boxes after the wnid.
    labels["kaggle-csv"].write_text(
        "ImageId,PredictionString\n"
        + "".join(f"ILSVRC2012_val_{n:08d},{w} 10 12 40 44 {w} 1 2 3 4 \n" for n, w in reversed(numbered))
    )
    labels["filename-wnid"].write_text("".join(f"ILSVRC2012_val_{n:08d}.JPEG {w}\n" for n, w in numbered))
    return MiniImagenet(train_tar, val_tar, labels, expected, tuple(images["train"]))


def tree_files(root: Path) -> dict[str, bytes]:
    """Every file under `root` (hidden ones too) by relative path."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
