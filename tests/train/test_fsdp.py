"""--fsdp: a language model sharded over 2 gloo processes on the CPU (FSDP2) makes the updates of one process,
resumes exactly after a SIGKILL from its DCP checkpoint, and leaves a run directory every reader takes.

Every run here is the tiny GPT of tests/train/test_lm.py (d_model 32, 2 layers, context 32) on its tiny text,
its processes started by the test (``python -m torch.distributed.run --standalone``), one thread each.
"""

import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import weakref
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from skiplab import distributed
from skiplab.models import GPT, GPTConfig
from skiplab.train.sharded import shard, units
from tests.train.test_distributed import ROOT, ok, one_thread, torchrun
from tests.train.test_lm import STORY, args, run, text  # noqa: F401 - text: the fixture

FSDP = ("--fsdp", "true")


def last(out: Path) -> dict:
    return torch.load(out / "last.pt", weights_only=True)


def lines(out: Path, name: str) -> list[dict]:
    return [json.loads(x) for x in (out / name).read_text().splitlines()]


@pytest.fixture(scope="module")
def clipped(text, tmp_path_factory):  # noqa: F811
    """2 sharded processes and 1 plain one, --grad-accum 4 (each rank accumulates 2 micro-batches), clipping on."""
    root = tmp_path_factory.mktemp("fsdp")
    ok(torchrun(*args(text, root / "two", "--grad-accum", "4", *FSDP)))
    with one_thread():
        assert run(args(text, root / "one", "--grad-accum", "4")) == 0
    return root / "two", root / "one"


def test_two_sharded_processes_make_the_updates_of_one_exactly_without_clipping(text, tmp_path):  # noqa: F811
    # ReZero: one 0-dim α a layer (tied across its two sub-layers), which fully_shard refuses; it stays whole
    extra = ("--grad-accum", "2", "--clip-norm", "0", "--connection", "ReZero")
    ok(torchrun(*args(text, tmp_path / "two", *extra, *FSDP)))
    with one_thread():
        assert run(args(text, tmp_path / "one", *extra)) == 0
    a, b = last(tmp_path / "two")["model"], last(tmp_path / "one")["model"]
    assert list(a) == list(b)  # the full model's plain names, the tied α under both
    assert a["layers.0.conn_attn.alpha"].dim() == 0 and a["layers.0.conn_attn.alpha"] != 0  # trained
    # Exact: each rank runs one micro-batch's kernels, the reduce-scatter (and the α's all-reduce) adds the two
    # ranks' gradients (rounded once, as one process accumulates them) and halves them (exact), and AdamW is
    # elementwise on the shards.
    for key in b:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)
    assert [r["valid_loss"] for r in lines(tmp_path / "two", "metrics.jsonl")] == \
        [r["valid_loss"] for r in lines(tmp_path / "one", "metrics.jsonl")]


def test_two_sharded_processes_make_the_updates_of_one_within_float_noise(clipped):
    two, one = clipped
    a, b = last(two)["model"], last(one)["model"]
    assert list(a) == list(b)
    # Not exact: clipping scales every gradient by clip / ‖g‖, and the sharded norm sums the squares of each
    # shard, then of the ranks, in another order than one process (‖g‖ differs in its last bits), and each rank
    # adds its two micro-batches before the ranks' sums are added (one process adds the four in turn, as DDP
    # does not either). Measured after 6 updates: up to 2.9e-7 in the key biases (their gradient is zero in
    # exact arithmetic, so Adam normalises float noise), 6e-8 elsewhere; 2 DDP processes against the same one
    # process: 2.5e-7 and 6e-8. Without clipping and with one micro-batch a rank, exact (the test above).
    for key in b:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-5, msg=key)
    for x, y in zip(lines(two, "steps.jsonl"), lines(one, "steps.jsonl"), strict=True):
        assert x["grad_norm"] == pytest.approx(y["grad_norm"], rel=1e-5) and x["clipped"] == y["clipped"]
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-5)
    assert [r["step"] for r in lines(two, "metrics.jsonl")] == [3, 6]


