"""skiplab's DeepNorm against microsoft/torchscale's (``DecoderConfig(deepnorm=True)``,
``EncoderConfig(deepnorm=True)``, ``EncoderDecoderConfig(deepnorm=True)``), in two parts.

The connection, given the same weights: torchscale's own ``DecoderLayer`` and ``EncoderLayer`` (post-norm, its α, its
LayerNorms) against skiplab's ``DeepNorm`` connections wrapped around the same layer's attention and feed-forward
sub-modules (copies, so that each side's gradients are its own), at torchscale's initialisation with the LayerNorms'
gains and biases drawn away from 1 and 0: outputs and gradients (of the input, the encoder output, the norms and every
weight of the sub-layers), in train mode with dropout 0, in float64, for a decoder-only, an encoder-only and both
stacks of an encoder-decoder model.

The initialisation: the skip weight α of every sub-layer, and the branch initialisation compared as standard
deviations by role (query, key, value, output, feed-forward), for decoder-only and encoder-decoder stacks at width 256
and ≥ 4 layers: ≥ 262k weights a role, so that a role's sample standard deviation has a standard error of ≤ 0.14%
(1/√(2n)); the comparison allows 0.5% (the samples drawn here lie within 0.31%), and a 1% error in a gain fails. The
two draw the branch from different base initialisations (torchscale: fairseq's, Xavier-uniform with gain 1/√2 on q, k,
v, PyTorch's default on the feed-forward layers, then the value, output and feed-forward weights divided by its
``init_scale``; skiplab: DeepNet's Fig. 2, Xavier-normal with gain β on value, output and feed-forward, gain 1 on
query and key). What is compared is the factor DeepNorm applies to each role: torchscale's deepnorm weights' std over
the same model's without it (drawn from the same seed: exact), against skiplab's weights' std over the Xavier-normal
std of their shape. torchscale also divides those layers' biases; skiplab leaves biases as the model draws them
(DeepNet's Fig. 2 names the weights).

One disagreement, by design: torchscale's encoder of an encoder-decoder model divides by (N⁴M)^{1/16} / 1.15, a
β of 1.15 (N⁴M)^{−1/16}, where the paper's table has 0.87 (N⁴M)^{−1/16} (0.87 ≈ 1/1.15): skiplab follows the paper.

Each comparison is shown to fail under a mutation of DeepNorm's constants (α 1% off, β 1% off) or of its formula
(LN(x + αF) for LN(αx + F)).
"""

import copy
import importlib.machinery
import importlib.metadata
import math
import sys
import types

import pytest
import torch

import skiplab
from skiplab import Place
from skiplab.connections import deepnorm
from skiplab.models import GPT, GPTConfig, Transformer, TransformerConfig

TORCHSCALE_VERSION = "0.3.0"  # the version these comparisons were checked against
D, FFN, HEADS = 256, 1024, 4  # the init: ≥ 262k weights a role (4 layers), a sample std to ≤ 0.14% (1/√(2n))
INIT_TOL = 0.005  # twice a 1% error in a gain; the samples drawn here lie within 0.31% of torchscale's factor
LAYER_D, LAYER_FFN, LAYER_HEADS = 64, 256, 4  # the layer comparisons: float64, width 64


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
        from torchscale.architecture import config, decoder, encoder, encoder_decoder
    finally:
        for name in names:
            del sys.modules[name]
        sys.modules.update(saved)
    return config, decoder, encoder, encoder_decoder


pytest.importorskip("torchscale")
ts_config, ts_decoder, ts_encoder, ts_encoder_decoder = _import_torchscale()
DecoderConfig, EncoderConfig, EncoderDecoderConfig = (ts_config.DecoderConfig, ts_config.EncoderConfig,
                                                      ts_config.EncoderDecoderConfig)
TSDecoder, TSEncoderDecoder = ts_decoder.Decoder, ts_encoder_decoder.EncoderDecoder
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


def mutate(monkeypatch, alpha: float = 1.0, beta: float = 1.0) -> None:
    """DeepNorm's constants off by the factors ``alpha`` and ``beta`` in every connection built from here on."""
    constants = deepnorm.deepnorm_constants
    monkeypatch.setattr(deepnorm, "deepnorm_constants", lambda place: (constants(place)[0] * alpha,
                                                                       constants(place)[1] * beta))


# --- the initialisation ---------------------------------------------------------------------------------------------

def same_factors(ours: dict[str, float], theirs: dict[str, float], roles=("value", "output", "ffn"),
                 scale: float = 1.0) -> None:
    """skiplab's factor of each role is torchscale's (times ``scale``) within INIT_TOL."""
    for role in roles:
        assert ours[role] == pytest.approx(scale * theirs[role], rel=INIT_TOL), role


