"""CIFAR-10/100 "python version": official layout round trips, the restricted unpickler, bad files."""

from __future__ import annotations

import builtins
import io
import os
import pickle
import struct
import tarfile
from pathlib import Path

import numpy as np
import pytest

from skiplab.data.cifar import CIFAR10, CIFAR100, locate_cifar, read_cifar
from skiplab.data.safe_pickle import safe_loads

N = 4  # images per batch: tiny, the format is what is under test
SPECS = {"cifar10": CIFAR10, "cifar100": CIFAR100}


def make_batches(name: str, seed: int = 0, n: int = N) -> dict[str, dict]:
    """The batches of a tiny CIFAR in the official format: dicts with bytes keys, uint8 (n, 3072) data."""
    spec, rng = SPECS[name], np.random.default_rng(seed)
    batches = {}
    for i, member in enumerate((*spec.train_members, spec.test_member)):
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        batch = {
            b"batch_label": f"batch {i}".encode(),
            b"data": data,
            b"filenames": [f"img_{i}_{j}.png".encode() for j in range(n)],
        }
        labels = [int(v) for v in rng.integers(0, spec.num_classes, size=n)]
        labels[-1] = spec.num_classes - 1  # the top label must be accepted
        if spec is CIFAR10:
            batch[b"labels"] = labels
        else:
            batch[b"fine_labels"] = labels
            batch[b"coarse_labels"] = [v // 5 for v in labels]
        batches[member] = batch
    return batches


def write_cifar(root: Path, name: str, archive: bool = False, seed: int = 0, n: int = N) -> dict[str, dict]:
    """Write a tiny CIFAR-10/100 (``n`` images a batch) under ``root`` as the extracted folder or the .tar.gz; return
    its batches."""
    spec = SPECS[name]
    batches = make_batches(name, seed, n)
    if spec is CIFAR10:
        meta_name, meta = "batches.meta", {b"num_cases_per_batch": n, b"label_names": [b"c%d" % i for i in range(10)]}
    else:
        meta_name = "meta"
        meta = {b"fine_label_names": [b"f%d" % i for i in range(100)], b"coarse_label_names": [b"k%d" % i for i in range(20)]}
    files = {m: pickle.dumps(b, protocol=2) for m, b in batches.items()}
    files[meta_name] = pickle.dumps(meta, protocol=2)
    write_files(root, spec, files, archive)
    return batches


def write_files(root: Path, spec, files: dict[str, bytes], archive: bool) -> Path:
    """Put ``files`` (member -> bytes) into ``root`` as ``spec.folder/`` or as ``spec.archive``."""
    root.mkdir(parents=True, exist_ok=True)
    if not archive:
        (root / spec.folder).mkdir(exist_ok=True)
        for member, raw in files.items():
            (root / spec.folder / member).write_bytes(raw)
        return root / spec.folder
    with tarfile.open(root / spec.archive, "w:gz") as tar:
        for member, raw in files.items():
            info = tarfile.TarInfo(f"{spec.folder}/{member}")
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    return root / spec.archive


def expected(spec, batches: dict[str, dict]):
    key = spec.label_key
    train_x = np.concatenate([batches[m][b"data"] for m in spec.train_members]).reshape(-1, 3, 32, 32)
    train_y = np.concatenate([batches[m][key] for m in spec.train_members])
    test = batches[spec.test_member]
    return train_x, train_y, test[b"data"].reshape(-1, 3, 32, 32), np.array(test[key])


@pytest.mark.parametrize("archive", [False, True], ids=["folder", "archive"])
@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_round_trip(tmp_path, name, archive):
    spec = SPECS[name]
    batches = write_cifar(tmp_path, name, archive)
    source = locate_cifar(spec, tmp_path)
    assert source == tmp_path / (spec.archive if archive else spec.folder)
    train_x, train_y, test_x, test_y = read_cifar(spec, source)
    assert train_x.shape == (N * len(spec.train_members), 3, 32, 32) and test_x.shape == (N, 3, 32, 32)
    for got, want in zip((train_x, train_y, test_x, test_y), expected(spec, batches)):
        assert np.array_equal(got.numpy(), want)
    assert train_y.dtype.is_floating_point is False and str(train_y.dtype) == "torch.int64"
    # Channel order: each row is 1024 R, then 1024 G, then 1024 B bytes, row-major.
    row = batches[spec.train_members[0]][b"data"][1]
    assert train_x[1, :, 0, 0].tolist() == [row[0], row[1024], row[2048]]
    assert train_x[1, 0, 0, 1] == row[1] and train_x[1, 0, 1, 0] == row[32] and train_x[1, 2, 31, 31] == row[3071]


class _Py2Pickler(pickle._Pickler):
    """Writes every str and bytes as a Python 2 ``str`` (BINSTRING), as the official files do."""

    dispatch = pickle._Pickler.dispatch.copy()

    def _save_py2_str(self, obj):
        raw = obj.encode("latin-1") if isinstance(obj, str) else obj
        if len(raw) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(raw)]) + raw)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(raw)) + raw)
        self.memoize(obj)

    dispatch[bytes] = _save_py2_str
    dispatch[str] = _save_py2_str


