"""Matched budgets (skiplab.tasks.budget) and a run resumed on another machine (run_dir.note_machine)."""

import json
import time
from dataclasses import dataclass

import pytest

from skiplab import host, run_dir
from skiplab.tasks import budget
from skiplab.tasks.variants import Variant


@dataclass(frozen=True)
class Config:
    model: str = "a"
    max_steps: int = 100
    warmup: int = 10
    out: str = ""


class FakeTask:
    """A task whose step of model "b" takes twice model "a"'s time and does three times its work."""

    name, probes = "fake", True

    def probe_step(self, cfg):
        seconds = {"a": 0.002, "b": 0.004}[cfg.model]

        def step():
            time.sleep(seconds)

        return step, 10


def _variants():
    return [Variant("a", {"model": "a"}, {}), Variant("b", {"model": "b"}, {})]


def test_time_budget_gives_the_slower_design_fewer_updates(tmp_path, monkeypatch):
    monkeypatch.setattr(budget, "flops_per_token", lambda task, cfg: {"a": 1.0, "b": 3.0}[cfg.model])
    plan = budget.plan(FakeTask(), Config(), _variants(), "time", tmp_path)
    assert plan["a"]["max_steps"] == 100 and plan["a"]["time_ratio"] == 1.0
    assert plan["b"]["time_ratio"] == pytest.approx(2.0, rel=0.25)  # sleeps: the ratio of the sleeps, roughly
    assert plan["b"]["max_steps"] == round(100 / plan["b"]["time_ratio"])
    stored = json.loads((tmp_path / "budget.json").read_text())
    assert stored["budget"] == "time" and stored["variants"]["b"] == plan["b"]
    line = budget.describe("time", Config(), plan, "a", tmp_path)  # the machine budget.json was measured on
    assert line.startswith("budget: equal wall-clock on " + host.machine_name(stored["environment"]))
    # read back as written (the ratios are the machine's that planned it), not measured again
    monkeypatch.setattr(budget, "time_ratio", lambda *a, **k: pytest.fail("measured again"))
    assert budget.plan(FakeTask(), Config(), _variants(), "time", tmp_path) == plan


def test_flops_budget_and_its_errors(tmp_path, monkeypatch):
    monkeypatch.setattr(budget, "flops_per_token", lambda task, cfg: {"a": 1.0, "b": 3.0}[cfg.model])
    plan = budget.plan(FakeTask(), Config(), _variants(), "flops", tmp_path)
    assert (plan["a"]["max_steps"], plan["b"]["max_steps"]) == (100, 33)
    with pytest.raises(ValueError, match="not past the 10 warm-up updates"):
        budget.plan(FakeTask(), Config(max_steps=20), _variants(), "flops", tmp_path / "other")
    with pytest.raises(ValueError, match="choose one of updates, flops, time"):
        budget.check(FakeTask(), Config(), "tokens")

    class NoSteps(FakeTask):
        probes = False

    with pytest.raises(ValueError, match="only --budget updates applies"):
        budget.check(NoSteps(), Config(), "flops")
    budget.check(NoSteps(), Config(), "updates")  # equal updates: nothing to measure


def test_a_run_resumed_on_another_machine_records_it(tmp_path, monkeypatch):
    # both machines are made up and faked as the current one: nothing depends on the processor the test runs on
    first = {"cpu": "Testchip Beta", "cpu_capability": "AVX2", "cuda": None, "git_commit": "abc1234"}
    run_dir.write_json(tmp_path / "config.json", {"config": {}, "environment": first})
    monkeypatch.setattr(host, "environment", lambda: dict(first))
    assert run_dir.note_machine(tmp_path, 300) == ""  # same machine and code: nothing written
    assert "resumed_on" not in json.loads((tmp_path / "config.json").read_text())
    other = {**first, "cpu": "Testchip(R) Alpha(R) Processor", "cpu_capability": "AVX512"}
    monkeypatch.setattr(host, "environment", lambda: dict(other))
    line = run_dir.note_machine(tmp_path, 300)
    assert "resumed at 300 on Testchip Alpha Processor (AVX512)" in line and "before: Testchip Beta (AVX2)" in line
    stored = json.loads((tmp_path / "config.json").read_text())
    assert stored["resumed_on"] == [{"at": 300, "environment": other}]
    assert run_dir.machines(stored) == ["Testchip Beta (AVX2)", "Testchip Alpha Processor (AVX512)"]
    assert run_dir.codes(stored) == ["abc1234"]  # resumed on another machine, not on other code
    assert run_dir.codes({**stored, "resumed_on": [{"at": 300, "environment": {**other, "git_commit": "def5678"}},
                                                   {"at": 400, "environment": {**first, "git_commit": None}}]}) \
        == ["abc1234", "def5678", "unknown"]
    assert run_dir.note_machine(tmp_path, 400) == ""  # still there: nothing new
    assert run_dir.codes({**stored, "resumed_on": [{"at": 300, "environment": {**first, "git_dirty": True}}]}) \
        == ["abc1234", "abc1234+uncommitted"]
    monkeypatch.setattr(host, "environment", lambda: {**other, "git_dirty": True})  # same commit, changed code
    assert "code abc1234+uncommitted (before: " in run_dir.note_machine(tmp_path, 500)
