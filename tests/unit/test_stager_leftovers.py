"""The stager's sweep of the temp files a killed run left, on a real directory tree."""

from __future__ import annotations

import os
import time
from pathlib import Path

from dtjob.azure.leftovers import stale_files, sweep_partial_files
from dtjob.azure.local_tree import LocalTree


def test_the_sweep_spares_another_destination_a_link_and_without_the_lock_a_live_temp_file(
    tmp_path: Path,
) -> None:
    root, outside = tmp_path / "data", tmp_path / "outside"
    for directory in (root / "sub", root / "nested", outside):
        directory.mkdir(parents=True)
    for path in (root / ".old.dtjob-part", root / "sub" / ".live.dtjob-part", root / "keep.bin"):
        path.write_bytes(b"x")
    an_hour_ago = time.time() - 3700
    os.utime(root / ".old.dtjob-part", (an_hour_ago, an_hour_ago))
    (root / "nested" / ".dtjob-stage.lock").touch()  # another destination, its own stager's to sweep
    (root / "nested" / ".theirs.dtjob-part").write_bytes(b"x")
    (outside / ".victim.dtjob-part").write_bytes(b"x")
    (root / "link").symlink_to(outside, target_is_directory=True)

    with LocalTree(root) as tree:
        assert sweep_partial_files(tree, older_than_s=3600) == 1  # no lock: only what no one still writes
        assert (root / "sub" / ".live.dtjob-part").exists()
        assert sweep_partial_files(tree) == 1  # the lock held: every temp file of this destination
        assert stale_files(tree, {"keep.bin"}) == []
    assert not (root / ".old.dtjob-part").exists() and not (root / "sub" / ".live.dtjob-part").exists()
    assert (root / "nested" / ".theirs.dtjob-part").exists()
    assert (outside / ".victim.dtjob-part").exists()
    assert (root / "keep.bin").exists()
