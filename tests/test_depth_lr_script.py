"""experiments/depth_lr.sh with a stand-in for skiplab: the grids, then three seeds at each grid optimum and its
neighbours (two where the optimum is on the grid's edge), then the table read from every sweep."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "experiments" / "depth_lr.sh"

# the stand-in: records its arguments; a sweep of one seed writes the stability and rows the script reads, its best lr
# the swept one nearest a target per depth (4: 1.6e-2, bracketed after two widenings; 8: 1e-1, still on the edge
# after three; 16: 1e-3, inside the grid; 32: 1e-4, below it) and none for LNS (nothing stable); a sweep of three
# seeds makes its lowest lr the best at 16 layers (the seeds move the optimum down), its middle one elsewhere
STUB = r'''#!PYTHON
import json, math, sys
from pathlib import Path
args = sys.argv[1:]
with open(LOG, "a") as f:
    f.write(json.dumps(args) + "\n")
value = {a: args[i + 1] for i, a in enumerate(args[:-1]) if a.startswith("--")}
if args[0] == "sweep":
    Path(value["--out"]).mkdir(parents=True, exist_ok=True)
if args[0] == "sweep" and value["--seeds"] == "1":
    target = {4: 1.6e-2, 8: 1e-1, 16: 1e-3, 32: 1e-4}
    lrs = [float(v) for v in value["--lrs"].split(",")]
    cells = [(c, int(d)) for c in value["--connections"].split(",") for d in value["--depths"].split(",")]
    best = lambda c, d: None if c == "LNS" else min(lrs, key=lambda lr: abs(math.log(lr / target[d])))
    Path(value["--out"], "sweep.json").write_text(json.dumps({
        "stability": [{"connection": c, "depth": d, "best_lr": best(c, d)} for c, d in cells],
        "rows": [{"connection": c, "depth": d, "lr": lr} for c, d in cells for lr in lrs]}))
if args[0] == "sweep" and value["--seeds"] == "3":  # the seeds' best: the lowest lr seeded at 16 layers, else the middle
    lrs = sorted(float(v) for v in value["--lrs"].split(","))
    c, d = value["--connections"], int(value["--depths"])
    Path(value["--out"], "sweep.json").write_text(json.dumps({
        "stability": [{"connection": c, "depth": d, "best_lr": lrs[0] if d == 16 else lrs[len(lrs) // 2]}],
        "rows": [{"connection": c, "depth": d, "lr": lr} for lr in lrs]}))
'''


def run(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    log = tmp_path / "calls.jsonl"
    stub = tmp_path / "skiplab"
    stub.write_text(STUB.replace("PYTHON", sys.executable).replace("LOG", repr(str(log))))
    stub.chmod(0o755)
    done = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out")], capture_output=True, text=True, cwd=ROOT,
                          env={"PATH": os.environ["PATH"], "SKIPLAB": str(stub), **env}, timeout=60)
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return done, calls


def _opts(call: list[str]) -> dict[str, str]:
    return {a: call[i + 1] for i, a in enumerate(call[:-1]) if a.startswith("--")}


def _names(calls, prefix):
    return [(Path(_opts(c)["--out"]).name, _opts(c)["--lrs"]) for c in calls
            if c[0] == "sweep" and Path(_opts(c)["--out"]).name.startswith(prefix)]


def test_the_grids_widened_at_their_edges_then_seeds_around_each_optimum_then_the_table(tmp_path):
    done, calls = run(tmp_path, DEPTHS="4,8,16,32", OTHER_DEPTHS="4")
    assert done.returncode == 0, done.stderr
    grid = "2.5e-4,5e-4,1e-3,2e-3,4e-3"
    widened = {4: ["0.00025,0.0005,0.001,0.002,0.004,0.008", "0.00025,0.0005,0.001,0.002,0.004,0.008,0.016",
                   "0.00025,0.0005,0.001,0.002,0.004,0.008,0.016,0.032"],
               8: ["0.00025,0.0005,0.001,0.002,0.004,0.008", "0.00025,0.0005,0.001,0.002,0.004,0.008,0.016",
                   "0.00025,0.0005,0.001,0.002,0.004,0.008,0.016,0.032"],
               32: ["0.000125,0.00025,0.0005,0.001,0.002,0.004", "6.25e-05,0.000125,0.00025,0.0005,0.001,0.002,0.004"]}
    expected = []
    for name, designs, depths in (("standard", ["PreLN"], [4, 8, 16, 32]), ("completep", ["PreLN"], [4, 8, 16, 32]),
                                  ("others", ["DeepNorm", "LNS", "PeriLN"], [4])):
        expected.append((f"grid-{name}", grid))
        for r in range(3):  # round by round, the cells still on an edge
            expected += [(f"grid-{name}-{c}-L{d}", widened[d][r]) for c in designs for d in depths
                         if c != "LNS" and d in widened and r < len(widened[d])]
    got = _names(calls, "grid-")
    assert sorted(got) == sorted(expected)  # two cells of a round side by side: in either order
    assert [n for n, _ in got if n.count("-") == 1] == ["grid-standard", "grid-completep", "grid-others"]
    for cell in {n for n, _ in got}:  # a cell's grid only ever widens, round after round
        assert [w for n, w in got if n == cell] == [w for n, w in expected if n == cell]
    assert all(_opts(c)["--seeds"] == "1" for c in calls if c[0] == "sweep" and "/grid-" in _opts(c)["--out"])
    cp = [c for c in calls if c[0] == "sweep" and "grid-completep" in _opts(c)["--out"]]
    assert all(_opts(c)["--parametrization"] == "completep" and _opts(c)["--depth-base"] == "4" for c in cp)
    assert not any("--parametrization" in c for c in calls if "completep" not in _opts(c).get("--out", "completep"))
    around = {4: "0.008,0.016,0.032", 8: "0.016,0.032", 16: "0.0005,0.001,0.002", 32: "6.25e-05,0.000125,0.00025"}
    # at 16 layers the seeds put the best at 5e-4, whose lower neighbour 2.5e-4 (the grid's edge) is seeded in a
    # second round; then 2.5e-4 is best, on the edge, and the lrs are widened past it round after round (three
    # rounds after the first); at 8 layers the seeds' best is the top, 0.032, but the cell was widened three times
    rounds = ["0.00025,0.0005,0.001,0.002", "0.000125,0.00025,0.0005,0.001,0.002",
              "6.25e-05,0.000125,0.00025,0.0005,0.001,0.002"]
    seeds = [(f"seeds-{n}-PreLN-L{d}", lrs) for n in ("standard", "completep") for d, lrs in around.items()]
    for n in ("standard", "completep"):  # after the first round's cells of the family
        at = seeds.index((f"seeds-{n}-PreLN-L32", around[32])) + 1
        seeds[at:at] = [(f"seeds-{n}-PreLN-L16", lrs) for lrs in rounds]
    seeds += [(f"seeds-others-{c}-L4", around[4]) for c in ("DeepNorm", "PeriLN")]  # LNS: nothing stable
    assert _names(calls, "seeds-") == seeds
    assert all(_opts(c)["--seeds"] == "3" for c in calls if c[0] == "sweep" and "/seeds-" in _opts(c)["--out"])
    table = calls[-1]
    assert table[:2] == ["analyze", "lr-depth"] and _opts(table)["--out"].endswith("out/table")
    named = sorted(Path(p).name for p in table[2:] if not p.startswith("--") and not p.endswith("table"))
    assert named == sorted({n for n, _ in expected} | {n for n, _ in seeds})


def test_stage_1_runs_the_grids_alone(tmp_path):
    done, calls = run(tmp_path, STAGE="1", DEPTHS="16", OTHER_DEPTHS="16", WIDEN="0")
    assert done.returncode == 0, done.stderr
    assert [Path(_opts(c)["--out"]).name for c in calls] == ["grid-standard", "grid-completep", "grid-others"]
    assert json.loads((tmp_path / "out" / "grid-standard" / "sweep.json").read_text())["stability"][0]["depth"] == 16


def test_names_trains_and_seeds_only_the_families_named_in_that_order_and_the_table_reads_every_sweep(tmp_path):
    (tmp_path / "out" / "grid-others").mkdir(parents=True)  # a family trained in an earlier sitting
    done, calls = run(tmp_path, NAMES="completep standard", DEPTHS="16", WIDEN="0")
    assert done.returncode == 0, done.stderr
    names = [Path(_opts(c)["--out"]).name for c in calls if c[0] == "sweep"]
    assert names == ["grid-completep", "grid-standard", "seeds-completep-PreLN-L16", "seeds-standard-PreLN-L16"]
    assert "grid-others" in [Path(p).name for p in calls[-1][2:]]


def test_an_unknown_name_is_refused_in_one_line_before_anything_runs(tmp_path):
    done, calls = run(tmp_path, NAMES="standard preln")
    assert done.returncode == 2 and calls == []
    assert done.stderr.strip().splitlines() == ["depth_lr.sh: NAMES: unknown family 'preln' (standard, completep, others)"]
