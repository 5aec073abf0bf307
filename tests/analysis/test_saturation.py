"""``skiplab analyze saturation``: DyT layers' saturated share and mean tanh' per kept checkpoint, against hand
computation from hooks on the same checkpoints, its special cases, the masks it counts, and its refusals."""

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from skiplab import run_dir
from skiplab.analysis.saturation import checkpoints, entries, saturation, table, valid_losses
from skiplab.analysis.trained import Examples, Trained
from skiplab.cli import main
from skiplab.connections.norms import DyT
from skiplab.tasks import load_trained
from tests.analysis.conftest import TINY_GPT as TINY, tiny_lm_runs



@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A tiny PreDyT GPT with step checkpoints at 2 and 4, and a PreLN one."""
    return tiny_lm_runs(tmp_path_factory.mktemp("saturation"),
                        {name: TINY.format(layers=2, conn=conn) for name, conn in (("dyt", "PreDyT"), ("preln", "PreLN"))},
                        eval_every=2, lr="3e-2")


def by_hand(tr, path, threshold, examples):
    """(share, mean tanh') per DyT layer of the checkpoint at ``path``, from its own hooks."""
    tr.model.load_state_dict(run_dir.load_checkpoint(path, kind="lm")["model"])
    seen = {}
    layers = {n: m for n, m in tr.model.named_modules() if isinstance(m, DyT)}
    hooks = [m.register_forward_pre_hook(lambda m, a, n=n: seen.setdefault(n, []).append(a[0].double() * m.alpha.item()))
             for n, m in layers.items()]
    with torch.no_grad():
        for ex in tr.examples("test", examples, 0):
            tr.forward(ex)
    for h in hooks:
        h.remove()
    out = {}
    for n, zs in seen.items():
        z = torch.cat([x.flatten() for x in zs])
        out[n] = ((z.abs() > threshold).double().mean().item(), (1 / torch.cosh(z) ** 2).mean().item())
    return out


def test_against_hooks_on_every_kept_checkpoint(runs):
    tr = load_trained(runs / "dyt")
    before = {k: v.clone() for k, v in tr.model.state_dict().items()}
    result = saturation(tr, examples=5, threshold=0.02, progress=False)
    files = checkpoints(runs / "dyt", "lm")
    assert [f.name for f in files] == ["checkpoint_2.pt", "checkpoint_4.pt"]  # last.pt is step 4 again
    assert [c["step"] for c in result["checkpoints"]] == [2, 4]
    assert all(torch.equal(v, tr.model.state_dict()[k]) for k, v in before.items())  # the model is put back
    names = [x["layer"] for x in result["checkpoints"][0]["layers"]]
    assert names == ["layers.0.conn_attn.norm", "layers.0.conn_mlp.norm", "layers.1.conn_attn.norm",
                     "layers.1.conn_mlp.norm", "norm"]
    losses = valid_losses(runs / "dyt")
    for row, path in zip(result["checkpoints"], files):
        assert row["valid_loss"] == losses[row["step"]]
        hand = by_hand(tr, path, 0.02, 5)
        for x in row["layers"]:
            share, gain = hand[x["layer"]]
            assert x["saturated"] == pytest.approx(share, abs=1e-12)
            assert x["gain"] == pytest.approx(gain, rel=1e-9)
            assert 0 < share < 1  # the threshold cuts inside the entries: the count is not trivially 0 or 1
    # a change that moves the layers' inputs moves the shares: the comparison is not blind
    assert result["checkpoints"][0]["layers"][-1]["saturated"] != result["checkpoints"][1]["layers"][-1]["saturated"]


def test_special_cases_of_alpha(runs, tmp_path):
    """α large: every entry saturated, tanh' ≈ 0; α = 0: none, tanh' = 1 exactly."""
    state = run_dir.load_checkpoint(runs / "dyt" / "checkpoint_4.pt", kind="lm")
    for name, alpha, share, gain in (("big", 1e6, 1.0, 0.0), ("zero", 0.0, 0.0, 1.0)):
        run = tmp_path / name
        run.mkdir()
        for f in ("config.json", "metrics.jsonl"):
            (run / f).write_bytes((runs / "dyt" / f).read_bytes())
        changed = {**state, "model": {k: (torch.full_like(v, alpha) if k.endswith("alpha") else v)
                                      for k, v in state["model"].items()}}
        run_dir.save_checkpoint(run / "last.pt", changed)
        result = saturation(load_trained(run), examples=3, progress=False)
        assert [c["file"] for c in result["checkpoints"]] == ["last.pt"]
        for x in result["checkpoints"][0]["layers"]:
            assert x["alpha"] == alpha
            assert x["saturated"] == pytest.approx(share, abs=1e-3)
            assert x["gain"] == pytest.approx(gain, abs=1e-3)


@dataclass
class TwoStacks(Trained):
    kind = "mt"
    stacks = {"encoder": "encoder.layers", "decoder": "decoder.layers"}


def test_entries_count_real_positions_of_the_right_stack():
    tr = TwoStacks(Path("."), None, {}, {})
    x = torch.arange(2 * 3 * 4, dtype=torch.float64).view(2, 3, 4)
    enc = torch.tensor([[True, True, False], [True, False, False]])
    dec = torch.tensor([[True, False, False], [True, True, True]])
    ex = Examples((), torch.zeros(1), {"encoder": enc, "decoder": dec})
    assert torch.equal(entries(tr, ex, "encoder.layers.1.conn_ffn.norm", x, "seq"), x[enc].flatten())
    assert torch.equal(entries(tr, ex, "decoder.layers.0.conn_attn.norm", x, "seq"), x[dec].flatten())
    assert torch.equal(entries(tr, ex, "decoder.norm", x, "seq"), x[dec].flatten())  # outside the blocks: by name
    assert entries(tr, ex, "layers.0.norm", torch.ones(2, 3, 4, 5), "conv").numel() == 120  # a feature map: all
    one = Examples((), torch.zeros(1), {"decoder": dec})
    assert torch.equal(entries(tr, one, "norm", x, "seq"), x[dec].flatten())  # the one mask of its shape


def test_a_run_without_dyt_is_refused_in_one_line_and_nothing_is_written(runs, capsys):
    with pytest.raises(ValueError, match="has no DyT layer"):
        saturation(load_trained(runs / "preln"), examples=2, progress=False)
    assert main(["analyze", "saturation", str(runs / "preln"), "--examples", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no DyT layer" in err[0]
    assert not (runs / "preln" / "analysis").exists()
    with pytest.raises(ValueError, match="threshold must be positive"):
        saturation(load_trained(runs / "dyt"), threshold=0, progress=False)


def test_one_checkpoint_file_is_refused_not_filed_as_the_whole_run(runs, capsys):
    """saturation reads every checkpoint of the run: given checkpoint_2.pt it wrote every checkpoint's table into
    saturation.checkpoint_2.json, whose record named step 2."""
    assert main(["analyze", "saturation", str(runs / "dyt" / "checkpoint_2.pt"), "--examples", "2"]) == 2
    err = capsys.readouterr().err
    assert "checkpoint_2.pt: saturation reads every checkpoint of a run, across its training; give the run folder" \
        in err and err.count("\n") == 1
    assert not list((runs / "dyt").glob("analysis/saturation.checkpoint_2.*"))


def test_from_the_command_line(runs):
    assert main(["analyze", "saturation", str(runs / "dyt"), "--examples", "3", "--threshold", "0.5"]) == 0
    for f in ("saturation.json", "saturation.md", "saturation.png"):
        assert (runs / "dyt" / "analysis" / f).is_file()
    result = json.loads((runs / "dyt" / "analysis" / "saturation.json").read_text())
    assert result["threshold"] == 0.5 and [c["step"] for c in result["checkpoints"]] == [2, 4]
    assert "| step | valid loss | 0.attn" in (runs / "dyt" / "analysis" / "saturation.md").read_text()


def test_an_image_run_shows_its_test_loss(fashion_dir, tmp_path):
    """An image run records no validation loss: its rows carry the test loss it recorded at each step."""
    run = tmp_path / "dyt-image"
    assert main(["train", "image", "--dataset", "fashion-mnist", "--data-dir", str(fashion_dir), "--depth", "8",
                 "--connection", "2xSkip+DyT", "--epochs", "1", "--batch-size", "64", "--out", str(run)]) == 0
    result = saturation(load_trained(run), examples=8, progress=False)
    recorded = {int(r["step"]): r["test_loss"] for r in run_dir.read_metrics(run) if "test_loss" in r}
    assert result["loss"] == "test_loss" and recorded
    for row in result["checkpoints"]:
        assert row["test_loss"] == recorded[row["step"]]
    assert "test loss" in table(result).splitlines()[2]


def test_a_seed_given_for_a_language_models_first_windows_is_said_to_change_nothing(runs, capsys):
    """A language model's examples are its split's first windows: a seed given changes nothing, and says so."""
    argv = ["analyze", "saturation", str(runs / "dyt"), "--examples", "4", "--overwrite"]
    assert main(argv) == 0
    plain = json.loads((runs / "dyt" / "analysis" / "saturation.json").read_text())
    assert "note:" not in capsys.readouterr().err
    assert main([*argv, "--seed", "3"]) == 0
    err = capsys.readouterr().err
    assert "note: saturation reads a language model's first 4 windows of the split, the same whatever --seed" in err
    seeded = json.loads((runs / "dyt" / "analysis" / "saturation.json").read_text())
    assert seeded["checkpoints"] == plain["checkpoints"]
