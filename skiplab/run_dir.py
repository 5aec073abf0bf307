"""The run-directory contract shared by every training command.

    OUT/config.json     the resolved config, the model's config, data facts and the environment
    OUT/metrics.jsonl   one JSON record per epoch (or evaluation)
    OUT/last.pt         the latest checkpoint: what --resume continues from; the final one after the run
    OUT/best.pt         the checkpoint with the best validation/test metric
    OUT/summary.json    written once the run ends: status "finished" or "diverged", final metrics
    OUT/checkpoint_<step>.pt   step checkpoints of a translation run, averaged for evaluation
    OUT/.lock           while a process trains OUT: held by it, naming it; a second process is refused

A directory that holds a run is never overwritten silently: ``--resume`` continues it, ``--overwrite``
replaces it, anything else is an error. Checkpoints are written atomically (temp file + rename) and
read with ``weights_only=True``: no code in a checkpoint is ever run.

Where a run lives is not part of what it is: the fields of :data:`PLACE` (its directory, its data's
directory, its device) may differ when a run is resumed, so a run directory can be moved or copied from
another machine and resumed there. The checkpoint is the truth on resume: metrics.jsonl keeps the records
the checkpoint covers (the checkpoint holds its own record too, restored where the file lost it) and
drops the rest, a last line torn by a killed process included, saying what it dropped.
"""

from __future__ import annotations

import json
import os
import pickle
import platform
import re
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

import torch
from torch import Tensor

from . import host

try:
    import fcntl
except ImportError:  # Windows: run directories are not locked
    fcntl = None

RUN_FILES = ("config.json", "metrics.jsonl", "last.pt", "best.pt", "summary.json")
STEPS_FILE = "steps.jsonl"  # per-step telemetry (skiplab.train.telemetry)
LAYERS_FILE = "layers.jsonl"  # per-layer telemetry (skiplab.train.layer_telemetry)
# config fields that say where a run is, how it is watched and how it is computed where the numbers stay the
# same (activation checkpointing), not what it trains
PLACE = ("out", "data_dir", "device", "log_every", "log_layers", "logger", "activation_checkpointing")


class RunDirError(ValueError):
    """A run directory that cannot be used as asked."""


STARTED = ".started"  # OUT/.started: written by a fresh run, removed with its config.json (:func:`write_config`)


def failed_start(out: Path) -> bool:
    """Whether ``out`` holds what a run wrote before it stopped short of its config.json (a tokenizer trained, then
    bad data or a kill): only that run's files, which the next run in ``out`` replaces without being asked."""
    return (out / STARTED).is_file() and not (out / "config.json").is_file()


def _check(out: Path, resume: bool, overwrite: bool) -> bool:
    """Whether ``out`` may be used as asked (else a RunDirError); True where its files are to be replaced."""
    if resume and overwrite:
        raise RunDirError("--resume and --overwrite exclude each other")
    if out.exists() and not out.is_dir():
        raise RunDirError(f"{out} is a file; --out names a run directory")
    if any(p.exists() and not p.is_dir() for p in out.parents):
        raise RunDirError(f"{next(p for p in out.parents if p.exists() and not p.is_dir())} is a file, not a folder "
                          f"that {out} can be made in")
    if resume:  # config.json alone: a run stopped before its first save, which starts again (Run.resume)
        if not ((out / "last.pt").is_file() or (out / "config.json").is_file()):
            if failed_start(out):
                raise RunDirError(f"nothing to resume in {out}: its run stopped before writing config.json; "
                                  "start it again without --resume")
            raise RunDirError(f"nothing to resume in {out}: neither last.pt nor config.json there")
        return False
    if not (out.exists() and any(p.name != LOCK for p in out.iterdir())):
        return False
    if failed_start(out):
        return True
    if not (out / "config.json").is_file():  # guard against wiping a directory that is not a run
        raise RunDirError(f"{out} holds files but no skiplab run (no config.json); give --out a new or empty folder"
                          if not overwrite else
                          f"{out} is not a skiplab run directory (no config.json); refusing to overwrite it")
    if not overwrite:
        raise RunDirError(f"{out} already holds files; use --resume to continue that run or --overwrite to replace it")
    return True


