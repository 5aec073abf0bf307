"""LAuReL (Menghani et al., ICML 2025, arXiv 2411.07501) on a pre-norm block, by hand: RW (Section 2.1,
y = α·F(G(x)) + β·x with (α, β) = softmax(a, b)), LR (Section 2.2, Eq. 3, y = F(G(x)) + x + B A x) and Gemma 3n's
normalised low-rank term (y = x + F(h) + RMSNorm(B A h), h = G(x)); outputs and gradients, the paper's
initialisation, the spec's refusals; the models build, train a step and decode incrementally. Gemma 3n's
``Gemma3nTextLaurelBlock`` itself: tests/oracles/test_oracle_laurel.py."""

import math

import pytest
import torch
import torch.nn.functional as F

import skiplab
from skiplab.connections.laurel import column_orthogonal
from skiplab.models import GPTConfig
from tests.connections.model_checks import (gpt_step_and_incremental_decoding, resnet_step, tiny_gpt, tiny_resnet,
                                            tiny_transformer, transformer_step)
from tests.connections.test_formulas import EPS, ln
from tests.conftest import DIM, make_branch, make_input, randomise_affine


def rms(h, w):
    return h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + EPS) * w


def randomise(conn, seed=4):
    """Every LAuReL parameter away from its start (B off 0, the logits apart), the norms' affine too."""
    randomise_affine(conn)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name in ("logits", "a", "b"):
            if hasattr(conn, name):
                p = getattr(conn, name)
                p.copy_(torch.randn(p.shape, generator=g))


def outputs_and_gradients_agree(conn, x, branch, want_fn):
    """conn(x, F) against ``want_fn()`` (the formula written out from the same tensors): outputs, and the
    gradients of a random read-out with respect to x, every parameter of the connection and of the branch."""
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(3))
    y, want = conn(x, branch), want_fn()
    torch.testing.assert_close(y, want)
    params = [x, *conn.parameters(), *branch.parameters()]
    got = torch.autograd.grad((y * dy).sum(), params)
    exp = torch.autograd.grad((want * dy).sum(), params)
    for g, e in zip(got, exp):
        assert e.abs().max() > 0
        torch.testing.assert_close(g, e)
    return dy


def test_rw_is_alpha_f_plus_beta_x_with_softmax_weights():
    conn = skiplab.connection("LAuReL", DIM)
    randomise(conn)
    x, branch = make_input("seq"), make_branch("seq")
    a, b = conn.logits
    alpha = torch.exp(a) / (torch.exp(a) + torch.exp(b))
    beta = torch.exp(b) / (torch.exp(a) + torch.exp(b))
    dy = outputs_and_gradients_agree(conn, x, branch, lambda: alpha * branch(ln(x, conn.norm.weight, conn.norm.bias)) + beta * x)
    # ∂L/∂a = α β (⟨dy, F⟩ − ⟨dy, x⟩), ∂L/∂b = −∂L/∂a: the softmax's Jacobian, by hand
    conn.logits.grad = None
    (conn(x, branch) * dy).sum().backward()
    f = branch(ln(x, conn.norm.weight, conn.norm.bias))
    da = (alpha * beta * ((dy * f).sum() - (dy * x).sum())).detach()
    torch.testing.assert_close(conn.logits.grad, torch.stack([da, -da]))
    assert conn.stats() == {"alpha": pytest.approx(alpha.item()), "beta": pytest.approx(beta.item())}


def test_rw_starts_at_one_half_each():
    conn = skiplab.connection("LAuReL", DIM)
    x, branch = make_input("seq"), make_branch("seq")
    torch.testing.assert_close(conn(x, branch), 0.5 * branch(ln(x)) + 0.5 * x)
    assert conn.stats() == {"alpha": 0.5, "beta": 0.5} and sum(p.numel() for p in conn.parameters()) == 2 + 2 * DIM


