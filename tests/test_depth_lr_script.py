"""experiments/depth_lr.sh with a stand-in for skiplab: the grids, then three seeds at each grid optimum and its
neighbours (two where the optimum is on the grid's edge), then the table read from every sweep."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "experiments" / "depth_lr.sh"

# the stand-in: records its arguments; a grid sweep writes the stability the script reads (best lr 1e-3 at depth 4,
# the grid's highest at depth 8, its lowest at 16, none at 32)
STUB = r'''#!PYTHON
import json, sys
from pathlib import Path
args = sys.argv[1:]
with open(LOG, "a") as f:
    f.write(json.dumps(args) + "\n")
value = {a: args[i + 1] for i, a in enumerate(args[:-1]) if a.startswith("--")}
if args[0] == "sweep":
    Path(value["--out"]).mkdir(parents=True)
if args[0] == "sweep" and Path(value["--out"]).name.startswith("grid-"):
    best = {4: 1e-3, 8: 4e-3, 16: 2.5e-4, 32: None}
    stability = [{"connection": c, "depth": int(d), "best_lr": best[int(d)]}
                 for c in value["--connections"].split(",") for d in value["--depths"].split(",")]
    Path(value["--out"], "sweep.json").write_text(json.dumps({"stability": stability}))
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


def test_the_grids_then_seeds_around_each_optimum_then_the_table(tmp_path):
    done, calls = run(tmp_path, DEPTHS="4,8,16,32", OTHER_DEPTHS="4")
    assert done.returncode == 0, done.stderr
    grids = [c for c in calls if Path(_opts(c)["--out"]).name.startswith("grid-")]
    assert [Path(_opts(c)["--out"]).name for c in grids] == ["grid-standard", "grid-completep", "grid-others"]
    assert all(_opts(c)["--lrs"] == "2.5e-4,5e-4,1e-3,2e-3,4e-3" and _opts(c)["--seeds"] == "1" for c in grids)
    assert _opts(grids[1])["--parametrization"] == "completep" and _opts(grids[1])["--depth-base"] == "4"
    seeds = [(Path(_opts(c)["--out"]).name, _opts(c)["--lrs"], _opts(c)["--seeds"], _opts(c).get("--parametrization"))
             for c in calls if Path(_opts(c)["--out"]).name.startswith("seeds-")]
    around = {4: "0.0005,0.001,0.002", 8: "0.002,0.004", 16: "0.00025,0.0005"}  # no optimum at 32: no seeds
    expected = [(f"seeds-standard-PreLN-L{d}", lrs, "3", None) for d, lrs in around.items()]
    expected += [(f"seeds-completep-PreLN-L{d}", lrs, "3", "completep") for d, lrs in around.items()]
    expected += [(f"seeds-others-{c}-L4", around[4], "3", None) for c in ("DeepNorm", "LNS", "PeriLN")]
    assert seeds == expected
    table = calls[-1]
    assert table[:2] == ["analyze", "lr-depth"] and _opts(table)["--out"].endswith("out/table")
    named = sorted(Path(p).name for p in table[2:] if not p.startswith("--") and not p.endswith("table"))
    assert named == sorted(["grid-standard", "grid-completep", "grid-others", *(e[0] for e in expected)])


def test_stage_1_runs_the_grids_alone(tmp_path):
    done, calls = run(tmp_path, STAGE="1", DEPTHS="4")
    assert done.returncode == 0, done.stderr
    assert [Path(_opts(c)["--out"]).name for c in calls] == ["grid-standard", "grid-completep", "grid-others"]
    assert json.loads((tmp_path / "out" / "grid-standard" / "sweep.json").read_text())["stability"][0]["depth"] == 4
