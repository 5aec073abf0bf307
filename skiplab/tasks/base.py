"""What a task is: everything train, eval, compare, analyze and reproduce need to know of one.

A task (image classification, translation, ...) is one subclass of :class:`Task`, in a module of its own,
registered by name (``skiplab.tasks``); the commands consult the registry and never branch on a task's name,
so a new task adds one module. A task names its training config and loop, the model families it trains, its
metric and learning curves, how a trained run is read for the analyses (its :class:`Trained`), how its runs
are evaluated and labelled, and what a cell of a paper's table becomes for it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from ..analysis.trained import Trained
from .variants import Variant, model_variants


class Task:
    """One task; subclasses fill in the class attributes and override what differs."""

    name: ClassVar[str]
    help: ClassVar[str]  # one line, for the command line
    config: ClassVar[type]  # the training config (a frozen dataclass; the CLI's options derive from it)
    trained: ClassVar[type[Trained]]  # a trained run as the analyses read it

    # what compare reports: the summary's key, the table's header, the learning curves and their x axis
    metric: ClassVar[str]
    metric_label: ClassVar[str]
    higher_is_better: ClassVar[bool]
    curves: ClassVar[tuple[str, ...]]
    x: ClassVar[str] = "step"
    decimals: ClassVar[int] = 2  # of the metric in compare's table
    cost_columns: ClassVar[bool] = False  # parameters and seconds per update in compare's table
    compare_connections: ClassVar[tuple[str, ...]] = ()  # compare's default connections (model takes them)
    compare_seeds: ClassVar[int] = 2
    compare_out: ClassVar[str] = "runs/compare"
    # what sweep varies and reports (skiplab.reproduce.sweep): the model options one depth sets (none: the task has
    # no ``skiplab sweep``), and the summary's final validation number with its column header
    depth_options: ClassVar[tuple[str, ...]] = ()
    final_valid: ClassVar[tuple[str, str]] = ("final_valid_loss", "final valid loss")
    # a finished run less than ``stall_margin`` better than :meth:`reference` (in the metric's units; worse than it
    # too) stalled (skiplab.analysis.blocks.status)
    stall_margin: ClassVar[float | None] = None
    probes: ClassVar[bool] = False  # the task has :meth:`probe_step` (compare's FLOPs column and matched budgets)
    significance: ClassVar[str] = "Welch's t-test over seeds"  # reproduce's test between a cell and its baseline
    paired: ClassVar[bool] = False  # reproduce tests seed-matched measurements with paired_p instead

    def families(self) -> list[type]:
        """The model families' config classes this task trains."""
        raise NotImplementedError

    def train(self, cfg: Any, resume: bool = False, overwrite: bool = False, progress: bool = True) -> dict[str, Any]:
        """Train ``cfg``'s run into ``cfg.out``; return its summary."""
        raise NotImplementedError

    def score(self, cfg: Any, summary: dict[str, Any], progress: bool) -> dict[str, Any]:
        """A finished run's summary with :attr:`metric` in it (computing and saving it where training does not)."""
        return summary

    def metric_note(self, runs: list[tuple[str, int, dict[str, Any]]]) -> str:
        """How :attr:`metric` was measured, for a comparison's title, given its runs' ``(label, seed, summary)``
        ("" where the metric's label says it all)."""
        return ""

    def reference(self, cfg: Any) -> dict[str, Any] | None:
        """A context-free level of :attr:`metric` on the data of ``cfg``'s finished run, ``{"label", "value"}``, that a
        run which learned nothing beyond the data's frequencies reaches (the sweep draws it); None where the task
        has none."""
        return None

    def probe_step(self, cfg: Any) -> tuple[Callable[[], None], int]:
        """One training step of ``cfg``'s model on a random batch of its shape (freshly built, the optimizer the
        recipe's) and the tokens (or examples) the step takes: what skiplab.tasks.budget counts and times."""
        raise NotImplementedError

    def add_train_arguments(self, p: argparse.ArgumentParser) -> None:
        """``skiplab train <task>``'s options of this task beyond its config's fields (none by default)."""

    def before_train(self, args: argparse.Namespace) -> None:
        """What those options ask for before the config is read (``args.resume`` may be set here)."""

    def shared_data(self, base: Any, root: Path, progress: bool = True) -> Any:
        """``base`` reading data that every run of a comparison or sweep under ``root`` shares, made once (the
        LM task tokenises its corpus once into a prepared folder); ``base`` itself where nothing is shared."""
        return base

    def check_scorable(self, cfg: Any) -> None:
        """An error where a finished run of ``cfg`` could not be scored (:meth:`score`), raised before it trains."""

    def variants(self, base_model: str, models: tuple[str, ...], connections: tuple[str, ...],
                 options: dict[str, Any] | None = None) -> list[Variant]:
        """compare's rows: every model spec x connection, ``options`` (the command line's model options) added to
        each of ``models``."""
        return model_variants(base_model, models, connections, options)

    def missing_data(self, cfg: Any) -> str:
        """What of ``cfg``'s data is not where it reads them, in words ("" where nothing is missing, or where the
        task fetches or finds its data itself): a table's cell says it instead of training."""
        return ""

    def data_name(self, cfg: Any) -> str:
        """The dataset or corpus a config reads, as a folder of ``reproduce --data-root`` names it."""
        raise NotImplementedError

    def describe_data(self, cfg: Any) -> str:
        """The data, for a comparison's title."""
        return self.data_name(cfg)

    def run_label(self, cfg: Any) -> tuple[str, ...]:
        """What a run is, for its directory name under ``reproduce``."""
        return (self.data_name(cfg), cfg.model)

    def add_eval_arguments(self, p: argparse.ArgumentParser) -> None:
        """The options of ``skiplab eval <task>``."""
        raise NotImplementedError

    def evaluate(self, args: argparse.Namespace) -> dict[str, Any]:
        """``skiplab eval <task>``: a trained run's scores."""
        raise NotImplementedError

    # ---- reproduce ---------------------------------------------------------------------------------------
    def cell_config(self, base: Any, run: Any, setting: Any) -> Any:
        """The config a table cell's ``run`` (skiplab.reproduce.tables.Run) starts from at ``setting`` (from
        ``base``, its config there), or a string saying why it has none there."""
        raise NotImplementedError

    def with_dataset(self, cfg: Any, name: str) -> Any:
        """``cfg`` reading the dataset ``name`` instead of its setting's (``reproduce --dataset``), or a string saying
        why it cannot; an error for a name the task does not know."""
        return f"the {self.name} task's settings have no --dataset choice"

    def measure(self, cfg: Any, summary: dict[str, Any], metric: str, average: int, beam: int,
                progress: bool) -> dict[str, Any]:
        """A finished run's value of a table whose metric is ``metric`` (``value``), with what tests need."""
        raise NotImplementedError

    def paired_p(self, a: dict[str, Any], b: dict[str, Any], cfg_a: Any, cfg_b: Any) -> float | None:
        """p of a paired test between two seed-matched measurements (tasks with :attr:`paired`)."""
        raise NotImplementedError


def averaged_note(metric_label: str, runs: list[tuple[str, int, dict[str, Any]]], average: int, beam: int) -> str:
    """``metric_label`` of each run's last ``average`` checkpoints averaged, beam ``beam``, naming the runs whose
    score averaged fewer (their ``summary["averaged"]``: a run with fewer checkpoints than ``average``)."""
    counts = {(label, seed): s["averaged"] for label, seed, s in runs if s.get("averaged")}
    said = f"{metric_label} of each run's last {average} checkpoints averaged, beam {beam}"
    short = {k: n for k, n in counts.items() if n < average}
    if not short:
        return said
    if len(short) == len(counts) and len(set(short.values())) == 1:
        n = next(iter(short.values()))
        return (f"{metric_label} of each run's last {n} checkpoint{'s' if n > 1 else ''} averaged (its runs have "
                f"{n}; {average} where a run has them), beam {beam}")
    return f"{said}; fewer where a run has fewer: " + ", ".join(
        f"{label} seed {seed} {n}" for (label, seed), n in short.items())
