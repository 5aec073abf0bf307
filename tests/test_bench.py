"""``skiplab bench --quick``: every group runs on tiny shapes and produces every row (values are not timed
against thresholds here: speed is measured by the full benchmark, side by side)."""

import json
import math
import time

import pytest

from skiplab import host
from skiplab.bench import GROUPS, run
from skiplab.bench.engine import spawn_ranks
from skiplab.bench.shapes import DEPTH_DESIGNS, HYPER_DESIGNS, IMAGE_DESIGNS, LM_DESIGNS, MT_DESIGNS
from skiplab.bench import suite
from skiplab.bench.suite import default_groups
from skiplab.bench.timing import Row
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


def _rank_sleeps(rank: int, seconds: float) -> None:
    """Rank 1 sleeps ``seconds`` (inside C: the GIL released, as a rank waiting in gloo would be)."""
    if rank == 1:
        time.sleep(seconds)


def test_processes_that_finish_or_fail_or_hang_end_the_call(capfd):
    spawn_ranks(_rank_sleeps, (0.1,), world=2, deadline=60)
    with pytest.raises(RuntimeError, match=r"(?s)2 process\(es\) of _rank_sleeps did not finish: .*ValueError"):
        spawn_ranks(_rank_sleeps, (-1,), world=2, deadline=60)  # time.sleep(-1) raises in rank 1
    # the rank's watchdog ends it (exit code 1), not the caller's last resort ("still running after 33 s")
    with pytest.raises(RuntimeError, match=r"did not finish: process 1 terminated with exit code 1"):
        spawn_ranks(_rank_sleeps, (600,), world=2, deadline=3)
    err = capfd.readouterr().err  # the watchdog's dump: where the rank was waiting
    assert "Timeout" in err and "in _rank_sleeps" in err, err


def test_ddp_is_gone_before_the_process_group_is_destroyed(monkeypatch):
    """The processes benchmark's rank frees DDP (and its Reducer, which holds the group) before
    destroy_process_group: a Reducer left to free the group joins gloo's threads holding the GIL (a deadlock)."""
    import weakref

    import torch.distributed as dist
    from torch import nn

    from skiplab.bench import engine
    from skiplab.bench.shapes import QUICK

    made = []

    class Recorded(nn.parallel.DistributedDataParallel):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(weakref.ref(self))

    monkeypatch.setattr(nn.parallel, "DistributedDataParallel", Recorded)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{engine._free_port()}", rank=0, world_size=1)
    try:
        secs = engine._ddp_steps(0, 2, QUICK)  # DDP over a group of one: half the batch, the same code path
        assert secs > 0 and len(made) == 1
        assert made[0]() is None  # freed when the steps returned, while the group is still registered
    finally:
        dist.destroy_process_group()


def test_unknown_group_is_a_one_line_error(capsys):
    with pytest.raises(ValueError, match="unknown benchmark group.*known: machine, image"):
        run(quick=True, groups=("imag",))
    assert main(["bench", "--quick", "--groups", "imag"]) == 2
    assert "unknown benchmark group(s) imag" in capsys.readouterr().err


def _benchmark(name):
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_step_profiles_at_tiny_shapes(tmp_path, capsys):
    """benchmarks/profile_steps.py: every design of both cases against its baseline, the operators it adds among
    the listed ones, the files written; bad options one line."""
    from skiplab.connections.kernels import load
    profile_steps = _benchmark("profile_steps")
    out = tmp_path / "profile"
    result = profile_steps.main(["--small", "--rounds", "2", "--steps", "1", "--threads", "1", "--top", "30",
                                 "--out", str(out)])
    assert json.loads((out / "profile.json").read_text())["cases"] == result["cases"]
    assert (out / "profile.md").read_text().startswith("# Step profiles: ")
    code = host.code_name(host.environment())  # the code profiled, and that tiny shapes are no measurement
    assert result["code"] == code and f"code {code}, tiny shapes (--small" in (out / "profile.md").read_text()
    cases = {c["case"]: c for c in result["cases"]}
    assert [d["design"] for d in cases["r56"]["designs"]] == ["2xSkip+LN", "2rSkip+LN", "SAS"]
    assert [d["design"] for d in cases["hc"]["designs"]] == ["HC", "mHC"]
    for c in cases.values():
        for d in c["designs"]:
            assert d["ratio"] > 0 and len(d["ratio_per_round"]) == 2
            assert all(o["design_spread_ms"] >= 0 and o["baseline_spread_ms"] >= 0 for o in d["ops"])
    ops = {d["design"]: {o["op"] for o in d["ops"]} for c in cases.values() for d in c["designs"]}
    sinkhorn = "_SinkhornKernel" if load("sinkhorn") is not None else "_Sinkhorn"  # the kernel, or the operators
    assert sinkhorn in ops["mHC"]  # an operator only the design runs is among its differences
    assert all(o["baseline_ms"] == 0 for d in cases["hc"]["designs"] if d["design"] == "mHC"
               for o in d["ops"] if o["op"] == sinkhorn)
    capsys.readouterr()
    for argv, message in ((["--cases", "r56,nope"], "--cases: unknown 'nope'; known: r56, hc"),
                          (["--rounds", "1"], "--rounds must be >= 2"),
                          (["--small", "--out", str(out)], "profile.json exists; give another --out")):
        with pytest.raises(SystemExit) as stop:
            profile_steps.main(argv)
        assert stop.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert message in err[-1]


