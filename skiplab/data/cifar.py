"""CIFAR-10 and CIFAR-100, the official "python version" (https://www.cs.toronto.edu/~kriz/cifar.html).

Accepted on disk, looked for in this order inside a folder ``root``:

* ``root`` itself being the extracted folder (``cifar-10-batches-py`` / ``cifar-100-python``),
* that extracted folder inside ``root``,
* the archive ``cifar-10-python.tar.gz`` / ``cifar-100-python.tar.gz`` (or its un-gzipped ``.tar``)
  inside ``root``; its members are read straight from the tar, nothing is extracted to disk.

Each batch is a Python 2 pickle of a dict with bytes keys: ``b"data"`` a uint8 array (N, 3072), each
row 1024 red, 1024 green, 1024 blue bytes in row-major order, hence (N, 3, 32, 32); ``b"labels"``
(CIFAR-10) or ``b"fine_labels"`` (CIFAR-100, the 100-class labels used here). The pickles are read
with the restricted unpickler of :mod:`.safe_pickle`, never with plain ``pickle.load``.
"""

from __future__ import annotations

import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .safe_pickle import safe_loads

Splits = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # train_x, train_y, test_x, test_y


@dataclass(frozen=True)
class CifarSpec:
    """Where one CIFAR variant lives and how its batches are keyed."""

    title: str  # for messages: "CIFAR-10"
    folder: str  # the extracted folder's name
    archive: str  # the official archive's file name
    url: str
    md5: str  # of the archive
    train_members: tuple[str, ...]
    test_member: str
    label_key: bytes
    num_classes: int


CIFAR10 = CifarSpec(
    title="CIFAR-10",
    folder="cifar-10-batches-py",
    archive="cifar-10-python.tar.gz",
    url="https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
    md5="c58f30108f718f92721af3b95e74349a",
    train_members=tuple(f"data_batch_{i}" for i in range(1, 6)),
    test_member="test_batch",
    label_key=b"labels",
    num_classes=10,
)

CIFAR100 = CifarSpec(
    title="CIFAR-100",
    folder="cifar-100-python",
    archive="cifar-100-python.tar.gz",
    url="https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
    md5="eb9058c3a382ffc7106e4002c42a8d85",
    train_members=("train",),
    test_member="test",
    label_key=b"fine_labels",
    num_classes=100,
)


def locate_cifar(spec: CifarSpec, root: Path) -> Path | None:
    """The extracted folder or the archive holding ``spec`` in ``root``, or None when there is neither."""
    root = Path(root)
    if root.name == spec.folder and root.is_dir():
        return root
    for candidate in (root / spec.folder, root / spec.archive, root / spec.archive.removesuffix(".gz")):
        if candidate.exists():
            return candidate
    return None


def read_cifar(spec: CifarSpec, source: Path) -> Splits:
    """Read train and test splits from an extracted folder or an archive found by :func:`locate_cifar`.

    Returns uint8 images (N, 3, 32, 32) and int64 labels (N,) for train, then for test.
    """
    source = Path(source)
    batches = _read_archive(spec, source) if source.is_file() else _read_folder(spec, source)
    train = [batches[m] for m in spec.train_members]
    test_x, test_y = batches[spec.test_member]
    # np.concatenate copies, so the tensors own writable memory rather than the pickle's buffers.
    train_x = np.concatenate([x for x, _ in train])
    train_y = np.concatenate([y for _, y in train])
    return (
        torch.from_numpy(train_x),
        torch.from_numpy(train_y),
        torch.from_numpy(np.array(test_x)),
        torch.from_numpy(np.array(test_y)),
    )


def parse_batch(raw: bytes, source: str, label_key: bytes, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Unpickle one batch safely and check it: images (N, 3, 32, 32) uint8 and labels (N,) int64."""
    batch = safe_loads(raw, source)
    if not isinstance(batch, dict):
        raise ValueError(f"{source}: expected a pickled dict of a CIFAR batch, found {type(batch).__name__}")
    data, labels = _entry(batch, b"data", source), _entry(batch, label_key, source)
    if not (isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 2 and data.shape[1] == 3072):
        found = f"{data.dtype} array of shape {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise ValueError(f"{source}: b'data' must be a uint8 array of shape (N, 3072), found {found}")
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.dtype.kind not in "iu":
        raise ValueError(
            f"{source}: {label_key!r} must be a list of integers, found {labels.dtype} of shape {labels.shape}"
        )
    if len(labels) != len(data):
        raise ValueError(f"{source}: {len(data)} images but {len(labels)} labels in {label_key!r}")
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(
            f"{source}: labels must lie in [0, {num_classes}), found {int(labels.min())}..{int(labels.max())}"
        )
    # Each row is the R plane, then G, then B, each 32x32 row-major: exactly (3, 32, 32) in C order.
    return data.reshape(-1, 3, 32, 32), labels.astype(np.int64)


def _entry(batch: dict, key: bytes, source: str) -> object:
    # The originals have bytes keys; accept str keys too, for files re-pickled under Python 3.
    for k in (key, key.decode()):
        if k in batch:
            return batch[k]
    raise ValueError(f"{source}: the batch has no {key!r} entry (keys: {sorted(map(repr, batch))})")


def _read_folder(spec: CifarSpec, folder: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    batches = {}
    for member in (*spec.train_members, spec.test_member):
        path = folder / member
        if not path.is_file():
            raise FileNotFoundError(
                f"{path}: missing; the {spec.title} folder needs {', '.join((*spec.train_members, spec.test_member))}"
            )
        batches[member] = parse_batch(path.read_bytes(), str(path), spec.label_key, spec.num_classes)
    return batches


def _read_archive(spec: CifarSpec, archive: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    wanted = {f"{spec.folder}/{m}": m for m in (*spec.train_members, spec.test_member)}
    batches = {}
    try:
        # Stream mode ("r|*", gzip or plain) decompresses the archive once, front to back; random
        # access would re-decompress from the start for every member.
        with tarfile.open(archive, mode="r|*") as tar:
            for info in tar:
                name = info.name.removeprefix("./")
                if name in wanted and info.isfile():
                    raw = tar.extractfile(info).read()  # type: ignore[union-attr]
                    source = f"{archive}[{name}]"
                    batches[wanted[name]] = parse_batch(raw, source, spec.label_key, spec.num_classes)
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())
        raise ValueError(f"{archive}: corrupt or truncated {spec.title} archive ({detail})") from None
    missing = [name for name, member in wanted.items() if member not in batches]
    if missing:
        raise ValueError(f"{archive}: not a {spec.title} archive, it lacks {', '.join(missing)}")
    return batches