@pytest.mark.parametrize("layers", [4, 12])
def test_decoder_only_alpha_beta_and_branch_init_are_torchscales(layers):
    build, stacks, conns = decoder_only(layers)
    ts_layers = build(deepnorm=True)["decoder"]
    alpha, beta = (2 * layers) ** 0.25, (8 * layers) ** -0.25  # DeepNet, Fig. 2: decoder-only
    for conn in conns["decoder"]:
        assert conn.alpha == pytest.approx(alpha, rel=1e-12) and conn.beta == pytest.approx(beta, rel=1e-12)
        assert conn.stats() == {"alpha": conn.alpha, "beta": conn.beta}
    assert all(layer.alpha == pytest.approx(alpha, rel=1e-12) for layer in ts_layers)
    theirs = torchscale_factors(build)["decoder"]
    ours = skiplab_factors(stacks)["decoder"]
    for role in ("value", "output", "ffn"):
        assert theirs[role] == pytest.approx(beta, rel=1e-6)
    for role in ("query", "key"):
        assert theirs[role] == pytest.approx(1.0, rel=1e-6)
    same_factors(ours, theirs, ("query", "key", "value", "output", "ffn"))


@pytest.mark.parametrize("n,m", [(4, 4), (12, 4)])
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
        same_factors(ours[stack], theirs[stack], ("query", "key"))
    for role in ("value", "output", "ffn"):
        assert theirs["decoder"][role] == pytest.approx(paper["decoder"][1], rel=1e-6)
        # the encoder: torchscale's β is 1.15 (N⁴M)^(-1/16) (encoder.py: init_scale = (N⁴M)^(1/16) / 1.15), the
        # paper's and skiplab's 0.87 (N⁴M)^(-1/16)
        assert theirs["encoder"][role] == pytest.approx(1.15 * (n**4 * m) ** (-1 / 16), rel=1e-6)
    same_factors(ours["decoder"], theirs["decoder"])
    same_factors(ours["encoder"], theirs["encoder"], scale=0.87 / 1.15)


@pytest.mark.parametrize("off", [1.01, 0.99])
def test_the_init_comparison_fails_with_beta_one_percent_off(monkeypatch, off):
    """The comparison of the branch init alone resolves a 1% error in the gain β, either way."""
    mutate(monkeypatch, beta=off)
    build, stacks, _ = decoder_only(4)
    theirs, ours = torchscale_factors(build)["decoder"], skiplab_factors(stacks)["decoder"]
    for role in ("value", "output", "ffn"):
        with pytest.raises(AssertionError):
            same_factors(ours, theirs, (role,))
    same_factors(ours, theirs, ("query", "key"))  # gain 1 there: untouched


# --- the connection, given the same weights --------------------------------------------------------------------------

def layer_config(architecture: str, n: int, m: int):
    """torchscale's config of a model of ``n`` encoder and ``m`` decoder layers at width LAYER_D, dropout 0."""
    common = dict(deepnorm=True, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, drop_path_rate=0.0,
                  vocab_size=10, no_output_layer=True)
    enc = dict(encoder_layers=n, encoder_embed_dim=LAYER_D, encoder_ffn_embed_dim=LAYER_FFN,
               encoder_attention_heads=LAYER_HEADS)
    dec = dict(decoder_layers=m, decoder_embed_dim=LAYER_D, decoder_ffn_embed_dim=LAYER_FFN,
               decoder_attention_heads=LAYER_HEADS)
    if architecture == "decoder-only":
        return DecoderConfig(**dec, **common)
    if architecture == "encoder-only":
        return EncoderConfig(**enc, **common)
    return EncoderDecoderConfig(**enc, **dec, **common)


def torchscale_layer(architecture: str, stack: str, layer: int, n: int, m: int):
    """Layer ``layer`` (1-based) of ``stack`` of torchscale's model, as torchscale builds and initialises it
    (deepnorm's division of v, out, fc1, fc2 included), its LayerNorms' gains and biases drawn away from 1 and 0."""
    torch.manual_seed(0)
    cfg = layer_config(architecture, n, m)
    if architecture == "encoder-decoder":
        model = TSEncoderDecoder(cfg)
        module = (model.encoder if stack == "encoder" else model.decoder).layers[layer - 1]
    elif architecture == "encoder-only":
        module = ts_encoder.Encoder(cfg).layers[layer - 1]
    else:
        module = TSDecoder(cfg).layers[layer - 1]
    module = module.double().train()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for ln in norms_of(module):
            ln.weight.copy_(1 + 0.3 * torch.randn(ln.weight.shape, generator=g, dtype=ln.weight.dtype))
            ln.bias.copy_(0.3 * torch.randn(ln.bias.shape, generator=g, dtype=ln.bias.dtype))
    return module


def norms_of(module) -> list:
    """A torchscale layer's post-norms in the order of its sub-layers."""
    return [ln for ln in (module.self_attn_layer_norm, getattr(module, "encoder_attn_layer_norm", None),
                          module.final_layer_norm) if ln is not None]


