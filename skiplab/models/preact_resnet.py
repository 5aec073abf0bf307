"""PreAct-ResNet for 32x32 images (He et al. 2016b, "Identity mappings in deep residual networks"),
with every block's addition replaced by a skiplab connection.

    conv3x3(16w) -> stage 1: n blocks, 16w ch -> stage 2: n blocks, 32w ch, first strides by 2
                 -> stage 3: n blocks, 64w ch, first strides by 2 -> BN-ReLU -> global avg pool -> linear

Depth = 6n + 2. A block is  y = conn(x, F, skip=shortcut)  with the pre-activation residual branch

    F(x) = conv3x3(ReLU(BN(conv3x3(ReLU(BN(x))))))

and, on the two downsampling blocks, a 1x1 strided projection shortcut applied, like the branch, to the
pre-activated input ReLU(BN(x)) (the "both pre-activated" first unit of a stage); elsewhere the skip
is x itself. With ``1xSkip`` this is exactly the standard PreAct-ResNet (ResNet-110: 1.7M parameters).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..connections import REGISTRY, Place, connection, parse_spec


@dataclass(frozen=True)
class PreActResNetConfig:
    """A PreAct-ResNet: depth, width, the connection on every block, and the data it reads."""

    depth: int = field(default=20, metadata={"help": "6n + 2: 20, 32, 44, 56, 110, ..."})
    width: int = field(default=1, metadata={"help": "channel multiplier: stages have 16w, 32w, 64w channels"})
    connection: str = field(default="1xSkip", metadata={"help": "connection spec on every block, e.g. 2rSkip+LN"})
    in_channels: int = field(default=3, metadata={"help": "image channels"})
    num_classes: int = field(default=10, metadata={"help": "output classes"})

    def __post_init__(self):
        if self.depth < 8 or (self.depth - 2) % 6:
            raise ValueError(f"PreAct-ResNet depth must be 6n + 2 with n >= 1 (20, 32, 44, 56, 110), got {self.depth}")
        if self.width < 1:
            raise ValueError(f"width must be a positive integer, got {self.width}")
        spec = parse_spec(self.connection)  # a bad spec fails here, with the known names
        if REGISTRY[spec.name].needs_stack:
            raise ValueError(f"{spec.name} needs a stack that holds its residual streams from the first block to "
                             "the last; the PreAct-ResNet's stages change width and resolution between blocks")
        if REGISTRY[spec.name].model_requires:
            raise ValueError(f"{spec.name} is a Transformer layer's design (its part inside the attention: "
                             f"{', '.join(f'{k}={v}' for k, v in REGISTRY[spec.name].model_requires.items())}); "
                             "the PreAct-ResNet has no attention")
        if REGISTRY[spec.name].model_side:
            raise ValueError(f"{spec.name} needs its model around it (unit-norm embeddings, scaled attention and "
                             "logits, weights renormalised after each step): the GPT's alone, not the PreAct-ResNet's")
        if REGISTRY[spec.name].previous_inputs(spec):
            raise ValueError(f"{spec.name}(form=pa) mixes the inputs of earlier blocks, which the PreAct-ResNet's "
                             "stages change in width and resolution; use k=1, form=lr or form=rw")
        if spec.stack:
            raise ValueError(f"+{spec.stack[0].name} is a design across the layers of a Transformer stack (attention "
                             "values, same-width skips); the PreAct-ResNet has no attention and its stages change width")

    @property
    def blocks_per_stage(self) -> int:
        return (self.depth - 2) // 6


class PreActBlock(nn.Module):
    """y = conn(x, F, skip): F(x) = conv(ReLU(BN(conv(ReLU(BN(x)))))), skip = proj(ReLU(BN(x))) or x."""

    def __init__(self, c_in: int, c_out: int, stride: int, spec: str, place: Place | None = None):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(c_in)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.shortcut = nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False) if stride != 1 or c_in != c_out else None
        self.conn = connection(spec, c_out, layout="conv", in_dim=c_in, place=place)

    def forward(self, x: Tensor) -> Tensor:  # (N, c_in, H, W) -> (N, c_out, H/s, W/s)
        cache: dict[str, Tensor] = {}

        def preact(t: Tensor) -> Tensor:  # ReLU(BN(x)) once, shared by branch and projection
            if t is not x:  # a pre-norm connection hands the branch its own normalised x
                return F.relu(self.bn1(t))
            if "x" not in cache:
                cache["x"] = F.relu(self.bn1(x))
            return cache["x"]

        def branch(t: Tensor) -> Tensor:
            return self.conv2(F.relu(self.bn2(self.conv1(preact(t)))))

        skip = None if self.shortcut is None else (lambda t: self.shortcut(preact(t)))
        return self.conn(x, branch, skip=skip)


class PreActResNet(nn.Module):
    def __init__(self, cfg: PreActResNetConfig):
        super().__init__()
        self.cfg = cfg
        widths = [16 * cfg.width, 32 * cfg.width, 64 * cfg.width]
        self.stem = nn.Conv2d(cfg.in_channels, widths[0], 3, padding=1, bias=False)
        blocks, c_in = [], widths[0]
        n = 3 * cfg.blocks_per_stage  # the blocks are an encoder-only stack of n layers
        for stage, c_out in enumerate(widths):
            for i in range(cfg.blocks_per_stage):
                stride = 2 if stage > 0 and i == 0 else 1
                where = Place(len(blocks) + 1, "encoder", n, 0)
                blocks.append(PreActBlock(c_in, c_out, stride, cfg.connection, where))
                c_in = c_out
        self.blocks = nn.Sequential(*blocks)
        self.bn = nn.BatchNorm2d(c_in)
        self.fc = nn.Linear(c_in, cfg.num_classes)
        for m in self.modules():  # He init for the convolutions; norms, gates and fc keep PyTorch's defaults
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: Tensor) -> Tensor:  # (N, C, 32, 32) -> (N, classes)
        h = self.blocks(self.stem(x))
        h = F.relu(self.bn(h))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))
