"""Keel (Chen and Wei 2026, arXiv 2601.19895): y = G(α·x + F(G(x))) by hand, outputs and gradients; α and the first
layer's exceptions from the Place; a GPT of Keel blocks against OLMo-core's ``KeelTransformerBlock`` forward as read
(allenai/OLMo-core ``src/olmo_core/nn/transformer/block.py`` at a1f35ea; no released ai2-olmo-core, 3.0.0 the
latest, has the block, so its forward is written out here), shown to fail under mutations; the models build,
train a step and decode incrementally."""

import copy

import pytest
import torch
import torch.nn.functional as F

import skiplab
from skiplab import Place
from skiplab.connections import keel as keel_mod
from skiplab.models import GPT, GPTConfig
from tests.connections.model_checks import (gpt_step_and_incremental_decoding, resnet_step, tiny_gpt, tiny_resnet,
                                            tiny_transformer, transformer_step)
from tests.connections.test_formulas import EPS, ln
from tests.conftest import DIM, make_branch, make_input, randomise_affine


def rms(h, w):
    return h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + EPS) * w


def norm_by_hand(kind, norm, h):
    return ln(h, norm.weight, norm.bias) if kind == "LN" else rms(h, norm.weight)


def grads(loss, tensors):
    return torch.autograd.grad(loss, tensors)


@pytest.mark.parametrize("kind", ["LN", "RMS"])
def test_keel_is_g_of_alpha_x_plus_f_of_g_x_outputs_and_gradients(kind):
    """Layer 2 of a 3-layer decoder-only stack: α = 2 · 3 = 6, y = G_out(6x + F(G_in(x)))."""
    conn = skiplab.connection(f"Keel+{kind}", DIM, place=Place.decoder_only(2, 3, 1, 2, "attn"))
    randomise_affine(conn)
    assert conn.alpha == 6.0 and conn.stats() == {"alpha": 6.0, "post_norm": 1.0}
    x, branch = make_input("seq"), make_branch("seq")
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(3))
    y = conn(x, branch)
    want = norm_by_hand(kind, conn.norm_out, 6 * x + branch(norm_by_hand(kind, conn.norm_in, x)))
    torch.testing.assert_close(y, want)
    params = [x, *conn.parameters(), *branch.parameters()]
    for got, exp in zip(grads((y * dy).sum(), params), grads((want * dy).sum(), params)):
        assert exp.abs().max() > 0
        torch.testing.assert_close(got, exp)


def test_first_layer_is_pre_norm_then_post_norm_without_alpha():
    """OLMo-core's block 0: the attention sub-layer plain pre-norm (no second norm), the FFN G(x + F(G(x)))."""
    x, branch = make_input("seq"), make_branch("seq")
    first = skiplab.connection("Keel", DIM, place=Place.decoder_only(1, 4, 1, 2, "attn"))
    randomise_affine(first)
    assert first.norm_out is None and first.stats() == {"alpha": 1.0, "post_norm": 0.0}
    assert [n for n, _ in first.named_parameters()] == ["norm_in.weight", "norm_in.bias"]
    torch.testing.assert_close(first(x, branch), x + branch(ln(x, first.norm_in.weight, first.norm_in.bias)))
    second = skiplab.connection("Keel", DIM, place=Place.decoder_only(1, 4, 2, 2, "ffn"))
    randomise_affine(second)
    assert second.alpha == 1.0
    inner = branch(ln(x, second.norm_in.weight, second.norm_in.bias))
    torch.testing.assert_close(second(x, branch), ln(x + inner, second.norm_out.weight, second.norm_out.bias))
    later = skiplab.connection("Keel", DIM, place=Place.decoder_only(2, 4, 1, 2, "attn"))
    assert later.alpha == 8.0 and later.norm_out is not None


def test_alpha_counts_the_sub_layers_of_each_stack():
    """α = layers × sub-layers per layer: an encoder of 6 (2 sub-layers) 12, a decoder of 4 (3 sub-layers) 12, a CNN
    stack of 9 blocks (1 sub-layer each) 9; layer 1 of a decoder: self-attention pre-norm, cross and FFN α = 1."""
    assert skiplab.connection("Keel", DIM, place=Place(3, "encoder", 6, 4, 2, 2, "ffn")).alpha == 12.0
    assert skiplab.connection("Keel", DIM, place=Place(2, "decoder", 6, 4, 2, 3, "cross")).alpha == 12.0
    assert skiplab.connection("Keel", DIM, layout="conv", place=Place(5, "encoder", 9, 0)).alpha == 9.0
    cross = skiplab.connection("Keel", DIM, place=Place(1, "decoder", 6, 4, 2, 3, "cross"))
    assert cross.alpha == 1.0 and cross.post
    assert not skiplab.connection("Keel", DIM, place=Place(1, "decoder", 6, 4, 1, 3, "attn")).post


def test_keel_conv_layout_normalises_each_example():
    conn = skiplab.connection("Keel", DIM, layout="conv", place=Place(2, "encoder", 3, 0))
    x, branch = make_input("conv"), make_branch("conv")
    inner = F.group_norm(x, 1, conn.norm_in.weight, conn.norm_in.bias, EPS)
    want = F.group_norm(3 * x + branch(inner), 1, conn.norm_out.weight, conn.norm_out.bias, EPS)
    torch.testing.assert_close(conn(x, branch), want)


