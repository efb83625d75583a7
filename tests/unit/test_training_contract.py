"""The training contract lives in dtjob.contract.training: the operator's parser, its command line and the
trainers import it, and the hand-written CRD's copies of it (enums, bounds, the defaults its descriptions
quote, the CEL rules that keep one framework's options from another) are held to it here, as are the
defaults the operator's reference quotes."""

from __future__ import annotations

import ast
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from dtjob.contract import training
from dtjob.contract.training_progress import latest_progress
from dtjob.spec.model import CUSTOM, FRAMEWORKS, Hyperparameters
from dtjob_train.cli import DEFAULT_EPOCHS, parse_args
from dtjob_train.progress import Reporter, Throughput

from tests.crd_contract import spec_schema

REPO = Path(__file__).resolve().parents[2]
SPEC = spec_schema()
HYPERPARAMETERS: dict[str, Any] = SPEC["properties"]["hyperparameters"]["properties"]
# The CRD's camelCase field of each Hyperparameters field that has a plain default.
FIELDS = {
    "epochs": "epochs", "learning_rate": "learningRate", "warmup_epochs": "warmupEpochs",
    "momentum": "momentum", "weight_decay": "weightDecay", "label_smoothing": "labelSmoothing", "amp": "amp",
    "amp_dtype": "ampDtype", "fp16_allreduce": "fp16Allreduce", "channels_last": "channelsLast", "xla": "xla",
    "data_loader": "dataLoader", "compile": "compile", "image_size": "imageSize",
    "log_interval": "logInterval", "seed": "seed",
}  # fmt: skip


def _rule(about: str) -> str:
    rules = [v["rule"] for v in SPEC["x-kubernetes-validations"] if f"hyperparameters.{about}" in v["rule"]]
    assert len(rules) == 1, rules
    rule: str = rules[0]
    return rule


def _quoted(text: str) -> list[str]:
    return re.findall(r"'([^']*)'", text)


def _crd_default(field: str) -> str:
    said = re.search(r"Default ([^ ]+)\.$", HYPERPARAMETERS[field]["description"])
    assert said is not None, f"spec.hyperparameters.{field} states its default"
    return said.group(1)


def test_the_contract_imports_nothing() -> None:
    # A trainer imports it in an image that has none of the operator's dependencies.
    tree = ast.parse(Path(training.__file__).read_text())
    imported = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    assert all(isinstance(n, ast.ImportFrom) and n.module == "__future__" for n in imported)


def test_the_crds_frameworks_and_choices_are_the_contracts() -> None:
    assert tuple(SPEC["properties"]["framework"]["enum"]) == FRAMEWORKS == (*training.FRAMEWORKS, CUSTOM)
    assert tuple(HYPERPARAMETERS["ampDtype"]["enum"]) == training.AMP_DTYPES
    assert tuple(HYPERPARAMETERS["dataLoader"]["enum"]) == training.DATA_LOADERS
    assert tuple(HYPERPARAMETERS["compile"]["enum"]) == training.COMPILE_MODES
    assert (HYPERPARAMETERS["seed"]["minimum"], HYPERPARAMETERS["seed"]["maximum"]) == (0, training.MAX_SEED)
    smoothing = HYPERPARAMETERS["labelSmoothing"]
    assert (smoothing["maximum"], smoothing["exclusiveMaximum"]) == (training.LABEL_SMOOTHING_BELOW, True)
    source = SPEC["properties"]["dataset"]["properties"]["source"]
    assert tuple(source["enum"]) == training.DATA_SOURCES
    assert source["description"].endswith(f"Default {training.DEFAULT_DATA_SOURCE}.")


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_the_defaults_the_crd_quotes_are_the_models(field: str) -> None:
    default = getattr(Hyperparameters(), field)
    quoted = _crd_default(FIELDS[field])
    if isinstance(default, bool):
        assert quoted == str(default).lower()
    elif isinstance(default, str):
        assert quoted == default
    else:
        assert float(quoted) == default


def test_the_models_defaults_are_the_contracts_but_epochs() -> None:
    model = Hyperparameters()
    for f in fields(Hyperparameters):
        contract_name = f"DEFAULT_{f.name.upper()}".replace("LEARNING_RATE", "BASE_LR")
        if hasattr(training, contract_name):
            assert getattr(model, f.name) == getattr(training, contract_name), f.name
    assert model.epochs == 1 != DEFAULT_EPOCHS  # a job's quick check of the world, not the recipe
    assert model.given_batch_size_per_gpu is None
    assert model.batch_size_per_gpu == training.DEFAULT_BATCH_AMP
    assert Hyperparameters(amp=False).batch_size_per_gpu == training.DEFAULT_BATCH_FP32


def test_the_batch_and_the_rate_the_crd_describes_are_the_contracts() -> None:
    batch = HYPERPARAMETERS["batchSizePerGpu"]["description"]
    assert f"Default {training.DEFAULT_BATCH_AMP} with amp" in batch, batch
    assert f"{training.DEFAULT_BATCH_FP32} without" in batch, batch
    rate = HYPERPARAMETERS["learningRate"]["description"]
    per = training.LR_REFERENCE_BATCH
    assert f"per {per} images" in rate and f"/ {per}." in rate, rate
    assert f"Default {training.DEFAULT_BASE_LR}." in rate, rate