def prepare(out: str | Path, resume: bool = False, overwrite: bool = False) -> Path:
    """Make ``out`` ready for a run: fresh, resumed (it holds last.pt, or config.json alone: a run stopped before
    its first save) or replaced (``overwrite``, or where a run stopped before its config.json: :func:`failed_start`),
    and held by this process (:func:`hold`) until :func:`release`. Checked before anything is written, and again once
    held (another process may have written there in between)."""
    out = Path(out)
    _check(out, resume, overwrite)
    _made.update(p.resolve() for p in (out, *out.parents) if not p.exists())  # the folders mkdir makes
    out.mkdir(parents=True, exist_ok=True)
    hold(out)
    try:
        put_back(out)  # a replacement killed before its config.json: the run it replaced is there again
        if _check(out, resume, overwrite):
            if (out / "config.json").is_file():  # a run: kept aside until its replacement writes config.json
                set_aside(out)
            else:
                clear(out)
        if not (resume or (out / "config.json").is_file()):
            (out / STARTED).touch()
    except BaseException:
        release(out)
        raise
    return out


def write_config(out: Path, payload: dict[str, Any]) -> None:
    """OUT/config.json of a fresh run: from now on ``out`` holds a run (:func:`failed_start` no longer), and the run
    it replaces (``--overwrite``, :func:`set_aside`) is gone."""
    write_json(out / "config.json", payload)
    (out / STARTED).unlink(missing_ok=True)
    shutil.rmtree(out / REPLACED, ignore_errors=True)


# OUT/.replaced: the files of the run that ``--overwrite`` replaces, kept until the new run has checked its data and
# model and written its config.json; a start that fails or is interrupted before then puts them back
REPLACED = ".replaced"


def set_aside(out: Path) -> None:
    """Move the run in ``out`` (all but the lock) into ``out``/.replaced."""
    aside = out / REPLACED
    shutil.rmtree(aside, ignore_errors=True)
    aside.mkdir()
    for path in out.iterdir():
        if path.name not in (LOCK, REPLACED):
            path.rename(aside / path.name)


def put_back(out: Path) -> None:
    """Where ``out``/.replaced is left and no new config.json was written: the new start's files removed, the
    replaced run's moved back (a --overwrite whose data or model failed, or that was interrupted, loses nothing)."""
    aside = out / REPLACED
    if not aside.is_dir() or (out / "config.json").is_file():
        return
    clear(out)
    for path in aside.iterdir():
        path.rename(out / path.name)
    aside.rmdir()


def clear(out: Path) -> None:
    """Remove everything in the run directory ``out`` but its lock (and a replaced run set aside)."""
    for path in out.iterdir():
        if path.name in (LOCK, REPLACED):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


# -- one process a run directory ---------------------------------------------------------------------------
LOCK = ".lock"  # OUT/.lock: held (flock) by the process training OUT; it says who, for the error of another
_held: dict[Path, IO[str]] = {}
_made: set[Path] = set()  # run directories this process made (prepare), which let_go removes where left empty


def hold(out: Path) -> None:
    """Take ``out``'s lock for this process, or refuse in one line naming the process that holds it: two
    processes training one directory would interleave their checkpoints and metrics.jsonl records.

    An advisory ``flock`` on OUT/.lock, so the system lets it go when its process ends, however it ends
    (a killed run leaves at most an unheld .lock file, which the next run takes over). :func:`release`
    removes the file while still holding it, so a lock taken on a file that has since been removed is
    dropped and taken again on the new one. Within one process holding again is a no-op (a resumed run in the
    same process). Where the system has no ``fcntl`` (Windows) nothing is locked."""
    key = out.resolve()
    if fcntl is None or key in _held:
        return
    path = out / LOCK
    while True:
        handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115 -- held open until release()
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "a process that has not said who it is yet"
            handle.close()
            raise RunDirError(f"{out} is being trained by another process ({holder}); wait for it to end or stop "
                              "it first") from None
        try:
            if os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino:
                break
        except FileNotFoundError:
            pass
        handle.close()  # released and removed by its holder in between: take the new file's lock
    handle.seek(0)
    handle.truncate()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime())
    handle.write(f"pid {os.getpid()} on {platform.node() or 'this machine'}, since {stamp}\n")
    handle.flush()
    _held[key] = handle


