"""The flags the operator builds for the trainers are read by the trainers' own parser (dtjob_train.cli), so a
flag renamed or a bound tightened on either side fails here, not in every rank of a running job."""

from __future__ import annotations

from typing import Any

import pytest
from dtjob.contract.training import EXPECT_GPU_ENV
from dtjob.desired.command import rank_env, training_flags
from dtjob.spec.parse import SpecError
from dtjob_train import host
from dtjob_train.cli import TrainConfig, parse_args

from tests.unit.operator_fixtures import job_spec

IMAGENET = {"source": "imagenet", "volume": {"persistentVolumeClaim": {"claimName": "imagenet"}},
            "dataDir": "/data/imagenet"}  # fmt: skip
# The spec's bounds on hyperparameters, on the accepted side of each (the CRD holds the same, see
# test_crd_contract.py), and every combination of optional flags.
SPECS: list[dict[str, Any]] = [
    {},
    {"dataset": IMAGENET, "checkpoints": {"persistentVolumeClaim": {"claimName": "ckpt"}}},
    {"hyperparameters": {"amp": False, "fp16Allreduce": False, "channelsLast": False, "stepsPerEpoch": 3}},
    {"hyperparameters": {"ampDtype": "bf16", "dataLoader": "dali", "compile": "max-autotune"}},
    {"framework": "keras", "hyperparameters": {"dataLoader": "pytorch"}},
    {"framework": "tensorflow", "hyperparameters": {"xla": True, "amp": False, "ampDtype": "bf16"}},
    {"hyperparameters": {"batchSizePerGpu": 1, "epochs": 1, "stepsPerEpoch": 1, "learningRate": 0,
                         "warmupEpochs": 0, "momentum": 0, "weightDecay": 0, "labelSmoothing": 0,
                         "imageSize": 8, "logInterval": 1, "seed": 0}},
    {"hyperparameters": {"labelSmoothing": 0.999999, "seed": 2**32 - 1, "learningRate": 1e-9,
                         "warmupEpochs": 0.5, "batchSizePerGpu": 4096, "epochs": 1000}},
]  # fmt: skip


@pytest.mark.parametrize("changes", SPECS)
def test_the_trainers_parser_reads_every_flag_the_operator_passes(changes: dict[str, Any]) -> None:
    spec = job_spec(**changes)
    cfg: TrainConfig = parse_args("dtjob_train", training_flags(spec), framework=spec.framework)
    hp = spec.hyperparameters
    assert cfg.data == spec.dataset.source
    assert (str(cfg.data_dir) if cfg.data_dir else None) == (
        spec.dataset.data_dir if spec.dataset.source == "imagenet" else None
    )
    assert (cfg.batch_size, cfg.epochs, cfg.steps_per_epoch) == (hp.batch_size_per_gpu, hp.epochs,
                                                                  hp.steps_per_epoch)  # fmt: skip
    assert (cfg.base_lr, cfg.warmup_epochs, cfg.momentum, cfg.weight_decay, cfg.label_smoothing) == (
        hp.learning_rate,
        hp.warmup_epochs,
        hp.momentum,
        hp.weight_decay,
        hp.label_smoothing,
    )
    assert (cfg.amp, cfg.fp16_allreduce, cfg.channels_last) == (hp.amp, hp.fp16_allreduce, hp.channels_last)
    assert cfg.amp_dtype == (hp.amp_dtype if hp.amp else "fp16")  # the type of amp; without amp not passed
    assert (cfg.xla, cfg.data_loader, cfg.compile) == (hp.xla, hp.data_loader, hp.compile)
    assert (cfg.image_size, cfg.log_interval, cfg.seed) == (hp.image_size, hp.log_interval, hp.seed)
    assert cfg.checkpoint_dir is not None and cfg.output_dir is not None and cfg.progress_file is not None


