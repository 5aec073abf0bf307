"""Machine translation: the recipe's formulas, and a tiny end-to-end CLI run on a Multi30k subset."""

import csv
import gzip
import io
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from skiplab.cli import main
from skiplab.decoding.search import EOS, beam_search
from skiplab.translate.translator import Translator
from skiplab import run_dir
from skiplab.train.mt import MTTrainConfig, train
from skiplab.run_dir import average_state_dicts
from skiplab.train.recipe_mt import inverse_sqrt_lr, label_smoothed_loss, peak_lr

MULTI30K = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "multi30k"


def vaswani_lr(step: int, d_model: int, warmup: int) -> float:
    """Eq. 3 of Vaswani et al. (2017) as written: d_model^-0.5 · min(s^-0.5, s · warmup^-1.5)."""
    return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def test_inverse_sqrt_schedule_at_chosen_steps():
    assert inverse_sqrt_lr(1, 5e-4, 4000) == pytest.approx(5e-4 / 4000)
    assert inverse_sqrt_lr(2000, 5e-4, 4000) == pytest.approx(2.5e-4)
    assert inverse_sqrt_lr(4000, 5e-4, 4000) == pytest.approx(5e-4)
    assert inverse_sqrt_lr(16000, 5e-4, 4000) == pytest.approx(2.5e-4)
    # Vaswani et al.: d^-0.5 · min(s^-0.5, s · w^-1.5) with peak = d^-0.5 · w^-0.5
    d, w, s = 512, 8000, 20000
    assert inverse_sqrt_lr(s, d**-0.5 * w**-0.5, w) == pytest.approx(d**-0.5 * min(s**-0.5, s * w**-1.5))


def test_vaswani_schedule_at_hand_values():
    """Eq. 3 of Vaswani et al. for d_model = 512, warmup = 4000 (the paper's own setting), worked by hand."""
    assert vaswani_lr(1, 512, 4000) == pytest.approx(1 / (22.627417 * 252982.21))  # 512^-0.5 · 4000^-1.5
    assert vaswani_lr(2000, 512, 4000) == pytest.approx(0.5 * 6.9877124e-4)  # half the peak, on the warm-up line
    assert vaswani_lr(4000, 512, 4000) == pytest.approx(6.9877124e-4)  # the peak: 512^-0.5 · 4000^-0.5
    assert vaswani_lr(16000, 512, 4000) == pytest.approx(3.4938562e-4)  # s^-0.5 branch: 512^-0.5 · 16000^-0.5
    assert vaswani_lr(100000, 512, 4000) == pytest.approx(1.3975425e-4)  # 512^-0.5 · 100000^-0.5
    assert vaswani_lr(8000, 1024, 8000) == pytest.approx(3.4938562e-4)  # Big, warmup 8000: 1024^-.5 · 8000^-.5
    assert peak_lr("vaswani", 1.0, 512, 4000) == pytest.approx(6.9877124e-4)  # --lr (1.0 here) is not used
    assert peak_lr("inverse_sqrt", 5e-4, 512, 4000) == 5e-4
    # the training loop follows inverse_sqrt_lr's curve with the resolved peak: that is Eq. 3 at every step
    peak = peak_lr("vaswani", 5e-4, 256, 8000)
    for s in (1, 7, 3999, 8000, 8001, 12345, 400000):
        assert inverse_sqrt_lr(s, peak, 8000) == pytest.approx(vaswani_lr(s, 256, 8000), rel=1e-12)


def test_the_schedule_option_and_its_errors(tmp_path, capsys):
    from skiplab.cli import build_parser

    args = build_parser().parse_args(["train", "mt", "--max-steps", "1", "--schedule", "vaswani"])
    assert args.schedule == "vaswani"
    assert MTTrainConfig(max_steps=1).schedule == "inverse_sqrt"  # the default: runs written before it resume
    with pytest.raises(ValueError, match=r"unknown schedule 'cosine'; known: inverse_sqrt, vaswani"):
        MTTrainConfig(max_steps=1, schedule="cosine")
    with pytest.raises(ValueError, match=r"--schedule vaswani needs --warmup >= 1"):
        MTTrainConfig(max_steps=1, schedule="vaswani", warmup=0)
    assert main(["train", "mt", "--max-steps", "1", "--schedule", "cosine", "--out", str(tmp_path / "never")]) == 2
    err = capsys.readouterr().err
    assert "unknown schedule 'cosine'; known: inverse_sqrt, vaswani" in err and err.count("\n") == 1, err
    assert not (tmp_path / "never").exists()


