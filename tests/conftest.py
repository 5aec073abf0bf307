import os

import pytest
import torch
from torch import nn

DIM = 6

# Optional packages. A test that needs one the test extras install (a reference implementation, a tokenizer, the
# COCO metrics) takes it with pytest.importorskip, so that an environment without it runs the rest. Under `make
# test` (SKIPLAB_REQUIRE_EXTRAS=1, as CI runs it) every one is there to be had, and a skip for a package that could
# not be imported fails the run, naming the tests: a reference that is gone is a check lost, not a skip.
REQUIRE_EXTRAS = "SKIPLAB_REQUIRE_EXTRAS"
_missing: list[str] = []


def _note_missing(report) -> None:
    if not report.skipped:
        return
    reason = str(report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr)
    if "could not import" in reason:
        _missing.append(f"{report.nodeid}: {reason.removeprefix('Skipped: ')}")


def pytest_collectreport(report):
    _note_missing(report)


def pytest_runtest_logreport(report):
    _note_missing(report)


def _required() -> bool:
    return os.environ.get(REQUIRE_EXTRAS) == "1"


def pytest_sessionfinish(session, exitstatus):
    if _missing and _required() and exitstatus == 0:
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _missing and _required():
        terminalreporter.section(f"optional packages missing ({REQUIRE_EXTRAS}=1: a failure)", red=True)
        for line in _missing:
            terminalreporter.line(line)


def make_input(layout: str, dim: int = DIM, seed: int = 0) -> torch.Tensor:
    """A batch in the layout: (B, T, C) for seq, (N, C, H, W) for conv; not centred, not unit scale."""
    g = torch.Generator().manual_seed(seed)
    shape = (3, 5, dim) if layout == "seq" else (4, dim, 3, 3)
    return (torch.randn(shape, generator=g) * 1.7 + 0.3).requires_grad_()


def make_branch(layout: str, dim: int = DIM, seed: int = 1) -> nn.Module:
    """A small non-linear branch F that keeps the shape."""
    torch.manual_seed(seed)
    if layout == "seq":
        return nn.Sequential(nn.Linear(dim, dim), nn.Tanh(), nn.Linear(dim, dim))
    return nn.Sequential(nn.Conv2d(dim, dim, 3, padding=1), nn.Tanh(), nn.Conv2d(dim, dim, 1))


def randomise_affine(module: nn.Module, seed: int = 2) -> None:
    """Move every norm's gain and bias away from 1 and 0, so formulas that ignore them fail."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() == 1 and ("norm" in name or name.startswith("weight")):
                p.copy_(p + 0.5 * torch.randn(p.shape, generator=g))


@pytest.fixture(params=["seq", "conv"])
def layout(request):
    return request.param


def idx_bytes(array, dims=None, magic=None) -> bytes:
    """An IDX file of uint8 ``array``; ``dims``/``magic`` override the header to make bad files."""
    import struct

    import numpy as np

    dims = array.shape if dims is None else dims
    magic = (0x0800 | len(dims)) if magic is None else magic
    return struct.pack(f">I{len(dims)}I", magic, *dims) + np.ascontiguousarray(array, dtype=np.uint8).tobytes()


def write_idx(path, raw: bytes):
    """Write ``raw`` to ``path``, gzipped when the name ends in .gz."""
    import gzip

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(raw) if path.suffix == ".gz" else raw)
    return path


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """Keep a test off the real ~/.cache and $SKIPLAB_DATA, and off the network."""
    import urllib.request

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SKIPLAB_DATA", raising=False)

    def no_network(*args, **kwargs):
        raise AssertionError("a test tried to reach the network")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)


def write_fashion_mnist(root, n_train: int = 256, n_test: int = 64, seed: int = 0):
    """A tiny dataset in Fashion-MNIST's files: 28x28 grey images whose brightness depends on the class."""
    import numpy as np

    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("t10k", n_test)):
        labels = rng.integers(0, 10, n)
        images = rng.integers(0, 80, (n, 28, 28)) + labels[:, None, None] * 17
        write_idx(root / f"{split}-images-idx3-ubyte.gz", idx_bytes(images))
        write_idx(root / f"{split}-labels-idx1-ubyte.gz", idx_bytes(labels))
    return root


@pytest.fixture(scope="session")
def fashion_dir(tmp_path_factory):
    return write_fashion_mnist(tmp_path_factory.mktemp("fashion"))
