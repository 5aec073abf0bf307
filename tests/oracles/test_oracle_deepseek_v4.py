"""skiplab's mHC against DeepSeek-V4's hyper-connection in transformers (``DeepseekV4HyperConnection`` and the
residual update of ``DeepseekV4DecoderLayer``, models/deepseek_v4/modeling_deepseek_v4.py), the same weights.

The mapping (skiplab ← transformers, per connection):

* φ = ``fn``ᵀ, with the n² columns of φ^res re-ordered: transformers stores H^resᵀ (``comb``, applied as
  combᵀ x, "sum over the FIRST hc axis"), so its row 2n + j·n + i is skiplab's column 2n + i·n + j;
* b^pre, b^post = ``base[:n]``, ``base[n:2n]``; b^res = ``base[2n:]`` as an n × n matrix, transposed; α = ``scale``;
* the sub-layer's own RMSNorm gain = ``input_layernorm.weight`` / ``post_attention_layernorm.weight`` (ε as
  skiplab's, 1e-5: ``rms_norm_eps``); the norm of the flattened streams, x̃, at skiplab's ε (float32's machine ε,
  where transformers uses ``rms_norm_eps``);
* ``hc_eps`` = 0: transformers adds ε = 1e-6 to H^pre and inside Sinkhorn–Knopp, which the paper's Eqs. 8-9 and
  skiplab do not.

Its Sinkhorn–Knopp starts with a softmax over comb's rows, that is H^res's columns, then alternates (H^res's rows,
columns, ...): the paper's M⁽ᵗ⁾ = T_r(T_c(M⁽ᵗ⁻¹⁾)) from M⁽⁰⁾ = exp(H̃^res), as skiplab's. Where the two differ
by design: the initialisation of α (below), and the end of the stack: DeepSeek-V4 collapses the streams with a
learned σ-gated sum (``DeepseekV4HyperHead``) where skiplab sums them, as HC does.

The layer is compared at width 64 (n = 4 streams of 64), outputs and gradients; the last test mutates a constant of
the design (the 2 in H^post = 2σ, the initial α) and shows the comparison then fails.
"""

import copy
import importlib.metadata

import pytest
import torch
from torch import nn

import skiplab
from skiplab import Place
from skiplab.connections import hyper
from skiplab.connections.hyper import PHI_STD

DeepseekV4Config = pytest.importorskip("transformers").DeepseekV4Config
ds = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")

TRANSFORMERS_VERSION = "5.24.0"  # the version this mapping was checked against
D, N = 64, 4


def test_checked_against_the_installed_version():
    assert importlib.metadata.version("transformers") == TRANSFORMERS_VERSION, (
        "transformers changed: check the mapping in this module and update TRANSFORMERS_VERSION")


def config(**kw) -> DeepseekV4Config:
    tiny = dict(hidden_size=D, hc_mult=N, hc_sinkhorn_iters=20, num_hidden_layers=1, vocab_size=16,
                num_attention_heads=2, head_dim=8, q_lora_rank=8, o_groups=1, o_lora_rank=8, moe_intermediate_size=8,
                n_routed_experts=2, num_experts_per_tok=1, index_n_heads=2, index_head_dim=8, index_topk=4)
    return DeepseekV4Config(**{**tiny, **kw})


def order() -> torch.Tensor:
    """transformers' row of ``fn`` (and entry of ``base``) for each of skiplab's columns of φ."""
    res = torch.arange(N * N).view(N, N).t().flatten()  # skiplab's (i, j) is comb's (j, i)
    return torch.cat([torch.arange(2 * N), 2 * N + res])


def copy_across(hc: ds.DeepseekV4HyperConnection, conn) -> None:
    with torch.no_grad():
        conn.phi.copy_(hc.fn[order()].t())
        conn.b_pre.copy_(hc.base[:N]), conn.b_post.copy_(hc.base[N : 2 * N])
        conn.b_res.copy_(hc.base[2 * N :].view(N, N).t())
        conn.alpha.copy_(hc.scale)
    hc.input_norm.eps = torch.finfo(torch.float32).eps  # skiplab's ε for x̃


class Sublayer(nn.Module):
    """A branch standing in for the attention or the MoE, with their call signatures."""

    def __init__(self, f: nn.Module, returns_pair: bool):
        super().__init__()
        self.f, self.returns_pair = f, returns_pair

    def forward(self, h, **kwargs):
        return (self.f(h), None) if self.returns_pair else self.f(h)


def branch(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(D, 2 * D), nn.SiLU(), nn.Linear(2 * D, D))