def test_label_smoothing_by_hand_on_a_three_word_vocabulary():
    """V = 3, two positions, the second padding (id 0). Position 1: logits (0, ln 2, 0), so p = (1/4, 1/2, 1/4),
    and the target is word 1: NLL = ln 2 = 0.693147; the uniform part (1/3)(ln 4 + ln 2 + ln 4) = 1.155245;
    with ε = 0.1: 0.9 · 0.693147 + 0.1 · 1.155245 = 0.739357. The padded position adds nothing."""
    logits = torch.tensor([[[0.0, math.log(2.0), 0.0], [5.0, -3.0, 1.0]]])
    target = torch.tensor([[1, 0]])
    loss, nll = label_smoothed_loss(logits, target, 0.1, pad_id=0)
    assert nll.item() == pytest.approx(0.693147, abs=1e-6)
    assert loss.item() == pytest.approx(0.739357, abs=1e-6)
    plain, _ = label_smoothed_loss(logits, target, 0.0, pad_id=0)
    assert plain.item() == pytest.approx(0.693147, abs=1e-6)


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_label_smoothing_equals_torchs_cross_entropy(eps):
    g = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(2, 5, 7, generator=g)
    target = torch.randint(1, 7, (2, 5), generator=g)
    target[0, 3:] = 0
    target[1, 4] = 0
    loss, nll = label_smoothed_loss(logits, target, eps, pad_id=0)
    flat_logits, flat_target = logits.reshape(-1, 7), target.reshape(-1)
    expect = F.cross_entropy(flat_logits, flat_target, label_smoothing=eps, ignore_index=0, reduction="sum")
    expect_nll = F.cross_entropy(flat_logits, flat_target, ignore_index=0, reduction="sum")
    torch.testing.assert_close(loss, expect)
    torch.testing.assert_close(nll, expect_nll)