def test_the_kernel_benchmark_at_tiny_shapes(tmp_path, capsys):
    """benchmarks/kernel_r56.py: every chain and every step row, the kernel on in the rows that say so (2rSkip+LN
    as built, 2xSkip+LN with it asked for) and off in the others, the files written; bad options and an existing
    folder one line."""
    from skiplab.connections.kernels import load
    if load("add_group_norm") is None:
        pytest.skip("no C compiler on this machine")
    bench = _benchmark("kernel_r56")
    out = tmp_path / "kernel"
    result = bench.main(["--small", "--rounds", "2", "--reps", "2", "--threads", "1", "--out", str(out)])
    assert json.loads((out / "kernel.json").read_text())["step"] == result["step"]
    assert (out / "kernel.md").read_text().startswith("# The add + GroupNorm kernel on a PreAct-ResNet-8 on 16×16 images "
                                                      "(--small: a test): ")  # not R-56: says so
    assert [(c["design"], len(c["shape"])) for c in result["chain"]] == [("2rSkip+LN", 4)] * 2 + [("2xSkip+LN", 4)] * 2
    assert all(c["eager_ms"] > 0 and c["kernel_ms"] > 0 for c in result["chain"])
    steps = {s["design"]: s for s in result["step"]}
    assert list(steps) == bench.DESIGNS and steps["1xSkip"]["ratio"] == 1.0
    assert [d for d, s in steps.items() if s["kernel"]] == ["2xSkip+LN kernel", "2rSkip+LN"]
    assert all(s["ms"] > 0 and s["page_faults"] >= 0 for s in steps.values())
    for key in ("machine", "torch", "threads", "commit", "load_start", "load_end"):
        assert result[key] not in (None, "")
    from skiplab import host
    if host.keep_freed_memory() is not None:  # glibc: a step's freed memory kept, as in a run, and said so
        assert result["malloc"]["kept"] == host.keep_freed_memory()
        assert "malloc: freed memory kept" in (out / "kernel.md").read_text()
    capsys.readouterr()
    for argv, message in ((["--rounds", "0"], "--threads, --rounds and --reps must be at least 1"),
                          (["--small", "--out", str(out)], "kernel.json exists; choose another --out")):
        with pytest.raises(SystemExit) as stop:
            bench.main(argv)
        assert stop.value.code == 2
        assert message in capsys.readouterr().err.strip().splitlines()[-1]


def test_the_kernel_benchmark_times_the_older_kernel_in_turns_with_the_current_one(monkeypatch):
    """fastest_turns: one warm-up call each, then rounds in turns, the order reversed every other round (so neither
    always runs after the other), and the fastest call of each."""
    bench = _benchmark("kernel_r56")
    clock = iter(range(1000))
    monkeypatch.setattr(bench.time, "perf_counter", lambda: next(clock))
    calls, pause = [], {"a": 1, "b": 0}

    def timed(name):
        def call():
            calls.append(name)
            for _ in range(pause[name]):  # a takes one tick longer than b
                next(clock)
        return call
    assert bench.fastest_turns([timed("a"), timed("b")], 4) == [2, 1]
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b", "b", "a"]