def note_made(folder: str | Path) -> None:
    """``folder`` (a comparison's or sweep's ``--out``) and the parents of it that do not exist yet are this
    command's to make: :func:`let_go` removes them where the command left nothing but empty folders in them."""
    folder = Path(folder)
    _made.update(p.resolve() for p in (folder, *folder.parents) if not p.exists())


def _holds_no_file(folder: Path) -> bool:
    return folder.is_dir() and all(p.is_dir() and not p.is_symlink() and _holds_no_file(p) for p in folder.iterdir())


def let_go() -> None:
    """Every run directory this process still holds (a command that failed or was interrupted), let go: its lock
    removed, and a start that wrote nothing but its marker leaves nothing behind (the folder too, where this process
    made it). A start that wrote more (a tokenizer) stays a :func:`failed_start`, which the next run takes. A folder
    this process made (:func:`note_made`) that holds no file is removed (a sweep refused once its data were
    looked for)."""
    for key in list(_held):
        put_back(key)  # before the lock goes: the replaced run back where its replacement never started
        release(key)
        if failed_start(key) and {p.name for p in key.iterdir()} <= {STARTED}:
            (key / STARTED).unlink(missing_ok=True)
            folder = key
            while folder in _made and not any(folder.iterdir()):  # the run's folder, and those made for it
                folder.rmdir()
                folder = folder.parent
    for folder in sorted(_made, key=lambda p: len(p.parts)):  # outermost first: a whole empty tree at once
        if folder.exists() and _holds_no_file(folder):
            shutil.rmtree(folder)
    _made.clear()


def release(out: Path) -> None:
    """Remove ``out``'s lock file and let go of its lock (a no-op where this process does not hold it)."""
    key = Path(out).resolve()
    handle = _held.pop(key, None)
    if handle is not None:
        (key / LOCK).unlink(missing_ok=True)
        handle.close()  # closing the descriptor releases the flock


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as err:
        raise RunDirError(f"{path}: unreadable JSON ({err})") from None


def append_metrics(out: Path, record: dict[str, Any]) -> None:
    with open(out / "metrics.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")


def parse_records(path: Path, torn_last_ok: bool, what: str = "a JSON record") -> tuple[list[dict[str, Any]],
                                                                                      int | None]:
    """The records of the JSON Lines file ``path`` (metrics.jsonl, steps.jsonl, layers.jsonl) and the number of a
    torn last line (``torn_last_ok``: what a process killed while writing it leaves; else it is an error too).

    A line that is not one JSON object is a :class:`RunDirError` naming the file, the line and ``what`` it is not."""
    records, torn = [], None
    lines = path.read_text().splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError(f"a {type(record).__name__}, not a record")
        except ValueError as err:
            if torn_last_ok and n == len(lines):
                torn = n
                break
            raise RunDirError(f"{path}, line {n}: not {what} ({err})") from None
        records.append(record)
    return records, torn


def read_metrics(out: Path, upto: int | None = None, key: str = "epoch") -> list[dict[str, Any]]:
    """The records of metrics.jsonl (those with ``key`` <= ``upto`` where given); a bad line is an error."""
    path = Path(out) / "metrics.jsonl"
    if not path.exists():
        return []
    records, _ = parse_records(path, torn_last_ok=False)
    return [r for r in records if upto is None or r.get(key, 0) <= upto]


def resume_metrics(out: Path, upto: int, key: str = "epoch", record: dict[str, Any] | None = None) -> str:
    """Make metrics.jsonl what the checkpoint at ``key`` = ``upto`` covers; return what was dropped ('' if nothing).

    Records past the checkpoint and a torn last line (a process killed while writing it) are dropped; the
    checkpoint's own ``record``, where the file lost it, is put back. A bad line before the last is an error:
    it is not what a killed process leaves, and nothing is rewritten."""
    path = Path(out) / "metrics.jsonl"
    records, torn = parse_records(path, torn_last_ok=True) if path.exists() else ([], None)
    keep = [r for r in records if r.get(key, 0) <= upto]
    if record is not None and not any(r.get(key) == upto for r in keep):
        keep.append(record)
    dropped = [f"a torn last line (line {torn})"] if torn else []
    past = [r.get(key) for r in records if r.get(key, 0) > upto]
    if past:
        dropped.append(f"{len(past)} record(s) past the checkpoint ({key} {', '.join(map(str, past))})")
    tmp = Path(out) / "metrics.jsonl.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in keep))
    os.replace(tmp, path)
    return f"{path}: dropped {' and '.join(dropped)}; the checkpoint at {key} {upto} is where the run goes on" \
        if dropped else ""


