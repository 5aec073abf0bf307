"""The image datasets by name, and :func:`load_image_dataset`, which finds, fetches and loads one.

Every dataset comes back as uint8 images (N, C, 32, 32) in memory: CIFAR with C = 3, the grey
MNIST / Fashion-MNIST with C = 1, zero-padded from 28x28 to 32x32 (see :mod:`.idx`).

Where the files are looked for when ``data_dir`` is None, in order:
``$SKIPLAB_DATA/<name>`` (when that variable is set), ``/usr/share/datasets/fashion-mnist`` (for
fashion-mnist only: the Debian package ``dataset-fashion-mnist``), ``~/.cache/skiplab/<name>``.
A download goes to the first of these that is not a system folder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from . import cifar, idx
from .download import DownloadError
from .download import download as _download

SYSTEM_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")


@dataclass(frozen=True, eq=False)  # eq=False: comparing tensors field by field has no single truth value
class ImageData:
    """A whole image classification dataset in memory, raw uint8 pixels plus what training needs."""

    name: str
    train_x: torch.Tensor  # uint8 (N, C, 32, 32)
    train_y: torch.Tensor  # int64 (N,)
    test_x: torch.Tensor  # uint8 (M, C, 32, 32)
    test_y: torch.Tensor  # int64 (M,)
    num_classes: int
    mean: tuple[float, ...]  # per channel, of train_x / 255
    std: tuple[float, ...]  # per channel, of train_x / 255 (population std)
    flip: bool  # whether a horizontal flip keeps the class (not for digits)

    def __post_init__(self) -> None:
        for split, x, y in (("train", self.train_x, self.train_y), ("test", self.test_x, self.test_y)):
            if x.dtype != torch.uint8 or x.dim() != 4 or y.dtype != torch.int64 or y.shape != (len(x),):
                raise ValueError(
                    f"ImageData({self.name}): {split} needs uint8 images (N, C, H, W) and int64 labels (N,), "
                    f"found {x.dtype} {tuple(x.shape)} and {y.dtype} {tuple(y.shape)}"
                )

    @property
    def channels(self) -> int:
        """C: 3 for CIFAR, 1 for the grey datasets."""
        return self.train_x.shape[1]


@dataclass(frozen=True)
class RemoteFile:
    """One file of a dataset as published: where, under what name, with what md5."""

    url: str
    filename: str
    md5: str


@dataclass(frozen=True)
class DatasetInfo:
    """How to find, fetch and read one dataset."""

    name: str
    title: str  # for messages: "CIFAR-10"
    description: str
    num_classes: int
    flip: bool
    files: tuple[RemoteFile, ...]  # what a download fetches
    locate: Callable[[Path], Any]  # the data found in a folder, or None
    missing: Callable[[Path], str]  # what is absent from a folder, for the error message
    read: Callable[[Any], cifar.Splits]  # what locate found -> (train_x, train_y, test_x, test_y)
    system_dirs: tuple[Path, ...] = ()
    hint: str = ""  # another way to get the files


def _cifar_info(name: str, spec: cifar.CifarSpec, description: str) -> DatasetInfo:
    return DatasetInfo(
        name=name,
        title=spec.title,
        description=description,
        num_classes=spec.num_classes,
        flip=True,
        files=(RemoteFile(spec.url, spec.archive, spec.md5),),
        locate=lambda root: cifar.locate_cifar(spec, root),
        missing=lambda root: f"no {spec.folder}/ folder or {spec.archive} in {root}",
        read=lambda found: cifar.read_cifar(spec, found),
    )


def _locate_idx(root: Path) -> dict[str, tuple[Path, Path]] | None:
    found = {split: tuple(idx.find_idx_file(root, f) for f in files) for split, files in idx.IDX_FILES.items()}
    return None if any(p is None for pair in found.values() for p in pair) else found  # type: ignore[return-value]


def _idx_missing(root: Path) -> str:
    absent = [f for files in idx.IDX_FILES.values() for f in files if idx.find_idx_file(root, f) is None]
    return f"{root / absent[0]}.gz is missing" if absent else f"nothing missing in {root}"


def _read_idx(found: dict[str, tuple[Path, Path]]) -> cifar.Splits:
    return (*idx.read_idx_split(*found["train"]), *idx.read_idx_split(*found["test"]))


def _idx_info(
    name: str,
    title: str,
    description: str,
    base: str,
    md5s: tuple[str, ...],
    flip: bool,
    system_dirs: tuple[Path, ...] = (),
    hint: str = "",
) -> DatasetInfo:
    names = [f"{f}.gz" for files in idx.IDX_FILES.values() for f in files]
    return DatasetInfo(
        name=name,
        title=title,
        description=description,
        num_classes=10,
        flip=flip,
        files=tuple(RemoteFile(base + n, n, m) for n, m in zip(names, md5s)),
        locate=_locate_idx,
        missing=_idx_missing,
        read=_read_idx,
        system_dirs=system_dirs,
        hint=hint,
    )


# md5s in the order train-images, train-labels, t10k-images, t10k-labels (the values torchvision uses).
IMAGE_DATASETS: dict[str, DatasetInfo] = {
    "cifar10": _cifar_info("cifar10", cifar.CIFAR10, "CIFAR-10: 50000 + 10000 colour 32x32 images, 10 classes"),
    "cifar100": _cifar_info("cifar100", cifar.CIFAR100, "CIFAR-100: 50000 + 10000 colour 32x32 images, 100 classes"),
    "fashion-mnist": _idx_info(
        "fashion-mnist",
        "Fashion-MNIST",
        "Fashion-MNIST: 60000 + 10000 grey 28x28 images (padded to 32x32), 10 classes",
        "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
        ("8d4fb7e6c68d591d4c3dfef9ec88bf0d", "25c81989df183df01b3e8a0aad5dffbe",
         "bef4ecab320f06d8554ea6380940ec79", "bb300cfdad3c16e7a12a480ee83cd310"),
        flip=True,  # a mirrored shoe or shirt is still a shoe or shirt
        system_dirs=(SYSTEM_FASHION_MNIST,),
        hint=f"or run `apt-get install dataset-fashion-mnist` (puts them in {SYSTEM_FASHION_MNIST})",
    ),
    "mnist": _idx_info(
        "mnist",
        "MNIST",
        "MNIST: 60000 + 10000 grey 28x28 digits (padded to 32x32), 10 classes",
        "https://ossci-datasets.s3.amazonaws.com/mnist/",
        ("f68b3c2dcbeaaa9fbdd348bbdeb94873", "d53e105ee54ea40749a09fcbcd1e9432",
         "9fb629c4189551a2d022fa330f9573f3", "ec29112dd5afa0611ce80d1b7f02629c"),
        flip=False,  # a mirrored digit is not the same digit
    ),
}


def load_image_dataset(name: str, data_dir: str | os.PathLike | None = None, download: bool = True) -> ImageData:
    """Load dataset ``name`` (a key of :data:`IMAGE_DATASETS`) from ``data_dir`` or the default places.

    When the files are nowhere, ``download=True`` fetches the official ones (md5-checked) into
    ``data_dir`` or the default download folder; ``download=False`` raises ``FileNotFoundError``
    saying what is missing and where to get it.
    """
    info = _info(name)
    roots = [Path(data_dir).expanduser()] if data_dir is not None else default_dirs(info)
    if data_dir is not None and roots[0].is_file():
        raise NotADirectoryError(f"{roots[0]} is a file, not a folder of {info.title}'s files")
    # where a download goes: the first folder not a system one (a --data-dir naming the system folder: that folder)
    target = next((r for r in roots if r not in info.system_dirs), roots[0])
    found = next((f for f in map(info.locate, roots) if f is not None), None)
    if found is None:
        if not download:
            raise FileNotFoundError(_missing_message(info, roots, target))
        for remote in info.files:
            # A file the user has, gzipped or not, is kept: download() never overwrites.
            if not (target / remote.filename.removesuffix(".gz")).exists():
                try:
                    _download(remote.url, target / remote.filename, remote.md5)
                except DownloadError as err:  # offline: say the other way to get the files too, where there is one
                    if not info.hint:
                        raise
                    raise DownloadError(f"{err}, {info.hint}") from None
        found = info.locate(target)
        if found is None:
            raise FileNotFoundError(_missing_message(info, [target], target))
    train_x, train_y, test_x, test_y = info.read(found)
    mean, std = channel_stats(train_x)
    return ImageData(info.name, train_x, train_y, test_x, test_y, info.num_classes, mean, std, info.flip)


def dataset_dirs(name: str) -> list[Path]:
    """Where the image task looks for dataset ``name`` when no folder is given, in order."""
    return default_dirs(_info(name))


def default_dirs(info: DatasetInfo) -> list[Path]:
    """Where ``info`` is looked for when no ``data_dir`` is given, in order (see the module docstring)."""
    env = os.environ.get("SKIPLAB_DATA")
    dirs = [Path(env).expanduser() / info.name] if env else []
    return [*dirs, *info.system_dirs, Path("~/.cache/skiplab").expanduser() / info.name]


def channel_stats(x: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and population std of uint8 images ``x`` (N, C, H, W) scaled to [0, 1].

    Computed from a 256-bin histogram per channel, exactly in float64, without materialising a
    float copy of the images (CIFAR's would take 1.2 GB).
    """
    values = torch.arange(256, dtype=torch.float64) / 255
    means, stds = [], []
    for c in range(x.shape[1]):
        counts = torch.bincount(x[:, c].reshape(-1), minlength=256).to(torch.float64)
        n = counts.sum()
        mean = (counts * values).sum() / n
        means.append(float(mean))
        stds.append(float(((counts * (values - mean) ** 2).sum() / n).sqrt()))
    return tuple(means), tuple(stds)


def _info(name: str) -> DatasetInfo:
    key = name.strip().lower().replace("_", "-")
    if key not in IMAGE_DATASETS:
        raise ValueError(f"unknown image dataset {name!r}; known: {', '.join(IMAGE_DATASETS)}")
    return IMAGE_DATASETS[key]


def _missing_message(info: DatasetInfo, roots: list[Path], target: Path) -> str:
    looked = f" (looked in {', '.join(map(str, roots))})" if len(roots) > 1 else ""
    urls = ", ".join(f.url for f in info.files)
    hint = f", {info.hint}" if info.hint else ""
    return (
        f"{info.title} not found: {info.missing(target)}{looked}; "
        f"download {urls} into {target}{hint}, or load with download=True"
    )