def test_keel_takes_the_model_norm_and_adds_no_final_norm():
    assert skiplab.parse_spec("Keel", norm="RMS").norm == "RMS" and skiplab.parse_spec("Keel+LN", norm="RMS").norm == "LN"
    assert isinstance(skiplab.final_norm("Keel", 16, layers=4, norm="RMS"), torch.nn.Identity)
    with pytest.raises(ValueError, match="no normalisation"):
        skiplab.parse_spec("Keel+BN")


# --- the GPT against OLMo-core's KeelTransformerBlock, as read -------------------------------------------------------

def olmo_sized(connection, **kw):
    torch.manual_seed(0)
    cfg = dict(vocab_size=50, d_model=64, heads=4, layers=3, ffn_dim=128, context=16, connection=connection)
    return GPT(GPTConfig(**{**cfg, **kw}))


def olmo_keel_logits(model, tokens):
    """OLMo-core's ``KeelTransformerBlock.forward`` on each layer, its names: ``keel_alpha = 2 * n_layers``;
    ``attn_out = attention(attention_norm(x))``; ``h = x + attn_out`` at ``block_idx == 0`` (no
    ``post_attention_norm``), else ``post_attention_norm(keel_alpha * x + attn_out)``; ``mlp_out =
    feed_forward(feed_forward_norm(h))``; ``post_feed_forward_norm(h + mlp_out)`` at ``block_idx == 0``, else
    ``post_feed_forward_norm(keel_alpha * h + mlp_out)``. Then the tied output layer on the last block's output."""
    keel_alpha = 2 * len(model.layers)
    x = model.embed(tokens)
    for block_idx, layer in enumerate(model.layers):
        attention_norm, feed_forward_norm = layer.conn_attn.norm_in, layer.conn_mlp.norm_in
        post_attention_norm, post_feed_forward_norm = layer.conn_attn.norm_out, layer.conn_mlp.norm_out
        attn_out = layer.attn(attention_norm(x), causal=True)
        h = x + attn_out if block_idx == 0 else post_attention_norm(keel_alpha * x + attn_out)
        mlp_out = layer.mlp(feed_forward_norm(h))
        x = post_feed_forward_norm(h + mlp_out) if block_idx == 0 else post_feed_forward_norm(keel_alpha * h + mlp_out)
    return F.linear(x, model.embed.weight)


def compare_with_olmo_keel(norm="RMS"):
    model = olmo_sized("Keel", norm=norm, mlp="swiglu").double()
    randomise_affine(model)
    assert model.layers[0].conn_attn.norm_out is None  # OLMo-core: no post_attention_norm in block 0
    tokens = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(1))
    reference = copy.deepcopy(model)
    logits, want = model(tokens), olmo_keel_logits(reference, tokens)
    torch.testing.assert_close(logits, want, rtol=1e-10, atol=1e-12)
    w = torch.randn(logits.shape, generator=torch.Generator().manual_seed(2), dtype=logits.dtype)
    (logits * w).sum().backward()
    (want * w).sum().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert q.grad.abs().max() > 0, name
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-10, atol=1e-12, msg=name)


@pytest.mark.parametrize("norm", ["RMS", "LN"])
def test_gpt_of_keel_blocks_gives_olmo_core_keel_outputs_and_gradients(norm):
    compare_with_olmo_keel(norm)


def test_the_olmo_core_comparison_fails_under_mutations(monkeypatch):
    """α the number of layers (the paper's "L" read as layers, 3 for 6 sub-layers), and α on layer 1 too: both fail."""
    with monkeypatch.context() as m:
        m.setattr(keel_mod, "keel_alpha", lambda place: float(place.layers))
        with pytest.raises(AssertionError):
            compare_with_olmo_keel()
    original = keel_mod.Keel.__init__

    def alpha_everywhere(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.alpha = keel_mod.keel_alpha(self.place)

    with monkeypatch.context() as m:
        m.setattr(keel_mod.Keel, "__init__", alpha_everywhere)
        with pytest.raises(AssertionError):
            compare_with_olmo_keel()


# --- the models ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("norm", ["LN", "RMS"])
def test_gpt_of_keel_trains_a_step_and_decodes_incrementally(norm):
    model = tiny_gpt("Keel", norm=norm)
    assert isinstance(model.norm, torch.nn.Identity) and model.layers[1].conn_attn.alpha == 4.0
    gpt_step_and_incremental_decoding(model)


def test_transformer_of_keel_trains_a_step():
    model = tiny_transformer("Keel")
    assert model.encoder.layers[1].conn_attn.alpha == 4.0 and model.decoder.layers[1].conn_cross.alpha == 9.0
    assert isinstance(model.encoder.norm, torch.nn.Identity) and isinstance(model.decoder.norm, torch.nn.Identity)
    transformer_step(model)


def test_preact_resnet_of_keel_trains_a_step():
    """One sub-layer a block: α = the stack's 3 blocks after the first, which is the plain pre-norm block."""
    model = tiny_resnet("Keel")
    assert [b.conn.alpha for b in model.blocks] == [1.0, 3.0, 3.0] and model.blocks[0].conn.norm_out is None
    resnet_step(model)
