"""What a table of a paper is, as data: its cells, each with the published number and what to run for ours.

A table is a grid of rows (designs) x columns (datasets, depths, or a single metric column). Each
:class:`Cell` holds the number the paper prints and a :class:`Run` saying how to obtain ours: a *setting*
(see ``skiplab.reproduce.scales``) and what the row changes in it (a connection spec, a model family and
its options, a layer count), or ``None`` with the reason no scale here can run it (another system's row,
a dataset not built). A probe cell measures a trained run otherwise: the BLEU after one of its layers is
distilled into a linear map (the depth-wise LSTM paper, Tables 6-7).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Run:
    """How to obtain one cell: ``setting`` with the row's changes."""

    setting: str
    connection: str = ""  # image: the connection on every block; MT: the Transformer's; LM: every sub-layer's
    family: str = "transformer"  # MT: transformer or dwlstm
    options: tuple[tuple[str, Any], ...] = ()  # model options: MT (share, merge, hidden_layers), LM (init)
    layers: int = 0  # MT: the paper's encoder and decoder layer count (0: the preset's)
    probe: tuple[str, int] | None = None  # ("encoder" | "decoder", k): BLEU with layer k (1-based) made linear
    metric: str = ""  # what the cell reads of its run where columns are metrics of one run (captioning: "CIDEr")


@dataclass(frozen=True)
class Cell:
    row: str
    column: str
    paper: float | None  # the published number (None: the paper prints none)
    run: Run | None = None
    why: str = ""  # why there is no run, when ``run`` is None


@dataclass(frozen=True)
class Table:
    """One experimental table: cells, metric and direction, the baseline row, and MT scoring."""

    id: str  # "000-table1"
    source: str  # the paper's file in shared/papers (.txt), or its citation ("arXiv:2412.13795v1 ..., Table 1")
    title: str
    metric: str  # "error %", "accuracy %", "BLEU" or "perplexity" (a scale may measure ours in another: Setting.metric)
    higher_is_better: bool
    baseline: str  # the row every other row is compared with (per column)
    cells: tuple[Cell, ...]
    average: int = 0  # MT: checkpoints averaged for the Base test score, as the paper states (Vaswani et al.'s if silent)
    average_big: int = 20  # MT: the same for Big settings (Vaswani et al.: 20)
    beam: int = 4
    reading: str = ""  # how an ambiguous row is read here
    compare: tuple[tuple[str, str], ...] = ()  # (row, its baseline row) where that is not ``baseline``
    notes: tuple[str, ...] = field(default_factory=tuple)
    out_of_reach: tuple[tuple[str, str], ...] = ()  # (scale, why): runnable there in principle, not in practice

    @property
    def rows(self) -> list[str]:
        return list(dict.fromkeys(c.row for c in self.cells))

    @property
    def columns(self) -> list[str]:
        return list(dict.fromkeys(c.column for c in self.cells))

    def cell(self, row: str, column: str) -> Cell | None:
        return next((c for c in self.cells if c.row == row and c.column == column), None)

    def baseline_of(self, row: str) -> str:
        """The row that ``row`` is compared with (itself for the baseline)."""
        return dict(self.compare).get(row, self.baseline)

    def averaged(self, setting: str) -> int:
        """Checkpoints the paper averages for a run of ``setting``."""
        return self.average_big if "big" in setting else self.average

    @property
    def probes(self) -> bool:
        return any(c.run is not None and c.run.probe for c in self.cells)

