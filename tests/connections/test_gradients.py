"""Gradient scaling through stacks of blocks (Section 3 and Fig. 3 of the rSkip+LN paper)."""

import torch

import skiplab


def zero_branch(x):
    return torch.zeros_like(x)


def input_gradient(spec: str, depth: int = 10, dim: int = 32) -> tuple[float, float]:
    """Mean |dL/dx| at the input and at the output of a stack of ``depth`` blocks with F = 0."""
    torch.manual_seed(0)
    blocks = [skiplab.connection(spec, dim) for _ in range(depth)]
    x = torch.randn(8, dim, requires_grad=True)
    h = x
    for block in blocks:
        h = block(h, zero_branch)
    h.retain_grad()
    (h * torch.randn_like(h)).sum().backward()  # a random read-out: the sum of an LN output is constant
    return x.grad.abs().mean().item(), h.grad.abs().mean().item()


def test_2xskip_stack_multiplies_the_gradient_by_2_to_the_depth():
    g_in, g_out = input_gradient("2xSkip")
    assert g_in / g_out == 2.0**10


def test_2xskip_ln_stack_keeps_the_gradient_within_a_small_factor():
    g_in, g_out = input_gradient("2xSkip+LN")
    assert 0.25 < g_in / g_out < 4.0
    g_in, g_out = input_gradient("2rSkip+LN")
    assert 0.25 < g_in / g_out < 4.0


def test_0_5xskip_stack_vanishes():
    g_in, g_out = input_gradient("0.5xSkip")
    assert g_in / g_out == 0.5**10
