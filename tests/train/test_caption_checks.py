"""Captioning's start-up checks: the test split's files, files cut short, and a self-critical run's source."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from skiplab.cli import main
from skiplab.data.captions import CaptionedImage, ImageFolder
from tests.train.test_caption import PIXELS, scene_args, scenes_dir, write_coco  # noqa: F401 (a fixture)

COMMON = ["train", "caption", "--dataset", "", "--min-count", "1", "--batch-size", "10", "--max-steps", "1",
          "--warmup", "1", "--save-every", "1", "--device", "cpu"]


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_a_missing_test_image_stops_a_run_before_it_writes(tmp_path, capsys):
    """The test split's files were not checked at start-up: a missing test image was found by `eval caption`
    after all training. Now a Karpathy file's test images and a COCO --test-captions file's are checked too."""
    coco = write_coco(tmp_path / "coco")
    missing = sorted(coco["images"].glob("COCO_test*"))[1]
    missing.unlink()
    pixels = ["--model", PIXELS.format(3), "--image-dir", str(coco["images"])]
    for name, data in (("karpathy", ["--captions", str(coco["karpathy"])]),
                       ("coco", ["--captions", str(coco["train"]), "--valid-captions", str(coco["val"]),
                                 "--test-captions", str(coco["test"])])):
        out = tmp_path / f"{name}-run"
        assert main([*COMMON, *data, *pixels, "--out", str(out)]) == 2, name
        assert one_line(capsys) == f"skiplab: error: {missing}: no such file"
        assert not out.exists()


def test_a_run_without_a_test_split_still_trains(tmp_path, capsys):
    """A COCO captions run that names no --test-captions has no test split to check, and is not refused."""
    coco = write_coco(tmp_path / "coco")
    out = tmp_path / "run"
    assert main([*COMMON, "--captions", str(coco["train"]), "--valid-captions", str(coco["val"]), "--model",
                 PIXELS.format(3), "--image-dir", str(coco["images"]), "--out", str(out)]) == 0
    assert (out / "last.pt").is_file()


def cut(path: Path, keep: int = 100) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def test_a_truncated_png_stops_a_run_before_it_writes(tmp_path, capsys):
    """A PNG cut to its first 100 bytes passed the header check and the run died at the step that read it."""
    coco = write_coco(tmp_path / "coco")
    args = [*COMMON, "--captions", str(coco["karpathy"]), "--model", PIXELS.format(3), "--image-dir",
            str(coco["images"]), "--out", str(tmp_path / "run"), "--overwrite"]
    assert main(args) == 0
    before = snapshot(tmp_path / "run")  # an existing run, --overwrite given: left as it was
    bad = sorted(coco["images"].glob("COCO_train*"))[3]
    cut(bad)
    capsys.readouterr()
    assert main(args) == 2
    err = one_line(capsys)
    assert err.startswith(f"skiplab: error: {bad}: not a readable image (a PNG cut short") and "IEND" in err, err
    assert snapshot(tmp_path / "run") == before


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def image(tmp_path: Path, name: str, fmt: str) -> tuple[ImageFolder, CaptionedImage, Path]:
    from PIL import Image

    rng = np.random.default_rng(1)
    path = tmp_path / name
    Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(path, format=fmt)
    return ImageFolder(tmp_path, size=(32, 32), channels=3), CaptionedImage(1, name, [], []), path


@pytest.mark.parametrize("fmt,name,marker", [("PNG", "a.png", "IEND"), ("JPEG", "a.jpg", "FF D9")])
def test_a_file_cut_short_is_told_from_its_end(tmp_path, fmt, name, marker):
    folder, record, path = image(tmp_path, name, fmt)
    assert folder.check(record) == path
    whole = path.read_bytes()
    for keep in (100, len(whole) // 2):
        path.write_bytes(whole[:keep])
        with pytest.raises(ValueError) as caught:
            folder.check(record)
        said = str(caught.value)
        assert said.startswith(f"{path}: not a readable image (a {fmt} cut short") and marker in said, said
        assert "\n" not in said
    if fmt == "PNG":  # its IEND's last byte gone, its pixels all there: decoded whole and kept, as training reads it
        path.write_bytes(whole[:-1])
        assert folder.check(record) == path


@pytest.mark.parametrize("fmt,name", [("PNG", "a.png"), ("JPEG", "a.jpg")])
def test_a_whole_file_with_padding_or_a_trailer_passes(tmp_path, fmt, name):
    """Zero bytes after the end marker are accepted as padding; other trailing bytes only where the image still
    decodes (the check then reads that one file whole)."""
    folder, record, path = image(tmp_path, name, fmt)
    whole = path.read_bytes()
    for tail in (b"\0" * 3000, b"trailing bytes another program left"):
        path.write_bytes(whole + tail)
        assert folder.check(record) == path


@pytest.fixture(scope="module")
def xe_run(scenes_dir, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("xe") / "run"
    assert main(scene_args(scenes_dir, out)) == 0
    return out


def scst_args(scenes_dir: Path, xe: Path, out: Path, *extra: str) -> list[str]:  # noqa: F811
    args = scene_args(scenes_dir, out, "--scst-from", str(xe), "--scst-samples", "2", "--schedule", "constant",
                      "--lr", "5e-6", "--warmup", "0", *extra)
    args[args.index("--max-steps") + 1] = "1"
    return args


@pytest.mark.parametrize("dataset", ["fashion-mnist-scenes-hard", "fashion-mnist-scenes-crowded"])
def test_self_critical_training_refuses_another_dataset(scenes_dir, xe_run, tmp_path, capsys, dataset):  # noqa: F811
    """A run on another dataset was accepted silently and reused the source run's vocabulary."""
    out = tmp_path / "scst"
    shutil.copytree(xe_run, out)  # an existing run, --overwrite given: left as it was
    before = snapshot(out)
    capsys.readouterr()
    assert main(scst_args(scenes_dir, xe_run, out, "--dataset", dataset, "--overwrite")) == 2
    assert one_line(capsys) == (f"skiplab: error: --scst-from {xe_run} trained on --dataset fashion-mnist-scenes, "
                                f"this run names --dataset {dataset}: give the same dataset")
    assert snapshot(out) == before