def test_checkpoint_averaging_averages():
    a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}
    b = {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(5)}
    avg = average_state_dicts([a, b])
    assert torch.equal(avg["w"], torch.tensor([2.0, 4.0])) and avg["n"].item() == 5
    with pytest.raises(ValueError, match="another model"):
        average_state_dicts([a, {"w": torch.zeros(3), "n": torch.tensor(1)}])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The first lines of Multi30k en-de, as plain parallel files."""
    if not (MULTI30K / "train.en.gz").exists():
        pytest.skip(f"Multi30k not found at {MULTI30K}")
    root = tmp_path_factory.mktemp("m30k")
    for split, n in (("train", 300), ("val", 12), ("test_2016_flickr", 10)):
        for lang in ("en", "de"):
            with gzip.open(MULTI30K / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
                lines = [next(f) for _ in range(n)]
            (root / f"{split}.{lang}").write_text("".join(lines), encoding="utf-8")
    return root


def tiny_args(corpus, out, *extra):
    return ["train", "mt", "--corpus", "", "--train-prefix", str(corpus / "train"), "--valid-prefix",
            str(corpus / "val"), "--test-prefix", str(corpus / "test_2016_flickr"), "--d-model", "32",
            "--ffn-dim", "64", "--heads", "2", "--encoder-layers", "1", "--decoder-layers", "1", "--vocab-size",
            "300", "--max-tokens", "1024", "--max-steps", "4", "--save-every", "2", "--warmup", "2",
            "--lr", "1e-3", "--out", str(out), *extra]


def test_train_translate_score_average_end_to_end(corpus, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    assert main(tiny_args(corpus, out, "--connection", "2rSkip+LN")) == 0
    assert {"config.json", "metrics.jsonl", "last.pt", "best.pt", "summary.json", "checkpoint_2.pt",
            "checkpoint_4.pt"} <= {p.name for p in out.iterdir()}
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 4]
    assert {"train_loss", "valid_loss", "valid_ppl", "lr", "tokens_per_s"} <= set(records[0])
    assert records[1]["valid_ppl"] == pytest.approx(math.exp(records[1]["valid_nll"]))
    # --lr 1e-3 --warmup 2: the peak at step 2, then 1e-3 · sqrt(2 / 4) at step 4
    assert [r["lr"] for r in records] == pytest.approx([1e-3, 1e-3 * 0.5**0.5])
    stored = json.loads((out / "config.json").read_text())
    assert stored["schedule"] == {"name": "inverse_sqrt", "peak_lr": 1e-3, "warmup": 2}
    capsys.readouterr()

    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"A man is riding a bike.\nTwo dogs play.\n")))
    assert main(["translate", "--checkpoint", str(out), "--beam", "2"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"A man is riding a bike.\n")))
    assert main(["translate", "--checkpoint", str(out), "--max-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert "--max-tokens 2 holds fewer tokens than the longest line's" in err and err.count("\n") == 1
    assert main(tiny_args(corpus, out / "config.json")) == 2  # --out a file
    assert "config.json is a file; --out names a run directory" in capsys.readouterr().err

    assert main(["eval", "mt", "--checkpoint", str(out), "--split", "test", "--average", "2"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["sentences"] == 10 and 0 <= result["bleu"] <= 100 and "tok:13a" in result["bleu_signature"]
    assert result["bleu_lowercase"] >= result["bleu"] and "case:lc" in result["bleu_lowercase_signature"]
    assert result["averaged"] == ["checkpoint_2.pt", "checkpoint_4.pt"] and result["seed"] == 1  # the run's seed
    assert len(Path(result["hypotheses"]).read_text().splitlines()) == 10

    assert main(["average", "--checkpoint", str(out), "--last", "2", "--out", str(tmp_path / "avg.pt")]) == 0
    avg = torch.load(tmp_path / "avg.pt", weights_only=True)["model"]
    c2, c4 = (torch.load(out / f"checkpoint_{s}.pt", weights_only=True)["model"] for s in (2, 4))
    key = "encoder.layers.0.ffn.0.weight"
    torch.testing.assert_close(avg[key], (c2[key] + c4[key]) / 2)
    assert main(["average", "--checkpoint", str(out), "--last", "2", "--out", str(tmp_path / "avg.pt")]) == 2


def test_an_average_never_takes_a_step_checkpoints_or_last_checkpoints_place(corpus, tmp_path, capsys):
    """`average --out RUN/checkpoint_999.pt` was then averaged as a step (a mean of means), and `average --out
    RUN/last.pt --overwrite` resumed from a mean of weights with one step's optimizer, silently: both names are
    refused, an average found among the step checkpoints is named, and --resume refuses an averaged last.pt."""
    out = tmp_path / "run"
    assert main(tiny_args(corpus, out)) == 0
    capsys.readouterr()
    for name in ("checkpoint_999.pt", "last.pt", "best.pt"):
        before = (out / name).read_bytes() if (out / name).exists() else None
        assert main(["average", "--checkpoint", str(out), "--last", "2", "--out", str(out / name), "--overwrite"]) == 2
        err = capsys.readouterr().err
        assert "is the run's own checkpoint's name" in err and f"{out / 'avg2.pt'}" in err and err.count("\n") == 1
        assert ((out / name).read_bytes() if (out / name).exists() else None) == before
    assert main(["average", "--checkpoint", str(out), "--last", "2", "--out", str(out / "avg2.pt")]) == 0
    state, _ = run_dir.average_checkpoints(out, 2)
    run_dir.save_checkpoint(out / "checkpoint_999.pt", state)  # as a script might
    capsys.readouterr()
    assert main(["eval", "mt", "--checkpoint", str(out), "--average", "2"]) == 2
    assert "checkpoint_999.pt: an average of checkpoint_2.pt, checkpoint_4.pt, not a step checkpoint" in \
        capsys.readouterr().err
    (out / "checkpoint_999.pt").unlink()
    run_dir.save_checkpoint(out / "last.pt", state)
    assert main(tiny_args(corpus, out, "--max-steps", "6", "--resume")) == 2
    assert "last.pt is an average of checkpoint_2.pt, checkpoint_4.pt, not a training step's state" in \
        capsys.readouterr().err


def interrupt_after_step(monkeypatch, step: int):
    """Make training stop (as Ctrl-C does) once step ``step``'s checkpoint and metrics are written; return the
    undo."""
    real = run_dir.append_metrics

    def stop(out, record):
        real(out, record)
        if record["step"] == step:
            raise KeyboardInterrupt

    monkeypatch.setattr(run_dir, "append_metrics", stop)
    return lambda: monkeypatch.setattr(run_dir, "append_metrics", real)


def test_mt_resume_continues_exactly(corpus, tmp_path, monkeypatch):
    straight, stopped = tmp_path / "a", tmp_path / "b"
    assert main(tiny_args(corpus, straight)) == 0
    undo = interrupt_after_step(monkeypatch, 2)
    assert main(tiny_args(corpus, stopped)) == 130  # interrupted after step 2's checkpoint
    undo()
    assert main(["train", "mt", "--resume", "--out", str(stopped)]) == 0
    a = torch.load(straight / "last.pt", weights_only=True)["model"]
    b = torch.load(stopped / "last.pt", weights_only=True)["model"]
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=0, msg=key)
    # per-step telemetry, a line every update, the same through the stop (the clock's numbers aside)
    same = ("step", "loss", "lr", "grad_norm", "clipped", "spike")
    la, lb = ([{k: x[k] for k in same} for x in run_dir.read_steps(r)] for r in (straight, stopped))
    assert la == lb and [x["step"] for x in la] == list(range(1, len(la) + 1)) and len(la) >= 3
    sa, sb = (json.loads((r / "summary.json").read_text()) for r in (straight, stopped))
    assert (sa["loss_spikes"], sa["max_grad_norm"]) == (sb["loss_spikes"], sb["max_grad_norm"]) and sa["max_grad_norm"] > 0


def test_the_vaswani_schedule_derives_its_peak_and_records_it(corpus, tmp_path):
    out = tmp_path / "vaswani"
    assert main(tiny_args(corpus, out, "--schedule", "vaswani", "--warmup", "50")) == 0  # d_model 32, --lr unused
    stored = json.loads((out / "config.json").read_text())
    assert stored["schedule"] == {"name": "vaswani", "peak_lr": pytest.approx(0.025), "warmup": 50}  # 32^-.5 · 50^-.5
    lrs = [json.loads(x)["lr"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert lrs == pytest.approx([0.001, 0.002])  # 32^-0.5 · s · 50^-1.5 = s / 2000 at s = 2, 4


def test_a_run_written_before_the_schedule_option_resumes(corpus, tmp_path, monkeypatch, capsys):
    out = tmp_path / "old"
    undo = interrupt_after_step(monkeypatch, 2)
    assert main(tiny_args(corpus, out)) == 130
    undo()
    # what an older skiplab wrote: no schedule in the checkpoints' config nor in config.json
    for path in out.glob("*.pt"):
        ckpt = torch.load(path, weights_only=True)
        del ckpt["config"]["schedule"]
        torch.save(ckpt, path)
    stored = json.loads((out / "config.json").read_text())
    del stored["config"]["schedule"], stored["schedule"]
    (out / "config.json").write_text(json.dumps(stored))
    capsys.readouterr()

    # the missing field counts as its default, inverse_sqrt: another schedule is another config
    assert main(["train", "mt", "--resume", "--out", str(out), "--schedule", "vaswani"]) == 2
    assert "another config (different schedule)" in capsys.readouterr().err
    assert main(["train", "mt", "--resume", "--out", str(out)]) == 0
    assert torch.load(out / "last.pt", weights_only=True)["step"] == 4


def test_resume_with_a_larger_budget_equals_the_longer_run(corpus, tmp_path, capsys):
    straight, short = tmp_path / "a", tmp_path / "b"
    assert main(tiny_args(corpus, straight)) == 0  # 4 steps
    assert main([*tiny_args(corpus, short), "--max-steps", "2"]) == 0
    assert main(["train", "mt", "--resume", "--out", str(short), "--max-steps", "4"]) == 0
    assert "resumed with max_steps 2 -> 4" in capsys.readouterr().out
    assert json.loads((short / "config.json").read_text())["config"]["max_steps"] == 4
    assert [json.loads(x)["step"] for x in (short / "metrics.jsonl").read_text().splitlines()] == [2, 4]
    a = torch.load(straight / "last.pt", weights_only=True)["model"]
    b = torch.load(short / "last.pt", weights_only=True)["model"]
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=0, msg=key)

    assert main(["train", "mt", "--resume", "--out", str(short), "--max-steps", "6", "--lr", "0.5"]) == 2
    assert "another config (different lr)" in capsys.readouterr().err
    assert json.loads((short / "config.json").read_text())["config"]["max_steps"] == 4  # nothing rewritten
    assert main(["train", "mt", "--resume", "--out", str(short), "--max-steps", "3"]) == 2
    assert "has already trained 4 updates" in capsys.readouterr().err


def test_bad_corpora_and_checkpoints(corpus, tmp_path, capsys):
    (tmp_path / "empty.en").write_text("")
    (tmp_path / "empty.de").write_text("")
    (tmp_path / "mis.en").write_text("a\nb\n")
    (tmp_path / "mis.de").write_text("a\n")
    (tmp_path / "bad.en").write_bytes(b"fine\n\xff\xfe broken\n")
    (tmp_path / "bad.de").write_text("gut\nkaputt\n")
    for prefix, message in [("empty", "empty corpus"), ("mis", "misaligned corpus"), ("bad", "line 2 is not valid UTF-8")]:
        argv = tiny_args(corpus, tmp_path / f"out-{prefix}")
        argv[argv.index("--train-prefix") + 1] = str(tmp_path / prefix)
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
        assert not (tmp_path / f"out-{prefix}").exists()

    image_ckpt = tmp_path / "image.pt"
    torch.save({"kind": "image", "model": {}}, image_ckpt)
    assert main(["translate", "--checkpoint", str(image_ckpt)]) == 2
    assert "not a skiplab mt checkpoint" in capsys.readouterr().err


def test_bootstrap_command(tmp_path, capsys):
    refs = [f"the cat number {i} sat on the mat" for i in range(30)]
    (tmp_path / "ref").write_text("\n".join(refs) + "\n")
    (tmp_path / "a").write_text("\n".join(refs) + "\n")
    (tmp_path / "b").write_text("\n".join(r.replace("cat", "dog").replace("mat", "rug") for r in refs) + "\n")
    assert main(["bootstrap", str(tmp_path / "ref"), str(tmp_path / "a"), str(tmp_path / "b"), "--samples", "200"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["better"] == "a" and result["p_value"] < 0.05
    assert result["seed"] == 12345 and result["samples"] == 200  # what it can be run again with
    assert main(["bootstrap", str(tmp_path / "ref"), str(tmp_path), str(tmp_path / "b")]) == 2
    assert capsys.readouterr().err == f"skiplab: error: {tmp_path}: a folder, not a text file\n"  # was "no such file"


def test_config_needs_steps_or_epochs():
    with pytest.raises(ValueError, match="exactly one of --max-steps and --epochs"):
        MTTrainConfig()
    with pytest.raises(ValueError, match="exactly one"):
        MTTrainConfig(max_steps=5, epochs=1)
    assert train  # the loop is importable beside its config


def test_compare_mt_writes_a_bleu_table(corpus, tmp_path, capsys):
    args = tiny_args(corpus, tmp_path / "cmp")[2:]  # the training options, without "train mt"
    assert main(["compare", "mt", *args, "--connections", "PostLN,2rSkip+LN", "--seeds", "1"]) == 0
    table = (tmp_path / "cmp" / "table.md").read_text()
    assert "BLEU (mean ± std)" in table and "| 2rSkip+LN" in table
    # Its runs have two checkpoints each, so the score averaged two, and the title says so (not "the last 5").
    assert table.splitlines()[0].endswith("; test BLEU of each run's last 2 checkpoints averaged (its runs have 2; "
                                          "5 where a run has them), beam 4")
    summary = json.loads((tmp_path / "cmp" / "PostLN" / "seed1" / "summary.json").read_text())
    assert summary["averaged"] == 2 and 0 <= summary["test_bleu"] <= 100
    last = tmp_path / "cmp" / "PostLN" / "seed1" / "last.pt"
    trained = last.stat().st_mtime_ns
    # Given again, the comparison finds its finished runs (config.json holds lists where the config has tuples).
    assert main(["compare", "mt", *args, "--connections", "PostLN,2rSkip+LN", "--seeds", "1"]) == 0
    assert last.stat().st_mtime_ns == trained


def test_resuming_another_tasks_run_names_its_task(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(tiny_args(corpus, out, "--max-steps", "2")) == 0
    files = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    said = f"{out} holds a mt run, which `skiplab train mt --resume` continues, not `train image`"
    assert main(["train", "image", "--out", str(out), "--resume"]) == 2
    assert capsys.readouterr().err.strip() == f"skiplab: error: {said}"
    payload = json.loads((out / "config.json").read_text())
    assert payload.pop("kind") == "mt"  # a run written before config.json named its task: last.pt does
    (out / "config.json").write_text(json.dumps(payload))
    assert main(["train", "caption", "--out", str(out), "--resume"]) == 2
    assert "holds a mt run, which `skiplab train mt --resume` continues, not `train caption`" in capsys.readouterr().err
    assert {p.name for p in out.iterdir()} == set(files)


def test_resuming_with_the_presets_own_connection_named_is_the_same_run(corpus, tmp_path, capsys):
    """--connection PostLN on --resume of a transformer-small run (whose preset's connection it is) names the same
    model: the run goes on (here, to a longer --max-steps); another connection is refused as a different model."""
    out = tmp_path / "run"
    assert main(tiny_args(corpus, out, "--max-steps", "2")) == 0
    assert json.loads((out / "config.json").read_text())["model"]["connection"] == "PostLN"
    capsys.readouterr()
    assert main(tiny_args(corpus, out, "--max-steps", "2", "--connection", "PreLN", "--resume")) == 2
    assert "different model" in capsys.readouterr().err
    assert main(tiny_args(corpus, out, "--max-steps", "3", "--connection", "PostLN", "--resume")) == 0
    assert json.loads((out / "summary.json").read_text())["steps"] == 3


def test_a_max_len_that_drops_every_pair_is_one_line(corpus, tmp_path, capsys):
    assert main(tiny_args(corpus, tmp_path / "run", "--max-len", "2")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--max-len 2 drops every one of the" in err and "training pairs" in err, err
    assert not (tmp_path / "run" / "config.json").exists()
    assert main(tiny_args(corpus, tmp_path / "run")) == 0  # the start's own files (spm.model) replaced unasked


def test_a_non_finite_validation_loss_is_a_divergence(corpus, tmp_path, monkeypatch, capsys):
    import skiplab.train.mt as mt

    monkeypatch.setattr(mt, "validate", lambda *a, **k: {"valid_loss": math.nan, "valid_nll": math.nan,
                                                         "valid_ppl": math.nan})
    assert main(tiny_args(corpus, tmp_path / "run")) == 0
    assert "non-finite validation loss (nan) at epoch 1, step 2: the run diverged" in capsys.readouterr().out
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "diverged"
    assert not (tmp_path / "run" / "last.pt").exists()


def test_a_non_finite_loss_stops_mt_training(corpus, tmp_path, monkeypatch, capsys):
    from skiplab.models import Transformer

    real = Transformer.forward
    monkeypatch.setattr(Transformer, "forward", lambda self, src, tgt: real(self, src, tgt) * float("inf"))
    assert main(tiny_args(corpus, tmp_path / "run")) == 0
    assert "non-finite loss (nan) at epoch 1, step 1" in capsys.readouterr().out
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "diverged"
    (line,) = run_dir.read_steps(tmp_path / "run")  # the non-finite update's line
    assert line["step"] == 1 and math.isnan(line["loss"])


def test_dwlstm_trains_translates_and_scores_through_the_same_commands(corpus, tmp_path, capsys, monkeypatch):
    out = tmp_path / "dw"
    argv = tiny_args(corpus, out, "--model", "dwlstm-small", "--share", "gates", "--merge", "concat",
                     "--hidden-layers", "2", "--max-steps", "30", "--save-every", "10", "--lr", "3e-3")
    assert main(argv) == 0
    stored = json.loads((out / "config.json").read_text())
    assert stored["config"]["model"] == ("dwlstm-small(d_model=32,ffn_dim=64,heads=2,encoder_layers=1,decoder_layers=1,"
                                         "hidden_layers=2,merge=concat,share=gates)")  # the options fold into the spec
    assert stored["model"]["class"] == "DepthWiseLSTMTransformer" and stored["model"]["share"] == "gates"
    losses = [json.loads(x)["train_loss"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert losses == sorted(losses, reverse=True) and losses[0] - losses[-1] > 0.25, losses  # the training loss falls
    capsys.readouterr()
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"A man is riding a bike.\n")))
    assert main(["translate", "--checkpoint", str(out), "--beam", "2", "--average", "2"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1
    assert main(["eval", "mt", "--checkpoint", str(out), "--split", "test", "--average", "3"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["model"].startswith("dwlstm-small(") and "connection" not in result and result["sentences"] == 10


@pytest.mark.parametrize("extra,message", [
    (("--model", "dwlstm-small", "--connection", "PreLN"), "dwlstm-small has no option connection (its options:"),
    (("--model", "transformer-small", "--share", "all"), "transformer-small has no option share"),
    (("--max-positions", "0"), "max_positions and the layer counts must be positive"),
    (("--model", "transformer-small(heads=4)",), "heads is set twice: heads=4 in 'transformer-small(heads=4)' and heads=2"),
    (("--model", "dwlstm-small(share=all)", "--share", "none"), "share is set twice"),
    (("--model", "resnet",), "unknown model 'resnet'"),
    (("--model", "preact-resnet20",), "preact-resnet20 is not a translation model"),
])
def test_an_option_the_family_lacks_is_a_one_line_error(corpus, tmp_path, capsys, extra, message):
    out = tmp_path / "never"
    assert main([*tiny_args(corpus, out), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not out.exists()


def test_translate_names_a_bad_line_and_warns_about_a_long_one(corpus, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    assert main(tiny_args(corpus, out, "--max-positions", "64", "--max-steps", "2")) == 2
    assert "--max-len 256 is more than the model's positions cover (max_positions 64)" in capsys.readouterr().err
    assert main(tiny_args(corpus, out, "--max-positions", "64", "--max-len", "64", "--max-steps", "2")) == 0
    capsys.readouterr()
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"A dog.\n\xff\xfe runs\n")))
    assert main(["translate", "--checkpoint", str(out)]) == 2
    err = capsys.readouterr().err
    assert "standard input: line 2 is not valid UTF-8" in err and err.count("\n") == 1
    long = " ".join(["a man in a red shirt rides a bike"] * 14)
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(f"A dog.\n{long}\n".encode())))
    assert main(["translate", "--checkpoint", str(out), "--beam", "1"]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 2
    assert "skiplab: warning: line 2 has" in captured.err and "more than the 63 this model takes" in captured.err
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"A dog.\nA cat runs.\n")))
    assert main(["translate", "--checkpoint", str(out), "--beam", "2"]) == 0
    alone = capsys.readouterr().out.splitlines()
    assert len(alone) == 2 and all(alone)  # the model says something for each
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"A dog.\n\n  \nA cat runs.\n")))
    assert main(["translate", "--checkpoint", str(out), "--beam", "2"]) == 0
    assert capsys.readouterr().out.split("\n") == [alone[0], "", "", alone[1], ""]  # a blank line stays blank


def test_a_model_of_few_positions_translates_and_evaluates_within_them(corpus, tmp_path, capsys, monkeypatch):
    """max_positions 40, below the output's allowance (source + 50): sources are not cut (they were, to
    40 − 50 − 1 = −11 tokens: "translating its first -11", then eval failed on a 41-token output); the output
    stops at the positions' end."""
    out = tmp_path / "run"
    assert main(tiny_args(corpus, out, "--max-positions", "40", "--max-len", "30", "--max-steps", "2")) == 0
    capsys.readouterr()
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"A man in a red shirt.\n")))
    assert main(["translate", "--checkpoint", str(out), "--beam", "2"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() and "warning" not in captured.err
    tr = Translator.load(out)
    hyps = beam_search(tr.model, torch.tensor([tr.tok.encode("A man in a red shirt.") + [EOS]]), beam=2, max_len=39)
    assert len(hyps[0][0].tokens) <= 39
    assert main(["eval", "mt", "--checkpoint", str(out), "--beam", "1"]) == 0, capsys.readouterr().err
    warned = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert all("more than the 39 this model takes" in line for line in warned)  # test lines past the positions


def test_compare_mt_varies_the_model(corpus, tmp_path, capsys):
    args = tiny_args(corpus, tmp_path / "cmp")[2:]
    models = "transformer-small(connection=PreLN),dwlstm-small(share=all)"
    assert main(["compare", "mt", *args, "--models", models, "--seeds", "1"]) == 0
    rows = list(csv.DictReader((tmp_path / "cmp" / "table.csv").open()))
    assert [r["model"] for r in rows] == ["transformer-small(connection=PreLN)", "dwlstm-small(share=all)"]
    assert all(int(r["parameters"]) > 0 and float(r["s/update"]) > 0 for r in rows)
    run = tmp_path / "cmp" / "dwlstm-small_share=all_" / "seed1"
    assert json.loads((run / "config.json").read_text())["model"]["share"] == "all"
    for label in ("transformer-small_connection=PreLN_", "dwlstm-small_share=all_"):  # the size options reach each
        model = json.loads((tmp_path / "cmp" / label / "seed1" / "config.json").read_text())["model"]
        assert (model["d_model"], model["ffn_dim"], model["heads"]) == (32, 64, 2), label
    assert "| model" in (tmp_path / "cmp" / "table.md").read_text()
    # a model without connections cannot be crossed with connections
    assert main(["compare", "mt", *args, "--models", "dwlstm-small", "--connections", "PostLN"]) == 2
    assert "dwlstm-small has no option connection" in capsys.readouterr().err


def test_multi_process_and_compile_options_come_from_the_config():
    from skiplab.cli import build_parser

    args = build_parser().parse_args(["train", "mt", "--max-steps", "1", "--sync-bn", "true", "--compile", "yes"])
    assert args.sync_bn is True and args.compile is True
    cfg = MTTrainConfig(max_steps=1)
    assert cfg.sync_bn is False and cfg.compile is False


def test_admin_profile_in_translation(corpus, tmp_path, capsys):
    assert main(tiny_args(corpus, tmp_path / "run", "--connection", "Admin(init=profile)", "--max-steps", "1")) == 0
    assert "Admin: ω profiled on one batch" in capsys.readouterr().out
    assert json.loads((tmp_path / "run" / "config.json").read_text())["admin"]["encoder"]["built"] == "profile"
    # the default on the Xavier-initialised Transformer: the batch confirms the closed form, which is kept
    assert main(tiny_args(corpus, tmp_path / "auto", "--connection", "Admin", "--max-steps", "1")) == 0
    assert "profiled" not in capsys.readouterr().out
    built = json.loads((tmp_path / "auto" / "config.json").read_text())["admin"]
    assert {stack: (b["init"], b["built"]) for stack, b in built.items()} == {"encoder": ("auto", "closed"),
                                                                             "decoder": ("auto", "closed")}


def test_a_start_that_fails_after_writing_its_tokenizer_leaves_a_folder_the_next_run_takes(corpus, tmp_path, capsys):
    """Too small a batch for the corpus's pairs fails once the tokenizer is trained (its files already in OUT): one
    line naming the flags, and the folder, holding only that start's files, is taken by the next run without
    --overwrite; --resume there says why there is nothing to resume. A folder of someone else's stays refused."""
    out = tmp_path / "run"
    argv = tiny_args(corpus, out)
    argv[argv.index("--max-tokens") + 1] = "8"
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--max-tokens 8" in err and "--max-len 8" in err, err
    assert (out / "spm.model").is_file() and not (out / "config.json").exists()
    assert main(tiny_args(corpus, out, "--resume")) == 2
    assert "stopped before writing config.json; start it again without --resume" in capsys.readouterr().err
    assert main(tiny_args(corpus, out)) == 0
    assert json.loads((out / "summary.json").read_text())["status"] == "finished"
    assert not (out / run_dir.STARTED).exists()
    assert main(tiny_args(corpus, out)) == 2  # a run now: refused without a flag
    assert "already holds files" in capsys.readouterr().err
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "spm.model").write_text("not skiplab's")
    assert main(tiny_args(corpus, mine)) == 2  # not a run: --overwrite is not offered, which would refuse it
    assert "holds files but no skiplab run (no config.json); give --out a new or empty folder" in capsys.readouterr().err
    assert (mine / "spm.model").read_text() == "not skiplab's"


def test_an_epoch_closed_by_a_save_goes_on_to_the_next_epochs_order(corpus, tmp_path, monkeypatch):
    """Where an epoch's last update is also a save step, the run walked that epoch's batch order a second time
    instead of the next epoch's, so a run stopped at that save and resumed (which draws the next order) ended
    elsewhere than the uninterrupted one; now both draw the next epoch's order and end on the same bits."""
    probe = tmp_path / "probe"
    assert main([*tiny_args(corpus, probe), "--max-steps", "2", "--save-every", "2"]) == 0
    per_epoch = round(2 / json.loads((probe / "summary.json").read_text())["epochs"])  # updates in one epoch
    assert per_epoch >= 3
    budget = ["--max-steps", str(2 * per_epoch + 1), "--save-every", str(per_epoch)]
    straight, stopped = tmp_path / "a", tmp_path / "b"
    assert main([*tiny_args(corpus, straight), *budget]) == 0
    undo = interrupt_after_step(monkeypatch, per_epoch)  # stopped at the save that closes epoch 1
    assert main([*tiny_args(corpus, stopped), *budget]) == 130
    undo()
    assert main(["train", "mt", "--resume", "--out", str(stopped)]) == 0
    a = torch.load(straight / "last.pt", weights_only=True)
    b = torch.load(stopped / "last.pt", weights_only=True)
    assert a["epoch"] == b["epoch"] == 2
    for key in a["model"]:
        torch.testing.assert_close(b["model"][key], a["model"][key], rtol=0, atol=0, msg=key)


def test_relative_prefixes_are_recorded_absolute_and_evaluated_from_elsewhere(corpus, tmp_path, capsys, monkeypatch):
    """--train-prefix pc/tr (relative to where the command ran) is recorded absolute: `eval mt` from another
    folder reads the same test files (it looked for pc/va.en beside wherever eval ran)."""
    shutil.copytree(corpus, tmp_path / "pc")
    monkeypatch.chdir(tmp_path)
    argv = tiny_args(Path("pc"), "run")
    assert main(argv) == 0
    stored = json.loads((tmp_path / "run" / "config.json").read_text())["config"]
    assert stored["test_prefix"] == str(tmp_path / "pc" / "test_2016_flickr")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    capsys.readouterr()
    assert main(["eval", "mt", "--checkpoint", str(tmp_path / "run"), "--beam", "1"]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("extra, said", [
    (["--corpus", "multi30k"], "--train-prefix, --valid-prefix, --test-prefix name files of your own, read with "
                               "--corpus '' only; this run names --corpus multi30k"),
    (["--label-smoothing", "2"], "--label-smoothing must be in [0, 1), got 2.0"),
    (["--label-smoothing", "-0.1"], "--label-smoothing must be in [0, 1), got -0.1"),
])
def test_settings_that_would_train_on_other_data_or_against_the_targets_are_refused(corpus, tmp_path, capsys, extra,
                                                                                   said):
    """Prefixes beside a named corpus were dropped for the corpus's files (and recorded as if read); a smoothing ε
    outside [0, 1) trains the model away from the right words. Both ran silently."""
    out = tmp_path / "run"
    assert main([*tiny_args(corpus, out), *extra]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1
    assert not out.exists()


def test_averaged_note_names_the_runs_that_averaged_fewer():
    from skiplab.tasks.base import averaged_note
    full, short = {"averaged": 5}, {"averaged": 3}
    assert averaged_note("BLEU", [("A", 1, full), ("B", 1, full), ("A", 2, {"status": "diverged"})], 5, 4) == \
        "BLEU of each run's last 5 checkpoints averaged, beam 4"
    assert averaged_note("BLEU", [("A", 1, full), ("B", 1, short), ("B", 2, {"averaged": 1})], 5, 4) == \
        "BLEU of each run's last 5 checkpoints averaged, beam 4; fewer where a run has fewer: B seed 1 3, B seed 2 1"
    assert averaged_note("CIDEr", [("A", 1, {"averaged": 1})], 5, 3) == \
        "CIDEr of each run's last 1 checkpoint averaged (its runs have 1; 5 where a run has them), beam 3"

