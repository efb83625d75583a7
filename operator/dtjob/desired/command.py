"""Command lines: the training entry point with its flags, the MPI launcher around it, worker sshd, and the
stager (`python -m dtjob.stager`) downloading the dataset or uploading rank 0's results."""

from __future__ import annotations

import shlex

from dtjob import names
from dtjob.contract.results_upload import UPLOAD_FAILED_EXIT
from dtjob.contract.training import DEFAULT_COMPILE, DEFAULT_DATA_LOADER, EXPECT_GPU_ENV, RANK_PID_DIR
from dtjob.desired.common import (
    DISCOVER_HOSTS,
    HOSTFILE,
    OUTPUT_DIR,
    PROGRESS_FILE,
    SSH_DIR,
    SSH_KEY_FILE,
    SSH_PORT,
    Json,
    sas_mount_path,
)
from dtjob.names import SECRET_TOKEN_KEY, SECRET_URL_KEY, Access, run_prefix
from dtjob.spec.parse import JobSpec

SSH_KEY_PATH = f"{SSH_DIR}/{SSH_KEY_FILE}"


# sshd in the foreground, trusting only this job's key. Everything it writes (a host key minted per pod, its
# pid file) goes to /tmp/ssh, where the dtjob images' sshd_config looks for its host key, so it runs as root
# or as an unprivileged user alike; -o options override the image's sshd_config, whose other settings (e.g.
# SetEnv PATH for the ranks) still apply. Only a root sshd
# needs /run/sshd (its privilege-separation chroot; the images create it); the pods run it as the training
# user, which could not create it and never uses it.
def worker_sshd_script(ssh_dir: str = SSH_DIR, state_dir: str = "/tmp/ssh", port: int = SSH_PORT) -> str:
    keys = shlex.quote(state_dir)
    return f"""set -e
if [ "$(id -u)" = 0 ]; then mkdir -p /run/sshd; fi
mkdir -p {keys}
[ -f {keys}/ssh_host_ed25519_key ] || ssh-keygen -q -t ed25519 -N "" -f {keys}/ssh_host_ed25519_key
exec /usr/sbin/sshd -D -e -p {port} -h {keys}/ssh_host_ed25519_key -o PidFile={keys}/sshd.pid \\
  -o AuthorizedKeysFile={shlex.quote(ssh_dir)}/authorized_keys -o StrictModes=no \\
  -o PasswordAuthentication=no -o PermitRootLogin=no -o UsePAM=no
"""


# An elastic world's worker: sshd as a child, and the pod's SIGTERM (a deletion with a grace period, a spot
# eviction) handed to the ranks of this pod, which commit with the others and leave; the entrypoint waits for
# them (the kubelet's SIGKILL ends the wait at the grace period), then stops sshd.
def elastic_worker_script(pid_dir: str = RANK_PID_DIR) -> str:
    sshd = worker_sshd_script().replace("exec /usr/sbin/sshd", "/usr/sbin/sshd", 1).rstrip("\n") + " &\n"
    pids = shlex.quote(pid_dir)
    return f"""{sshd}sshd=$!
set +e
leave() {{
  for f in {pids}/*.pid; do [ -f "$f" ] && kill -TERM "$(cat "$f")" 2>/dev/null; done
  while ls {pids}/*.pid >/dev/null 2>&1; do
    alive=
    for f in {pids}/*.pid; do kill -0 "$(cat "$f" 2>/dev/null)" 2>/dev/null && alive=1; done
    [ -z "$alive" ] && break
    sleep 0.2
  done
  kill -TERM "$sshd" 2>/dev/null
}}
trap leave TERM
wait "$sshd"
wait "$sshd"
"""


# The launcher's ssh client trusts the workers it reaches by name; their host keys are minted per pod.
SSH_CLIENT_SETUP = f"""mkdir -p "$HOME/.ssh"
cat > "$HOME/.ssh/config" <<'CONFIG'
Host *
  IdentityFile {SSH_KEY_PATH}
  Port {SSH_PORT}
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
CONFIG
"""

