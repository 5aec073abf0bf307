"""Every skiplab checkpoint loads with plain ``torch.load(path, weights_only=True)``: no safe globals added, no
skiplab code, for every kind of run (image, translation, captioning, language models on text and on token files,
an averaged checkpoint). Imported Hugging Face runs: tests/interop/test_hf_commands.py."""

from pathlib import Path

import numpy as np
import pytest
import torch

from skiplab import run_dir
from skiplab.cli import main
from tests.train.test_caption import scene_args, scenes_dir  # noqa: F401 - scenes_dir is a fixture
from tests.train.test_distributed import one_thread
from tests.train.test_lm import TINY, args as lm_args, text  # noqa: F401 - text is a fixture
from tests.train.test_mt import corpus, tiny_args as mt_args  # noqa: F401 - corpus is a fixture


def load_every_checkpoint(folder: Path, kind: str) -> list[str]:
    """The names of the .pt files under ``folder``, each loaded with plain weights_only=True and of ``kind``."""
    files = sorted(folder.rglob("*.pt"))
    for path in files:
        state = torch.load(path, weights_only=True)
        assert isinstance(state, dict) and state["kind"] == kind, path
    return [p.name for p in files]


def token_files(root: Path) -> list[str]:
    """Headerless uint16 token files of a train and a valid split (ids below 256), as a .bin run reads them."""
    root.mkdir()
    for split in ("train", "valid"):
        np.random.default_rng(0).integers(0, 256, 600).astype(np.uint16).tofile(root / f"{split}.bin")
    return ["--corpus", "", "--train-file", str(root / "train.bin"), "--valid-file", str(root / "valid.bin"),
            "--vocab-size", "256"]


@pytest.mark.parametrize("kind", ["image", "mt", "caption", "lm text", "lm token files"])
def test_every_kind_of_run_loads_weights_only(kind, request, tmp_path):
    out = tmp_path / "run"
    with one_thread():
        if kind == "image":
            argv = ["train", "image", "--dataset", "fashion-mnist", "--data-dir",
                    str(request.getfixturevalue("fashion_dir")), "--epochs", "1", "--train-subset", "64",
                    "--test-subset", "64", "--batch-size", "64", "--model", "preact-resnet20", "--out", str(out)]
        elif kind == "mt":
            argv = mt_args(request.getfixturevalue("corpus"), out)
        elif kind == "caption":
            argv = scene_args(request.getfixturevalue("scenes_dir"), out)
        elif kind == "lm text":
            argv = [str(a) for a in lm_args(request.getfixturevalue("text"), out, "--max-steps", "2",
                                            "--eval-every", "2")]
        else:  # no tokenizer: the checkpoint's is None (an empty bytes is what weights_only refused)
            argv = ["train", "lm", *token_files(tmp_path / "bins"), "--model", TINY, "--batch-size", "4",
                    "--max-steps", "2", "--eval-every", "2", "--device", "cpu", "--out", str(out)]
        assert main(argv) == 0
        names = load_every_checkpoint(out, kind.split()[0])
    assert {"last.pt", "best.pt"} <= set(names)
    steps = run_dir.step_checkpoints(out)
    assert steps or kind == "image"
    if steps:  # skiplab average writes a checkpoint of the run's own kind too, into a folder it makes
        avg = tmp_path / "averaged" / "avg.pt"
        assert main(["average", "--checkpoint", str(out), "--last", str(len(steps)), "--out", str(avg)]) == 0
        state = torch.load(avg, weights_only=True)
        assert state["kind"] == kind.split()[0] and state["averaged"] == [p.name for p in steps]
    if kind == "lm token files":
        assert torch.load(out / "last.pt", weights_only=True)["tokenizer"] is None


def test_step_checkpoints_are_the_numbered_ones(tmp_path):
    """`average --out RUN/checkpoint_avg.pt` wrote a file whose name broke every later `average` and `eval --average`
    of the run ("invalid literal for int()"): only checkpoint_<step>.pt files are step checkpoints."""
    from skiplab import run_dir

    for name in ("checkpoint_10.pt", "checkpoint_2.pt", "checkpoint_avg.pt", "checkpoint_.pt"):
        (tmp_path / name).write_bytes(b"")
    assert [p.name for p in run_dir.step_checkpoints(tmp_path)] == ["checkpoint_2.pt", "checkpoint_10.pt"]
