"""Same-config runs at two CPU threads end with the same weights, to the bit: a run fixes its thread count (MKL's
dynamic thread choice off) and records it; a resume at another count is said and recorded."""

import json
import os
import subprocess
import sys

import pytest
import torch

from skiplab import host, run_dir
from tests.train.test_distributed import ROOT
from tests.train.test_lm import args, text  # noqa: F401 (text is a fixture)

MKL = torch.backends.mkl.is_available()


def skiplab(*argv, threads: int = 2) -> subprocess.CompletedProcess:
    """``python -m skiplab ARGV`` in a process of its own, as a user starts it: its threads from OMP_NUM_THREADS,
    nothing in it having fixed them yet."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    env.pop("MKL_DYNAMIC", None)
    run = subprocess.run([sys.executable, "-m", "skiplab", *map(str, argv)], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    return run


def test_fixing_the_threads_turns_mkls_dynamic_choice_off():
    code = ("import json; from skiplab.host import fix_threads, thread_settings; "
            "print(json.dumps([thread_settings(), fix_threads()]))")
    env = {**os.environ, "OMP_NUM_THREADS": "2", "PYTHONPATH": str(ROOT)}
    env.pop("MKL_DYNAMIC", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    before, after = json.loads(out.stdout.splitlines()[-1])
    assert before["threads"] == after["threads"] == 2 and after["thread_env"] == {"OMP_NUM_THREADS": "2"}
    if MKL and before["mkl_dynamic"] is not None:  # readable from torch's MKL: on until a count is set
        assert (before["mkl_dynamic"], after["mkl_dynamic"]) == (True, False)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="two threads need two CPUs")
def test_two_runs_on_two_threads_and_a_stopped_one_end_with_the_same_weights(text, tmp_path):
    constant = ("--schedule", "constant")  # a budget a resumed run may grow: stopped at 3 updates, then on to 6
    for name in ("a", "b"):
        skiplab(*args(text, tmp_path / name, *constant))
    skiplab(*args(text, tmp_path / "c", *constant, "--max-steps", "3"))
    skiplab("train", "lm", "--resume", "--out", tmp_path / "c", "--max-steps", "6")
    a, b, c = (torch.load(tmp_path / n / "last.pt", weights_only=True) for n in "abc")
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
        assert torch.equal(a["model"][key], c["model"][key]), key
    for k, state in a["optimizer"]["state"].items():
        for other in (b, c):
            assert torch.equal(state["exp_avg_sq"], other["optimizer"]["state"][k]["exp_avg_sq"]), k
    valid = [[r["valid_loss"] for r in run_dir.read_metrics(tmp_path / n)] for n in "abc"]
    assert valid[0] == valid[1] == valid[2] and len(valid[0]) == 2
    env = json.loads((tmp_path / "a" / "config.json").read_text())["environment"]
    assert env["threads"] == 2 and env["thread_env"] == {"OMP_NUM_THREADS": "2"}
    assert env["mkl_dynamic"] is not True  # off; None where there is no MKL to ask


def test_a_resume_on_another_number_of_threads_is_said_and_recorded(tmp_path, monkeypatch):
    first = {"cpu": "a CPU", "cpu_capability": "AVX2", "cuda": None, "git_commit": "abc1234", "threads": 2}
    run_dir.write_json(tmp_path / "config.json", {"config": {}, "environment": first})
    monkeypatch.setattr(host, "environment", lambda: dict(first))
    assert run_dir.note_machine(tmp_path, 10) == ""
    monkeypatch.setattr(host, "environment", lambda: {**first, "threads": 1})
    line = run_dir.note_machine(tmp_path, 10)
    assert "resumed at 10 on a CPU (AVX2), threads 1" in line and "(before: a CPU (AVX2), threads 2" in line
    assert json.loads((tmp_path / "config.json").read_text())["resumed_on"][0]["environment"]["threads"] == 1
    old = {k: v for k, v in first.items() if k != "threads"}  # a record without its threads: nothing to compare
    run_dir.write_json(tmp_path / "config.json", {"config": {}, "environment": old})
    assert run_dir.note_machine(tmp_path, 10) == ""


def test_git_state_names_the_commit_and_whether_tracked_code_differs_from_it(tmp_path):
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    assert host.git_state(repo / "pkg") == ("", None)  # not a checkout
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "pkg" / "code.py").write_text("x = 1\n")
    (repo / "notes.md").write_text("a\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "c"], check=True)
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert host.git_state(repo / "pkg") == (head, False)
    (repo / "pkg" / "scratch.py").write_text("untracked\n")
    (repo / "notes.md").write_text("b\n")  # tracked, but outside the folder
    assert host.git_state(repo / "pkg") == (head, False)
    (repo / "pkg" / "code.py").write_text("x = 2\n")
    assert host.git_state(repo / "pkg") == (head, True)
    assert host.environment()["git_dirty"] in (True, False, None)