def test_the_kernel_benchmark_times_an_older_kernel_beside_the_current_one(tmp_path, capsys, monkeypatch):
    """--before FILE: the file is built and its functions run in the ``before`` chain column and the ``2rSkip+LN
    before`` step (and only there), recorded with its hash; a missing, unbuildable or incomplete file is one line."""
    from skiplab.connections.kernels import build, load
    if load("add_group_norm") is None:
        pytest.skip("no C compiler on this machine")
    bench = _benchmark("kernel_r56")
    source = tmp_path / "older.c"
    source.write_text((build.HERE / "add_group_norm.c").read_text())
    calls = []

    class Spy:  # the older library, its calls counted
        def __init__(self, lib):
            self.lib = lib

        def __getattr__(self, name):
            fn = getattr(self.lib, name)
            return lambda *args: calls.append(name) or fn(*args)

    built = bench.build_before
    monkeypatch.setattr(bench, "build_before", lambda src, folder: Spy(built(src, folder)))
    result = bench.main(["--small", "--rounds", "2", "--reps", "1", "--threads", "1", "--before", str(source)])
    assert result["before"]["file"] == str(source) and len(result["before"]["sha256"]) == 64
    assert all(c["before_ms"] > 0 for c in result["chain"])
    steps = {s["design"]: s for s in result["step"]}
    assert list(steps) == [*bench.DESIGNS, "2rSkip+LN before"] and steps["2rSkip+LN before"]["kernel"]
    assert {"forward_f32", "backward_f32"} <= set(calls)
    n = len(calls)
    bench.step_rows(True, 1)  # without --before the current kernel runs: the older one is not called
    assert len(calls) == n
    assert "before (ms)" in capsys.readouterr().out
    (tmp_path / "bad.c").write_text("int f(\n")
    (tmp_path / "none.c").write_text("static int unused;\n")
    for path, message in ((tmp_path / "nope.c", "is not a file"), (tmp_path / "bad.c", "does not build"),
                          (tmp_path / "none.c", "lacks forward_f32")):
        with pytest.raises(SystemExit) as stop:
            bench.main(["--small", "--before", str(path)])
        assert stop.value.code == 2
        assert f"--before: {path} {message}" in capsys.readouterr().err.strip().splitlines()[-1]


def test_sas_fused_against_plain_at_tiny_shapes(tmp_path, capsys):
    """benchmarks/sas_fused.py times both forms, puts the real one back, writes its table, refuses to overwrite."""
    from skiplab.connections import fused, sas
    bench = _benchmark("sas_fused")
    out = tmp_path / "sas.md"
    rows = bench.main(["--small", "--rounds", "2", "--out", str(out)])
    assert sas.gated_norm_sum is fused.gated_norm_sum
    assert [r["shape"] for r in rows] == [[4, 3, 4, 4]]
    assert rows[0]["fused_ms"] > 0 and rows[0]["plain_ms"] > 0 and rows[0]["ratio_min"] <= rows[0]["ratio"]
    assert out.read_text().startswith("# SAS fused / plain: ") and "| 4x3x4x4 |" in out.read_text()
    head = out.read_text().splitlines()[0]  # the code it measured, and that tiny shapes are no measurement
    assert f"code {host.code_name(host.environment())}" in head and "tiny shapes (--small" in head
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        bench.main(["--small", "--out", str(out)])
    assert stop.value.code == 2 and "exists; give another --out" in capsys.readouterr().err


def test_recipe_fields_are_the_model_choices_a_design_changes():
    """nGPT's recipe changes the preset's MLP, biases and tying (gpt-small has rotary positions already; gpt2-small
    learned ones); HybridNorm's qk_norm is its normalisation, not a model choice; PreLN's designs change nothing."""
    from skiplab.bench.steps import recipe_fields, show_fields
    fields = recipe_fields("gpt-small", "nGPT")
    assert fields == {"mlp": "swiglu", "bias": False, "tie": False}
    assert show_fields(fields) == "mlp=swiglu, bias=false, tie=false"
    assert recipe_fields("gpt2-small", "nGPT")["positions"] == "rope"
    assert recipe_fields("gpt-small", "HybridNorm") == {}
    assert recipe_fields("gpt-small", "PreLN+MUDD") == {} == recipe_fields("gpt-small", "Keel")


