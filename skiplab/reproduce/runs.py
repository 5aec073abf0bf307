"""The runs a table needs: where each lives, which are missing, and training those (one by one or side by side).

A run is one config and seed. It lives in ``<root>/<name>-<key>/seed<k>/``: ``name`` says what it is
(``fashion-mnist_preact-resnet20_2rSkip+LN``), ``key`` is the first 8 hex digits of the SHA-1 of its config
without the seed and the fields that do not change what is trained (where it is written, where the data
is, the device), and of the model config its spec resolves to (so a preset whose defaults change, such as
the depth-wise LSTM's initialisation, names new runs). Two tables that need the same run thus find the
same directory, and a run with any other setting gets its own. A finished (or diverged) run is reused as it is; one cut short is resumed from its
last checkpoint, exactly as ``compare`` does.

With ``jobs`` > 1, that many runs train side by side in worker processes, each with
``threads // jobs`` threads (on a 2-core CPU two runs of one thread each keep both cores busy); a worker's
output goes to ``<run>.log`` beside the run directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import multiprocessing
import os
import sys
import threading
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from .. import run_dir
from ..models import model_config
from ..tasks import check_same_run, get as get_task, run_name, train_or_resume

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


def state(cfg: Any) -> str:
    """``finished``, ``diverged``, ``partial`` (a checkpoint to resume from) or ``missing``."""
    out = Path(cfg.out)
    if (out / "summary.json").is_file():
        return run_dir.read_json(out / "summary.json")["status"]
    return "partial" if (out / "last.pt").is_file() else "missing"


def train_time(cfg: Any) -> float:
    """Seconds the run's training took (its summary's ``train_time_s``; 0 when not finished)."""
    out = Path(cfg.out) / "summary.json"
    return float(run_dir.read_json(out).get("train_time_s", 0.0)) if out.is_file() else 0.0


def check_same(cfg: Any) -> None:
    """An error when ``cfg.out`` holds a run with other settings (a directory copied in by hand, say)."""
    check_same_run(cfg, advice="remove it")


def _worker(task: str, cfg: Any, threads: int) -> dict[str, Any]:
    """Train one run in a worker process; its progress bar and any error go to ``<run>.log``, line by line."""
    torch.set_num_threads(threads)
    tqdm.set_lock(threading.RLock())  # tqdm's default lock is a process-shared semaphore, left behind at exit
    log = Path(cfg.out).with_suffix(".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a", buffering=1) as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        return train_or_resume(task, cfg, progress=True)


def train_missing(jobs: list[tuple[str, Any]], workers: int = 1, threads: int | None = None,
                  progress: bool = True) -> dict[str, dict[str, Any]]:
    """Train every run of ``jobs`` ((task, placed config)) not yet finished; return run dir -> summary."""
    todo = [(t, c) for t, c in jobs if state(c) in ("partial", "missing")]
    for _, c in todo:
        check_same(c)
    bar = tqdm(total=len(todo), desc="runs", unit="run", disable=not progress or not todo)
    if workers <= 1 or len(todo) <= 1:
        for task, cfg in todo:
            bar.set_postfix_str(Path(cfg.out).parent.name)
            train_or_resume(task, cfg, progress)
            bar.update()
    else:
        threads = threads or max(1, (os.cpu_count() or 1) // workers)
        pool = multiprocessing.get_context("spawn").Pool(workers, maxtasksperchild=1)
        try:
            pending = [(pool.apply_async(_worker, (t, c, threads)), c) for t, c in todo]
            for handle, cfg in pending:
                try:
                    handle.get()
                except Exception as exc:  # a run's own error, named with its log
                    log = Path(cfg.out).with_suffix(".log")
                    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                    raise RuntimeError(f"run {cfg.out} failed: {first} (its output: {log})") from exc
                bar.update()
            pool.close()
        finally:
            pool.terminate()  # an error or an interrupt here stops the other runs too (each resumes later)
            pool.join()
    bar.close()
    sys.stdout.flush()
    return {c.out: run_dir.read_json(Path(c.out) / "summary.json") for _, c in jobs
            if (Path(c.out) / "summary.json").is_file()}
