"""The modern per-block designs against their formulas, initialisations and the special cases their papers
state: ReZero, SkipInit, LayerScale, LayerNorm scaling (LNS) and Mix-LN."""

import math

import pytest
import torch

import skiplab
from skiplab import Place, final_norm
from skiplab.connections.mixed import post_layers
from skiplab.connections.scaled import layerscale_init
from skiplab.models import GPT, GPTConfig, Transformer, TransformerConfig
from tests.connections.test_formulas import conv_ln, ln
from tests.conftest import DIM, make_branch, make_input, randomise_affine


@pytest.mark.parametrize("name", ["ReZero", "SkipInit"])
def test_rezero_and_skipinit_start_as_the_identity_then_scale_the_branch(name, layout):
    x, branch = make_input(layout), make_branch(layout)
    conn = skiplab.connection(name, DIM, layout)
    assert torch.equal(conn(x, branch), x)  # α = 0: the block is the identity at initialisation
    with torch.no_grad():
        conn.alpha.fill_(0.7)
    torch.testing.assert_close(conn(x, branch), x + 0.7 * branch(x))
    assert conn.stats() == {"alpha": pytest.approx(0.7)}
    assert skiplab.connection(f"{name}(init=0.25)", DIM, layout).alpha.item() == 0.25


def test_rezero_gradient_reaches_alpha_while_the_branch_is_off():
    x, branch = make_input("seq"), make_branch("seq")
    conn = skiplab.connection("ReZero", DIM)
    dy = torch.randn(x.shape)
    (conn(x, branch) * dy).sum().backward()
    torch.testing.assert_close(conn.alpha.grad, (dy * branch(x)).sum())  # ∂y/∂α = F(x)
    torch.testing.assert_close(x.grad, dy)  # α = 0: only the skip carries the gradient


@pytest.mark.parametrize("depth, expect", [(12, 0.1), (18, 0.1), (24, 1e-5), (36, 1e-6), (100, 1e-6)])
def test_layerscale_init_follows_cait_depth_rule(depth, expect):
    assert layerscale_init(depth) == expect
    conn = skiplab.connection("LayerScale", DIM, place=Place(1, "encoder", depth))
    assert torch.equal(conn.scale, torch.full((DIM,), expect))


def test_layerscale_is_x_plus_lambda_times_f_of_ln_x(layout):
    x, branch = make_input(layout), make_branch(layout)
    conn = skiplab.connection("LayerScale(init=0.1)", DIM, layout)
    randomise_affine(conn)
    lam = torch.linspace(-0.5, 1.5, DIM)
    with torch.no_grad():
        conn.scale.copy_(lam)
    if layout == "seq":
        expect = x + lam * branch(ln(x, conn.norm.weight, conn.norm.bias))
    else:
        expect = x + lam.view(1, -1, 1, 1) * branch(conv_ln(x, conn.norm.weight, conn.norm.bias))
    torch.testing.assert_close(conn(x, branch), expect)
    assert type(final_norm("LayerScale", DIM)) is torch.nn.LayerNorm
    assert type(final_norm("LayerScale+RMS", DIM)).__name__ == "RMSNorm"


@pytest.mark.parametrize("layer", [1, 4, 9])
def test_lns_scales_the_normalised_input_by_one_over_root_layer(layer, layout):
    x, branch = make_input(layout), make_branch(layout)
    lns = skiplab.connection("LNS", DIM, layout, place=Place(layer, "encoder", 12))
    plain = skiplab.connection("PreLN", DIM, layout)
    randomise_affine(lns)
    plain.load_state_dict(lns.state_dict())
    assert lns.spec == "LNS" and lns.stats() == {"scale": 1 / math.sqrt(layer)}  # built without a model: LN
    h = lns.norm(x)
    torch.testing.assert_close(lns(x, branch), x + branch(h / math.sqrt(layer)))
    if layer == 1:  # LNS at l = 1 is PreLN exactly
        assert torch.equal(lns(x, branch), plain(x, branch))


