"""What experiments/depth_lr.sh runs next, read from its sweeps: per design and depth of the grid NAME, the lrs swept
so far (the grid's, and those of the widened sweep OUT/grid-NAME-<design>-L<depth> where there is one) and the best.

    python3 experiments/depth_lr_cells.py edges OUT NAME   design depth lrs: the cells whose best lr is the lowest or
                                                          highest swept, with the lrs widened by a factor 2 past it
    python3 experiments/depth_lr_cells.py seeds OUT NAME [WIDEN]   design depth lrs: the cells whose best lr and
                                                          neighbours swept are not all seeded yet, with the lrs to seed

The best lr of a cell is its grid's (one seed) until the cell has a seeded sweep, OUT/seeds-NAME-<design>-L<depth>;
then it is that sweep's, the lowest mean over the seeds among the lrs every seed of which finished. Where the seeds
move it (a neighbour seeded beats the grid's best), the cell is listed again with the new best's neighbours added to
the lrs seeded, so that the table's optimum is bracketed by seeded lrs; where the seeds put it on the edge of the
lrs swept, the lr a factor 2 past it is added (while the cell has been widened fewer than WIDEN times, default 3,
counting the grid's widenings). A cell whose lrs are all seeded is not listed.
A cell with no stable lr is in neither list (nothing to bracket or to seed).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _cell(sweep: dict, design: str, depth: int) -> tuple[float | None, set[float]]:
    """(best lr, lrs swept) of one design and depth in a sweep.json."""
    cell = next(c for c in sweep["stability"] if (c["connection"], c["depth"]) == (design, depth))
    return cell["best_lr"], {r["lr"] for r in sweep["rows"] if (r["connection"], r["depth"]) == (design, depth)}


def _past_edge(lrs: list[float], best: float) -> float | None:
    """The lr a factor 2 past ``best`` where it is the highest or lowest of ``lrs`` (sorted), else None."""
    return best * 2 if best == lrs[-1] else best / 2 if best == lrs[0] else None


def cells(out: Path, name: str) -> list[tuple[str, int, float | None, list[float], int]]:
    """(design, depth, best lr, lrs swept, how many of them the grid had) per cell of OUT/grid-NAME, a widened
    sweep's figures replacing the grid's."""
    grid = json.loads((out / f"grid-{name}" / "sweep.json").read_text())
    rows = []
    for s in grid["stability"]:
        design, depth = s["connection"], s["depth"]
        wide = out / f"grid-{name}-{design}-L{depth}" / "sweep.json"
        best, lrs = _cell(json.loads(wide.read_text()) if wide.is_file() else grid, design, depth)
        rows.append((design, depth, best, sorted(lrs), len(_cell(grid, design, depth)[1])))
    return rows


def _fmt(values: list[float]) -> str:
    return ",".join(f"{v:g}" for v in values)


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4) or argv[0] not in ("edges", "seeds"):
        print(__doc__, file=sys.stderr)
        return 2
    what, out, name = argv[0], Path(argv[1]), argv[2]
    widen = int(argv[3]) if len(argv) == 4 else 3
    for design, depth, best, lrs, base in cells(out, name):
        if best is None:
            continue
        if what == "edges":
            past = _past_edge(lrs, best)
            if past is not None:
                print(design, depth, _fmt(sorted(lrs + [past])))
        else:
            seeded_sweep = out / f"seeds-{name}-{design}-L{depth}" / "sweep.json"
            seeded: set[float] = set()
            if seeded_sweep.is_file():
                best, seeded = _cell(json.loads(seeded_sweep.read_text()), design, depth)
                if best is None:
                    continue
                lrs = sorted(set(lrs) | seeded)
            i = lrs.index(best)
            wanted = set(lrs[max(i - 1, 0): i + 2])
            past = _past_edge(lrs, best)
            if seeded and past is not None and len(lrs) - base < widen:  # past the edge, as the grid widens
                wanted.add(past)
            if not wanted <= seeded:
                print(design, depth, _fmt(sorted(wanted | seeded)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
