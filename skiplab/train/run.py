"""One training run's directory, from its creation to its summary: what every task's loop shares.

A task's ``train`` makes a :class:`Run` once its data are read, and then only says what is its own::

    run = Run(cfg, "image", group, device, resume, overwrite)   # OUT made ready (rank 0)
    ckpt = run.resume()                  # last.pt, checked against cfg; None for a fresh run
    ... tokenizer, model, optimizer ...
    run.attach(model, model_config, optimizer)
    run.restore(ckpt) if ckpt else run.write_config({...})
    for each evaluation:  run.save(run.checkpoint(record, rng={...}, **extras), improved)
    return run.finish(lambda last: {...})  # or run.diverged(loss, epoch, step) on a non-finite loss, the
    # training loss or an evaluation's

What a run directory holds when a task goes through a Run (the files themselves: ``skiplab.run_dir``):

    config.json             written once, by a fresh run: the config, the model's class and config, its
                            parameter count, its connections' specs as built (``connections``: the model's
                            norm resolved, ``MixLN+RMS``), Admin's ω as built (``admin``), what the task adds (data, schedule, ...), device, amp, and the
                            environment (versions, processor, git commit, world size and backend)
    metrics.jsonl           one record a save, in the order of the run's ``key`` (epoch or step)
    steps.jsonl             per-step telemetry (skiplab.train.telemetry), written with each save
    layers.jsonl            train lm --log-layers: per-layer telemetry (skiplab.train.layer_telemetry), written
                            by the task before each save; both cut back to the checkpoint's step on resume
    last.pt                 the checkpoint of the latest save; best.pt that of the best one so far
    checkpoint_<step>.pt    with step checkpoints, one a save, the last ``keep`` of them kept
    dcp/step_<step>/        --fsdp (skiplab.train.sharded): every rank's shards of the model and optimizer of last.pt
    .lock                   from start to summary, held by the training process (``run_dir.hold``): a
                            second process training the same directory is refused, told which one holds it
    summary.json            status "finished" (what the task reports, train_time_s summed over the
                            records' "time", world_size, the compile report where compiled, the config)
                            or "diverged" (where the loss stopped being finite)

A checkpoint is ``kind`` (the task), ``config``, ``model_config``, ``model``, ``optimizer``, the task's
own entries, ``rng`` (the task's generators, the global RNG states, and under torchrun ``ranks``: every
rank's own, in rank order), ``world_size`` and the save's ``record``.

What resume guarantees: a run stopped after any save and resumed goes on exactly as if it had never
stopped, to the bit, given the same number of processes (its RNG states and batch shares are per rank),
the same machine and number of CPU threads (a Run fixes the count it starts with: ``host.fix_threads``;
config.json's environment records it, and a resume with another count is noted in ``resumed_on``)
and the same config, apart from the fields a task lets grow (a budget) and where the run lives
(``run_dir.PLACE``: a moved run resumes). Anything else is refused with a one-line error before a file
is touched. A run stopped before its first save (config.json alone) resumes by starting again from
the beginning, said in a line, where its config matches. A resumed run's metrics.jsonl is cut back to
the records its checkpoint covers, and a changed field is written into config.json, each said in a line.

Under torchrun every rank holds a Run; rank 0 alone writes, and what it reads or raises reaches every
rank (``Group.on_main``). ``checkpoint`` gathers every rank's RNG state, so every rank calls it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .. import config, distributed, host, run_dir
from ..compiled import CompileStats, compile_model
from ..connections import admin, iter_connections
from ..interop.loggers import open_loggers
from . import sharded, telemetry
from .telemetry import Telemetry


class Run:
    """The run directory ``cfg.out`` of a training run of task ``kind`` ("image", "mt", ...).

    ``cfg`` is the task's config, a frozen dataclass with at least ``out``, ``amp`` and ``compile``. Making a Run
    prepares the directory (fresh, ``resume`` or ``overwrite``: :func:`run_dir.prepare`) on rank 0."""

    def __init__(self, cfg: Any, kind: str, group: distributed.Group, device: torch.device,
                 resume: bool = False, overwrite: bool = False) -> None:
        self.cfg, self.kind, self.group, self.device, self.resuming = cfg, kind, group, device, resume
        host.fix_threads()  # the CPU kernels' thread count fixed (MKL's dynamic choice off): same config, same bits
        host.keep_freed_memory()  # what a step frees stays in malloc's heap for the next (glibc), not paged in again
        self.amp = cfg.amp and device.type == "cuda"  # bf16 autocast: CUDA only
        self.out = group.on_main(lambda: run_dir.prepare(cfg.out, resume=resume, overwrite=overwrite))
        self.model: nn.Module | None = None
        self.model_config: Any = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.compile_stats: CompileStats | None = None
        self.stored: dict[str, Any] = {}  # the resumed run's config, and the fields of it cfg changes
        self.changed: list[str] = []
        self.resume_step = 0  # the step of the checkpoint a resumed run goes on from
        self.watch = Telemetry(0)  # per-step telemetry (skiplab.train.telemetry), made by attach
        # generators a task draws from as it trains (self-critical sampling), saved with every rank's RNG states
        # and restored with them, so that a resumed run draws what the uninterrupted one would
        self.generators: dict[str, torch.Generator] = {}

    @property
    def config(self) -> dict[str, Any]:
        return dataclasses.asdict(self.cfg)

    def say(self, line: str) -> None:
        """Print ``line`` on rank 0 (once, under torchrun)."""
        if self.group.main:
            print(line)

    # -- before the model --------------------------------------------------------------------------------
    def resume(self, upgrade: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
               extendable: tuple[str, ...] = ()) -> dict[str, Any] | None:
        """The checkpoint to go on from (last.pt; None for a fresh run), refused unless it is this task's,
        of this config (``upgrade`` brings a stored config to today's form; ``extendable`` fields may
        differ) and of this number of processes. The task reads its own entries from it. A run stopped before
        its first save (config.json alone) starts again from the beginning, said in a line, where its config
        is this one (else refused as a checkpoint's would be): None, its files removed, a fresh run."""
        if not self.resuming:
            return None
        defaults = {f.name: f.default for f in dataclasses.fields(self.cfg)}
        if not (self.out / "last.pt").is_file():  # stopped before its first save: config.json alone
            def restart() -> None:  # on rank 0 alone: its error, if any, reaches every rank
                stored = run_dir.read_json(self.out / "config.json").get("config") or {}
                run_dir.check_resumable(self.out, config.absolute(upgrade(stored) if upgrade else stored),
                                        config.absolute(self.config), extendable=extendable, defaults=defaults)
                run_dir.clear(self.out)
                (self.out / run_dir.STARTED).touch()  # a fresh run's from here, until its config.json

            self.group.on_main(restart)
            self.resuming = False
            self.say(f"{self.out}: stopped before its first checkpoint; the run starts again from the beginning")
            return None
        ckpt = run_dir.load_checkpoint(self.out / "last.pt", kind=self.kind)
        if "averaged" in ckpt:  # `average --out RUN/last.pt`: a mean of weights beside one step's optimizer
            raise run_dir.RunDirError(f"{self.out / 'last.pt'} is an average of {', '.join(ckpt['averaged'])}, not "
                                      "a training step's state: nothing to resume from")
        self.resume_step = int(ckpt.get("step", 0))
        # the data's paths absolute on both sides: a run that stored them as given (relative) names the same files
        self.stored = config.absolute(upgrade(ckpt["config"]) if upgrade else ckpt["config"])
        self.changed = run_dir.check_resumable(self.out, self.stored, config.absolute(self.config),
                                               extendable=extendable, defaults=defaults)
        distributed.check_resume_world(ckpt.get("world_size", 1), self.group, str(self.out))
        return ckpt

    def compile(self, model: nn.Module, dynamic: bool | None = None) -> nn.Module:
        """``model`` through torch.compile where the config asks (what compiling costs is counted from here,
        for the summary), else ``model`` itself."""
        if not self.cfg.compile:
            return model
        self.compile_stats = CompileStats()
        return compile_model(model, dynamic=dynamic)

    # -- with the model -----------------------------------------------------------------------------------
    def attach(self, model: nn.Module, model_config: Any, optimizer: torch.optim.Optimizer,
               flops_per_token: float = 0.0) -> None:
        """The plain (not compiled, not wrapped) model, its config (a dataclass) and the optimizer the
        checkpoints hold; the run's watch (:class:`~skiplab.train.telemetry.Telemetry`: a line every
        ``cfg.log_every`` updates, ``flops_per_token`` for its FLOP rate, the loggers ``cfg.logger`` names, opened
        on rank 0)."""
        self.model, self.model_config, self.optimizer = model, model_config, optimizer
        loggers = None
        if getattr(self.cfg, "logger", "") and self.group.main:
            loggers = open_loggers(self.cfg.logger, self.out, self.config, self.resume_step)
        self.watch = Telemetry(getattr(self.cfg, "log_every", 0), flops_per_token, self.device, loggers)

    def restore(self, ckpt: dict[str, Any], key: str = "epoch") -> None:
        """Model, optimizer and RNG state (this rank's, under torchrun) from ``ckpt``; metrics.jsonl cut back
        to the records up to the checkpoint's ``key`` and config.json given the changed fields, each said."""
        sharded.load_states(self.model, self.optimizer, ckpt, self.out)  # --fsdp: from its DCP shards
        self.watch.load_state(ckpt.get("telemetry"))
        if "step" in ckpt:  # the lines a killed run wrote past its checkpoint
            self.group.on_main(lambda: telemetry.cut_lines(self.out, ckpt["step"]))
        ranks = ckpt["rng"].get("ranks")
        state = ranks[self.group.rank] if ranks else ckpt["rng"]
        run_dir.restore_rng(state)
        for name, generator in self.generators.items():
            if name in state:  # (a checkpoint written before the generator was saved: it starts at its seed)
                generator.set_state(state[name])
        for line in self.group.on_main(lambda: (
                run_dir.note_changes(self.out, self.stored, self.config, self.changed),
                run_dir.note_machine(self.out, int(ckpt.get(key, 0)), str(self.device), self.amp),
                run_dir.resume_metrics(self.out, ckpt[key], key=key, record=ckpt.get("record")))):
            if line:
                self.say(line)

    def profile(self, model: nn.Module, forward: Callable[[], Any]) -> None:
        """A fresh run's designs that initialise from data (``Admin``: ``init=profile``, and ``init=auto``, which
        the batch decides) see one batch, ``forward`` (the model in evaluation mode: dropout off), before the first
        update; the same batch on every rank. config.json records what they were built as (``admin``)."""
        omegas = admin.profile(model, forward)
        if omegas:
            self.say(f"Admin: ω profiled on one batch, {min(omegas.values()):.3f} to {max(omegas.values()):.3f} "
                     f"over {len(omegas)} connections")

    def write_config(self, extra: dict[str, Any]) -> None:
        """config.json of a fresh run; ``extra`` (the task's data, schedule, ...) goes after the parameters."""
        model = self.model
        built = admin.summary(model)  # Admin's ω per stack: closed form or profiled
        specs = sorted({c.spec for _, c in iter_connections(model)})  # as built, the model's norm resolved (MixLN+RMS)
        self.group.on_main(lambda: run_dir.write_config(self.out, {
            "kind": self.kind, "config": self.config, "model": {"class": type(model).__name__, **dataclasses.asdict(self.model_config)},
            "parameters": sum(p.numel() for p in model.parameters()), **({"connections": specs} if specs else {}),
            **({"admin": built} if built else {}), **extra,
            "device": str(self.device), "amp": self.amp,
            "environment": {**host.environment(), **self.group.describe()}}))

    def checkpoint(self, record: dict[str, Any], rng: dict[str, Any], **extras: Any) -> dict[str, Any]:
        """The checkpoint of now: the task's ``extras`` (epoch, step, best, ...) and ``rng`` (its own
        generators' states) with the model, optimizer and global RNG states. Every rank calls it."""
        own = {**run_dir.rng_state(), **{name: g.get_state() for name, g in self.generators.items()}}
        rng = {**rng, **own}
        if self.group.active:  # every rank's own state, each restored to its rank on resume
            rng["ranks"] = self.group.gather(own)
        return {"kind": self.kind, "config": self.config, "model_config": dataclasses.asdict(self.model_config),
                **sharded.states(self.model, self.optimizer), **extras,  # --fsdp: the full model, no optimizer
                "telemetry": self.watch.state(), "rng": rng,
                "world_size": self.group.world_size, "record": record}

    def save(self, state: dict[str, Any], improved: bool, step: int | None = None, keep: int | None = None) -> None:
        """Write ``state`` (rank 0): the per-step lines since the last save to steps.jsonl, checkpoint_<step>.pt
        where ``step`` is given (the last ``keep`` of them kept; None: all), best.pt where ``improved``, last.pt,
        then its record to metrics.jsonl.

        last.pt is written last of the files a resume reads: a process killed before it resumes from the save before,
        which cuts the lines past it and writes the same files again on its way (the lines, held in memory till now,
        were lost where last.pt came first); one killed after it has lost at most the metrics record, which the
        resume puts back from the checkpoint."""
        state = sharded.save(self.model, self.optimizer, self.out, state, self.group)  # --fsdp: DCP shards first
        lines = self.watch.take()

        def write() -> None:
            telemetry.append_lines(self.out, lines)
            if step is not None:
                run_dir.save_checkpoint(self.out / f"checkpoint_{step}.pt", state)
                if keep:
                    for old in run_dir.step_checkpoints(self.out)[:-keep]:
                        old.unlink()
            if improved:
                run_dir.save_checkpoint(self.out / "best.pt", state)
            run_dir.save_checkpoint(self.out / "last.pt", state)
            run_dir.append_metrics(self.out, state["record"])

        self.group.on_main(write)
        sharded.prune(self.out, state, self.group)  # --fsdp: the shards last.pt does not name

    # -- the end ------------------------------------------------------------------------------------------
    def diverged(self, loss: float, epoch: int | None, step: int, what: str = "loss") -> dict[str, Any]:
        """A non-finite ``loss`` at ``epoch`` and ``step`` (from 1): the run is recorded as diverged; its summary.
        ``what`` names the loss: the training loss, or an evaluation's ("test loss", "validation loss") after
        ``step``, where the weights the last updates made are not finite (no checkpoint keeps them)."""
        lines = self.watch.take()  # the updates since the last save, the non-finite one last

        def write() -> dict[str, Any]:
            telemetry.append_lines(self.out, lines)
            summary = run_dir.stop_diverged(self.out, self.config, loss, epoch, step,
                                           self.watch.summary() if self.watch.losses else None, what)
            run_dir.release(self.out)
            return summary

        self.watch.close()
        return self.group.on_main(write)

    def finish(self, summary: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
        """Write summary.json of a finished run and return it: ``summary(last record)`` gives the task's
        entries (final and best metrics, epochs, ...), followed by the training time (the sum of every
        record's "time"), world size, compile report and config."""
        def write() -> dict[str, Any]:
            history = run_dir.read_metrics(self.out)
            watched = self.watch.summary() if self.watch.losses else {}  # a task that reports its updates
            result = {"status": "finished", **summary(history[-1]), **watched,
                      "train_time_s": sum(r["time"] for r in history), "world_size": self.group.world_size,
                      **({"compile": self.compile_stats.report()} if self.compile_stats else {}), "config": self.config}
            run_dir.write_json(self.out / "summary.json", result)
            run_dir.release(self.out)
            return result

        self.watch.close()
        return self.group.on_main(write)
