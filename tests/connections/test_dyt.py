"""DyT's initial α: 0.5 at every site by default; ``alpha0=llm``, the DyT paper's LLM recipe, by site and width,
with a learned scalar on the embeddings."""

import math

import pytest
import torch
from torch import nn

from skiplab import Place, connection, final_norm, input_norm
from skiplab.connections.norms import DyT, InputScale, dyt_llm_alpha0
from skiplab.models.gpt import GPT, GPTConfig

# Zhu et al. 2025, "Transformers without Normalization" (arXiv 2503.10622), Section 7, optimal α0
# (attention / other): the table by width and depth (Table 12 of arXiv v1, Table 11 of the later version) for
# widths 1024, 2048, 4096, 8192, and the LLaMA 13B row of the table by model (Table 11 of v1, Table 10 later)
# for width 5120.
PAPER = [(1024, 1.0, 1.0), (2048, 1.0, 0.5), (4096, 0.8, 0.2), (5120, 0.6, 0.15), (8192, 0.2, 0.05)]


def site(role: str, layer: int = 1, layers: int = 4) -> Place:
    """A GPT's sub-layer: 1 "attn", 2 "ffn"."""
    return Place.decoder_only(layer, layers, 1 if role == "attn" else 2, 2, role)


def alphas(module: nn.Module) -> list[float]:
    return [m.alpha.item() for m in module.modules() if isinstance(m, DyT)]


@pytest.mark.parametrize("width, attention, other", PAPER)
def test_the_llm_recipe_starts_attention_and_ffn_dyt_at_the_papers_alpha0(width, attention, other):
    spec = "PreDyT(alpha0=llm)"
    assert connection(spec, width, place=site("attn")).norm.alpha.item() == pytest.approx(attention)
    assert connection(spec, width, place=site("ffn")).norm.alpha.item() == pytest.approx(other)
    assert final_norm(spec, width, layers=4).alpha.item() == pytest.approx(other)  # the final DyT is "other"


@pytest.mark.parametrize("width, attention, other", [
    (128, 1.0, 1.0), (768, 1.0, 1.0),  # narrower than every listed width: 1024's
    (1448, 1.0, 1.0), (1449, 1.0, 0.5),  # either side of √(1024·2048) = 1448.2
    (3000, 0.8, 0.2),  # nearer 4096 than 2048 on a log scale (on a linear one 2048 would be nearer)
    (16384, 0.2, 0.05),  # wider than every listed width: 8192's
])
def test_an_unlisted_width_takes_the_nearest_listed_widths_alpha0(width, attention, other):
    assert (dyt_llm_alpha0(width, True), dyt_llm_alpha0(width, False)) == (attention, other)
    assert connection("PreDyT(alpha0=llm)", width, place=site("attn")).norm.alpha.item() == pytest.approx(attention)


def test_the_llm_recipe_reaches_every_dyt_a_plus_dyt_design_holds():
    peri = connection("PeriLN+DyT(alpha0=llm)", 4096, place=site("attn"))
    assert alphas(peri) == pytest.approx([0.8, 0.8])  # the norms around the attention sub-layer
    cross = Place(1, "decoder", 2, 2, 2, 3, "cross")  # the Transformer decoder's cross-attention: "other"
    assert alphas(connection("SandwichLN+DyT(alpha0=llm)", 4096, place=cross)) == pytest.approx([0.2, 0.2])
    post = connection("MixLN+DyT(alpha0=llm)", 2048, place=site("attn", 1, 4))  # layer 1 of 4: post-norm
    pre = connection("MixLN+DyT(alpha0=llm)", 2048, place=site("ffn", 4, 4))
    assert (post.post, pre.post) == (True, False)
    assert (alphas(post), alphas(pre)) == ([1.0], [0.5])
    assert alphas(connection("PreDyT(alpha0=1.5)", 4096, place=site("ffn"))) == [1.5]  # a number: every site


