"""The image build inputs that can be checked without a Docker engine: files, sshd config, entrypoint."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.training.training_helpers import REPO

pytestmark = pytest.mark.training

# One Dockerfile builds both framework images; its FRAMEWORK build argument picks what it installs.
DOCKERFILES = sorted((REPO / "images").glob("horovod*/Dockerfile"))
FRAMEWORK_OF = {"horovod-pytorch": "torch", "horovod-tensorflow": "tensorflow"}


def test_both_framework_images_exist() -> None:
    assert [d.parent.name for d in DOCKERFILES] == ["horovod"]
    text = DOCKERFILES[0].read_text()
    assert re.search(r"^ARG FRAMEWORK=torch$", text, re.M)
    assert re.search(r"^ENV DTJOB_FRAMEWORKS=\$\{FRAMEWORK\} ", text, re.M), "install.sh installs FRAMEWORK"
    script = REPO / "hack" / "build-images.sh"
    refs = subprocess.run([str(script), "refs"], capture_output=True, text=True, check=True).stdout.split()
    assert [ref.split("/")[-1].split(":")[0] for ref in refs if "/horovod" in ref] == list(FRAMEWORK_OF)
    for name, framework in FRAMEWORK_OF.items():
        # The build script gives each image its framework, on the one Dockerfile.
        assert re.search(rf"^ *{name}\) echo .* FRAMEWORK={framework}\"", script.read_text(), re.M), name
    assert re.search(r"^ *horovod-\*\) echo images/horovod/Dockerfile ;;$", script.read_text(), re.M)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_dockerfile_copies_existing_files_and_runs_the_ci_install_script(dockerfile: Path) -> None:
    text = dockerfile.read_text()
    for line in re.findall(r"^COPY (?!--from)(.+)$", text, re.M):
        *sources, _dest = line.split()
        for source in sources:
            matches = list(REPO.glob(source))
            assert matches, f"{dockerfile.parent.name}: COPY source {source} does not exist"
    assert "/opt/dtjob/training/install.sh /opt/venv/bin/python" in text
    # Every file install.sh reads beside itself reaches the build stage.
    copied = {
        path
        for line in re.findall(r"^COPY (?!--from)(.+) /opt/dtjob/training/\S*$", text, re.M)
        for source in line.split()
        for path in REPO.glob(source)
    }
    # (`$here/../hack/cache-lock.sh`, the host's cache locks, is optional: an image build runs without it.)
    for name in set(re.findall(r"\$here/(?!\.\./)([\w.-]+)", (REPO / "training" / "install.sh").read_text())):
        assert any(p == REPO / "training" / name or REPO / "training" / name in p.parents for p in copied), (
            name
        )
    assert re.search(r"^ARG DTJOB_DEVICE=gpu$", text, re.M), (
        "the images are GPU images unless asked otherwise"
    )
    # The framework's wheels carry CUDA's libraries and NCCL, and PyPI has nvcc: no CUDA base image by
    # default, but what the NVIDIA container toolkit reads from one, set in the final stage.
    assert re.search(r"^ARG BUILD_IMAGE=debian:bookworm-slim$", text, re.M)
    assert re.search(r"^ARG RUNTIME_IMAGE=debian:bookworm-slim$", text, re.M)
    for name in ("NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "NVIDIA_REQUIRE_CUDA"):
        assert re.search(rf"^ENV .*\b{name}=\$\{{{name}\}}", text, re.M | re.S), name
    assert re.search(r"install-system.sh runtime \$\{DTJOB_DEVICE\}$", text, re.M), "GPU images get RDMA"
    assert re.search(r"^USER dtjob$", text, re.M), "training runs as the unprivileged user"


PRIVATE_RUN_UNAVAILABLE = 97


def _with_privsep_dir(argv: list[str]) -> list[str]:
    """As root, sshd (even -t) requires its privilege-separation chroot /run/sshd, which only exists where
    something else (a running ssh service, the images' build) made it: give it one in a private mount
    namespace on an empty tmpfs, so the check neither depends on this machine nor changes it. Without root
    sshd never chroots, so it runs as is."""
    if os.geteuid() != 0:
        return argv
    if shutil.which("unshare") is None:
        pytest.skip("running as root, sshd -t needs /run/sshd; util-linux unshare gives it a private one")
    private_run = "mount -t tmpfs tmpfs /run && mkdir -m 0755 /run/sshd"
    setup = f'{private_run} || exit {PRIVATE_RUN_UNAVAILABLE}; exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "--fork", "sh", "-c", setup, "sh", *argv]


def test_sshd_config_is_valid_and_key_only(tmp_path: Path) -> None:
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    if not Path(sshd).exists():
        pytest.skip("openssh-server is not installed (make deps)")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "host")], check=True)
    config = (REPO / "images/common/sshd_config").read_text()
    assert re.search(r"^PasswordAuthentication no$", config, re.M)
    assert re.search(r"^PermitRootLogin no$", config, re.M)
    (tmp_path / "sshd_config").write_text(
        re.sub(r"^HostKey .*$", f"HostKey {tmp_path}/host", config, flags=re.M)
    )
    # -t only parses and checks the configuration; it starts no server.
    check = subprocess.run(
        _with_privsep_dir([sshd, "-t", "-f", str(tmp_path / "sshd_config")]), capture_output=True, text=True
    )
    if check.returncode == PRIVATE_RUN_UNAVAILABLE or check.stderr.startswith("unshare:"):
        pytest.skip(f"cannot give sshd -t a private /run/sshd (mount namespace): {check.stderr.strip()}")
    assert check.returncode == 0, check.stderr


@pytest.mark.parametrize(
    ("role", "needs"), [("worker", "authorized_keys"), ("true", "id_ed25519")], ids=["worker", "launcher"]
)
def test_entrypoint_without_the_ssh_secret_says_what_is_missing(
    tmp_path: Path, role: str, needs: str
) -> None:
    """Each role needs only its half of the key pair: workers authorized_keys, the launcher the key."""
    run = subprocess.run(
        [str(REPO / "images/common/entrypoint.sh"), role],
        env={"DTJOB_SSH_DIR": str(tmp_path), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2
    assert f"{tmp_path}/{needs} is missing (is the SSH Secret mounted?)" in run.stderr
    (tmp_path / needs).write_text("key\n")
    if role == "true":  # the launcher sets up its ssh client and runs the command
        done = subprocess.run(
            [str(REPO / "images/common/entrypoint.sh"), role],
            env={"DTJOB_SSH_DIR": str(tmp_path), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr
        assert f"IdentityFile {tmp_path}/.ssh/id_ed25519" in (tmp_path / ".ssh" / "config").read_text()


def test_results_uploader_installs_into_a_bare_environment(tmp_path: Path) -> None:
    """What the training images run to carry `python -m dtjob.stager upload` (rank 0's results upload)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    script = REPO / "images" / "common" / "install-uploader.sh"
    # From the wheels `make venv` downloaded: the tests run where no registry is reachable.
    wheels = os.environ.get("UPLOADER_WHEELS", "")
    assert wheels and Path(wheels, ".ready").exists(), "run it through `make test` (it sets UPLOADER_WHEELS)"
    offline = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": wheels}
    done = subprocess.run(
        [str(script), str(python), str(REPO)], capture_output=True, text=True, timeout=300, env=offline
    )
    assert done.returncode == 0, done.stderr
    # The upload runs from the installed package alone: no working tree on the path.
    probe = subprocess.run(
        [str(python), "-c", "import azure.storage.blob, dtjob.stager.__main__ as m; print(m.__file__)"],
        capture_output=True, text=True, cwd=tmp_path, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    assert str(venv) in probe.stdout
    for dockerfile in DOCKERFILES:
        assert "install-uploader.sh /opt/venv/bin/python /opt/dtjob/src" in dockerfile.read_text()


def test_gpu_runtime_carries_the_infiniband_userspace() -> None:
    """NCCL reaches InfiniBand on ND-series VMs through libibverbs and its providers (mlx5)."""
    script = (REPO / "images" / "common" / "install-system.sh").read_text()
    packages = {
        condition: set(added.split())
        for condition, added in re.findall(r"^\[\[ (.+) \]\] && pkgs\+=\((.+)\)$", script, re.M)
    }
    assert {"libibverbs1", "ibverbs-providers"} <= packages["$stage == runtime && $device == gpu"]
    assert "patchelf" in packages["$stage == build"], "the GPU build relocates Horovod's libraries"


FAKE_CTR = r'''#!/usr/bin/env python3
"""A containerd's image names as `ctr images` shows and changes them; every call is logged."""
import json, sys
from pathlib import Path

state = Path(__file__).with_name("images.json")
names = json.loads(state.read_text())
args = [a for a in sys.argv[1:] if a != "--sync"]
args = args[args.index("images") + 1:]
with state.with_name("calls.log").open("a") as log:
    log.write(" ".join(args) + "\n")
if args[0] == "ls":
    print("REF TYPE DIGEST SIZE PLATFORMS LABELS")
    for name, digest in names.items():
        if len(args) == 1 or args[1] == f"name=={name}":
            print(f"{name} application/vnd.oci.image.manifest.v1+json {digest} 1.0MiB linux/amd64 -")
elif args[0] == "rm":
    for name in args[1:]:
        names.pop(name)
elif args[0] == "import":
    sys.stdin.buffer.read()
    new = state.with_name("new-digest").read_text().strip()
    names["localhost/dtjob/operator:dev"] = new
state.write_text(json.dumps(names))
'''


def test_import_drops_every_name_of_an_old_build(tmp_path: Path) -> None:
    """The kubelet's runtime names each image it has seen by its ID too (sha256:...). Unless those names go
    with the tag, every rebuild leaves the old layers on each node: a test node's store grew to 21 GB."""

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ctr = bin_dir / "ctr"
    ctr.write_text(FAKE_CTR)
    ctr.chmod(0o755)
    (bin_dir / "images.json").write_text(
        json.dumps({
            "localhost/dtjob/operator:dev": "sha256:old",
            "sha256:id-of-old": "sha256:old",  # the runtime's name of the build being replaced
            "localhost/dtjob/stager:dev": "sha256:stager",
            "sha256:id-of-stager": "sha256:stager",  # still tagged: kept
            "sha256:id-of-older": "sha256:gone",  # an earlier build no tag points at
        })
    )  # fmt: skip
    (bin_dir / "new-digest").write_text("sha256:new")
    cache = tmp_path / "cache"
    layout = cache / "buildah" / "images" / "localhost_dtjob_operator_dev.oci"
    layout.mkdir(parents=True)
    (layout / "index.json").write_text("{}")
    layout.with_name(layout.name + ".digest").write_text("sha256:new")
    sock_path = tmp_path / "containerd.sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    try:
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "DTJOB_CACHE": str(cache)}
        done = subprocess.run(
            [str(REPO / "hack" / "build-images.sh"), "import", "--address", str(sock_path), "operator"],
            capture_output=True, text=True, env=env, timeout=60,
        )  # fmt: skip
    finally:
        sock.close()
    assert done.returncode == 0, done.stderr
    names = json.loads((bin_dir / "images.json").read_text())
    assert names == {
        "localhost/dtjob/operator:dev": "sha256:new",
        "localhost/dtjob/stager:dev": "sha256:stager",
        "sha256:id-of-stager": "sha256:stager",
    }
    removals = [
        line.split()[1:] for line in (bin_dir / "calls.log").read_text().splitlines() if line[:2] == "rm"
    ]
    assert removals == [["sha256:id-of-older"], ["localhost/dtjob/operator:dev", "sha256:id-of-old"]]
