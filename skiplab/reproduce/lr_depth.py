"""``skiplab analyze lr-depth SWEEP [SWEEP ...] --out DIR``: the best learning rate per depth per design, read
from the runs of one or more ``skiplab sweep`` folders (a one-seed grid and the seeded sweeps around each
optimum, as ``experiments/depth_lr.sh`` makes them), with the interval of each optimum and the slope of the
optimum across depth (:mod:`skiplab.analysis.lr_optimum` has the formulas).

A design is its connection under the sweep's parametrisation (``PreLN`` standard, ``PreLN@completep``). A run
found in several sweeps counts once. The runs must be of one kind of machine, and the sweeps of one task and
metric; otherwise one line says which differ. DIR gets:

    lr_depth.json   every run read, per design and depth the per-lr cells, the optimum, its interval and status,
                    per design the slope across depth, the sweeps, machine kind and code versions
    lr_depth.md     the two tables
    lr_depth.png    per design the metric against lr, a line per depth (mean ± std over the seeds, the optimum
                    marked); and the optimum against depth, every design, with its interval
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .. import host, run_dir
from ..analysis import lr_optimum
from ..analysis.report import markdown, pyplot
from .sweep import one_kind

FILES = ("lr_depth.json", "lr_depth.md", "lr_depth.png")


def design_label(connection: str, parametrization: str) -> str:
    """``PreLN`` under the standard parametrisation, ``PreLN@completep`` under another."""
    return connection if parametrization in ("", "standard") else f"{connection}@{parametrization}"


def read(sweeps: list[Path]) -> dict[str, Any]:
    """The runs of the sweeps, each once, labelled by design; the task's metric and direction."""
    metric = higher = label_text = None
    runs: dict[tuple[str, int, float, int], dict[str, Any]] = {}
    for folder in sweeps:
        path = folder / "sweep.json" if folder.is_dir() else folder
        if not path.is_file():
            raise ValueError(f"{folder}: no sweep.json (give the folder `skiplab sweep --out` wrote)")
        s = run_dir.read_json(path)
        if metric is None:
            metric, higher = s["metric"], bool(s["higher_is_better"])
            label_text = s.get("metric_label", metric)
        elif (s["metric"], bool(s["higher_is_better"])) != (metric, higher):
            raise ValueError(f"{path}: its metric is {s['metric']}, the first sweep's {metric}: one metric a table")
        conf = s.get("config", {})
        kind = conf.get("parametrization", "standard")
        # a run the sweep recorded no kind of machine for (older sweeps): the machine the sweep's table was made on,
        # which made its runs too, else one unrecorded kind (pooled with no other)
        env = s.get("environment")
        made_on = host.machine_kind(env, str(conf.get("device", "cpu")), bool(conf.get("amp", False))) \
            if isinstance(env, dict) else "unknown"
        made_on = f"{path}'s machine, {made_on}" if made_on == "unknown" else made_on
        for r in s["runs"]:
            label = design_label(r["connection"], kind)
            key = (label, r["depth"], r["lr"], r["seed"])
            entry = {"design": label, "depth": r["depth"], "lr": r["lr"], "seed": r["seed"], "status": r["status"],
                     "value": r.get(metric), "kinds": r.get("kinds") or [made_on], "code": r.get("code", []),
                     "dir": r.get("dir", ""), "sweep": str(folder)}
            old = runs.get(key)
            if old is None or (old["status"] != "finished" and entry["status"] == "finished"):
                runs[key] = entry  # a run read before it finished, then again after
            elif entry["status"] == "finished" and old["value"] != entry["value"]:
                raise ValueError(f"{label} at depth {r['depth']}, lr {r['lr']:g}, seed {r['seed']}: "
                                 f"{old['sweep']} and {folder} give different {metric} ({old['value']} and "
                                 f"{entry['value']}): are they two runs?")
    if metric is None:
        raise ValueError("give at least one sweep")
    kind = one_kind(list(runs.values()),
                    advice="analyse each kind's sweeps apart (analyze lr-depth SWEEP ... of one kind)")
    return {"metric": metric, "metric_label": label_text, "higher_is_better": higher, "runs": list(runs.values()),
            "kind": kind}


def analyse(data: dict[str, Any], samples: int = lr_optimum.SAMPLES) -> dict[str, Any]:
    """Per design and depth the optimum over the lrs swept at that depth (its bootstrap seeded by the depth), per
    design the slope."""
    designs: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for r in data["runs"]:
        designs.setdefault(r["design"], {}).setdefault(r["depth"], []).append(r)
    out = []
    for label, by_depth in designs.items():
        optima = [(depth, lr_optimum.optimum(rs, sorted({r["lr"] for r in rs}), data["higher_is_better"], samples,
                                             depth))
                  for depth, rs in sorted(by_depth.items())]  # the lrs swept at that depth (a widened grid's too)
        out.append({"design": label, "optima": [{"depth": d, **o} for d, o in optima],
                    "slope": lr_optimum.slope(optima)})
    codes = sorted({" + ".join(r["code"]) for r in data["runs"] if r["code"]})
    return {"metric": data["metric"], "metric_label": data.get("metric_label") or data["metric"],
            "higher_is_better": data["higher_is_better"], "kind": data["kind"],
            "codes": codes, "samples": samples, "designs": out, "runs": data["runs"]}


