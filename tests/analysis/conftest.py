"""Tiny trained runs the analysis tests share: translation runs on Multi30k, and GPT runs on a story."""

import gzip
import json
from pathlib import Path

import pytest

from skiplab.cli import main

MULTI30K = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "multi30k"


@pytest.fixture(scope="session")
def mt_runs(tmp_path_factory):
    """Tiny translation runs (SAS Transformer, depth-wise LSTM) on the first 200 pairs of Multi30k."""
    if not (MULTI30K / "train.en.gz").exists():
        pytest.skip(f"Multi30k not found at {MULTI30K}")
    root = tmp_path_factory.mktemp("mt")
    for split, n in (("train", 200), ("val", 8), ("test_2016_flickr", 8)):
        for lang in ("en", "de"):
            with gzip.open(MULTI30K / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
                (root / f"{split}.{lang}").write_text("".join(next(f) for _ in range(n)), encoding="utf-8")
    for name, model in (("sas", "transformer-small(connection=SAS)"), ("dwlstm", "dwlstm-small")):
        assert main(["train", "mt", "--model", model, "--corpus", "", "--train-prefix", str(root / "train"),
                     "--valid-prefix", str(root / "val"), "--test-prefix", str(root / "test_2016_flickr"), "--d-model", "16", "--ffn-dim", "32", "--heads", "2",
                     "--encoder-layers", "2", "--decoder-layers", "2", "--vocab-size", "200", "--max-tokens", "512",
                     "--max-steps", "3", "--save-every", "3", "--warmup", "2", "--lr", "3e-3",
                     "--out", str(root / name)]) == 0
    return root


STORY = "the cat sat on the mat. the dog sat on the log. they were happy. "
TINY_GPT = "gpt-mini(d_model=16,heads=2,layers={layers},ffn_dim=32,context=16,connection={conn})"


def tiny_lm_runs(root: Path, runs: dict[str, str], steps: int = 4, eval_every: int = 4, lr: str = "1e-2") -> Path:
    """Train each ``runs`` name -> model spec for ``steps`` updates into ``root/name`` on a story corpus written
    to ``root`` (its train, valid and test JSONL)."""
    for split, n in (("train", 30), ("valid", 3), ("test", 3)):
        with open(root / f"{split}.jsonl", "w") as f:
            for i in range(n):
                f.write(json.dumps({"text": STORY * (2 + i % 3)}) + "\n")
    for name, model in runs.items():
        argv = ["train", "lm", "--corpus", "", "--train-file", root / "train.jsonl", "--valid-file",
                root / "valid.jsonl", "--test-file", root / "test.jsonl", "--model", model,
                "--batch-size", "8", "--max-steps", steps, "--eval-every", eval_every, "--warmup", "1", "--lr", lr,
                "--device", "cpu", "--out", root / name]
        assert main([str(a) for a in argv]) == 0
    return root
