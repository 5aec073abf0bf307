"""Run keys stay what they were for the runs already recorded: a model field added later (the GPT's ``norm``) is
left out of the key at the value every earlier run had, and names new runs at any other."""

import json
from pathlib import Path

import pytest

from skiplab.models import model_config
from skiplab.reproduce import runs
from skiplab.train.lm import LMTrainConfig

RECORDED = Path(__file__).resolve().parents[1] / "docs" / "results" / "depth" / "runs"


def recorded_runs() -> list[Path]:
    return sorted(p for p in RECORDED.iterdir() if (p / "seed1" / "config.json").is_file())


def test_there_are_recorded_gpt_runs_of_the_designs_that_take_the_models_norm():
    names = [p.name for p in recorded_runs()]
    assert any("connection=MixLN_" in n for n in names) and any("connection=LNS_" in n for n in names)


@pytest.mark.parametrize("run", recorded_runs(), ids=lambda p: p.name)
def test_a_recorded_gpt_run_keeps_its_key(run):
    stored = json.loads((run / "seed1" / "config.json").read_text())["config"]
    cfg = LMTrainConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in stored.items()})
    assert model_config(cfg.model).norm == "LN"
    assert run.name.endswith(f"-{runs.key(cfg)}")  # <name>-<key>


def test_the_models_norm_enters_the_key_only_where_it_differs_from_the_older_runs():
    assert "norm" not in runs.keyed_model(model_config("gpt-mini"))  # LN: the key every GPT run had
    assert "norm" not in runs.keyed_model(model_config("transformer-small"))
    assert runs.keyed_model(model_config("llama-71m"))["norm"] == "RMS"  # the LLaMA presets' runs are new runs
    assert runs.keyed_model(model_config("gpt-mini(norm=RMS)"))["norm"] == "RMS"
    assert runs.keyed_model(model_config("gpt-mini"))["connection"] == "PreLN"  # the other fields stay


@pytest.mark.parametrize("table", ["001-table5", "003-table1", "003-table6", "003-table7"])
def test_the_recorded_tables_made_since_keys_hash_the_resolved_model_still_find_their_runs(table):
    """Fields added to the families since (the Transformer's ``norm``, the depth-wise LSTM's ``wiring`` and
    ``output_bias``) leave the keys of the recorded cpu-scale runs as they were (docs/reproducing.md names these
    tables; the ones recorded before keys hashed the resolved model are trained again)."""
    from skiplab.reproduce import command, scales
    from skiplab.reproduce.papers import TABLES

    recorded = Path(__file__).resolve().parents[1] / "docs" / "results" / "repro" / "cpu" / "runs"
    _, jobs = command.plan(TABLES[table], scales.BY_NAME["cpu"], 2, Path("runs/repro/cpu"))
    assert jobs and all((recorded / Path(cfg.out).parent.name).is_dir() for _, cfg in jobs)
