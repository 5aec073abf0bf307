"""``skiplab analyze``: gradient norms, gates, ratios and activations of trained runs, against hand computation."""

import copy
import shutil
import json

import pytest
import torch
import torch.nn.functional as F

from skiplab.analysis import activations
from skiplab.analysis.analyze import analyze
from skiplab.analysis.gradients import gradient_norms
from skiplab.analysis.learned import learned, table
from skiplab.analysis.norms import norms
from skiplab.analysis.report import legend_labels, per_position
from skiplab.tasks import load_trained
from skiplab.cli import main
from skiplab.connections import iter_connections, recording
from tests.noise import DELTA, assert_within_noise, noise, perturbed


@pytest.fixture(scope="module")
def runs(fashion_dir, tmp_path_factory):
    """Tiny PreAct-ResNet-20 runs (one epoch on 256 images) with a plain, a SAS and a recursive skip."""
    root = tmp_path_factory.mktemp("runs")
    for spec in ("1xSkip", "SAS", "2rSkip+LN", "Highway", "wSkip+LN", "ReZero", "LayerScale"):
        argv = ["train", "image", "--dataset", "fashion-mnist", "--data-dir", str(fashion_dir), "--epochs", "1",
                "--batch-size", "64", "--connection", spec, "--out", str(root / spec)]
        assert main(argv) == 0
    return root


def test_gradient_norms_equal_autograd_per_example(runs):
    tr = load_trained(runs / "2rSkip+LN")
    result = gradient_norms(tr, split="train", examples=40, progress=False)
    assert result["examples"] == 40 and [b["block"] for b in result["blocks"]] == [f"block.{i}" for i in range(9)]
    ex = next(tr.examples("train", 40))  # the same 40 examples, in one batch
    model64 = copy.deepcopy(tr.model).double()
    # the noise (tests/noise.py): each side against its float64 run, and the float64 run on perturbed images
    # (a ReLU input within its float32 error of zero passes or stops its gradient by chance)
    result64, perturbed64 = (gradient_norms(in_float64(tr, delta), split="train", examples=40, progress=False)
                             for delta in (0.0, DELTA))
    for index in (1, 6):  # two chosen blocks, one example at a time
        mean, mean64 = (mean_grad_norm(model, ex, index) for model in (tr.model, model64))
        actual, actual64, bumped = (r["blocks"][index]["grad_norm"] for r in (result, result64, perturbed64))
        assert_within_noise(actual, mean, noise((mean, mean64), (actual, actual64), (bumped, actual64)))


def in_float64(tr, delta):
    """``tr`` with its model in float64 and its images :func:`perturbed` by ``delta`` (0: as they are)."""
    tr64 = copy.copy(tr)
    tr64.model = copy.deepcopy(tr.model).double()
    tr64.forward = lambda ex: tr64.model(perturbed(ex.inputs[0].double(), delta) if delta else ex.inputs[0].double())
    tr64.losses = lambda ex, output: F.cross_entropy(output, ex.target, reduction="none")
    return tr64


def mean_grad_norm(model, ex, index):
    """mean over examples n of ‖∂L_n/∂y_n‖ at block ``index``'s output, one example at a time."""
    block, norms = model.blocks[index], []
    for n in range(len(ex)):
        out = {}
        handle = block.register_forward_hook(lambda m, i, o: out.__setitem__("y", o))
        logits = model(ex.inputs[0][n : n + 1].to(model.fc.weight.dtype))
        handle.remove()
        (grad,) = torch.autograd.grad(F.cross_entropy(logits, ex.target[n : n + 1]), out["y"])
        norms.append(grad.norm().item())
    return sum(norms) / len(norms)


def test_gates_and_ratios_average_the_per_batch_values(runs):
    for spec, what, key, stat in (("SAS", "gates", "alpha", "alpha"), ("SAS", "gates", "beta", "beta"),
                                  ("2rSkip+LN", "ratios", "ratio", "ratio_mean"), ("Highway", "gates", "T", "T")):
        tr = load_trained(runs / spec)
        result = learned(tr, what, split="test", examples=60, progress=False)
        assert result["examples"] == 60
        by_hand, by_hand64 = (averaged_stat(tr, model, stat) for model in (tr.model, copy.deepcopy(tr.model).double()))
        for row in result["connections"]:
            name = row["connection"]
            assert_within_noise(row[key], by_hand[name], noise((by_hand[name], by_hand64[name])), msg=f"{spec} {name}")
    ratios = learned(load_trained(runs / "2rSkip+LN"), "ratios", examples=20, progress=False)
    stage2 = [r["ratio"] for r in ratios["connections"] if r["stage"] == "stage 2"]
    assert ratios["stages"]["stage 2"] == pytest.approx(sum(stage2) / len(stage2)) and ratios["paper"]["ratio"] == 2.64


