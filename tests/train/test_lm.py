"""Language-model training: the schedule, a tiny model that learns, exact resume, two processes = one with
accumulation, evaluation, generation, compare and the analyses on LM runs."""

import dataclasses
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from skiplab import host, run_dir
from skiplab.cli import main
from skiplab.models import GPT, GPTConfig
from skiplab.models.generate import filter_logits, generate
from skiplab.tasks import lm as lm_task
from skiplab.tasks import load_trained
from skiplab.tokenization.lm import ByteTokenizer
from skiplab.train import lm_branch
from skiplab.train.lm import LMTrainConfig, learning_rate, parameter_groups, train
from skiplab.train.lm_config import stable_end
from tests.train.test_distributed import ok, one_thread, torchrun
from tests.train.test_mt import interrupt_after_step

PYDOCS = Path(__file__).resolve().parents[3] / "shared" / "data" / "pydocs"
TINY = "gpt-mini(d_model=32,heads=2,layers=2,ffn_dim=64,context=32)"
STORY = ("the cat sat on the mat. the dog sat on the log. a cat and a dog sat together on the mat and the log. "
         "they were happy. ")


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    root = tmp_path_factory.mktemp("lmtext")
    for split, n in (("train", 40), ("valid", 4), ("test", 4)):
        with open(root / f"{split}.jsonl", "w") as f:
            for i in range(n):
                f.write(json.dumps({"text": STORY * (1 + i % 3)}) + "\n")
    return root


def args(text, out, *extra):
    return ["train", "lm", "--corpus", "", "--train-file", text / "train.jsonl", "--valid-file", text / "valid.jsonl",
            "--test-file", text / "test.jsonl", "--model", TINY, "--batch-size", "8", "--max-steps", "6",
            "--eval-every", "3", "--warmup", "2", "--lr", "3e-3", "--device", "cpu", "--out", out, *extra]


def another_machine(cfg_path: Path) -> str:
    """Rewrite the run's recorded machine into one that differs from this one by construction (this CPU's name with
    " (other)" appended, no GPU), whatever this machine is; the machine name the tables and messages will show."""
    cfg = json.loads(cfg_path.read_text())
    env = cfg["environment"]
    env.update(cpu=f"{env['cpu']} (other)", cuda=None)
    cfg_path.write_text(json.dumps(cfg))
    assert host.machine_name(env) != host.machine_name(host.environment())
    return host.machine_name(env)


def run(argv) -> int:
    return main([str(a) for a in argv])


def test_schedule_warms_up_then_decays_to_min_lr():
    cfg = LMTrainConfig(lr=1e-3, min_lr=1e-4, warmup=10, max_steps=110)
    assert learning_rate(cfg, 5) == pytest.approx(5e-4)
    assert learning_rate(cfg, 10) == pytest.approx(1e-3)
    assert learning_rate(cfg, 60) == pytest.approx(1e-4 + 0.9e-3 * 0.5)  # half way: cos(π/2) = 0
    assert learning_rate(cfg, 110) == pytest.approx(1e-4)
    constant = LMTrainConfig(lr=1e-3, warmup=10, max_steps=110, schedule="constant")
    assert learning_rate(constant, 100) == 1e-3


