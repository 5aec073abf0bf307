"""``LAuReL(form=pa, rank=r, k=K)`` (Menghani et al., ICML 2025, arXiv 2411.07501, Section 2.3, LAuReL-PA): in a stack,
against the paper's equation written out by hand over the sub-layers (outputs and gradients, width 64), failing under a
mutation of the mix; the start (the plain pre-norm model exactly), k = 1 (form=lr with a learned scale), incremental
decoding, both Transformer stacks, the refusals, and what it reports."""

import re

import pytest
import torch
import torch.nn.functional as F

import skiplab
from skiplab.connections import laurel, parse_spec
from skiplab.connections.laurel import column_orthogonal
from skiplab.models import GPT, GPTConfig
from tests.connections.model_checks import gpt_step_and_incremental_decoding, tiny_resnet
from tests.connections.test_denseformer import decoding_steps_give_the_full_pass, gpt, tokens, transformer


def randomise(model, seed=5):
    """Every LAuReL parameter away from its start: A, B (B off 0), γ and the norms' gains."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, laurel.LAuReL):
                for p in m.parameters():
                    p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * (0.3 if p.dim() == 2 else 1.0)
                            + (1.0 if p.dim() == 1 else 0.0))


def hand(m: GPT, x: torch.Tensor, k: int) -> torch.Tensor:
    """The paper's Eq. for every sub-layer i of the stack, in order: x_{i+1} = F(G(x_i)) + x_i +
    Σ_{j=0}^{min(k, i+1)−1} γ_{i,j} B_i A_i x_{i−j}, x_0 the embeddings; the sum written term by term."""
    h = m.embed(x) + (m.pos_embed.weight[: x.shape[1]] if m.pos_embed is not None else 0)
    inputs = []
    for layer in m.layers:
        for conn, f in ((layer.conn_attn, lambda u: layer.attn(u, causal=True)), (layer.conn_mlp, layer.mlp)):
            inputs.append(h)
            i = len(inputs) - 1
            term = sum(conn.gamma[j] * (inputs[i - j] @ conn.a.T @ conn.b.T) for j in range(min(k, i + 1)))
            h = h + f(conn.norm(h)) + term
    return m.logits(m.norm(h))


def outputs_and_gradients_agree(m: GPT, k: int) -> None:
    x = tokens()
    out, ref = m(x), hand(m, x, k)
    torch.testing.assert_close(out, ref)
    params = list(m.parameters())
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=out.dtype)
    got = torch.autograd.grad((out * w).sum(), params)
    want = torch.autograd.grad((ref * w).sum(), params)
    for (name, _), a, b in zip(m.named_parameters(), got, want):
        torch.testing.assert_close(a, b, msg=name)
        if re.search(r"conn_\w+\.(a|b|gamma)$", name):
            assert b.abs().sum() > 0, name


@pytest.mark.parametrize("spec, k", [("LAuReL(form=pa,rank=8)", 4), ("LAuReL+RMS(form=pa,rank=4,k=2)", 2),
                                     ("LAuReL(form=pa,rank=4,k=9)", 9)])
def test_the_mix_of_earlier_inputs_is_the_papers_against_a_hand_written_forward(spec, k):
    m = gpt(spec, layers=4).double()
    randomise(m)
    outputs_and_gradients_agree(m, k)


def test_the_comparison_fails_when_the_mix_reads_the_earlier_inputs_in_the_wrong_order(monkeypatch):
    m = gpt("LAuReL(form=pa,rank=8,k=3)", layers=3).double()
    randomise(m)
    forward = laurel.LAuReL.forward
    monkeypatch.setattr(laurel.LAuReL, "forward",
                        lambda self, x, branch, skip=None, previous=(): forward(self, x, branch, skip, previous[::-1]))
    with pytest.raises(AssertionError):
        outputs_and_gradients_agree(m, 3)


def test_the_comparison_fails_when_gamma_is_left_out(monkeypatch):
    m = gpt("LAuReL(form=pa,rank=8,k=3)", layers=3).double()
    randomise(m)
    low_rank = laurel.LAuReL.low_rank
    monkeypatch.setattr(laurel.LAuReL, "low_rank", lambda self, t: low_rank(self, t) / self.gamma[0])
    with pytest.raises(AssertionError):
        outputs_and_gradients_agree(m, 3)


@torch.no_grad()
def test_at_the_start_it_is_the_plain_pre_norm_model_exactly():
    pa, plain = gpt("LAuReL(form=pa,rank=4)", layers=3), gpt("PreLN", layers=3)
    missing, unexpected = pa.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and all(re.search(r"\.(a|b|gamma)$", n) for n in missing)
    conn = pa.layers[1].conn_mlp
    assert torch.equal(conn.b, torch.zeros(64, 4)) and torch.equal(conn.a, column_orthogonal(4, 64))
    assert torch.equal(conn.gamma, torch.ones(4))
    x = tokens()
    assert torch.equal(pa(x), plain(x))


@torch.no_grad()
def test_k_1_is_form_lr_with_a_learned_scale_on_its_term():
    pa, lr = gpt("LAuReL(form=pa,rank=4,k=1)", layers=2), gpt("LAuReL(form=lr,rank=4)", layers=2)
    randomise(lr)
    pa.load_state_dict(lr.state_dict(), strict=False)
    assert pa.across.previous == 0 and not pa.across.per_sublayer  # nothing to hand over: the layers call it
    x = tokens()
    torch.testing.assert_close(pa(x), lr(x))
    for layer in pa.layers:
        layer.conn_attn.gamma.fill_(0.0)
        layer.conn_mlp.gamma.fill_(0.0)
    assert not torch.allclose(pa(x), lr(x))


def test_parameters_are_the_papers_2rd_plus_k_a_sublayer():
    conn = skiplab.connection("LAuReL(form=pa,rank=4,k=3)", 64)
    assert sum(p.numel() for n, p in conn.named_parameters() if not n.startswith("norm")) == 2 * 4 * 64 + 3


def test_the_gpt_trains_a_step_and_decodes_incrementally():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, d_model=32, heads=4, layers=3, ffn_dim=64, context=16,
                          connection="LAuReL(form=pa,rank=4,k=3)", norm="RMS"))
    randomise(model)
    gpt_step_and_incremental_decoding(model)


def test_both_transformer_stacks_mix_their_own_inputs_and_decode_step_by_step():
    model = transformer("LAuReL(form=pa,rank=4,k=3)").double()
    randomise(model)
    assert model.encoder.across.previous == model.decoder.across.previous == 2
    src = torch.randint(0, 40, (2, 7), generator=torch.Generator().manual_seed(3))
    tgt = torch.randint(0, 40, (2, 6), generator=torch.Generator().manual_seed(4))
    loss = F.cross_entropy(model(src, tgt).transpose(1, 2), tgt)
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in model.named_parameters() if "gamma" in n)
    decoding_steps_give_the_full_pass(model.eval(), src, tgt)


@pytest.mark.parametrize("spec, problem", [
    ("LAuReL(k=3)", "k is form=pa's (the activations it mixes); LAuReL(form=rw) reads its own input only"),
    ("LAuReL(form=lr,k=2)", "k is form=pa's"),
    ("LAuReL(form=pa,norm=rms)", "norm=rms is Gemma 3n's term on form=lr"),
    ("LAuReL(form=pa,k=0)", "option k: must be an integer >= 1, got 0"),
    ("LAuReL(form=pa)+Scalars(per=sublayer)", "+Scalars runs every sub-layer itself, and LAuReL(form=pa) needs"),
    ("LAuReL(form=pa)+AttnRes", "+AttnRes runs every sub-layer itself"),
])
def test_bad_specs_are_refused_in_one_line(spec, problem):
    with pytest.raises(ValueError, match=re.escape(problem)) as err:
        parse_spec(spec)
    assert "\n" not in str(err.value) and str(err.value).startswith(f"bad connection spec {spec!r}: ")


def test_designs_that_act_elsewhere_join_it():
    m = gpt("LAuReL(form=pa,k=2)+Scalars+ValueRes", layers=2)
    assert m.layers[0].conn_attn.spec.endswith("(form=pa,k=2)+Scalars+ValueRes")
    m(tokens()).sum().backward()


def test_activation_checkpointing_and_the_resnet_refuse_it_in_one_line():
    m = gpt("LAuReL(form=pa)", layers=2).train()
    m.checkpointing = True
    with pytest.raises(ValueError, match=re.escape("runs a layer twice, which LAuReL(form=pa) cannot")):
        m(tokens())
    with pytest.raises(ValueError, match=re.escape("LAuReL(form=pa) mixes the inputs of earlier blocks")):
        tiny_resnet("LAuReL(form=pa,rank=2)")
    tiny_resnet("LAuReL(form=pa,rank=2,k=1)")  # nothing earlier to read: it builds


def test_stats_report_gamma_by_distance_and_the_norm_of_b_a():
    conn = skiplab.connection("LAuReL(form=pa,rank=2,k=3)", 8)
    randomise(conn)
    stats = conn.stats()
    assert [stats[f"pa_gamma_{j}"] for j in range(3)] == conn.gamma.tolist()
    assert stats["ba_norm"] == pytest.approx((conn.b @ conn.a).norm().item(), rel=1e-5)
    assert "form=pa, rank=2, k=3" in repr(conn)
