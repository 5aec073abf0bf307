"""Multi-process training under torchrun (gloo, CPU): N processes make one process's updates.

Every test here starts its processes itself (``python -m torch.distributed.run --standalone``) on tiny
data written by the test, with tiny models, one thread per process.
"""

import json
import os
import random
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from skiplab.bench.engine import _free_port
from skiplab.cli import main
from skiplab import distributed
from skiplab.distributed import _sync_batch_norm
from tests.noise import DELTA, assert_within_noise, image_training_in_float64, noise

ROOT = Path(__file__).resolve().parents[2]

# A toy parallel corpus: English sentences and a word-by-word "German" of them.
WORDS = {"a": "ein", "the": "der", "man": "mann", "woman": "frau", "dog": "hund", "cat": "katze", "red": "rot",
         "big": "gross", "small": "klein", "runs": "rennt", "sees": "sieht", "eats": "isst", "ball": "ball",
         "house": "haus", "green": "gruen", "old": "alt", "young": "jung", "in": "im", "park": "park",
         "street": "strasse", "and": "und", "plays": "spielt", "with": "mit", "bike": "fahrrad", "car": "auto"}


def write_corpus(root: Path, pairs: dict[str, int], seed: int = 0) -> Path:
    rng = random.Random(seed)
    vocab = sorted(WORDS)
    root.mkdir(parents=True, exist_ok=True)
    for split, n in pairs.items():
        en = [" ".join(rng.choice(vocab) for _ in range(rng.randint(3, 12))) for _ in range(n)]
        (root / f"{split}.en").write_text("".join(s.capitalize() + " .\n" for s in en))
        (root / f"{split}.de").write_text("".join(" ".join(WORDS[w] for w in s.split()).capitalize() + " .\n"
                                                  for s in en))
    return root


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("toy"), {"train": 240, "valid": 16})


def mt_args(corpus, out, *extra):
    return ["train", "mt", "--corpus", "", "--train-prefix", str(corpus / "train"), "--valid-prefix",
            str(corpus / "valid"), "--d-model", "32", "--ffn-dim", "64", "--heads", "2", "--encoder-layers", "1",
            "--decoder-layers", "1", "--vocab-size", "200", "--max-tokens", "256", "--max-steps", "4",
            "--save-every", "2", "--warmup", "2", "--lr", "1e-3", "--out", str(out), *extra]


NO_DROPOUT = ("--dropout", "0", "--attention-dropout", "0")


def torchrun(*args, nproc: int = 2) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           "-m", "skiplab", *map(str, args)]
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)


