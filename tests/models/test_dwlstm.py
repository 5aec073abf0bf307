"""The depth-wise LSTM Transformer: its unit against Eqs. 2-10 by hand, parameter counts, sharing, decoding."""

import copy
import math

import pytest
import torch

from skiplab.models import DepthWiseLSTMTransformer, build_model, model_config
from skiplab.models.dwlstm import DepthWiseLSTM, LSTMGates, LSTMHidden
from skiplab.decoding import beam_search, greedy_search
from tests.models.test_transformer import full_and_incremental
from tests.noise import assert_within_noise, noise

V, D, FFN = 30, 8, 12


def tiny(**kw):
    torch.manual_seed(0)
    fields = dict(vocab_size=V, d_model=D, ffn_dim=FFN, heads=2, encoder_layers=2, decoder_layers=3)
    return build_model(model_config("dwlstm-small", **{**fields, **kw}))


def perturb(module, seed=3):
    """Move every parameter (LN gains and biases included) off its initial value."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))


def layer_norm(z, w, b, eps=1e-6):  # Eq. 7, with the family's ε (Neutron's)
    mu = z.mean(-1, keepdim=True)
    var = ((z - mu) ** 2).mean(-1, keepdim=True)
    return (z - mu) / torch.sqrt(var + eps) * w + b


def act(z, name):
    return 0.5 * z * (1 + torch.erf(z / math.sqrt(2))) if name == "gelu" else torch.tanh(z)


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("activation", ["gelu", "tanh"])
@pytest.mark.parametrize("in_dim", [D, 2 * D])  # merge=add / merge=concat input widths
def test_the_unit_computes_equations_2_to_10(layers, activation, in_dim):
    torch.manual_seed(1)
    unit = DepthWiseLSTM(LSTMGates(in_dim + D, D), LSTMHidden(in_dim + D, D, FFN, layers, activation), 0.0)
    perturb(unit)
    x, out, cell = torch.randn(4, 5, in_dim), torch.randn(4, 5, D), torch.randn(4, 5, D)
    new_out, new_cell = unit(x, (out, cell))

    c = torch.cat([x, out], -1)  # Eq. 2
    W, b = unit.gates.proj.weight, unit.gates.proj.bias
    gw, gb = unit.gates.norm.weight, unit.gates.norm.bias
    i, f, o = (torch.sigmoid(layer_norm(c @ W[k * D:(k + 1) * D].T + b[k * D:(k + 1) * D], gw[k], gb[k]))
               for k in range(3))  # Eqs. 3-5, each gate with its own LN
    hid = unit.hidden
    h = act(layer_norm(c @ hid.proj.weight.T + hid.proj.bias, hid.norm.weight, hid.norm.bias), activation)  # Eq. 6
    if layers == 2:
        h = h @ hid.out.weight.T + hid.out.bias  # Eq. 8
    expect_cell = cell * f + h * i  # Eq. 9
    torch.testing.assert_close(new_cell, expect_cell)
    torch.testing.assert_close(new_out, expect_cell * o)  # Eq. 10, no tanh on the cell


def test_gate_norm_starts_at_gain_one_bias_zero():
    gates = LSTMGates(2 * D, D)
    assert torch.equal(gates.norm.weight, torch.ones(3, D)) and torch.equal(gates.norm.bias, torch.zeros(3, D))
    hidden = LSTMHidden(2 * D, D, FFN, 2, "gelu")
    assert torch.equal(hidden.norm.weight, torch.ones(FFN)) and torch.equal(hidden.norm.bias, torch.zeros(FFN))


def expected_parameters(share: str, merge: str, hidden_layers: int, enc: int = 2, dec: int = 3) -> int:
    """The parameter count derived from the shapes, by hand."""
    d, f = D, FFN
    attn = 4 * (d * d + d)
    ln = 2 * d

    def gates(m):  # W: (m + d) -> 3d, and 3 LNs of d
        return (m + d) * 3 * d + 3 * d + 3 * ln

    def hidden(m):
        if hidden_layers == 2:  # (m + d) -> f, LN(f), f -> d
            return (m + d) * f + f + 2 * f + f * d + d
        return (m + d) * d + d + ln  # (m + d) -> d, LN(d)

    def lstm(m, n):
        if share == "all":
            return gates(m) + hidden(m)
        return (1 if share == "gates" else n) * gates(m) + n * hidden(m)

    m_dec = d if merge == "add" else 2 * d
    encoder = enc * (attn + ln) + lstm(d, enc) + ln
    decoder = dec * (2 * attn + 2 * ln) + lstm(m_dec, dec) + ln
    return V * d + encoder + decoder


@pytest.mark.parametrize("share", ["gates", "all", "none"])
@pytest.mark.parametrize("merge", ["add", "concat"])
@pytest.mark.parametrize("hidden_layers", [1, 2])
def test_parameter_counts_match_the_shapes(share, merge, hidden_layers):
    model = tiny(share=share, merge=merge, hidden_layers=hidden_layers)
    assert sum(p.numel() for p in model.parameters()) == expected_parameters(share, merge, hidden_layers)


def test_shared_parameters_are_the_same_tensors_in_every_layer():
    gates = tiny(share="gates")
    for stack in (gates.encoder, gates.decoder):
        first = stack.layers[0].lstm
        for layer in stack.layers[1:]:
            assert layer.lstm.gates.proj.weight is first.gates.proj.weight
            assert layer.lstm.gates.norm.weight is first.gates.norm.weight
            assert layer.lstm.hidden.proj.weight is not first.hidden.proj.weight
    assert gates.encoder.layers[0].lstm.gates is not gates.decoder.layers[0].lstm.gates  # stacks share nothing
    state = gates.state_dict()  # one storage under every layer's name, so saving and averaging keep the tie
    assert state["encoder.layers.0.lstm.gates.proj.weight"].data_ptr() == \
        state["encoder.layers.1.lstm.gates.proj.weight"].data_ptr()

    every = tiny(share="all")
    assert all(layer.lstm is every.decoder.layers[0].lstm for layer in every.decoder.layers)
    assert all(layer.self_attn is not every.decoder.layers[0].self_attn for layer in every.decoder.layers[1:])
    none = tiny(share="none")
    assert none.encoder.layers[1].lstm.gates is not none.encoder.layers[0].lstm.gates


def test_a_shared_gate_gets_the_gradient_of_every_layer():
    model = tiny(share="gates")
    src, tgt = torch.randint(4, V, (2, 5)), torch.randint(4, V, (2, 4))
    model(src, tgt).sum().backward()
    grad = model.encoder.layers[0].lstm.gates.proj.weight.grad
    assert grad is not None and grad.abs().sum() > 0


@pytest.mark.parametrize("options", [{}, {"merge": "concat", "share": "none"},
                                     {"share": "all", "hidden_layers": 1, "activation": "tanh"},
                                     {"wiring": "neutron", "output_bias": True}])
def test_incremental_decoding_equals_full_recomputation(options):
    model = tiny(**options).eval()
    perturb(model)
    g = torch.Generator().manual_seed(2)
    src = torch.randint(4, V, (3, 7), generator=g)
    src[0, 4:] = 0
    tgt = torch.randint(4, V, (3, 6), generator=g)
    full, steps, state = full_and_incremental(model, src, tgt)
    full64, steps64, _ = full_and_incremental(copy.deepcopy(model).double(), src, tgt)
    assert_within_noise(steps, full, noise((full, full64), (steps, steps64)))
    assert all(set(c) == {"k", "v"} for c in state.caches)  # attention caches only: nothing kept for the LSTM


def test_beam_one_is_greedy_and_the_shell_is_shared():
    model = tiny().eval()
    perturb(model)
    assert isinstance(model, DepthWiseLSTMTransformer)
    src = torch.randint(4, V, (4, 6), generator=torch.Generator().manual_seed(5))
    greedy = greedy_search(model, src, max_len_b=8)
    beam1 = [h[0].tokens for h in beam_search(model, src, beam=1, max_len_b=8)]
    assert greedy == beam1 and any(greedy)


def test_the_first_layer_starts_from_the_embedded_input():
    """With one encoder layer whose gates are forced (i = 0, f = 1, o = 1) the layer passes its cell on: the
    stack's output is LN(cell_0) = LN(embedded input)."""
    model = tiny(encoder_layers=1).eval()
    gates = model.encoder.layers[0].lstm.gates
    with torch.no_grad():
        gates.norm.weight.zero_()
        gates.norm.bias.copy_(torch.tensor([-50.0, 50.0, 50.0])[:, None].expand(3, D))
    src = torch.randint(4, V, (2, 5))
    model64 = copy.deepcopy(model).double()
    with torch.no_grad():
        memory, memory64 = model.encode(src).out, model64.encode(src).out
        expect, expect64 = (m.encoder.norm(m.embed_tokens(src)) for m in (model, model64))
    assert_within_noise(memory, expect, noise((expect, expect64), (memory, memory64)))


