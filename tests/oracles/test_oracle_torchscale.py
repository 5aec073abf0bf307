"""skiplab's DeepNorm against microsoft/torchscale's (``DecoderConfig(deepnorm=True)``, ``EncoderDecoderConfig(
deepnorm=True)``): the skip weight α of every sub-layer, and the branch initialisation, compared as standard
deviations by role (query, key, value, output, feed-forward), for decoder-only and encoder-decoder stacks at two
depths each.

The two draw the branch from different base initialisations (torchscale: fairseq's, Xavier-uniform with gain 1/√2
on q, k, v, PyTorch's default on the feed-forward layers, then the value, output and feed-forward weights divided by
its ``init_scale``; skiplab: DeepNet's Fig. 2, Xavier-normal with gain β on value, output and feed-forward, gain 1
on query and key). What is compared is the factor DeepNorm applies to each role: torchscale's deepnorm weights'
std over the same model's without it (drawn from the same seed), against skiplab's weights' std over the
Xavier-normal std of their shape. torchscale also divides those layers' biases; skiplab leaves biases as the model
draws them (DeepNet's Fig. 2 names the weights).

One disagreement, by design: torchscale's encoder of an encoder-decoder model divides by (N⁴M)^{1/16} / 1.15, a
β of 1.15 (N⁴M)^{−1/16}, where the paper's table has 0.87 (N⁴M)^{−1/16} (0.87 ≈ 1/1.15): skiplab follows the paper.
"""

import importlib.machinery
import importlib.metadata
import math
import sys
import types

import pytest
import torch

from skiplab.models import GPT, GPTConfig, Transformer, TransformerConfig

TORCHSCALE_VERSION = "0.3.0"  # the version these comparisons were checked against
D, FFN, HEADS = 64, 256, 4


def _import_torchscale():
    """torchscale's architectures. torchscale imports one symbol from timm (``timm.models.layers.drop_path``, used
    only with ``drop_path_rate`` > 0), and timm would pull torchvision and another torch: it is not installed. A
    stand-in module serves that import and is taken out of ``sys.modules`` again, so that no other code finds a
    "timm"."""
    names = ("timm", "timm.models", "timm.models.layers")
    fakes = {name: types.ModuleType(name) for name in names}
    for name, module in fakes.items():
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)

    def drop_path(*args, **kwargs):
        raise RuntimeError("stand-in for timm's drop_path: these tests build torchscale with drop_path_rate = 0")

    fakes["timm.models.layers"].drop_path = drop_path
    fakes["timm"].models, fakes["timm.models"].layers = fakes["timm.models"], fakes["timm.models.layers"]
    saved = {name: sys.modules[name] for name in names if name in sys.modules}
    sys.modules.update(fakes)
    try:
        from torchscale.architecture.config import DecoderConfig, EncoderDecoderConfig
        from torchscale.architecture.decoder import Decoder
        from torchscale.architecture.encoder_decoder import EncoderDecoder
    finally:
        for name in names:
            del sys.modules[name]
        sys.modules.update(saved)
    return DecoderConfig, EncoderDecoderConfig, Decoder, EncoderDecoder


DecoderConfig, EncoderDecoderConfig, TSDecoder, TSEncoderDecoder = _import_torchscale()
ROLES = {"q_proj": "query", "k_proj": "key", "v_proj": "value", "out_proj": "output", "fc1": "ffn", "fc2": "ffn"}


def test_checked_against_the_installed_version():
    assert importlib.metadata.version("torchscale") == TORCHSCALE_VERSION, (
        "torchscale changed: check the comparisons in this module and update TORCHSCALE_VERSION")


def torchscale_roles(layers) -> dict[str, list[torch.Tensor]]:
    out: dict[str, list[torch.Tensor]] = {}
    for layer in layers:
        for name, p in layer.named_parameters():
            part, kind = name.split(".")[-2:]
            if kind == "weight" and part in ROLES:
                out.setdefault(ROLES[part], []).append(p.detach())
    return out


def torchscale_factors(build, **shape) -> dict[str, dict[str, float]]:
    """Per stack, per role: the std of torchscale's deepnorm weights over its plain ones, the same seed."""
    torch.manual_seed(0)
    deep = build(deepnorm=True, **shape)
    torch.manual_seed(0)
    plain = build(deepnorm=False, subln=False, **shape)  # subln would rescale too: the plain fairseq init
    factors = {}
    for stack in deep:
        a, b = torchscale_roles(deep[stack]), torchscale_roles(plain[stack])
        factors[stack] = {role: math.sqrt(sum(w.pow(2).sum() for w in a[role]) / sum(w.pow(2).sum() for w in b[role]))
                          for role in a}
    return factors


def skiplab_factors(stacks: dict[str, list]) -> dict[str, dict[str, float]]:
    """Per stack, per role: the std of skiplab's weights over the Xavier-normal std of their shapes (gain 1)."""
    factors = {}
    for stack, sublayers in stacks.items():
        by_role: dict[str, list[torch.Tensor]] = {}
        for sub in sublayers:
            for role, ws in sub.projections().items():
                by_role.setdefault(role, []).extend(w.detach() for w in ws)
        factors[stack] = {role: math.sqrt(sum(w.pow(2).sum() for w in ws)
                                          / sum(w.numel() * 2 / sum(w.shape) for w in ws)) for role, ws in by_role.items()}
    return factors