def test_weight_decay_on_matrices_only():
    model = GPT(GPTConfig(vocab_size=20, d_model=16, heads=2, layers=1, ffn_dim=32, connection="SAS"))
    decayed, kept = parameter_groups(model, 0.1)
    assert decayed["weight_decay"] == 0.1 and kept["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decayed["params"]) and all(p.dim() < 2 for p in kept["params"])
    assert len(decayed["params"]) + len(kept["params"]) == len(list(model.parameters()))


def test_a_tiny_model_learns_a_short_text(text, tmp_path):
    with one_thread():
        summary = train(LMTrainConfig(corpus="", train_file=str(text / "train.jsonl"),
                                      valid_file=str(text / "valid.jsonl"), model=TINY, batch_size=16, max_steps=150,
                                      eval_every=75, warmup=10, lr=1e-2, min_lr=1e-3, device="cpu",
                                      out=str(tmp_path / "run")), progress=False)
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert summary["final_valid_loss"] < 0.5 < math.log(257) / 4  # a few bits a byte at the start, then learnt
    assert records[-1]["valid_bpb"] < records[0]["valid_bpb"]
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["data"]["vocab_size"] == 257 and config["data"]["valid_bytes"] == len(STORY.encode()) * (1 + 2 + 3 + 1)


def test_a_stopped_and_resumed_run_equals_an_uninterrupted_one(text, tmp_path, monkeypatch, capsys):
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    with one_thread():
        assert run(args(text, straight, "--dropout", "0.1")) == 0
        undo = interrupt_after_step(monkeypatch, 3)
        assert run(args(text, stopped, "--dropout", "0.1")) == 130  # interrupted after step 3's checkpoint
        undo()
        assert run(["train", "lm", "--resume", "--out", stopped]) == 0
    a = torch.load(straight / "last.pt", weights_only=True)
    b = torch.load(stopped / "last.pt", weights_only=True)
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert torch.equal(a["rng"]["windows"], b["rng"]["windows"])
    ra = [json.loads(x) for x in (straight / "metrics.jsonl").read_text().splitlines()]
    rb = [json.loads(x) for x in (stopped / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["train_loss"], r["valid_loss"]) for r in ra] == [(r["step"], r["train_loss"], r["valid_loss"])
                                                                           for r in rb]


def test_two_processes_make_the_updates_of_one_with_twice_the_accumulation(text, tmp_path):
    ok(torchrun(*args(text, tmp_path / "two", "--grad-accum", "2")))
    with one_thread():
        assert run(args(text, tmp_path / "one", "--grad-accum", "2")) == 0
    a = torch.load(tmp_path / "two" / "last.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "one" / "last.pt", weights_only=True)["model"]
    for key in b:  # exact: each rank runs one micro-batch's kernels; gloo adds, and the scalings by 2 are exact
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)
    odd = torchrun(*args(text, tmp_path / "odd", "--grad-accum", "3"))
    assert odd.returncode != 0 and "--grad-accum 3 must be a multiple of the 2 processes" in odd.stderr


def test_a_non_finite_validation_loss_is_a_divergence(text, tmp_path, monkeypatch, capsys):
    import skiplab.train.lm as lm

    monkeypatch.setattr(lm, "evaluate", lambda *a, **k: {"loss": math.nan, "bpb": math.nan, "token_ppl": math.nan})
    assert run(args(text, tmp_path / "run")) == 0
    assert "non-finite validation loss (nan) at step 3: the run diverged" in capsys.readouterr().out  # no epochs
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["step"] == 3 and "epoch" not in summary
    assert not (tmp_path / "run" / "last.pt").exists()


def test_eval_generate_and_analyze_a_run(text, tmp_path, capsys):
    out = tmp_path / "run"
    with one_thread():
        assert run(args(text, out)) == 0
        capsys.readouterr()
        assert run(["eval", "lm", "--checkpoint", out, "--split", "test", "--stride", "16"]) == 0
        result = json.loads(capsys.readouterr().out)
        assert result["stride"] == 16 and result["bytes"] == len(STORY.encode()) * (1 + 2 + 3 + 1)
        assert result["bpb"] == pytest.approx(result["loss"] * result["tokens"] / (math.log(2) * result["bytes"]))
        words = sum(len((STORY * k).split()) + 1 for k in (1, 2, 3, 1))  # + 1: the trailing space's empty piece
        assert result["words"] == words and result["tokenizer"] == "bytes" and "test.jsonl" in result["covers"]
        assert result["word_ppl"] == pytest.approx(math.exp(result["nll"] / words))
        assert result["token_ppl"] == pytest.approx(math.exp(result["loss"]))
        assert result["seed"] == 1 and result["environment"]["torch"] == torch.__version__  # what scored it
        assert "git_commit" in result["environment"] and "its documents, each followed by" in result["covers"]
        assert run(["eval", "lm", "--checkpoint", out, "--average", "2"]) == 0
        assert json.loads(capsys.readouterr().out)["averaged"] == 2
        assert run(["generate", "--checkpoint", out, "--prompt", "the cat", "--max-new-tokens", "10",
                    "--temperature", "0"]) == 0
        first = capsys.readouterr().out
        assert run(["generate", "--checkpoint", out, "--prompt", "the cat", "--max-new-tokens", "10",
                    "--temperature", "0"]) == 0
        assert first.startswith("the cat") and capsys.readouterr().out == first  # greedy: the same every time
        assert run(["generate", "--checkpoint", out, "--prompt", "the cat", "--temperature", "0"]) == 0  # context 32
        assert len(capsys.readouterr().out.removesuffix("\n")) <= 32 - 1  # what the context leaves: 32 - eot
        assert run(["generate", "--checkpoint", out, "--prompt", "x" * 40, "--max-new-tokens", "5"]) == 0
        err = capsys.readouterr().err
        assert "the prompt's first 13 of 40 tokens cut: the model's context holds 32, 5 of them" in err, err
        # a prompt that fills the context but for the end of text before it: nothing of the prompt is cut
        assert run(["generate", "--checkpoint", out, "--prompt", "x" * 27, "--max-new-tokens", "5"]) == 0
        assert "cut" not in capsys.readouterr().err
        with pytest.raises(SystemExit):  # argparse's refusal
            run(["generate", "--checkpoint", out, "--prompt", "x", "--seed", str(2**64)])
        assert "argument --seed: a seed is an integer in [0, 2**63 - 1], got 18446744073709551616" in \
            capsys.readouterr().err
        assert run(["generate", "--checkpoint", out, "--max-new-tokens", "32"]) == 2
        assert "--max-new-tokens 32 leaves no room for a prompt in the model's context (32)" in capsys.readouterr().err
        assert run(["eval", "lm", "--checkpoint", out, "--stride", "33"]) == 2
        assert "--stride must be in 1..context (32), got 33" in capsys.readouterr().err
        assert run(["analyze", "gradients", str(out), "--examples", "8", "--split", "valid"]) == 0
    table = (out / "analysis" / "gradients.md").read_text()
    assert "layer.0" in table and "layer.1" in table
    tr = load_trained(out)
    assert list(tr.blocks()) == ["layer.0", "layer.1"] and tr.block_of("layers.1.conn_mlp") == "layer.1"


def test_gates_and_the_linearity_probe_on_an_sas_language_model(text, tmp_path):
    out = tmp_path / "sas"
    with one_thread():
        assert run(args(text, out, "--connection", "SAS")) == 0
        assert run(["analyze", "gates", out, "--examples", "8", "--split", "valid"]) == 0
        assert run(["analyze", "linearity", out, "--layers", "layer.1", "--steps", "1", "--sample", "200"]) == 0
    gates = json.loads((out / "analysis" / "gates.json").read_text())
    assert [c["block"] for c in gates["connections"]][:2] == ["layer.0", "layer.0"]  # conn_attn, conn_mlp
    probe = json.loads((out / "analysis" / "linearity.json").read_text())
    assert probe["metric"] == "bpb" and probe["layers"][0]["layer"] == "layer.1" and probe["untouched"] > 0


def test_gates_report_the_value_residual_lambda_and_the_unet_weights(text, tmp_path):
    out = tmp_path / "across"
    with one_thread():
        assert run(args(text, out, "--connection", "PreLN+ValueRes(learn=yes)+UNet")) == 0
        assert run(["analyze", "gates", out, "--examples", "8", "--split", "valid"]) == 0
    rows = json.loads((out / "analysis" / "gates.json").read_text())["connections"]
    across = load_trained(out).model.across
    lam, weight = across.designs[0].lam.tolist(), across.designs[1].weight.tolist()
    assert [(r["block"], r["value_lambda"]) for r in rows if "value_lambda" in r] == [("layer.1", lam[0])]
    assert [(r["block"], r["skip_weight"]) for r in rows if "skip_weight" in r] == [("layer.1", weight[0])]
    assert lam[0] != 0.5 and weight[0] != 1.0  # trained away from their start
    assert "value_lambda" in (out / "analysis" / "gates.md").read_text()


@torch.no_grad()
def test_cached_generation_equals_recomputing_the_prefix():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=30, d_model=32, heads=4, layers=2, ffn_dim=64, context=40)).eval()
    a = generate(model, [1, 2, 3], 20, temperature=0.8, top_k=10, generator=torch.Generator().manual_seed(5))
    b = generate(model, [1, 2, 3], 20, temperature=0.8, top_k=10, generator=torch.Generator().manual_seed(5),
                 cache=False)
    assert a == b and len(a) == 20
    with pytest.raises(ValueError, match="a prompt of 3 tokens and 38 new ones are more than the model's context"):
        generate(model, [1, 2, 3], 38)
    for bad in (float("nan"), float("inf"), -1.0):
        with pytest.raises(ValueError, match="need temperature >= 0"):
            generate(model, [1, 2, 3], 2, temperature=bad)
    greedy = generate(model, [1, 2, 3], 20, temperature=0)
    for tiny in (1e-40, 1e-45):  # every log-probability / T was -inf in float32: NaN probabilities, a traceback
        assert generate(model, [1, 2, 3], 20, temperature=tiny, generator=torch.Generator().manual_seed(5)) == greedy
        assert generate(model, [1, 2, 3], 20, temperature=tiny, top_p=0.5, top_k=3) == greedy


class Padded(torch.nn.Module):
    """A model whose output is padded past its tokenizer's vocabulary, the padded rows the most likely: as an
    imported model with untrained padding rows may be."""

    def __init__(self, model, pad=6, lift=50.0):
        super().__init__()
        self.inner, self.pad, self.lift, self.cfg = model, pad, lift, model.cfg

    def _padded(self, logits):
        return torch.cat([logits, logits.new_full((*logits.shape[:-1], self.pad), self.lift)], -1).log_softmax(-1)

    def forward(self, tokens):
        return self._padded(self.inner(tokens))

    def start(self, prefix):
        return self.inner.start(prefix)

    def step(self, tokens, state):
        return self._padded(self.inner.step(tokens, state))


