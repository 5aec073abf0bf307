"""Image classification with any connection: the CIFAR recipe of He et al. 2016b, as both papers use it.

SGD (momentum 0.9), batch 128, lr 0.1, weight decay 2e-4 (the papers' choice; He et al. use 1e-4),
164 epochs with lr / 10 at epochs 81 and 122 (``--epochs`` scales both milestones), and for depth >= 110
a warm-up at lr 0.01 for the first 400 iterations. Augmentation: pad 4, random 32x32 crop, horizontal
flip (off for digits), per-channel normalisation. The loop below is the whole of training.

Under torchrun (see ``skiplab.distributed``) the batch stays ``batch_size`` images, the union over the
ranks: every rank draws the same permutation and augmentation and takes its share of the union batch, and
its loss is scaled so that DDP's average of the ranks' gradients is the gradient of the union's mean
loss (:func:`share_loss`). N processes thus compute on the images one process would, and with
``sync_bn`` (BatchNorm statistics over the union) make its updates.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..data import ImageData, augment_batch, load_image_dataset, normalise
from .. import distributed, run_dir
from ..config import check_bounds
from ..models import PRESETS, PreActResNetConfig, build_model, family_of, format_model_spec, model_config, \
    model_from_checkpoint, parse_model_spec
from ..device import pick_device
from .run import Run

PAPER_EPOCHS, PAPER_MILESTONES = 164, (81, 122)


@dataclass(frozen=True)
class ImageTrainConfig:
    """Everything that decides an image-classification run; saved as config.json beside its results."""

    model: str = field(default="preact-resnet20", metadata={
        "help": "model spec: a preset, optionally with options, e.g. preact-resnet110(connection=2rSkip+LN); "
                "the model options below add to it"})
    dataset: str = field(default="cifar10", metadata={"help": "cifar10, cifar100, fashion-mnist or mnist"})
    data_dir: str = field(default="", metadata={"help": "where the dataset files are ('' = the default place)"})
    epochs: int = field(default=PAPER_EPOCHS, metadata={"min": 1, "help": "epochs; the lr milestones scale with it"})
    batch_size: int = field(default=128, metadata={"min": 1, "help": "mini-batch size"})
    lr: float = field(default=0.1, metadata={"help": "peak learning rate"})
    momentum: float = field(default=0.9, metadata={"min": 0.0, "help": "SGD momentum"})
    weight_decay: float = field(default=2e-4, metadata={
        "min": 0.0, "help": "L2 weight decay (2e-4 as the papers; 1e-4 as He et al.)"})
    warmup_iters: int = field(default=-1, metadata={"min": -1, "help": "iterations at lr 0.01 first; -1 = 400 for depth >= 110, else 0"})
    seed: int = field(default=1, metadata={"help": "seed for initialisation, subsets, shuffling and augmentation"})
    train_subset: int = field(default=0, metadata={"min": 0, "help": "train on a fixed random subset of N images (0 = all)"})
    test_subset: int = field(default=0, metadata={"min": 0, "help": "evaluate on a fixed random subset of N test images (0 = all)"})
    device: str = field(default="auto", metadata={"help": "cpu, cuda, cuda:1, or auto"})
    amp: bool = field(default=True, metadata={"help": "bf16 autocast on CUDA (ignored on CPU)"})
    sync_bn: bool = field(default=False, metadata={
        "help": "under torchrun, BatchNorm statistics over the whole batch of every process (no effect in one)"})
    compile: bool = field(default=False, metadata={"help": "run the model through torch.compile"})
    out: str = field(default="runs/image", metadata={"help": "run directory"})

    def __post_init__(self):
        check_bounds(self)
        if self.lr <= 0:
            raise ValueError(f"--lr must be > 0, got {self.lr}")
        if not 0 <= self.momentum < 1:  # at 1 or past it the velocity never decays: the steps grow without bound
            raise ValueError(f"--momentum must be in [0, 1), got {self.momentum:g}")
        if family_of(self.model) is not PreActResNetConfig:
            raise ValueError(f"{self.model} is not an image model; known: "
                             f"{', '.join(n for n, (c, _) in PRESETS.items() if c is PreActResNetConfig)}")
        model_config(self.model)  # a bad spec or option fails here, before anything is written

    def model_config(self, in_channels: int, num_classes: int) -> PreActResNetConfig:
        """The model's config, resolved from the spec, for images of ``in_channels`` and ``num_classes``. The data
        set both: a spec that sets either to another value is refused (it was overridden, and recorded)."""
        _, options = parse_model_spec(self.model)
        for key, value, what in (("in_channels", in_channels, "channels"), ("num_classes", num_classes, "classes")):
            if key in options and str(options[key]).strip() != str(value):
                raise ValueError(f"--model {self.model} sets {key}={options[key]}, but {self.dataset} has {value} "
                                 f"{what if value != 1 else what[:-1]}: the data set it; leave {key} out")
        return model_config(self.model, in_channels=in_channels, num_classes=num_classes)

    @staticmethod
    def upgrade(stored: dict[str, Any]) -> dict[str, Any]:
        """A stored config in today's form. Runs written before the model spec held the connection and width
        have them as fields of their own, which won over the spec's: they move into the spec, as trained."""
        stored = dict(stored)
        legacy = {k: stored.pop(k) for k in ("connection", "width") if k in stored}
        if legacy:
            name, options = parse_model_spec(stored.get("model", "preact-resnet20"))
            preset = model_config(name)
            options.update({k: str(v) for k, v in legacy.items()})
            options = {k: v for k, v in options.items() if k not in legacy or legacy[k] != getattr(preset, k)}
            stored["model"] = format_model_spec(name, options)
        return stored


