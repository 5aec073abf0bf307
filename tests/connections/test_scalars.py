"""``+Scalars``, the speedrun's residual scalars: both forms against a pre-norm GPT written out by hand (outputs and
gradients, width 64), the codes' starting values, the special case a = 1, b = 0 (the plain model), incremental
decoding, the combinations refused, and mutations the hand forward catches."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F

import skiplab
from skiplab.connections import parse_spec
from skiplab.compiled import CompileStats, compile_layers, set_recompile_limit
from skiplab.connections.across import Scalars
from skiplab.models import GPT, GPTConfig, Transformer, TransformerConfig
from tests.connections.test_formulas import ln
from tests.noise import assert_within_noise, noise

WIDTH, LAYERS = 64, 4


def gpt(spec, layers=LAYERS, **kw):
    torch.manual_seed(0)
    cfg = dict(vocab_size=40, d_model=WIDTH, heads=4, layers=layers, ffn_dim=128, context=16, positions="learned",
               connection=spec)
    return GPT(GPTConfig(**{**cfg, **kw})).eval()


def tokens(b=2, t=9, seed=1):
    return torch.randint(0, 40, (b, t), generator=torch.Generator().manual_seed(seed))


def attend(a, h):
    """Causal self-attention of module ``a`` on h (B, T, D), written out."""
    b, t, _ = h.shape
    q, k, v = (z.view(b, t, a.heads, -1).transpose(1, 2) for z in a.qkv_proj(h).chunk(3, -1))
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
    return a.out_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, -1))


def hand_gpt(m, x, layer_in=None, skip=None, head_in=None):
    """The PreLN GPT (learned positions, tied head) by hand: layer i reads ``layer_in(i, x_i, x0)``; sub-layer k's
    skip path is ``skip(k, u, x0)`` on its input u, its branch reads LN(u); the head reads
    ``head_in(x_L, [x_1, ..., x_L])`` (each default: as the plain model)."""
    t = x.shape[1]
    x0 = m.embed(x) + m.pos_embed.weight[:t]
    h, outs = x0, []
    for i, layer in enumerate(m.layers):
        n1, n2 = layer.conn_attn.norm, layer.conn_mlp.norm
        u = layer_in(i, h, x0) if layer_in else h
        h = (skip(2 * i, u, x0) if skip else u) + attend(layer.attn, ln(u, n1.weight, n1.bias))
        h = (skip(2 * i + 1, h, x0) if skip else h) + layer.mlp(ln(h, n2.weight, n2.bias))
        outs.append(h)
    h = head_in(h, outs) if head_in else h
    return F.linear(ln(h, m.norm.weight, m.norm.bias), m.embed.weight)


def per_layer(a, b):
    """nanochat's ``x = resid_lambdas[i] * x + x0_lambdas[i] * x0`` before block i."""
    return lambda i, h, x0: a[i] * h + b[i] * x0


def per_sublayer(a, b):
    """modded-nanogpt's skip path: a_k x, plus b_i x0 at each layer's attention (k even)."""
    return lambda k, u, x0: a[k // 2, k % 2] * u + (b[k // 2] * x0 if k % 2 == 0 else 0)


def randomise(m, seed=3):
    """The scalars away from their start, so that every a and b is seen."""
    s = m.across.designs[0]
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        s.a.copy_(0.5 + torch.rand(s.a.shape, generator=g, dtype=s.a.dtype))
        s.b.copy_(torch.randn(s.b.shape, generator=g, dtype=s.b.dtype))
    return s


def outputs_and_gradients(m, forward):
    """``forward()``'s output and the gradients it gives every parameter of ``m``, for one random weighting."""
    m.zero_grad()
    y = forward()
    (y * torch.randn(y.shape, generator=torch.Generator().manual_seed(7), dtype=y.dtype)).sum().backward()
    return y.detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("per, oracle", [("layer", "layer_in"), ("sublayer", "skip")])
def test_the_scalars_give_the_hand_forward_outputs_and_gradients(per, oracle):
    m = gpt(f"PreLN+Scalars(per={per})").double()  # float64: the formula, not float32's order of sums, compared
    s = randomise(m)
    x = tokens()
    form = per_layer(s.a, s.b) if per == "layer" else per_sublayer(s.a, s.b)
    y, grads = outputs_and_gradients(m, lambda: m(x))
    y_hand, grads_hand = outputs_and_gradients(m, lambda: hand_gpt(m, x, **{oracle: form}))
    torch.testing.assert_close(y, y_hand)
    assert grads.keys() == grads_hand.keys() and {"across.designs.0.a", "across.designs.0.b"} <= grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], grads_hand[name], msg=name)
    assert s.a.grad.abs().min() > 0 and s.b.grad.abs().min() > 0


