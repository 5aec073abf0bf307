"""Blocked comparisons: the statistics behind "design A trains better than design B".

A **block** is one seed of every design of a comparison, trained on one machine: seed k of the baseline and seed
k of a design share their data order and initial draws where the designs allow it, and their machine's kernels
and speed. Rows are compared with the baseline block by block, so a comparison whose blocks were trained on
different machines (a session on an Intel Xeon, the next on an AMD EPYC) compares each design with a baseline of
its own machine. A run's block is (seed, machine); a design's run whose machine differs from its block's
baseline run has no pair and is left out of the paired numbers (the table's header says so).

Over a row's B paired blocks, with m_b its metric and m⁰_b the baseline's in block b, d_b = m_b − m⁰_b:

    Δ = (1/B) Σ_b d_b,   s_d = sqrt(Σ_b (d_b − Δ)² / (B − 1))
    95% CI of Δ:  Δ ± t_{B−1, 0.975} · s_d / √B                  (Student's t interval of a mean difference)
    paired p:     2 · P(T_{B−1} > |Δ| / (s_d / √B))               (the paired t-test, scipy.stats.ttest_rel)
    Wilcoxon p:   2 · P(W ≤ min(W⁺, W⁻)), W⁺ = Σ_{d_b > 0} rank(|d_b|), W⁻ likewise, under the exact null
                  distribution of W over the 2^B sign patterns (Wilcoxon 1945; ``scipy.stats.wilcoxon(method=
                  "exact")``), uncorrected; it needs no normality of the d_b, and its smallest attainable value
                  is 2/2^B (all B differences of one sign): 0.0625 at B = 5, 0.0078 at B = 8
    Welch p:      over the row's and the baseline's finished runs, unpaired, unequal variances (Welch 1947):
                  the row's runs that have a baseline run of their own machine in their block, and the
                  baseline's runs on the machines of those (none across machines)

undefined with fewer than two pairs or no spread in the differences. **Holm's correction** (Holm 1979) over the m
rows of one table that have a paired p and no failed run (below): with p_(1) ≤ … ≤ p_(m) in ascending order,

    p̃_(i) = min(1, max_{j ≤ i} (m − j + 1) · p_(j))

and a row's difference holds at level α when p̃ < α; this controls the chance of any false claim among the m rows
(the family-wise error rate) at α, whatever the dependence between the rows. The t-test's corrected p decides
"holds"; the Wilcoxon p stands beside it as a check that needs no normality.

**One kind of machine.** A run's kind of machine (:func:`skiplab.host.machine_kind`: a CPU model with its
kernel set in fp32, or a GPU model with its precision) is part of what a design's difference to its baseline is:
blocking removes an additive machine effect, not a design that gains more on one kind than on another. A block's
kind is its baseline run's; a table pools blocks of one kind only (:func:`one_kind` refuses others).

**Run status**: ``diverged`` (its loss stopped being finite), ``stalled`` (finished, but its metric is not the
task's stated margin better than the context-free reference, or is worse: the unigram model for a language model,
chance for a classifier; it trained without learning much), or ``trained``. **Failures are not findings**: a row with any
stalled or diverged run is ``failed``; it is reported apart (its runs listed by status), and its paired p leaves
Holm's family, so that "worse than the baseline" is never a claim about a run that did not train. The baseline's
row likewise; and a block whose baseline run stalled or diverged pairs no row ("better than the baseline" is no
claim either where the baseline did not train).
"""

from __future__ import annotations

import csv
import io
import math
import warnings
from dataclasses import dataclass, field
from typing import Any

from .comparison import mean_std, scipy_stats, welch_p

__all__ = ["RunRecord", "Block", "blocks", "holm", "holm_once", "mean_difference", "one_kind", "paired_p", "status", "summarise",
           "wilcoxon_p"]


@dataclass(frozen=True)
class RunRecord:
    """One run as a comparison sees it. ``status``: finished, diverged (or partial/missing: not counted);
    ``machines``: every machine it trained on (a run resumed elsewhere has two); ``kinds``: every kind of machine
    (:func:`skiplab.run_dir.kinds`)."""

    label: str
    seed: int
    status: str
    value: float | None = None
    machines: tuple[str, ...] = ()
    commit: str | None = None
    s_per_update: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    kinds: tuple[str, ...] = ()

    @property
    def machine(self) -> str:
        return " + ".join(self.machines) if self.machines else "unknown"

    @property
    def kind(self) -> str:
        return " + ".join(self.kinds) if self.kinds else "unknown"