@torch.no_grad()
def test_generation_never_draws_an_id_past_the_tokenizers_vocabulary():
    torch.manual_seed(0)
    model = Padded(GPT(GPTConfig(vocab_size=30, d_model=32, heads=4, layers=2, ffn_dim=64, context=40)).eval())
    assert generate(model, [1, 2, 3], 1, temperature=0)[0] >= 30  # the padding wins where nothing stops it
    greedy = generate(model, [1, 2, 3], 20, temperature=0, vocab=30)
    assert greedy == generate(model.inner, [1, 2, 3], 20, temperature=0)  # the tokenizer's ids, as unpadded
    assert greedy == generate(model, [1, 2, 3], 20, temperature=0, vocab=30, cache=False)
    drawn = generate(model, [1, 2, 3], 36, temperature=3.0, top_p=0.99, vocab=30,
                     generator=torch.Generator().manual_seed(1))
    assert len(drawn) == 36 and max(drawn) < 30


def test_generate_draws_only_the_tokenizers_ids(monkeypatch, tmp_path, capsys):
    """``skiplab generate`` hands the tokenizer's vocabulary to the sampler: a model padded past it (an import)
    never yields an id the tokenizer cannot write."""
    torch.manual_seed(0)
    model = Padded(GPT(GPTConfig(vocab_size=257, d_model=32, heads=4, layers=2, ffn_dim=64, context=40)).eval())
    tok = ByteTokenizer()
    monkeypatch.setattr(lm_task.lm, "load_run", lambda path, average=0: ({}, model, tok))
    assert main(["generate", "--checkpoint", str(tmp_path), "--prompt", "the", "--max-new-tokens", "8",
                 "--temperature", "0"]) == 0
    assert capsys.readouterr().out.startswith("the")


def test_top_k_and_top_p_keep_the_right_tokens():
    logits = torch.log(torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]))
    assert torch.isfinite(filter_logits(logits, top_k=2)).tolist() == [True, True, False, False, False]
    assert torch.isfinite(filter_logits(logits, top_p=0.8)).tolist() == [True, True, True, False, False]
    assert torch.isfinite(filter_logits(logits, top_p=0.5)).tolist() == [True, False, False, False, False]