def test_self_critical_training_refuses_another_caption_length(scenes_dir, xe_run, tmp_path, capsys):  # noqa: F811
    """The source run's --max-caption-len was not looked at: the run's own (16 unless given) was used."""
    out = tmp_path / "scst"
    assert main(scst_args(scenes_dir, xe_run, out, "--max-caption-len", "12")) == 2
    err = one_line(capsys)
    assert "--max-caption-len 16" in err and "12" in err and str(xe_run) in err, err
    assert not out.exists()
    assert main(scst_args(scenes_dir, xe_run, out, "--max-caption-len", "16")) == 0  # the same: trains


def test_self_critical_training_refuses_another_captions_file(tmp_path, capsys):
    """A files run: the source run's --captions must be the same file (its path, or a copy of the same bytes)."""
    coco = write_coco(tmp_path / "coco")
    features = ["--model", "captioner-base(d_model=32,ffn_dim=64,heads=2,encoder_layers=1,decoder_layers=1,"
                "feature_dim=8)", "--feature-dir", str(coco["feats"])]
    xe = tmp_path / "xe"
    assert main([*COMMON, "--captions", str(coco["karpathy"]), *features, "--out", str(xe)]) == 0
    scst = ["--scst-from", str(xe), "--scst-samples", "2", "--schedule", "constant", "--lr", "5e-6", "--warmup", "0"]
    copy = tmp_path / "elsewhere" / "dataset_coco.json"
    copy.parent.mkdir()
    shutil.copy(coco["karpathy"], copy)
    assert main([*COMMON, "--captions", str(copy), *features, *scst, "--out", str(tmp_path / "same")]) == 0
    other = tmp_path / "other.json"
    data = json.loads(coco["karpathy"].read_text())
    data["images"][0]["sentences"][0]["tokens"] = ["another", "caption"]
    other.write_text(json.dumps(data))
    out = tmp_path / "scst"
    capsys.readouterr()
    assert main([*COMMON, "--captions", str(other), *features, *scst, "--out", str(out)]) == 2
    err = one_line(capsys)
    assert f"--captions {coco['karpathy']}" in err and f"--captions {other}" in err, err
    assert not out.exists()


@pytest.mark.parametrize("flag, theirs, ours", [("--scene-seed", "0", "7"), ("--train-scenes", "40", "30"),
                                                ("--test-scenes", "6", "4"), ("--min-count", "1", "2")])
def test_self_critical_training_refuses_other_scenes_or_another_vocabulary_threshold(scenes_dir, xe_run, tmp_path,
                                                                                     capsys, flag, theirs, ours):  # noqa: F811
    """Another scene seed or size composed other scenes (train, valid and test alike) for the source run's
    vocabulary, and another --min-count was recorded while the source's vocabulary was used: both ran silently."""
    out = tmp_path / "scst"
    args = scst_args(scenes_dir, xe_run, out)
    if flag in args:
        args[args.index(flag) + 1] = ours
    else:
        args += [flag, ours]
    capsys.readouterr()
    assert main(args) == 2
    assert one_line(capsys) == (f"skiplab: error: --scst-from {xe_run} trained with {flag} {theirs}, this run has "
                                f"{ours}: give {flag} {theirs}")
    assert not out.exists()


@pytest.mark.parametrize("content", [None, "{\"images\": [", "[1, 2]"])
def test_a_missing_or_misshapen_captions_file_is_told_so_with_the_other_splits_given(tmp_path, capsys, content):
    """With --valid-captions and --test-captions given, a captions file that is missing, cut short or not an object
    was called "a Karpathy split file"; its reader's own error names what is wrong."""
    captions = tmp_path / "train.json"
    if content is not None:
        captions.write_text(content)
    capsys.readouterr()
    assert main([*COMMON, "--captions", str(captions), "--valid-captions", str(tmp_path / "val.json"),
                 "--test-captions", str(tmp_path / "test.json"), "--image-dir", str(tmp_path),
                 "--out", str(tmp_path / "run")]) == 2
    err = one_line(capsys)
    assert str(captions) in err and "Karpathy split file" not in err, err