def pair():
    """transformers' decoder layer, its attention and MoE replaced by small branches, and skiplab's two mHC
    connections (attention, feed-forward) with the same weights."""
    torch.manual_seed(0)
    layer = ds.DeepseekV4DecoderLayer(config(hc_eps=0.0, rms_norm_eps=1e-5), layer_idx=0)
    f_attn, f_ffn = branch(1), branch(2)
    layer.self_attn, layer.mlp = Sublayer(copy.deepcopy(f_attn), True), Sublayer(copy.deepcopy(f_ffn), False)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # the module's parameters start empty (a checkpoint fills them): draw them away from 0
        for hc in (layer.attn_hc, layer.ffn_hc):
            hc.fn.copy_(1.7 / (N * D) ** 0.5 * torch.randn(hc.fn.shape, generator=g))  # logits x̃φ of std ~1.7
            hc.base.copy_(torch.randn(hc.base.shape, generator=g))
            hc.scale.copy_(0.2 + torch.rand(3, generator=g))
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            norm.weight.copy_(1 + 0.3 * torch.randn(D, generator=g))
    conns = [skiplab.connection(f"mHC+RMS(n={N})", D, place=Place.decoder_only(1, 1, s, 2, role))
             for s, role in ((1, "attn"), (2, "ffn"))]
    for hc, norm, conn in zip((layer.attn_hc, layer.ffn_hc), (layer.input_layernorm, layer.post_attention_layernorm),
                              conns):
        copy_across(hc, conn)
        with torch.no_grad():
            conn.norm.weight.copy_(norm.weight)
        assert conn.norm.eps == norm.variance_epsilon
    return layer, conns, (f_attn, f_ffn)


@pytest.mark.parametrize("kernel", [True, False], ids=["kernels", "pytorch"])
def test_mhc_layer_gives_deepseek_v4s_outputs_and_gradients(kernel):
    """Through the CPU kernels (stream mixes, norm-projection, Sinkhorn) and through the PyTorch path CUDA runs."""
    layer, (c_attn, c_ffn), (f_attn, f_ffn) = pair()
    if not kernel:
        c_attn.kernel = c_ffn.kernel = None
    x = (torch.randn(2, 5, N, D, generator=torch.Generator().manual_seed(4)) * 1.5 + 0.3).requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    y = c_ffn(c_attn(x, f_attn), f_ffn)
    y_ref = layer(x_ref)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(5))
    (y * w).sum().backward(), (y_ref * w).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-4, atol=1e-5)
    for conn, hc, norm in ((c_attn, layer.attn_hc, layer.input_layernorm),
                           (c_ffn, layer.ffn_hc, layer.post_attention_layernorm)):
        for got, want in ((conn.phi.grad, hc.fn.grad[order()].t()), (conn.b_pre.grad, hc.base.grad[:N]),
                          (conn.b_post.grad, hc.base.grad[N : 2 * N]),
                          (conn.b_res.grad, hc.base.grad[2 * N :].view(N, N).t()), (conn.alpha.grad, hc.scale.grad),
                          (conn.norm.weight.grad, norm.weight.grad)):
            assert want.abs().max() > 1e-5  # a gradient to compare
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_the_residual_mixing_is_doubly_stochastic_in_both():
    layer, (c_attn, _), _ = pair()
    x = torch.randn(2, 5, N, D, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        _, comb, _ = layer.attn_hc(x)
        _, res, _ = c_attn.weights(x)
    torch.testing.assert_close(res, comb.mT, rtol=1e-5, atol=1e-6)  # H^res = combᵀ
    torch.testing.assert_close(res.sum(-1), torch.ones(2, 5, N))
    torch.testing.assert_close(res.sum(-2), torch.ones(2, 5, N), rtol=0, atol=1e-2)  # converging: 20 iterations


def test_initialisation_takes_the_ports_biases_and_phi_and_the_papers_gating_factors():
    """transformers' ``_init_weights`` for the hyper-connection: ``base`` zeros, ``fn`` ~ N(0, initializer_range²),
    ``scale`` ones. skiplab takes the first two (the mHC paper leaves them open) and the paper's α = 0.01
    (Table 5) for the third."""
    cfg = config()
    torch.manual_seed(0)
    model = ds.DeepseekV4Model(cfg)  # the port's own initialisation runs (post_init)
    hc = model.layers[0].attn_hc
    conn = skiplab.connection(f"mHC(n={N})", D, place=Place.decoder_only(1, 1, 1, 2, "attn"))
    assert torch.equal(hc.base, torch.zeros_like(hc.base))
    assert torch.equal(torch.cat([conn.b_pre, conn.b_post, conn.b_res.t().flatten()]), hc.base.detach())
    assert PHI_STD == cfg.initializer_range
    assert conn.phi.std().item() == pytest.approx(hc.fn.std().item(), rel=0.1)
    assert hc.fn.std().item() == pytest.approx(cfg.initializer_range, rel=0.1)
    assert torch.equal(hc.scale, torch.ones(3))  # the port: α = 1
    assert conn.alpha.tolist() == pytest.approx([0.01] * 3)  # skiplab: the paper's Table 5


def test_the_comparisons_fail_when_a_constant_of_the_design_is_mutated(monkeypatch):
    """H^post = 2.02σ(·) (for Eq. 8's 2σ): the layer's outputs and gradients differ; α starting at 0.0101 (for the
    paper's 0.01): the initialisation check fails."""
    with monkeypatch.context() as m:
        m.setattr(hyper, "POST_GAIN", 2.02)
        with pytest.raises(AssertionError):
            test_mhc_layer_gives_deepseek_v4s_outputs_and_gradients(kernel=True)
    with monkeypatch.context() as m:
        m.setattr(hyper, "MHC_ALPHA", 0.0101)
        with pytest.raises(AssertionError):
            test_initialisation_takes_the_ports_biases_and_phi_and_the_papers_gating_factors()
