"""A task's options on the command line: its training config from them (``--resume``: the stored run's, with what
was given changed) and its model families' config fields as options that add to ``--model``'s spec.

Model options given on the command line add to the model spec (``--model dwlstm-small --share all`` is
``dwlstm-small(share=all)``); one the family lacks, or one the spec already sets otherwise, is an error.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any
from pathlib import Path

from .. import config, run_dir
from ..models import model_config, with_options
from . import get
from .model_options import family_options, given_family_options

def train_config(cls, args: argparse.Namespace):
    """The config from the options, model options added to its spec; with --resume, the stored run's config
    with only the options given changed (and --out, where the run is now)."""
    if not getattr(args, "resume", False):
        cfg = config.from_arguments(cls, args)
        return dataclasses.replace(cfg, model=with_model_options(cfg.model, args))
    if getattr(args, "overwrite", False):
        raise run_dir.RunDirError("--resume and --overwrite exclude each other")
    out = getattr(args, "out")
    if (Path(out) / run_dir.REPLACED).is_dir() and not (Path(out) / "config.json").is_file():
        # an --overwrite killed before its config.json: the run it was replacing, set aside, is the one to resume
        run_dir.hold(Path(out))  # (refused where that --overwrite is still running)
        try:
            run_dir.put_back(Path(out))
        finally:
            run_dir.release(Path(out))
    try:
        payload = run_dir.read_json(Path(out) / "config.json")
        stored = payload["config"]
    except FileNotFoundError:
        why = ("its run stopped before writing config.json; start it again without --resume"
               if run_dir.failed_start(Path(out)) else "no config.json there")
        raise run_dir.RunDirError(f"nothing to resume in {out}: {why}") from None
    stored = getattr(cls, "upgrade", dict)(stored)
    given = config.absolute({name: getattr(args, name) for name in config.given(args, cls)})
    given["out"] = out
    stale = sorted(set(stored) - {f.name for f in dataclasses.fields(cls)})
    kind = payload.get("kind") or (run_dir.run_kind(Path(out)) if stale else None)
    task = getattr(args, "task", None)
    if kind and task and kind != task:
        raise run_dir.RunDirError(f"{out} holds a {kind} run, which `skiplab train {kind} --resume` continues, "
                                  f"not `train {task}`")
    if stale:
        raise run_dir.RunDirError(f"{out} was written by an older skiplab (its config has {', '.join(stale)}); "
                                  "it cannot be resumed by this one")
    stored = {k: tuple(v) if isinstance(v, list) else v for k, v in stored.items()}
    cfg = cls(**{**stored, **given})
    model = with_model_options(cfg.model, args)
    before = stored.get("model")
    if before and model != before and model_config(model) == model_config(before):  # the run's model written
        # another way (a preset's own value named, or left out: --width 1 on preact-resnet20): the stored spec, which
        # the resumed run is checked against
        model = before
    return dataclasses.replace(cfg, model=model)


def model_options(task: str) -> dict[str, tuple[dataclasses.Field, type, list[str]]]:
    """name -> (field, type, the families that have it), over the task's model families' configs."""
    return family_options(get(task).families())


def add_model_options(p: argparse.ArgumentParser, task: str, skip: tuple[str, ...] = ()) -> None:
    group = p.add_argument_group("model options", "fields of the model's config; each adds to --model's spec "
                                                  "(default: the preset's value)")
    every = len(get(task).families())
    p.set_defaults(model_options=task)
    for name, (f, tp, families) in model_options(task).items():
        if name in skip:
            continue
        only = "" if len(families) == every else f" [{', '.join(families)} only]"
        kind = _spec_text if name == "connection" else config.parser_for(tp)
        group.add_argument("--" + name.replace("_", "-"), dest=name, type=kind, default=None,
                           metavar=name.upper(), help=f"{f.metadata.get('help', '')}{only}")


def _spec_text(text: str) -> str:
    """``--connection``: the spec without the spaces the grammar ignores (``2xSkip + LN`` is ``2xSkip+LN``), so that
    the run records, and a later command compares, one spelling."""
    return "".join(text.split())


def given_model_options(args: argparse.Namespace) -> dict[str, Any]:
    """The model options given on the command line, by field name."""
    task = getattr(args, "model_options", None)
    return given_family_options(args, get(task).families()) if task else {}


def with_model_options(spec: str, args: argparse.Namespace) -> str:
    """``spec`` with the model options given on the command line added (a value the spec sets otherwise is an
    error naming both)."""
    given = given_model_options(args)
    return with_options(spec, **given) if given else spec