@contextmanager
def one_thread():
    """The in-process run computes as the single-threaded workers do (else float noise moves Adam's steps on
    parameters whose gradient is zero, such as the key bias)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def ok(run: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run


def model_of(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "last.pt", weights_only=True)["model"]


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def mt_pair(corpus, tmp_path_factory):
    """Two processes with --update-freq 1, and one with --update-freq 2, over the same batches."""
    root = tmp_path_factory.mktemp("mt")
    two = ok(torchrun(*mt_args(corpus, root / "two", *NO_DROPOUT)))
    with one_thread():
        assert main(mt_args(corpus, root / "one", *NO_DROPOUT, "--update-freq", "2")) == 0
    return root / "two", root / "one", two


def test_two_mt_processes_make_the_updates_of_one_with_twice_the_update_freq(mt_pair):
    two, one, _ = mt_pair
    a, b = model_of(two), model_of(one)
    assert list(a) == list(b)  # the plain model's keys: no "module." or "_orig_mod." prefixes
    # Exact, not close: each rank runs the kernels of one process's batch (same shapes, one thread each), gloo
    # adds the two ranks' gradients (a + b, rounded once, as one process accumulates them), and the scalings
    # by N = 2 (DDP's mean, grad / (T / N)) are exact; the losses are added in batch order on both sides.
    for key in b:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)
    for x, y in zip(records(two), records(one), strict=True):
        assert (x["step"], x["epoch"]) == (y["step"], y["epoch"])
        for key in ("train_loss", "valid_loss", "valid_nll"):
            assert x[key] == y[key], key
    ckpt = torch.load(two / "last.pt", weights_only=True)
    single = torch.load(one / "last.pt", weights_only=True)
    assert (ckpt["batch_pos"], ckpt["epoch"]) == (single["batch_pos"], single["epoch"])
    assert ckpt["world_size"] == 2 and len(ckpt["rng"]["ranks"]) == 2 and single["world_size"] == 1
    environment = json.loads((two / "config.json").read_text())["environment"]
    assert (environment["world_size"], environment["backend"]) == (2, "gloo")
    assert json.loads((two / "summary.json").read_text())["world_size"] == 2


def test_rank_0_alone_writes_the_run(mt_pair):
    two, one, run = mt_pair
    assert sorted(p.name for p in two.iterdir()) == sorted(p.name for p in one.iterdir()) == sorted([
        "config.json", "metrics.jsonl", "last.pt", "best.pt", "summary.json", "checkpoint_2.pt", "checkpoint_4.pt",
        "spm.model", "spm.vocab", "steps.jsonl"])
    assert [r["step"] for r in records(two)] == [2, 4]  # one line per record, not one per rank
    assert run.stdout.count('"status": "finished"') == 1 and run.stdout.count("training pairs") == 1
    assert "skiplab: error" not in run.stderr


def test_a_two_process_run_resumes_exactly_and_only_with_two(corpus, tmp_path, mt_pair, capsys):
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    ok(torchrun(*mt_args(corpus, straight, "--dropout", "0.2")))  # dropout on: every rank's RNG state matters
    ok(torchrun(*mt_args(corpus, stopped, "--dropout", "0.2", "--max-steps", "2")))
    resumed = ok(torchrun("train", "mt", "--resume", "--out", stopped, "--max-steps", "4"))
    assert resumed.stdout.count("resumed with max_steps 2 -> 4") == 1
    a, b = model_of(straight), model_of(stopped)
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=0, msg=key)
    assert [r["step"] for r in records(stopped)] == [2, 4]

    two, _, _ = mt_pair
    assert main(["train", "mt", "--resume", "--out", str(two), "--max-steps", "6"]) == 2
    err = capsys.readouterr().err
    assert "was trained by 2 processes; resume it with the same number (torchrun --nproc_per_node 2), not 1" in err
    assert err.count("\n") == 1


def test_two_image_processes_with_sync_bn_equal_one_with_the_union_batch(fashion_dir, tmp_path):
    # 100 images in batches of 64: the last batch (36) is shared 18 + 18; every PreAct block holds BatchNorm
    args = ["train", "image", "--dataset", "fashion-mnist", "--data-dir", fashion_dir, "--epochs", "1",
            "--train-subset", "100", "--test-subset", "40", "--batch-size", "64", "--lr", "0.02",
            "--connection", "2xSkip+BN", "--sync-bn", "true"]
    ok(torchrun(*args, "--out", tmp_path / "two"))
    with one_thread():
        assert main([*map(str, args), "--out", str(tmp_path / "one")]) == 0
        # The ranks' BatchNorm statistics and gradient sums are combined in another order than one process's:
        # the two runs differ by float32 rounding. Its size, measured (tests/noise.py): the one-process run
        # against the same run in float64, and that against itself on images perturbed at float32 size.
        with image_training_in_float64():
            assert main([*map(str, args), "--out", str(tmp_path / "exact")]) == 0
        with image_training_in_float64(delta=DELTA):
            assert main([*map(str, args), "--out", str(tmp_path / "perturbed")]) == 0
    runs = ("two", "one", "exact", "perturbed")
    a, b, b64, moved64 = (model_of(tmp_path / name) for name in runs)
    assert list(a) == list(b)
    for key in b:  # they differ by up to 3e-5 here; without --sync-bn by up to 3e-2 (98 of 135 tensors fail)
        assert_within_noise(a[key], b[key], noise((b[key], b64[key]), (moved64[key], b64[key])), msg=key)
    (x,), (y,), (y64,), (moved,) = (records(tmp_path / name) for name in runs)
    for key in ("train_loss", "test_loss"):
        assert_within_noise(x[key], y[key], noise((y[key], y64[key]), (moved[key], y64[key])), msg=key)
    assert (x["train_error"], x["test_error"]) == (y["train_error"], y["test_error"])


def test_an_error_on_rank_0_stops_every_rank_with_one_line(corpus, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "something").write_text("not a run")
    run = torchrun(*mt_args(corpus, out))
    assert run.returncode != 0
    lines = [line for line in run.stderr.splitlines() if line.startswith("skiplab: error:")]
    assert lines == [f"skiplab: error: {out} holds files but no skiplab run (no config.json); give --out a new or "
                     "empty folder"]
    assert sorted(p.name for p in out.iterdir()) == ["something"]


def test_a_killed_two_process_image_run_resumes_exactly(fashion_dir, tmp_path):
    args = ["train", "image", "--dataset", "fashion-mnist", "--data-dir", fashion_dir, "--epochs", "3",
            "--train-subset", "192", "--test-subset", "32", "--batch-size", "32", "--connection", "2rSkip+LN"]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    ok(torchrun(*args, "--out", straight))

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "skiplab",
           *map(str, args), "--out", str(killed)]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not ((killed / "metrics.jsonl").is_file() and (killed / "metrics.jsonl").read_text().count("\n")):
            assert proc.poll() is None and time.time() < deadline, "the run ended before its first epoch was saved"
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGTERM)  # torchrun stops its workers
        proc.wait(timeout=60)
    assert not (killed / "summary.json").exists(), "the run finished before it was killed"

    ok(torchrun("train", "image", "--resume", "--out", killed))
    a, b = model_of(straight), model_of(killed)
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=0, msg=key)
    assert [r["epoch"] for r in records(killed)] == [1, 2, 3]


def test_synchronised_batchnorm_refuses_a_second_derivative_in_one_line():
    """Its backward all-reduces the statistics' sums, which is no graph: asked for one (create_graph), it says so
    rather than return a gradient autograd would differentiate as if the sums were constants."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:  # the synchronised path itself (a group of one: the layer alone would run as plain BatchNorm)
        bn = nn.BatchNorm2d(4).train()
        x = torch.randn(2, 4, 5, 5, requires_grad=True)
        (g,) = torch.autograd.grad(_sync_batch_norm(bn, x).square().sum(), x)  # a first derivative: as before
        assert torch.isfinite(g).all()
        with pytest.raises(RuntimeError, match="synchronised BatchNorm has no second derivative"):
            torch.autograd.grad(_sync_batch_norm(bn, x).square().sum(), x, create_graph=True)
    finally:
        dist.destroy_process_group()


def test_a_step_before_the_group_needs_torchruns_store(monkeypatch):
    """``on_main_first`` waits through torchrun's own store; a process given the launch variables by hand has none:
    one line saying what to do, and the step not run. Not launched: the step runs here."""
    done = []
    distributed.on_main_first("branch", lambda: done.append(1))
    assert done == [1]
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    with pytest.raises(ValueError, match="branch under several processes needs torchrun's own store"):
        distributed.on_main_first("branch", lambda: done.append(2))
    assert done == [1]