def test_lr_is_f_plus_x_plus_b_a_x_outputs_and_gradients():
    conn = skiplab.connection("LAuReL(form=lr,rank=2)", DIM)
    randomise(conn)
    x, branch = make_input("seq"), make_branch("seq")
    A, B = conn.a, conn.b  # (r, D), (D, r)
    assert A.shape == (2, DIM) and B.shape == (DIM, 2)
    dy = outputs_and_gradients_agree(conn, x, branch,
                                     lambda: branch(ln(x, conn.norm.weight, conn.norm.bias)) + x + x @ A.t() @ B.t())
    # closed forms: ∂L/∂B = Σ_positions dy (A x)ᵀ, ∂L/∂A = Σ_positions Bᵀ dy xᵀ
    conn.zero_grad()
    (conn(x, branch) * dy).sum().backward()
    xs, dys = x.detach().reshape(-1, DIM), dy.reshape(-1, DIM)
    torch.testing.assert_close(conn.b.grad, dys.t() @ (xs @ A.detach().t()))
    torch.testing.assert_close(conn.a.grad, (dys @ B.detach()).t() @ xs)


def test_lr_starts_as_the_pre_norm_block_with_the_papers_initialisation():
    """B = 0 (LoRA's scheme, which the paper follows); A_{j,i} = 1/√(rD) where i mod r = j (footnote 2)."""
    conn = skiplab.connection("LAuReL(form=lr,rank=4)", 10)
    assert torch.equal(conn.b, torch.zeros(10, 4))
    want = torch.zeros(4, 10)
    for i in range(10):
        want[i % 4, i] = 1 / math.sqrt(4 * 10)
    assert torch.equal(conn.a, want) and torch.equal(column_orthogonal(4, 10), want)
    x, branch = make_input("seq", dim=10), make_branch("seq", dim=10)
    torch.testing.assert_close(conn(x, branch), x + branch(ln(x)))
    assert conn.stats() == {"rank": 4, "ba_norm": 0.0}


def test_lr_with_norm_rms_is_x_plus_f_plus_rmsnorm_of_b_a_h():
    conn = skiplab.connection("LAuReL(form=lr,rank=3,norm=rms)", DIM)
    randomise(conn)
    x, branch = make_input("seq"), make_branch("seq")

    def want():
        h = ln(x, conn.norm.weight, conn.norm.bias)
        return x + branch(h) + rms(h @ conn.a.t() @ conn.b.t(), conn.lr_norm.weight)

    outputs_and_gradients_agree(conn, x, branch, want)
    stats = conn.stats()
    assert set(stats) == {"rank", "ba_norm", "gain_mean"}
    assert stats["ba_norm"] == pytest.approx(torch.linalg.matrix_norm(conn.b @ conn.a).item(), rel=1e-5)
    assert stats["gain_mean"] == pytest.approx(conn.lr_norm.weight.mean().item())


def test_norm_rms_starts_from_gemma_initialisation():
    """N(0, 0.02²) for A and B, as transformers initialises Gemma 3n's linear layers; gain 1."""
    torch.manual_seed(0)
    conn = skiplab.connection("LAuReL(form=lr,norm=rms)", 256)
    for p in (conn.a, conn.b):
        assert abs(p.std().item() - 0.02) < 0.002 and abs(p.mean().item()) < 0.002
    assert torch.equal(conn.lr_norm.weight, torch.ones(256))


