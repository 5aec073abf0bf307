"""ReZero's α per layer (the authors' code: one ``resweight`` per layer) or per sub-layer (Eq. 1 read per branch),
and the tying step that makes a layer's connections hold one parameter (skiplab.connections.tie)."""

import pytest
import torch

import skiplab
from skiplab.connections import parse_spec, tie_within_layers
from skiplab.models import GPT, GPTConfig, Transformer, TransformerConfig

LAYERS = 3


def gpt(spec: str, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=30, d_model=16, heads=2, layers=LAYERS, ffn_dim=32, context=10, connection=spec))


def transformer(spec: str, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(TransformerConfig(vocab_size=30, d_model=16, heads=2, ffn_dim=32, encoder_layers=2,
                                         decoder_layers=LAYERS, dropout=0, attention_dropout=0, connection=spec))


def layer_groups(model) -> list[list[torch.nn.Module]]:
    """Each layer's connections, every stack of the model."""
    if isinstance(model, GPT):
        return [[layer.conn_attn, layer.conn_mlp] for layer in model.layers]
    return ([[layer.conn_attn, layer.conn_ffn] for layer in model.encoder.layers]
            + [[layer.conn_self, layer.conn_cross, layer.conn_ffn] for layer in model.decoder.layers])


def test_the_spec_parses_share_and_writes_the_default_out():
    assert parse_spec("ReZero").options == {"init": 0.0, "share": "layer"}
    assert parse_spec("ReZero(share=sublayer)").options["share"] == "sublayer"
    assert skiplab.connection("ReZero(share=layer)", 4).spec == "ReZero"  # the default, left out
    assert skiplab.connection("ReZero(share=sublayer,init=0.5)", 4).spec == "ReZero(init=0.5,share=sublayer)"
    with pytest.raises(ValueError, match="option share: must be one of layer, sublayer, got 'block'"):
        parse_spec("ReZero(share=block)")
    with pytest.raises(ValueError, match="SkipInit has no option 'share'"):  # SkipInit: one α per residual branch
        parse_spec("SkipInit(share=layer)")


@pytest.mark.parametrize("build", [gpt, transformer])
def test_share_layer_gives_each_layer_one_alpha_and_sublayer_one_per_branch(build):
    shared, apart = build("ReZero"), build("ReZero(share=sublayer)")
    groups = layer_groups(shared)
    for group in groups:
        assert all(c.alpha is group[0].alpha for c in group)
    assert len({id(g[0].alpha) for g in groups}) == len(groups)  # one per layer, not one per model
    for group in layer_groups(apart):
        assert len({id(c.alpha) for c in group}) == len(group)
    extra = sum(len(g) - 1 for g in groups)  # the later sub-layers' own α
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(apart) - count(shared) == extra
    opt = torch.optim.SGD(shared.parameters(), lr=0.1)
    held = [p for group in opt.param_groups for p in group["params"]]
    assert sum(p is groups[0][0].alpha for p in held) == 1  # the optimiser updates it once


def test_the_shared_alpha_takes_the_gradient_of_every_sublayer():
    tokens = torch.randint(0, 30, (2, 7), generator=torch.Generator().manual_seed(1))
    apart, shared = gpt("ReZero(share=sublayer)"), gpt("ReZero")
    with torch.no_grad():
        for i, layer in enumerate(apart.layers):  # both sub-layers of layer i at the same α, away from 0
            layer.conn_attn.alpha.fill_(0.3 + 0.1 * i), layer.conn_mlp.alpha.fill_(0.3 + 0.1 * i)
    shared.load_state_dict(apart.state_dict())
    dy = torch.randn(2, 7, 30, generator=torch.Generator().manual_seed(2))
    ya, ys = apart(tokens), shared(tokens)
    torch.testing.assert_close(ys, ya)  # the same network while the α agree
    (ya * dy).sum().backward(), (ys * dy).sum().backward()
    for la, ls in zip(apart.layers, shared.layers):
        parts = la.conn_attn.alpha.grad, la.conn_mlp.alpha.grad
        assert all(g.abs() > 1e-6 for g in parts)  # each sub-layer contributes
        torch.testing.assert_close(ls.conn_attn.alpha.grad, parts[0] + parts[1])
    torch.optim.SGD(shared.parameters(), lr=1.0).step()
    for layer in shared.layers:
        assert layer.conn_attn.alpha is layer.conn_mlp.alpha  # still one parameter after the step


@pytest.mark.parametrize("build", [gpt, transformer])
def test_state_dict_and_checkpoint_round_trip_keep_the_tie(build, tmp_path):
    model = build("ReZero")
    with torch.no_grad():
        for k, group in enumerate(layer_groups(model)):
            group[0].alpha.fill_(0.1 * (k + 1))
    state = model.state_dict()
    names = [n for n in state if n.endswith(".alpha")]
    assert len(names) == sum(len(g) for g in layer_groups(model))  # every connection's name is listed
    path = tmp_path / "model.pt"
    torch.save(state, path)
    loaded = torch.load(path)
    first = layer_groups(model)[0]
    a, b = (f"{n}.alpha" for n, c in model.named_modules() if c in first[:2])
    assert loaded[a].untyped_storage().data_ptr() == loaded[b].untyped_storage().data_ptr()  # written once
    again = build("ReZero", seed=5)
    again.load_state_dict(loaded)
    for g_new, g_old in zip(layer_groups(again), layer_groups(model)):
        assert all(c.alpha is g_new[0].alpha for c in g_new)  # loading copies into the tied parameter
        assert g_new[0].alpha.item() == pytest.approx(g_old[0].alpha.item())


def test_tie_within_layers_ties_by_stack_and_layer_and_only_what_a_design_shares():
    from skiplab import Place
    places = [Place.decoder_only(layer, 2, sub, 2) for layer in (1, 2) for sub in (1, 2)]
    conns = torch.nn.ModuleList(skiplab.connection("ReZero", 4, place=p) for p in places)
    assert tie_within_layers(conns) == 2
    assert conns[0].alpha is conns[1].alpha and conns[2].alpha is conns[3].alpha
    assert conns[0].alpha is not conns[2].alpha
    assert tie_within_layers(conns) == 0  # tied already
    for spec in ("ReZero(share=sublayer)", "SkipInit", "PreLN"):
        others = torch.nn.ModuleList(skiplab.connection(spec, 4, place=p) for p in places)
        assert tie_within_layers(others) == 0


def test_a_state_dict_with_differing_alphas_is_refused_by_the_tied_model():
    apart, shared = gpt("ReZero(share=sublayer)"), gpt("ReZero")
    with torch.no_grad():
        apart.layers[1].conn_mlp.alpha.fill_(0.5)  # layer 2's sub-layers apart: 0 and 0.5
    with pytest.raises(RuntimeError, match=r"layers\.1\.conn_attn\.alpha and layers\.1\.conn_mlp\.alpha differ"):
        shared.load_state_dict(apart.state_dict())
    with torch.no_grad():
        apart.layers[1].conn_attn.alpha.fill_(0.5)
    shared.load_state_dict(apart.state_dict())  # equal copies: one value, loaded
    assert shared.layers[1].conn_attn.alpha.item() == 0.5
