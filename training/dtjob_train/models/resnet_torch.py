"""ResNet-50 (v1.5: stride on the 3x3 conv, as torchvision and NVIDIA's reference use) in plain torch.

The last BatchNorm of every residual branch starts at zero (Goyal et al.), so each block begins as the
identity: it is what lets the large-batch warmup schedule train stably.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int) -> None:
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        nn.init.zeros_(self.bn3.weight)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module = nn.Identity()
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), nn.BatchNorm2d(out_ch)
            )

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        result: Tensor = self.relu(out + self.downsample(x))
        return result


class ResNet(nn.Module):
    def __init__(self, blocks: tuple[int, ...], *, base_width: int = 64, num_classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, base_width, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(base_width),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        stages: list[nn.Module] = []
        in_ch = base_width
        for i, count in enumerate(blocks):
            width = base_width * 2**i
            for j in range(count):
                stages.append(Bottleneck(in_ch, width, stride=2 if (j == 0 and i > 0) else 1))
                in_ch = width * Bottleneck.expansion
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_ch, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: Tensor) -> Tensor:
        x = self.pool(self.stages(self.stem(x)))
        logits: Tensor = self.fc(torch.flatten(x, 1))
        return logits


def build(arch: str, num_classes: int) -> ResNet:
    if arch == "resnet50":
        return ResNet((3, 4, 6, 3), num_classes=num_classes)
    if arch == "resnet-tiny":
        # Same block structure, one block per stage at 1/8 width: for tests on 2 CPU cores.
        return ResNet((1, 1, 1, 1), base_width=8, num_classes=num_classes)
    raise ValueError(f"--arch: unknown architecture {arch!r}")