def averaged_stat(tr, model, stat):
    """Each connection's ``stat`` over 60 test examples: batches of 25, 25, 10, weighted by examples."""
    conns = dict(iter_connections(model))
    by_hand = {name: 0.0 for name in conns}
    with torch.no_grad():
        for ex in tr.examples("test", 60, batch=25):
            model(*(x.to(model.fc.weight.dtype) for x in ex.inputs))
            for name, conn in conns.items():
                by_hand[name] += conn.stats()[stat] * len(ex) / 60
    return by_hand


def test_wskip_reports_its_learned_vector(runs):
    tr = load_trained(runs / "wSkip+LN")
    result = learned(tr, "gates", examples=10, progress=False)
    conns = dict(iter_connections(tr.model))
    assert result["examples"] == 0 and len(result["connections"]) == 9  # a parameter: no data needed
    for row in result["connections"]:
        w = conns[row["connection"]].weight.detach()
        assert row["w_norm"] == pytest.approx(w.norm().item()) and row["w_mean"] == pytest.approx(w.mean().item())
        assert row["dim"] == w.numel()
    assert any(abs(r["w_mean"] - 1.0) > 1e-4 for r in result["connections"])  # trained away from its start


def test_rezero_and_layerscale_report_their_learned_gains(runs):
    for spec, key, read in (("ReZero", "alpha", lambda c: c.alpha.item()),
                            ("LayerScale", "lambda_mean", lambda c: c.scale.mean().item())):
        tr = load_trained(runs / spec)
        result = learned(tr, "gates", examples=10, progress=False)
        conns = dict(iter_connections(tr.model))
        assert result["examples"] == 0 and len(result["connections"]) == 9
        for row in result["connections"]:
            assert row[key] == pytest.approx(read(conns[row["connection"]]))
        assert any(abs(r[key]) > 1e-6 for r in result["connections"])  # ReZero's α and λ moved from 0 and 0.1
        assert any(abs(r[key] - 0.1) > 1e-6 for r in result["connections"])
        assert key in table(result)


def test_per_position_drops_padding():
    value = torch.arange(12.0).reshape(2, 3, 2)  # (B, T, features)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    assert per_position(value, mask, 2).tolist() == [[0.0, 1.0], [2.0, 3.0], [6.0, 7.0]]
    gate = torch.tensor([[[0.5], [0.7], [9.0]], [[0.1], [9.0], [9.0]]])  # padding holds 9s
    assert per_position(gate, mask, 2).mean().item() == pytest.approx((0.5 + 0.7 + 0.1) / 3)
    assert per_position(torch.ones(1, 4, 1, 1), None, 3).shape == (3, 4)  # a broadcast batch axis


def test_activations_count_every_stream_at_real_positions_only():
    """A hyper-connection layer's output is (B, T, n, D): its padding was counted (43% of the values of a Multi30k
    batch), where a (B, T, D) output's was not."""
    class Run:
        def mask(self, ex, name):
            return torch.tensor([[True, True, False], [True, False, False]])

    streams = torch.full((2, 3, 2, 4), 9.0)  # padding holds 9s
    streams[0, :2], streams[1, :1] = 1.0, 2.0
    rows = activations._rows(Run(), "encoder.0", streams, [0, 1])
    assert rows.shape == (3, 8) and set(rows.flatten().tolist()) == {1.0, 2.0}
    assert activations._rows(Run(), "encoder.0", streams[:, :, 0], [0, 1]).shape == (3, 4)