# A worker can be Ready before the cluster DNS serves its name: the operator publishes it before it creates
# the launcher, but the DNS server catches up in its own time, and mpirun gives up at the first host it cannot
# resolve. So the launcher waits (bounded) until every host of the hostfile resolves, and fails naming the one
# that never did. Images without getent skip the wait.
DNS_WAIT_SECONDS = 120


def wait_for_host_names(hostfile: str, seconds: int) -> str:
    """Shell that waits until every host of `hostfile` resolves, failing after `seconds`."""
    return wait_for_hosts(f"$(sed -e 's/[: ].*//' {hostfile})", "MPI host", seconds)


def wait_for_hosts(hosts: str, what: str, seconds: int) -> str:
    """Shell that waits until every host `hosts` (shell words) names resolves, failing after `seconds`, the
    message naming the host as `what`."""
    return f"""if command -v getent >/dev/null 2>&1; then
  for host in {hosts}; do
    waited=0
    until getent hosts "$host" >/dev/null; do
      if [ "$waited" -ge {seconds} ]; then
        echo "dtjob: {what} $host does not resolve after {seconds} s" >&2
        exit 1
      fi
      sleep 1
      waited=$((waited + 1))
    done
  done
fi
"""


WAIT_FOR_HOST_NAMES = wait_for_host_names(HOSTFILE, DNS_WAIT_SECONDS)


def rank_env(spec: JobSpec) -> list[Json]:
    """The environment of the pods that run or launch ranks: DTJOB_EXPECT_GPU=1 when the job asks for GPUs,
    unless the job's own env sets it (e.g. DTJOB_EXPECT_GPU=0 on a CPU-only test bed), then the job's env."""
    own = [dict(e) for e in spec.env]
    if spec.gpus_per_worker > 0 and all(e.get("name") != EXPECT_GPU_ENV for e in own):
        return [{"name": EXPECT_GPU_ENV, "value": "1"}, *own]
    return own


def training_command(spec: JobSpec) -> list[str]:
    """What each rank runs: `python -m dtjob_train.<framework>` (`dtjob_train.ddp` for pytorch under
    torchrun) and the flags built from the spec; or the user's command and args as given (the flags too only
    with appendTrainingFlags)."""
    if spec.command:
        flags = training_flags(spec) if spec.append_training_flags else []
        return [*spec.command, *(spec.args or ()), *flags]
    # Under torchrun the PyTorch trainer is its DDP variant (torch.distributed, no Horovod).
    module = "ddp" if spec.torchrun is not None and spec.framework == "pytorch" else spec.framework
    program = ["python", "-m", f"dtjob_train.{module}"]
    return program + (list(spec.args) if spec.args is not None else training_flags(spec))


def training_flags(spec: JobSpec) -> list[str]:
    hp = spec.hyperparameters
    flags = [
        "--data", spec.dataset.source,
        "--batch-size", str(hp.batch_size_per_gpu),
        "--epochs", str(hp.epochs),
        "--base-lr", _num(hp.learning_rate),
        "--warmup-epochs", _num(hp.warmup_epochs),
        "--momentum", _num(hp.momentum),
        "--weight-decay", _num(hp.weight_decay),
        "--label-smoothing", _num(hp.label_smoothing),
        "--image-size", str(hp.image_size),
        "--log-interval", str(hp.log_interval),
        "--seed", str(hp.seed),
        "--output-dir", OUTPUT_DIR,
        "--checkpoint-dir", checkpoint_dir(spec),
        "--progress-file", PROGRESS_FILE,
    ]  # fmt: skip
    if spec.dataset.source == "imagenet":
        flags += ["--data-dir", spec.dataset.data_dir]
    if hp.steps_per_epoch is not None:
        flags += ["--steps-per-epoch", str(hp.steps_per_epoch)]
    # Both states spelled out, so the job runs as its spec says whatever the trainers' defaults.
    switches = {"amp": hp.amp, "fp16-allreduce": hp.fp16_allreduce, "channels-last": hp.channels_last}
    flags += [f"--{name}" if on else f"--no-{name}" for name, on in switches.items()]
    if hp.amp:
        flags += ["--amp-dtype", hp.amp_dtype]
    # Each trainer refuses the other frameworks' options: passed only where set (dtjob.spec.run checks them).
    if hp.xla:
        flags.append("--xla")
    if hp.data_loader != DEFAULT_DATA_LOADER:
        flags += ["--data-loader", hp.data_loader]
    if hp.compile != DEFAULT_COMPILE:
        flags += ["--compile", hp.compile]
    if spec.elastic is not None:
        flags.append("--elastic")
        if spec.elastic.commit_every_steps is not None:
            flags += ["--commit-every", str(spec.elastic.commit_every_steps)]
    return flags


