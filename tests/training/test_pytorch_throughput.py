"""In-process checks of the PyTorch trainer's throughput features on CPU: the decode worker count, the
prefetcher's normalised batches, bf16 autocast without a loss scaler."""

from __future__ import annotations

import os

import pytest
import torch
from dtjob_train.data.folder import MEAN_RGB, STD_RGB
from dtjob_train.data.torch_data import default_workers
from dtjob_train.host import cores_per_rank
from dtjob_train.models.resnet_torch import build

pytestmark = pytest.mark.training


@pytest.mark.parametrize(
    ("cpus", "local_size", "workers"),
    [
        (96, 8, 11),  # ND H100 v5: 96 cores, 8 GPUs; a cap of 8 would leave 24 cores idle
        (24, 4, 5),  # NC24ads A100 v4 x1 GPU per rank, 4 ranks
        (128, 1, 127),
        (8, 8, 1),  # a core per rank: the rank's own process, one decode worker
        (2, 4, 1),  # more ranks than cores
    ],
)
def test_decode_workers_follow_the_cores_each_rank_has(cpus: int, local_size: int, workers: int) -> None:
    assert default_workers(local_size, cpus) == workers


def test_the_core_count_is_this_processs_affinity() -> None:
    mine = len(os.sched_getaffinity(0))
    assert cores_per_rank(1) == mine and default_workers(1) == max(1, mine - 1)


def _loader_batches(count: int) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    g = torch.Generator().manual_seed(0)
    return [
        (
            torch.randint(0, 256, (4, 8, 8, 3), dtype=torch.uint8, generator=g),
            torch.arange(4) + i,
            i,
        )
        for i in range(count)
    ]


@pytest.mark.parametrize("channels_last", [True, False])
def test_the_prefetcher_hands_over_normalised_float_batches(channels_last: bool) -> None:
    from dtjob_train.torch_train import Normalize, Prefetcher

    fmt = torch.channels_last if channels_last else torch.contiguous_format
    batches = _loader_batches(3)
    prefetch = Prefetcher(Normalize(torch.device("cpu"), fmt))
    assert prefetch.stream is None  # no CUDA here: normalised as taken
    out = list(prefetch(iter(batches)))
    assert len(out) == 3
    mean = torch.tensor(MEAN_RGB).view(1, 3, 1, 1)
    std = torch.tensor(STD_RGB).view(1, 3, 1, 1)
    for (images, labels, skipped), (raw, raw_labels, raw_skipped) in zip(out, batches, strict=True):
        reference = (raw.permute(0, 3, 1, 2).float() - mean) / std
        assert images.dtype == torch.float32 and images.shape == (4, 3, 8, 8)
        assert images.is_contiguous(memory_format=fmt)
        torch.testing.assert_close(images, reference)
        assert torch.equal(labels, raw_labels) and skipped == raw_skipped


def _activation_dtypes(amp: object, model: torch.nn.Module) -> set[torch.dtype]:
    seen: set[torch.dtype] = set()
    hooks = [m.register_forward_hook(lambda _m, _i, out: seen.add(out.dtype)) for m in model.modules()
             if isinstance(m, torch.nn.Conv2d)]  # fmt: skip
    with amp.autocast():  # type: ignore[attr-defined]
        model(torch.randn(2, 3, 32, 32))
    for hook in hooks:
        hook.remove()
    return seen


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_bf16_autocast_needs_no_loss_scaler(dtype: str) -> None:
    from dtjob_train.torch_train import Amp

    model = build("resnet-tiny", 2)
    amp = Amp(True, dtype, torch.device("cpu"))
    # CPUs compute in bf16 whatever --amp-dtype says; bf16 keeps fp32's exponent range: nothing to scale.
    assert amp.dtype == torch.bfloat16 and amp.scaler is None
    assert _activation_dtypes(amp, model) == {torch.bfloat16}
    off = Amp(False, dtype, torch.device("cpu"))
    assert off.scaler is None and _activation_dtypes(off, model) == {torch.float32}


def test_a_bf16_step_trains_without_a_scaler() -> None:
    """train_step's path without loss scaling: a plain backward and optimizer step (Horovod's optimizer
    synchronises inside its step; the runs on real ranks cover that)."""
    from dtjob_train.torch_train import Amp, train_step

    torch.manual_seed(0)
    model = build("resnet-tiny", 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    amp = Amp(True, "bf16", torch.device("cpu"))
    images, labels = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 0, 1])
    before = [p.detach().clone() for p in model.parameters()]
    loss = train_step(model, optimizer, amp, torch.nn.CrossEntropyLoss(), (images, labels, 0), 0.1)
    assert torch.isfinite(loss)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # fp32 master weights
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