def test_lns_in_a_gpt_gives_both_sublayers_of_layer_l_the_same_factor():
    model = GPT(GPTConfig(vocab_size=20, d_model=16, heads=2, layers=4, ffn_dim=32, context=8, connection="LNS"))
    factors = [(layer.conn_attn.factor, layer.conn_mlp.factor) for layer in model.layers]
    assert factors == [(1 / math.sqrt(l), 1 / math.sqrt(l)) for l in range(1, 5)]
    assert type(model.norm) is torch.nn.LayerNorm  # the final norm is unchanged


@pytest.mark.parametrize("alpha, layers, post", [(0.25, 12, 3), (0.25, 24, 6), (0.25, 6, 1), (0.29, 100, 29),
                                                 (0.0, 8, 0), (1.0, 8, 8)])
def test_mixln_post_norm_layers_are_floor_alpha_l(alpha, layers, post):
    assert post_layers(alpha, layers) == post
    kinds = [skiplab.connection(f"MixLN(alpha={alpha})", DIM, place=Place(l, "encoder", layers)).post
             for l in range(1, layers + 1)]
    assert kinds == [True] * post + [False] * (layers - post)


def test_mixln_layers_are_post_ln_then_pre_ln():
    x, branch = make_input("seq"), make_branch("seq")
    first, last = (skiplab.connection("MixLN", DIM, place=Place(l, "encoder", 12)) for l in (3, 4))
    for conn in (first, last):
        randomise_affine(conn)
    w, b = first.norm.weight, first.norm.bias
    torch.testing.assert_close(first(x, branch), ln(x + branch(x), w, b))
    w, b = last.norm.weight, last.norm.bias
    torch.testing.assert_close(last(x, branch), x + branch(ln(x, w, b)))
    assert type(final_norm("MixLN", DIM, layers=12)) is torch.nn.LayerNorm
    assert type(final_norm("MixLN(alpha=1)", DIM, layers=12)) is torch.nn.Identity
    with pytest.raises(ValueError, match=r"option alpha: must be in \[0, 1\], got 1.5"):
        skiplab.connection("MixLN(alpha=1.5)", DIM)


def _same_model(spec_a: str, spec_b: str, family: str, load: bool = True) -> tuple[torch.nn.Module, torch.nn.Module]:
    """Two models of ``family`` with the same weights: loaded from one into the other (``load``), or drawn from
    the same seed (designs whose parameters are named differently, whose own start at fixed values)."""
    if family == "gpt":
        def build(spec):
            return GPT(GPTConfig(vocab_size=30, d_model=16, heads=2, layers=4, ffn_dim=32, context=10,
                                 connection=spec)).eval()
    else:
        def build(spec):
            return Transformer(TransformerConfig(vocab_size=30, d_model=16, heads=2, ffn_dim=32, encoder_layers=3,
                                                 decoder_layers=2, dropout=0, attention_dropout=0,
                                                 connection=spec)).eval()
    if not load:
        seed = torch.initial_seed()
        a = build(spec_a)
        torch.manual_seed(seed)
        return a, build(spec_b)
    a, b = build(spec_a), build(spec_b)
    randomise_affine(a)
    b.load_state_dict(a.state_dict())  # the same parameters under the same names
    return a, b


@pytest.mark.parametrize("family", ["gpt", "transformer"])
@pytest.mark.parametrize("alpha, equals", [(0, "PreLN"), (1, "PostLN")])
@torch.no_grad()
def test_mixln_at_alpha_0_is_preln_and_at_1_postln(family, alpha, equals):
    mix, ref = _same_model(f"MixLN(alpha={alpha})", equals, family)
    tokens = torch.randint(1, 30, (2, 7), generator=torch.Generator().manual_seed(0))
    args = (tokens,) if family == "gpt" else (tokens, tokens)
    assert torch.equal(mix(*args), ref(*args))  # the same operations on the same weights, in the same order


# ---------------------------------------------------------------- DeepNorm