def require(summary: dict[str, Any], keys: tuple[str, ...], path: Path) -> None:
    """A one-line error where a finished run's summary lacks one of ``keys`` (an edited or cut-short file)."""
    missing = [k for k in keys if k not in summary]
    if missing:
        raise RunDirError(f"{path}: a finished run's summary without {', '.join(missing)}; remove the run to train it "
                          "again")


def changed_settings(stored: dict[str, Any], new: dict[str, Any], ignore: tuple[str, ...] = ()) -> list[str]:
    """The fields of config ``new`` whose value differs from ``stored``'s, ``ignore`` aside, sorted.

    Both are compared as JSON, so a config read back from config.json (lists) equals the dataclass it
    was written from (tuples). (Callers hand a stored config's data paths made absolute,
    :func:`skiplab.config.absolute`: a run that stored them as given, relative, names the same files.)
    """
    stored, new = json.loads(json.dumps(stored)), json.loads(json.dumps(new))
    return sorted(k for k in new if k not in ignore and stored.get(k) != new[k])


def check_resumable(out: Path, stored: dict[str, Any], new: dict[str, Any], extendable: tuple[str, ...] = (),
                    defaults: dict[str, Any] | None = None) -> list[str]:
    """Refuse to resume ``out`` with settings other than ``stored``'s, except ``extendable`` ones and the
    :data:`PLACE` fields (a moved run resumes); return the changed ``extendable`` ones.

    A field ``stored`` lacks (one added to the config since the run was written) counts as its value in
    ``defaults``: the run was trained as that default says."""
    stored = {**(defaults or {}), **stored}
    other = changed_settings(stored, new, ignore=extendable + PLACE)
    if other:
        raise RunDirError(f"{out} holds a run with another config (different {', '.join(other)}); resume it with "
                          "that config, or use --overwrite")
    return [k for k in extendable + PLACE if k in changed_settings(stored, new)]


def note_changes(out: Path, stored: dict[str, Any], new: dict[str, Any], changed: list[str]) -> str:
    """config.json's config becomes ``new`` (the ``changed`` fields of a resumed run); return a line saying so."""
    if not changed:
        return ""
    write_json(out / "config.json", {**read_json(out / "config.json"), "config": new})
    return f"{out}: resumed with " + ", ".join(f"{k} {stored.get(k)} -> {new[k]}" for k in changed)


def note_machine(out: Path, at: int, device: str | None = None, amp: bool | None = None) -> str:
    """A run resumed on another machine, kind of machine (``device`` and ``amp``, where given: :func:`kinds`), code
    version or number of CPU threads than config.json's ``environment`` names (a CPU's kernels split their sums by
    the thread count, so the updates from there may differ in their last bits): the new one goes into config.json's
    ``resumed_on`` (with the step it went on from), so that tables can tell a run trained on two machines; return a
    line saying so ("" where nothing changed)."""
    stored = read_json(out / "config.json")
    now, first = host.environment(), stored.get("environment", {})
    seen = [first, *(e["environment"] for e in stored.get("resumed_on", []))]
    last = seen[-1]
    entry = {"at": at, "environment": now, **({"device": device, "amp": amp} if device is not None else {})}
    same_kind = device is None or host.machine_kind(now, device, bool(amp)) == _segments(stored)[-1]
    same_machine = host.machine_name(now) == host.machine_name(last)
    if same_machine and host.code_name(now) == host.code_name(last) and same_kind \
            and now.get("threads") == last.get("threads", now.get("threads")):
        return ""
    write_json(out / "config.json", {**stored, "resumed_on": [*stored.get("resumed_on", []), entry]})

    def where(env: dict[str, Any]) -> str:
        return f"{host.machine_name(env)}, threads {env.get('threads', '?')}, code {host.code_name(env)}"
    return f"{out}: resumed at {at} on {where(now)} (before: {where(last)}); config.json records it"


