"""The experiments' shell scripts that move records around (restore_runs.sh, collect_runs.sh) and pick runs out of a
study's folder (depth_study.sh's analysis step), run on small folders the tests write; skiplab itself replaced by a
stand-in that records its arguments where a script would train."""

import json
import os
import subprocess
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def bash(script: str, *args, env=None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(EXPERIMENTS / script), *map(str, args)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})}, cwd=cwd)


def run_folder(path: Path, lines: int, finished: bool = True, lr: float = 1e-3) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"config": {"lr": lr}}))
    (path / "metrics.jsonl").write_text("".join(json.dumps({"step": k}) + "\n" for k in range(1, lines + 1)))
    if finished:
        (path / "summary.json").write_text(json.dumps({"status": "finished"}))
    return path


def test_restoring_a_record_over_a_run_cut_short_is_refused(tmp_path):
    """The record's summary.json beside a cut-short run's metrics made it count as finished with half a record (and
    collecting it back cut the record's metrics.jsonl to the partial one's lines)."""
    record, out = tmp_path / "record", tmp_path / "out"
    run_folder(record / "PreLN" / "seed1", 2)
    run_folder(record / "HC" / "seed1", 2)
    run_folder(out / "PreLN" / "seed1", 1, finished=False)
    done = bash("restore_runs.sh", record, out)
    assert done.returncode == 2 and done.stderr.strip() == (
        f"restore_runs.sh: {out}/PreLN/seed1 holds a run cut short that {record} records finished: move one aside")
    assert not (out / "PreLN" / "seed1" / "summary.json").exists() and not (out / "HC").exists()  # nothing copied
    (out / "PreLN" / "seed1" / "config.json").unlink()  # moved aside: the record comes back whole
    assert bash("restore_runs.sh", record, out).returncode == 0
    assert (out / "HC" / "seed1" / "summary.json").is_file()
    assert (out / "PreLN" / "seed1" / "metrics.jsonl").read_text().count("\n") == 1  # a file there is never replaced
    assert bash("restore_runs.sh", "", out).returncode == 0  # no record: nothing to do


def test_collecting_from_a_missing_folder_writes_nothing(tmp_path):
    done = bash("collect_runs.sh", tmp_path / "nowhere", tmp_path / "dest")
    assert done.returncode == 2 and done.stderr.strip() == f"collect_runs.sh: {tmp_path / 'nowhere'}: no such folder"
    assert not (tmp_path / "dest").exists()  # it made DEST, then failed on cd
    for script in ("collect_runs.sh", "restore_runs.sh", "collect_new_runs.sh", "pool_gpu.sh"):
        done = bash(script)
        assert done.returncode == 2 and done.stderr.startswith(f"usage: experiments/{script} "), script


def test_the_depth_studys_analysis_reads_the_lr_1e3_runs(tmp_path):
    """Step 3 puts PreLN's runs at lr 3e-3 and 1e-2 beside its 1e-3 one, under names that hold no lr: the analysis
    took the first name in order, here the 3e-3 run."""
    runs = tmp_path / "out" / "runs"
    chosen = {}
    for design, hashes in {"PreLN": ("0aaa", "ffff"), "MixLN": ("1bbb", "2ccc"), "LNS": ("3ddd", "0eee")}.items():
        for h, lr in zip(hashes, (3e-3, 1e-3)):
            run = run_folder(runs / f"pydocs_gpt-mini_context=128_connection={design}_layers=4_-{h}" / "seed1", 1, lr=lr)
            (run / "last.pt").write_bytes(b"")
            if lr == 1e-3:
                chosen[design] = run
    stand_in = tmp_path / "skiplab"
    stand_in.write_text('#!/usr/bin/env bash\necho "$*" >> "$LOG"\nif [ "$1" = analyze ]; then a=$2; shift 2\n'
                        '  for r in "$@"; do case $r in --*) continue;; esac\n'
                        '    mkdir -p "$r/analysis"; : > "$r/analysis/${a}_compare.png"; : > "$r/analysis/$a.json"\n'
                        '  done\nfi\n')
    stand_in.chmod(0o755)
    log = tmp_path / "log"
    done = bash("depth_study.sh", tmp_path / "out", cwd=tmp_path,
                env={"SKIPLAB": str(stand_in), "LOG": str(log), "DESIGNS": "PreLN,MixLN,LNS", "DEPTHS": "4",
                     "LR_AXIS": "no"})
    assert done.returncode == 0, done.stderr
    analyses = [line.split() for line in log.read_text().splitlines() if line.startswith("analyze")]
    assert len(analyses) == 2
    for words in analyses:
        assert words[2:6] == [str(chosen["PreLN"]), "--compare", str(chosen["MixLN"]), str(chosen["LNS"])]
    assert (tmp_path / "out" / "analysis" / "PreLN.redundancy.json").is_file()
