"""A trained run, ready to be looked into: its model, its blocks, and examples of a split with their loss.

Works on any run directory (or checkpoint) of either task: an image run (PreAct-ResNet: each residual
block is a block) or a translation run of any family (each encoder and decoder layer is a block, named
``encoder.i`` / ``decoder.i``). Data are read from where the run found them (its config), unless
``data_dir`` says otherwise.

    L_n = cross-entropy of example n (image), or the sum of its target tokens' cross-entropies (MT).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import run_dir
from ..data import load_image_dataset, normalise
from ..models import model_from_checkpoint
from ..text import Tokenizer, encode_parallel, filter_long, load_split, make_batches

PAD = Tokenizer.PAD
SPLITS = {"image": ("train", "test"), "mt": ("train", "valid", "test")}


@dataclass
class Examples:
    """One batch of examples: the model's inputs, targets, and per side the positions that are real."""

    inputs: tuple[Tensor, ...]
    target: Tensor
    masks: dict[str, Tensor | None]  # "encoder" / "decoder" (MT: (B, T), True at real tokens); None for images

    def __len__(self) -> int:
        return self.target.shape[0]


@dataclass
class Trained:
    path: Path
    kind: str  # "image" or "mt"
    model: nn.Module
    config: dict[str, Any]
    checkpoint: dict[str, Any]

    @property
    def label(self) -> str:
        """The connection of an image run's blocks; a translation run's model spec."""
        connection = getattr(getattr(self.model, "cfg", None), "connection", None)
        return connection if self.kind == "image" and connection else self.config["model"]

    def blocks(self) -> dict[str, nn.Module]:
        """The model's blocks in forward order: residual blocks (image), encoder then decoder layers (MT)."""
        if self.kind == "image":
            return {f"block.{i}": b for i, b in enumerate(self.model.blocks)}
        return {**{f"encoder.{i}": layer for i, layer in enumerate(self.model.encoder.layers)},
                **{f"decoder.{i}": layer for i, layer in enumerate(self.model.decoder.layers)}}

    def replace_block(self, block: str, module: nn.Module) -> nn.Module:
        """Put ``module`` where ``block`` (as :meth:`blocks` names it) is; return what was there."""
        side, index = block.split(".")
        container = self.model.blocks if self.kind == "image" else getattr(self.model, side).layers
        original = container[int(index)]
        container[int(index)] = module
        return original

    def block_of(self, name: str) -> str:
        """The block a module of the model belongs to: ``blocks.3.conn`` -> ``block.3``,
        ``decoder.layers.2.conn_ffn`` -> ``decoder.2``."""
        parts = name.split(".")
        if self.kind == "image":
            return f"block.{parts[1]}"
        return f"{parts[0]}.{parts[2]}"

    def stage_of(self, block: str) -> str:
        """``stage k`` of an image block (three stages of equal length), ``encoder``/``decoder`` of an MT one."""
        if self.kind == "mt":
            return block.split(".")[0]
        n = self.model.cfg.blocks_per_stage
        return f"stage {int(block.split('.')[1]) // n + 1}"

    def forward(self, ex: Examples) -> Tensor:
        return self.model(*ex.inputs)

    def losses(self, ex: Examples, output: Tensor) -> Tensor:
        """L_n per example, shape (B,)."""
        if self.kind == "image":
            return F.cross_entropy(output.float(), ex.target, reduction="none")
        nll = F.cross_entropy(output.float().transpose(1, 2), ex.target, ignore_index=PAD, reduction="none")
        return nll.sum(1)

    def examples(self, split: str, count: int, seed: int = 0, batch: int = 250, max_tokens: int = 4096,
                 data_dir: str = "", shuffle: bool = False) -> Iterator[Examples]:
        """``count`` random examples of ``split`` (all of it where it is smaller), in batches: in the split's
        order (``shuffle`` false), or in random batches (images) / length-sorted batches in random order (MT)."""
        if split not in SPLITS[self.kind]:
            raise ValueError(f"{self.kind} runs have the splits {', '.join(SPLITS[self.kind])}, not {split!r}")
        gen = torch.Generator().manual_seed(seed)
        if self.kind == "image":
            data = load_image_dataset(self.config["dataset"], data_dir or self.config["data_dir"] or None)
            x, y = (data.train_x, data.train_y) if split == "train" else (data.test_x, data.test_y)
            pick = torch.randperm(len(y), generator=gen)[:count]
            pick = pick if shuffle else pick.sort().values
            for i in range(0, len(pick), batch):
                idx = pick[i : i + batch]
                yield Examples((normalise(x[idx], data.mean, data.std),), y[idx], {"": None})
            return
        where = {**self.config, **({"data_dir": data_dir} if data_dir else {})}
        tok = Tokenizer.from_bytes(self.checkpoint["tokenizer"])
        src, tgt = encode_parallel(tok, load_split(where, split))
        kept, _ = filter_long(src, tgt, min(self.config["max_len"], self.model.cfg.max_positions))
        pick = torch.tensor(kept)[torch.randperm(len(kept), generator=gen)[:count]].sort().values.tolist()
        for b in make_batches(src, tgt, max_tokens, pick, shuffle=shuffle, generator=gen):
            yield Examples((b.src, b.tgt_in), b.tgt_out, {"encoder": b.src != PAD, "decoder": b.tgt_in != PAD})


def load_trained(path: str | Path) -> Trained:
    """The run at ``path`` (a run directory or a checkpoint file) in evaluation mode, on the CPU."""
    ckpt = run_dir.load_checkpoint(path, kind=("image", "mt"))
    kind = ckpt["kind"]
    model = model_from_checkpoint(ckpt, path)
    cfg = ckpt["config"]
    run = Path(path) if Path(path).is_dir() else Path(path).parent
    return Trained(run, kind, model.eval(), cfg, ckpt)
