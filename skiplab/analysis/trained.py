"""A trained run, ready to be looked into: its model, its blocks, and examples of a split with their loss.

This is what every analysis needs of a run, whatever its task; each task gives its own subclass
(``skiplab.tasks``) saying how its data are read and scored. Blocks are the members of the model's
stacks, named ``<stack>.<i>``: an image run's residual blocks ``block.i``, a translation run's encoder and
decoder layers ``encoder.i`` / ``decoder.i``. Data are read from where the run found them (its config),
unless ``data_dir`` says otherwise.

    L_n = the loss of example n: its cross-entropy (image), or the sum of its target tokens'
          cross-entropies (sequences); u_n its units: 1 (image), its target tokens (sequences).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn


@dataclass
class Examples:
    """One batch of examples: the model's inputs, targets, and per stack the positions that are real."""

    inputs: tuple[Tensor, ...]
    target: Tensor
    masks: dict[str, Tensor]  # stack -> (B, T), True at real tokens; none where every entry counts (images)

    def __len__(self) -> int:
        return self.target.shape[0]


@dataclass
class Trained:
    """A run's model (evaluation mode, CPU), config and checkpoint, as its task reads them."""

    path: Path
    model: nn.Module
    config: dict[str, Any]
    checkpoint: dict[str, Any]
    source: Path | None = None  # the checkpoint file read, where it is not the run's last.pt (an average, a step's)

    kind: ClassVar[str] = ""  # the task, as checkpoints name it
    splits: ClassVar[tuple[str, ...]] = ()
    stacks: ClassVar[dict[str, str]] = {}  # block prefix -> the model's ModuleList of them, e.g. block -> blocks
    metric: ClassVar[str] = ""  # what score_test measures, as result keys name it: "error", "bleu", ...
    metric_title: ClassVar[str] = ""  # and as text names it: "error", "BLEU", ...
    higher_is_better: ClassVar[bool] = False

    @property
    def analysis_name(self) -> str:
        """What an analysis's files add to their name: nothing for the run's last.pt, ``.<stem>`` for another
        checkpoint of it (``norms.avg5.json`` beside ``norms.json``), so the analyses of two checkpoints of one run
        are kept apart."""
        return f".{self.source.stem}" if self.source is not None else ""

    @property
    def label(self) -> str:
        """What the run is, for tables and legends: its model spec."""
        return self.config["model"]

    def _stack(self, prefix: str) -> nn.ModuleList:
        module = self.model
        for part in self.stacks[prefix].split("."):
            module = getattr(module, part)
        return module

    def blocks(self) -> dict[str, nn.Module]:
        """The model's blocks in forward order, stack by stack."""
        return {f"{prefix}.{i}": b for prefix in self.stacks for i, b in enumerate(self._stack(prefix))}

    def replace_block(self, block: str, module: nn.Module) -> nn.Module:
        """Put ``module`` where ``block`` (as :meth:`blocks` names it) is; return what was there."""
        prefix, index = block.split(".")
        container = self._stack(prefix)
        original = container[int(index)]
        container[int(index)] = module
        return original

    def block_of(self, name: str) -> str:
        """The block a module of the model belongs to: ``blocks.3.conn`` -> ``block.3``,
        ``decoder.layers.2.conn_ffn`` -> ``decoder.2``."""
        for prefix, path in self.stacks.items():
            if name.startswith(path + "."):
                return f"{prefix}.{name[len(path) + 1:].split('.')[0]}"
        raise ValueError(f"{name} is in none of the model's stacks ({', '.join(self.stacks.values())})")

    def stage_of(self, block: str) -> str:
        """The part of the model a block is in, for grouping in figures: its stack."""
        return block.split(".")[0]

    def mask(self, ex: Examples, block: str) -> Tensor | None:
        """(B, T), True at the real positions that ``block`` sees; None where every entry counts."""
        return ex.masks.get(block.split(".")[0])

    def forward(self, ex: Examples) -> Tensor:
        return self.model(*ex.inputs)

    def losses(self, ex: Examples, output: Tensor) -> Tensor:
        """L_n per example, shape (B,)."""
        raise NotImplementedError

    def units(self, ex: Examples) -> Tensor:
        """u_n summed over the batch: what the training objective averages over (examples; target tokens)."""
        return torch.tensor(len(ex))

    def mean_loss(self, ex: Examples, output: Tensor) -> Tensor:
        """The training objective: Σ_n L_n / Σ_n u_n over the batch (:meth:`units`)."""
        return self.losses(ex, output).sum() / self.units(ex)

    def examples(self, split: str, count: int, seed: int = 0, batch: int = 250, max_tokens: int = 4096,
                 data_dir: str = "", shuffle: bool = False) -> Iterator[Examples]:
        """``count`` random examples of ``split`` (all of it where it is smaller), in batches: in the split's
        order (``shuffle`` false), or in random batches."""
        raise NotImplementedError

    def check_split(self, split: str) -> None:
        if split not in self.splits:
            raise ValueError(f"{self.kind} runs have the splits {', '.join(self.splits)}, not {split!r}")

    scored_unit = "examples"  # what score_test counts

    def score_test(self, beam: int, progress: bool) -> tuple[float, int, dict[str, float]]:
        """(the test metric, test examples (:attr:`scored_unit`), other forms of it by name) of the model as it is
        now; ``beam`` where the task decodes."""
        raise NotImplementedError
