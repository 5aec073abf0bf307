"""HybridNorm (Zhuo et al. 2025, arXiv 2503.04598): the attention's QKV-norm by hand, the layers by hand (attention
y = x + Attn_QKV(x), FFN y = G(x + FFN(x)), HybridNorm*'s pre-norm first layer), outputs and gradients at width 64,
each comparison failing under a mutation; incremental decoding, both Transformer stacks, the refusals."""

import re

import pytest
import torch
import torch.nn.functional as F

from skiplab.connections import hybridnorm, parse_spec
from skiplab.models import GPT, GPTConfig, Transformer, TransformerConfig, model_config
from skiplab.models.attention import SelfAttention
from tests.connections.model_checks import gpt_step_and_incremental_decoding, tiny_resnet
from tests.connections.test_denseformer import decoding_steps_give_the_full_pass, tokens


def randomise(model, seed=6):
    """Every norm's gain and bias away from 1 and 0."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (torch.nn.LayerNorm, torch.nn.RMSNorm)):
                m.weight.copy_(1 + 0.3 * torch.randn(m.weight.shape, generator=g, dtype=m.weight.dtype))
                if getattr(m, "bias", None) is not None:
                    m.bias.copy_(0.3 * torch.randn(m.bias.shape, generator=g, dtype=m.bias.dtype))


def ln(x, norm):
    return F.layer_norm(x, x.shape[-1:], norm.weight, norm.bias, norm.eps)


def attention_by_hand(attn: SelfAttention, x: torch.Tensor) -> torch.Tensor:
    """q, k, v each LayerNorm-ed over the d features after their projection, then causal softmax attention."""
    w_q, w_k, w_v = attn.qkv_proj.weight.chunk(3)
    b_q, b_k, b_v = attn.qkv_proj.bias.chunk(3)
    q = ln(x @ w_q.T + b_q, attn.q_norm.norm)
    k = ln(x @ w_k.T + b_k, attn.k_norm.norm)
    v = ln(x @ w_v.T + b_v, attn.v_norm.norm)
    b, t, d = x.shape
    h = attn.heads
    q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
    scores = q @ k.transpose(-1, -2) / (d // h) ** 0.5
    scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
    return attn.out_proj(out)


def agree(got, want, params):
    torch.testing.assert_close(got, want)
    w = torch.randn(got.shape, generator=torch.Generator().manual_seed(2), dtype=got.dtype)
    for a, b in zip(torch.autograd.grad((got * w).sum(), params), torch.autograd.grad((want * w).sum(), params)):
        torch.testing.assert_close(a, b)


def qkv_attention():
    torch.manual_seed(0)
    attn = SelfAttention(64, 4, qk_norm="qkv").double()
    randomise(attn)
    return attn, torch.randn(2, 7, 64, dtype=torch.float64, requires_grad=True)


def test_qkv_norm_is_the_three_layer_norms_by_hand():
    attn, x = qkv_attention()
    agree(attn(x, causal=True), attention_by_hand(attn, x), [x, *attn.parameters()])


def test_the_attention_comparison_fails_without_the_value_norm():
    attn, x = qkv_attention()
    want = attention_by_hand(attn, x)
    attn.v_norm = None
    with pytest.raises(AssertionError):
        torch.testing.assert_close(attn(x, causal=True), want)


def gpt(spec, layers=3):
    torch.manual_seed(0)
    m = GPT(model_config(f"gpt-mini(connection={spec})", vocab_size=40, d_model=64, heads=4, layers=layers,
                         ffn_dim=128, context=16)).double()
    randomise(m)
    return m


def layers_by_hand(m: GPT, x: torch.Tensor, star: bool) -> torch.Tensor:
    h = m.embed(x)
    for i, layer in enumerate(m.layers):
        attn = lambda u: layer.attn(u, causal=True)  # noqa: E731
        if star and i == 0:  # HybridNorm*: the first layer pre-norm in both sub-layers
            h = h + attn(ln(h, layer.conn_attn.norm))
            h = h + layer.mlp(ln(h, layer.conn_mlp.norm))
        else:
            h = h + attn(h)
            h = ln(h + layer.mlp(h), layer.conn_mlp.norm)
    return m.logits(ln(h, m.norm))


@pytest.mark.parametrize("spec, star", [("HybridNorm", False), ("HybridNorm(star=yes)", True)])
def test_the_layers_are_the_papers_by_hand_outputs_and_gradients(spec, star):
    m = gpt(spec)
    assert m.cfg.qk_norm == "qkv"
    x = tokens()
    agree(m(x), layers_by_hand(m, x, star), list(m.parameters()))


def test_the_layer_comparison_fails_when_the_ffn_is_pre_norm(monkeypatch):
    m = gpt("HybridNorm")
    x = tokens()
    want = layers_by_hand(m, x, star=False)
    for layer in m.layers:
        monkeypatch.setattr(layer.conn_mlp, "at", "pre")
    with pytest.raises(AssertionError):
        torch.testing.assert_close(m(x), want)


def test_the_recipe_sets_qkv_norm_and_a_model_without_it_is_refused():
    assert model_config("gpt-mini(connection=HybridNorm)").qk_norm == "qkv"
    assert model_config("transformer-small(connection=HybridNorm)").qk_norm == "qkv"
    for spec in ("gpt-mini(connection=HybridNorm,qk_norm=all)", "transformer-small(decoder_connection=HybridNorm)"):
        with pytest.raises(ValueError, match=re.escape("HybridNorm needs the model option qk_norm=qkv")):
            model_config(spec)
    with pytest.raises(ValueError, match=re.escape("HybridNorm is a Transformer layer's design (its part inside the "
                                                   "attention: qk_norm=qkv); the PreAct-ResNet has no attention")):
        tiny_resnet("HybridNorm")


def test_each_sub_layer_reports_where_its_norm_is():
    m = gpt("HybridNorm(star=yes)")
    assert m.layers[0].conn_attn.stats() == {"pre_norm": 1.0, "post_norm": 0.0}
    assert m.layers[1].conn_attn.stats() == {"pre_norm": 0.0, "post_norm": 0.0} and m.layers[1].conn_attn.norm is None
    assert m.layers[1].conn_mlp.stats() == {"pre_norm": 0.0, "post_norm": 1.0}
    assert parse_spec("HybridNorm(star=no)").options["star"] == "no"
    assert m.layers[2].conn_mlp.spec == "HybridNorm+LN(star=yes)"


def test_the_gpt_trains_a_step_and_decodes_incrementally():
    torch.manual_seed(0)
    model = GPT(model_config("gpt-mini(connection=HybridNorm+RMS)", vocab_size=50, d_model=32, heads=4, layers=2,
                             ffn_dim=64, context=16, norm="RMS"))
    assert isinstance(model.layers[0].attn.v_norm.norm, torch.nn.RMSNorm)
    gpt_step_and_incremental_decoding(model)


def test_both_transformer_stacks_and_cross_attention_normalise_the_values():
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(vocab_size=40, d_model=64, heads=4, ffn_dim=128, encoder_layers=3,
                                          decoder_layers=3, connection="HybridNorm", qk_norm="qkv")).double().eval()
    assert model.decoder.layers[0].cross_attn.v_norm is not None
    randomise(model)
    src = torch.randint(0, 40, (2, 7), generator=torch.Generator().manual_seed(3))
    tgt = torch.randint(0, 40, (2, 6), generator=torch.Generator().manual_seed(4))
    F.cross_entropy(model(src, tgt).transpose(1, 2), tgt).backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if "v_norm" in n)
    decoding_steps_give_the_full_pass(model.eval(), src, tgt)


def test_the_module_docstring_cites_the_authors_config():
    assert "use_value_norm" in hybridnorm.HybridNorm.__doc__ and "ffn_residual_after_norm" in hybridnorm.HybridNorm.__doc__
    cfg = GPTConfig(connection="HybridNorm", qk_norm="qkv")
    assert cfg.qk_norm == "qkv"