def test_depth_rows_price_ngpt_against_preln_of_its_model(monkeypatch):
    """The depth group's nGPT row with its goal divides by PreLN built with nGPT's model choices; the whole model's
    row by the preset's PreLN; a design without a recipe keeps one row against the preset's PreLN."""
    import skiplab.bench.designs as designs
    from skiplab.bench.shapes import QUICK
    built = []
    real = designs.build
    monkeypatch.setattr(designs, "build", lambda spec, **kw: built.append((spec, kw)) or real(spec, **kw))
    monkeypatch.setattr(designs, "interleaved", lambda steps, *a: {k: 1.0 + len(k) / 100 for k in steps})
    rows = designs._design_steps(QUICK, "depth", {"nGPT": "1.15", "Keel": "1.05"}, QUICK.hyper_widths[-1:])
    own = "PreLN(mlp=swiglu, bias=false, tie=false)"
    for mode in ("eager", "compiled"):
        by_name = {r.name: r for r in rows if r.name.endswith(mode)}
        step = next(r for n, r in by_name.items() if n.endswith(f" nGPT step, {mode}"))
        assert step.value == pytest.approx((1 + len("nGPT") / 100) / (1 + len(own) / 100))
        assert "with nGPT's model (mlp=swiglu, bias=false, tie=false)" in step.note and "goal 1.15x" in step.note
        whole = next(r for n, r in by_name.items() if n.endswith(f" nGPT whole model step, {mode}"))
        assert whole.value == pytest.approx((1 + len("nGPT") / 100) / (1 + len("PreLN") / 100))
        assert "goal" not in whole.note
        keel = next(r for n, r in by_name.items() if n.endswith(f" Keel step, {mode}"))
        assert keel.value == pytest.approx((1 + len("Keel") / 100) / (1 + len("PreLN") / 100))
    matched = [kw for spec, kw in built if spec.endswith("(connection=PreLN)") and kw.get("mlp") == "swiglu"]
    assert len(matched) == 2 and all(kw["bias"] is False and kw["tie"] is False for kw in matched)  # eager, compiled


def test_the_head_loss_memory_benchmark_at_tiny_shapes(tmp_path, capsys):
    """benchmarks/head_loss_memory.py: the eager and chunked heads (and a chunk size asked for), each in its own
    process, the same loss; a whole step of a model with each head; bad row counts in one line."""
    bench = _benchmark("head_loss_memory")
    result = bench.main(["--rows", "64", "--dim", "16", "--vocab", "300", "--chunks", "7", "--repeats", "1",
                         "--threads", "1", "--out", str(tmp_path / "head")])
    runs = result["runs"]
    assert [(r["impl"], r["chunk"]) for r in runs] == [("eager", None), ("chunked", 64), ("chunked", 7)]
    assert all(abs(r["loss"] - runs[0]["loss"]) < 1e-5 and r["extra_peak_mib"] >= 0 for r in runs)
    md = (tmp_path / "head" / "head_loss.md").read_text()
    assert "| rows | head | extra peak memory (MiB) | step (s) | loss | chunk rows |" in md and "| 64 | chunked |" in md
    step = bench.main(["--model", "gpt-mini(d_model=32,heads=2,layers=2,ffn_dim=64,context=16)", "--rows", "2",
                       "--repeats", "0", "--threads", "1", "--out", str(tmp_path / "step")])
    assert [r["impl"] for r in step["runs"]] == ["eager", "chunked"] and step["runs"][0]["tokens"] == 32
    assert abs(step["runs"][0]["loss"] - step["runs"][1]["loss"]) < 1e-5
    assert "| sequences | tokens | head |" in (tmp_path / "step" / "step.md").read_text()
    with pytest.raises(SystemExit):
        bench.main(["--rows", "64,x", "--out", str(tmp_path / "bad")])
    assert "--rows and --chunks take comma-separated whole numbers" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_a_record_in_out_is_kept_unless_overwrite(tmp_path, capsys):
    (tmp_path / "bench.md").write_text("a record\n")
    with pytest.raises(ValueError, match="holds a benchmark record .* --overwrite to replace it"):
        run(quick=True, groups=("machine",), out=str(tmp_path), progress=False)
    assert (tmp_path / "bench.md").read_text() == "a record\n"
    assert main(["bench", "--quick", "--groups", "machine", "--out", str(tmp_path)]) == 2
    assert (tmp_path / "bench.md").read_text() == "a record\n" and capsys.readouterr().err.count("\n") == 1
    run(quick=True, groups=("machine",), out=str(tmp_path), progress=False, overwrite=True)
    assert "a record" not in (tmp_path / "bench.md").read_text()


def test_a_value_not_measured_reads_as_a_dash():
    assert Row("gpu", "PreLN MFU", float("nan"), "%", "no known peak for this device").text() == "-"