def _lr(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def tables(result: dict[str, Any]) -> str:
    """The optimum per design and depth, then the slope per design, as markdown."""
    rows, notes = [], []
    for d in result["designs"]:
        for o in d["optima"]:
            best = next((c for c in o["cells"] if c["lr"] == o["best_grid_lr"]), None)
            at_best = ("-" if best is None else f"{best['mean']:.4f} (one run)" if best["finished"] == 1
                       else f"{best['mean']:.4f} ± {best['std']:.4f}")  # one seed has no spread to show
            diverged = sum(c["runs"] - c["finished"] for c in o["cells"])
            star = _lr(o["lr_star"]) if o["status"] == "bracketed" else o["status"]
            if o["status"] == "edge":
                low = o["best_grid_lr"] == o["cells"][0]["lr"]
                star = f"{'<=' if low else '>='} {_lr(o['best_grid_lr'])} (edge)"
            ci = f"[{_lr(o['ci'][0])}, {_lr(o['ci'][1])}]" if o["ci"] else "-"
            if o.get("why"):
                notes.append(f"- {d['design']} at depth {o['depth']}: {o['why']}")
            rows.append([d["design"], o["depth"], _lr(o["best_grid_lr"]), star, ci, at_best, o["seeds"],
                         sum(c["runs"] for c in o["cells"]), diverged])
    first = markdown(["design", "depth", "best grid lr", "lr* (parabola)", "95% interval",
                      f"{result['metric_label']} at the best grid lr (mean ± std)", "seeds", "runs", "not finished"],
                     rows)
    rows = []
    for d in result["designs"]:
        s = d["slope"]
        rows.append([d["design"], ", ".join(str(v) for v in s["depths"]) or "-",
                     "-" if s["slope"] is None else f"{s['slope']:+.2f}",
                     f"[{s['ci'][0]:+.2f}, {s['ci'][1]:+.2f}]" if s["ci"] else "-", s["verdict"]])
    second = markdown(["design", "depths fitted", "slope of log2 lr* on log2 L", "95% interval", "lr* with depth"],
                      rows)
    head = (f"Runs on {result['kind'] or 'an unrecorded machine'}; code {', '.join(result['codes']) or 'unrecorded'}; "
            f"{result['samples']} bootstrap replicates over seeds.")
    notes_text = "\n".join(notes) + "\n\n" if notes else ""
    return f"{head}\n\n{first}\n\n{notes_text}{second}\n"


def figure(result: dict[str, Any]):
    """Per design the metric against lr (a line per depth), then lr* against depth for every design."""
    plt = pyplot()
    designs = result["designs"]
    fig, axes = plt.subplots(1, len(designs) + 1, figsize=(4 * (len(designs) + 1), 3.6), squeeze=False)
    colours = plt.get_cmap("viridis")
    depths = sorted({o["depth"] for d in designs for o in d["optima"]})
    shade = {depth: colours(i / max(len(depths) - 1, 1)) for i, depth in enumerate(depths)}
    for ax, d in zip(axes[0], designs):
        for o in d["optima"]:
            cells = [c for c in o["cells"] if c["mean"] is not None and c["stable"]]
            colour = shade[o["depth"]]
            ax.errorbar([c["lr"] for c in cells], [c["mean"] for c in cells], yerr=[c["std"] for c in cells],
                        marker="o", ms=3, capsize=2, color=colour, label=f"L = {o['depth']}")
            if o["status"] == "bracketed":
                ax.axvline(o["lr_star"], color=colour, lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_title(d["design"], fontsize=9)
        ax.set_xlabel("learning rate")
        ax.set_ylabel(result["metric_label"])
        ax.legend(fontsize=7)
    ax = axes[0][-1]
    for d in designs:
        got = [o for o in d["optima"] if o["status"] == "bracketed"]
        if not got:
            continue
        ys = [o["lr_star"] for o in got]
        lo = [y - (o["ci"][0] if o["ci"] else y) for y, o in zip(ys, got)]
        hi = [(o["ci"][1] if o["ci"] else y) - y for y, o in zip(ys, got)]
        ax.errorbar([o["depth"] for o in got], ys, yerr=[lo, hi], marker="o", ms=4, capsize=3, label=d["design"])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("layers L")
    ax.set_ylabel("lr* (95% interval)")
    ax.set_title("the optimum across depth", fontsize=9)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("sweeps", nargs="+", metavar="SWEEP", help="folders `skiplab sweep --out` wrote (or sweep.json)")
    p.add_argument("--out", required=True, help="the folder of the table's files")
    p.add_argument("--samples", type=int, default=lr_optimum.SAMPLES,
                   help=f"bootstrap replicates over seeds (default: {lr_optimum.SAMPLES})")
    p.add_argument("--overwrite", action="store_true", help="replace the files if they exist")
    p.set_defaults(func=command)


def command(args: argparse.Namespace) -> None:
    if args.samples < 100:
        raise ValueError(f"--samples must be >= 100, got {args.samples}")
    out = Path(args.out)
    present = [str(out / n) for n in FILES if (out / n).exists()]
    if present and not args.overwrite:
        raise run_dir.RunDirError(f"{present[0]} exists; use --overwrite to replace it")
    result = analyse(read([Path(s) for s in args.sweeps]), args.samples)
    result["sweeps"] = [str(s) for s in args.sweeps]
    write(result, out)


def write(result: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    text = tables(result)
    kept = [{**d, "optima": [{k: v for k, v in o.items() if k != "replicates"} for o in d["optima"]]}
            for d in result["designs"]]  # the replicates stay out: the seeds and the sample count remake them
    run_dir.write_json(out / "lr_depth.json", {**result, "designs": kept})
    (out / "lr_depth.md").write_text(text)
    fig = figure(result)
    fig.savefig(out / "lr_depth.png", dpi=100)
    pyplot().close(fig)
    print(text + f"wrote {', '.join(str(out / n) for n in FILES)}")
