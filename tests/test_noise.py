"""tests/noise.py: another summation order passes its tolerance, a real difference does not."""

import pytest
import torch

from tests.noise import EPS32, assert_within_noise, noise


def layer_sum(w, x):
    """Σ_n tanh(W x_n / 16): sums of 256 and of 64 terms."""
    return torch.tanh(x @ w.T / 16).sum(0)


def test_float32_rounding_passes_and_a_real_difference_fails():
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(32, 256, generator=g), torch.randn(64, 256, generator=g)
    ref, ref64 = layer_sum(w, x), layer_sum(w.double(), x.double())
    other = sum(layer_sum(w, x[n : n + 1]) for n in reversed(range(64)))  # one at a time, last first
    assert not torch.equal(other, ref)  # the same sums in another order: other rounding
    level = noise((ref, ref64))
    assert 0 < level < 1e-5 * ref64.abs().max()
    assert_within_noise(other, ref, level)
    w[0, 0] *= 1.001  # one weight in 8192 moved by a thousandth
    with pytest.raises(AssertionError):
        assert_within_noise(layer_sum(w, x), ref, level)


def test_the_noise_is_never_below_one_float32_ulp():
    exact = torch.tensor([0.25, -3.0], dtype=torch.float64)
    assert noise((exact.float(), exact)) == EPS32 * 3.0  # float32 holds these exactly: the floor
    assert noise((exact.float() + torch.tensor([0.0, 1e-3]), exact)) == pytest.approx(1e-3, rel=1e-4)
    assert_within_noise(torch.tensor([1, 2]), torch.tensor([1, 2]), 0.0)  # integers: equal
    with pytest.raises(AssertionError):
        assert_within_noise(torch.tensor([1, 2]), torch.tensor([1, 3]), 1.0)