def py2_dumps(obj) -> bytes:
    """A pickle as Python 2 with numpy 1.x wrote the CIFAR files: py2 strings, numpy.core globals."""
    out = io.BytesIO()
    _Py2Pickler(out, protocol=2).dump(obj)
    return out.getvalue().replace(b"cnumpy._core.multiarray\n", b"cnumpy.core.multiarray\n")


@pytest.mark.filterwarnings("error")  # no DeprecationWarning from numpy.core either
def test_python2_pickles_like_the_originals(tmp_path):
    batches = make_batches("cifar100")
    assert b"cnumpy.core.multiarray\n_reconstruct" in py2_dumps(batches["train"])
    files = {m: py2_dumps(b) for m, b in batches.items()}
    source = write_files(tmp_path, CIFAR100, files, archive=True)
    for got, want in zip(read_cifar(CIFAR100, source), expected(CIFAR100, batches)):
        assert np.array_equal(got.numpy(), want)


def test_extracted_folder_given_directly(tmp_path):
    write_cifar(tmp_path, "cifar10")
    folder = tmp_path / CIFAR10.folder
    assert locate_cifar(CIFAR10, folder) == folder
    assert read_cifar(CIFAR10, folder)[0].shape == (5 * N, 3, 32, 32)
    assert locate_cifar(CIFAR10, tmp_path / "elsewhere") is None


class _System:
    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


class _Eval:
    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return (builtins.eval, (f"__import__('os').system({self.command!r})",))


@pytest.mark.parametrize("archive", [False, True], ids=["folder", "archive"])
@pytest.mark.parametrize("payload, refused", [(_System, ".system"), (_Eval, ".eval")])
def test_code_in_a_pickle_is_refused_and_not_run(tmp_path, payload, refused, archive):
    marker = tmp_path / "pwned"
    files = {m: pickle.dumps(b, protocol=2) for m, b in make_batches("cifar10").items()}
    # Hidden inside an otherwise normal batch dict, where a loader would not look.
    files["data_batch_3"] = pickle.dumps({b"data": payload(f"touch {marker}"), b"labels": [0]}, protocol=2)
    source = write_files(tmp_path / "d", CIFAR10, files, archive)
    with pytest.raises(ValueError, match="refused to unpickle global") as err:
        read_cifar(CIFAR10, source)
    message = str(err.value)
    assert "data_batch_3" in message and refused in message and "only plain data and numpy arrays" in message
    assert "\n" not in message
    assert not marker.exists()


