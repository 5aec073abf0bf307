"""The coordinate check (``skiplab analyze coord-check``): what it measures against hand computation, the slope and
its interval against scipy's regression, the verdicts on the standard parametrisation and width μP, a μP broken on
purpose (its hidden learning rates left unscaled) caught, the files and the bad inputs."""

import json
import math

import pytest
import torch
from scipy import stats

from skiplab.analysis import coord_check as reading
from skiplab.cli import main
from skiplab.train import coord_check, parametrization
from skiplab.train.coord_check import CoordCheckConfig, check_point
from tests.train.test_distributed import one_thread

SMALL = dict(widths=(32, 64, 128), depths=(2, 4, 8), steps=3, seeds=3, context=32, batch_size=16)


def test_what_it_measures_is_the_hand_computed_rms():
    cfg = CoordCheckConfig(connection="PreLN", widths=(32, 64), depths=(2, 3), steps=2, seeds=1, context=8,
                           batch_size=2)
    with one_thread():
        rows = check_point(cfg, 32, 2, seed=1)
    assert [r["step"] for r in rows] == [0, 1, 2] and rows[0]["delta_logits_rms"] == 0.0
    # the start, made again by hand: the same seed's model on the probe batch
    torch.manual_seed(1)
    from skiplab.models import build_model
    model = build_model(cfg.model_config(32, 2)).eval()
    tokens = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(10_001))
    seen = {}

    def keep(name):
        def hook(module, args):
            seen.setdefault(name, args[0])
        return hook

    model.norm.register_forward_pre_hook(keep("final"))
    model.layers[0].conn_attn.register_forward_pre_hook(keep("x0"))
    with torch.no_grad():
        logits = model(tokens)
    rms = lambda t: t.double().pow(2).mean().sqrt().item()  # noqa: E731
    assert rows[0]["logits_rms"] == pytest.approx(rms(logits), rel=1e-6)
    assert rows[0]["final_rms"] == pytest.approx(rms(seen["final"]), rel=1e-6)
    assert rows[0]["stream_rms_by_layer"][0] == pytest.approx(rms(seen["x0"]), rel=1e-6)
    assert len(rows[0]["stream_rms_by_layer"]) == len(rows[0]["branch_rms_by_layer"]) == 4  # 2 layers x 2
    assert rows[0]["stream_rms"] == pytest.approx(sum(rows[0]["stream_rms_by_layer"]) / 4)
    assert rows[2]["delta_logits_rms"] > 0 and rows[2]["delta_final_rms"] > 0


def test_the_slope_and_its_interval_are_scipys_regression_in_log2():
    xs, ys = [32, 32, 64, 64, 128, 128], [1.0, 1.2, 2.1, 1.9, 4.4, 3.7]
    b, lo, hi = reading.slope(xs, ys)
    fit = stats.linregress([math.log2(x) for x in xs], [math.log2(y) for y in ys])
    half = stats.t.ppf(0.975, len(xs) - 2) * fit.stderr
    assert b == pytest.approx(fit.slope) and lo == pytest.approx(fit.slope - half) and hi == pytest.approx(fit.slope + half)
    assert reading.slope([1, 2, 4], [3, 3, 3]) == pytest.approx((0.0, 0.0, 0.0))
    assert reading.slope([1, 2], [1, 2])[1:] == (-math.inf, math.inf)  # two points: no interval
    assert [reading.verdict(*v, 0.25) for v in ((-0.1, 0.2), (0.3, 0.9), (-0.9, -0.3), (-0.1, 0.4))] == \
        ["flat", "grows", "shrinks", "unclear"]


def checked(kind: str) -> dict:
    with one_thread():
        result = coord_check.coord_check(CoordCheckConfig(connection="PreLN", parametrization=kind, **SMALL),
                                         progress=False)
    return reading.summary(result)


def slopes_of(summary: dict, axis: str) -> dict[str, float]:
    return {r["quantity"]: r["slope"] for r in summary["slopes"] if r["axis"] == axis}


def test_standard_grows_with_width_and_mup_does_not_and_completep_holds_depth():
    standard, mup, completep = checked("standard"), checked("mup"), checked("completep")
    assert standard["axes"]["width"] == "grows"
    assert all(b > 0.5 for b in slopes_of(standard, "width").values())
    assert all(abs(b) < 0.35 for b in slopes_of(mup, "width").values()), slopes_of(mup, "width")
    assert mup["axes"]["depth"] == "grows" and slopes_of(mup, "depth")["stream_rms"] > 0.7  # PreLN's stream ~ L
    assert all(abs(b) < 0.35 for b in slopes_of(completep, "depth").values()), slopes_of(completep, "depth")


def test_a_mup_broken_on_purpose_is_caught(monkeypatch):
    """The hidden matrices' lr left at the base lr (no 1/m_d): width μP no more, and the check says so."""
    groups = parametrization.parameter_groups

    def unscaled(model, weight_decay, param=parametrization.Parametrization(), eps=1e-8):
        out = groups(model, weight_decay, param, eps)
        for g in out:
            if g.get("name") == "hidden_matrices":
                g["lr_scale"] = 1.0
        return out

    monkeypatch.setattr(parametrization, "parameter_groups", unscaled)
    broken = checked("mup")
    assert broken["axes"]["width"] == "grows"
    assert slopes_of(broken, "width")["delta_final_rms"] > 0.5


def test_the_command_writes_its_files_and_says_where_it_ran(tmp_path, capsys):
    out = tmp_path / "cc"
    args = ["analyze", "coord-check", "PreLN", "PreLN@mup", "--widths", "32,64", "--depths", "1,2", "--steps", "1",
            "--seeds", "2", "--context", "8", "--batch-size", "2", "--out", str(out)]
    with one_thread():
        assert main(args) == 0
    assert sorted(p.name for p in out.iterdir()) == ["PreLN_mup.png", "PreLN_standard.png", "coord_check.json",
                                                     "coord_check.md"]
    data = json.loads((out / "coord_check.json").read_text())
    assert [c["label"] for c in data["cases"]] == ["PreLN (standard)", "PreLN (mup)"]
    assert data["environment"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert len(data["cases"][0]["rows"]) == (2 + 2) * 2 * 2  # (widths + depths) x seeds x (steps + 1)
    md = (out / "coord_check.md").read_text()
    assert "| PreLN (mup)" in md and "torch " in md
    before = (out / "coord_check.md").read_text()
    assert main(args) == 2  # exists: refused, nothing touched
    assert "exists; use --overwrite" in capsys.readouterr().err
    assert (out / "coord_check.md").read_text() == before


@pytest.mark.parametrize("extra, problem", [
    (["NoSuch"], "coord-check case 'NoSuch': "),
    (["DeepNorm@completep"], "coord-check case 'DeepNorm@completep': --parametrization completep scales pre-norm"),
    (["PreLN@bogus"], "unknown parametrization 'bogus'"),
    (["PreLN", "--widths", "32"], "at least two different positive widths"),
    (["PreLN", "--widths", "32,40"], "multiple of the head size 16; 40 is not"),
    (["PreLN", "PreLN"], "a case is given twice"),
    (["PreLN", "--tolerance", "0"], "--tolerance must be > 0"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, extra, problem):
    out = tmp_path / "cc"
    assert main(["analyze", "coord-check", *extra, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert problem in err and len(err.splitlines()) == 1
    assert not out.exists()
