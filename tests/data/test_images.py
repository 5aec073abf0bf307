"""load_image_dataset: the four datasets from test-written folders, default places, download paths."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

from skiplab.data import IMAGE_DATASETS, DownloadError, ImageData, default_dirs, download, load_image_dataset
from skiplab.data.images import RemoteFile
from tests.data.test_cifar import N, write_cifar
from tests.data.test_idx import write_idx_dataset

# name -> (train size, test size, classes, channels, flip) of the tiny test-written copies
EXPECTED = {
    "cifar10": (5 * N, N, 10, 3, True),
    "cifar100": (N, N, 100, 3, True),
    "fashion-mnist": (6, 3, 10, 1, True),
    "mnist": (6, 3, 10, 1, False),
}


def write_dataset(root: Path, name: str) -> None:
    if name.startswith("cifar"):
        write_cifar(root, name)
    else:
        write_idx_dataset(root, n_train=6, n_test=3)


pytestmark = pytest.mark.usefixtures("offline")  # off ~/.cache, $SKIPLAB_DATA and the network


@pytest.mark.parametrize("name", list(EXPECTED))
def test_loads_each_dataset(tmp_path, name):
    write_dataset(tmp_path / name, name)
    data = load_image_dataset(name, data_dir=tmp_path / name, download=False)
    n_train, n_test, classes, channels, flip = EXPECTED[name]
    assert isinstance(data, ImageData) and data.name == name
    assert data.train_x.shape == (n_train, channels, 32, 32) and data.test_x.shape == (n_test, channels, 32, 32)
    assert data.train_x.dtype == torch.uint8 and data.test_x.dtype == torch.uint8
    assert data.train_y.dtype == torch.int64 and data.train_y.shape == (n_train,) and data.test_y.shape == (n_test,)
    assert data.num_classes == classes and data.channels == channels and data.flip is flip
    assert int(data.train_y.max()) < classes and int(data.train_y.min()) >= 0
    flat = (data.train_x.double() / 255).transpose(0, 1).reshape(channels, -1)
    assert data.mean == pytest.approx(flat.mean(1).tolist(), abs=1e-12)
    assert data.std == pytest.approx(flat.std(1, correction=0).tolist(), abs=1e-12)
    assert all(isinstance(v, float) for v in (*data.mean, *data.std))


def test_registry_names():
    assert list(IMAGE_DATASETS) == ["cifar10", "cifar100", "fashion-mnist", "mnist"]
    assert all(info.description for info in IMAGE_DATASETS.values())


def test_unknown_name_lists_known_ones():
    with pytest.raises(ValueError, match="unknown image dataset 'svhn'; known: cifar10, cifar100, fashion-mnist, mnist"):
        load_image_dataset("svhn")


def test_name_spelling_is_forgiving(tmp_path):
    write_dataset(tmp_path, "fashion-mnist")
    assert load_image_dataset("Fashion_MNIST", data_dir=tmp_path, download=False).name == "fashion-mnist"


def test_archive_in_data_dir(tmp_path):
    write_cifar(tmp_path, "cifar100", archive=True)
    assert load_image_dataset("cifar100", data_dir=tmp_path, download=False).train_x.shape == (N, 3, 32, 32)


def test_default_dirs(tmp_path, monkeypatch):
    cache = tmp_path / "home" / ".cache" / "skiplab"
    assert default_dirs(IMAGE_DATASETS["mnist"]) == [cache / "mnist"]
    assert default_dirs(IMAGE_DATASETS["fashion-mnist"]) == [
        Path("/usr/share/datasets/fashion-mnist"),
        cache / "fashion-mnist",
    ]
    monkeypatch.setenv("SKIPLAB_DATA", str(tmp_path / "data"))
    assert default_dirs(IMAGE_DATASETS["cifar10"]) == [tmp_path / "data" / "cifar10", cache / "cifar10"]


def test_skiplab_data_then_cache(tmp_path, monkeypatch):
    write_dataset(tmp_path / "home" / ".cache" / "skiplab" / "mnist", "mnist")
    assert load_image_dataset("mnist", download=False).train_x.shape[0] == 6  # found in the cache
    monkeypatch.setenv("SKIPLAB_DATA", str(tmp_path / "data"))
    write_idx_dataset(tmp_path / "data" / "mnist", n_train=2, n_test=1)
    assert load_image_dataset("mnist", download=False).train_x.shape[0] == 2  # $SKIPLAB_DATA comes first


@pytest.mark.parametrize(
    "name, missing", [("cifar10", "cifar-10-python.tar.gz"), ("mnist", "train-images-idx3-ubyte.gz")]
)
def test_absent_files_without_download(tmp_path, name, missing):
    with pytest.raises(FileNotFoundError) as err:
        load_image_dataset(name, data_dir=tmp_path, download=False)
    message = str(err.value)
    assert missing in message and str(tmp_path) in message and "https://" in message and "\n" not in message


def test_absent_fashion_mnist_mentions_the_debian_package(tmp_path):
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
        load_image_dataset("fashion-mnist", data_dir=tmp_path, download=False)


@pytest.mark.parametrize("where", ["connect", "mid-stream"])
def test_offline_download_says_what_to_put_where(tmp_path, monkeypatch, where):
    def urlopen(url, timeout=None):
        if where == "connect":
            raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")
        return _Response(b"partial bytes", fail_after=True)

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    with pytest.raises(DownloadError, match="this machine seems offline") as err:
        load_image_dataset("cifar10", data_dir=tmp_path / "c10", download=True)
    message = str(err.value)
    assert "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz" in message
    assert str(tmp_path / "c10" / "cifar-10-python.tar.gz") in message and "\n" not in message
    assert list(tmp_path.iterdir()) == []  # no partial file, not even a hidden one, nor the folder made for it


def test_a_failed_download_removes_the_folders_it_made_and_keeps_the_others(tmp_path, monkeypatch):
    """A mistyped --data-dir is not left behind, made and empty; a folder that was there stays, and one that a
    first file reached keeps it."""
    def urlopen(url, timeout=None):
        raise urllib.error.URLError("[Errno -2] Name or service not known")

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    with pytest.raises(DownloadError):
        load_image_dataset("fashion-mnist", data_dir=tmp_path / "typo" / "fm", download=True)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "mine").mkdir()
    with pytest.raises(DownloadError):
        load_image_dataset("fashion-mnist", data_dir=tmp_path / "mine", download=True)
    assert (tmp_path / "mine").is_dir() and list((tmp_path / "mine").iterdir()) == []
    served = {"n": 0}

    def first_only(url, timeout=None):
        served["n"] += 1
        if served["n"] > 1:
            raise urllib.error.URLError("gone")
        return io.BytesIO(b"one file")

    monkeypatch.setattr(urllib.request, "urlopen", first_only)
    info = IMAGE_DATASETS["fashion-mnist"]
    monkeypatch.setitem(IMAGE_DATASETS, "fashion-mnist",
                        dataclasses.replace(info, files=tuple(dataclasses.replace(f, md5=None) for f in info.files)))
    with pytest.raises(DownloadError):
        load_image_dataset("fashion-mnist", data_dir=tmp_path / "half", download=True)
    assert [p.name for p in (tmp_path / "half").iterdir()] == [IMAGE_DATASETS["fashion-mnist"].files[0].filename]


def test_a_data_dir_that_is_a_file_is_one_line(tmp_path):
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(b"x")
    with pytest.raises(NotADirectoryError) as err:
        load_image_dataset("fashion-mnist", data_dir=tmp_path / "train-images-idx3-ubyte.gz")
    assert str(err.value) == f"{tmp_path / 'train-images-idx3-ubyte.gz'} is a file, not a folder of Fashion-MNIST's files"
    with pytest.raises(NotADirectoryError, match=r"is a file, not a folder that x.gz can be downloaded into"):
        download("http://unused", tmp_path / "train-images-idx3-ubyte.gz" / "x.gz", None)


def test_offline_fashion_mnist_names_the_debian_package_too(tmp_path, monkeypatch):
    """Offline, with the files nowhere: the one line says where to put the download and the package that has them."""
    def urlopen(url, timeout=None):
        raise urllib.error.URLError("[Errno -2] Name or service not known")

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    with pytest.raises(DownloadError, match="this machine seems offline") as err:
        load_image_dataset("fashion-mnist", data_dir=tmp_path / "fm", download=True)
    message = str(err.value)
    assert str(tmp_path / "fm" / "train-images-idx3-ubyte.gz") in message and "\n" not in message
    assert message.endswith("or run `apt-get install dataset-fashion-mnist` (puts them in "
                            f"{IMAGE_DATASETS['fashion-mnist'].system_dirs[0]})")


def test_checksum_mismatch_leaves_no_file(tmp_path, monkeypatch):
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout=None: io.BytesIO(b"<html>moved</html>"))
    with pytest.raises(ValueError, match="checksum mismatch .* expected md5 f68b3c2dcbeaaa9fbdd348bbdeb94873, got"):
        load_image_dataset("mnist", data_dir=tmp_path, download=True)
    assert list(tmp_path.iterdir()) == []


def test_download_then_load(tmp_path, monkeypatch):
    """The happy path: the archive is fetched, checked, placed, then read."""
    write_cifar(tmp_path / "server", "cifar10", archive=True)
    served = (tmp_path / "server" / "cifar-10-python.tar.gz").read_bytes()
    info = IMAGE_DATASETS["cifar10"]
    remote = RemoteFile("https://example.invalid/c10.tar.gz", "cifar-10-python.tar.gz", hashlib.md5(served).hexdigest())
    monkeypatch.setitem(IMAGE_DATASETS, "cifar10", dataclasses.replace(info, files=(remote,)))
    calls = []
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout=None: calls.append(url) or io.BytesIO(served))
    data = load_image_dataset("cifar10", data_dir=tmp_path / "data")
    assert calls == [remote.url] and data.train_x.shape == (5 * N, 3, 32, 32)
    assert [p.name for p in (tmp_path / "data").iterdir()] == ["cifar-10-python.tar.gz"]
    assert (tmp_path / "data" / "cifar-10-python.tar.gz").read_bytes() == served
    load_image_dataset("cifar10", data_dir=tmp_path / "data")
    assert len(calls) == 1  # present now: not fetched again


def test_download_never_overwrites(tmp_path):
    dest = tmp_path / "file.gz"
    dest.write_bytes(b"mine")
    assert download("https://example.invalid/file.gz", dest, "0" * 32) == dest  # urlopen would raise
    assert dest.read_bytes() == b"mine"


class _Response(io.BytesIO):
    """A response whose connection drops after the first chunk."""

    def __init__(self, data: bytes, fail_after: bool):
        super().__init__(data)
        self.fail_after, self.reads = fail_after, 0

    def read(self, size=-1):
        self.reads += 1
        if self.fail_after and self.reads > 1:
            raise TimeoutError("timed out")
        return super().read(size)


def test_a_data_dir_that_is_the_system_folder_is_read(tmp_path, monkeypatch):
    """--data-dir naming the folder the Debian package fills (where the data README says the files are): read, not a
    StopIteration from looking for a folder to download into."""
    system = tmp_path / "usr-share"
    write_dataset(system, "fashion-mnist")
    monkeypatch.setitem(IMAGE_DATASETS, "fashion-mnist",
                        dataclasses.replace(IMAGE_DATASETS["fashion-mnist"], system_dirs=(system,)))
    assert load_image_dataset("fashion-mnist", data_dir=system, download=False).train_x.shape[0] == 6


def test_a_download_stopped_by_sigterm_leaves_nothing_and_a_killed_ones_file_goes_next_time(tmp_path, monkeypatch):
    """SIGTERM (``timeout``'s signal) killed the process without the clean-up: its partial file and the folders
    it made stayed, and files of downloads killed outright were never removed."""
    script = (f"import sys; sys.path.insert(0, {str(Path(__file__).parents[2])!r})\n"
              "import io, os, signal, urllib.request\n"
              "from pathlib import Path\n"
              "from skiplab.data.download import download\n"
              "class Slow(io.BytesIO):\n"
              "    def read(self, n=-1):\n"
              "        os.kill(os.getpid(), signal.SIGTERM)  # mid-download\n"
              "        return b'x' * 10\n"
              "urllib.request.urlopen = lambda url, timeout=None: Slow()\n"
              f"download('http://unused', Path({str(tmp_path / 'made' / 'f.gz')!r}), None)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    assert list(tmp_path.iterdir()) == []
    stale = tmp_path / ".f.gz.999999999.abc123.part"  # a process id no process has
    mine = tmp_path / f".f.gz.{os.getpid()}.abc123.part"  # a download still running (this process)
    older = tmp_path / ".f.gz.abc123.part"  # named before process ids were: left alone
    for p in (stale, mine, older):
        p.write_bytes(b"partial")
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout=None: io.BytesIO(b"whole"))
    download("http://unused", tmp_path / "f.gz", None)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([mine.name, older.name, "f.gz"])
