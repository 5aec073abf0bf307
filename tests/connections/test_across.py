"""Designs across a stack's layers (``+ValueRes``, ``+UNet``): the spec grammar, their formulas against a hand-written
forward pass, the special cases (λ = 0 is the plain model), gradients, and the families that refuse them."""

import math
import re

import pytest
import torch
import torch.nn.functional as F

import skiplab
from skiplab.connections import available_connections, parse_spec
from skiplab.models import GPT, GPTConfig, PreActResNetConfig, Transformer, TransformerConfig
from tests.connections.test_formulas import ln


def gpt(spec, layers=4, **kw):
    torch.manual_seed(0)
    cfg = dict(vocab_size=30, d_model=16, heads=2, layers=layers, ffn_dim=32, context=12, positions="learned",
               connection=spec)
    return GPT(GPTConfig(**{**cfg, **kw})).eval()


def tokens(b=2, t=9):
    return torch.randint(0, 30, (b, t), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("text, canonical, names", [
    ("PreLN+ValueRes", "PreLN+ValueRes", ["ValueRes"]),
    ("LNS+ValueRes(lambda=0.25,learn=yes)", "LNS+ValueRes(lambda=0.25,learn=yes)", ["ValueRes"]),
    ("LNS+RMS+ValueRes(lambda=0.25)", "PreRMS(scale=depth)+ValueRes(lambda=0.25)", ["ValueRes"]),
    ("MixLN+RMS(alpha=0.5)+UNet(init=1)+ValueRes(lambda=0.5)", "MixLN+RMS(alpha=0.5)+UNet+ValueRes", ["UNet", "ValueRes"]),
    ("2rSkip+LN+UNet(init=0.5)", "2rSkip+LN+UNet(init=0.5)", ["UNet"]),
    ("PostLN", "1xSkip+LN", []),
])
def test_the_grammar_reads_designs_across_the_stack_after_the_connection(text, canonical, names):
    conn = skiplab.connection(text, 8)
    assert conn.spec == canonical and [s.name for s in parse_spec(text).stack] == names
    assert parse_spec(conn.spec) == parse_spec(text)  # the canonical form reads back to the same spec
    assert parse_spec(text).norm == parse_spec(canonical.split("+ValueRes")[0].split("+UNet")[0]).norm


@pytest.mark.parametrize("text, problem", [
    ("PreLN+UNet+UNet", "UNet is given twice"),
    ("PreLN+UNet(depth=2)", "UNet has no option 'depth'"),
    ("PreLN+ValueRes(learn=maybe)", "option learn: must be one of no, yes"),
    ("PreLN+ValueRes(lambda=nan)", "option lambda: must be in [0, 1], got nan"),
    ("PreLN+Unet", "+Unet is neither a normalisation (LN, BN, RMS, DyT) nor a design across the stack (ValueRes, "
                   "UNet, DenseFormer, MUDD, AttnRes, Scalars, Backout) (did you mean +UNet? names are case-sensitive)"),
    ("PreLN+ValueRes+Foo", "+Foo is neither a normalisation"),
])
def test_bad_designs_across_the_stack_are_named(text, problem):
    with pytest.raises(ValueError, match=re.escape(problem)):
        parse_spec(text)


def test_they_are_listed_with_their_formulas():
    listed = available_connections()
    assert "V_1" in listed["+ValueRes(lambda=0.5,learn=no|yes)"] and "w_i" in listed["+UNet(init=1)"]


def hand_value_residual(m: GPT, x: torch.Tensor, lam: list[float]) -> torch.Tensor:
    """PreLN GPT with learned positions: V'_l = λ_l V_1 + (1 − λ_l) V_l for l >= 2, attention written out."""
    b, t = x.shape
    h = m.embed(x) + m.pos_embed.weight[:t]
    v1 = None
    for i, layer in enumerate(m.layers):
        a, n1, n2 = layer.attn, layer.conn_attn.norm, layer.conn_mlp.norm
        q, k, v = (z.view(b, t, a.heads, -1).transpose(1, 2) for z in a.qkv_proj(ln(h, n1.weight, n1.bias)).chunk(3, -1))
        if i == 0:
            v1 = v
        else:
            v = lam[i - 1] * v1 + (1 - lam[i - 1]) * v
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
        h = h + a.out_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, -1))
        h = h + layer.mlp(ln(h, n2.weight, n2.bias))
    return F.linear(ln(h, m.norm.weight, m.norm.bias), m.embed.weight)