def skiplab_around(module, stack: str, layer: int, n: int, m: int, memory: torch.Tensor | None):
    """skiplab's DeepNorm connections of that layer, its norms loaded with torchscale's, and the branches: copies of
    torchscale's own attention, cross-attention and feed-forward sub-modules."""
    self_attn, ffn = copy.deepcopy(module.self_attn), copy.deepcopy(module.ffn)

    def attend(t):  # the decoder attends causally: torchscale's future mask, -inf above the diagonal
        if stack != "decoder":
            return self_attn(query=t, key=t, value=t)[0]
        mask = torch.triu(torch.full((t.shape[1],) * 2, float("-inf"), dtype=t.dtype), 1)
        return self_attn(query=t, key=t, value=t, attn_mask=mask)[0]

    branches = [(attend, self_attn, "attn")]
    if getattr(module, "encoder_attn", None) is not None:
        cross = copy.deepcopy(module.encoder_attn)
        branches.append((lambda t: cross(query=t, key=memory, value=memory)[0], cross, "cross"))
    branches.append((ffn, ffn, "ffn"))
    conns = []
    for k, ((_, _, role), ln) in enumerate(zip(branches, norms_of(module)), start=1):
        conn = skiplab.connection("DeepNorm", LAYER_D, place=Place(layer, stack, n, m, k, len(branches), role))
        conn = conn.double()
        with torch.no_grad():
            conn.norm.weight.copy_(ln.weight), conn.norm.bias.copy_(ln.bias)
        assert conn.norm.eps == ln.eps
        conns.append(conn)
    return conns, branches


LAYERS = {  # (architecture, stack, layer, N, M)
    "decoder-only": ("decoder-only", "decoder", 3, 0, 6),
    "encoder-only": ("encoder-only", "encoder", 2, 6, 0),
    "encoder-decoder encoder": ("encoder-decoder", "encoder", 5, 12, 4),
    "encoder-decoder decoder": ("encoder-decoder", "decoder", 2, 12, 4),
}


def compare_layer(case: str) -> tuple:
    """skiplab's DeepNorm around torchscale's sub-modules against torchscale's layer: outputs and gradients; the
    torchscale layer and skiplab's connections."""
    architecture, stack, layer, n, m = LAYERS[case]
    module = torchscale_layer(architecture, stack, layer, n, m)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 7, LAYER_D, generator=g, dtype=torch.float64, requires_grad=True)
    memory = torch.randn(2, 5, LAYER_D, generator=g, dtype=torch.float64, requires_grad=True)
    x_ref, memory_ref = (t.detach().clone().requires_grad_() for t in (x, memory))
    cross = getattr(module, "encoder_attn", None) is not None
    conns, branches = skiplab_around(module, stack, layer, n, m, memory if cross else None)
    h = x
    for conn, (f, _, _) in zip(conns, branches):
        h = conn(h, f)
    if stack == "decoder":
        mask = torch.triu(torch.full((7, 7), float("-inf"), dtype=torch.float64), 1)  # torchscale's future mask
        y_ref = module(x_ref, encoder_out=memory_ref if cross else None, self_attn_mask=mask)[0]
    else:
        y_ref = module(x_ref, encoder_padding_mask=None)[0]
    torch.testing.assert_close(h, y_ref, rtol=1e-10, atol=1e-12)
    w = torch.randn(h.shape, generator=g, dtype=h.dtype)
    (h * w).sum().backward(), (y_ref * w).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-10, atol=1e-12)
    if cross:
        assert memory_ref.grad.abs().max() > 1e-6
        torch.testing.assert_close(memory.grad, memory_ref.grad, rtol=1e-10, atol=1e-12)
    originals = [module.self_attn, *([module.encoder_attn] if cross else []), module.ffn]
    for conn, (_, ours, _), theirs, ln in zip(conns, branches, originals, norms_of(module)):
        pairs = [("norm.weight", conn.norm.weight.grad, ln.weight.grad),
                 ("norm.bias", conn.norm.bias.grad, ln.bias.grad)]
        pairs += [(name, p.grad, q.grad) for (name, p), q in zip(ours.named_parameters(), theirs.parameters(),
                                                                 strict=True)]
        for name, got, want in pairs:
            # a gradient to compare, but for the key's bias: it adds one constant to a query's logits, which the
            # softmax ignores (0 but for the rounding of torchscale's float32 softmax, ~1e-9)
            assert name == "k_proj.bias" or want.abs().max() > 1e-6, name
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    return module, conns


@pytest.mark.parametrize("case", LAYERS)
def test_deepnorm_around_torchscales_sublayers_gives_its_layers_outputs_and_gradients(case):
    module, conns = compare_layer(case)
    assert all(conn.alpha == pytest.approx(module.alpha, rel=1e-12) for conn in conns)


@pytest.mark.parametrize("mutation", ["alpha 1% off", "LN(x + αF)"])
def test_the_layer_comparison_fails_when_deepnorm_is_mutated(monkeypatch, mutation):
    if mutation == "alpha 1% off":
        mutate(monkeypatch, alpha=1.01)
    else:  # the skip and the branch swapped in the weighted sum: LN(x + αF)
        monkeypatch.setattr(deepnorm, "scaled_add", lambda s, lam, f, phi=1.0: s + lam * f)
    with pytest.raises(AssertionError):
        compare_layer("decoder-only")