@dataclass
class Block:
    """Seed ``seed``'s runs, keyed by label; ``machines`` every machine its runs trained on."""

    seed: int
    runs: dict[str, RunRecord]

    @property
    def machines(self) -> list[str]:
        return sorted({r.machine for r in self.runs.values()})

    @property
    def commits(self) -> list[str]:
        return sorted({r.commit for r in self.runs.values() if r.commit})


def blocks(records: list[RunRecord]) -> list[Block]:
    """The records grouped by seed, in seed order."""
    out: dict[int, Block] = {}
    for r in records:
        out.setdefault(r.seed, Block(r.seed, {})).runs[r.label] = r
    return [out[k] for k in sorted(out)]


def status(record: RunRecord, reference: float | None, margin: float | None, higher_is_better: bool) -> str:
    """``diverged``, ``stalled`` or ``trained`` (module docstring); partial and missing runs are returned as they are."""
    if record.status != "finished":
        return record.status
    if reference is None or margin is None or record.value is None:
        return "trained"
    gap = record.value - reference if higher_is_better else reference - record.value
    return "stalled" if gap < margin else "trained"


def mean_difference(diffs: list[float], level: float = 0.95) -> tuple[float, float | None, float | None]:
    """Δ and its ``level`` confidence interval (Student's t; None with fewer than two differences)."""
    if not diffs:
        return math.nan, None, None
    mean, sd = mean_std(diffs)
    if len(diffs) < 2:
        return mean, None, None
    half = float(scipy_stats().t.ppf(0.5 + level / 2, len(diffs) - 1)) * sd / math.sqrt(len(diffs))
    return mean, mean - half, mean + half


def paired_p(diffs: list[float]) -> float | None:
    """Two-sided p of the paired t-test that the mean difference is 0 (None where undefined)."""
    if len(diffs) < 2 or mean_std(diffs)[1] == 0:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        p = float(scipy_stats().ttest_1samp(diffs, 0.0).pvalue)
    return None if math.isnan(p) else p


def wilcoxon_p(diffs: list[float]) -> float | None:
    """Two-sided exact p of Wilcoxon's signed-rank test that the differences are symmetric about 0 (module
    docstring; None with fewer than two differences or none nonzero)."""
    if len(diffs) < 2 or not any(diffs):
        return None
    with warnings.catch_warnings():  # ties or zeros: scipy says its exact p is then approximate, the p stands
        warnings.simplefilter("ignore")
        p = float(scipy_stats().wilcoxon(diffs, method="exact").pvalue)
    return None if math.isnan(p) else p


def one_kind(block_kinds: dict[int, str], what: str = "blocks") -> str | None:
    """The one kind of machine of ``block_kinds`` (seed -> kind; None where it has none), or a one-line error
    naming each kind's seeds: blocks of two kinds are never pooled in one paired analysis (module docstring)."""
    by_kind: dict[str, list[int]] = {}
    for seed, kind in sorted(block_kinds.items()):
        by_kind.setdefault(kind, []).append(seed)
    if len(by_kind) > 1:
        listed = "; ".join(f"seed{'s' if len(v) > 1 else ''} {', '.join(map(str, v))} on {k}" for k, v in by_kind.items())
        raise ValueError(f"{what} of different kinds of machine cannot be pooled in one paired analysis ({listed}): "
                         "give each kind its own --out (move the other kind's seed folders there)")
    return next(iter(by_kind), None)