@pytest.mark.parametrize(
    ("hyperparameters", "flag"),
    [
        ({"labelSmoothing": 1}, "--label-smoothing"),
        ({"seed": 2**32}, "--seed"),
        ({"batchSizePerGpu": 0}, "--batch-size"),
        ({"learningRate": -1}, "--base-lr"),
        ({"logInterval": 0}, "--log-interval"),
    ],
)
def test_what_the_trainers_refuse_the_operator_refuses_first(
    hyperparameters: dict[str, Any], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SpecError):
        job_spec(hyperparameters=hyperparameters)
    # The trainer refuses the same value: without the operator's check every rank would exit with status 2.
    accepted = job_spec()
    flags = training_flags(accepted)
    value = {"--label-smoothing": "1", "--seed": str(2**32), "--batch-size": "0", "--base-lr": "-1",
             "--log-interval": "0"}[flag]  # fmt: skip
    flags[flags.index(flag) + 1] = value
    with pytest.raises(SystemExit) as exited:
        parse_args("dtjob_train.pytorch", flags)
    assert exited.value.code == 2
    assert flag in capsys.readouterr().err


def test_the_operators_gpu_expectation_is_the_one_the_trainers_read() -> None:
    env = {e["name"]: e["value"] for e in rank_env(job_spec())}
    # One name (dtjob.contract.training): the operator sets it, the trainers read it.
    assert env[EXPECT_GPU_ENV] and host.expect_gpu(env)


def test_the_operators_default_rate_is_the_trainers() -> None:
    operators = parse_args("dtjob_train.pytorch", training_flags(job_spec()))
    assert operators.base_lr == parse_args("dtjob_train.pytorch", []).base_lr


# Set per job by the operator, not defaults: where the data and the outputs are. epochs differs on purpose:
# a job without it runs one epoch (a quick check of the world), the trainers' own default is the 90-epoch
# recipe.
PER_JOB = {"data", "data_dir", "checkpoint_dir", "output_dir", "progress_file", "epochs"}


@pytest.mark.parametrize("hyperparameters", [{}, {"amp": False}], ids=["amp", "fp32"])
def test_the_trainers_defaults_are_the_operators(hyperparameters: dict[str, Any]) -> None:
    """A job that sets nothing trains as the trainers do when run by hand with no flags: mixed precision,
    channels-last, fp16 allreduce, the batch that fits the precision; no field is left out unnoticed."""
    operators = parse_args("dtjob_train.pytorch", training_flags(job_spec(hyperparameters=hyperparameters)))
    by_hand = parse_args("dtjob_train.pytorch", [] if hyperparameters.get("amp", True) else ["--no-amp"])
    differing = {f for f in vars(operators) if getattr(operators, f) != getattr(by_hand, f)}
    assert differing <= PER_JOB, differing
    assert (by_hand.amp, by_hand.channels_last, by_hand.fp16_allreduce) == (operators.amp, True, True)
    assert by_hand.batch_size == (256 if by_hand.amp else 128)


@pytest.mark.parametrize(
    ("framework", "hyperparameters", "flag"),
    [
        ("tensorflow", {"dataLoader": "dali"}, "--data-loader"),
        ("pytorch", {"xla": True}, "--xla"),
        ("keras", {"compile": "eager"}, "--compile"),
    ],
)
def test_one_frameworks_options_are_refused_for_another(
    framework: str, hyperparameters: dict[str, Any], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SpecError) as refused:
        job_spec(framework=framework, hyperparameters=hyperparameters)
    assert refused.value.path == f"spec.hyperparameters.{next(iter(hyperparameters))}"
    # The trainer refuses it too, when the flag is given by hand.
    flags = {"--data-loader": [flag, "dali"], "--compile": [flag, "eager"]}.get(flag, [flag])
    with pytest.raises(SystemExit) as exited:
        parse_args(f"dtjob_train.{framework}", flags, framework=framework)
    assert exited.value.code == 2 and f"{flag}" in capsys.readouterr().err


@pytest.mark.parametrize("framework", ["tensorflow", "keras"])
def test_the_pytorch_optimizers_step_is_refused_for_the_tensorflow_trainers(
    framework: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--no-fused-optimizer is a PyTorch trainer's flag (no job sets it: its fused SGD is the default)."""
    assert (
        parse_args("dtjob_train.pytorch", ["--no-fused-optimizer"], framework="pytorch").fused_optimizer
        is False
    )
    assert parse_args(f"dtjob_train.{framework}", [], framework=framework).fused_optimizer is True
    with pytest.raises(SystemExit) as exited:
        parse_args(f"dtjob_train.{framework}", ["--no-fused-optimizer"], framework=framework)
    assert (
        exited.value.code == 2
        and "--no-fused-optimizer applies to the PyTorch trainer" in capsys.readouterr().err
    )