def test_a_sharded_run_with_the_chunked_head_loss_makes_the_updates_of_one_eager_process(clipped, text, tmp_path):  # noqa: F811
    """--head-loss chunked under FSDP2: the root's forward takes the targets and returns the loss (the tied
    embedding's gradient through the readout), and the two ranks make the one eager process's updates."""
    two, one = tmp_path / "two", clipped[1]
    ok(torchrun(*args(text, two, "--grad-accum", "4", "--head-loss", "chunked", *FSDP)))
    a, b = last(two)["model"], last(one)["model"]
    for key in b:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-5, msg=key)
    for x, y in zip(lines(two, "steps.jsonl"), lines(one, "steps.jsonl"), strict=True):
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-5)


def test_a_sharded_run_keeps_the_shards_of_its_last_checkpoint_and_a_full_model(clipped):
    two, _ = clipped
    ckpt = last(two)
    assert ckpt["dcp"] == "dcp/step_6" and ckpt["optimizer"] is None and ckpt["world_size"] == 2
    assert ckpt["config"]["fsdp"] is True and len(ckpt["rng"]["ranks"]) == 2
    assert sorted(p.name for p in (two / "dcp").iterdir()) == ["step_6"]  # step_3's removed once last.pt moved on
    assert sorted(p.name for p in (two / "dcp" / "step_6").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    model = GPT(GPTConfig(**ckpt["model_config"]))
    model.load_state_dict(ckpt["model"])  # strict: every parameter, full size
    assert torch.load(two / "checkpoint_3.pt", weights_only=True)["model"].keys() == ckpt["model"].keys()


def test_activation_checkpointing_recomputes_the_sharded_layers_to_the_bit(clipped, text, tmp_path):  # noqa: F811
    two, _ = clipped  # the layers' recomputation in the backward gathers their shards again
    ok(torchrun(*args(text, tmp_path / "ac", "--grad-accum", "4", *FSDP, "--activation-checkpointing", "true")))
    a, b = last(tmp_path / "ac")["model"], last(two)["model"]
    for key in b:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)


def test_eval_generate_and_average_read_a_sharded_run(clipped, capsys):
    two, one = clipped
    with one_thread():
        capsys.readouterr()
        assert run(["eval", "lm", "--checkpoint", two, "--split", "valid"]) == 0
        result = json.loads(capsys.readouterr().out)
        # the full model of last.pt scores the validation split as the sharded run did at its last save (there
        # every rank scored every batch: a sharded forward pass needs all ranks)
        assert result["loss"] == pytest.approx(lines(two, "metrics.jsonl")[-1]["valid_loss"], rel=1e-12, abs=0)
        assert run(["eval", "lm", "--checkpoint", one, "--split", "valid"]) == 0
        assert result["loss"] == pytest.approx(json.loads(capsys.readouterr().out)["loss"], rel=1e-5)
        assert run(["eval", "lm", "--checkpoint", two, "--average", "2"]) == 0
        assert json.loads(capsys.readouterr().out)["averaged"] == 2
        assert run(["generate", "--checkpoint", two, "--prompt", "the cat", "--max-new-tokens", "5",
                    "--temperature", "0"]) == 0
        assert capsys.readouterr().out.startswith("the cat")


def test_a_killed_sharded_run_resumes_exactly(text, tmp_path):  # noqa: F811
    extra = ("--max-steps", "15", "--grad-accum", "2", "--dropout", "0.1", *FSDP)  # dropout: each rank's RNG matters
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    ok(torchrun(*args(text, straight, *extra)))

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "skiplab",
           *map(str, args(text, killed, *extra))]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # its own process group: torchrun and both workers
    try:
        deadline = time.time() + 120
        metrics = killed / "metrics.jsonl"
        while not (metrics.is_file() and metrics.read_text().count("\n")):
            assert proc.poll() is None and time.time() < deadline, "the run ended before its first save"
            time.sleep(0.01)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # as a lost machine: no process gets to clean up
        proc.wait(timeout=60)
    assert not (killed / "summary.json").exists(), "the run finished before it was killed"
    saved = last(killed)
    assert (killed / saved["dcp"] / ".metadata").is_file() and saved["step"] < 15

    ok(torchrun("train", "lm", "--resume", "--out", killed))
    # Exact: the shards of model and optimizer come back from DCP bit for bit, every rank's RNG state and the
    # windows' generator from last.pt, and the resumed ranks run the kernels the straight ones ran.
    a, b = last(straight), last(killed)
    for key in a["model"]:
        torch.testing.assert_close(b["model"][key], a["model"][key], rtol=0, atol=0, msg=key)
    assert [(r["step"], r["train_loss"], r["valid_loss"]) for r in lines(killed, "metrics.jsonl")] == \
        [(r["step"], r["train_loss"], r["valid_loss"]) for r in lines(straight, "metrics.jsonl")]
    assert [(s["step"], s["loss"], s["grad_norm"]) for s in lines(killed, "steps.jsonl")] == \
        [(s["step"], s["loss"], s["grad_norm"]) for s in lines(straight, "steps.jsonl")]
    assert sorted(p.name for p in (killed / "dcp").iterdir()) == ["step_15"]


