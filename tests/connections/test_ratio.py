"""The learned skip-to-residual ratio of krSkip+G (Appendix A of the rSkip+LN paper).

The reference here never uses the ratio formula: it replays the recursion of Eq. 4 on the inputs of a real
forward pass to get every norm's input, freezes those statistics, and reads the coefficients of x and F off the resulting affine map
y = A·x + B·F + C by evaluation at unit inputs. The ratio is A / B, averaged over positions.
"""

import copy

import pytest
import torch

import skiplab
from tests.conftest import DIM, make_branch, make_input, randomise_affine
from tests.noise import assert_within_noise, noise


def frozen_stats(norm, h):
    """(μ, σ, w, b) of ``norm`` at input ``h``, shaped to broadcast against ``h``."""
    conv = h.dim() == 4
    w = norm.weight.detach()
    b = norm.bias.detach() if getattr(norm, "bias", None) is not None else torch.zeros_like(w)
    if conv:
        w, b = w.view(1, -1, 1, 1), b.view(1, -1, 1, 1)
    name = type(norm).__name__
    h = h.detach()
    if "BatchNorm" in name:
        dims = tuple(d for d in range(h.dim()) if d != (1 if conv else h.dim() - 1))
        keep = dict(dim=dims, keepdim=True)
        if norm.training:
            mu, var = h.mean(**keep), h.var(unbiased=False, **keep)
        else:
            shape = (1, -1, 1, 1) if conv else (-1,)
            mu, var = norm.running_mean.view(shape), norm.running_var.view(shape)
        return mu, torch.sqrt(var + norm.eps), w, b
    dims = (1, 2, 3) if conv else (-1,)
    if "RMS" in name:
        return torch.zeros(()), torch.sqrt((h**2).mean(dims, keepdim=True) + norm.eps), w, b
    mu = h.mean(dims, keepdim=True)
    return mu, torch.sqrt(((h - mu) ** 2).mean(dims, keepdim=True) + norm.eps), w, b


def affine_coefficients(conn, x, branch):
    """Run ``conn`` once, then each norm's statistics at its input; return (A, B, y, y_frozen)."""
    y = conn(x, branch)
    stats, out = [], branch(x).detach()
    for m in conn.norms:  # h_i = x + y_{i-1} (y_0 = F), normalised with the statistics of h_i itself
        stats.append(frozen_stats(m, x + out))
        mu, sigma, w, b = stats[-1]
        out = w * (x + out - mu) / sigma + b

    def frozen(xv, fv):
        out = fv
        for mu, sigma, w, b in stats:
            out = w * (xv + out - mu) / sigma + b
        return out

    fx = branch(x).detach()
    zero, one = torch.zeros_like(fx), torch.ones_like(fx)
    base = frozen(zero, zero)
    return frozen(one, zero) - base, frozen(zero, one) - base, y.detach(), frozen(x.detach(), fx)


def reported_and_expected(conn, x, branch, layout):
    """The connection's reported ratio, A / B averaged over positions, the output and its frozen affine form."""
    A, B, y, y_frozen = affine_coefficients(conn, x, branch)
    ratio = A / B
    per_feature = ratio.mean(tuple(d for d in range(ratio.dim()) if d != (1 if layout == "conv" else ratio.dim() - 1)))
    return conn.stats()["ratio"], per_feature, y, y_frozen


@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize("norm,mode", [("LN", "train"), ("RMS", "train"), ("BN", "train"), ("BN", "eval")])
def test_reported_ratio_is_the_ratio_of_the_coefficients_of_x_and_f(k, norm, mode, layout):
    conn = skiplab.connection(f"{k}rSkip+{norm}", DIM, layout)
    randomise_affine(conn)
    x, branch = make_input(layout), make_branch(layout)
    if mode == "eval":
        conn(x * 2 + 1, branch)  # move the running statistics away from their start
        conn.eval()
    conn64, x64, branch64 = copy.deepcopy(conn).double(), x.detach().double(), copy.deepcopy(branch).double()
    reported, expect, y, y_frozen = reported_and_expected(conn, x, branch, layout)
    reported64, expect64, y64, y_frozen64 = reported_and_expected(conn64, x64, branch64, layout)
    # each side against itself in float64 measures the float32 noise (tests/noise.py)
    assert_within_noise(y_frozen, y, noise((y, y64), (y_frozen, y_frozen64)))  # the frozen form is the output
    assert_within_noise(reported, expect, noise((expect, expect64), (reported, reported64)))


def test_2rskip_ratio_is_sigma1_over_w1_plus_1():
    """Eq. 6, per position: x : F = σ_1 / w_1 + 1."""
    conn = skiplab.connection("2rSkip+LN", DIM)
    randomise_affine(conn)
    x, branch = make_input("seq"), make_branch("seq")
    h1 = (x + branch(x)).detach()
    sigma1 = torch.sqrt(h1.var(-1, unbiased=False, keepdim=True) + 1e-5)
    conn(x, branch)
    expect = (sigma1 / conn.norms[0].weight.detach() + 1).mean((0, 1))
    torch.testing.assert_close(conn.stats()["ratio"], expect)
    assert conn.stats()["ratio_mean"] == pytest.approx(expect.mean().item())


def test_1rskip_ratio_is_one_and_no_forward_means_no_ratio():
    assert torch.equal(skiplab.connection("1rSkip+LN", DIM).stats()["ratio"], torch.ones(DIM))
    fresh = skiplab.connection("2rSkip+LN", DIM).stats()
    assert fresh["k"] == 2 and fresh["ratio"] is None and fresh["ratio_mean"] is None