@pytest.mark.parametrize("n", [6, 100])
def test_deepnorm_constants_follow_deepnets_table(n):
    from skiplab.connections.deepnorm import deepnorm_constants
    m = n // 2
    assert deepnorm_constants(Place(1, "encoder", n, 0)) == pytest.approx(((2 * n) ** 0.25, (8 * n) ** -0.25))
    assert deepnorm_constants(Place.decoder_only(1, n)) == pytest.approx(((2 * n) ** 0.25, (8 * n) ** -0.25))
    enc = deepnorm_constants(Place(1, "encoder", n, m))
    assert enc == pytest.approx((0.81 * (n**4 * m) ** (1 / 16), 0.87 * (n**4 * m) ** (-1 / 16)))
    assert deepnorm_constants(Place(1, "decoder", n, m)) == pytest.approx(((3 * m) ** 0.25, (12 * m) ** -0.25))


def test_deepnorm_matches_the_papers_worked_numbers():
    from skiplab.connections.deepnorm import deepnorm_constants
    # decoder-only, 12 and 48 layers: alpha 2.213 and 3.130, beta 0.320 and 0.226 ((24)^1/4, (96)^-1/4, ...)
    assert deepnorm_constants(Place.decoder_only(1, 12)) == pytest.approx((2.2134, 0.3195), abs=1e-4)
    assert deepnorm_constants(Place.decoder_only(1, 48)) == pytest.approx((3.1302, 0.2259), abs=1e-4)


def test_deepnorm_is_ln_of_alpha_x_plus_f(layout):
    x, branch = make_input(layout), make_branch(layout)
    conn = skiplab.connection("DeepNorm", DIM, layout, place=Place(2, "encoder", 6))
    randomise_affine(conn)
    alpha = 12 ** 0.25
    assert conn.alpha == pytest.approx(alpha)
    norm = ln if layout == "seq" else conv_ln
    torch.testing.assert_close(conn(x, branch), norm(alpha * x + branch(x), conn.norm.weight, conn.norm.bias))
    assert type(final_norm("DeepNorm", DIM, layers=6)) is torch.nn.Identity


def _xavier_std(w, gain=1.0):
    fan_out, fan_in = w.shape
    return gain * math.sqrt(2.0 / (fan_in + fan_out))


def test_deepnorm_draws_value_output_and_ffn_with_gain_beta_in_a_gpt():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=30, d_model=64, heads=4, layers=8, ffn_dim=256, context=8, connection="DeepNorm"))
    beta = 64 ** -0.25  # decoder-only, M = 8: (8M)^-1/4
    layer = model.layers[3]
    assert layer.conn_attn.beta == pytest.approx(beta)
    q, k, v = layer.attn.qkv_proj.weight.detach().chunk(3)
    for w, gain in ((q, 1.0), (k, 1.0), (v, beta), (layer.attn.out_proj.weight.detach(), beta),
                    (layer.mlp.up.weight.detach(), beta), (layer.mlp.down.weight.detach(), beta)):
        assert w.std().item() == pytest.approx(_xavier_std(w, gain), rel=0.06)  # 4096+ draws: std within ~2%
    assert type(model.norm) is torch.nn.Identity


def test_deepnorm_in_the_transformer_uses_each_stacks_own_beta():
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(vocab_size=30, d_model=64, heads=4, ffn_dim=256, encoder_layers=6,
                                          decoder_layers=6, connection="DeepNorm"))
    enc_beta, dec_beta = 0.87 * (6**5) ** (-1 / 16), 72 ** -0.25
    enc, dec = model.encoder.layers[0], model.decoder.layers[5]
    assert enc.conn_attn.alpha == pytest.approx(0.81 * (6**5) ** (1 / 16)) and dec.conn_cross.alpha == pytest.approx(18**0.25)
    for w, gain in ((enc.self_attn.qkv_proj.weight.detach().chunk(3)[2], enc_beta),
                    (enc.ffn[2].weight.detach(), enc_beta),
                    (dec.cross_attn.kv_proj.weight.detach().chunk(2)[1], dec_beta),
                    (dec.cross_attn.out_proj.weight.detach(), dec_beta),
                    (dec.cross_attn.q_proj.weight.detach(), 1.0)):
        assert w.std().item() == pytest.approx(_xavier_std(w, gain), rel=0.06)


