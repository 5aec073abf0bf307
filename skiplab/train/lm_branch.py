"""Branching a warm-up-stable-decay run: a new run directory going on from a step checkpoint of the stable phase,
to be decayed to another budget (``train lm --branch``), and the check that a resumed wsd run may change its budget.
"""

from __future__ import annotations

import dataclasses
import filecmp
import json
import shutil
from pathlib import Path
from typing import Any

from .. import run_dir
from .lm_config import BUDGET, LMTrainConfig


# What a branch's command may set besides --max-steps: where the run is and what it logs (a resume may change them
# too) and how many checkpoints it keeps; every other option is the checkpoint's.
BRANCH_MAY_SET = (*run_dir.PLACE, *BUDGET)


def check_branch(ckpt: dict[str, Any], cfg: LMTrainConfig) -> None:
    """A wsd run goes on to another budget only from its stable phase: every update it made had the lr of both
    budgets (its step <= both stable ends); else a one-line error."""
    _check_stable(ckpt, cfg.max_steps, str(cfg.out))


def _check_stable(ckpt: dict[str, Any], max_steps: int, where: str) -> None:
    before, decay = ckpt["config"]["max_steps"], ckpt["config"].get("decay", 0.2)
    last = min(before - round(decay * before), max_steps - round(decay * max_steps))
    if ckpt["step"] > last:
        raise run_dir.RunDirError(
            f"{where}: the checkpoint is at update {ckpt['step']}, past the stable phase (to update {last}) that "
            f"--max-steps {before} and {max_steps} share; branch from a checkpoint at or before it")


def branch(source: str | Path, out: str | Path, overwrite: bool = False, max_steps: int = 0) -> Path:
    """A new run directory ``out`` going on from the step checkpoint ``source`` of a wsd run (``train lm --branch``):
    the checkpoint as its last.pt, its config.json, its metrics and steps (which the resume cuts at the checkpoint);
    ``train lm --resume --out OUT --max-steps M`` then decays it to M updates (``max_steps``).

    Everything is checked before anything is written or removed: the checkpoint (a wsd run's, in its stable phase
    for ``max_steps``), the config.json beside it (the config of the run that wrote it), and ``out``, which is
    replaced only with ``overwrite`` and only where it holds a run (as :func:`run_dir.prepare` rules). A branch of
    the same checkpoint that has not saved since it was made (its start failed) is made again without
    ``overwrite``, so that the same command runs once its input is fixed. The source is not changed."""
    source, out = Path(source), Path(out)
    if source.is_dir():
        source = source / "last.pt"
    ckpt = run_dir.load_checkpoint(source, kind="lm")
    if ckpt["config"].get("schedule") != "wsd":
        raise ValueError(f"{source}: a run of the {ckpt['config'].get('schedule')} schedule; --branch takes a "
                         "checkpoint of a --schedule wsd run")
    _check_stable(ckpt, max_steps or ckpt["config"]["max_steps"], str(source))
    beside = source.parent / "config.json"
    if not beside.is_file():
        raise FileNotFoundError(f"{beside}: no such file; --branch takes a step checkpoint inside the directory of "
                                "the run that wrote it (its config.json beside it)")
    stored = run_dir.read_json(beside)
    if not isinstance(stored, dict) or not isinstance(stored.get("config"), dict):
        raise run_dir.RunDirError(f"{beside}: not a run's config.json (no \"config\" object)")
    defaults = {f.name: f.default for f in dataclasses.fields(LMTrainConfig)}
    other = run_dir.changed_settings({**defaults, **stored["config"]}, {**defaults, **ckpt["config"]},
                                     ignore=run_dir.PLACE + BUDGET + ("max_steps",))
    if other:
        raise run_dir.RunDirError(f"{beside}: the config of another run than {source.name}'s (different "
                                  f"{', '.join(other)}); --branch takes a step checkpoint inside the directory of "
                                  "the run that wrote it")
    again = _unsaved_branch(out, source)
    if not again and out.exists() and any(p.name != run_dir.LOCK for p in out.iterdir()):
        if not overwrite:
            raise run_dir.RunDirError(f"{out} exists; use --overwrite to replace it")
        if not (out / "config.json").is_file():
            raise run_dir.RunDirError(f"{out} is not a skiplab run directory (no config.json); refusing to "
                                      "overwrite it")
    if again:
        print(f"{out}: a branch of {source} that has not saved since it was made; made again")
    run_dir.prepare(out, overwrite=True)  # held by this process (and the training that follows); its files removed
    step = ckpt["step"]
    run_dir.write_config(out, {**stored, "branched_from": {"checkpoint": str(source.resolve()), "step": step}})
    for name in ("metrics.jsonl", run_dir.STEPS_FILE, run_dir.LAYERS_FILE):  # whole: the resume cuts them
        if (source.parent / name).is_file():
            shutil.copyfile(source.parent / name, out / name)
    shutil.copyfile(source, out / "last.pt")
    return out


def _unsaved_branch(out: Path, source: Path) -> bool:
    """Whether ``out`` holds a branch of the checkpoint ``source`` whose last.pt is still that checkpoint."""
    try:
        made = json.loads((out / "config.json").read_text()).get("branched_from", {})
        return made.get("checkpoint") == str(source.resolve()) and filecmp.cmp(source, out / "last.pt", shallow=False)
    except (OSError, ValueError, AttributeError):
        return False
