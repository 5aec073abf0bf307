"""The task registry: every command asks it what a task does (skiplab.tasks.base.Task).

    image   image classification (skiplab.tasks.image)
    mt      machine translation (skiplab.tasks.mt)
    caption image captioning (skiplab.tasks.caption)
    lm      language modelling (skiplab.tasks.lm)

A new task is one module with a :class:`Task` subclass, added to :data:`TASKS` here.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from .. import config, run_dir
from ..analysis.trained import Trained
from ..models import model_from_checkpoint
from .base import Task
from .caption import CaptionTask
from .image import ImageTask
from .lm import LMTask
from .mt import MTTask
from .variants import Variant, connection_variants, model_variants, run_name

TASKS: dict[str, Task] = {t.name: t for t in (ImageTask(), MTTask(), LMTask(), CaptionTask())}


def get(name: str) -> Task:
    """The task called ``name``; an error naming the known ones."""
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; known: {', '.join(TASKS)}") from None


def load_trained(path: str | Path) -> Trained:
    """The run at ``path`` (a run directory or a checkpoint file of any task) in evaluation mode, on the CPU."""
    ckpt = run_dir.load_checkpoint(path, kind=tuple(TASKS))
    model = model_from_checkpoint(ckpt, path)
    run = Path(path) if Path(path).is_dir() else Path(path).parent
    trained = TASKS[ckpt["kind"]].trained(run, model.eval(), ckpt["config"], ckpt)
    if Path(path).is_file() and Path(path).name != "last.pt":
        trained.source = Path(path)
    return trained


def check_same_run(cfg: Any, advice: str = "use another --out") -> None:
    """An error when ``cfg.out`` holds a run with settings other than ``cfg``'s (where it lives aside:
    :data:`~skiplab.run_dir.PLACE`). A field the stored run lacks (one added to the config since it was written)
    counts as the value its metadata gives every earlier run (``older_runs``)."""
    out = Path(cfg.out)
    if (out / "config.json").is_file():
        older = {f.name: f.metadata["older_runs"] for f in dataclasses.fields(cfg) if "older_runs" in f.metadata}
        stored = {**older, **getattr(type(cfg), "upgrade", dict)(run_dir.read_json(out / "config.json").get("config") or {})}
        new = config.absolute(dataclasses.asdict(cfg))  # data paths compared as absolute ones, on both sides
        diff = run_dir.changed_settings(config.absolute(stored), new, ignore=run_dir.PLACE)
        if diff:
            raise run_dir.RunDirError(f"{out} holds a run with other settings ({', '.join(diff)}); {advice}")


def train_or_resume(task: str, cfg: Any, progress: bool = True) -> dict[str, Any]:
    """Train ``cfg``'s run into ``cfg.out``, resuming it from its last checkpoint when one is there."""
    out = Path(cfg.out)
    resume = (out / "last.pt").is_file()
    run_dir.note_made(out.parent)  # a variant's folder, removed where its run wrote nothing (run_dir.let_go)
    out.parent.mkdir(parents=True, exist_ok=True)
    return get(task).train(cfg, resume=resume, overwrite=not resume and out.exists(), progress=progress)


__all__ = ["TASKS", "Task", "Trained", "Variant", "check_same_run", "connection_variants", "get", "load_trained",
           "model_variants", "run_name", "train_or_resume"]