def checkpoint_dir(spec: JobSpec) -> str:
    """On spec.checkpoints when set (a restart resumes), else inside rank 0's pod."""
    if spec.checkpoints is None:
        return f"{OUTPUT_DIR}/checkpoints"
    return f"{spec.checkpoints.mount_path.rstrip('/')}/{spec.namespace}/{spec.name}"


def _num(value: float) -> str:
    return repr(float(value))


# Open MPI settings of the launcher (horovodrun runs mpirun too). Open MPI shortens host names to their first
# label by default, and a pod's short hostname does not resolve in another pod: keep the hostfile's names,
# which the headless Service publishes. Only the launcher has the SSH client set up, so it starts every
# host's daemon itself instead of having daemons start each other (tree spawn).
LAUNCHER_MPI_ENV = (
    ("OMPI_MCA_orte_keep_fqdn_hostnames", "true"),
    ("OMPI_MCA_plm_rsh_no_tree_spawn", "true"),
)
# horovodrun gives every host's task service 30 s by default to start over ssh and answer; a pod on a busy or
# freshly started node can take longer to start Python there, and the launcher then fails with "Timed out
# waiting for tasks to start". A default only: the job's own spec.env (HOROVOD_START_TIMEOUT) overrides it.
LAUNCHER_DEFAULT_ENV = (("HOROVOD_START_TIMEOUT", "120"),)


# The Hydra launchers (MPICH's mpiexec.hydra, Intel MPI's mpirun) reach the hosts over ssh and pass the whole
# environment by default. Their proxies call back to the launcher's control port: -iface makes the launcher
# announce its pod address there, since other pods cannot resolve a launcher pod's hostname.
HYDRA_LAUNCHERS = {"MPICH": "mpiexec.hydra", "IntelMPI": "mpirun"}
POD_INTERFACE = "eth0"


# Horovod gives up waiting for spec.elastic.minWorkers later than the operator restarts such a world, so the
# restart is the operator's (counted, with the reason in status) rather than a launcher failure.
ELASTIC_TIMEOUT_MARGIN_SECONDS = 60
# Horovod blacklists the host of a rank that failed, and hosts are pod addresses here: a network plugin that
# hands a deleted pod's address to a later pod would otherwise never see that pod used. A host is given
# another try after this many seconds (Horovod picks one in the range).
BLACKLIST_COOLDOWN_SECONDS = ("30", "120")
# Every resize re-forms the Gloo world: the ranks that stay wait, within Gloo's timeout (30 s by default), for
# a joining rank to start Python, import its framework and reach the rendezvous and the first state sync. A
# replacement on a busy or freshly started node takes longer than 30 s there, and the ranks that waited exit,
# failing the launcher. The cost: a rank lost without a word (its node gone) is noticed that much later by the
# ranks not talking to it directly.
ELASTIC_GLOO_TIMEOUT_SECONDS = 120


def elastic_command(spec: JobSpec) -> list[str]:
    """horovodrun for Horovod Elastic: -np ranks aimed for, --min-np/--max-np from spec.elastic, the hosts
    from the discovery script (the workers that are Ready) instead of the hostfile."""
    assert spec.elastic is not None
    slots = spec.slots_per_worker
    return [
        "horovodrun", "-np", str(spec.workers * slots),
        "--min-np", str(spec.elastic.min_workers * slots),
        "--max-np", str(spec.elastic.max_workers * slots),
        "--host-discovery-script", DISCOVER_HOSTS,
        "--elastic-timeout", str(spec.elastic.timeout_seconds + ELASTIC_TIMEOUT_MARGIN_SECONDS),
        "--blacklist-cooldown-range", *BLACKLIST_COOLDOWN_SECONDS,
        "--gloo-timeout-seconds", str(ELASTIC_GLOO_TIMEOUT_SECONDS),
        "--ssh-port", str(SSH_PORT), "--ssh-identity-file", SSH_KEY_PATH,
        *training_command(spec),
    ]  # fmt: skip