# ---------------------------------------------------------------- Peri-LN and Sandwich-LN

@pytest.mark.parametrize("name", ["PeriLN", "SandwichLN"])
def test_peri_and_sandwich_normalise_the_branchs_input_and_output(name, layout):
    x, branch = make_input(layout), make_branch(layout)
    conn = skiplab.connection(name, DIM, layout)
    randomise_affine(conn)
    norm = ln if layout == "seq" else conv_ln
    inner = norm(x, conn.norm_in.weight, conn.norm_in.bias)
    torch.testing.assert_close(conn(x, branch), x + norm(branch(inner), conn.norm_out.weight, conn.norm_out.bias))
    assert type(final_norm(name, DIM)) is torch.nn.LayerNorm


def test_periln_normalises_the_embeddings_and_sandwich_does_not():
    from skiplab import input_norm
    assert type(input_norm("PeriLN", DIM)) is torch.nn.LayerNorm
    assert type(input_norm("PeriLN+RMS", DIM)).__name__ == "RMSNorm"
    for spec in ("PeriLN(embed=no)", "SandwichLN", "PreLN"):
        assert type(input_norm(spec, DIM)) is torch.nn.Identity
    gpt = GPT(GPTConfig(vocab_size=30, d_model=16, heads=2, layers=2, ffn_dim=32, context=8, connection="PeriLN"))
    tokens = torch.randint(0, 30, (2, 6), generator=torch.Generator().manual_seed(0))
    seen = {}
    gpt.layers[0].register_forward_pre_hook(lambda m, args: seen.__setitem__("x", args[0]))
    gpt(tokens)
    torch.testing.assert_close(seen["x"], ln(gpt.embed(tokens), gpt.embed_norm.weight, gpt.embed_norm.bias))


# ---------------------------------------------------------------- DyT

def test_dyt_is_gamma_tanh_alpha_x_plus_beta(layout):
    from skiplab.connections.norms import make_norm
    x = make_input(layout)
    dyt = make_norm("DyT", DIM, layout)
    assert dyt.alpha.item() == 0.5 and torch.equal(dyt.weight, torch.ones(DIM)) and torch.equal(dyt.bias, torch.zeros(DIM))
    with torch.no_grad():
        dyt.alpha.fill_(0.8)
        dyt.weight.copy_(torch.linspace(0.5, 2.0, DIM))
        dyt.bias.copy_(torch.linspace(-1.0, 1.0, DIM))
    shape = (-1,) if layout == "seq" else (-1, 1, 1)
    expect = dyt.weight.view(shape) * torch.tanh(0.8 * x) + dyt.bias.view(shape)
    torch.testing.assert_close(dyt(x), expect)
    conn = skiplab.connection("1xSkip+DyT", DIM, layout)
    branch = make_branch(layout)
    torch.testing.assert_close(conn(x, branch), torch.tanh(0.5 * (x + branch(x))))  # γ = 1, β = 0 at start


def test_dyt_in_a_pre_norm_gpt_replaces_every_norm():
    model = GPT(GPTConfig(vocab_size=30, d_model=16, heads=2, layers=2, ffn_dim=32, context=8, connection="PreDyT"))
    kinds = {type(m).__name__ for m in model.modules() if type(m).__name__ in ("DyT", "LayerNorm", "RMSNorm")}
    assert kinds == {"DyT"} and type(model.norm).__name__ == "DyT"


def test_dyt_is_refused_where_the_design_needs_a_normalisation_statistic():
    with pytest.raises(ValueError, match=r"rSkip takes no normalisation \+DyT \(allowed: \+LN, \+BN, \+RMS\)"):
        skiplab.connection("2rSkip+DyT", DIM)


