"""Training the runs a comparison, sweep or table needs: one by one, or side by side in worker processes.

With ``workers`` > 1, that many runs train side by side, each with ``threads // workers`` threads (on a 2-core CPU
two runs of one thread each keep both cores busy); a worker's output goes to ``<run>.log`` beside the run
directory. A finished (or diverged) run is kept as it is; one cut short resumes from its last checkpoint. The runs
begin in the order given, the next as soon as a worker is free; a run can be scored on the test split right after it
trains, in its own worker (:func:`score_run`), so that scoring never leaves a core waiting.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from .. import run_dir
from . import check_same_run, get, train_or_resume


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


def scored(spec, cfg: Any, progress: bool) -> dict[str, Any]:
    """The summary of ``cfg``'s run, with the task's metric in it where the run finished: scored now from its
    checkpoint where training did not score it (:meth:`~skiplab.tasks.base.Task.score`). A finished run restored
    without its score and without its checkpoint is a one-line error."""
    out = Path(cfg.out)
    summary = run_dir.read_json(out / "summary.json")
    if summary["status"] == "finished" and spec.metric not in summary:
        if not (out / "last.pt").is_file():
            raise run_dir.RunDirError(f"{out}: finished but not scored ({spec.metric}), and its checkpoint (last.pt) "
                                      "is not there to score it from; put it back, or remove the run to train it again")
        summary = spec.score(cfg, summary, progress)
    return summary


def score_run(task: str, cfg: Any) -> None:
    """:func:`scored` for a run just trained (``train_missing``'s ``then``, in the run's own process)."""
    if state(cfg) == "finished":
        scored(get(task), cfg, progress=False)


class RunFailed(ValueError):
    """A run trained in a worker stopped on what a run alone would say in one line (bad input, absent data, a
    package not installed): that line, with the run and its log named."""


def _train(task: str, cfg: Any, progress: bool, then: Callable[[str, Any], Any] | None) -> None:
    train_or_resume(task, cfg, progress)
    if then is not None:
        then(task, cfg)


def _worker(task: str, cfg: Any, threads: int, then: Callable[[str, Any], Any] | None) -> None:
    """Train one run in a worker process (then ``then(task, cfg)`` there); its progress bar and any error go to
    ``<run>.log``, line by line."""
    torch.set_num_threads(threads)
    tqdm.set_lock(threading.RLock())  # tqdm's default lock is a process-shared semaphore, left behind at exit
    log = Path(cfg.out).with_suffix(".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a", buffering=1) as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        _train(task, cfg, True, then)


def _leave_interrupts_to_the_parent() -> None:
    """A worker's initializer: Ctrl-C reaches the whole process group, and a worker that took it printed its own
    traceback to the terminal; the parent alone takes it, says so in one line and stops the workers, with SIGTERM
    (``Pool.terminate``), on which a worker lets go of its run as an interrupted command does (its lock removed, a
    run that ``--overwrite`` was replacing put back: :func:`skiplab.run_dir.let_go`) and exits."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _stopped_by_the_parent)


def _stopped_by_the_parent(signum: int, frame: Any) -> None:
    run_dir.let_go()
    os._exit(128 + signum)  # at once: the pool is going, nothing of this worker's is waited for


def train_missing(jobs: list[tuple[str, Any]], workers: int = 1, threads: int | None = None,
                  progress: bool = True, then: Callable[[str, Any], Any] | None = None) -> dict[str, dict[str, Any]]:
    """Train every run of ``jobs`` ((task, placed config)) not yet finished, in their order, ``workers`` side by
    side (the next run begins as soon as a worker is free); return run dir -> summary. Every run already there,
    finished ones too, is checked first to hold the job's settings (:func:`check_same`): a run trained with
    others (copied in, or trained by hand at the path) is one line naming what differs, not a number counted. ``then(task, cfg)``, a
    module-level function (a worker receives it pickled), runs right after each run trains, in the same process
    (e.g. scoring the run while the other workers train)."""
    for _, c in jobs:  # a finished or diverged run counts as it is: its settings must be the job's too
        check_same(c)
    todo = [(t, c) for t, c in jobs if state(c) in ("partial", "missing")]
    bar = tqdm(total=len(todo), desc="runs", unit="run", disable=not progress or not todo)
    if workers <= 1 or len(todo) <= 1:
        try:
            for task, cfg in todo:
                bar.set_postfix_str(Path(cfg.out).parent.name)
                _train(task, cfg, progress, then)
                bar.update()
        except BaseException:
            bar.leave = False  # the error's line stands alone, not after a bar
            bar.close()
            raise
    else:
        threads = threads or max(1, (os.cpu_count() or 1) // workers)
        pool = multiprocessing.get_context("spawn").Pool(workers, maxtasksperchild=1,
                                                         initializer=_leave_interrupts_to_the_parent)
        try:
            pending = [(pool.apply_async(_worker, (t, c, threads, then)), c) for t, c in todo]
            for handle, cfg in pending:
                try:
                    handle.get()
                except Exception as exc:  # a run's own error, named with its log
                    log = Path(cfg.out).with_suffix(".log")
                    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                    message = f"run {cfg.out} failed: {first} (its output: {log})"
                    if isinstance(exc, (ValueError, OSError, ImportError)):  # bad input, absent data: one line
                        raise RunFailed(message) from None
                    raise RuntimeError(message) from exc
                bar.update()
            pool.close()
        except BaseException:
            bar.leave = False  # the error's line stands alone, not after a bar
            bar.close()
            raise
        finally:
            pool.terminate()  # an error or an interrupt here stops the other runs too (each resumes later)
            pool.join()
    bar.close()
    sys.stdout.flush()
    return {c.out: run_dir.read_json(Path(c.out) / "summary.json") for _, c in jobs
            if (Path(c.out) / "summary.json").is_file()}