def machines(stored: dict[str, Any]) -> list[str]:
    """Every machine a run's config.json says it trained on, in order, none twice."""
    return list(dict.fromkeys(host.machine_name(e) for e in _environments(stored)))


def codes(stored: dict[str, Any]) -> list[str]:
    """Every code version (git commit) a run's config.json says it trained with, its start's then each resume's, in
    order, none twice; "unknown" where none was recorded, "+uncommitted" after one the package differed from."""
    return list(dict.fromkeys(host.code_name(e) for e in _environments(stored)))


def _environments(stored: dict[str, Any]) -> list[dict[str, Any]]:
    """The environment of each stretch of a run: its start's, then every resume's that config.json notes."""
    return [stored.get("environment", {}), *(e["environment"] for e in stored.get("resumed_on", []))]


def _device_and_amp(stored: dict[str, Any]) -> tuple[str, bool]:
    """The device and precision config.json records (older runs: resolved from their config as training did)."""
    config, env = stored.get("config") or {}, stored.get("environment", {})
    device = str(stored.get("device") or config.get("device") or "auto")
    if device == "auto":
        device = "cuda" if env.get("cuda") else "cpu"
    amp = stored.get("amp", bool(config.get("amp")) and device.startswith("cuda"))
    return device, bool(amp)


def kinds(stored: dict[str, Any]) -> list[str]:
    """Every kind of machine (:func:`skiplab.host.machine_kind`) a run's config.json says it trained on, in order, none twice
    (a run resumed on another kind has two)."""
    return list(dict.fromkeys(_segments(stored)))


def _segments(stored: dict[str, Any]) -> list[str]:
    """The kind of machine of each stretch of a run: its start, then every resume config.json notes."""
    device, amp = _device_and_amp(stored)
    out = [host.machine_kind(stored.get("environment", {}), device, amp)]
    for e in stored.get("resumed_on", []):
        out.append(host.machine_kind(e["environment"], e.get("device", device), e.get("amp", amp)))
    return out


def rng_state() -> dict[str, Any]:
    """The global RNG states (CPU, and every CUDA device where present) that dropout draws from."""
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """``state`` into ``path`` whole or not at all: written beside it, then renamed over it (the part written is
    removed where the writing is interrupted: Ctrl-C, an error; a process killed outright leaves it, and the next save
    writes over it)."""
    tmp = path.with_suffix(".pt.tmp")
    try:
        torch.save(state, tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


TASK_KINDS = ("image", "mt", "caption", "lm")  # the tasks whose runs save checkpoints


def load_checkpoint(path: str | Path, kind: str | tuple[str, ...]) -> dict[str, Any]:
    """Read a checkpoint with ``weights_only=True``; ``path`` may be the file or its run directory.

    ``kind``: the task the checkpoint must be of ("image", "mt"), or a tuple of those accepted."""
    path = Path(path)
    if path.is_dir():
        path = path / "last.pt"
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # objects that are not plain data (never unpickled); corrupt, truncated, not a torch file
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(err))
        if isinstance(err, pickle.UnpicklingError) and found:
            raise RunDirError(f"{path}: not a readable checkpoint (it holds {found.group(1)}, not only tensors and "
                              "plain data; skiplab reads checkpoints with weights_only=True and never runs a file's "
                              "code)") from None
        if isinstance(err, pickle.UnpicklingError):
            raise RunDirError(f"{path}: not a readable checkpoint (not a file torch.save wrote, or cut short)") from None
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        why = f"{type(err).__name__}: {first}" if first else type(err).__name__
        raise RunDirError(f"{path}: not a readable checkpoint (not a file torch.save wrote, or cut short; "
                          f"{why[:120]})") from None
    kinds = (kind,) if isinstance(kind, str) else kind
    if not isinstance(state, dict) or state.get("kind") not in kinds:
        found = state.get("kind") if isinstance(state, dict) else type(state).__name__
        raise RunDirError(f"{path}: not a skiplab {' or '.join(kinds)} checkpoint (found {found!r})")
    return state