# ---------------------------------------------------------------- Admin

def test_admin_closed_form_omega():
    from skiplab.connections.admin import admin_omega
    assert admin_omega(24) == pytest.approx(2.60, abs=0.005) and admin_omega(48) == pytest.approx(3.40, abs=0.005)
    for n in (12, 200):
        assert admin_omega(n) == pytest.approx(math.sqrt((n + 1) / math.log(n + 1) - 1))
    gpt = GPT(GPTConfig(vocab_size=30, d_model=16, heads=2, layers=6, ffn_dim=32, context=8, connection="Admin"))
    assert torch.equal(gpt.layers[2].conn_mlp.omega, torch.full((16,), admin_omega(12)))  # 6 layers x 2 sub-layers
    mt = Transformer(TransformerConfig(vocab_size=30, d_model=16, heads=2, ffn_dim=32, encoder_layers=6, decoder_layers=6,
                                       connection="Admin"))
    assert mt.decoder.layers[0].conn_cross.omega[0].item() == pytest.approx(admin_omega(18))  # 6 x 3 sub-layers
    assert type(gpt.norm) is torch.nn.Identity


def test_admin_is_ln_of_omega_x_plus_f(layout):
    x, branch = make_input(layout), make_branch(layout)
    conn = skiplab.connection("Admin", DIM, layout, place=Place(1, "encoder", 6))
    randomise_affine(conn)
    omega = torch.linspace(0.5, 3.0, DIM)
    with torch.no_grad():
        conn.omega.copy_(omega)
    shape = (-1,) if layout == "seq" else (-1, 1, 1)
    norm = ln if layout == "seq" else conv_ln
    torch.testing.assert_close(conn(x, branch), norm(omega.view(shape) * x + branch(x), conn.norm.weight, conn.norm.bias))


def test_admin_profiling_follows_the_variance_chain():
    from skiplab.connections.admin import profile
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=30, d_model=16, heads=2, layers=3, ffn_dim=32, context=8,
                          connection="Admin(init=profile)"))
    tokens = torch.randint(0, 30, (4, 8), generator=torch.Generator().manual_seed(1))
    omegas = profile(model, lambda: model(tokens))
    assert len(omegas) == 6 and omegas["layers.0.conn_attn"] == 1.0
    seen = []  # each connection's skip input and branch output in a forward with the profiled ω
    for _, conn in skiplab.iter_connections(model):
        conn.register_forward_hook(lambda m, args, out: seen.append((m.omega[0].item(), args[0], args[1](args[0]))))
    with torch.no_grad():
        model.eval()(tokens)
    for (omega, s, f), (after, _, _) in zip(seen, seen[1:]):  # ω_{i+1}² = Var(ω_i x) + Var(F_i)
        assert after == pytest.approx(math.sqrt((omega * s).var(unbiased=False).item() + f.var(unbiased=False).item()),
                                      rel=1e-5)
    assert profile(GPT(GPTConfig(vocab_size=30, d_model=16, heads=2, layers=1, ffn_dim=32, context=8,
                                 connection="Admin(init=closed)")), lambda: None) == {}  # the closed form needs no data


# ---------------------------------------------------------------- hyper-connections

def test_hc_static_mixes_streams_as_the_hyper_connection_matrix_says():
    torch.manual_seed(0)
    n, x = 3, torch.randn(2, 5, 3, DIM)  # (B, T, n, D) streams
    branch = make_branch("seq")
    conn = skiplab.connection("HC(n=3,kind=static)", DIM, place=Place(5, "encoder", 8))  # k = 4: e_{4 mod 3} = e_1
    assert conn.a_m.tolist() == [0.0, 1.0, 0.0] and torch.equal(conn.a_r, torch.eye(3)) and conn.b.tolist() == [1.0] * 3
    randomise_affine(conn)
    a_m, a_r, b = torch.tensor([0.2, 0.9, -0.3]), torch.tensor([[1.0, 0.2, 0.0], [0.1, 0.8, 0.3], [0.0, -0.4, 1.1]]), \
        torch.tensor([0.5, 1.5, -1.0])
    with torch.no_grad():
        conn.a_m.copy_(a_m), conn.a_r.copy_(a_r), conn.b.copy_(b)
    h0 = sum(a_m[i] * x[..., i, :] for i in range(n))
    f = branch(ln(h0, conn.norm.weight, conn.norm.bias))
    expect = torch.stack([b[j] * f + sum(a_r[i, j] * x[..., i, :] for i in range(n)) for j in range(n)], dim=-2)
    torch.testing.assert_close(conn(x, branch), expect)