WORKER = textwrap.dedent("""
    import json, sys
    import torch
    from skiplab import distributed
    from skiplab.models import GPT, GPTConfig
    from skiplab.train.sharded import shard
    from skiplab.train.telemetry import grad_norm

    group, _ = distributed.setup(torch.device("cpu"))
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=50, d_model=32, heads=2, layers=2, ffn_dim=64, context=16, connection="ReZero")
    plain, model = GPT(cfg), GPT(cfg)
    model.load_state_dict(plain.state_dict())
    net = shard(model, model, group, amp=False)
    batches = torch.randint(0, 50, (4, 3, 16), generator=torch.Generator().manual_seed(1))
    loss = lambda m, x: torch.nn.functional.cross_entropy(m(x[:, :-1]).transpose(1, 2), x[:, 1:])
    for x in batches:  # one process: the 4 micro-batches' mean loss
        (loss(plain, x) / 4).backward()
    mine = [batches[k] for k in range(4) if k % 2 == group.rank]
    with net.no_sync():
        (loss(net, mine[0]) * 2 / 4).backward()
    held = [p.grad is None for p in model.parameters() if p.dim()]  # no reduce-scatter yet: no sharded gradient
    (loss(net, mine[1]) * 2 / 4).backward()
    norm, clipped = grad_norm(list(model.parameters()), 0.0)
    grads = {n: p.grad.full_tensor() if p.dim() else p.grad for n, p in model.named_parameters()}
    diff = max(float((grads[n] - p.grad).abs().max()) for n, p in plain.named_parameters())
    expected, _ = grad_norm(list(plain.parameters()), 0.0)
    kinds = sorted({type(p).__name__ for p in model.parameters()})
    every = group.gather([type(norm).__name__, norm])
    if group.main:
        print("RESULT", json.dumps({"every": every, "expected": expected, "held": all(held), "diff": diff,
                                    "kinds": kinds}))
    distributed.shutdown()
""")


