"""The runs a table needs: where each lives, which are missing, and training those (one by one or side by side).

A run is one config and seed. It lives in ``<root>/<name>-<key>/seed<k>/``: ``name`` says what it is
(``fashion-mnist_preact-resnet20_2rSkip+LN``), ``key`` is the first 8 hex digits of the SHA-1 of its config
without the seed and the fields that do not change what is trained (where it is written, where the data
is, the device), and of the model config its spec resolves to (so a preset whose defaults change, such as
the depth-wise LSTM's initialisation, names new runs). Two tables that need the same run thus find the
same directory, and a run with any other setting gets its own. A finished (or diverged) run is reused as it is; one cut short is resumed from its
last checkpoint, exactly as ``compare`` does.

Training what is missing, one by one or side by side, and scoring each run as it ends: :mod:`skiplab.tasks.parallel`
(``state``, ``train_missing``, ``score_run``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from .. import run_dir
from ..models import model_config
from ..tasks import get as get_task, run_name
from ..tasks.parallel import check_same, score_run, state, train_missing, train_time

__all__ = ["check_same", "key", "keyed_model", "label", "placed", "run_path", "score_run", "state", "train_missing",
           "train_time"]

NOT_TRAINED = ("seed", *run_dir.PLACE)


def key(cfg: Any) -> str:
    """8 hex digits naming a config's run (seed, output, data place and device aside) and its resolved model.

    A model field added after runs were keyed names in its metadata (``older_runs``) the value every earlier run
    had; the key leaves the field out at that value, so those runs keep their directories (the GPT's ``norm``:
    LN, as every GPT was before it), and a run with any other value gets its own. A training config's fields
    added later do the same (the LM's ``decay``, ``decay_shape``)."""
    fields = {k: v for k, v in keyed_model(cfg).items() if k not in NOT_TRAINED}
    fields["resolved_model"] = keyed_model(model_config(cfg.model))
    return hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:8]


def keyed_model(model: Any) -> dict[str, Any]:
    """A model (or training) config's fields as a run key sees them: those at their ``older_runs`` value left
    out."""
    older = {f.name: f.metadata["older_runs"] for f in dataclasses.fields(model) if "older_runs" in f.metadata}
    return {k: v for k, v in dataclasses.asdict(model).items() if k not in older or v != older[k]}


def label(task: str, cfg: Any) -> str:
    """What a run is, for its directory name (the task's :meth:`~skiplab.tasks.base.Task.run_label`)."""
    return run_name("_".join(get_task(task).run_label(cfg)))


def run_path(root: Path, task: str, cfg: Any) -> Path:
    """The directory of ``cfg``'s run (its seed included) under ``root``."""
    return root / f"{label(task, cfg)}-{key(cfg)}" / f"seed{cfg.seed}"


def placed(root: Path, task: str, cfg: Any) -> Any:
    """``cfg`` writing to its directory under ``root``."""
    return dataclasses.replace(cfg, out=str(run_path(root, task, cfg)))