def test_dynamic_hc_starts_as_static_and_its_weights_then_follow_the_streams():
    torch.manual_seed(0)
    x, branch = torch.randn(2, 4, 4, DIM), make_branch("seq")
    dyn, stat = (skiplab.connection(f"HC(kind={k})", DIM) for k in ("dynamic", "static"))
    stat.load_state_dict({k: v for k, v in dyn.state_dict().items() if k in stat.state_dict()})
    assert torch.equal(dyn(x, branch), stat(x, branch))  # W = 0: the dynamic terms vanish
    with torch.no_grad():
        dyn.w_b.copy_(torch.linspace(-1, 1, DIM))
    _, _, b = dyn.weights(x)
    hn = ln(x, dyn.stream_norm.weight, dyn.stream_norm.bias)
    torch.testing.assert_close(b, 0.01 * torch.tanh(hn @ dyn.w_b) + 1.0)


def test_dynamic_hc_without_tanh_is_linear_in_the_normalised_streams():
    torch.manual_seed(0)
    x = torch.randn(2, 4, 4, DIM)
    conn = skiplab.connection("HC(tanh=no)", DIM)
    with torch.no_grad():
        conn.w_b.copy_(torch.linspace(-3, 3, DIM))
        conn.w_r.copy_(torch.randn(DIM, 4))
    a_m, a_r, b = conn.weights(x)
    hn = ln(x, conn.stream_norm.weight, conn.stream_norm.bias)
    torch.testing.assert_close(b, 0.01 * (hn @ conn.w_b) + 1.0)  # beyond tanh's range: |H̄ W_β| reaches > 1
    assert (hn @ conn.w_b).abs().max() > 1
    torch.testing.assert_close(a_r, 0.01 * (hn @ conn.w_r) + torch.eye(4))
    # refused when parsed (it passed parse_spec, and only building failed), quoting the spec as every spec error does
    with pytest.raises(ValueError, match=r"^bad connection spec 'HC\(kind=static,tanh=no\)': tanh=no acts on the "
                                         r"dynamic weights .*kind=static has none$"):
        skiplab.parse_spec("HC(kind=static,tanh=no)")


@pytest.mark.parametrize("family", ["gpt", "transformer"])
@torch.no_grad()
def test_hc_with_one_stream_is_preln(family):
    torch.manual_seed(3)
    hc, ref = _same_model("HC(n=1)", "PreLN", family, load=False)
    tokens = torch.randint(1, 30, (2, 7), generator=torch.Generator().manual_seed(0))
    args = (tokens,) if family == "gpt" else (tokens, tokens)
    torch.testing.assert_close(hc(*args), ref(*args), rtol=0, atol=0)


def test_hc_is_refused_by_the_resnet_with_its_reason():
    from skiplab.models import PreActResNetConfig
    with pytest.raises(ValueError, match="HC needs a stack that holds its residual streams"):
        PreActResNetConfig(depth=20, connection="HC")


