"""Side-by-side timing: the cases of a comparison take turns, so a change in the machine's load touches
all of them alike, and every result is a ratio of two times measured in the same run."""

from __future__ import annotations

import math

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    """One line of the benchmark table: ``value`` in ``unit`` (``x`` for a ratio), with what it compares."""

    group: str
    name: str
    value: float
    unit: str
    note: str = ""

    def text(self) -> str:
        if math.isnan(self.value):  # not measured here (an MFU without a known peak): the note says why
            return "-"
        if self.unit == "x":
            return f"{self.value:.3f}x"
        if self.unit == "%":
            return f"{self.value:.1f}%"
        return f"{self.value:.4g} {self.unit}"


def interleaved(cases: dict[str, Callable[[], object]], repeats: int, warmup: int = 1) -> dict[str, float]:
    """Median seconds per call of every case, calling them in turn: ``warmup`` untimed rounds, then
    ``repeats`` timed ones. Each round starts one case further on, so that no case always runs first
    (right after the previous round's last, whose memory is still being given back)."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for i in range(warmup + repeats):
        for name in names[i % len(names):] + names[: i % len(names)]:
            fn = cases[name]
            start = time.perf_counter()
            fn()
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def markdown(rows: list[Row], header: str = "") -> str:
    """The rows as a Markdown table, grouped in the order they came."""
    lines = [header] if header else []
    lines += ["| group | measurement | value | compared with |", "|---|---|---:|---|"]
    lines += [f"| {r.group} | {r.name} | {r.text()} | {r.note} |" for r in rows]
    return "\n".join(lines) + "\n"
