"""benchmarks/profile_gpu.py: the compiled bench step of PreLN and of the designs named or found above their goal in
a bench.json, profiled, each with its trace; at smoke size on the CPU here (on a card the same with kernels)."""

import gzip
import json
import math

import pytest

from skiplab.bench.gpu import GOALS
from tests.test_bench import _benchmark

profile_gpu = _benchmark("profile_gpu")


def test_each_design_is_profiled_beside_preln_with_its_trace(tmp_path):
    result = profile_gpu.main(["--designs", "PreLN+ValueRes", "--steps", "1", "--top", "5", "--out", str(tmp_path)])
    assert [p["design"] for p in result["profiles"]] == ["PreLN", "PreLN+ValueRes"]
    saved = json.loads((tmp_path / "profile.json").read_text())
    assert [p["design"] for p in saved["profiles"]] == ["PreLN", "PreLN+ValueRes"] and saved["device"] == "cpu"
    for p in saved["profiles"]:
        with gzip.open(tmp_path / p["trace"]) as f:
            assert json.load(f)["traceEvents"]  # a Chrome trace
        assert p["wall_ms"] > 0 and p["host_ms"] > 0 and p["device_ms"] == 0  # no card: no kernels
        assert any(v["host_ms"] > 0 and not v["kernel"] for v in p["events"].values())
    md = (tmp_path / "profile.md").read_text()
    assert "## PreLN: " in md and "## PreLN+ValueRes: " in md and "(trace-PreLN-ValueRes.json.gz)" in md
    assert md.count("| kernel | host ms a step | calls | PreLN's (host ms) |") == 2
    section = md.split("## PreLN+ValueRes: ")[1]
    assert len([line for line in section.splitlines() if line.startswith("| `")]) == 5  # --top


def test_a_profile_is_replaced_only_when_asked_and_then_whole(tmp_path, capsys):
    """A second profile into the same --out replaced the report silently and left the first one's traces beside
    it (18 files for two designs)."""
    profile_gpu.main(["--designs", "PreLN+ValueRes", "--steps", "1", "--out", str(tmp_path)])
    before = (tmp_path / "profile.json").read_bytes()
    with pytest.raises(SystemExit) as e:
        profile_gpu.main(["--steps", "1", "--out", str(tmp_path)])
    assert e.value.code == 2 and "holds a profile" in capsys.readouterr().err
    assert (tmp_path / "profile.json").read_bytes() == before
    profile_gpu.main(["--steps", "1", "--out", str(tmp_path), "--overwrite"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["profile.json", "profile.md", "trace-PreLN.json.gz"]


def test_the_designs_above_their_goal_are_read_from_a_bench_json(tmp_path):
    rows = [{"name": "PostLN step", "value": 1.05}, {"name": "mHC step", "value": 1.20},
            {"name": "SAS step", "value": 1.30}, {"name": "nGPT whole model step", "value": 1.5},
            {"name": "HC step", "value": math.nan}, {"name": "PreLN MFU", "value": 40.0},
            {"name": "PreLN+MUDD step", "value": 1.16}, {"name": "PeriLN step", "value": 1.101}]
    assert GOALS["mHC"] == GOALS["PreLN+MUDD"] == 1.15 and GOALS["SAS"] == 1.35
    assert profile_gpu.missed({"rows": rows}) == ["mHC", "PreLN+MUDD", "PeriLN"]
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"rows": [{"name": "PeriLN step", "value": 1.2}]}))
    result = profile_gpu.main(["--from-bench", str(bench), "--steps", "1", "--budget", "0", "--out",
                               str(tmp_path / "out")])
    assert [p["design"] for p in result["profiles"]] == ["PreLN"] and result["not_reached"] == ["PeriLN"]
    assert "Not reached within 0 s: PeriLN." in (tmp_path / "out" / "profile.md").read_text()


@pytest.mark.parametrize("argv, message", [
    (["--designs", "PreLM"], "not a design of the GPU bench: PreLM"),
    (["--from-bench", "/nonexistent/bench.json"], "--from-bench: cannot read /nonexistent/bench.json"),
    (["--designs", "HC", "--steps", "0"], "--steps and --top must be at least 1"),
])
def test_bad_arguments_are_one_line(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        profile_gpu.main([*argv, "--out", str(tmp_path / "out")])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
