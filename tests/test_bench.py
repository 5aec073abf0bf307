"""``skiplab bench --quick``: every group runs on tiny shapes and produces every row (values are not timed
against thresholds here: speed is measured by the full benchmark, side by side)."""

import json
import math

import pytest

from skiplab.bench import GROUPS, run
from skiplab.bench.suite import DEPTH_DESIGNS, HYPER_DESIGNS, IMAGE_DESIGNS, LM_DESIGNS, MT_DESIGNS, default_groups
from skiplab.cli import main


def test_quick_bench_produces_every_row(tmp_path):
    rows = run(quick=True, out=str(tmp_path), progress=False)
    by_group = {}
    for r in rows:
        by_group.setdefault(r.group, []).append(r)
        assert math.isfinite(r.value) and r.value > 0, r
    assert set(by_group) == set(default_groups()) == set(GROUPS) - {"gpu"}  # no card here: gpu runs when asked
    names = " | ".join(r.name for r in rows)
    for design in IMAGE_DESIGNS[1:]:
        assert f"{design} step" in names
    for design in (*MT_DESIGNS[1:], "dwlstm"):
        assert any(r.group == "mt" and r.name == f"{design} step" and "FLOP ratio" in r.note for r in rows)
    for design in LM_DESIGNS[1:]:
        assert any(r.group == "lm" and r.name == f"{design} step" and "FLOP ratio" in r.note for r in rows)
    for group, designs in (("hyper", HYPER_DESIGNS), ("depth", DEPTH_DESIGNS)):
        for design, goal in designs.items():
            for mode in ("eager", "compiled"):
                assert any(r.group == group and r.name.endswith(f" {design} step, {mode}") and f"goal {goal}x" in r.note
                           for r in rows), (group, design, mode)
    assert any(r.group == "lm" and r.name == "skiplab PreLN decoder / torch.nn layers" for r in rows)
    assert any(r.group == "lm" and "new tokens: recomputing the prefix / cached" in r.name for r in rows)
    for what in ("torch.nn.Transformer", "recomputing the prefix", "achieved training FLOP/s", "padding share",
                 "nn.RMSNorm / nn.LayerNorm", "fused RMSNorm / nn.LayerNorm", "compiled / eager", "2 processes / 1",
                 "per-step telemetry: the step with it / without", "per-layer telemetry at N = 10 / without"):
        assert what in names, what
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["quick"] and len(saved["rows"]) == len(rows)
    assert (tmp_path / "bench.md").read_text().count("\n| ") == len(rows) + 1  # header row + one per row


def test_unknown_group_is_a_one_line_error(capsys):
    with pytest.raises(ValueError, match="unknown benchmark group.*known: machine, image"):
        run(quick=True, groups=("imag",))
    assert main(["bench", "--quick", "--groups", "imag"]) == 2
    assert "unknown benchmark group(s) imag" in capsys.readouterr().err
