"""The outside loggers a run's per-step lines also go to (``--logger tensorboard,wandb,trackio``); each package is
imported only when its logger is asked for, and a missing one is a one-line ImportError naming it. The run's
``steps.jsonl`` stays the record (:mod:`skiplab.train.telemetry`); a logger gets each line as it is made, and with
``--log-layers`` the per-layer figures as scalars ``layers/<sub-layer>/<quantity>`` (layers.jsonl stays their
record: :mod:`skiplab.train.layer_telemetry`).

    tensorboard   ``torch.utils.tensorboard.SummaryWriter`` in RUN/tensorboard: a scalar ``train/<key>`` per
                  number of the line at its step; a resumed run opens it with ``purge_step`` = the step after its
                  checkpoint, so TensorBoard drops what a killed run wrote past it
    wandb         ``wandb.init(project="skiplab", name=RUN's name, id=a digest of RUN's path, resume="allow",
                  dir=RUN, config=the run's config)``, ``wandb.log(line, step=step)``; offline with
                  ``WANDB_MODE=offline`` (files in RUN/wandb)
    trackio       ``trackio.init(project="skiplab", name=RUN's name, config=the run's config)``, ``trackio.log``
"""

from __future__ import annotations

import hashlib
import importlib
from pathlib import Path
from typing import Any

LOGGERS = ("tensorboard", "wandb", "trackio")
PACKAGE = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}


def parse_loggers(spec: str) -> tuple[str, ...]:
    """``--logger``'s names, checked (a one-line ValueError naming an unknown one); () for ''."""
    names = tuple(n.strip() for n in spec.split(",") if n.strip())
    unknown = [n for n in names if n not in LOGGERS]
    if unknown:
        raise ValueError(f"--logger: unknown logger {unknown[0]!r}; known: {', '.join(LOGGERS)}")
    return names


def _require(name: str) -> Any:
    try:
        return importlib.import_module(PACKAGE[name])
    except ImportError:
        raise ImportError(f"--logger {name} needs the {PACKAGE[name]} package: pip install {PACKAGE[name]}") from None


class Loggers:
    """The loggers ``names`` of the run in ``out`` (its ``config`` for those that keep one); ``resume_step``: the
    step of the checkpoint a resumed run goes on from (0 for a fresh run)."""

    def __init__(self, names: tuple[str, ...], out: Path, config: dict[str, Any], resume_step: int = 0) -> None:
        for name in names:  # every package there before any logger starts
            _require(name)
        self.names, self.out = names, Path(out)
        self.writer = self.wandb = self.trackio = None
        if "tensorboard" in names:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.out / "tensorboard"),
                                        **({"purge_step": resume_step + 1} if resume_step else {}))
        if "wandb" in names:
            wandb = _require("wandb")
            run_id = hashlib.sha1(str(self.out.resolve()).encode()).hexdigest()[:12]
            self.wandb = wandb.init(project="skiplab", name=self.out.name, id=run_id, resume="allow",
                                    dir=str(self.out), config=config, reinit="finish_previous")
        if "trackio" in names:
            self.trackio = _require("trackio")
            self.trackio.init(project="skiplab", name=self.out.name, config=config)

    def log(self, line: dict[str, Any]) -> None:
        """A steps.jsonl line: a scalar ``train/<key>`` per number in it."""
        numbers = {k: v for k, v in line.items() if k != "step" and isinstance(v, (int, float))}
        self.scalars({f"train/{k}": v for k, v in numbers.items()}, line["step"])

    def scalars(self, values: dict[str, float], step: int) -> None:
        """Scalars by their full names (``layers/0.attn/grad_norm``: :mod:`skiplab.train.layer_telemetry`) at
        ``step``."""
        values = {k: float(v) for k, v in values.items()}
        if self.writer is not None:
            for key, value in values.items():
                self.writer.add_scalar(key, value, step)
        if self.wandb is not None:
            self.wandb.log(values, step=step)
        if self.trackio is not None:
            self.trackio.log(values, step=step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.wandb is not None:
            self.wandb.finish()
        if self.trackio is not None:
            self.trackio.finish()


def open_loggers(spec: str, out: Path, config: dict[str, Any], resume_step: int = 0) -> Loggers | None:
    """The loggers ``spec`` names for the run in ``out``, or None where it names none."""
    names = parse_loggers(spec)
    return Loggers(names, out, config, resume_step) if names else None