def mpi_command(spec: JobSpec) -> list[str]:
    """horovodrun or mpirun with -np = every slot of every MPI host, hosts from the mounted hostfile."""
    if spec.elastic is not None:
        return elastic_command(spec)
    np = str(spec.total_slots)
    hydra = HYDRA_LAUNCHERS.get(spec.launcher.mpi_implementation)
    if spec.launcher.runner == "mpirun" and hydra is not None:
        cmd = [hydra, "-n", np, "-f", HOSTFILE, "-bootstrap", "ssh", "-iface", POD_INTERFACE]
        return cmd + list(spec.launcher.mpi_args) + training_command(spec)
    if spec.launcher.runner == "horovodrun":
        cmd = ["horovodrun", "-np", np, "--hostfile", HOSTFILE, "--ssh-port", str(SSH_PORT),
               "--ssh-identity-file", SSH_KEY_PATH]  # fmt: skip
        if spec.launcher.mpi_args:
            cmd.append("--mpi-args=" + shlex.join(spec.launcher.mpi_args))
        return cmd + training_command(spec)
    cmd = [
        "mpirun", "--allow-run-as-root", "-np", np, "--hostfile", HOSTFILE,
        "-bind-to", "none", "-map-by", "slot",
        "-mca", "pml", "ob1", "-mca", "btl", "^openib",
        "-x", "NCCL_DEBUG", "-x", "LD_LIBRARY_PATH", "-x", "PATH",
    ]  # fmt: skip
    # The ranks get the launcher's values of these (their ssh-started daemons do not see the pods' env).
    for name in dict.fromkeys(str(env["name"]) for env in rank_env(spec)):
        cmd += ["-x", name]
    return cmd + list(spec.launcher.mpi_args) + training_command(spec)


def _credential_args(access: Access, job: str) -> list[str]:
    """The stager reads the container URL and the token from the mounted SAS Secret's files, never argv."""
    return [
        "--container-url-file",
        f"{sas_mount_path(access)}/{SECRET_URL_KEY}",
        "--sas-file",
        f"{sas_mount_path(access)}/{SECRET_TOKEN_KEY}",
        "--credentials-hint",
        f"Secret {names.sas_secret_name(job, access)}",
    ]


def stager_download_args(job: str, prefix: str, destination: str, concurrency: int) -> list[str]:
    """Arguments for `python -m dtjob.stager` (the stager image's entrypoint) in the staging Job."""
    return [
        "download",
        *_credential_args(Access.INPUT, job),
        "--prefix",
        prefix,
        "--dest",
        destination,
        "--concurrency",
        str(concurrency),
        "--progress-interval",
        "10",
    ]


def results_upload_command(
    job: str,
    source_dir: str,
    run_prefix: str,
    retry_seconds: int = 0,
    python: str = "python",
    credentials: list[str] | None = None,
) -> list[str]:
    """What rank 0 runs after training to upload the output directory to the run's prefix
    (dtjob.names.run_prefix); it needs `<job>-sas-out` mounted (desired.pods.sas_volume/sas_volume_mount),
    unless `credentials` names other files (`_credential_files`)."""
    return [
        python,
        "-m",
        "dtjob.stager",
        "upload",
        *(credentials if credentials is not None else _credential_args(Access.OUTPUT, job)),
        "--src",
        source_dir,
        "--prefix",
        run_prefix,
        # The output SAS is create+write only: nothing to list, so every file is uploaded.
        "--overwrite",
        "--termination-file",
        "/dev/null",
        "--retry-for",
        str(retry_seconds),
    ]