def test_the_starting_values_are_the_codes():
    layer = gpt("PreLN+Scalars", layers=6).across.designs[0]
    # nanochat GPT.init_weights, typed in: 1.15 - (0.10 * i / max(n_layer - 1, 1)), 0.20 - (0.15 * i / ...)
    torch.testing.assert_close(layer.a, torch.tensor([1.15 - 0.10 * i / 5 for i in range(6)]))
    torch.testing.assert_close(layer.b, torch.tensor([0.20 - 0.15 * i / 5 for i in range(6)]))
    sub = gpt("PreLN+Scalars(per=sublayer)", layers=6).across.designs[0]
    # modded-nanogpt: torch.full((num_layers, 2), 1.1**0.5), x0_lambdas torch.zeros(num_layers)
    assert sub.a.shape == (6, 2) and torch.equal(sub.a, torch.full((6, 2), 1.1 ** 0.5))
    assert torch.equal(sub.b, torch.zeros(6))
    one = gpt("PreLN+Scalars", layers=1).across.designs[0]  # max(L − 1, 1): a single layer starts at v0
    assert one.a.tolist() == pytest.approx([1.15]) and one.b.tolist() == pytest.approx([0.2])
    given = gpt("PreLN+Scalars(per=sublayer,a=2:1,b=0.5)", layers=3).across.designs[0]
    assert given.a.tolist() == [[2.0, 2.0], [1.5, 1.5], [1.0, 1.0]] and given.b.tolist() == [0.5] * 3


@pytest.mark.parametrize("text, canonical", [
    ("PreLN+Scalars(per=layer,a=auto,b=auto)", "PreLN+Scalars"),
    ("PreLN+Scalars(per=sublayer,a=1.0,b=0:0)", "PreLN+Scalars(per=sublayer,a=1,b=0)"),
    ("PreRMS+UNet+Scalars(a=1.15:1.05)+Backout", "PreRMS+UNet+Scalars(a=1.15:1.05)+Backout"),
])
def test_the_spec_reads_back_to_itself(text, canonical):
    assert skiplab.connection(text, 8).spec == canonical
    assert parse_spec(canonical) == parse_spec(text)


@pytest.mark.parametrize("text, problem", [
    ("PreLN+Scalars(per=block)", "option per: must be one of layer, sublayer"),
    ("PreLN+Scalars(a=1:2:3)", "option a: must be auto, a number or first:last"),
    ("PreLN+Scalars(b=nan)", "option b: must be finite"),
    ("PreLN+Scalars(a=one)", "option a: could not convert"),
    ("HC+Scalars(per=sublayer)", "+Scalars(per=sublayer) scales the skip path, which HC's streams have not; use "
                                 "per=layer"),
    ("mHC(n=2)+Scalars(per=sublayer)", "which mHC(n=2)'s streams have not"),
    ("NoSkip+Scalars(per=sublayer)", "+Scalars(per=sublayer) scales the skip path, which NoSkip has not (y = F(x)); "
                                     "use per=layer"),  # accepted, and its a_k, b_i never reached the model
])
def test_bad_specs_are_named_in_one_line(text, problem):
    with pytest.raises(ValueError) as err:
        parse_spec(text)
    assert problem in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("per", ["layer", "sublayer"])
@pytest.mark.parametrize("family", ["gpt", "transformer"])
@torch.no_grad()
def test_a_1_b_0_is_the_plain_model_exactly(per, family):
    def build(spec):
        torch.manual_seed(0)
        if family == "gpt":
            return gpt(spec)
        return Transformer(TransformerConfig(vocab_size=40, d_model=WIDTH, heads=4, ffn_dim=128, encoder_layers=3,
                                             decoder_layers=2, dropout=0, attention_dropout=0, connection=spec)).eval()

    plain, scaled = build("PreLN"), build(f"PreLN+Scalars(per={per},a=1,b=0)")
    missing, unexpected = scaled.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and missing and all(k.rsplit(".", 1)[-1] in ("a", "b") for k in missing)
    x = tokens()
    args = (x,) if family == "gpt" else (x, x)
    assert torch.equal(scaled(*args), plain(*args))
    for name, p in scaled.named_parameters():
        if "across." in name:  # the scalars
            p.add_(0.1)
    assert not torch.allclose(scaled(*args), plain(*args))


def test_the_transformer_decoder_adds_x0_at_its_self_attention():
    torch.manual_seed(0)
    t = Transformer(TransformerConfig(vocab_size=40, d_model=WIDTH, heads=4, ffn_dim=128, encoder_layers=2,
                                      decoder_layers=2, dropout=0, attention_dropout=0,
                                      connection="PreLN+Scalars(per=sublayer)"))
    dec = t.decoder.across.designs[0]
    assert dec.a.shape == (2, 3) and set(dec.stats()) == {"resid_lambda_attn", "resid_lambda_cross",
                                                          "resid_lambda_ffn", "x0_lambda"}
    t(tokens(), tokens()).sum().backward()
    for stack in (t.encoder, t.decoder):
        assert all(p.grad is not None and p.grad.abs().min() > 0 for p in stack.across.parameters())