def milestones(epochs: int) -> tuple[int, int]:
    """The epochs at which lr drops ten-fold: 81 and 122 of 164, scaled to ``epochs``; the second at least one
    epoch after the first (at 2 epochs both rounded to 1, and lr went from 0.1 to 0.001 with no 0.01 phase)."""
    first, second = (max(1, round(m * epochs / PAPER_EPOCHS)) for m in PAPER_MILESTONES)
    return first, max(second, first + 1)


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


def chosen(cfg: ImageTrainConfig, data: ImageData) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The training and test images ``cfg``'s run reads (``--train-subset``, ``--test-subset``; None: all)."""
    return (subset(len(data.train_y), cfg.train_subset, cfg.seed),
            subset(len(data.test_y), cfg.test_subset, cfg.seed + 10_000))


@torch.no_grad()
def evaluate(model, x_u8: torch.Tensor, y: torch.Tensor, data: ImageData, device, amp: bool, batch: int = 500,
             group: distributed.Group = distributed.Group()):
    """(mean cross-entropy, error %) of ``model`` on uint8 images ``x_u8``.

    Under torchrun rank r scores batches r, r + N, ...; the per-batch sums are gathered and added in batch
    order, so the result is the single process's to the bit (for the same weights)."""
    model.eval()
    scores = []
    for k, i in enumerate(range(0, len(y), batch)):
        if k % group.world_size != group.rank:
            continue
        xb = normalise(x_u8[i : i + batch].to(device), data.mean, data.std)
        yb = y[i : i + batch].to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(xb)
        loss = F.cross_entropy(logits.float(), yb, reduction="sum").item()
        scores.append((k, loss, (logits.argmax(1) != yb).sum().item()))
    loss_sum, wrong = 0.0, 0
    for _, loss, n_wrong in sorted(s for rank_scores in group.gather(scores) for s in rank_scores):
        loss_sum, wrong = loss_sum + loss, wrong + n_wrong
    model.train()
    return loss_sum / len(y), 100.0 * wrong / len(y)