def holm(pvalues: list[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values, in the given order (None stays None and is not counted in m)."""
    present = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    m, out, running = len(present), list(pvalues), 0.0
    for j, (p, i) in enumerate(present):
        running = max(running, min(1.0, (m - j) * p))
        out[i] = running
    return out


def holm_once(pvalues: list[float | None], experiments: list[Any]) -> list[float | None]:
    """Holm's correction with each experiment counted once: entries of one ``experiments`` key (one pair of runs
    standing for several cells of a table, e.g. a miniature for two paper sizes) are one member of the family,
    with the p of its first entry, and every entry gets its experiment's corrected p. m is the number of distinct
    experiments with a p, not of entries: copies of one comparison do not make the correction stricter."""
    first: dict[Any, float] = {}
    for p, key in zip(pvalues, experiments):
        if p is not None:
            first.setdefault(key, p)
    keys = list(first)
    adjusted = dict(zip(keys, holm([first[k] for k in keys])))
    return [adjusted[key] if p is not None else None for p, key in zip(pvalues, experiments)]


def summarise(records: list[RunRecord], order: list[str], baseline: str, higher_is_better: bool = False,
              reference: float | None = None, margin: float | None = None,
              alpha: float = 0.05) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One row per label of ``order`` (the module's formulas) and what the table's header must say:
    ``{"blocks": [...], "unpaired": [...], "mixed": bool, "alpha": α, "holm_m": m, "kind": ..., "failed": [...]}``;
    a ValueError where the blocks are of two kinds of machine (:func:`one_kind`)."""
    by_block = blocks(records)
    kind = one_kind({b.seed: b.runs[baseline].kind for b in by_block
                     if baseline in b.runs and b.runs[baseline].kinds})
    unpaired: list[str] = []
    base_failed = [b.seed for b in by_block if baseline in b.runs
                   and status(b.runs[baseline], reference, margin, higher_is_better) in ("stalled", "diverged")]
    rows = []
    for label in order:
        mine = [r for r in records if r.label == label]
        finished = [r.value for r in mine if r.status == "finished" and r.value is not None]
        mean, std = mean_std(finished)
        states = [status(r, reference, margin, higher_is_better) for r in mine]
        diffs, ratios, elsewhere = [], [], set()
        for b in by_block:
            run, base = b.runs.get(label), b.runs.get(baseline)
            if run is None or base is None or label == baseline:
                continue
            if run.machine != base.machine:
                unpaired.append(f"{label} seed {b.seed} ({run.machine}; its baseline: {base.machine})")
                elsewhere.add(b.seed)
                continue
            if run.kind != base.kind:  # one machine, another device or precision
                unpaired.append(f"{label} seed {b.seed} ({run.kind}; its baseline: {base.kind})")
                elsewhere.add(b.seed)
                continue
            if b.seed in base_failed:  # a baseline that did not train pairs nothing
                continue
            if run.status == "finished" and base.status == "finished" and None not in (run.value, base.value):
                diffs.append(run.value - base.value)
            if run.s_per_update and base.s_per_update:
                ratios.append(run.s_per_update / base.s_per_update)
        if label == baseline:
            ratios = [1.0] if any(r.s_per_update for r in mine) else []
        # Welch's runs: the row's with a baseline of their machine, and the baseline's on those machines
        mine_kept = [r for r in mine if r.seed not in elsewhere]
        welch_runs = [r.value for r in mine_kept if r.status == "finished" and r.value is not None]
        where = {(r.machine, r.kind) for r in mine_kept}
        base_values = [r.value for r in records if r.label == baseline and r.status == "finished"
                       and r.value is not None and (r.machine, r.kind) in where]
        delta, lo, hi = mean_difference(diffs) if label != baseline else (math.nan, None, None)
        by_status = {s: [r.seed for r, t in zip(mine, states) if t == s] for s in ("trained", "stalled", "diverged")}
        rows.append({
            "label": label, "runs": len(mine), "trained": states.count("trained"),
            "stalled": states.count("stalled"), "diverged": states.count("diverged"), "seeds": by_status,
            "failed": bool(by_status["stalled"] or by_status["diverged"]),
            "mean": mean, "std": std, "values": {r.seed: r.value for r in mine if r.status == "finished"},
            "pairs": len(diffs), "delta": delta, "ci_low": lo, "ci_high": hi,
            "p_paired": paired_p(diffs) if label != baseline else None,
            "p_wilcoxon": wilcoxon_p(diffs) if label != baseline else None,
            "p_welch": welch_p(welch_runs, base_values) if label != baseline else None,
            "time_ratio": sum(ratios) / len(ratios) if ratios else None,
        })
    adjusted = holm([None if r["failed"] else r["p_paired"] for r in rows])  # failures are not findings
    for r, p in zip(rows, adjusted):
        r["p_holm"] = p
        r["holds"] = p is not None and p < alpha
    header = {
        "baseline": baseline, "alpha": alpha, "holm_m": sum(p is not None for p in adjusted), "kind": kind,
        "failed": [r["label"] for r in rows if r["failed"]], "baseline_failed": base_failed,
        "blocks": [{"seed": b.seed, "machines": b.machines, "commits": b.commits, "runs": len(b.runs),
                    "baseline": baseline in b.runs} for b in by_block],
        "unpaired": unpaired, "mixed": any(len(b.machines) > 1 for b in by_block),
        "reference": reference, "margin": margin,
    }
    return rows, header


# ---- the table ------------------------------------------------------------------------------------------------
def _num(value: float | None, decimals: int, sign: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:+.{decimals}f}" if sign else f"{value:.{decimals}f}"


def _cell(value: Any) -> str:
    """A describing column's value: an int with thousands separators, anything else as it is."""
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def _p(value: float | None) -> str:
    return "-" if value is None else f"{value:.2g}" if value >= 0.001 else f"{value:.1e}"


def header_lines(header: dict[str, Any], metric_label: str) -> list[str]:
    """What a blocked table says above itself: its blocks and machines, its budget, how runs are classed and what the
    columns mean, and every warning (a block of two machines, runs without a same-machine baseline)."""
    base, out = header["baseline"], []
    by_machine: dict[str, list[int]] = {}
    for b in header["blocks"]:
        by_machine.setdefault(" / ".join(b["machines"]), []).append(b["seed"])
    where = "; ".join(f"{m} (seed{'s' if len(s) > 1 else ''} {', '.join(map(str, s))})" for m, s in by_machine.items())
    commits = sorted({c for b in header["blocks"] for c in b["commits"]})
    out.append(f"Blocks: {len(header['blocks'])} (block k = seed k of every row); machines: {where}; "
               f"code: {', '.join(commits) or 'unknown'}.")
    if header.get("kind"):
        out.append(f"Kind of machine: {header['kind']}, every block (a table pools blocks of one kind).")
    if header.get("budget"):
        out.append(header["budget"][0].upper() + header["budget"][1:] + ".")
    if header.get("reference") is not None and header.get("margin") is not None:
        out.append(f"Status: diverged (non-finite loss), stalled (finished less than {header['margin']:g} better "
                   f"than the context-free reference, {header.get('reference_label') or 'reference'}: "
                   f"{header['reference']:.3f}, or worse), else trained.")
    n = len(header["blocks"])
    out.append(f"Δ: the paired difference to {base} (row − {base} in the same block), mean over blocks, with its 95% "
               f"CI (Student's t); p paired: paired t-test; p Wilcoxon: exact signed-rank test of the same "
               f"differences, uncorrected (with n = {n} blocks the smallest attainable exact Wilcoxon p is "
               f"2/2^{n} = {2 / 2 ** n:.2g}, larger for a row of fewer pairs than blocks); p Welch: unpaired; "
               f"p Holm: Holm's correction of the paired t-test over "
               f"the {header['holm_m']} rows with a paired p and no failed run; holds: p Holm < {header['alpha']:g}.")
    if header.get("failed"):
        out.append(f"Failures are not findings: {', '.join(header['failed'])} had a stalled or diverged run; listed "
                   "apart below the table, outside Holm's family.")
    if header.get("baseline_failed"):
        seeds = header["baseline_failed"]
        out.append(f"The baseline {base} stalled or diverged in block{'s' if len(seeds) > 1 else ''} seed "
                   f"{', '.join(map(str, seeds))}: no row is paired there.")
    for b in header["blocks"]:
        if len(b["machines"]) > 1:
            out.append(f"WARNING: block seed{b['seed']} mixes machines ({', '.join(b['machines'])}).")
        if not b["baseline"]:
            out.append(f"WARNING: block seed{b['seed']} has no {base} run: its rows have no pair there.")
    if header["unpaired"]:
        out.append("WARNING: no same-machine baseline, left out of Δ and the paired and Welch p: "
                   + "; ".join(header["unpaired"]))
    return out


def markdown(rows: list[dict[str, Any]], header: dict[str, Any], columns: dict[str, dict[str, str]],
             metric_label: str, decimals: int = 2, higher_is_better: bool = False) -> str:
    """The table with its header lines (:func:`header_lines`) and, after it, which differences hold."""
    base = header["baseline"]
    names = list(dict.fromkeys(k for c in columns.values() for k in c))
    head = [*(("λ" if k == "lambda" else k) for k in names), f"time × {base}", f"{metric_label} (mean ± std)",
            f"Δ vs {base} [95% CI]", "p paired", "p Wilcoxon", "p Welch", "p Holm", "holds",
            "trained / stalled / diverged"]
    body = []
    for r in rows:
        if r.get("failed"):
            continue
        col = columns.get(r["label"], {})
        interval = (f" [{_num(r['ci_low'], decimals, True)}, {_num(r['ci_high'], decimals, True)}]"
                    if r["ci_low"] is not None else "")
        pairs = f" ({r['pairs']} pair{'' if r['pairs'] == 1 else 's'})"
        body.append([
            *(_cell(col.get(k, "-")) for k in names),
            _num(r["time_ratio"], 3) if r["time_ratio"] is not None else "-",
            _mean_cell(r, decimals),
            "-" if r["label"] == base else _num(r["delta"], decimals, True) + interval + pairs,
            _p(r["p_paired"]), _p(r.get("p_wilcoxon")), _p(r["p_welch"]), _p(r["p_holm"]),
            "-" if r["label"] == base else ("yes" if r["holds"] else "no"),
            f"{r['trained']} / {r['stalled']} / {r['diverged']}"])
    table = _grid(head, body)
    failed = _failed_table(rows, columns, names, metric_label, decimals)
    better = [r for r in rows if r["holds"] and (r["delta"] > 0) == higher_is_better]
    worse = [r for r in rows if r["holds"] and (r["delta"] > 0) != higher_is_better]
    verdict = (f"Differences that hold after Holm's correction: better than {base}: "
               f"{', '.join(r['label'] for r in better) or 'none'}; worse: {', '.join(r['label'] for r in worse) or 'none'}.")
    return "\n".join([*header_lines(header, metric_label), "", *table, "", verdict, *failed])


def _mean_cell(row: dict[str, Any], decimals: int) -> str:
    """A row's mean ± std; where it has none, why: no run finished, or those that did have no value (a metric that
    could not be computed)."""
    if not math.isnan(row["mean"]):
        if sum(v is not None for v in row["values"].values()) == 1:  # no spread to state: one run
            return f"{row['mean']:.{decimals}f} (one run)"
        return f"{row['mean']:.{decimals}f} ± {row['std']:.{decimals}f}"
    return "no value" if row["values"] else "none finished"


def _grid(head: list[str], body: list[list[str]]) -> list[str]:
    """A markdown table, its columns padded to their widest cell."""
    widths = [max(len(x[i]) for x in [head] + body) for i in range(len(head))]
    line = lambda r: "| " + " | ".join(v.ljust(w) for v, w in zip(r, widths)) + " |"  # noqa: E731
    return [line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in body]


def _failed_table(rows: list[dict[str, Any]], columns: dict[str, dict[str, str]], names: list[str],
                  metric_label: str, decimals: int) -> list[str]:
    """The rows with a stalled or diverged run, apart: each run by its status (seed: metric), no test."""
    failed = [r for r in rows if r.get("failed")]
    if not failed:
        return []
    head = [*(("λ" if k == "lambda" else k) for k in names), f"{metric_label} (mean ± std)",
            "trained / stalled / diverged", f"trained runs (seed: {metric_label})", "stalled runs", "diverged runs"]

    def runs(r: dict[str, Any], what: str) -> str:
        seeds = r["seeds"][what]
        values = r["values"]
        return ", ".join(f"{s}: {values[s]:.{decimals}f}" if values.get(s) is not None else str(s)
                         for s in seeds) or "-"

    body = [[*(_cell(columns.get(r["label"], {}).get(k, "-")) for k in names),
             _mean_cell(r, decimals),
             f"{r['trained']} / {r['stalled']} / {r['diverged']}", runs(r, "trained"), runs(r, "stalled"),
             runs(r, "diverged")] for r in failed]
    return ["", "Rows with a stalled or diverged run (not findings; outside Holm's family):", "", *_grid(head, body)]


def to_csv(rows: list[dict[str, Any]], columns: dict[str, dict[str, str]]) -> str:
    """The rows with their describing columns, one line each (per-seed values as seed:value pairs)."""
    names = list(dict.fromkeys(k for c in columns.values() for k in c))
    buf = io.StringIO()
    keys = [k for k in rows[0] if k not in ("values", "seeds")]
    writer = csv.writer(buf)
    writer.writerow([*names, *keys, "values"])
    for r in rows:
        col = columns.get(r["label"], {})
        if sum(v is not None for v in r["values"].values()) <= 1:  # no spread to state (the table: "(one run)")
            r = {**r, "std": ""}
        writer.writerow([*(col.get(k, "") for k in names), *(r[k] for k in keys),
                         " ".join(f"{s}:{v}" for s, v in r["values"].items())])
    return buf.getvalue()