def test_cli_writes_files_refuses_to_overwrite_and_names_missing_quantities(runs, capsys):
    run = runs / "SAS"
    argv = ["analyze", "gates", str(run), "--examples", "30", "--compare", str(runs / "Highway")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "alpha (mean ± std)" in out
    for suffix in ("json", "md", "png"):
        assert (run / "analysis" / f"gates.{suffix}").is_file()
    assert (run / "analysis" / "gates_compare.png").is_file()
    stored = json.loads((run / "analysis" / "gates.json").read_text())
    assert stored["examples"] == 30 and stored["split"] == "train" and stored["config"]["model"] == "preact-resnet20(connection=SAS)"
    ckpt = torch.load(run / "last.pt", weights_only=True)
    assert stored["checkpoint"]["step"] == ckpt.get("step") and stored["checkpoint"]["epoch"] == ckpt.get("epoch")
    assert stored["environment"]["torch"] == torch.__version__ and "git_commit" in stored["environment"]
    before = (run / "analysis" / "gates.json").read_bytes()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "gates.json exists; use --overwrite" in err and err.count("\n") == 1
    assert (run / "analysis" / "gates.json").read_bytes() == before
    assert main([*argv, "--overwrite"]) == 0
    capsys.readouterr()

    assert main(["analyze", "gates", str(runs / "1xSkip"), "--examples", "10"]) == 2
    err = capsys.readouterr().err
    assert "1xSkip has no gates to analyze" in err and err.count("\n") == 1
    assert not (runs / "1xSkip" / "analysis").exists()
    kept = (runs / "Highway" / "analysis" / "gates.json").read_bytes()  # written as the first command's --compare
    assert main(["analyze", "gates", str(runs / "Highway"), "--examples", "10", "--compare", str(runs / "1xSkip"),
                 "--overwrite"]) == 2  # the second run fails: the first one's files are not replaced before it
    assert "1xSkip has no gates to analyze" in capsys.readouterr().err
    assert (runs / "Highway" / "analysis" / "gates.json").read_bytes() == kept
    assert main(["analyze", "ratios", str(runs / "SAS"), "--examples", "10"]) == 2
    assert "SAS has no ratios to analyze" in capsys.readouterr().err
    assert main(["analyze", "gradients", str(runs)]) == 2  # not a run
    assert "no checkpoint at" in capsys.readouterr().err


def test_gradients_and_activations_from_the_command_line(runs, capsys):
    assert main(["analyze", "gradients", str(runs / "1xSkip"), "--examples", "20", "--compare",
                 str(runs / "2rSkip+LN")]) == 0
    assert "mean ‖∂L_n/∂y_n‖" in capsys.readouterr().out
    assert main(["analyze", "activations", str(runs / "2rSkip+LN"), "--examples", "20"]) == 0
    result = json.loads((runs / "2rSkip+LN" / "analysis" / "activations.json").read_text())
    assert len(result["blocks"]) == 9 and len(result["normalised"]) == 9
    post = result["normalised"][4]["post"]
    assert sum(post["histogram"]) == pytest.approx(1.0)
    assert result["blocks"][0]["count"] == 20 * 16 * 32 * 32  # every entry of the first stage's outputs


def test_mt_gates_count_real_positions_only(mt_runs):
    """The padded-batch average equals the one from each sentence alone (no padding), weighted by length."""
    tr = load_trained(mt_runs / "sas")
    result = learned(tr, "gates", split="train", examples=30, progress=False)
    alpha, alpha64 = (alpha_by_sentence(tr, model) for model in (tr.model, copy.deepcopy(tr.model).double()))
    assert len(result["connections"]) == 2 * 2 + 2 * 3
    for row in result["connections"]:
        name = row["connection"]
        assert_within_noise(row["alpha"], alpha[name], noise((alpha[name], alpha64[name])), msg=name)


def alpha_by_sentence(tr, model):
    """Each connection's α over 30 training sentences, each alone (no padding), weighted by its length."""
    conns = dict(iter_connections(model))
    sums, counts = {n: 0.0 for n in conns}, {n: 0 for n in conns}
    with torch.no_grad():
        for ex in tr.examples("train", 30):
            for i in range(len(ex)):
                src = ex.inputs[0][i : i + 1][:, ex.masks["encoder"][i]]
                tgt = ex.inputs[1][i : i + 1][:, ex.masks["decoder"][i]]
                model(src, tgt)
                for name, conn in conns.items():
                    n = src.shape[1] if name.startswith("encoder") else tgt.shape[1]
                    sums[name] += conn.stats()["alpha"] * n
                    counts[name] += n
    return {name: sums[name] / counts[name] for name in conns}


def test_mt_gradients_cover_every_layer_of_both_families(mt_runs):
    for name in ("sas", "dwlstm"):
        result = gradient_norms(load_trained(mt_runs / name), split="valid", examples=8, progress=False)
        assert [b["block"] for b in result["blocks"]] == ["encoder.0", "encoder.1", "decoder.0", "decoder.1"]
        assert all(b["grad_norm"] > 0 for b in result["blocks"]) and result["examples"] == 8


def test_linearity_on_a_strided_image_block(runs, capsys):
    """block.3 halves the resolution and doubles the channels: its linear stand-in is a strided 1x1 conv."""
    from skiplab.analysis.linearity import linearity

    tr = load_trained(runs / "1xSkip")
    result = linearity(tr, ["block.3"], steps=2, sample=2000, progress=False)
    row = result["layers"][0]
    assert result["metric"] == "error" and result["examples"] == 64 and row["fit_rows"] == 2000
    assert row["map"] == "Conv2d 16 -> 32, stride 2"
    assert 0 <= row["error"] <= 100 and row["delta_pct"] == pytest.approx(
        100 * (row["error"] - result["untouched"]) / result["untouched"])
    assert type(tr.model.blocks[3]).__name__ == "PreActBlock"  # put back
    assert main(["analyze", "gradients", str(runs / "1xSkip"), "--compare", str(runs.parent)]) == 2
    assert "no checkpoint at" in capsys.readouterr().err


def test_legend_entries_say_only_what_differs_and_name_a_presets_own_connection():
    assert legend_labels([{"label": "gpt-mini(context=64)"}, {"label": "gpt-mini(connection=2rSkip+LN,context=64)"}]) \
        == ["PreLN", "2rSkip+LN"]  # gpt-mini's own connection, not "-"
    assert legend_labels([{"label": "gpt-mini(layers=4)"}, {"label": "gpt-mini(layers=8)"}]) == ["layers=4", "layers=8"]
    assert legend_labels([{"label": "SAS"}, {"label": "Highway"}]) == ["SAS", "Highway"]  # not model specs


def test_norms_of_an_image_run_are_each_examples_feature_map(runs):
    """An image run's state entering a block is its feature map (B, C, H, W), one row per example: a 4-d tensor
    was summed over its height as if it were n hyper-connection streams (a 2rSkip+LN block's input, RMS 1 after its
    norm, read about 20)."""
    tr = load_trained(runs / "2rSkip+LN")
    result = norms(tr, examples=16, progress=False)
    entering: dict[str, list[torch.Tensor]] = {}
    hooks = [b.register_forward_pre_hook(lambda m, a, name=name: entering.setdefault(name, []).append(a[0]))
             for name, b in tr.blocks().items()]
    with torch.no_grad():
        for ex in tr.examples("test", 16, 0):
            tr.forward(ex)
    for h in hooks:
        h.remove()
    rows = {r["state"]: r for r in result["states"]}
    for name, xs in entering.items():
        rms = torch.cat(xs).double().flatten(1).pow(2).mean(-1).sqrt()
        assert rows[name]["rms_mean"] == pytest.approx(rms.mean().item(), rel=1e-9), name
        assert rows[name]["positions"] == 16
    after_norm = [r["rms_mean"] for n, r in rows.items() if not n.endswith(".out") and not n.endswith(".0")]
    assert max(after_norm) < 1.5  # each block after the first reads the previous block's LN(x + LN(x + F)) output


def test_another_checkpoint_of_a_run_writes_its_own_files(runs, tmp_path, capsys):
    """An analysis of RUN/avg.pt (or a step's checkpoint) stands beside RUN's own: it was refused as "gates.json
    exists", and with --overwrite replaced the last.pt analysis; its JSON names the file it read."""
    run = runs / "Highway"
    (run / "avg1.pt").write_bytes((run / "last.pt").read_bytes())  # another checkpoint file of the run
    for target in (run, run / "avg1.pt"):
        assert main(["analyze", "gates", str(target), "--examples", "10", "--overwrite"]) == 0
    capsys.readouterr()
    own = json.loads((run / "analysis" / "gates.json").read_text())
    avg = json.loads((run / "analysis" / "gates.avg1.json").read_text())
    assert own["checkpoint"]["path"] == str(run) and avg["checkpoint"]["path"] == str(run / "avg1.pt")
    assert (run / "analysis" / "gates.avg1.md").is_file() and (run / "analysis" / "gates.avg1.png").is_file()
    assert main(["analyze", "gates", str(run / "avg1.pt"), "--examples", "10"]) == 2
    assert "gates.avg1.json exists; use --overwrite" in capsys.readouterr().err


def test_gate_and_ratio_spreads_are_across_examples(runs):
    """The ± std of gates and ratios is the spread of each example's own mean (the example alone through the
    model, eval mode), not of every entry: the entries' spread (channels and positions besides) is several times
    larger here, so a std taken over them fails this."""
    for spec, what, key, stat in (("SAS", "gates", "alpha", "alpha"), ("2rSkip+LN", "ratios", "ratio", "ratio_mean"),
                                  ("Highway", "gates", "T", "T")):
        tr = load_trained(runs / spec)
        result = learned(tr, what, split="test", examples=30, progress=False)
        assert result["per"] == "example"
        means = {name: [] for name, _ in iter_connections(tr.model)}
        with torch.no_grad():
            for ex in tr.examples("test", 30):
                for i in range(len(ex)):
                    tr.model(ex.inputs[0][i : i + 1])
                    for name, conn in iter_connections(tr.model):
                        means[name].append(conn.stats()[stat])
        for row in result["connections"]:
            each = torch.tensor(means[row["connection"]], dtype=torch.float64)
            assert len(each) == 30
            assert row[f"{key}_std"] == pytest.approx(each.std(unbiased=False).item(), rel=1e-3, abs=1e-6), \
                f"{spec} {row['connection']}"
    # the entries' own spread, for the record: larger than the examples' in a Highway gate
    tr = load_trained(runs / "Highway")
    with torch.no_grad(), recording(tr.model) as logs:
        tr.model(next(tr.examples("test", 30)).inputs[0])
    name = next(n for n, _ in iter_connections(tr.model))
    entries = torch.cat([e["T"].flatten() for e in logs[name]]).double()
    row = next(r for r in learned(tr, "gates", split="test", examples=30, progress=False)["connections"]
               if r["connection"] == name)
    assert entries.std(unbiased=False).item() > 2 * row["T_std"]


def test_mt_gate_spread_is_across_real_positions(mt_runs):
    """In a translation model each real position counts once (a SAS gate is one number a position there) and
    padding is left out: each sentence alone, no padding, gives the same spread."""
    tr = load_trained(mt_runs / "sas")
    result = learned(tr, "gates", split="train", examples=30, progress=False)
    assert result["per"] == "position"
    name = "encoder.layers.0.conn_attn"
    conn = dict(iter_connections(tr.model))[name]
    values = []
    with torch.no_grad(), recording(tr.model) as logs:
        for ex in tr.examples("train", 30):
            for i in range(len(ex)):
                src = ex.inputs[0][i : i + 1][:, ex.masks["encoder"][i]]
                tgt = ex.inputs[1][i : i + 1][:, ex.masks["decoder"][i]]
                logs[name].clear()
                tr.model(src, tgt)
                alpha = logs[name][0]["alpha"].double()
                values.append(alpha.expand(1, src.shape[1], alpha.shape[-1]).mean(-1).flatten())
    each = torch.cat(values)
    row = next(r for r in result["connections"] if r["connection"] == name)
    assert conn.name == "SAS" and len(each) == sum(int(m.sum()) for m in
                                                  (ex.masks["encoder"] for ex in tr.examples("train", 30)))
    assert row["alpha_std"] == pytest.approx(each.std(unbiased=False).item(), rel=1e-4, abs=1e-7)


def test_overlaid_checkpoints_of_one_run_are_told_apart(runs, capsys):
    """--compare of a run's checkpoints: one model, so each legend entry and label names the file read."""
    run = runs / "SAS"
    (run / "other.pt").write_bytes((run / "last.pt").read_bytes())
    try:
        results = analyze("gates", [load_trained(run), load_trained(run / "other.pt")], overwrite=True,
                          progress=False, examples=5)
    finally:
        (run / "other.pt").unlink()
    labels = [r["label"] for r in results]
    assert labels[0].endswith(" [SAS]") and labels[1].endswith(" [other.pt]")
    assert len(set(legend_labels(results))) == 2
    assert f"{run / 'other.pt'} (" in capsys.readouterr().out


def test_a_parameter_only_analysis_says_it_read_no_examples(runs, capsys):
    assert main(["analyze", "gates", str(runs / "wSkip+LN"), "--examples", "10", "--overwrite"]) == 0
    out = capsys.readouterr().out
    assert "gates, learned parameters only (no examples read), eval mode" in out and "0 train examples" not in out


def test_overlaid_runs_of_one_model_in_folders_of_one_name_are_told_apart_by_path(runs, tmp_path):
    """Two seeds' folders are both named seed1 under their comparisons: the legend names each by its path."""
    for side in ("a", "b"):
        shutil.copytree(runs / "Highway", tmp_path / side / "seed1")
    results = analyze("gates", [load_trained(tmp_path / side / "seed1") for side in ("a", "b")], overwrite=True,
                      progress=False, examples=5)
    assert [r["label"].rsplit(" [", 1)[1] for r in results] == [f"{tmp_path / 'a' / 'seed1'}]",
                                                                f"{tmp_path / 'b' / 'seed1'}]"]