@pytest.mark.parametrize("spec", ["PreDyT", "1xSkip+DyT", "MixLN+DyT", "PeriLN+DyT", "DeepNorm+DyT", "SAS+DyT"])
def test_the_simple_form_starts_every_dyt_at_one_half(spec):
    for role in ("attn", "ffn"):
        found = alphas(connection(spec, 4096, place=site(role)))
        assert found and all(a == 0.5 for a in found)
    assert all(a == 0.5 for a in alphas(final_norm(spec, 4096, layers=4)))
    assert not any(isinstance(m, InputScale) for m in input_norm(spec, 4096).modules())  # no embedding scalar


def test_the_llm_recipe_scales_the_embeddings_by_a_learned_scalar_from_root_d():
    scaled = input_norm("PreDyT(alpha0=llm)", 512)
    assert isinstance(scaled.scale, nn.Parameter) and scaled.scale.item() == pytest.approx(math.sqrt(512))
    x = torch.randn(2, 3, 512)
    torch.testing.assert_close(scaled(x), math.sqrt(512) * x)
    # embeddings that already carry √d (the Transformer's E·√d): the scalar makes that factor learnable, from 1
    assert input_norm("PreDyT(alpha0=llm)", 512, embed_scale=math.sqrt(512)).scale.item() == pytest.approx(1.0)
    # Peri-LN's embedding DyT (an "other" DyT) comes after the scalar
    peri = input_norm("PeriLN+DyT(alpha0=llm)", 4096)
    assert alphas(peri) == pytest.approx([0.2])
    x = torch.randn(2, 4096)
    torch.testing.assert_close(peri(x), peri.inner(64.0 * x))
    assert isinstance(input_norm("PreDyT", 512), nn.Identity)  # the simple form has none
    with pytest.raises(ValueError, match="embed_scale must be a finite number > 0, got 0"):
        input_norm("PreDyT(alpha0=llm)", 512, embed_scale=0)


@torch.no_grad()
def test_a_gpt_with_the_llm_recipe_starts_each_dyt_by_its_site():
    d = 2048  # the paper's 1.0 / 0.5
    model = GPT(GPTConfig(vocab_size=8, d_model=d, heads=2, layers=2, ffn_dim=8, context=4, bias=False,
                          connection="PreDyT(alpha0=llm)"))
    assert [layer.conn_attn.norm.alpha.item() for layer in model.layers] == [1.0, 1.0]
    assert [layer.conn_mlp.norm.alpha.item() for layer in model.layers] == [0.5, 0.5]
    assert model.norm.alpha.item() == 0.5 and model.embed_norm.scale.item() == pytest.approx(math.sqrt(d))
    tokens = torch.tensor([[1, 2, 3]])
    x = model.embed_norm(model.embed(tokens))
    torch.testing.assert_close(x, math.sqrt(d) * model.embed.weight[tokens])  # the embeddings times √d


@pytest.mark.parametrize("shape", [(4, 4, 5), (4, 4, 3, 3), (2, 4, 2, 3, 4), (4, 4)])
def test_conv_dyt_scales_per_channel_whatever_the_spatial_axes(shape):
    """γ and β of a conv-layout DyT lie along the channel axis (axis 1) for (N, C), (N, C, L), (N, C, H, W) and
    (N, C, D, H, W) alike; with N = C a view for four axes put them along the batch axis of a 3-d input, silently."""
    norm = DyT(4, layout="conv", alpha=0.7)
    with torch.no_grad():
        norm.weight.copy_(torch.arange(1.0, 5.0))
        norm.bias.copy_(torch.arange(-2.0, 2.0))
    x = torch.randn(shape)
    along = (1, 4) + (1,) * (len(shape) - 2)
    want = norm.weight.view(along) * torch.tanh(0.7 * x) + norm.bias.view(along)
    torch.testing.assert_close(norm(x), want)
