"""MNIST and Fashion-MNIST in the IDX format (http://yann.lecun.com/exdb/mnist/), gzipped or not.

An IDX file is a big-endian header, a magic number ``0x000008NN`` (0x08: unsigned bytes, NN: the
number of dimensions), one 32-bit size per dimension, then the bytes of the array. Images are
``0x00000803`` with dims (N, 28, 28); labels are ``0x00000801`` with dims (N,).

The grey 28x28 images are zero-padded by 2 pixels on each side to 32x32, so every dataset here has
the same spatial size as CIFAR and one network fits all; they keep one channel: (N, 1, 32, 32).
Original pixel (r, c) lands at (r + 2, c + 2).
"""

from __future__ import annotations

import gzip
import math
import struct
import zlib
from pathlib import Path

import numpy as np
import torch

IMAGES_MAGIC = 0x00000803
LABELS_MAGIC = 0x00000801
PAD = 2  # 28 + 2 * 2 = 32

# split -> (images file, labels file), the official names without ".gz".
IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def find_idx_file(root: Path, name: str) -> Path | None:
    """``root/name.gz`` or, failing that, the un-gzipped ``root/name``; None when neither exists."""
    for candidate in (Path(root) / f"{name}.gz", Path(root) / name):
        if candidate.is_file():
            return candidate
    return None


def read_idx(path: Path, magic: int) -> np.ndarray:
    """Read one IDX file of unsigned bytes, checking its magic number and its length against the header."""
    path = Path(path)
    raw = _read_bytes(path)
    if len(raw) < 4:
        raise ValueError(f"{path}: truncated IDX file: {len(raw)} bytes, too short for a header")
    (found,) = struct.unpack(">I", raw[:4])
    if found != magic:
        kind = "images" if magic == IMAGES_MAGIC else "labels"
        raise ValueError(f"{path}: wrong magic number 0x{found:08x}, expected 0x{magic:08x} (IDX {kind})")
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{path}: truncated IDX file: header needs {header} bytes, found {len(raw)}")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    expected, found_bytes = math.prod(dims), len(raw) - header
    if found_bytes < expected:
        raise ValueError(f"{path}: truncated IDX file: expected {expected} bytes of data, found {found_bytes}")
    if found_bytes > expected:
        raise ValueError(f"{path}: IDX file too long: expected {expected} bytes of data, found {found_bytes}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def read_idx_split(images_path: Path, labels_path: Path, num_classes: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """One split: uint8 images (N, 1, 32, 32), zero-padded from 28x28, and int64 labels (N,), each in
    [0, ``num_classes``) (the IDX datasets' ten)."""
    images = read_idx(images_path, IMAGES_MAGIC)
    if images.shape[1:] != (28, 28):
        raise ValueError(f"{images_path}: expected 28x28 images, found {images.shape[1]}x{images.shape[2]}")
    labels = read_idx(labels_path, LABELS_MAGIC)
    if len(labels) != len(images):
        raise ValueError(f"{labels_path}: {len(labels)} labels but {images_path} holds {len(images)} images")
    if len(labels) and labels.max() >= num_classes:  # unsigned bytes: none below 0
        raise ValueError(f"{labels_path}: labels must lie in [0, {num_classes}), found {int(labels.min())}.."
                         f"{int(labels.max())}")
    return torch.from_numpy(pad_to_32(images)), torch.from_numpy(labels.astype(np.int64))


def pad_to_32(images: np.ndarray) -> np.ndarray:
    """(N, 28, 28) uint8 -> (N, 1, 32, 32) uint8 with a zero border of 2 pixels."""
    out = np.zeros((len(images), 1, 28 + 2 * PAD, 28 + 2 * PAD), dtype=np.uint8)
    out[:, 0, PAD:-PAD, PAD:-PAD] = images
    return out


def _read_bytes(path: Path) -> bytes:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    if path.suffix != ".gz":
        return path.read_bytes()
    try:
        return gzip.decompress(path.read_bytes())
    # BadGzipFile is an OSError; a cut-off stream is EOFError; damaged deflate data is zlib.error.
    except (OSError, EOFError, zlib.error) as exc:
        raise ValueError(f"{path}: not a valid gzip file ({' '.join(str(exc).split())})") from None