def test_the_crds_rules_give_each_frameworks_options_to_the_contracts_frameworks() -> None:
    xla = _rule("xla")
    refused = {f for f in FRAMEWORKS if f"self.framework != '{f}'" in xla}
    assert refused == set(training.FRAMEWORKS) - set(training.XLA_FRAMEWORKS), xla
    loader = _rule("dataLoader")
    *any_framework, pytorch, custom = _quoted(loader)
    assert tuple(any_framework) == training.ANY_FRAMEWORK_DATA_LOADERS, loader
    assert {pytorch, custom} == {*training.DALI_FRAMEWORKS, CUSTOM}, loader
    compile_rule = _rule("compile")
    default, *taking = _quoted(compile_rule)
    assert default == training.DEFAULT_COMPILE
    assert set(taking) == {*training.COMPILE_FRAMEWORKS, CUSTOM}, compile_rule


def test_the_trainers_defaults_are_the_contracts() -> None:
    by_hand = parse_args("dtjob_train.pytorch", [])
    assert (by_hand.base_lr, by_hand.warmup_epochs, by_hand.momentum, by_hand.weight_decay) == (
        training.DEFAULT_BASE_LR,
        training.DEFAULT_WARMUP_EPOCHS,
        training.DEFAULT_MOMENTUM,
        training.DEFAULT_WEIGHT_DECAY,
    )
    assert (by_hand.label_smoothing, by_hand.amp, by_hand.amp_dtype, by_hand.xla, by_hand.data_loader) == (
        training.DEFAULT_LABEL_SMOOTHING,
        training.DEFAULT_AMP,
        training.DEFAULT_AMP_DTYPE,
        training.DEFAULT_XLA,
        training.DEFAULT_DATA_LOADER,
    )
    assert by_hand.compile == training.DEFAULT_COMPILE
    assert (by_hand.image_size, by_hand.log_interval, by_hand.seed, by_hand.batch_size) == (
        training.DEFAULT_IMAGE_SIZE,
        training.DEFAULT_LOG_INTERVAL,
        training.DEFAULT_SEED,
        training.DEFAULT_BATCH_AMP,
    )


def test_the_defaults_the_reference_quotes_are_the_contracts() -> None:
    row = next(
        line
        for line in (REPO / "operator" / "README.md").read_text().splitlines()
        if line.startswith("| `hyperparameters.*`")
    )
    assert (
        f"batchSizePerGpu {training.DEFAULT_BATCH_AMP} with amp ({training.DEFAULT_BATCH_FP32} without)"
        in row
    )
    assert (
        f"(per {training.LR_REFERENCE_BATCH} images" in row
        and f"ampDtype {training.DEFAULT_AMP_DTYPE}" in row
    )
    numbers = {
        "learningRate": training.DEFAULT_BASE_LR, "warmupEpochs": training.DEFAULT_WARMUP_EPOCHS,
        "momentum": training.DEFAULT_MOMENTUM, "weightDecay": training.DEFAULT_WEIGHT_DECAY,
        "labelSmoothing": training.DEFAULT_LABEL_SMOOTHING, "imageSize": training.DEFAULT_IMAGE_SIZE,
    }  # fmt: skip
    for name, value in numbers.items():
        quoted = re.search(rf"\b{name} ([0-9.e-]+)", row)
        assert quoted is not None and float(quoted.group(1)) == value, (name, row)


def test_the_operator_reads_the_progress_line_the_trainers_print(capsys: pytest.CaptureFixture[str]) -> None:
    reporter = Reporter(
        enabled=True, world_size=2, epochs=3, steps_per_epoch=10, progress_file=None, output_dir=None
    )
    reporter.interval(epoch=1, step=5, loss=1.5, lr=0.1, per_worker=100.0)
    progress = latest_progress(capsys.readouterr().out)
    assert progress is not None and (progress["epoch"], progress["step"]) == (2, 5), progress


def test_the_trainers_pace_and_world_reach_the_operators_eta(capsys: pytest.CaptureFixture[str]) -> None:
    reporter = Reporter(
        enabled=True, world_size=2, epochs=3, steps_per_epoch=10, progress_file=None, output_dir=None,
        batch_size=32,
    )  # fmt: skip
    reporter.interval(epoch=1, step=5, loss=1.5, lr=0.1, per_worker=100.0, steps_per_sec=0.5)
    progress = latest_progress(capsys.readouterr().out)
    assert progress is not None
    assert (progress["worldSize"], progress["globalBatch"], progress["stepsPerSec"]) == (2, 64, 0.5)
    # 15 of 30 steps done, 15 left at 0.5 steps/sec.
    assert (progress["percent"], progress["etaSeconds"]) == (50.0, 30)
    reporter.interval(epoch=0, step=1, loss=1.5, lr=0.1, per_worker=100.0, steps_per_sec=None)
    first = latest_progress(capsys.readouterr().out)
    assert first is not None and "stepsPerSec" not in first and "etaSeconds" not in first


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_pace_is_this_launchs_wall_clock_steps_after_the_first() -> None:
    clock = Clock()
    meter = Throughput(clock=clock)
    meter.new_epoch()
    clock.now += 30.0  # start-up and compilation, inside the first step: not the pace of what is left
    meter.add(64)
    assert meter.steps_per_sec is None  # one step: nothing to time yet
    for _ in range(10):
        clock.now += 0.5
        meter.add(64)
    meter.mark()
    clock.now += 5.0  # validation and a checkpoint between epochs: every later epoch has them too
    meter.new_epoch()
    for _ in range(10):
        clock.now += 0.5
        meter.add(64)
    assert meter.steps_per_sec == pytest.approx(20 / 15.0)
    # A restart's new trainer makes a new meter: its pace starts over, whatever the old one measured.
    assert Throughput(clock=clock).steps_per_sec is None
