"""MNIST-style IDX files: header parsing, length checks, gzip errors, the 28 -> 32 padding."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

from skiplab.data.idx import IDX_FILES, IMAGES_MAGIC, LABELS_MAGIC, find_idx_file, read_idx, read_idx_split
from tests.conftest import idx_bytes, write_idx


def write_idx_dataset(root: Path, n_train: int = 6, n_test: int = 3, seed: int = 0, gz: bool = True) -> dict:
    """A tiny MNIST-like folder with the four official file names; returns the arrays written."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for split, n in (("train", n_train), ("test", n_test)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, size=n, dtype=np.uint8)
        images_name, labels_name = IDX_FILES[split]
        suffix = ".gz" if gz else ""
        write_idx(root / f"{images_name}{suffix}", idx_bytes(images))
        write_idx(root / f"{labels_name}{suffix}", idx_bytes(labels))
        arrays[split] = (images, labels)
    return arrays


def test_round_trip_and_padding(tmp_path):
    images = np.random.default_rng(1).integers(1, 256, size=(3, 28, 28), dtype=np.uint8)  # no zeros inside
    labels = np.array([7, 0, 9], np.uint8)
    x, y = read_idx_split(
        write_idx(tmp_path / "img.gz", idx_bytes(images)), write_idx(tmp_path / "lbl.gz", idx_bytes(labels))
    )
    assert x.shape == (3, 1, 32, 32) and str(x.dtype) == "torch.uint8"
    assert y.tolist() == [7, 0, 9] and str(y.dtype) == "torch.int64"
    assert np.array_equal(x[:, 0, 2:30, 2:30].numpy(), images)
    assert x[0, 0, 2, 2] == images[0, 0, 0] and x[2, 0, 29, 29] == images[2, 27, 27]
    border = x.clone()
    border[:, :, 2:30, 2:30] = 0
    assert border.sum() == 0


def test_ungzipped_files_are_accepted(tmp_path):
    arrays = write_idx_dataset(tmp_path, gz=False)
    images_name, labels_name = IDX_FILES["test"]
    assert find_idx_file(tmp_path, images_name) == tmp_path / images_name
    x, y = read_idx_split(find_idx_file(tmp_path, images_name), find_idx_file(tmp_path, labels_name))
    assert np.array_equal(x[:, 0, 2:30, 2:30].numpy(), arrays["test"][0])
    assert find_idx_file(tmp_path, "absent") is None


def test_truncated_file(tmp_path):
    images = np.zeros((3, 28, 28), np.uint8)
    path = write_idx(tmp_path / "train-images-idx3-ubyte.gz", idx_bytes(images, dims=(10, 28, 28)))
    with pytest.raises(ValueError) as err:
        read_idx(path, IMAGES_MAGIC)
    assert str(err.value) == f"{path}: truncated IDX file: expected 7840 bytes of data, found 2352"


def test_truncated_header(tmp_path):
    path = write_idx(tmp_path / "x.gz", struct.pack(">II", IMAGES_MAGIC, 10))
    with pytest.raises(ValueError, match="truncated IDX file: header needs 16 bytes, found 8"):
        read_idx(path, IMAGES_MAGIC)


def test_trailing_bytes(tmp_path):
    path = write_idx(tmp_path / "y", idx_bytes(np.zeros(5, np.uint8), dims=(4,)))
    with pytest.raises(ValueError, match="IDX file too long: expected 4 bytes of data, found 5"):
        read_idx(path, LABELS_MAGIC)


def test_wrong_magic(tmp_path):
    path = write_idx(tmp_path / "labels-as-images.gz", idx_bytes(np.zeros(4, np.uint8)))
    with pytest.raises(ValueError, match=r"labels-as-images\.gz: wrong magic number 0x00000801, expected 0x00000803"):
        read_idx(path, IMAGES_MAGIC)


@pytest.mark.parametrize("damage", ["not gzip", "cut short"])
def test_bad_gzip_names_the_file(tmp_path, damage):
    path = tmp_path / "t10k-labels-idx1-ubyte.gz"
    good = gzip.compress(idx_bytes(np.arange(200, dtype=np.uint8)))
    path.write_bytes(b"plain bytes, not gzip" if damage == "not gzip" else good[: len(good) // 2])
    with pytest.raises(ValueError, match=r"t10k-labels-idx1-ubyte\.gz: not a valid gzip file") as err:
        read_idx(path, LABELS_MAGIC)
    assert "\n" not in str(err.value)


def test_label_count_must_match(tmp_path):
    images = write_idx(tmp_path / "i.gz", idx_bytes(np.zeros((3, 28, 28), np.uint8)))
    labels = write_idx(tmp_path / "l.gz", idx_bytes(np.zeros(4, np.uint8)))
    with pytest.raises(ValueError, match="4 labels but .* holds 3 images"):
        read_idx_split(images, labels)


@pytest.mark.parametrize("bad", [10, 255])
def test_labels_must_name_one_of_the_ten_classes(tmp_path, bad):
    """A label outside 0-9 is one line naming the file when it is read, not an index error mid-training."""
    images = write_idx(tmp_path / "i.gz", idx_bytes(np.zeros((3, 28, 28), np.uint8)))
    labels = write_idx(tmp_path / "l.gz", idx_bytes(np.array([0, bad, 9], np.uint8)))
    with pytest.raises(ValueError, match=rf"l.gz: labels must lie in \[0, 10\), found 0..{bad}") as err:
        read_idx_split(images, labels)
    assert "\n" not in str(err.value)
    labels = write_idx(tmp_path / "l.gz", idx_bytes(np.array([0, 9, 9], np.uint8)))
    assert read_idx_split(images, labels)[1].tolist() == [0, 9, 9]


def test_images_must_be_28x28(tmp_path):
    images = write_idx(tmp_path / "i.gz", idx_bytes(np.zeros((2, 32, 32), np.uint8)))
    labels = write_idx(tmp_path / "l.gz", idx_bytes(np.zeros(2, np.uint8)))
    with pytest.raises(ValueError, match="expected 28x28 images, found 32x32"):
        read_idx_split(images, labels)