def share_loss(logits: torch.Tensor, y: torch.Tensor, union: int, group: distributed.Group) -> torch.Tensor:
    """The loss whose gradient this rank contributes: with N ranks each holding a share of a batch of
    ``union`` images, N/union · Σ_share CE, so that DDP's mean over the ranks is the gradient of
    (1/union) Σ_union CE, the single process's mean cross-entropy. One process: the mean itself."""
    if not group.active:
        return F.cross_entropy(logits.float(), y)
    return F.cross_entropy(logits.float(), y, reduction="sum") * (group.world_size / union)


def build(cfg: ImageTrainConfig, data: ImageData):
    mcfg = cfg.model_config(data.channels, data.num_classes)
    torch.manual_seed(cfg.seed)
    return mcfg, build_model(mcfg)


def check_shares(n: int, batch_size: int, group: distributed.Group) -> None:
    """Every rank needs an image of every batch (BatchNorm cannot normalise an empty share)."""
    last = n % batch_size
    if group.active and (batch_size < group.world_size or 0 < last < group.world_size):
        raise ValueError(f"{group.world_size} processes need at least {group.world_size} images in every batch: "
                         f"--batch-size {batch_size} over {n} training images leaves a batch of "
                         f"{min(batch_size, last or batch_size)}; change --batch-size or --train-subset")


