"""The Transformer captioner: an image encoder in front of the residual Transformer's encoder-decoder shell.

    pixels (B, C, H, W) -> conv trunk -> grid (B, h·w, c) ─┐
                                                           ├-> Linear(·, d) -> (+ PE) -> dropout -> encoder -> memory
    features (B, N, F) -> ReLU(Linear(F, d)) -> LN ────────┘
    caption -> E·sqrt(d) + PE -> dropout -> decoder (attending to memory) -> h E^T

Two inputs, as captioning code bases take them:

- ``input=pixels``: a PreAct-ResNet trunk (He et al. 2016: pre-activation blocks with identity skips,
  :class:`TrunkBlock`) reads the image: a 3x3 stem of stride 2, three stages of ``trunk_blocks`` blocks of widths w,
  2w, 4w (strides 1, 2, 2), then BN and ReLU; its (H/8) x (W/8) grid, flattened row by row, is the sequence the
  encoder reads, each cell projected to d and given the sinusoidal position of its index (row-major). A 64 x 64
  scene gives an 8 x 8 grid, 64 positions. Pixels may be uint8 (scaled to [-1, 1]) or float (used as given).
- ``input=features``: precomputed region or grid features (B, N, F), one array per image (bottom-up-attention's
  (regions, 2048) in self-critical.pytorch's layout): ReLU(x W + b), dropout, LayerNorm (the "att_embed" of
  that code base and of the M² Transformer); no positions (regions are a set). Rows that are all zero are padding
  (a batch of images with fewer regions) and masked out of attention.

Everything after the features is the residual Transformer (:mod:`skiplab.models.transformer`): every sub-layer of
either stack takes any skiplab connection, the encoder's and the decoder's independently (``encoder_connection``,
``decoder_connection``), the caption embedding tied with the output (Press & Wolf 2017), beam search through the
shell's incremental interface (:mod:`skiplab.decoding`). The SAS paper gives no configuration for its MSCOCO
captioner (Section 4.3); ``captioner-base`` is the usual one (Vaswani et al.'s Base shape with 3 layers a side,
as the M² Transformer and many COCO captioners use) and ``captioner-small`` a CPU-sized one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .seq2seq import Memory
from .transformer import Transformer, TransformerConfig

INPUTS = ("pixels", "features")


@dataclass(frozen=True)
class CaptionerConfig(TransformerConfig):
    """The residual Transformer's fields and the image side: pixels through a trunk, or features."""

    input: str = field(default="pixels", metadata={"help": "pixels (a convolutional trunk) or features (precomputed)"})
    channels: int = field(default=1, metadata={"help": "image channels (pixels): 1 grey, 3 RGB"})
    image_size: int = field(default=64, metadata={"help": "image height and width (pixels), a multiple of 8"})
    trunk_width: int = field(default=32, metadata={"help": "width w of the trunk's first stage (then 2w, 4w)"})
    trunk_blocks: int = field(default=1, metadata={"help": "PreAct blocks per trunk stage"})
    feature_dim: int = field(default=2048, metadata={"help": "width F of precomputed features (features)"})

    def __post_init__(self):
        super().__post_init__()
        if self.input not in INPUTS:
            raise ValueError(f"input must be one of {', '.join(INPUTS)}, got {self.input!r}")
        if min(self.channels, self.trunk_width, self.trunk_blocks, self.feature_dim) < 1:
            raise ValueError("channels, trunk_width, trunk_blocks and feature_dim must be positive")
        if self.image_size < 8 or self.image_size % 8:
            raise ValueError(f"image_size must be a positive multiple of 8, got {self.image_size}")
        if self.input == "pixels" and (self.image_size // 8) ** 2 > self.max_positions:
            raise ValueError(f"an image of {self.image_size} gives {(self.image_size // 8) ** 2} grid positions, "
                             f"more than max_positions={self.max_positions}")

    @property
    def grid(self) -> int:
        """Positions the encoder reads for one image (pixels): (image_size / 8)²."""
        return (self.image_size // 8) ** 2


class TrunkBlock(nn.Module):
    """He et al.'s pre-activation block with a plain identity skip, y = x + F(x) (a 1x1 projection of ReLU(BN(x))
    where the shape changes): the image trunk's, not a connection under study, so the analyses and tables that
    list a model's connections see only the Transformer's."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.bn1, self.bn2 = nn.BatchNorm2d(c_in), nn.BatchNorm2d(c_out)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.shortcut = nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False) if stride != 1 or c_in != c_out else None

    def forward(self, x: Tensor) -> Tensor:
        a = F.relu(self.bn1(x))
        skip = x if self.shortcut is None else self.shortcut(a)
        return skip + self.conv2(F.relu(self.bn2(self.conv1(a))))


class Trunk(nn.Module):
    """Pixels (B, C, H, W) -> grid features (B, H/8 · W/8, 4w): stem of stride 2, stages of stride 1, 2, 2."""

    def __init__(self, cfg: CaptionerConfig):
        super().__init__()
        w = cfg.trunk_width
        self.stem = nn.Conv2d(cfg.channels, w, 3, stride=2, padding=1, bias=False)
        blocks, c_in = [], w
        for c_out, stride in ((w, 1), (2 * w, 2), (4 * w, 2)):
            for b in range(cfg.trunk_blocks):
                blocks.append(TrunkBlock(c_in, c_out, stride if b == 0 else 1))
                c_in = c_out
        self.blocks = nn.Sequential(*blocks)
        self.bn = nn.BatchNorm2d(c_in)
        self.out_dim = c_in
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, pixels: Tensor) -> Tensor:
        h = F.relu(self.bn(self.blocks(self.stem(pixels))))  # (B, 4w, H/8, W/8)
        return h.flatten(2).transpose(1, 2)  # row-major cells


class Captioner(Transformer):
    """The residual Transformer whose encoder reads an image (pixels or features) instead of source tokens."""

    def __init__(self, cfg: CaptionerConfig):
        super().__init__(cfg)
        d = cfg.d_model
        if cfg.input == "pixels":
            self.trunk = Trunk(cfg)
            self.project = nn.Linear(self.trunk.out_dim, d)
        else:
            self.project = nn.Linear(cfg.feature_dim, d)
            self.feature_norm = nn.LayerNorm(d)
        nn.init.xavier_uniform_(self.project.weight)
        nn.init.zeros_(self.project.bias)

    def image_sequence(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """The encoder's input (B, S, d) and its key mask (B, 1, 1, S) for images or features ``src``."""
        cfg = self.cfg
        if cfg.input == "pixels":
            if src.dim() == 3:  # grey images without a channel axis
                src = src[:, None]
            if src.dim() != 4 or src.shape[1:] != (cfg.channels, cfg.image_size, cfg.image_size):
                raise ValueError(f"expected images (B, {cfg.channels}, {cfg.image_size}, {cfg.image_size}), got "
                                 f"{tuple(src.shape)}")
            x = src.float() / 127.5 - 1.0 if src.dtype == torch.uint8 else src.float()
            x = self.project(self.trunk(x))
            x = x + self.positions[: x.shape[1]]
            mask = torch.ones(x.shape[0], 1, 1, x.shape[1], dtype=torch.bool, device=x.device)
            return self.drop(x), mask
        if src.dim() != 3 or src.shape[2] != cfg.feature_dim:
            raise ValueError(f"expected features (B, N, {cfg.feature_dim}), got {tuple(src.shape)}")
        mask = (src != 0).any(dim=2)[:, None, None, :]
        x = self.feature_norm(self.drop(F.relu(self.project(src.float()))))
        return x, mask

    def encode(self, src: Tensor) -> Memory:
        x, mask = self.image_sequence(src)
        return Memory(self.encoder(x, mask), mask)
