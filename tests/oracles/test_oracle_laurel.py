"""skiplab's ``LAuReL(form=lr,norm=rms)`` against Gemma 3n's LAuReL block in transformers
(``Gemma3nTextLaurelBlock``, models/gemma3n/modeling_gemma3n.py), the same weights.

Gemma's block maps the normalised input h to h + RMSNorm(W_R W_L h) (``linear_left``, ``linear_right``,
``post_laurel_norm``); skiplab's connection adds x + F(h) + RMSNorm(B A h), h = G(x). So with F, G and the weights
shared, skiplab's output is x + F(h) + (Gemma's block on h) − h, and that is what is compared, outputs and gradients
(of x, A, B, the norms' gains and the branch's weights). The mapping (skiplab ← transformers): A = ``linear_left.weight``
(r × D), B = ``linear_right.weight`` (D × r), the low-rank norm's gain = ``post_laurel_norm.weight`` (Gemma 3n's
RMSNorm multiplies by its weight, not 1 + weight), ε = ``rms_norm_eps`` = 1e-5 (skiplab's; Gemma 3n's default is
1e-6). Width 64, rank 8, random weights, float32 (Gemma's RMSNorm computes in float32 whatever its input).

What the comparison does not cover, by design (the connection's docstring): Gemma 3n adds h itself to the stream
and scales (x + attn + laurel) by 1/√2, around attention only. The last test mutates the connection (the low-rank
term read from x instead of h; the RMSNorm's ε 1e-3) and shows the comparison then fails.
"""

import copy
import importlib.metadata

import pytest
import torch
from torch import nn

import skiplab
from skiplab.connections import laurel, norms

Gemma3nTextConfig = pytest.importorskip("transformers.models.gemma3n.configuration_gemma3n").Gemma3nTextConfig
Gemma3nTextLaurelBlock = pytest.importorskip("transformers.models.gemma3n.modeling_gemma3n").Gemma3nTextLaurelBlock

TRANSFORMERS_VERSION = "5.24.0"  # the version this mapping was checked against
D, RANK = 64, 8
EPS = 1e-5  # Gemma's rms_norm_eps here: skiplab's norms' ε (Gemma 3n's default is 1e-6)


def test_checked_against_the_installed_version():
    assert importlib.metadata.version("transformers") == TRANSFORMERS_VERSION, (
        "transformers changed: check the mapping in this module and update TRANSFORMERS_VERSION")


def gemma_block(conn) -> Gemma3nTextLaurelBlock:
    block = Gemma3nTextLaurelBlock(Gemma3nTextConfig(hidden_size=D, laurel_rank=RANK, rms_norm_eps=EPS))
    with torch.no_grad():
        block.linear_left.weight.copy_(conn.a)
        block.linear_right.weight.copy_(conn.b)
        block.post_laurel_norm.weight.copy_(conn.lr_norm.weight)
    return block


def compare(pre_norm: str = "RMS"):
    torch.manual_seed(0)
    conn = skiplab.connection(f"LAuReL+{pre_norm}(form=lr,rank={RANK},norm=rms)", D)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # random weights: A, B of unit-scale products, the gains and biases off 1 and 0
        conn.a.copy_(torch.randn(RANK, D, generator=g) / D**0.5)
        conn.b.copy_(torch.randn(D, RANK, generator=g) / RANK**0.5)
        for name, p in conn.named_parameters():
            if "norm" in name:
                p.add_(0.5 * torch.randn(p.shape, generator=g))
    block = gemma_block(conn)
    pre = copy.deepcopy(conn.norm)  # G, shared by value
    branch = nn.Sequential(nn.Linear(D, 2 * D), nn.Tanh(), nn.Linear(2 * D, D))
    branch_ref = copy.deepcopy(branch)

    x = torch.randn(2, 7, D, generator=g).mul_(1.5).add_(0.2).requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    y = conn(x, branch)
    h = pre(x_ref)
    y_ref = x_ref + branch_ref(h) + block(h) - h
    torch.testing.assert_close(y, y_ref, rtol=2e-5, atol=2e-5)

    w = torch.randn(y.shape, generator=g)
    (y * w).sum().backward()
    (y_ref * w).sum().backward()
    pairs = [(x.grad, x_ref.grad), (conn.a.grad, block.linear_left.weight.grad),
             (conn.b.grad, block.linear_right.weight.grad), (conn.lr_norm.weight.grad, block.post_laurel_norm.weight.grad)]
    pairs += [(p.grad, q.grad) for p, q in zip(conn.norm.parameters(), pre.parameters())]
    pairs += [(p.grad, q.grad) for p, q in zip(branch.parameters(), branch_ref.parameters())]
    for got, want in pairs:
        assert want.abs().max() > 1e-3  # a gradient to compare
        torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("pre_norm", ["RMS", "LN"])
def test_low_rank_term_gives_gemma3n_laurel_outputs_and_gradients(pre_norm):
    compare(pre_norm)


def test_the_comparison_fails_when_the_design_is_mutated(monkeypatch):
    """The low-rank term read from the residual stream x (the paper's LR placement) instead of the normalised h;
    skiplab's norms' ε 1e-3 (Gemma's stays 1e-5): each comparison fails."""

    def reads_x(self, x, branch, skip=None):
        return x + branch(self.norm(x)) + self.low_rank(x)

    with monkeypatch.context() as m:
        m.setattr(laurel.LAuReL, "forward", reads_x)
        with pytest.raises(AssertionError):
            compare()
    with monkeypatch.context() as m:
        m.setattr(norms, "EPS", 1e-3)  # skiplab's norms only: Gemma's block keeps EPS, 1e-5
        with pytest.raises(AssertionError):
            compare()