def test_projection_skip_and_conv_layout():
    """With a projection shortcut x on the skip side is proj(x), in B A too (as in every skiplab formula), and
    norm=rms, whose term has the block input's shape, is refused; in the conv layout B A acts on the channels of
    every pixel, G normalises each example over (C, H, W)."""
    torch.manual_seed(5)
    conn = skiplab.connection("LAuReL(form=lr,rank=2)", DIM, in_dim=4)
    randomise(conn)
    x = torch.randn(3, 5, 4, requires_grad=True)
    proj, branch = torch.nn.Linear(4, DIM), torch.nn.Linear(4, DIM)
    s = proj(x)
    want = s + branch(ln(x, conn.norm.weight, conn.norm.bias)) + s @ conn.a.t() @ conn.b.t()
    torch.testing.assert_close(conn(x, branch, skip=proj), want)
    with pytest.raises(ValueError, match="projection shortcut"):
        skiplab.connection("LAuReL(form=lr,norm=rms)", DIM, in_dim=4)
    same_width = skiplab.connection("LAuReL(form=lr,rank=2,norm=rms)", DIM)
    with pytest.raises(ValueError, match="projection shortcut"):
        same_width(make_input("seq"), make_branch("seq"), skip=make_branch("seq", seed=5))

    conv = skiplab.connection("LAuReL(form=lr,rank=2)", DIM, layout="conv")
    randomise(conv)
    x, branch = make_input("conv"), make_branch("conv")
    low = torch.einsum("rc,nchw->nrhw", conv.a, x)
    low = torch.einsum("cr,nrhw->nchw", conv.b, low)
    want = x + branch(F.group_norm(x, 1, conv.norm.weight, conv.norm.bias, EPS)) + low
    torch.testing.assert_close(conv(x, branch), want)


def test_spec_refuses_what_form_rw_has_not_and_takes_the_model_norm():
    for bad, match in [("LAuReL(norm=rms)", r"form=rw\) has no low-rank term"), ("LAuReL(rank=4)", "form=rw"),
                       ("LAuReL(form=pb)", "must be one of rw, lr, pa"), ("LAuReL(form=lr,rank=0)", ">= 1"),
                       ("LAuReL+BN", "no normalisation")]:
        with pytest.raises(ValueError, match=match):
            skiplab.parse_spec(bad)
    with pytest.raises(ValueError, match=r"form=rw\) has no low-rank term"):
        GPTConfig(connection="LAuReL(norm=rms)")
    assert skiplab.parse_spec("LAuReL(form=lr)", norm="RMS").norm == "RMS"
    assert skiplab.connection("LAuReL(form=lr,rank=32)", 8).spec == "LAuReL(form=lr)"
    assert isinstance(skiplab.final_norm("LAuReL", 8, layers=3, norm="RMS"), torch.nn.RMSNorm)
    assert isinstance(skiplab.final_norm("LAuReL(form=lr)", 8, layers=3), torch.nn.LayerNorm)


# --- the models ------------------------------------------------------------------------------------------------------

SPECS = ["LAuReL", "LAuReL(form=lr,rank=4)", "LAuReL(form=lr,rank=4,norm=rms)"]


@pytest.mark.parametrize("spec", SPECS)
def test_gpt_of_laurel_trains_a_step_and_decodes_incrementally(spec):
    model = tiny_gpt(spec, norm="RMS")
    assert isinstance(model.norm, torch.nn.RMSNorm) and model.layers[0].conn_attn.spec.startswith("LAuReL+RMS")
    if "lr" in spec and "rms" not in spec:  # the GPT's own initialisation leaves the connection's A, B alone
        assert torch.equal(model.layers[1].conn_mlp.b, torch.zeros(32, 4))
    gpt_step_and_incremental_decoding(model)


@pytest.mark.parametrize("spec", SPECS)
def test_transformer_of_laurel_trains_a_step(spec):
    model = tiny_transformer(spec)
    assert isinstance(model.encoder.norm, torch.nn.LayerNorm) and isinstance(model.decoder.norm, torch.nn.LayerNorm)
    transformer_step(model)


def test_preact_resnet_of_laurel_trains_a_step_and_refuses_norm_rms():
    """The CNN's stage-changing blocks have a projection shortcut: form=lr's B A reads proj(x); norm=rms is refused."""
    for spec in ("LAuReL", "LAuReL(form=lr,rank=4)"):
        resnet_step(tiny_resnet(spec))
    with pytest.raises(ValueError, match="projection shortcut"):
        tiny_resnet("LAuReL(form=lr,norm=rms)")
