"""experiments/pool_gpu.sh, the GPU evidence track's block, at smoke size on the CPU (SMOKE=1: the same compare
command on a tiny model and a tiny pydocs-shaped corpus): it trains the block's runs and writes its table."""

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "pool_gpu.sh"
SKIPLAB = str(Path(sys.executable).with_name("skiplab"))


def tiny_pydocs(root: Path) -> Path:
    root.mkdir()
    text = "The residual stream carries x + F(x) from layer to layer. " * 8
    for split, n in (("train", 12), ("valid", 2), ("test", 2)):
        with gzip.open(root / f"{split}.jsonl.gz", "wt") as f:
            f.writelines(json.dumps({"id": f"{split}/{i}.txt", "text": f"{i}: {text}"}) + "\n" for i in range(n))
    return root


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "SKIPLAB": SKIPLAB, "OMP_NUM_THREADS": "1", **env})


def test_a_block_at_smoke_size(tmp_path):
    data = tiny_pydocs(tmp_path / "pydocs")
    out = tmp_path / "pool-gpu"
    done = run({"SMOKE": "1", "DESIGNS": "PreLN,HC"}, str(data), str(out), "1")
    assert done.returncode == 0, done.stderr[-2000:]
    table = (out / "table.md").read_text()
    assert "| PreLN " in table and "| HC " in table and "Blocks: 1" in table
    for design in ("PreLN", "HC"):
        config = json.loads(next(out.glob(f"*{design}*/seed1/config.json")).read_text())
        assert config["device"] == "cpu" and config["config"]["head_loss"] == "chunked"  # as on the card


def test_the_card_scale_needs_the_tokenizer(tmp_path):
    done = run({"TOKENIZER": ""}, str(tmp_path / "data"), str(tmp_path / "out"), "1")
    assert done.returncode != 0 and "TOKENIZER=tiktoken:gpt2:FILE" in done.stderr
    assert not list((tmp_path / "out").glob("*/seed1"))


def test_the_cards_record_script_packs_the_block(tmp_path):
    """experiments/gpu_record.sh (the bench skipped here: tests/test_bench_gpu.py runs it): the block's small files
    and table in one archive."""
    import tarfile

    data = tiny_pydocs(tmp_path / "pydocs")
    script = SCRIPT.with_name("gpu_record.sh")
    results = os.path.relpath(tmp_path / "results", SCRIPT.parents[1])  # relative: the archive was lost
    done = subprocess.run(["bash", str(script), results, "1", str(data), "unused.tiktoken"],
                          capture_output=True, text=True, timeout=600, cwd=SCRIPT.parents[1],
                          env={**os.environ, "OMP_NUM_THREADS": "1", "BENCH": "0", "SMOKE": "1",
                               "DESIGNS": "PreLN", "WORK": str(tmp_path / "work"),
                               "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    assert "pool block 1: exit 0" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    with tarfile.open(tmp_path / "results" / "pool-gpu.tgz") as tar:
        names = tar.getnames()
    assert "./table.md" in names and any(n.endswith("seed1/summary.json") for n in names)
    assert not any(n.endswith(".pt") for n in names)


def test_a_failed_block_is_no_record_and_fails_the_call(tmp_path):
    """A pool that failed (block 0: no seed) exited 0 and packed an empty pool-gpu.tgz, which then refused the retry
    as an earlier record."""
    data = tiny_pydocs(tmp_path / "pydocs")
    done = subprocess.run(["bash", str(SCRIPT.with_name("gpu_record.sh")), str(tmp_path / "results"), "0", str(data),
                           "unused.tiktoken"], capture_output=True, text=True, timeout=600, cwd=SCRIPT.parents[1],
                          env={**os.environ, "OMP_NUM_THREADS": "1", "BENCH": "0", "SMOKE": "1", "DESIGNS": "PreLN",
                               "WORK": str(tmp_path / "work"),
                               "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    assert done.returncode == 2 and "pool block 0: exit 2" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    assert "gpu_record.sh: a step failed" in done.stderr
    assert not (tmp_path / "results" / "pool-gpu.tgz").exists()
    usage = subprocess.run(["bash", str(SCRIPT.with_name("gpu_record.sh"))], capture_output=True, text=True)
    assert usage.returncode == 2 and usage.stderr.startswith("usage: experiments/gpu_record.sh RESULTS BLOCK")


@pytest.mark.parametrize("part,skip", [("bench", "POOL"), ("profile", "POOL"), ("pool-gpu.tgz", "BENCH")])
def test_gpu_record_keeps_an_earlier_record_unless_told(tmp_path, part, skip):
    """The bench was run with --overwrite always: a second call replaced a card's record silently."""
    results = tmp_path / "results"
    results.mkdir()
    (results / part).write_text("kept")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", skip: "0", "SMOKE": "1"}
    done = subprocess.run(["bash", str(SCRIPT.with_name("gpu_record.sh")), str(results), "1", "unused", "unused"],
                          capture_output=True, text=True, timeout=60, cwd=SCRIPT.parents[1], env=env)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == f"gpu_record.sh: {results / part} holds an earlier record; give another RESULTS, or " \
                          "OVERWRITE=1\n"
    assert sorted(p.name for p in results.iterdir()) == [part] and (results / part).read_text() == "kept"


@pytest.mark.parametrize("missing", ["corpus", "tokenizer"])
def test_gpu_record_checks_the_blocks_inputs_before_anything_runs(tmp_path, missing):
    """A corpus folder without its manifest, or no tokenizer file: one line and exit 2, before the bench or the
    card is touched (nothing written under RESULTS)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    if missing != "corpus":
        (corpus / "manifest.json").write_text("{}")
    ranks = tmp_path / "gpt2.tiktoken"
    if missing != "tokenizer":
        ranks.write_text("")
    results = tmp_path / "results"
    done = subprocess.run(["bash", str(SCRIPT.with_name("gpu_record.sh")), str(results), "1", str(corpus), str(ranks)],
                          capture_output=True, text=True, timeout=60, cwd=SCRIPT.parents[1],
                          env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    assert done.returncode == 2 and done.stdout == "" and len(done.stderr.strip().splitlines()) == 1
    assert ("not a built debdocs corpus" if missing == "corpus" else "no tokenizer file") in done.stderr
    assert not results.exists()


def test_gpu_record_profiles_the_designs_the_bench_found_above_their_goal(tmp_path):
    """After the bench, gpu_record.sh profiles PreLN and each design above its goal (benchmarks/profile_gpu.py);
    here the bench's bench.json is made by hand and the profiles run at smoke size."""
    results = tmp_path / "results"
    (results / "bench").mkdir(parents=True)
    (results / "bench" / "bench.json").write_text(json.dumps({"rows": [{"name": "PostLN step", "value": 1.3},
                                                                       {"name": "HC step", "value": 1.01}]}))
    done = subprocess.run(["bash", str(SCRIPT.with_name("gpu_record.sh")), str(results), "1", "unused", "unused"],
                          capture_output=True, text=True, timeout=600, cwd=SCRIPT.parents[1],
                          env={**os.environ, "OMP_NUM_THREADS": "1", "BENCH": "0", "POOL": "0",
                               "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    assert "profile: exit 0" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    saved = json.loads((results / "profile" / "profile.json").read_text())
    assert [p["design"] for p in saved["profiles"]] == ["PreLN", "PostLN"]
    assert (results / "profile" / "trace-PostLN.json.gz").is_file()