def test_sinkhorn_makes_the_mixing_matrix_doubly_stochastic():
    from skiplab.connections.hyper import sinkhorn
    logits = torch.randn(5, 4, 4, generator=torch.Generator().manual_seed(0))
    m = sinkhorn(logits, 20)
    assert (m > 0).all()
    torch.testing.assert_close(m.sum(-1), torch.ones(5, 4))  # rows: exact after the last step
    torch.testing.assert_close(m.sum(-2), torch.ones(5, 4))  # columns: converged in 20 iterations at this spread
    wide = logits * 2  # a wider spread converges more slowly: 20 iterations leave about 1e-2, 100 none
    first, later = ((sinkhorn(wide, k).sum(-2) - 1).abs().max() for k in (20, 100))
    assert later < 1e-5 < first
    # exp(I) for n = 4: diagonal e / (e + 3), the rest 1 / (e + 3) (symmetric: one step converges)
    torch.testing.assert_close(sinkhorn(torch.eye(4)), (torch.ones(4, 4) + (math.e - 1) * torch.eye(4)) / (math.e + 3))


def test_sinkhorn_gradient_is_that_of_the_unrolled_iterations():
    from skiplab.connections.hyper import sinkhorn

    def unrolled(logits, iters):  # the iteration as written, differentiated by autograd
        m = torch.exp(logits)
        for _ in range(iters):
            m = m / m.sum(-2, keepdim=True)
            m = m / m.sum(-1, keepdim=True)
        return m

    gen = torch.Generator().manual_seed(1)
    for shape, iters in (((4, 4), 20), ((5, 3, 3), 7), ((2, 3, 4, 4), 20)):
        logits = (2 * torch.randn(shape, generator=gen, dtype=torch.float64)).requires_grad_()
        weight = torch.randn(shape, generator=gen, dtype=torch.float64)
        got = sinkhorn(logits, iters)
        ref = unrolled(logits, iters)
        torch.testing.assert_close(got, ref)
        g_got, = torch.autograd.grad((got * weight).sum(), logits)
        g_ref, = torch.autograd.grad((ref * weight).sum(), logits)
        torch.testing.assert_close(g_got, g_ref)
        assert g_got.abs().max() > 1e-3  # a gradient to compare, not zeros
    assert torch.autograd.gradcheck(lambda z: sinkhorn(z, 5), (torch.randn(2, 3, 3, dtype=torch.float64,
                                                                          requires_grad=True),))
    half = sinkhorn(torch.randn(2, 4, 4, dtype=torch.bfloat16), 20)  # computed in float32, returned in bf16
    assert half.dtype == torch.bfloat16


def test_mhc_matches_its_equations():
    from skiplab.connections.hyper import sinkhorn
    torch.manual_seed(0)
    n, x, branch = 4, torch.randn(2, 3, 4, DIM), make_branch("seq")
    conn = skiplab.connection("mHC", DIM, place=Place(2, "encoder", 4))
    b_pre, b_post, b_res = torch.randn(4), torch.randn(4), torch.randn(4, 4)  # away from their start (all 0)
    with torch.no_grad():
        conn.phi.normal_(0, 0.5)
        conn.alpha.copy_(torch.tensor([0.3, -0.2, 0.7]))
        conn.b_pre.copy_(b_pre), conn.b_post.copy_(b_post), conn.b_res.copy_(b_res)
    flat = x.flatten(-2)
    xt = flat / torch.sqrt(flat.pow(2).mean(-1, keepdim=True) + torch.finfo(x.dtype).eps)
    proj = xt @ conn.phi
    pre = torch.sigmoid(0.3 * proj[..., :4] + b_pre)
    post = 2 * torch.sigmoid(-0.2 * proj[..., 4:8] + b_post)
    res = sinkhorn(0.7 * proj[..., 8:].reshape(2, 3, 4, 4) + b_res)
    h0 = torch.einsum("btn,btnd->btd", pre, x)
    f = branch(ln(h0, conn.norm.weight, conn.norm.bias))
    expect = torch.einsum("btij,btjd->btid", res, x) + post[..., None] * f[..., None, :]
    torch.testing.assert_close(conn(x, branch), expect)
    got_pre, got_res, got_post = conn.weights(x)
    torch.testing.assert_close(got_res.sum(-1), torch.ones(2, 3, 4))