def test_sharded_gradients_accumulate_on_the_rank_and_their_norm_is_one_float_on_every_rank(tmp_path):
    """The gradients of 4 micro-batches, 2 a rank (the first under no_sync), and their norm, against one process's."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    done = ok(subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                              str(script)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300))
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    result = json.loads(line[len("RESULT "):])
    # ReZero: its 0-dim α (fully_shard refuses those) stay whole on each rank, their gradients averaged by a hook
    assert result["kinds"] == ["DTensor", "Parameter"] and result["held"]
    (kind, norm), (_, other) = result["every"]
    assert kind == "float" and norm == other  # telemetry's grad_norm: a plain float, the same on both ranks
    assert norm == pytest.approx(result["expected"], rel=1e-6) and result["diff"] < 1e-6


def test_layers_that_share_a_parameter_with_the_rest_are_left_to_the_root():
    model = GPT(GPTConfig(vocab_size=20, d_model=16, heads=2, layers=3, ffn_dim=32))
    assert units(model) == list(model.layers)
    model.layers[2].mlp.up.weight = model.layers[0].mlp.up.weight  # tied across layers 0 and 2
    assert units(model) == [model.layers[1]]


def test_fsdp_needs_torchrun_and_says_so_in_one_line(text, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "alone"
    assert run(args(text, out, *FSDP)) == 2
    err = capsys.readouterr().err
    assert err == ("skiplab: error: --fsdp shards over torchrun's processes; start the run with torchrun "
                   "--nproc_per_node N (or leave --fsdp out)\n")
    assert not out.exists()  # refused before anything is written


@pytest.mark.parametrize("version, refused", [("2.9.1+cu128", True), ("2.6.0", True), ("2.10.0", False),
                                              ("2.11.0+cu130", False)])
def test_fsdp_on_an_older_torch_is_refused_in_one_line(text, tmp_path, capsys, monkeypatch, version, refused):  # noqa: F811
    monkeypatch.setattr(torch, "__version__", version)  # a str, as an older torch's would compare: "2.10" > "2.9"
    out = tmp_path / "old"
    assert run(args(text, out, *FSDP)) == 2
    err = capsys.readouterr().err
    if refused:
        assert err == (f"skiplab: error: --fsdp needs torch >= 2.10 (on older versions a sharded run does not make "
                       f"the updates of one process); this is torch {version}\n")
    else:  # past the version: the next check (not under torchrun here)
        assert err.startswith("skiplab: error: --fsdp shards over torchrun's processes")
    assert not out.exists()


def test_a_sharded_run_resumes_only_under_torchrun(clipped, capsys):
    two, _ = clipped
    assert run(["train", "lm", "--resume", "--out", two, "--max-steps", "9"]) == 2
    assert capsys.readouterr().err.startswith("skiplab: error: --fsdp shards over torchrun's processes")


@pytest.mark.slow
def test_a_compiled_sharded_run_trains_as_the_eager_one(clipped, text, tmp_path):  # noqa: F811
    """--compile with --fsdp works on the CPU (gloo), so it is allowed: dynamo compiles the model with FSDP's hooks
    around its layers (a minute on 2 cores with a cold inductor cache)."""
    two, _ = clipped
    ok(torchrun(*args(text, tmp_path / "compiled", "--grad-accum", "4", *FSDP, "--compile", "true")))
    a, b = last(tmp_path / "compiled")["model"], last(two)["model"]
    for key in b:  # measured: up to 4.4e-7 (a key bias), 2e-7 elsewhere: inductor fuses float32 sums in another order
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-5, msg=key)
    assert json.loads((tmp_path / "compiled" / "summary.json").read_text())["compile"]["graphs_compiled"] > 0


def test_per_layer_telemetry_of_a_sharded_run_is_that_of_the_full_parameters(text, tmp_path):  # noqa: F811
    """--log-layers under --fsdp: the gradient norms and update ratios summed from the shards over the processes
    (and the 0-dim α kept whole on every process counted once) equal one process's, within float noise; the
    activations are rank 0's first micro-batch, the one process's first, of the same weights."""
    extra = ("--grad-accum", "2", "--clip-norm", "0", "--connection", "ReZero", "--log-layers", "2")
    ok(torchrun(*args(text, tmp_path / "two", *extra, *FSDP)))
    with one_thread():
        assert run(args(text, tmp_path / "one", *extra)) == 0
    two, one = lines(tmp_path / "two", "layers.jsonl"), lines(tmp_path / "one", "layers.jsonl")
    assert [x["step"] for x in two] == [x["step"] for x in one] == [2, 4, 6]
    for a, b in zip(two, one):
        assert list(a["layers"]) == list(b["layers"])
        for name, quantities in b["layers"].items():
            for q, v in quantities.items():
                assert a["layers"][name][q] == pytest.approx(v, rel=1e-4, abs=1e-9), (a["step"], name, q)


@contextmanager
def group_of_one():
    """A gloo process group of this process alone, left again after the test."""
    from skiplab.bench.engine import _free_port

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        yield distributed.Group(0, 1, 0, "gloo", "cpu")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_nothing_the_sharding_adds_keeps_the_model_alive():
    """The hook that averages a replicated parameter's gradient (ReZero's α) holds no model: a tensor's hooks are
    kept by its C++ side, out of the garbage collector's sight, so a hook holding the sharding (a bound method of
    it) kept the model, its FSDP states and their process group alive to the interpreter's exit, where they were
    freed after the group had been destroyed (the order in which freeing them can abort the process)."""
    with group_of_one() as group:
        model = GPT(GPTConfig(vocab_size=20, d_model=16, heads=2, layers=2, ffn_dim=32, context=8,
                              connection="ReZero"))
        net = shard(model, model, group, amp=False)
        net(torch.randint(0, 20, (2, 8))).sum().backward()
        alphas = [p for p in model.parameters() if p.dim() == 0]
        assert alphas and all(p.grad is not None for p in alphas)
        gone = weakref.ref(model)
        del model, net, alphas
        gc.collect()
        assert gone() is None


def test_the_replicated_parameters_are_averaged_at_the_last_backward_pass_only(monkeypatch):
    """The hook sums a replicated parameter's gradient over the ranks and divides by their number, at the update's
    last backward pass (not under no_sync), whether or not the sharding object is still referred to."""
    reduced = []

    def all_reduce(t):  # stands for a second rank whose gradient is 3 times this one's
        reduced.append(t.clone())
        t.mul_(4)

    with group_of_one() as group:
        model = GPT(GPTConfig(vocab_size=20, d_model=16, heads=2, layers=2, ffn_dim=32, context=8,
                              connection="ReZero"))
        net = shard(model, model, group, amp=False)
        net.replicated.world_size = 2  # as if that rank had joined
        monkeypatch.setattr(dist, "all_reduce", all_reduce)
        x = torch.randint(0, 20, (2, 8))
        alphas = [p for p in model.parameters() if p.dim() == 0]  # one a layer, tied across its sub-layers
        with net.no_sync():
            net(x).sum().backward()
        assert reduced == [] and len(alphas) == 2  # accumulated on the rank, not averaged
        first = [a.grad.clone() for a in alphas]
        del net  # the training loop's object gone: the hook still averages
        gc.collect()
        model(x).sum().backward()  # the update's last pass: the same gradient again
        assert len(reduced) == 2
        for a, g in zip(alphas, first):
            torch.testing.assert_close(a.grad, (2 * g + 3 * 2 * g) / 2, rtol=1e-6, atol=0)


def test_leaving_the_group_first_frees_what_still_holds_it(monkeypatch):
    """distributed.shutdown collects the garbage before it destroys the group: what sits in a reference cycle with
    its model (FSDP2's states) lets go of the group while it is registered."""

    class Holder:  # stands for an FSDP state: in a cycle, nothing else refers to it
        def __init__(self):
            self.me = self

    freed_first = []
    with group_of_one():
        destroy = dist.destroy_process_group
        monkeypatch.setattr(dist, "destroy_process_group", lambda: (freed_first.append(held() is None), destroy()))
        enabled = gc.isenabled()
        gc.disable()  # no automatic pass in between: only shutdown's own can free the cycle
        try:
            held = weakref.ref(Holder())
            assert held() is not None
            distributed.shutdown()
        finally:
            if enabled:
                gc.enable()
        assert not dist.is_initialized()
    assert freed_first == [True]


def test_a_missing_shard_is_named_in_one_line(clipped, tmp_path):
    """A shard file deleted from a sharded checkpoint gave dcp's traceback on every rank at resume; the files its
    .metadata names are checked first, and an absent one is named."""
    from skiplab import run_dir
    from skiplab.train import sharded

    copy = tmp_path / "step_6"
    shutil.copytree(clipped[0] / "dcp" / "step_6", copy)
    sharded.check_shards(copy)  # all there
    (copy / "__1_0.distcp").unlink()
    with pytest.raises(run_dir.RunDirError, match=r"step_6: missing __1_0.distcp; the shards of last.pt's model"):
        sharded.check_shards(copy)
    (copy / ".metadata").write_bytes(b"not a pickle")
    with pytest.raises(run_dir.RunDirError, match=r"\.metadata: unreadable"):
        sharded.check_shards(copy)


def test_a_branch_made_under_torchrun_ends_where_a_straight_two_process_run_ends(text, tmp_path):  # noqa: F811
    """``--branch`` under torchrun: rank 0 makes the run directory while the others wait for it (every rank took
    the directory's lock and made it at once: "is being trained by another process"), then the branch trains on
    two processes and ends bit for bit where a two-process run of that budget ends. A refused branch stops every
    rank with one line, printed once."""
    wsd = ("--schedule", "wsd", "--decay", "0.5", "--eval-every", "2", "--warmup", "1", "--keep-checkpoints", "9",
           "--grad-accum", "2")
    short, straight, branched = tmp_path / "short", tmp_path / "straight", tmp_path / "branched"
    ok(torchrun(*args(text, short, *wsd, "--max-steps", "8")))
    ok(torchrun(*args(text, straight, *wsd, "--max-steps", "12")))
    ok(torchrun("train", "lm", "--branch", short / "checkpoint_4.pt", "--max-steps", "12", "--out", branched))
    a, b = last(straight), last(branched)
    assert b["step"] == 12 and all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert json.loads((branched / "config.json").read_text())["branched_from"]["step"] == 4
    late = torchrun("train", "lm", "--branch", short / "checkpoint_6.pt", "--max-steps", "12",
                    "--out", tmp_path / "late")
    assert late.returncode != 0 and not (tmp_path / "late").exists()
    assert late.stderr.count("past the stable phase (to update 4)") == 1, late.stderr[-2000:]
