"""Image classification with any connection: the CIFAR recipe of He et al. 2016b, as both papers use it.

SGD (momentum 0.9), batch 128, lr 0.1, weight decay 2e-4 (the papers' choice; He et al. use 1e-4),
164 epochs with lr / 10 at epochs 81 and 122 (``--epochs`` scales both milestones), and for depth >= 110
a warm-up at lr 0.01 for the first 400 iterations. Augmentation: pad 4, random 32x32 crop, horizontal
flip (off for digits), per-channel normalisation. The loop below is the whole of training.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..data import ImageData, augment_batch, load_image_dataset, normalise
from .. import run_dir
from ..models import build_model, model_config, model_from_checkpoint
from ..device import pick_device

PAPER_EPOCHS, PAPER_MILESTONES = 164, (81, 122)


@dataclass(frozen=True)
class ImageTrainConfig:
    """Everything that decides an image-classification run; saved as config.json beside its results."""

    model: str = field(default="preact-resnet20", metadata={"help": "model preset"})
    connection: str = field(default="1xSkip", metadata={"help": "connection spec on every block"})
    width: int = field(default=1, metadata={"help": "channel multiplier of the model"})
    dataset: str = field(default="cifar10", metadata={"help": "cifar10, cifar100, fashion-mnist or mnist"})
    data_dir: str = field(default="", metadata={"help": "where the dataset files are ('' = the default place)"})
    epochs: int = field(default=PAPER_EPOCHS, metadata={"help": "epochs; the lr milestones scale with it"})
    batch_size: int = field(default=128, metadata={"help": "mini-batch size"})
    lr: float = field(default=0.1, metadata={"help": "peak learning rate"})
    momentum: float = field(default=0.9, metadata={"help": "SGD momentum"})
    weight_decay: float = field(default=2e-4, metadata={"help": "L2 weight decay (2e-4 as the papers; 1e-4 as He et al.)"})
    warmup_iters: int = field(default=-1, metadata={"help": "iterations at lr 0.01 first; -1 = 400 for depth >= 110, else 0"})
    seed: int = field(default=1, metadata={"help": "seed for initialisation, subsets, shuffling and augmentation"})
    train_subset: int = field(default=0, metadata={"help": "train on a fixed random subset of N images (0 = all)"})
    test_subset: int = field(default=0, metadata={"help": "evaluate on a fixed random subset of N test images (0 = all)"})
    device: str = field(default="auto", metadata={"help": "cpu, cuda, cuda:1, or auto"})
    amp: bool = field(default=True, metadata={"help": "bf16 autocast on CUDA (ignored on CPU)"})
    out: str = field(default="runs/image", metadata={"help": "run directory"})

    def __post_init__(self):
        for name in ("epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0 or self.train_subset < 0 or self.test_subset < 0:
            raise ValueError("lr must be > 0 and subsets >= 0")


def milestones(epochs: int) -> tuple[int, int]:
    """The epochs at which lr drops ten-fold: 81 and 122 of 164, scaled to ``epochs``."""
    return tuple(max(1, round(m * epochs / PAPER_EPOCHS)) for m in PAPER_MILESTONES)


def learning_rate(cfg: ImageTrainConfig, depth: int, epoch: int, step: int) -> float:
    """lr at ``step`` (global iteration, from 0) in ``epoch`` (from 0): warm-up, then step decay."""
    warmup = cfg.warmup_iters if cfg.warmup_iters >= 0 else (400 if depth >= 110 else 0)
    if step < warmup:
        return 0.01 if cfg.lr > 0.01 else cfg.lr
    return cfg.lr * 0.1 ** sum(epoch >= m for m in milestones(cfg.epochs))


def subset(n: int, k: int, seed: int) -> torch.Tensor | None:
    """A fixed random choice of k of n indices (None: all)."""
    if not k or k >= n:
        return None
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:k].sort().values


@torch.no_grad()
def evaluate(model, x_u8: torch.Tensor, y: torch.Tensor, data: ImageData, device, amp: bool, batch: int = 500):
    """(mean cross-entropy, error %) of ``model`` on uint8 images ``x_u8``."""
    model.eval()
    loss_sum, wrong = 0.0, 0
    for i in range(0, len(y), batch):
        xb = normalise(x_u8[i : i + batch].to(device), data.mean, data.std)
        yb = y[i : i + batch].to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(xb)
        loss_sum += F.cross_entropy(logits.float(), yb, reduction="sum").item()
        wrong += (logits.argmax(1) != yb).sum().item()
    model.train()
    return loss_sum / len(y), 100.0 * wrong / len(y)


def build(cfg: ImageTrainConfig, data: ImageData):
    mcfg = model_config(cfg.model, connection=cfg.connection, width=cfg.width,
                        in_channels=data.channels, num_classes=data.num_classes)
    torch.manual_seed(cfg.seed)
    return mcfg, build_model(mcfg)


def train(cfg: ImageTrainConfig, resume: bool = False, overwrite: bool = False, progress: bool = True) -> dict[str, Any]:
    """Train as ``cfg`` says, writing the run directory; return the summary."""
    model_config(cfg.model, connection=cfg.connection)  # a bad model or spec fails before anything is written
    device = pick_device(cfg.device)
    data = load_image_dataset(cfg.dataset, cfg.data_dir or None)
    out = run_dir.prepare(cfg.out, resume=resume, overwrite=overwrite)
    amp = cfg.amp and device.type == "cuda"

    train_idx = subset(len(data.train_y), cfg.train_subset, cfg.seed)
    test_idx = subset(len(data.test_y), cfg.test_subset, cfg.seed + 10_000)
    train_x, train_y = (data.train_x, data.train_y) if train_idx is None else (data.train_x[train_idx], data.train_y[train_idx])
    test_x, test_y = (data.test_x, data.test_y) if test_idx is None else (data.test_x[test_idx], data.test_y[test_idx])

    mcfg, model = build(cfg, data)
    model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(cfg.seed)  # shuffling and augmentation
    start_epoch, step, best = 0, 0, math.inf

    if resume:
        ckpt = run_dir.load_checkpoint(out / "last.pt", kind="image")
        run_dir.check_resumable(out, ckpt["config"], dataclasses.asdict(cfg))
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        gen.set_state(ckpt["rng"]["data"])
        run_dir.restore_rng(ckpt["rng"])
        start_epoch, step, best = ckpt["epoch"], ckpt["step"], ckpt["best_error"]
        run_dir.truncate_metrics(out, start_epoch)
    else:
        run_dir.write_json(out / "config.json", {
            "config": dataclasses.asdict(cfg),
            "model": {"class": type(model).__name__, **dataclasses.asdict(mcfg)},
            "parameters": sum(p.numel() for p in model.parameters()),
            "data": {"name": data.name, "train": len(train_y), "test": len(test_y), "mean": data.mean, "std": data.std},
            "milestones": milestones(cfg.epochs),
            "device": str(device), "amp": amp, "environment": run_dir.environment(),
        })

    def checkpoint(epoch: int) -> dict[str, Any]:
        return {"kind": "image", "config": dataclasses.asdict(cfg), "model_config": dataclasses.asdict(mcfg),
                "model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch, "step": step,
                "best_error": best, "rng": {"data": gen.get_state(), **run_dir.rng_state()},
                "data_stats": {"mean": list(data.mean), "std": list(data.std)}}

    steps_per_epoch = math.ceil(len(train_y) / cfg.batch_size)
    bar = tqdm(range(start_epoch, cfg.epochs), initial=start_epoch, total=cfg.epochs, desc=Path(cfg.out).name,
               unit="epoch", disable=not progress)
    model.train()
    for epoch in bar:
        t0, loss_sum, wrong, seen = time.time(), 0.0, 0, 0
        perm = torch.randperm(len(train_y), generator=gen)
        for i in range(steps_per_epoch):
            idx = perm[i * cfg.batch_size : (i + 1) * cfg.batch_size]
            xb = normalise(augment_batch(train_x[idx], gen, flip=data.flip), data.mean, data.std).to(device)
            yb = train_y[idx].to(device)
            lr = learning_rate(cfg, mcfg.depth, epoch, step)
            for group in opt.param_groups:
                group["lr"] = lr
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                logits = model(xb)
            loss = F.cross_entropy(logits.float(), yb)
            if not torch.isfinite(loss):
                bar.close()
                return run_dir.stop_diverged(out, dataclasses.asdict(cfg), loss.item(), epoch + 1, step + 1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            loss_sum += loss.item() * len(yb)
            wrong += (logits.argmax(1) != yb).sum().item()
            seen += len(yb)
        test_loss, test_error = evaluate(model, test_x, test_y, data, device, amp)
        record = {"epoch": epoch + 1, "step": step, "lr": lr, "train_loss": loss_sum / seen,
                  "train_error": 100.0 * wrong / seen, "test_loss": test_loss, "test_error": test_error,
                  "time": time.time() - t0}
        improved = test_error < best
        best = min(best, test_error)
        state = checkpoint(epoch + 1)
        run_dir.save_checkpoint(out / "last.pt", state)
        if improved:
            run_dir.save_checkpoint(out / "best.pt", state)
        run_dir.append_metrics(out, record)
        bar.set_postfix(loss=f"{record['train_loss']:.3f}", test_err=f"{test_error:.2f}%", lr=f"{lr:g}")
    bar.close()

    history = run_dir.read_metrics(out)
    summary = {"status": "finished", "epochs": cfg.epochs, "final_test_error": history[-1]["test_error"],
               "final_test_loss": history[-1]["test_loss"], "best_test_error": best,
               "train_time_s": sum(r["time"] for r in history), "config": dataclasses.asdict(cfg)}
    run_dir.write_json(out / "summary.json", summary)
    return summary


def load_trained(path: str | Path):
    """(config, model in eval mode, checkpoint) from a run directory or checkpoint file."""
    ckpt = run_dir.load_checkpoint(path, kind="image")
    model = model_from_checkpoint(ckpt, path)
    try:
        cfg = ImageTrainConfig(**ckpt["config"])
    except (TypeError, ValueError) as err:
        raise run_dir.RunDirError(f"{path}: the checkpoint's config is not an image run's ({err})") from None
    return cfg, model.eval(), ckpt


def evaluate_checkpoint(path: str | Path, data_dir: str = "", device: str = "auto") -> dict[str, Any]:
    """Test loss and error of a trained checkpoint on its dataset's full test set."""
    cfg, model, ckpt = load_trained(path)
    dev = pick_device(device)
    data = load_image_dataset(cfg.dataset, data_dir or cfg.data_dir or None)
    loss, error = evaluate(model.to(dev), data.test_x, data.test_y, data, dev, cfg.amp and dev.type == "cuda")
    return {"checkpoint": str(path), "epoch": ckpt["epoch"], "connection": cfg.connection, "model": cfg.model,
            "dataset": cfg.dataset, "test_images": len(data.test_y), "test_loss": loss, "test_error": error}
