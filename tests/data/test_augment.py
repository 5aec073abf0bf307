"""Batch augmentation (random crop after zero padding, random horizontal flip) and normalisation."""

from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F

from skiplab.data import augment_batch, normalise


def images(b: int = 64, c: int = 3, seed: int = 0, dtype=torch.uint8) -> torch.Tensor:
    """A batch with no zero pixels, so every window of the padded image is told apart by its content."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 256, (b, c, 32, 32), generator=g).to(dtype)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_shape_and_dtype(dtype):
    x = images(dtype=dtype)
    out = augment_batch(x, gen())
    assert out.shape == x.shape and out.dtype == dtype


def test_identity_without_pad_and_flip():
    x = images()
    assert torch.equal(augment_batch(x, gen(), pad=0, flip=False), x)


def test_flip_only_mirrors_about_half():
    x = images(b=256)
    out = augment_batch(x, gen(3), pad=0, flip=True)
    same = (out == x).flatten(1).all(1)
    mirrored = (out == x.flip(-1)).flatten(1).all(1)
    assert bool((same | mirrored).all())
    assert 64 < int(mirrored.sum()) < 192  # Binomial(256, 1/2): far outside this is a bug, not chance


def test_crop_is_a_window_of_the_padded_image():
    x = images(b=64, c=2)
    out = augment_batch(x, gen(5), pad=4, flip=False)
    padded = F.pad(x, (4, 4, 4, 4))
    offsets = []
    for i in range(len(x)):
        windows = {(dy, dx): padded[i, :, dy : dy + 32, dx : dx + 32] for dy in range(9) for dx in range(9)}
        hits = [offset for offset, window in windows.items() if torch.equal(out[i], window)]
        assert len(hits) == 1, f"example {i} is not exactly one window of its padded input"
        offsets.append(hits[0])
    assert len(set(offsets)) > 20  # offsets are drawn per example, not once per batch
    assert len({dy for dy, _ in offsets}) >= 6 and len({dx for _, dx in offsets}) >= 6  # both axes move


def test_crop_and_flip_together():
    x = images(b=32)
    out = augment_batch(x, gen(7), pad=4, flip=True)
    padded = F.pad(x, (4, 4, 4, 4))
    for i in range(len(x)):
        windows = [padded[i, :, dy : dy + 32, dx : dx + 32] for dy in range(9) for dx in range(9)]
        assert any(torch.equal(out[i], w) or torch.equal(out[i], w.flip(-1)) for w in windows)


def test_same_seed_same_output():
    x = images()
    assert torch.equal(augment_batch(x, gen(11)), augment_batch(x, gen(11)))
    assert not torch.equal(augment_batch(x, gen(11)), augment_batch(x, gen(12)))


def test_input_unchanged_and_bad_input():
    x = images(b=8)
    before = x.clone()
    augment_batch(x, gen())
    assert torch.equal(x, before)
    with pytest.raises(ValueError, match="expected a batch"):
        augment_batch(x[0], gen())
    with pytest.raises(ValueError, match="pad must be >= 0"):
        augment_batch(x, gen(), pad=-1)


def test_normalise():
    x = images(b=4)
    mean, std = (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)
    out = normalise(x, mean, std)
    assert out.dtype == torch.float32 and out.shape == x.shape
    for c in range(3):
        assert torch.allclose(out[:, c], (x[:, c].float() / 255 - mean[c]) / std[c])
    with pytest.raises(ValueError, match="1 means and 1 stds for 3 channels"):
        normalise(x, (0.5,), (0.2,))