def _credential_files(url_file: str, token_file: str, hint: str) -> list[str]:
    return ["--container-url-file", url_file, "--sas-file", token_file, "--credentials-hint", hint]


def results_upload_later_script(job: str, run_prefix: str, retry_seconds: int) -> str:
    """What `dtjob results upload` runs on the pod that kept a job's results: the same upload as after
    training, with the container URL and the SAS the caller brings read from stdin (two lines) into a private
    directory that is removed at exit, so the token is never in argv, the pod spec or a Secret."""
    credentials = _credential_files('"$dir/url"', '"$dir/token"', "the SAS of dtjob results upload")
    upload = " ".join(
        arg if arg.startswith('"$dir/') else shlex.quote(arg)
        for arg in results_upload_command(job, OUTPUT_DIR, run_prefix, retry_seconds, credentials=credentials)
    )
    return (
        "umask 077\n"
        "dir=$(mktemp -d) || exit 1\n"
        "trap 'rm -rf \"$dir\"' EXIT\n"
        "IFS= read -r url && IFS= read -r token || { echo 'no URL and SAS on stdin' >&2; exit 2; }\n"
        'printf \'%s\' "$url" > "$dir/url" && printf \'%s\' "$token" > "$dir/token" || exit 1\n'
        f"{upload}\n"
    )


def results_upload_script(spec: JobSpec, uid: str) -> str | None:
    """With spec.output: upload rank 0's output directory to `<prefix>/<namespace>/<job>/<uid>/`, on the
    pod that ran rank 0 (worker 0 over ssh, the launcher itself when it runs ranks, or for an elastic job
    the worker that holds the results)."""
    if spec.output is None:
        return None
    prefix = run_prefix(spec.output.target.prefix, spec.namespace, spec.name, uid)
    retry = spec.output.upload_retry_seconds
    upload = shlex.join(results_upload_command(spec.name, OUTPUT_DIR, prefix, retry))
    if spec.launcher.run_as_worker:
        return upload
    if spec.elastic is not None:
        return find_elastic_rank0() + f'ssh "$rank0" {shlex.quote(upload)}'
    rank0 = names.host_fqdn(names.worker_name(spec.name, 0), spec.name, spec.namespace)
    return f"ssh {shlex.quote(rank0)} {shlex.quote(upload)}"


def find_elastic_rank0() -> str:
    """Shell setting $rank0 to the worker holding the results. An elastic world's rank 0 moves when its host
    is lost: the final rank 0 is the worker whose output directory holds metrics.json (the dtjob trainers
    write it last), else, for a program of the user's, the first whose output directory is not empty.
    Fails with the upload's own failure code when no Ready worker holds any."""
    has_metrics = shlex.quote(f"test -e {OUTPUT_DIR}/metrics.json")
    not_empty = shlex.quote(f'test -n "$(ls -A {OUTPUT_DIR})"')
    nobody = f"dtjob: no Ready worker holds the results in {OUTPUT_DIR}"
    return f"""rank0=
for test in {has_metrics} {not_empty}; do
  for host in $(sh {DISCOVER_HOSTS} | cut -d: -f1); do
    if ssh "$host" "$test" 2>/dev/null; then rank0=$host; break 2; fi
  done
done
if [ -z "$rank0" ]; then echo {shlex.quote(nobody)} >&2; exit {UPLOAD_FAILED_EXIT}; fi
"""


def launcher_script(spec: JobSpec, uid: str = "") -> str:
    training = shlex.join(mpi_command(spec))
    upload = results_upload_script(spec, uid)
    # An elastic world trains on the hosts that are Ready (Horovod waits for --min-np of them by itself).
    setup = SSH_CLIENT_SETUP + ("" if spec.elastic is not None else WAIT_FOR_HOST_NAMES)
    if upload is None:
        return setup + "exec " + training + "\n"
    # Not exec'd: after training, the results upload (which retries by itself while storage refuses). A
    # training failure exits with training's own code; an upload that failed for good with the code the
    # operator reads as "trained, results not uploaded" (an infrastructure failure, never a restart).
    return f"{setup}{training} || exit $?\n{upload} || exit {UPLOAD_FAILED_EXIT}\n"