@pytest.mark.parametrize("spec,message", [
    ("dwlstm-small(connection=PreLN)", "dwlstm-small has no option connection (its options:"),
    ("dwlstm-small(share=some)", "share must be one of gates, all, none, got 'some'"),
    ("dwlstm-small(merge=mean)", "merge must be one of add, concat"),
    ("dwlstm-small(hidden_layers=3)", "hidden_layers must be one of 1, 2"),
    ("dwlstm-small(activation=relu)", "activation must be one of gelu, tanh"),
    ("dwlstm-small(wiring=fairseq)", "wiring must be one of paper, neutron, got 'fairseq'"),
    ("dwlstm-small(wiring=neutron,merge=concat)", "wiring=neutron adds the cross-attention output"),
])
def test_bad_options_are_named(spec, message):
    with pytest.raises(ValueError) as err:
        model_config(spec)
    assert message in str(err.value)


def test_presets_have_the_papers_widths():
    for name, d, f, h, dropout in [("dwlstm-base", 512, 2048, 8, 0.1), ("dwlstm-big", 1024, 4096, 16, 0.3),
                                   ("dwlstm-small", 256, 1024, 4, 0.1)]:
        cfg = model_config(name)
        assert (cfg.d_model, cfg.ffn_dim, cfg.heads, cfg.dropout) == (d, f, h, dropout)
        assert (cfg.hidden_layers, cfg.merge, cfg.share, cfg.activation) == (2, "add", "gates", "gelu")
    assert model_config("dwlstm-base", encoder_layers=24, decoder_layers=24).encoder_layers == 24  # Table 5


