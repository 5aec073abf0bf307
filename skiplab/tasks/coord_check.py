"""``skiplab analyze coord-check CASE [CASE ...] --out DIR``: the coordinate check of each design under its
parametrisation (a CASE is a connection spec, or ``SPEC@standard|mup|completep``): measured by
:mod:`skiplab.train.coord_check`, read by :mod:`skiplab.analysis.coord_check`. DIR gets ``coord_check.json`` (every
measurement, the verdicts, the machine and code), ``coord_check.md`` (the table) and a figure per case."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path
from typing import Any

from .. import config, host, run_dir
from ..analysis import coord_check as reading
from ..analysis.report import pyplot
from ..train.coord_check import CoordCheckConfig, coord_check

FILES = ("coord_check.json", "coord_check.md")


def parse_case(text: str, base: CoordCheckConfig) -> CoordCheckConfig:
    """``SPEC`` or ``SPEC@PARAMETRIZATION`` as the check's config; a bad spec or parametrisation is one line,
    before anything trains (the smallest model of the case is configured here)."""
    spec, at, kind = text.rpartition("@")
    spec, kind = (spec, kind) if at else (text, "standard")
    cfg = dataclasses.replace(base, connection=spec.strip(), parametrization=kind.strip())
    for width, depth in ((min(cfg.widths), min(cfg.depths)), (max(cfg.widths), max(cfg.depths))):
        try:
            cfg.model_config(width, depth)
        except ValueError as err:
            raise ValueError(f"coord-check case {text!r}: {err}") from None
    return cfg


def slug(cfg: CoordCheckConfig) -> str:
    """A file name for a case: ``PreLN_mup``."""
    return re.sub(r"[^A-Za-z0-9=.+-]+", "_", f"{cfg.connection}_{cfg.parametrization}").strip("_")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("cases", nargs="+", metavar="CASE",
                   help="a connection spec, or SPEC@standard|mup|completep (default: standard)")
    p.add_argument("--out", required=True, help="the folder of the check's files")
    config.add_arguments(p, CoordCheckConfig, skip=("connection", "parametrization", "extra"))
    p.add_argument("--tolerance", type=float, default=reading.TOLERANCE,
                   help=f"|slope| of a flat curve, log2 q against log2 n (default: {reading.TOLERANCE})")
    p.add_argument("--overwrite", action="store_true", help="replace the check's files if they exist")
    p.set_defaults(func=command)


def command(args: argparse.Namespace) -> None:
    if not args.tolerance > 0:
        raise ValueError(f"--tolerance must be > 0, got {args.tolerance}")
    base = CoordCheckConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(CoordCheckConfig)
                               if f.name not in ("connection", "parametrization", "extra")})
    cases = [parse_case(c, base) for c in args.cases]
    out = Path(args.out)
    names = [*FILES, *(f"{slug(c)}.png" for c in cases)]
    if len(set(names)) != len(names):
        raise ValueError("a case is given twice")
    present = [str(out / n) for n in names if (out / n).exists()]
    if present and not args.overwrite:
        raise run_dir.RunDirError(f"{present[0]} exists; use --overwrite to replace it")
    write(run(cases, args.tolerance), cases, out)


def run(cases: list[CoordCheckConfig], tolerance: float, progress: bool = True) -> dict[str, Any]:
    results = [coord_check(c, progress) for c in cases]
    summaries = [reading.summary(r, tolerance) for r in results]
    return {"cases": results, "summaries": summaries, "tolerance": tolerance, "environment": host.environment()}


def write(result: dict[str, Any], cases: list[CoordCheckConfig], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    env = result["environment"]
    text = (f"Coordinate check on {host.machine_name(env)}, torch {env['torch']}, code {host.code_name(env)}; "
            f"slopes of log2 q on log2 n at the last step with their 95% intervals, flat within "
            f"±{result['tolerance']:g}.\n\n{reading.table(result['summaries'])}\n")
    run_dir.write_json(out / "coord_check.json", result)
    (out / "coord_check.md").write_text(text)
    plt = pyplot()
    for case, r in zip(cases, result["cases"]):
        fig = reading.figure(r)
        fig.savefig(out / f"{slug(case)}.png", dpi=80)
        plt.close(fig)
    print(text + f"wrote {out / 'coord_check.json'}, {out / 'coord_check.md'} and {len(cases)} figures")