def run_kind(out: Path) -> str | None:
    """The task of the run in ``out`` (config.json says; a run written before it did, its last.pt), None where
    neither says."""
    try:
        kind = read_json(out / "config.json").get("kind")
    except (OSError, ValueError):
        kind = None
    if kind is None and (out / "last.pt").is_file():
        try:
            kind = load_checkpoint(out / "last.pt", kind=TASK_KINDS).get("kind")
        except RunDirError:
            return None
    return kind


def stop_diverged(out: Path, config: dict[str, Any], loss: float, epoch: int | None, step: int,
                  watched: dict[str, Any] | None = None, what: str = "loss") -> dict[str, Any]:
    """A non-finite loss (``what``: the training loss, or the evaluation's after step ``step``): record the run as
    diverged (a result, not a crash), say where (the epoch too, where the recipe counts epochs: not None), return
    the summary (with what the run's per-step watch saw, ``watched``, where it has one)."""
    where = f"step {step}" if epoch is None else f"epoch {epoch}, step {step}"
    message = f"non-finite {what} ({loss}) at {where}: the run diverged"
    summary = {"status": "diverged", "message": message, **({} if epoch is None else {"epoch": epoch}), "step": step,
               **({k: v for k, v in watched.items()} if watched else {}), "config": config}
    write_json(out / "summary.json", summary)
    print(f"{out}: {message}")
    return summary


# -- checkpoint averaging (Vaswani et al. 2017, Section 6.1; how all three MT papers evaluate) ----------
def step_checkpoints(run: Path) -> list[Path]:
    """``checkpoint_<step>.pt`` files of a run directory, oldest first (other files named ``checkpoint_*.pt``,
    ``checkpoint_avg.pt`` of ``average --out``, say, are not step checkpoints)."""
    return sorted(filter(is_step_checkpoint, run.glob("checkpoint_*.pt")), key=lambda p: int(p.stem.split("_")[-1]))


def is_step_checkpoint(path: Path) -> bool:
    """Whether ``path`` is named as a step checkpoint: ``checkpoint_*<digits>.pt``."""
    return path.name.startswith("checkpoint_") and path.suffix == ".pt" and path.stem.split("_")[-1].isdigit()


def average_checkpoints(run: str | Path, last: int, kind: str | None = "mt") -> tuple[dict[str, Any], list[Path]]:
    """A checkpoint whose model is the mean of the last ``last`` step checkpoints of ``run``, of task ``kind``
    (None: the task of the run's newest one, whichever it is)."""
    if last < 1:
        raise ValueError(f"the number of checkpoints to average must be >= 1, got {last}")
    run = Path(run)
    if not run.is_dir():
        raise ValueError(f"{run}: no such run directory" if not run.exists() else
                         f"{run}: a file; give the run directory whose step checkpoints are to be averaged")
    files = step_checkpoints(run)[-last:]
    if len(files) < last:
        raise ValueError(f"{run}: {last} step checkpoints asked to average, {len(files)} found")
    if kind is None:
        kind = str(load_checkpoint(files[-1], kind=TASK_KINDS).get("kind"))
    states = [load_checkpoint(f, kind=kind) for f in files]
    mean = next((f for f, s in zip(files, states) if "averaged" in s), None)
    if mean is not None:
        raise ValueError(f"{mean}: an average of {', '.join(states[files.index(mean)]['averaged'])}, not a step "
                         "checkpoint; move it out of the run (or name it as average --out does, e.g. avg5.pt)")
    if any(s["model_config"] != states[-1]["model_config"] for s in states):
        raise ValueError(f"{run}: the checkpoints to average hold different models")
    return dict(states[-1], model=average_state_dicts([s["model"] for s in states]), averaged=[f.name for f in files]), files


def average_state_dicts(states: Sequence[dict[str, Tensor]]) -> dict[str, Tensor]:
    """Element-wise mean of model state dicts (floating tensors); other tensors are taken from the last.

    Averaging the last N checkpoints is how all three papers evaluate (Vaswani et al. 2017, Section 6.1).
    """
    if not states:
        raise ValueError("no checkpoints to average")
    keys = list(states[-1])
    for i, s in enumerate(states):
        if list(s) != keys or any(s[k].shape != states[-1][k].shape for k in keys):
            raise ValueError(f"checkpoint {i} holds another model (its parameters differ in names or shapes)")
    out = {}
    for k in keys:
        if torch.is_floating_point(states[-1][k]):
            out[k] = torch.stack([s[k].double() for s in states]).mean(0).to(states[-1][k].dtype)
        else:
            out[k] = states[-1][k].clone()
    return out