def test_dropout_acts_inside_the_two_layer_hidden_computation_as_in_the_authors_code():
    """h = W_h2 Drop(act(LN(W_h1 c + b_h1))) + b_h2: in training about p of the inner activations reach W_h2 as
    zeros and the rest scaled by 1 / (1 - p); one hidden layer has no inner activation to drop."""
    torch.manual_seed(0)
    hidden = LSTMHidden(2 * D, D, FFN, 2, "gelu", dropout=0.5).train()
    seen = []
    hidden.out.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    c = torch.randn(64, 2 * D)
    hidden(c)
    inner = hidden.act(hidden.norm(hidden.proj(c)))
    dropped = seen[0] == 0
    assert 0.45 < dropped.float().mean().item() < 0.55
    torch.testing.assert_close(seen[0][~dropped], 2 * inner[~dropped], rtol=0, atol=0)
    hidden.eval()
    torch.testing.assert_close(hidden(c), hidden.out(inner), rtol=0, atol=0)
    assert isinstance(LSTMHidden(2 * D, D, FFN, 1, "gelu", dropout=0.5).drop, torch.nn.Identity)


def test_neutron_wiring_feeds_the_lstm_the_cross_attention_sublayer_output():
    """wiring=neutron, the authors' decoder layer (Neutron transformer/RFN/Decoder.py, norm_residual): with h =
    LN_s(out), s = SelfAttn(h), q = LN_c(s + h), a = CrossAttn(q), the LSTM reads a + q; the paper's wiring reads
    s + a with the cross-attention on LN_c(s + out). Both by hand from the layer's own modules, dropout off."""
    torch.manual_seed(0)
    model = tiny(wiring="neutron").eval()
    perturb(model)
    paper = tiny().eval()
    paper.load_state_dict(model.state_dict())
    src, tgt = torch.randint(4, V, (2, 5)), torch.randint(4, V, (2, 4))
    memory = model.encode(src)
    x = model.embed_tokens(tgt)
    for m, neutron in ((model, True), (paper, False)):
        layer = m.decoder.layers[0]
        cross = layer.cross_attn.project_kv(memory.out)
        h = layer.self_norm(x)
        s = layer.self_attn(h, causal=True)
        if neutron:
            q = layer.cross_norm(s + h)
            lstm_in = layer.cross_attn(q, cross, memory.mask) + q
        else:
            lstm_in = s + layer.cross_attn(layer.cross_norm(s + x), cross, memory.mask)
        expect = layer.lstm(lstm_in, (x, x))
        got = layer(x, x, cross, memory.mask)
        for e, g in zip(expect, got):
            torch.testing.assert_close(g, e, rtol=0, atol=1e-6)
    with torch.no_grad():  # the two wirings differ on the same weights
        assert not torch.allclose(model(src, tgt), paper(src, tgt), atol=1e-3)


def test_output_bias_is_added_to_the_tied_logits_and_starts_at_zero():
    model = tiny(output_bias=True).eval()
    plain = tiny()
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in plain.parameters()) + V
    assert model.output_bias.shape == (V,) and not model.output_bias.any()
    with torch.no_grad():
        model.output_bias.copy_(torch.arange(V, dtype=torch.float32))
    h = torch.randn(2, 3, D)
    torch.testing.assert_close(model.output(h), h @ model.embed.weight.T + torch.arange(V, dtype=torch.float32))
    assert plain.output_bias is None