@pytest.mark.parametrize("protocol", range(2, pickle.HIGHEST_PROTOCOL + 1))
def test_safe_loads_rebuilds_numpy_arrays(protocol):
    value = {b"data": np.arange(12, dtype=np.uint8).reshape(3, 4), "f": np.linspace(0, 1, 5), b"l": [1, 2], b"s": b"x"}
    back = safe_loads(pickle.dumps(value, protocol=protocol), "mem")
    assert back.keys() == value.keys()
    assert np.array_equal(back[b"data"], value[b"data"]) and back[b"data"].dtype == np.uint8
    assert np.array_equal(back["f"], value["f"]) and back[b"l"] == [1, 2] and back[b"s"] == b"x"


def test_safe_loads_refuses_other_classes():
    with pytest.raises(ValueError, match=r"mem: refused to unpickle global collections\.OrderedDict"):
        safe_loads(pickle.dumps(__import__("collections").OrderedDict(a=1), protocol=2), "mem")


def test_truncated_pickle_names_the_file(tmp_path):
    files = {m: pickle.dumps(b, protocol=2) for m, b in make_batches("cifar10").items()}
    files["test_batch"] = files["test_batch"][: len(files["test_batch"]) // 2]
    source = write_files(tmp_path, CIFAR10, files, archive=False)
    with pytest.raises(ValueError, match="test_batch: corrupt or truncated pickle") as err:
        read_cifar(CIFAR10, source)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_archive_names_the_file(tmp_path, damage):
    write_cifar(tmp_path, "cifar100", archive=True)
    archive = tmp_path / CIFAR100.archive
    raw = archive.read_bytes()
    archive.write_bytes(b"\x1f\x8b not really gzip" * 50 if damage == "garbage" else raw[: len(raw) // 2])
    with pytest.raises(ValueError, match=f"{CIFAR100.archive}: corrupt or truncated CIFAR-100 archive") as err:
        read_cifar(CIFAR100, archive)
    assert "\n" not in str(err.value)


def test_archive_without_a_member(tmp_path):
    files = {m: pickle.dumps(b, protocol=2) for m, b in make_batches("cifar10").items()}
    del files["test_batch"]
    archive = write_files(tmp_path, CIFAR10, files, archive=True)
    with pytest.raises(ValueError, match="lacks cifar-10-batches-py/test_batch"):
        read_cifar(CIFAR10, archive)


def test_folder_without_a_member(tmp_path):
    write_cifar(tmp_path, "cifar10")
    (tmp_path / CIFAR10.folder / "data_batch_5").unlink()
    with pytest.raises(FileNotFoundError, match="data_batch_5: missing"):
        read_cifar(CIFAR10, tmp_path / CIFAR10.folder)


BAD_BATCHES = {
    "short rows": ({b"data": np.zeros((2, 3071), np.uint8), b"labels": [0, 1]}, r"shape \(N, 3072\)"),
    "float data": ({b"data": np.zeros((2, 3072), np.float32), b"labels": [0, 1]}, r"uint8 array"),
    "label count": ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]}, "2 images but 1 labels"),
    "label range": ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}, r"labels must lie in \[0, 10\)"),
    "str labels": ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [b"a", b"b"]}, "list of integers"),
    "no labels": ({b"data": np.zeros((2, 3072), np.uint8)}, "no b'labels' entry"),
    "not a dict": ([1, 2, 3], "expected a pickled dict"),
}


@pytest.mark.parametrize("case", BAD_BATCHES)
def test_invalid_batch_is_rejected_naming_the_file(tmp_path, case):
    batch, pattern = BAD_BATCHES[case]
    files = {m: pickle.dumps(b, protocol=2) for m, b in make_batches("cifar10").items()}
    files["data_batch_2"] = pickle.dumps(batch, protocol=2)
    source = write_files(tmp_path, CIFAR10, files, archive=False)
    with pytest.raises(ValueError, match=pattern) as err:
        read_cifar(CIFAR10, source)
    assert str(source / "data_batch_2") in str(err.value) and "\n" not in str(err.value)
