"""Parsing how the job runs: its pods' overrides and placement, the launcher, the run policy and the
training hyperparameters. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from dtjob import names
from dtjob.config import OperatorConfig
from dtjob.contract import training
from dtjob.spec import validators as rules
from dtjob.spec.model import (
    CUSTOM,
    DEFAULT_GANG_TIMEOUT_SECONDS,
    TOPOLOGY_MODES,
    TOPOLOGY_REQUIRED,
    Gang,
    Hyperparameters,
    Json,
    Launcher,
    Placement,
    PodOverrides,
    RunPolicy,
    Scheduling,
    Topology,
)
from dtjob.spec.reader import Reader, SpecError
from dtjob.spec.template import parse_template

CLEAN_POD_POLICIES = ("None", "Running", "All")
RESTART_POLICIES = ("OnFailure", "ExitCode")
RUNNERS = ("horovodrun", "mpirun")
MPI_IMPLEMENTATIONS = ("OpenMPI", "MPICH", "IntelMPI")
GANG_SCHEDULERS = ("coscheduling", "volcano")
# The PodGroup's scheduleTimeoutSeconds is an int32.
MAX_GANG_TIMEOUT_SECONDS = 2**31 - 1
# Deadlines and TTLs: 68 years, the batch Job's own int32 bound, so date arithmetic never overflows.
MAX_DURATION_SECONDS = 2**31 - 1
# The shortest runPolicy.progressDeadlineSeconds: a world's restart costs a checkpoint reload and its pods'
# start, so a deadline shorter than a slow step (or a first compiled one) would only restart it in a loop.
MIN_PROGRESS_DEADLINE_SECONDS = 30
# The label AKS puts on every node with the name of its node pool.
AGENTPOOL_LABEL = "kubernetes.azure.com/agentpool"


def parse_pod_overrides(r: Reader, main: str) -> PodOverrides:
    """podAnnotations, podLabels, resources and template of a pod whose own container is named `main`."""
    return PodOverrides(
        annotations=r.labels("podAnnotations", values_are_labels=False),
        labels=r.labels("podLabels"),
        resources=_resources(r),
        template=parse_template(r, main),
    )


def _resources(r: Reader) -> Json | None:
    """Container resources: qualified resource names, each a quantity (an integer or a quantity string)."""
    resources = r.optional_object("resources")
    if resources is None:
        return None
    for kind in ("limits", "requests"):
        values = resources.get(kind) or {}
        path = f"{r.at('resources')}.{kind}"
        if not isinstance(values, Mapping):
            raise SpecError(path, "must be an object")
        if len(values) > rules.MAX_MAP_ENTRIES:
            raise SpecError(path, f"must have at most {rules.MAX_MAP_ENTRIES} entries")
        for name, quantity in values.items():
            problem = rules.label_key_problem(str(name))
            if problem is not None:
                raise SpecError(f"{path}[{name}]", problem)
            if isinstance(quantity, bool) or not isinstance(quantity, int | str):
                raise SpecError(f"{path}[{name}]", f"must be a quantity, got {quantity!r}")
            if isinstance(quantity, str) and not rules.matches(rules.QUANTITY, quantity):
                raise SpecError(
                    f"{path}[{name}]", f"{quantity!r} is not a quantity (e.g. 2, 500m, 16Gi, 1.5e3)"
                )
    return resources


def parse_hyperparameters(r: Reader, framework: str) -> Hyperparameters:
    d = Hyperparameters()
    amp = r.boolean("amp", d.amp)
    data_loader = r.choice("dataLoader", training.DATA_LOADERS, d.data_loader)
    xla = r.boolean("xla", d.xla)
    compile_mode = r.choice("compile", training.COMPILE_MODES, d.compile)
    # Options of one framework's trainer, which the others refuse (a custom command gets them as given).
    if framework != CUSTOM and not training.takes_data_loader(framework, data_loader):
        raise SpecError(
            r.at("dataLoader"),
            f"{data_loader} applies to framework {' and '.join(training.DALI_FRAMEWORKS)} (not {framework})",
        )
    if framework != CUSTOM and not training.takes_compile(framework, compile_mode):
        raise SpecError(
            r.at("compile"),
            f"{compile_mode} applies to framework {' and '.join(training.COMPILE_FRAMEWORKS)} "
            f"(not {framework}, which compiles with xla)",
        )
    if xla and framework != CUSTOM and not training.takes_xla(framework):
        raise SpecError(
            r.at("xla"), f"applies to frameworks {' and '.join(training.XLA_FRAMEWORKS)} (not {framework})"
        )
    return Hyperparameters(
        given_batch_size_per_gpu=r.integer("batchSizePerGpu", None, minimum=1),
        epochs=r.integer("epochs", d.epochs, minimum=1) or d.epochs,
        steps_per_epoch=r.integer("stepsPerEpoch", None, minimum=1),
        learning_rate=r.number("learningRate", d.learning_rate),
        warmup_epochs=r.number("warmupEpochs", d.warmup_epochs),
        momentum=r.number("momentum", d.momentum),
        weight_decay=r.number("weightDecay", d.weight_decay),
        label_smoothing=r.number("labelSmoothing", d.label_smoothing, below=training.LABEL_SMOOTHING_BELOW),
        amp=amp,
        amp_dtype=r.choice("ampDtype", training.AMP_DTYPES, d.amp_dtype),
        fp16_allreduce=r.boolean("fp16Allreduce", d.fp16_allreduce),
        channels_last=r.boolean("channelsLast", d.channels_last),
        xla=xla,
        data_loader=data_loader,
        compile=compile_mode,
        image_size=r.integer("imageSize", d.image_size, minimum=8) or d.image_size,
        log_interval=r.integer("logInterval", d.log_interval, minimum=1) or d.log_interval,
        seed=r.integer("seed", d.seed, minimum=0, maximum=training.MAX_SEED) or 0,
    )


def parse_placement(r: Reader, config: OperatorConfig, gpus: bool = True) -> Placement:
    """Workers go to the GPU pool (tolerating its taint), or for a CPU job (`gpus` False) to the CPU pool (by
    default any node without a taint they lack: the GPU pool's keeps them off it)."""
    pool = r.checked("nodePool", _node_pool_problem) or (config.gpu_pool if gpus else config.cpu_pool)
    selector = _pool_selector(pool)
    selector.update(r.labels("nodeSelector"))
    gpu_toleration: Json = {
        "key": config.gpu_taint_key,
        "operator": "Equal",
        "value": config.gpu_taint_value,
        "effect": "NoSchedule",
    }
    own = r.tolerations("tolerations")
    tolerations = (gpu_toleration, *(t for t in own if t != gpu_toleration)) if gpus else own
    launcher = r.child("launcher")
    launcher_pool = launcher.checked("nodePool", _node_pool_problem) or config.cpu_pool
    launcher_selector = _pool_selector(launcher_pool)
    launcher_selector.update(launcher.labels("nodeSelector"))
    return Placement(
        node_selector=selector,
        tolerations=tolerations,
        affinity=r.optional_object("affinity"),
        launcher_node_selector=launcher_selector,
        launcher_tolerations=launcher.tolerations("tolerations"),
    )


def _pool_selector(pool: str) -> dict[str, str]:
    """The pool's agentpool selector; none for "" (the CPU pool's default: any node the pod tolerates)."""
    return {AGENTPOOL_LABEL: pool} if pool else {}


def _node_pool_problem(pool: str) -> str | None:
    if rules.matches(rules.NODE_POOL, pool):
        return None
    return (
        f"{pool!r} is not an AKS node pool name (1-12 lowercase letters and digits, starting with a letter)"
    )


def parse_launcher(r: Reader) -> Launcher:
    return Launcher(
        runner=r.choice("runner", RUNNERS, "horovodrun"),
        run_as_worker=r.boolean("runAsWorker", False),
        mpi_args=r.string_list("mpiArgs") or (),
        pod=parse_pod_overrides(r, names.LAUNCHER_CONTAINER),
        mpi_implementation=r.choice("mpiImplementation", MPI_IMPLEMENTATIONS, "OpenMPI"),
    )


def parse_run_policy(r: Reader) -> RunPolicy:
    d = RunPolicy()
    s = r.child("scheduling")
    return RunPolicy(
        backoff_limit=r.integer("backoffLimit", d.backoff_limit, minimum=0) or 0,
        active_deadline_seconds=r.integer(
            "activeDeadlineSeconds", None, minimum=1, maximum=MAX_DURATION_SECONDS
        ),
        ttl_seconds_after_finished=r.integer(
            "ttlSecondsAfterFinished", None, minimum=0, maximum=MAX_DURATION_SECONDS
        ),
        clean_pod_policy=r.choice("cleanPodPolicy", CLEAN_POD_POLICIES, d.clean_pod_policy),
        suspend=r.boolean("suspend", False),
        startup_deadline_seconds=r.integer(
            "startupDeadlineSeconds", None, minimum=1, maximum=MAX_DURATION_SECONDS
        ),
        progress_deadline_seconds=r.integer(
            "progressDeadlineSeconds",
            None,
            minimum=MIN_PROGRESS_DEADLINE_SECONDS,
            maximum=MAX_DURATION_SECONDS,
        ),
        restart_policy=r.choice("restartPolicy", RESTART_POLICIES, d.restart_policy),
        permanent_exit_codes=_exit_code_ranges(r, "permanentExitCodes") or d.permanent_exit_codes,
        scheduling=_scheduling(s),
    )


def _scheduling(s: Reader) -> Scheduling:
    scheduling = Scheduling(
        scheduler_name=s.checked("schedulerName", lambda n: rules.name_problem(n, subdomain=True)),
        queue_name=s.checked("queueName", lambda n: rules.name_problem(n, subdomain=False)),
        pod_group=s.checked("podGroup", lambda n: rules.name_problem(n, subdomain=False)),
        gang=_gang(s.child("gang")) if s.has("gang") else None,
        topology=_topology(s.child("topology")) if s.has("topology") else None,
    )
    if scheduling.gang is not None and scheduling.pod_group is not None:
        raise SpecError(
            s.at("podGroup"),
            "names a PodGroup of your own, while gang makes the operator create one: set one of them",
        )
    return scheduling


def _gang(g: Reader) -> Gang:
    if not g.has("scheduler"):
        raise SpecError(g.at("scheduler"), f"is required (one of {', '.join(GANG_SCHEDULERS)})")
    scheduler = g.choice("scheduler", GANG_SCHEDULERS, GANG_SCHEDULERS[0])
    queue = g.checked("queue", lambda n: rules.name_problem(n, subdomain=True))
    if queue is not None and scheduler != "volcano":
        raise SpecError(g.at("queue"), "is a Volcano Queue: it applies only with scheduler volcano")
    timeout = g.integer(
        "scheduleTimeoutSeconds", DEFAULT_GANG_TIMEOUT_SECONDS, minimum=1, maximum=MAX_GANG_TIMEOUT_SECONDS
    )
    return Gang(scheduler, timeout or DEFAULT_GANG_TIMEOUT_SECONDS, queue)


def _topology(t: Reader) -> Topology:
    if not t.has("key"):
        raise SpecError(t.at("key"), "is required: the node label key of the domain, e.g. a rack label")
    key = t.checked("key", rules.label_key_problem)
    assert key is not None
    return Topology(key=key, mode=t.choice("mode", TOPOLOGY_MODES, TOPOLOGY_REQUIRED))


def _exit_code_ranges(r: Reader, key: str) -> tuple[tuple[int, int], ...] | None:
    """`1-127,255` -> ((1, 127), (255, 255)); each range low to high."""
    text = r.checked(key, _exit_code_ranges_problem)
    if text is None:
        return None
    ranges = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        ranges.append((int(low), int(high or low)))
    return tuple(ranges)


def _exit_code_ranges_problem(text: str) -> str | None:
    if len(text) > rules.EXIT_CODE_RANGES_MAX or not rules.matches(rules.EXIT_CODE_RANGES, text):
        return f"{text!r} is not a list of exit codes 1-255 and ranges, e.g. 1-127 or 1-127,255"
    for part in text.split(","):
        low, _, high = part.partition("-")
        if high and int(low) > int(high):
            return f"range {part!r} runs backwards"
    return None