def decoder_only(layers: int):
    def build(**flags):
        cfg = DecoderConfig(decoder_layers=layers, decoder_embed_dim=D, decoder_ffn_embed_dim=FFN,
                            decoder_attention_heads=HEADS, vocab_size=10, no_output_layer=True, **flags)
        return {"decoder": TSDecoder(cfg).layers}
    torch.manual_seed(1)
    ours = GPT(GPTConfig(vocab_size=10, d_model=D, heads=HEADS, layers=layers, ffn_dim=FFN, context=8,
                         connection="DeepNorm"))
    stacks = {"decoder": [m for layer in ours.layers for m in (layer.attn, layer.mlp)]}
    conns = {"decoder": [c for layer in ours.layers for c in (layer.conn_attn, layer.conn_mlp)]}
    return build, stacks, conns


def encoder_decoder(n: int, m: int):
    def build(**flags):
        cfg = EncoderDecoderConfig(encoder_layers=n, decoder_layers=m, encoder_embed_dim=D, decoder_embed_dim=D,
                                   encoder_ffn_embed_dim=FFN, decoder_ffn_embed_dim=FFN, encoder_attention_heads=HEADS,
                                   decoder_attention_heads=HEADS, vocab_size=10, no_output_layer=True, **flags)
        model = TSEncoderDecoder(cfg)
        return {"encoder": model.encoder.layers, "decoder": model.decoder.layers}
    torch.manual_seed(1)
    ours = Transformer(TransformerConfig(vocab_size=10, d_model=D, heads=HEADS, ffn_dim=FFN, encoder_layers=n,
                                         decoder_layers=m, connection="DeepNorm"))
    stacks = {"encoder": [s for layer in ours.encoder.layers for s in (layer.self_attn, layer.ffn)],
              "decoder": [s for layer in ours.decoder.layers for s in (layer.self_attn, layer.cross_attn, layer.ffn)]}
    conns = {"encoder": [c for layer in ours.encoder.layers for c in (layer.conn_attn, layer.conn_ffn)],
             "decoder": [c for layer in ours.decoder.layers for c in (layer.conn_self, layer.conn_cross, layer.conn_ffn)]}
    return build, stacks, conns


@pytest.mark.parametrize("layers", [6, 18])
def test_decoder_only_alpha_beta_and_branch_init_are_torchscales(layers):
    build, stacks, conns = decoder_only(layers)
    ts_layers = build(deepnorm=True)["decoder"]
    alpha, beta = (2 * layers) ** 0.25, (8 * layers) ** -0.25  # DeepNet, Fig. 2: decoder-only
    for conn in conns["decoder"]:
        assert conn.alpha == pytest.approx(alpha, rel=1e-12) and conn.beta == pytest.approx(beta, rel=1e-12)
    assert all(layer.alpha == pytest.approx(alpha, rel=1e-12) for layer in ts_layers)
    theirs = torchscale_factors(build)["decoder"]
    ours = skiplab_factors(stacks)["decoder"]
    for role in ("value", "output", "ffn"):
        assert theirs[role] == pytest.approx(beta, rel=1e-6)
        assert ours[role] == pytest.approx(theirs[role], rel=0.03)  # a sample's std: 3% is > 6 standard errors
    for role in ("query", "key"):
        assert theirs[role] == pytest.approx(1.0, rel=1e-6)
        assert ours[role] == pytest.approx(1.0, rel=0.03)


@pytest.mark.parametrize("n,m", [(6, 6), (12, 4)])
def test_encoder_decoder_alpha_beta_and_branch_init_against_torchscale(n, m):
    build, stacks, conns = encoder_decoder(n, m)
    model = build(deepnorm=True)
    paper = {"encoder": (0.81 * (n**4 * m) ** (1 / 16), 0.87 * (n**4 * m) ** (-1 / 16)),  # DeepNet, Fig. 2
             "decoder": ((3 * m) ** 0.25, (12 * m) ** -0.25)}
    theirs, ours = torchscale_factors(build), skiplab_factors(stacks)
    for stack, (alpha, beta) in paper.items():
        for conn in conns[stack]:
            assert conn.alpha == pytest.approx(alpha, rel=1e-12) and conn.beta == pytest.approx(beta, rel=1e-12)
        assert all(layer.alpha == pytest.approx(alpha, rel=1e-12) for layer in model[stack])  # α agrees everywhere
        for role in ("query", "key"):
            assert theirs[stack][role] == pytest.approx(1.0, rel=1e-6)
            assert ours[stack][role] == pytest.approx(1.0, rel=0.03)
        for role in ("value", "output", "ffn"):
            assert ours[stack][role] == pytest.approx(beta, rel=0.03)
    for role in ("value", "output", "ffn"):
        assert theirs["decoder"][role] == pytest.approx(paper["decoder"][1], rel=1e-6)
        assert ours["decoder"][role] == pytest.approx(theirs["decoder"][role], rel=0.03)
        # the encoder: torchscale's β is 1.15 (N⁴M)^(-1/16) (encoder.py: init_scale = (N⁴M)^(1/16) / 1.15), the
        # paper's and skiplab's 0.87 (N⁴M)^(-1/16)
        assert theirs["encoder"][role] == pytest.approx(1.15 * (n**4 * m) ** (-1 / 16), rel=1e-6)
        assert ours["encoder"][role] / theirs["encoder"][role] == pytest.approx(0.87 / 1.15, rel=0.03)