@torch.no_grad()
def test_value_residual_mixes_the_first_layers_values_into_every_later_layer():
    m = gpt("PreLN+ValueRes(learn=yes)")
    lam = [0.3, -0.2, 0.8]
    m.across.designs[0].lam.copy_(torch.tensor(lam))
    x = tokens()
    torch.testing.assert_close(m(x), hand_value_residual(m, x, lam))
    fixed = gpt("PreLN+ValueRes")  # λ = 0.5 fixed: a buffer, no parameter
    assert fixed.across.designs[0].lam.tolist() == [0.5] * 3 and not list(fixed.across.parameters())
    torch.testing.assert_close(fixed(x), hand_value_residual(fixed, x, [0.5] * 3))


@pytest.mark.parametrize("family", ["gpt", "transformer"])
@torch.no_grad()
def test_value_residual_with_lambda_0_is_the_plain_model(family):
    def build(spec):
        torch.manual_seed(0)
        if family == "gpt":
            return gpt(spec)
        return Transformer(TransformerConfig(vocab_size=30, d_model=16, heads=2, ffn_dim=32, encoder_layers=3,
                                             decoder_layers=2, dropout=0, attention_dropout=0, connection=spec)).eval()

    plain, mixed = build("PreLN"), build("PreLN+ValueRes(lambda=0)")
    missing, unexpected = mixed.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and all(".lam" in k for k in missing) and missing
    x = tokens()
    args = (x,) if family == "gpt" else (x, x)
    assert torch.equal(mixed(*args), plain(*args))
    with torch.no_grad():
        for name, buf in mixed.named_buffers():
            if name.endswith(".lam"):
                buf.fill_(0.5)
    assert not torch.allclose(mixed(*args), plain(*args))


def hand_unet(m: GPT, x: torch.Tensor, w: list[float]) -> torch.Tensor:
    """Layers called one by one: layer h + i's input gets w_i times layer h − 1 − i's output, h = ⌊L/2⌋."""
    h, half, outs = m.embed(x), len(m.layers) // 2, []
    for i, layer in enumerate(m.layers):
        if half <= i < 2 * half:
            h = h + w[i - half] * outs[2 * half - 1 - i]
        h = layer(h)
        outs.append(h)
    return F.linear(m.norm(h), m.embed.weight)


@pytest.mark.parametrize("layers, w", [(4, [0.7, -1.3]), (5, [2.0, 0.4]), (1, [])])
@torch.no_grad()
def test_unet_adds_the_first_halfs_outputs_to_the_second_half_last_in_first_out(layers, w):
    m = gpt("PreLN+UNet", layers=layers, positions="rope")
    unet = m.across.designs[0]
    assert unet.weight.tolist() == [1.0] * (layers // 2)  # the code's torch.ones; odd L: the last layer has none
    unet.weight.copy_(torch.tensor(w))
    x = tokens()
    torch.testing.assert_close(m(x), hand_unet(m, x, w))
    if layers > 1:
        unet.weight.zero_()
        torch.testing.assert_close(m(x), hand_unet(m, x, [0.0] * len(w)))
        assert not torch.allclose(hand_unet(m, x, w), hand_unet(m, x, [0.0] * len(w)))


def test_the_learned_weights_get_gradients_in_both_families():
    m = gpt("HC(n=2)+ValueRes(learn=yes)+UNet")
    F.cross_entropy(m(tokens()).flatten(0, 1), tokens().flatten()).backward()
    vr, unet = m.across.designs
    assert vr.lam.grad.abs().min() > 0 and unet.weight.grad.abs().min() > 0
    stats = m.across.stats()
    assert torch.equal(stats["ValueRes"]["value_lambda"], vr.lam.detach()) and stats["UNet"]["skip_weight"].tolist() == [1.0, 1.0]
    t = Transformer(TransformerConfig(vocab_size=30, d_model=16, heads=2, ffn_dim=32, encoder_layers=2,
                                      decoder_layers=4, connection="PreLN+ValueRes(learn=yes)+UNet"))
    t(tokens(), tokens()).sum().backward()
    for stack in (t.encoder, t.decoder):
        assert all(p.grad is not None and p.grad.abs().min() > 0 for p in stack.across.parameters())


@pytest.mark.parametrize("spec", ["PreLN+ValueRes", "1xSkip+UNet"])
def test_the_resnet_refuses_them_with_the_reason(spec):
    with pytest.raises(ValueError, match=r"has no attention and its stages change width"):
        PreActResNetConfig(connection=spec)