# The files that say what kind of results a folder holds: a comparison's, a sweep's (its table at the top).
TABLE_FILES = {"a comparison": "compare.json", "a sweep": "sweep.json"}


def check_not_a_run(folder: Path, what: str) -> None:
    """``folder`` may hold ``what`` (a comparison, a sweep): it is not a training run's folder (its checkpoint or
    config.json there), nor the folder of results of another kind (a sweep's table, a comparison's, reproduce's
    ``<scale>/<table>/table.json``), whose files the table and the runs beside them would mix with or replace
    (curves.png, table.md)."""
    if (folder / "last.pt").is_file() or (folder / "config.json").is_file():
        raise RunDirError(f"{folder} is a training run's folder; {what} writes its runs and table in a folder of its "
                          "own: give another --out")
    other = next((kind for kind, name in TABLE_FILES.items() if kind != what and (folder / name).is_file()), None)
    if other is None and folder.is_dir() and next(folder.glob("*/*/table.json"), None) is not None:
        other = "reproduce's tables"
    if other:
        raise RunDirError(f"{folder} holds the results of {other}; {what} writes its runs and table in a folder of "
                          "its own: give another --out")


def check_table_kept(path: Path, before: dict[str, list[Any]], now: dict[str, list[Any]], overwrite: bool) -> None:
    """The table ``path`` (compare.json, sweep.json) was written over the axes ``before`` (designs, seeds, ...): the
    one of axes ``now`` replaces it only where it keeps every value of every axis (a design or a seed added), or
    with ``overwrite``; else one line naming what would go. The runs are never touched."""
    lost = {axis: [v for v in values if v not in now.get(axis, [])] for axis, values in before.items()}
    said = "; ".join(f"{axis} {', '.join(f'{x:g}' if isinstance(x, float) else str(x) for x in v)}"
                     for axis, v in lost.items() if v)
    if said and not overwrite:
        raise RunDirError(f"{path.parent} holds the table of another comparison, with {said}, which this one lacks; "
                          "give another --out, or --overwrite to replace that table (its runs stay)")


def evaluation_stem(path: str | Path, split: str, beam: int, average: int = 0, extra: str = "") -> Path:
    """Where an evaluation of ``path`` (a run directory, or a checkpoint file in one) writes its outputs, less their
    suffix: ``<run>/<split>.beam<k>[<extra>][.avg<n>][.of-<file>]``, the checkpoint file named where it is not the
    run's last.pt and ``extra`` naming settings off their defaults (``.alpha1``), so that evaluations of one run
    with other checkpoints or settings keep each its own files."""
    path = Path(path)
    run = path if path.is_dir() else path.parent
    of = f".of-{path.stem}" if not path.is_dir() and path.name != "last.pt" else ""
    return run / f"{split}.beam{beam}{extra}{f'.avg{average}' if average > 1 else ''}{of}"


def write_evaluation(stem: Path, report: dict[str, Any]) -> Path:
    """``<stem>.json``: an evaluation's ``report`` with the environment it ran in (machine, torch, code version)."""
    path = stem.with_name(stem.name + ".json")
    write_json(path, {**report, "environment": host.environment()})
    return path


def averaged_over(out: Path, average: int, cache: Callable[[int], Path]) -> int:
    """How many last step checkpoints a score of the run in ``out`` averages when ``average`` are asked for: as
    many as the run has, up to ``average``; for a run without checkpoints (collected with its small files, its
    scores cached as ``cache(n)``), the largest n <= ``average`` whose score is cached; at least 1."""
    have = len(step_checkpoints(out))
    if have:
        return max(1, min(average, have))
    return next((n for n in range(average, 0, -1) if cache(n).is_file()), 1)


def read_steps(run: str | Path, name: str = STEPS_FILE) -> list[dict[str, Any]]:
    """The per-step lines of the run directory ``run`` (its steps.jsonl, or the file ``name``: layers.jsonl;
    [] where it has none)."""
    path = Path(run) / name
    return [json.loads(x) for x in path.read_text().splitlines() if x] if path.is_file() else []
