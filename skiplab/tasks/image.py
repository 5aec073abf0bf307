"""Image classification: PreAct-ResNet with any connection, the CIFAR recipe (skiplab.train.image).

Blocks are the residual blocks, ``block.i``, in three stages of equal length; the metric is the final test
error (%), lower is better; L_n is the cross-entropy of image n.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import run_dir
from ..analysis.trained import Examples, Trained
from ..connections import connection
from ..data import load_image_dataset, normalise
from ..models import PreActResNetConfig, format_model_spec, model_config, parse_model_spec, with_options
from ..train import image
from .base import Task
from .variants import Variant, connection_variants, model_variants


class ImageTrained(Trained):
    kind = "image"
    splits = ("train", "test")
    stacks = {"block": "blocks"}
    metric, metric_title, higher_is_better = "error", "error", False

    @property
    def label(self) -> str:
        """The connection of the run's blocks."""
        return getattr(getattr(self.model, "cfg", None), "connection", None) or self.config["model"]

    def stage_of(self, block: str) -> str:
        """``stage k``: the three stages have equal numbers of blocks."""
        return f"stage {int(block.split('.')[1]) // self.model.cfg.blocks_per_stage + 1}"

    def losses(self, ex: Examples, output: Tensor) -> Tensor:
        return F.cross_entropy(output.float(), ex.target, reduction="none")

    def examples(self, split: str, count: int, seed: int = 0, batch: int = 250, max_tokens: int = 4096,
                 data_dir: str = "", shuffle: bool = False) -> Iterator[Examples]:
        self.check_split(split)
        gen = torch.Generator().manual_seed(seed)
        data = load_image_dataset(self.config["dataset"], data_dir or self.config["data_dir"] or None)
        x, y = (data.train_x, data.train_y) if split == "train" else (data.test_x, data.test_y)
        pick = torch.randperm(len(y), generator=gen)[:count]
        pick = pick if shuffle else pick.sort().values
        for i in range(0, len(pick), batch):
            idx = pick[i : i + batch]
            yield Examples((normalise(x[idx], data.mean, data.std),), y[idx], {})

    @torch.no_grad()
    def score_test(self, beam: int, progress: bool) -> tuple[float, int, dict[str, float]]:
        """Test error %."""
        wrong = total = 0
        for ex in self.examples("test", 10**9, batch=500):
            wrong += int((self.forward(ex).argmax(1) != ex.target).sum())
            total += len(ex)
        return 100.0 * wrong / total, total, {}


class ImageTask(Task):
    name = "image"
    help = "image classification (PreAct-ResNet, CIFAR recipe)"
    config = image.ImageTrainConfig
    trained = ImageTrained
    metric, metric_label, higher_is_better = "final_test_error", "error %", False
    curves, x = ("train_loss", "test_error"), "epoch"
    compare_connections, compare_seeds, compare_out = ("1xSkip", "2xSkip", "2xSkip+LN", "2rSkip+LN"), 3, "runs/compare"
    stall_margin = 10.0  # error points: a run ending within 10 of always answering one class learned little

    def families(self) -> list[type]:
        return [PreActResNetConfig]

    def reference(self, cfg: Any) -> dict[str, Any] | None:
        """The test error (%) of always answering the commonest class of the run's training images, on its test
        images (both as its ``--train-subset`` / ``--test-subset`` chose them), computed once and kept in the run's
        summary as ``majority_test_error``; None where the data are not here (a run collected without them)."""
        path = Path(cfg.out) / "summary.json"
        summary = run_dir.read_json(path)
        if "majority_test_error" not in summary:
            try:
                data = load_image_dataset(cfg.dataset, cfg.data_dir or None, download=False)
            except (OSError, ValueError):
                return None
            train, test = image.chosen(cfg, data)
            train_y = data.train_y if train is None else data.train_y[train]
            test_y = data.test_y if test is None else data.test_y[test]
            commonest = int(torch.bincount(train_y).argmax())
            summary = dict(summary, majority_test_error=100.0 * float((test_y != commonest).double().mean()))
            run_dir.write_json(path, summary)
        return {"label": "the commonest training class, always", "value": summary["majority_test_error"]}

    def train(self, cfg: Any, resume: bool = False, overwrite: bool = False, progress: bool = True) -> dict[str, Any]:
        return image.train(cfg, resume=resume, overwrite=overwrite, progress=progress)

    def variants(self, base_model: str, models: tuple[str, ...], connections: tuple[str, ...],
                 options: dict[str, Any] | None = None) -> list[Variant]:
        """One row per connection (labelled by it) on the base model; with ``models``, every model x connection,
        ``options`` added to each of ``models``."""
        if models or not connections:
            return model_variants(base_model, models, connections, options)
        return connection_variants(base_model, connections)

    def data_name(self, cfg: Any) -> str:
        return cfg.dataset

    def run_label(self, cfg: Any) -> tuple[str, ...]:
        """The dataset, the preset and the connection: fashion-mnist_preact-resnet20_2rSkip+LN."""
        name, options = parse_model_spec(cfg.model)
        return (cfg.dataset, format_model_spec(name, {k: v for k, v in options.items() if k != "connection"}),
                model_config(cfg.model).connection)

    def add_eval_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--checkpoint", required=True, help="a run directory (its last.pt) or a .pt file")
        p.add_argument("--data-dir", default="", help="where the dataset is, if not where the run found it")
        p.add_argument("--device", default="auto", help="cpu, cuda or auto (default: auto)")

    def evaluate(self, args: argparse.Namespace) -> dict[str, Any]:
        """Test loss and error of an image run."""
        return image.evaluate_checkpoint(args.checkpoint, args.data_dir, args.device)

    def cell_config(self, base: Any, run: Any, setting: Any) -> Any:
        """The setting's config with the cell's connection on every block."""
        return dataclasses.replace(base, model=with_options(base.model, connection=connection(run.connection, 4).spec))

    def measure(self, cfg: Any, summary: dict[str, Any], metric: str, average: int, beam: int,
                progress: bool) -> dict[str, Any]:
        """The final test error, or accuracy = 100 - error where the table reports accuracy."""
        run_dir.require(summary, ("final_test_error",), Path(cfg.out) / "summary.json")
        error = summary["final_test_error"]
        return {"value": 100.0 - error if metric.startswith("accuracy") else error,
                "train_time_s": summary["train_time_s"]}