def train(cfg: ImageTrainConfig, resume: bool = False, overwrite: bool = False, progress: bool = True) -> dict[str, Any]:
    """Train as ``cfg`` says, writing the run directory (rank 0 alone, under torchrun); return the summary."""
    group, device = distributed.setup(pick_device(cfg.device))
    data = group.main_first(lambda: load_image_dataset(cfg.dataset, cfg.data_dir or None))  # rank 0 downloads
    for flag, k, n, split in (("--train-subset", cfg.train_subset, len(data.train_y), "training"),
                              ("--test-subset", cfg.test_subset, len(data.test_y), "test")):
        if k > n:  # it was the whole split, recorded as asked
            raise ValueError(f"{flag} {k} is more than {cfg.dataset}'s {n:,} {split} images (0: all of them)")
    cfg.model_config(data.channels, data.num_classes)  # a spec that contradicts the data fails here, first
    train_idx, test_idx = chosen(cfg, data)
    train_x, train_y = (data.train_x, data.train_y) if train_idx is None else (data.train_x[train_idx], data.train_y[train_idx])
    test_x, test_y = (data.test_x, data.test_y) if test_idx is None else (data.test_x[test_idx], data.test_y[test_idx])
    check_shares(len(train_y), cfg.batch_size, group)
    run = Run(cfg, "image", group, device, resume=resume, overwrite=overwrite)
    ckpt = run.resume(upgrade=ImageTrainConfig.upgrade)
    amp = run.amp

    mcfg, model = build(cfg, data)
    model.to(device)
    if group.rank:
        torch.manual_seed(cfg.seed + group.rank)  # each rank its own random stream; rank 0 goes on with the seed's
    if cfg.sync_bn and group.active:
        distributed.sync_batch_norm(model)
    net = run.compile(model)  # evaluates; ``model`` keeps the plain parameter names
    example = normalise(train_x[:2], data.mean, data.std).to(device)
    train_net = distributed.data_parallel(net, group, example)  # trains
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    run.attach(model, mcfg, opt)
    gen = torch.Generator().manual_seed(cfg.seed)  # shuffling and augmentation, the same on every rank
    start_epoch, step, best = 0, 0, math.inf

    if ckpt:
        run.restore(ckpt, key="epoch")
        gen.set_state(ckpt["rng"]["data"])
        start_epoch, step, best = ckpt["epoch"], ckpt["step"], ckpt["best_error"]
    else:
        run.profile(model, lambda: model(normalise(train_x[: cfg.batch_size], data.mean, data.std).to(device)))
        run.write_config({
            "data": {"name": data.name, "train": len(train_y), "test": len(test_y), "mean": data.mean, "std": data.std},
            "milestones": milestones(cfg.epochs)})

    steps_per_epoch = math.ceil(len(train_y) / cfg.batch_size)
    bar = tqdm(range(start_epoch, cfg.epochs), initial=start_epoch, total=cfg.epochs, desc=Path(cfg.out).name,
               unit="epoch", disable=not (progress and group.main))
    model.train()
    for epoch in bar:
        t0, loss_sum, wrong, seen = time.time(), 0.0, 0, 0
        perm = torch.randperm(len(train_y), generator=gen)
        for i in range(steps_per_epoch):
            idx = perm[i * cfg.batch_size : (i + 1) * cfg.batch_size]  # the batch; this rank takes its share
            mine = group.part(len(idx))
            xb = normalise(augment_batch(train_x[idx], gen, flip=data.flip)[mine], data.mean, data.std).to(device)
            yb = train_y[idx][mine].to(device)
            lr = learning_rate(cfg, mcfg.depth, epoch, step)
            for pg in opt.param_groups:
                pg["lr"] = lr
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                logits = train_net(xb)
            loss = share_loss(logits, yb, len(idx), group)
            (batch_loss,) = group.sum([loss.item()])  # the batch's mean loss, times the number of ranks
            batch_loss /= group.world_size
            if not math.isfinite(batch_loss):
                bar.close()
                return run.diverged(batch_loss, epoch + 1, step + 1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            loss_sum += batch_loss * len(idx)
            wrong += (logits.argmax(1) != yb).sum().item()
            seen += len(idx)
        (wrong,) = group.sum([wrong])
        test_loss, test_error = evaluate(net, test_x, test_y, data, device, amp, group=group)
        if not math.isfinite(test_loss):  # the last updates left weights that are not finite: no error to read
            bar.close()
            return run.diverged(test_loss, epoch + 1, step, what="test loss")
        record = {"epoch": epoch + 1, "step": step, "lr": lr, "train_loss": loss_sum / seen,
                  "train_error": 100.0 * wrong / seen, "test_loss": test_loss, "test_error": test_error,
                  "time": time.time() - t0}
        improved = test_error < best
        best = min(best, test_error)
        run.save(run.checkpoint(record, rng={"data": gen.get_state()}, epoch=epoch + 1, step=step, best_error=best,
                                data_stats={"mean": list(data.mean), "std": list(data.std)}), improved)
        bar.set_postfix(loss=f"{record['train_loss']:.3f}", test_err=f"{test_error:.2f}%", lr=f"{lr:g}")
    bar.close()
    return run.finish(lambda last: {"steps": last["step"], "epochs": cfg.epochs,
                                    "final_test_error": last["test_error"], "final_test_loss": last["test_loss"],
                                    "best_test_error": best})


def load_trained(path: str | Path):
    """(config, model in eval mode, checkpoint) from a run directory or checkpoint file."""
    ckpt = run_dir.load_checkpoint(path, kind="image")
    model = model_from_checkpoint(ckpt, path)
    try:
        cfg = ImageTrainConfig(**ImageTrainConfig.upgrade(ckpt["config"]))
    except (TypeError, ValueError) as err:
        raise run_dir.RunDirError(f"{path}: the checkpoint's config is not an image run's ({err})") from None
    return cfg, model.eval(), ckpt


def evaluate_checkpoint(path: str | Path, data_dir: str = "", device: str = "auto") -> dict[str, Any]:
    """Test loss and error of a trained checkpoint on its dataset's full test set."""
    cfg, model, ckpt = load_trained(path)
    dev = pick_device(device)
    data = load_image_dataset(cfg.dataset, data_dir or cfg.data_dir or None)
    loss, error = evaluate(model.to(dev), data.test_x, data.test_y, data, dev, cfg.amp and dev.type == "cuda")
    return {"checkpoint": str(path), "epoch": ckpt["epoch"], "connection": model.cfg.connection, "model": cfg.model,
            "dataset": cfg.dataset, "test_images": len(data.test_y), "test_loss": loss, "test_error": error}