def test_the_record_is_strict_json_of_the_code_the_run_began_with(tmp_path, monkeypatch):
    """A value not measured was written NaN (no JSON parser but Python's reads it): null now. bench.md's header
    named the code the run began with and bench.json the tree at its last write (a commit or an edit mid-run
    made them disagree): both name the first."""
    monkeypatch.setitem(suite.GROUPS, "image", lambda sz, ctx: [Row("image", "MFU", float("nan"), "%", "no peak")])
    calls = []
    real = suite.environment

    def drifting():
        env = real()
        calls.append(1)
        return {**env, "git_commit": f"commit{len(calls)}", "git_dirty": False}

    monkeypatch.setattr(suite, "environment", drifting)
    run(quick=True, groups=("machine", "image"), out=str(tmp_path), progress=False)
    text = (tmp_path / "bench.json").read_text()
    record = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in bench.json"))
    assert record["rows"][-1]["value"] is None and record["environment"]["git_commit"] == "commit1"
    assert "code commit1" in (tmp_path / "bench.md").read_text() and len(calls) == 1


@pytest.mark.parametrize("argv, message", [
    (["--groups", ""], "--groups names no group"), (["--groups", ","], "--groups names no group"),
    (["--gpu-budget", "-5"], "--gpu-budget must be a finite number of seconds >= 0"),
    (["--gpu-budget", "nan"], "--gpu-budget must be a finite number of seconds >= 0")])
def test_bad_groups_and_budgets_are_one_line_and_write_nothing(tmp_path, capsys, argv, message):
    """An empty --groups ran every group (a full 6-7 minute run), a negative budget started no design and exited 0."""
    assert main(["bench", "--quick", *argv, "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "b").exists()


def test_a_run_cut_short_marks_its_record_incomplete_and_keeps_the_one_it_would_replace(tmp_path, monkeypatch):
    """Stopped after its first group (Ctrl-C), a bench run leaves the rows it measured marked incomplete in both
    files; with --overwrite over a complete record it writes beside it (bench.partial.*), so the record stays whole
    until the new run completes and replaces it (an interrupted --overwrite left half a record, unmarked)."""
    import skiplab.bench.suite as suite

    def stop(sz, ctx):
        raise KeyboardInterrupt

    monkeypatch.setitem(suite.GROUPS, "image", lambda sz, ctx: [Row("image", "a step", 1.0, "x")])
    monkeypatch.setitem(suite.GROUPS, "mt", stop)
    fresh = tmp_path / "fresh"
    with pytest.raises(KeyboardInterrupt):
        run(quick=True, groups=("machine", "image", "mt"), out=str(fresh), progress=False)
    record = json.loads((fresh / "bench.json").read_text())
    assert not record["complete"] and record["measured"] == ["machine", "image"] and len(record["rows"]) == 3
    assert "**Incomplete**: groups machine, image of machine, image, mt measured so far" in \
        (fresh / "bench.md").read_text()
    kept = tmp_path / "kept"
    run(quick=True, groups=("machine", "image"), out=str(kept), progress=False)
    whole = {f: (kept / f).read_bytes() for f in ("bench.md", "bench.json")}
    assert json.loads(whole["bench.json"])["complete"] and b"Incomplete" not in whole["bench.md"]
    with pytest.raises(KeyboardInterrupt):
        run(quick=True, groups=("machine", "image", "mt"), out=str(kept), progress=False, overwrite=True)
    assert {f: (kept / f).read_bytes() for f in ("bench.md", "bench.json")} == whole
    assert not json.loads((kept / "bench.partial.json").read_text())["complete"]
    monkeypatch.setitem(suite.GROUPS, "mt", lambda sz, ctx: [Row("mt", "a step", 1.0, "x")])
    run(quick=True, groups=("machine", "image", "mt"), out=str(kept), progress=False, overwrite=True)
    assert json.loads((kept / "bench.json").read_text())["measured"] == ["machine", "image", "mt"]
    assert not (kept / "bench.partial.json").exists() and not (kept / "bench.partial.md").exists()


def test_an_out_that_is_a_file_is_refused_before_measuring(tmp_path, monkeypatch):
    import skiplab.bench.suite as suite

    monkeypatch.setitem(suite.GROUPS, "machine", lambda sz, ctx: pytest.fail("measured before the check"))
    (tmp_path / "afile").write_text("x")
    for out in (tmp_path / "afile", tmp_path / "afile" / "b"):
        with pytest.raises(ValueError, match=f"{tmp_path / 'afile'} is a file, not a folder"):
            run(quick=True, groups=("machine",), out=str(out), progress=False)