@pytest.mark.parametrize("spec", ["PreLN+Scalars", "PreLN+Scalars(per=sublayer)", "PostLN+Scalars(per=sublayer)",
                                  "HC+Scalars", "PreLN+UNet+Scalars(per=sublayer)+Backout"])
@torch.no_grad()
def test_cached_decoding_gives_the_full_forward(spec):
    model = gpt(spec)
    randomise(model) if "UNet" not in spec else None
    assert_cached_is_full(model)


def assert_cached_is_full(model):
    """A prompt of 5 positions at once, then one position a step, against one pass over all 12; within float32's
    noise, measured against float64 runs of both."""
    x = tokens(t=12)

    def both(m):
        full, caches = m(x), m.new_caches()
        prefix = m(x[:, :5], caches)
        steps = [m(x[:, t : t + 1], caches) for t in range(5, x.shape[1])]
        return full, torch.cat([prefix, *steps], 1)

    full, cached = both(model)
    full64, cached64 = both(copy.deepcopy(model).double())
    assert_within_noise(cached, full, noise((full, full64), (cached, cached64)))


def test_stats_and_rows_give_a_and_b_per_layer():
    m = gpt("PreLN+Scalars(per=sublayer)", layers=3)
    s = randomise(m)
    stats = m.across.stats()["Scalars"]
    assert torch.equal(stats["resid_lambda_attn"], s.a[:, 0].detach()) and torch.equal(stats["x0_lambda"], s.b.detach())
    rows = s.rows()
    assert (2, "resid_lambda_ffn", float(s.a[2, 1].detach())) in rows
    assert (0, "x0_lambda", float(s.b[0].detach())) in rows
    assert len(rows) == 9
    assert [r[:2] for r in gpt("PreLN+Scalars", layers=2).across.designs[0].rows()] == [
        (0, "resid_lambda"), (1, "resid_lambda"), (0, "x0_lambda"), (1, "x0_lambda")]


def test_the_hand_forward_catches_the_wrong_form(monkeypatch):
    """Mutations the oracle must see: per=sublayer's scalars applied where the branch reads them too (the input
    form, not the code's skip path), and per=layer's x₀ taken as the layer's own input."""
    x = tokens()
    sub = gpt("PreLN+Scalars(per=sublayer)")
    s = randomise(sub)
    hand = hand_gpt(sub, x, skip=per_sublayer(s.a, s.b))
    torch.testing.assert_close(sub(x), hand)

    def input_form(self, k, h, conn, branch, state):
        i, r = divmod(k, 2)
        return conn(self.a[i, r] * h + (self.b[i] * state["scalars_x0"] if r == 0 else 0), branch)

    monkeypatch.setattr(Scalars, "sublayer", input_form)
    assert not torch.allclose(sub(x), hand, rtol=1e-3, atol=1e-4)
    monkeypatch.undo()

    lay = gpt("PreLN+Scalars")
    s = randomise(lay)
    hand = hand_gpt(lay, x, layer_in=per_layer(s.a, s.b))
    torch.testing.assert_close(lay(x), hand)
    monkeypatch.setattr(Scalars, "enter", lambda self, i, h, state: self.a[i] * h + self.b[i] * h)
    assert not torch.allclose(lay(x), hand, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("spec, per_layer_frames", [("PreLN+Scalars", 1),
                                                     ("PreLN+UNet+Scalars(per=sublayer)+Backout", 2)])
def test_it_compiles_without_graph_breaks(spec, per_layer_frames):
    """Whole (one frame over two steps) and per layer; per=sublayer's layers differ in the sub-layer index their
    code reads (a_k), so each of the 2 layers compiles once, as the value residual's first layer does."""
    torch._dynamo.reset()
    set_recompile_limit(64)
    try:
        model = gpt(spec, layers=2, positions="rope").train()
        x = tokens(t=8)

        def steps(forward):
            for _ in range(2):
                F.cross_entropy(forward(x).transpose(1, 2), x).backward()

        stats = CompileStats()
        steps(torch.compile(model, backend="eager", dynamic=False))
        report = stats.report()
        assert report["graph_breaks"] == 0 and report["frames_compiled"] == 1, report
        torch._dynamo.reset()
        compile_layers(model, backend="eager")
        stats = CompileStats()
        steps(model)
        report = stats.report()
        assert report["graph_breaks"] == 0 and report["frames_compiled"] == per_layer_frames, report
    finally:
        torch._dynamo.reset()
        set_recompile_limit(8)


@pytest.mark.parametrize("spec", ["PreLN+Scalars", "PreLN+UNet+Scalars(per=sublayer)+Backout"])
def test_activation_checkpointing_gives_the_same_numbers(spec):
    """The designs keep no state inside a layer but x₀, which a recomputed layer reads again: recomputable."""
    m = gpt(spec).train()
    x = tokens()
    y, grads = outputs_and_gradients(m, lambda: m(x))
    m.checkpointing = True
    y_again, grads_again = outputs_and_gradients(m, lambda: m(x))
    assert torch.equal(y, y_again) and all(torch.equal(grads[n], grads_again[n]) for n in grads)