def test_compare_lm_without_a_test_split_says_so_before_training(text, tmp_path, capsys, monkeypatch):
    """compare's metric is the test split's bits per byte: text files without --test-file, or a prepared folder
    without a test split, are one line before anything is prepared or trained; a prepared folder with one is
    taken without --test-file."""
    from skiplab import tasks

    monkeypatch.setattr(tasks.TASKS["lm"], "train", lambda *a, **k: pytest.fail("trained"))
    argv = args(text, tmp_path / "cmp", "--connections", "PreLN,PostLN", "--seeds", "1")[2:]
    i = argv.index("--test-file")
    no_test = argv[:i] + argv[i + 2:]
    assert run(["compare", "lm", *no_test]) == 2
    err = capsys.readouterr().err
    assert err == "skiplab: error: the final model is scored on the test split: give --test-file (with --corpus '')\n"
    assert not (tmp_path / "cmp").exists()
    for name, files in (("two", ["--valid-file", text / "valid.jsonl"]),
                        ("three", ["--valid-file", text / "valid.jsonl", "--test-file", text / "test.jsonl"])):
        assert run(["prepare", "lm", "--corpus", "", "--train-file", text / "train.jsonl", *files, "--tokenizer",
                    "bytes", "--out", tmp_path / name]) == 0
    capsys.readouterr()
    j = no_test.index("--train-file")
    on_folder = no_test[:j] + no_test[j + 4:] + ["--tokenizer", "bytes"]  # no --train-file, --valid-file
    assert run(["compare", "lm", *on_folder, "--data-dir", tmp_path / "two"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("skiplab: error: ") and err.endswith("no test split (it has train, valid)\n")
    assert not (tmp_path / "cmp").exists()
    with pytest.raises(pytest.fail.Exception, match="trained"):  # past the check: it goes on to train
        run(["compare", "lm", *on_folder, "--data-dir", tmp_path / "three"])


def test_compare_lm_writes_a_bits_per_byte_table(text, tmp_path, capsys):
    out = tmp_path / "cmp"
    argv = args(text, out, "--connections", "PreLN,PostLN", "--seeds", "1")[2:]  # drop "train lm"
    with one_thread():
        assert run(["compare", "lm", *argv]) == 0
    table = (out / "table.md").read_text()
    assert "bits per byte" in table and "PostLN" in table and "parameters" in table and "MFLOP/token" in table
    assert "Budget: equal updates (6 each)." in table and "Status: diverged (non-finite loss), stalled" in table
    summary = json.loads((out / "PostLN" / "seed1" / "summary.json").read_text())  # per-step telemetry's columns
    written = json.loads((out / "compare.json").read_text())
    column = written["columns"]["PostLN"]
    assert (column["loss spikes"], column["max grad norm"]) == (str(summary["loss_spikes"]),
                                                                 f"{summary['max_grad_norm']:.2f}")
    assert "| loss spikes | max grad norm |" in table
    mean = written["rows"][1]["mean"]
    assert f"{mean:.3f} (one run)" in table  # three decimals: bits per byte differ in the third; one seed: no spread
    assert summary["test_bpb"] > 0
    first = json.loads((out / "PreLN" / "seed1" / "summary.json").read_text())
    assert written["header"]["reference"] == first["unigram_test_bpb"] > 0  # the level the stall margin is from
    assert "WARNING" not in table  # every run on this machine
    # a run recorded on another machine (collected runs): its block mixes machines, the table says so and leaves
    # that pair out
    other = another_machine(out / "PostLN" / "seed1" / "config.json")
    with one_thread():
        assert run(["compare", "lm", *argv]) == 0  # both runs done: only the table is made again
    table = (out / "table.md").read_text()
    assert "WARNING: block seed1 mixes machines" in table
    assert f"WARNING: no same-machine baseline, left out of Δ and the paired and Welch p: PostLN seed 1 ({other}; its " \
           "baseline: " in table
    assert json.loads((out / "compare.json").read_text())["rows"][1]["pairs"] == 0
    assert "| bits per byte (mean ± std) |" in table  # the metric's name, not a variant's
    # a comparison that would drop a design of the table there is refused, in one line, unless --overwrite
    kept = (out / "table.md").read_bytes()
    fewer = args(text, out, "--connections", "PreLN", "--seeds", "1")[2:]
    capsys.readouterr()
    assert run(["compare", "lm", *fewer]) == 2
    err = capsys.readouterr().err
    assert "holds the table of another comparison, with designs PostLN, which this one lacks" in err
    assert err.count("\n") == 1 and (out / "table.md").read_bytes() == kept
    with one_thread():
        assert run(["compare", "lm", *fewer, "--overwrite"]) == 0
    assert "PostLN" not in (out / "table.md").read_text() and (out / "PostLN" / "seed1" / "summary.json").is_file()
    assert run(["compare", "lm", *args(text, out / "PreLN" / "seed1", "--connections", "PreLN", "--seeds", "1")[2:]]) == 2
    assert "is a training run's folder; a comparison writes its runs and table in a folder of its own" in \
        capsys.readouterr().err


def test_compare_scores_each_run_as_it_ends_and_names_an_unscorable_run(text, tmp_path, capsys, monkeypatch):
    """The runs are queued block by block, the baseline first, and each is scored as soon as it has trained (a
    block's collected files are whole without checkpoints); a finished run restored without its score and without
    last.pt is one line, nothing of the table written."""
    from skiplab.tasks import get, parallel

    events = []
    real_train, real_score = parallel.train_or_resume, type(get("lm")).score
    monkeypatch.setattr(parallel, "train_or_resume", lambda task, cfg, progress=True: (
        events.append(("train", "/".join(Path(cfg.out).parts[-2:]))), real_train(task, cfg, progress))[1])
    monkeypatch.setattr(type(get("lm")), "score", lambda self, cfg, summary, progress: (
        events.append(("score", "/".join(Path(cfg.out).parts[-2:]))), real_score(self, cfg, summary, progress))[1])
    out = tmp_path / "cmp"
    argv = args(text, out, "--connections", "PreLN,PostLN", "--seeds", "2")[2:]
    with one_thread():
        assert run(["compare", "lm", *argv]) == 0
    assert events == [(e, f"{r}/seed{k}") for k in (1, 2) for r in ("PreLN", "PostLN") for e in ("train", "score")]
    gone = out / "PostLN" / "seed2"
    summary = json.loads((gone / "summary.json").read_text())
    del summary["test_bpb"]
    (gone / "summary.json").write_text(json.dumps(summary))
    (gone / "last.pt").unlink()
    (out / "table.md").unlink()
    capsys.readouterr()
    with one_thread():
        assert run(["compare", "lm", *argv]) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("compare:")]
    assert err == [f"skiplab: error: {gone}: finished but not scored (test_bpb), and its checkpoint (last.pt) is not "
                   "there to score it from; put it back, or remove the run to train it again"]
    assert not (out / "table.md").exists()


def test_compare_with_jobs_scores_each_run_in_its_worker(text, tmp_path, monkeypatch):
    """With --jobs 2 the runs train in worker processes and each is scored there, right after it trains: every
    summary holds its score and the command's own process scores none."""
    from skiplab.tasks import get

    in_main = []
    monkeypatch.setattr(type(get("lm")), "score", lambda self, cfg, summary, progress: in_main.append(cfg.out))
    out = tmp_path / "cmp"
    argv = args(text, out, "--connections", "PreLN,PostLN", "--seeds", "2", "--jobs", "2")[2:]
    with one_thread():
        assert run(["compare", "lm", *argv]) == 0
    assert in_main == []
    for name in ("PreLN", "PostLN"):
        for k in (1, 2):
            assert "test_bpb" in json.loads((out / name / f"seed{k}" / "summary.json").read_text())
            assert (out / name / f"seed{k}.log").is_file()


def test_compare_refuses_a_block_begun_on_another_machine(text, tmp_path, capsys):
    """Block 1's PreLN was trained on another machine: PostLN's run of that block is not trained here (it would
    lack a same-machine baseline), nothing is written for it; --mixed-blocks trains it and the table flags it."""
    out = tmp_path / "cmp"
    base = args(text, out, "--seeds", "1")[2:]
    with one_thread():
        assert run(["compare", "lm", *base, "--connections", "PreLN,PostLN"]) == 0
    shutil.rmtree(out / "PostLN")  # block 1 holds PreLN alone, trained (as the edit below says) elsewhere
    other = another_machine(out / "PreLN" / "seed1" / "config.json")
    capsys.readouterr()
    with one_thread():
        assert run(["compare", "lm", *base, "--connections", "PreLN,PostLN"]) == 2
    err = capsys.readouterr().err
    assert f"block seed1 was begun on another machine (PreLN on {other})" in err
    assert "--mixed-blocks" in err and len([line for line in err.splitlines() if "skiplab:" in line]) == 1
    assert not (out / "PostLN").exists()
    with one_thread():
        assert run(["compare", "lm", *base, "--connections", "PreLN,PostLN", "--mixed-blocks"]) == 0
    assert "WARNING: block seed1 mixes machines" in (out / "table.md").read_text()


def test_compare_with_a_flops_budget_gives_costlier_designs_fewer_updates(text, tmp_path, capsys):
    """--budget flops: SAS's counted FLOPs per token exceed PreLN's by 6 x its gate matrices' weights (each
    weight a multiply-add forward and two backward); it gets round(S · F_PreLN / F_SAS) updates."""
    from skiplab.models import build_model
    from skiplab.tasks import budget, get
    from skiplab.train.lm import LMTrainConfig

    task = get("lm")
    cfg = LMTrainConfig(model=TINY, corpus="", train_file=str(text / "train.jsonl"),
                        valid_file=str(text / "valid.jsonl"), batch_size=4)
    f_pre = budget.flops_per_token(task, dataclasses.replace(cfg, model=TINY.replace(")", ",connection=PreLN)")))
    sas_cfg = dataclasses.replace(cfg, model=TINY.replace(")", ",connection=SAS)"))
    f_sas = budget.flops_per_token(task, sas_cfg)
    model = build_model(sas_cfg.model_config(257))
    gates = sum(m.weight.numel() for name, m in model.named_modules()
                if isinstance(m, torch.nn.Linear) and ".conn_" in name)  # the Scaling Gates' layers
    assert gates > 0 and f_sas - f_pre == pytest.approx(6 * gates)
    out = tmp_path / "cmp"
    argv = args(text, out, "--connections", "PreLN,SAS", "--seeds", "1", "--max-steps", "12", "--budget", "flops")[2:]
    with one_thread():
        assert run(["compare", "lm", *argv]) == 0
    plan = json.loads((out / "budget.json").read_text())
    assert plan["variants"]["PreLN"]["max_steps"] == 12
    assert plan["variants"]["SAS"]["max_steps"] == round(12 * f_pre / f_sas) < 12
    assert json.loads((out / "SAS" / "seed1" / "summary.json").read_text())["steps"] == round(12 * f_pre / f_sas)
    table = (out / "table.md").read_text()
    assert "Budget: equal training FLOPs" in table and "| updates" in table
    # the same folder under another budget: one line naming both budgets, nothing trained or written
    other = [a if a != "flops" else "time" for a in argv]
    kept = (out / "table.md").read_bytes()
    capsys.readouterr()
    assert run(["compare", "lm", *other]) == 2
    err = capsys.readouterr().err
    assert "holds a comparison under --budget flops" in err and "this one asks --budget time" in err
    assert err.count("\n") == 1 and (out / "table.md").read_bytes() == kept


def test_compare_lm_tokenises_once_for_every_run(text, tmp_path, monkeypatch):
    """The text is tokenised (and the bpe model trained) once, into OUT/prepared/, and no run reads the text; a
    run of the comparison ends exactly where the same run trained from the text ends (same windows)."""
    import skiplab.tasks.lm as task_lm
    import skiplab.train.lm as train_lm
    import skiplab.train.lm_data as lm_data

    made = []
    real = task_lm.prepare
    monkeypatch.setattr(task_lm, "prepare", lambda cfg, progress=True: made.append(cfg.out) or real(cfg, False))
    bpe = ("--tokenizer", "bpe", "--vocab-size", "300")
    alone = tmp_path / "alone"
    with one_thread():
        assert run(args(text, alone, *bpe)) == 0  # from the text, before text reading is refused
    for reader in (train_lm, lm_data):  # the loop's (a tokenizer trained by the run) and the token streams'
        monkeypatch.setattr(reader, "documents", lambda *a, **k: pytest.fail("a run read the text"))
    out = tmp_path / "cmp"
    argv = args(text, out, *bpe, "--connections", "PreLN,PostLN", "--seeds", "1")[2:]
    with one_thread():
        assert run(["compare", "lm", *argv]) == 0
        assert run(["compare", "lm", *argv]) == 0  # again: nothing tokenised, nothing trained
    (folder,) = map(Path, made)
    assert folder.parent == out / "prepared" and (folder / "prepared.json").is_file()
    for conn in ("PreLN", "PostLN"):
        assert json.loads((out / conn / "seed1" / "config.json").read_text())["config"]["data_dir"] == str(folder)
    ours = json.loads((out / "PreLN" / "seed1" / "summary.json").read_text())
    theirs = json.loads((alone / "summary.json").read_text())
    assert ours["final_valid_loss"] == theirs["final_valid_loss"] and ours["test_bpb"] > 0


@pytest.mark.skipif(not PYDOCS.is_dir(), reason="the pydocs corpus is not beside the checkout (../shared/data/pydocs)")
def test_the_loss_falls_on_pydocs(tmp_path):
    with one_thread():
        summary = train(LMTrainConfig(model=TINY, data_dir=str(PYDOCS), batch_size=16, max_steps=60, eval_every=30,
                                      warmup=5, lr=1e-2, valid_tokens=20000, device="cpu", out=str(tmp_path / "r")),
                        progress=False)
    records = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["valid_bpb"] < records[0]["valid_bpb"] < 8  # below the 8 bits of a uniform byte guess, falling
    assert summary["final_valid_bpb"] == records[-1]["valid_bpb"]


def test_admin_profile_sees_one_batch_before_the_first_update(text, tmp_path, capsys):
    out = tmp_path / "admin"
    with one_thread():
        assert run(args(text, out, "--connection", "Admin(init=profile)", "--max-steps", "1", "--eval-every", "1")) == 0
    assert "Admin: ω profiled on one batch" in capsys.readouterr().out
    with one_thread():
        assert run(args(text, tmp_path / "closed", "--connection", "Admin(init=closed)", "--max-steps", "1",
                        "--eval-every", "1")) == 0
    assert "profiled" not in capsys.readouterr().out  # the closed form needs no data
    assert json.loads((tmp_path / "closed" / "config.json").read_text())["admin"]["decoder"]["built"] == "closed"
    with one_thread():  # the default: the GPT's N(0, 0.02²) branches are not the closed form's, so it profiles
        assert run(args(text, tmp_path / "auto", "--connection", "Admin", "--max-steps", "1", "--eval-every", "1")) == 0
    assert "Admin: ω profiled on one batch" in capsys.readouterr().out
    built = json.loads((tmp_path / "auto" / "config.json").read_text())["admin"]["decoder"]
    assert (built["init"], built["built"], built["connections"]) == ("auto", "profile", 4)
    assert built["summed_share"]["profiled"] > 4 * built["summed_share"]["closed"]


def test_config_records_the_connections_as_built(text, tmp_path):
    """A spec that names no norm takes the model's: config.json says what was built (MixLN on an RMS model)."""
    with one_thread():
        assert run(args(text, tmp_path / "mix", "--connection", "MixLN", "--norm", "RMS", "--max-steps", "1",
                        "--eval-every", "1")) == 0
    config = json.loads((tmp_path / "mix" / "config.json").read_text())
    assert (config["model"]["connection"], config["model"]["norm"]) == ("MixLN", "RMS")
    assert config["connections"] == ["MixLN+RMS"]


def test_wsd_warms_up_holds_then_decays_over_the_last_fraction():
    cfg = LMTrainConfig(schedule="wsd", lr=1e-3, min_lr=1e-4, warmup=10, max_steps=100, decay=0.2)
    assert [learning_rate(cfg, s) for s in (5, 10, 11, 80)] == [5e-4, 1e-3, 1e-3, 1e-3]  # stable to 100 - 20
    assert learning_rate(cfg, 90) == pytest.approx(1e-4 + 0.9e-3 * 0.5)  # linear: halfway down at p = 1/2
    assert learning_rate(cfg, 100) == pytest.approx(1e-4)
    sqrt = LMTrainConfig(schedule="wsd", lr=1e-3, min_lr=1e-4, warmup=10, max_steps=100, decay=0.2,
                         decay_shape="sqrt")
    assert learning_rate(sqrt, 85) == pytest.approx(1e-4 + 0.9e-3 * (1 - math.sqrt(0.25)))
    with pytest.raises(ValueError, match="--warmup 90 runs into the decay, which starts after update 80"):
        LMTrainConfig(schedule="wsd", warmup=90, max_steps=100)
    with pytest.raises(ValueError, match="--decay must be in"):
        LMTrainConfig(schedule="wsd", decay=0)
    with pytest.raises(ValueError, match=r"--decay 0.04 of --max-steps 10 is 0.4 updates, which round to none"):
        LMTrainConfig(schedule="wsd", decay=0.04, max_steps=10, warmup=1)  # it ran at the peak lr to the end
    assert stable_end(LMTrainConfig(schedule="wsd", decay=0.06, max_steps=10, warmup=1)) == 9  # one update of decay


def test_the_decay_options_beside_another_schedule_are_refused(text, tmp_path, capsys):
    """--schedule cosine --decay-shape sqrt trained the cosine run and recorded a decay shape it never had."""
    for schedule in ("cosine", "constant"):
        for given in (("--decay-shape", "sqrt"), ("--decay", "0.5"), ("--decay", "0.5", "--decay-shape", "sqrt")):
            out = tmp_path / f"{schedule}{len(given)}"
            assert run(args(text, out, "--schedule", schedule, *given)) == 2
            flags = " and ".join(g for g in given if g.startswith("--"))
            assert capsys.readouterr().err == (f"skiplab: error: {flags} shape the wsd schedule's decay; --schedule "
                                               f"{schedule} has none (give --schedule wsd, or leave them out)\n")
            assert not out.exists()



def test_a_stable_phase_checkpoint_branches_into_a_longer_budget_exactly(text, tmp_path, capsys):
    """One wsd run of 8 updates (stable to 4) gives, from its checkpoint at 4, the run of 12 updates (stable to 6):
    the branch ends bit for bit where a 12-update run trained straight through ends. A checkpoint past the stable
    phase, or of another schedule, is refused in one line."""
    wsd = ("--schedule", "wsd", "--decay", "0.5", "--eval-every", "2", "--warmup", "1", "--keep-checkpoints", "9")
    short, straight, branched = tmp_path / "short", tmp_path / "straight", tmp_path / "branched"
    with one_thread():
        assert run(args(text, short, *wsd, "--max-steps", "8")) == 0
        assert run(args(text, straight, *wsd, "--max-steps", "12")) == 0
        assert run(["train", "lm", "--branch", short / "checkpoint_4.pt", "--max-steps", "12", "--out", branched]) == 0
    a = torch.load(straight / "last.pt", weights_only=True)
    b = torch.load(branched / "last.pt", weights_only=True)
    assert b["step"] == 12 and all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    ra, rb = ([json.loads(x) for x in (r / "metrics.jsonl").read_text().splitlines()] for r in (straight, branched))
    assert [(r["step"], r["lr"], r["valid_loss"]) for r in ra] == [(r["step"], r["lr"], r["valid_loss"]) for r in rb]
    config = json.loads((branched / "config.json").read_text())
    assert config["branched_from"]["step"] == 4 and config["config"]["max_steps"] == 12
    assert (short / "last.pt").is_file() and json.loads((short / "summary.json").read_text())["steps"] == 8
    capsys.readouterr()
    assert run(["train", "lm", "--branch", short / "checkpoint_6.pt", "--max-steps", "12",
                "--out", tmp_path / "late"]) == 2
    err = capsys.readouterr().err.strip()
    assert "the checkpoint is at update 6, past the stable phase (to update 4)" in err and "\n" not in err
    assert not (tmp_path / "late").exists()  # refused before anything is written
    cosine = tmp_path / "cosine"
    with one_thread():
        assert run(args(text, cosine, "--eval-every", "3")) == 0
    assert run(["train", "lm", "--branch", cosine / "checkpoint_3.pt", "--max-steps", "9",
                "--out", tmp_path / "c2"]) == 2
    assert "--branch takes a checkpoint of a --schedule wsd run" in capsys.readouterr().err


@pytest.mark.parametrize("connection", ["PreLN", "PostLN+ValueRes"])
def test_activation_checkpointing_gives_the_same_numbers(text, tmp_path, connection):
    """Recomputing each layer in the backward (dropout on: its RNG state is replayed) trains to the same bits; the
    model recomputes only while training with gradients, so an evaluation's forward hooks fire once a layer."""
    plain, ckpt = tmp_path / "plain", tmp_path / "ckpt"
    with one_thread():
        assert run(args(text, plain, "--dropout", "0.1", "--connection", connection)) == 0
        assert run(args(text, ckpt, "--dropout", "0.1", "--connection", connection,
                        "--activation-checkpointing", "true")) == 0
    a, b = (torch.load(r / "last.pt", weights_only=True)["model"] for r in (plain, ckpt))
    assert all(torch.equal(a[k], b[k]) for k in a)
    model = GPT(GPTConfig(vocab_size=20, d_model=16, heads=2, layers=2, ffn_dim=32, context=8))
    model.checkpointing = True
    calls = []
    forward = model.layers[0].forward
    model.layers[0].forward = lambda *a, **k: calls.append("forward") or forward(*a, **k)
    model.layers[0].register_forward_hook(lambda *_: calls.append("hook"))
    x = torch.randint(0, 20, (2, 8))
    model.train()(x).sum().backward()
    assert calls == ["forward", "hook", "forward"]  # recomputed in the backward, the hook seeing one forward
    calls.clear()
    with torch.no_grad():
        model.eval()(x)
    assert calls == ["forward", "hook"]


def test_a_padded_vocabulary_trains_evaluates_and_samples_real_tokens_alone(text, tmp_path, capsys):
    out = tmp_path / "padded"
    with one_thread():
        assert run(args(text, out, "--pad-vocab", "64")) == 0  # bytes: 257 ids in 320 rows
    state = torch.load(out / "last.pt", weights_only=True)
    assert state["model"]["embed.weight"].shape[0] == 320 and state["model_config"]["vocab_size"] == 257
    capsys.readouterr()
    assert run(["eval", "lm", "--checkpoint", out, "--split", "test"]) == 0
    assert json.loads(capsys.readouterr().out)["bpb"] > 0
    assert run(["generate", "--checkpoint", out, "--prompt", "the cat", "--max-new-tokens", "20", "--seed", "3"]) == 0
    assert capsys.readouterr().out.startswith("the cat")
    trained = load_trained(out)
    with torch.no_grad():
        logits = trained.model(torch.zeros(1, 4, dtype=torch.long))
    assert logits.shape[-1] == 257


WSD = ("--schedule", "wsd", "--decay", "0.5", "--eval-every", "2", "--warmup", "1", "--keep-checkpoints", "9")


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def refused(capsys, message: str) -> None:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("skiplab: error: ") and message in err, err


def test_a_branch_without_its_runs_config_leaves_the_run_it_would_replace(text, tmp_path, capsys):
    """A step checkpoint taken out of its run directory has no config.json beside it: --branch says so in one line
    before it removes anything, so the run --overwrite would replace is left whole."""
    short, existing, lone = tmp_path / "short", tmp_path / "existing", tmp_path / "lone"
    with one_thread():
        assert run(args(text, short, *WSD, "--max-steps", "8")) == 0
        assert run(args(text, existing, "--max-steps", "2", "--eval-every", "2")) == 0
    lone.mkdir()
    shutil.copyfile(short / "checkpoint_4.pt", lone / "checkpoint_4.pt")
    before = files_of(existing)
    capsys.readouterr()
    assert run(["train", "lm", "--branch", lone / "checkpoint_4.pt", "--max-steps", "12", "--out", existing,
                "--overwrite"]) == 2
    refused(capsys, f"{lone / 'config.json'}: no such file; --branch takes a step checkpoint inside the directory of "
                    "the run that wrote it")
    assert files_of(existing) == before
    notes = tmp_path / "notes"  # a folder that is not a run is never replaced, --overwrite or not
    notes.mkdir()
    (notes / "keep.txt").write_text("keep me")
    assert run(["train", "lm", "--branch", short / "checkpoint_4.pt", "--max-steps", "12", "--out", notes,
                "--overwrite"]) == 2
    refused(capsys, "notes is not a skiplab run directory (no config.json); refusing to overwrite it")
    assert files_of(notes) == {"keep.txt": b"keep me"}


def test_a_branch_beside_another_runs_config_writes_nothing_and_a_failed_start_does_not_block(text, tmp_path, capsys):
    """A checkpoint in a folder whose config.json is another run's is refused before RUN is made (it was left
    half-made, blocking the retry); a branch whose start fails (its data moved) is made again by the same command
    once the data are back."""
    short, other = tmp_path / "short", tmp_path / "other"
    with one_thread():
        assert run(args(text, short, *WSD, "--max-steps", "8")) == 0
        assert run(args(text, other, "--max-steps", "2", "--eval-every", "2", "--lr", "2e-3")) == 0
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copyfile(short / "checkpoint_4.pt", mixed / "checkpoint_4.pt")
    shutil.copyfile(other / "config.json", mixed / "config.json")
    branched = tmp_path / "branched"
    argv = ["train", "lm", "--branch", mixed / "checkpoint_4.pt", "--max-steps", "12", "--out", branched]
    capsys.readouterr()
    assert run(argv) == 2
    refused(capsys, f"{mixed / 'config.json'}: the config of another run than checkpoint_4.pt's (different ")
    assert not branched.exists()
    shutil.copyfile(short / "config.json", mixed / "config.json")  # the input fixed
    moved = text.parent / f"{text.name}-moved"
    text.rename(moved)
    try:
        with one_thread():
            assert run(argv) == 2  # the branch is made, its start fails: the training text is not there
        refused(capsys, "train.jsonl: no such file")
    finally:
        moved.rename(text)
    with one_thread():
        assert run(argv) == 0  # the same command: the branch that never saved is made again
    assert "has not saved since it was made; made again" in capsys.readouterr().out
    assert json.loads((branched / "summary.json").read_text())["steps"] == 12


def test_a_chunked_head_loss_trains_as_the_eager_head_and_liger_is_refused_on_a_cpu(text, tmp_path, capsys):
    """--head-loss chunked (the output layer and loss without the logits) makes the eager head's updates within
    float32 noise, and the run's config says which head it had."""
    with one_thread():
        assert run(args(text, tmp_path / "eager")) == 0
        assert run(args(text, tmp_path / "chunked", "--head-loss", "chunked")) == 0
    ra, rb = ([json.loads(x) for x in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]
              for d in ("eager", "chunked"))
    assert [r["step"] for r in ra] == [r["step"] for r in rb] == [3, 6]
    for a, b in zip(ra, rb):
        assert abs(a["train_loss"] - b["train_loss"]) < 1e-5 and abs(a["valid_loss"] - b["valid_loss"]) < 1e-5
    a = torch.load(tmp_path / "eager" / "last.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "chunked" / "last.pt", weights_only=True)["model"]
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-4, atol=1e-5, msg=key)
    assert json.loads((tmp_path / "chunked" / "config.json").read_text())["config"]["head_loss"] == "chunked"
    capsys.readouterr()
    assert run(args(text, tmp_path / "liger", "--head-loss", "liger")) == 2
    assert "--head-loss liger runs on CUDA only; chunked is the same computation on any device" in capsys.readouterr().err
    assert run(args(text, tmp_path / "other", "--head-loss", "fused")) == 2
    assert "unknown --head-loss 'fused'; known: eager, chunked, liger" in capsys.readouterr().err
    assert not (tmp_path / "liger").exists() and not (tmp_path / "other").exists()


def test_a_refused_start_leaves_no_folder_and_a_refused_resume_no_lock(text, tmp_path, capsys):
    """Bad data is found after the run's folder is made and held: the folder it made goes with it. A resume refused
    for its config, and a run that fails in its first steps, leave their folders as they were, but no lock."""
    out = tmp_path / "deep" / "run"
    argv = args(text, out)
    argv[argv.index("--train-file") + 1] = tmp_path / "nowhere.jsonl"
    assert run(argv) == 2
    assert "nowhere.jsonl" in capsys.readouterr().err and not out.exists() and not out.parent.exists()
    with one_thread():
        assert run(args(text, out)) == 0
    files = sorted(p.name for p in out.iterdir())
    capsys.readouterr()
    assert run(args(text, out, "--batch-size", "4", "--resume")) == 2
    assert "holds a run with another config (different batch_size)" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == files and run_dir.LOCK not in files
    assert run(["eval", "lm", "--checkpoint", out, "--split", "valid", "--data-dir", tmp_path / "nonexist"]) == 2
    assert "--data-dir " + str(tmp_path / "nonexist") + ": no such folder" in capsys.readouterr().err


def test_a_relative_data_dir_is_recorded_absolute(text, tmp_path, monkeypatch, capsys):
    """config.json names the data wherever the run is later evaluated from: --data-dir given relative to the
    folder the command ran in is recorded as that folder's absolute path. (Two updates with four of warm-up: the
    learning rate never reaches --lr, which a warning says.)"""
    monkeypatch.chdir(tmp_path)
    with one_thread():
        assert run(args(text, tmp_path / "run", "--data-dir", "data/here", "--max-steps", "2", "--warmup", "4",
                        "--log-layers", "3")) == 0
    stored = json.loads((tmp_path / "run" / "config.json").read_text())["config"]
    assert stored["data_dir"] == str(tmp_path / "data" / "here")
    err = capsys.readouterr().err
    assert "--warmup 4 is more than --max-steps 2: the learning rate rises to 0.0015 at most, never to --lr 0.003" in err
    # per-layer lines every 3 updates of 2: none written, said
    assert "--log-layers 3 is more than --max-steps 2: no update is watched" in err
    assert not (tmp_path / "run" / "layers.jsonl").exists()


def test_relative_data_files_are_recorded_absolute_and_evaluated_from_elsewhere(text, tmp_path, monkeypatch,
                                                                               capsys):
    """--train-file data/train.jsonl (relative to where the command ran) is recorded as an absolute path: `eval`
    from another folder reads the same test file (it read a path relative to wherever eval ran); a run that stored
    them relative, as runs did before, resumes with the same files named absolute."""
    shutil.copytree(text, tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    argv = args(Path("data"), "run", "--max-steps", "2")
    with one_thread():
        assert run(argv) == 0
    stored = json.loads((tmp_path / "run" / "config.json").read_text())["config"]
    assert [stored[f"{s}_file"] for s in ("train", "valid", "test")] == [
        str(tmp_path / "data" / f"{s}.jsonl") for s in ("train", "valid", "test")]
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    capsys.readouterr()
    assert run(["eval", "lm", "--checkpoint", tmp_path / "run", "--device", "cpu"]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] > 0
    monkeypatch.chdir(tmp_path)
    payload = json.loads((tmp_path / "run" / "config.json").read_text())
    payload["config"].update({f"{s}_file": f"data/{s}.jsonl" for s in ("train", "valid", "test")})
    (tmp_path / "run" / "config.json").write_text(json.dumps(payload))
    with one_thread():
        assert run(args(Path("data"), "run", "--max-steps", "2", "--resume")) == 0, capsys.readouterr().err
    # a run made in Python with relative paths (stored as given): resumed in Python as given, and from the shell
    cfg = LMTrainConfig(corpus="", train_file="data/train.jsonl", valid_file="data/valid.jsonl", model=TINY,
                        batch_size=8, max_steps=2, eval_every=2, warmup=1, device="cpu", out="api")
    with one_thread():
        train(cfg, progress=False)
        assert json.loads((tmp_path / "api" / "config.json").read_text())["config"]["train_file"] == "data/train.jsonl"
        assert train(cfg, resume=True, progress=False)["status"] == "finished"  # its config the stored one
        assert run(["train", "lm", "--out", "api", "--resume", "--train-file", "data/train.jsonl"]) == 0, \
            capsys.readouterr().err


def test_a_data_error_is_one_line_without_the_warm_up_warning_before_it(text, tmp_path, capsys):
    """The warm-up warning is said once the data are there: a missing training file is the one line printed."""
    argv = args(text, tmp_path / "run", "--max-steps", "2", "--warmup", "4")
    argv[argv.index("--train-file") + 1] = str(tmp_path / "nothere.jsonl")
    assert run(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("skiplab: error: ") and "nothere.jsonl" in err, err


def test_an_option_given_at_its_default_value_counts_on_resume_and_branch(text, tmp_path, capsys, monkeypatch):
    """--resume and --branch change only what the command gives; an option given at its default value is given
    too (it read as not given: `--resume --lr <default>` on a run of another lr resumed silently at the run's lr,
    and `--branch CK --max-steps 2000` decayed to the source run's budget). --branch with an option that is the
    checkpoint's (--lr) is refused in one line before its folder is made."""
    lr_default = next(f.default for f in dataclasses.fields(LMTrainConfig) if f.name == "lr")
    steps_default = next(f.default for f in dataclasses.fields(LMTrainConfig) if f.name == "max_steps")
    short = tmp_path / "short"
    with one_thread():
        assert run(args(text, short, *WSD, "--max-steps", "8")) == 0  # --lr 3e-3, not the default
    capsys.readouterr()
    assert run(["train", "lm", "--resume", "--out", short, "--lr", lr_default]) == 2
    refused(capsys, "holds a run with another config (different lr)")
    branched = tmp_path / "branched"
    assert run(["train", "lm", "--branch", short / "checkpoint_4.pt", "--max-steps", "12", "--lr", "0.01",
                "--d-model", "32", "--out", branched]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--branch trains on with the checkpoint's options: give --max-steps (and --out, " \
        "--overwrite, --data-dir, --device" in err and err.strip().endswith("not --lr, --d-model"), err
    assert not branched.exists()
    asked = []
    monkeypatch.setattr(lm_branch, "branch", lambda *a: asked.append(a[3]) or (_ for _ in ()).throw(ValueError("x")))
    assert run(["train", "lm", "--branch", short / "checkpoint_4.pt", "--max-steps", steps_default,
                "--out", branched]) == 2
    assert run(["train", "lm", "--branch", short / "checkpoint_4.pt", "--out", branched]) == 2
    assert asked == [steps_default, 0]  # given at the default: that budget; not given: the source run's


def test_data_a_run_cannot_train_on_is_refused_before_its_folder_holds_anything(text, tmp_path, capsys):
    """Splits mixing token ids (.bin) and text (a text run's validation ids were checked against --vocab-size and
    failed at the first evaluation, or a .bin run read a text split without a tokenizer: a traceback); --valid-tokens
    with .bin splits (it was ignored); a training split shorter than one window (found in the first update, after
    config.json was written, so the same command, fixed, was refused): one line each, nothing left behind."""
    np.arange(300, dtype=np.uint16).tofile(tmp_path / "ids.bin")
    ids = tmp_path / "ids.bin"
    cases = [
        (["--valid-file", ids], "--valid-file is token ids (.bin) and --train-file, --test-file text: give every split"),
        (["--train-file", ids, "--vocab-size", "300"], "--train-file is token ids (.bin) and --valid-file, --test-file"),
        (["--train-file", ids, "--valid-file", ids, "--test-file", ids, "--vocab-size", "300", "--valid-tokens", "50"],
         "--valid-tokens takes the first documents of a text split; a .bin split has no documents"),
    ]
    short = tmp_path / "short.jsonl"
    short.write_text(json.dumps({"text": "tiny"}) + "\n")
    cases.append((["--train-file", short], "short.jsonl: 5 tokens, fewer than a window of context + 1 = 33"))
    for i, (extra, message) in enumerate(cases):
        out = tmp_path / f"run{i}"
        capsys.readouterr()
        with one_thread():
            assert run(args(text, out, *extra)) == 2
        refused(capsys, message)
        assert not out.exists()


def test_a_resume_on_a_changed_split_is_refused(text, tmp_path, capsys):
    """The token counts config.json recorded are checked on resume: a training file cut short since the run started
    was resumed silently (the doc promises the updates of an uninterrupted run, which needs the same data)."""
    data = tmp_path / "data"
    shutil.copytree(text, data)
    out = tmp_path / "run"
    with one_thread():
        assert run(args(data, out, "--schedule", "constant", "--max-steps", "3")) == 0
    lines = (data / "train.jsonl").read_text().splitlines(keepends=True)
    (data / "train.jsonl").write_text("".join(lines[: len(lines) // 2]))
    before = (out / "last.pt").read_bytes()
    capsys.readouterr()
    assert run(["train", "lm", "--resume", "--out", out, "--max-steps", "6"]) == 2
    refused(capsys, f"but {out} started on ")  # "train.jsonl: N tokens, but RUN started on M: its train split ..."
    assert (out / "last.pt").read_bytes() == before


@pytest.mark.parametrize("command", [["train", "lm"], ["prepare", "lm"]])
def test_files_given_beside_a_named_corpus_are_refused(text, tmp_path, capsys, command):
    """--corpus is pydocs unless given: --train-file FILE without --corpus '' trained on pydocs, the file ignored."""
    argv = [*command, "--train-file", text / "train.jsonl", "--valid-file", text / "valid.jsonl",
            "--out", tmp_path / "out"]
    assert run(argv) == 2
    refused(capsys, "--train-file, --valid-file name files, which --corpus pydocs does not read: give --corpus ''")
    assert run([*command, "--corpus", "enwik8", "--test-file", text / "test.jsonl", "--out", tmp_path / "out"]) == 2
    refused(capsys, "--test-file names a file, which --corpus enwik8 does not read")
    assert not (tmp_path / "out").exists()


def test_overwrite_keeps_the_run_it_replaces_until_the_new_one_has_started(text, tmp_path, capsys):
    """--overwrite with a typo in the data (or a model that cannot be built) emptied the run folder before the
    error: the run it would replace is now kept aside until the new run writes its config.json, and put back
    where the new one fails or is interrupted before that."""
    out = tmp_path / "run"
    with one_thread():
        assert run(args(text, out)) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    for bad in (["--valid-file", text / "nope.jsonl"], ["--d-model", "30"]):
        capsys.readouterr()
        assert run([*args(text, out, *bad), "--overwrite"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("skiplab: error: "), err
        assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
        assert not (out / run_dir.REPLACED).exists()
    with one_thread():
        assert run([*args(text, out, "--lr", "2e-3"), "--overwrite"]) == 0
    assert not (out / run_dir.REPLACED).exists()
    assert json.loads((out / "config.json").read_text())["config"]["lr"] == 2e-3


def test_a_replaced_run_left_aside_by_a_killed_start_comes_back(tmp_path):
    """A --overwrite start killed (SIGKILL) before its config.json leaves the old run in .replaced: the next
    command in that folder puts it back before deciding anything."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text('{"config": {}}')
    (out / "last.pt").write_bytes(b"old")
    run_dir.set_aside(out)
    (out / run_dir.STARTED).touch()
    (out / "spm.model").write_bytes(b"new start's")
    with pytest.raises(run_dir.RunDirError, match="already holds"):
        run_dir.prepare(out)  # no --overwrite: the old run is back, and refused as any run is
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "last.pt"]
    assert (out / "last.pt").read_bytes() == b"old"


def test_resume_after_a_killed_overwrite_goes_on_with_the_run_it_was_replacing(text, tmp_path, capsys):  # noqa: F811
    """--resume in a folder a killed --overwrite left (the run set aside, no new config.json) said "its run stopped
    before writing config.json; start it again without --resume", and that start was refused as a run there."""
    out = tmp_path / "run"
    with one_thread():
        assert run(args(text, out, "--max-steps", "3", "--schedule", "constant")) == 0
    run_dir.set_aside(out)
    (out / run_dir.STARTED).touch()
    (out / "spm.model").write_bytes(b"the new start's")
    with one_thread():
        assert run(["train", "lm", "--resume", "--out", out, "--max-steps", "6"]) == 0, capsys.readouterr().err
    assert json.loads((out / "summary.json").read_text())["steps"] == 6
    assert not (out / run_dir.REPLACED).exists() and not (out / "spm.model").exists()
    assert torch.load(out / "checkpoint_3.pt", weights_only=True)["step"] == 3
