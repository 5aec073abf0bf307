"""``+DenseFormer(dilation=k, period=p)``: the depth-weighted averages against a hand-written forward pass (outputs and
gradients, width 64), the special cases (at the start it is the plain model, exactly; which α exist for a dilation
and a period), incremental decoding, both Transformer stacks, the bad specs, and what it reports."""

import copy
import re

import pytest
import torch
import torch.nn.functional as F

from skiplab.connections import parse_spec
from skiplab.connections.across import Across, DenseFormer, Stack
from skiplab.models import GPT, GPTConfig, Transformer, TransformerConfig


def gpt(spec, layers=4, **kw):
    torch.manual_seed(0)
    cfg = dict(vocab_size=40, d_model=64, heads=4, layers=layers, ffn_dim=128, context=16, connection=spec)
    return GPT(GPTConfig(**{**cfg, **kw})).eval()


def transformer(spec, decoder_layers=4):
    torch.manual_seed(0)
    return Transformer(TransformerConfig(vocab_size=40, d_model=64, heads=4, ffn_dim=128, encoder_layers=3,
                                         decoder_layers=decoder_layers, connection=spec)).eval()


def tokens(b=2, t=9):
    return torch.randint(0, 40, (b, t), generator=torch.Generator().manual_seed(1))


def randomise(design: DenseFormer, seed=3):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for a in design.alpha:
            a.copy_(torch.randn(a.shape, generator=g, dtype=a.dtype))


def hand(m: GPT, x: torch.Tensor, k: int, p: int) -> torch.Tensor:
    """The layers called one by one; after block i (1-based) with p | i: Y_i = Σ_{j≤i, k | i−j} α_ij X_j, the α of
    that DWA read in the order of j."""
    h = m.embed(x) + (m.pos_embed.weight[: x.shape[1]] if m.pos_embed is not None else 0)
    outs, alphas = [h], iter(m.across.designs[0].alpha)
    for i, layer in enumerate(m.layers, start=1):
        h = layer(h)
        outs.append(h)
        if i % p == 0:
            a = next(alphas)
            js = [j for j in range(i + 1) if (i - j) % k == 0]
            assert len(a) == len(js)
            h = sum(w * outs[j] for w, j in zip(a, js))
    return F.linear(m.norm(h), m.embed.weight)


@pytest.mark.parametrize("spec, k, p", [("PreLN+DenseFormer", 1, 1), ("PreRMS+DenseFormer(dilation=2)", 2, 1),
                                        ("PreLN+DenseFormer(dilation=2,period=2)", 2, 2),
                                        ("PreRMS+DenseFormer(dilation=3,period=2)", 3, 2)])
@pytest.mark.parametrize("layers", [4, 5])
def test_the_averages_are_the_papers_against_a_hand_written_forward_outputs_and_gradients(spec, k, p, layers):
    m = gpt(spec, layers=layers, mlp="swiglu" if "RMS" in spec else "gelu").double()
    randomise(m.across.designs[0])
    x = tokens()
    out, ref = m(x), hand(m, x, k, p)
    torch.testing.assert_close(out, ref)
    params = [q for q in m.parameters()]
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=out.dtype)
    got = torch.autograd.grad((out * w).sum(), params)
    want = torch.autograd.grad((ref * w).sum(), params)
    for (name, _), a, b in zip(m.named_parameters(), got, want):
        torch.testing.assert_close(a, b, msg=name)
    assert all(g.abs().sum() > 0 for (n, _), g in zip(m.named_parameters(), got) if "across" in n)


@pytest.mark.parametrize("spec", ["PreLN+DenseFormer", "PreRMS+DenseFormer(dilation=2,period=3)",
                                  "PostLN+DenseFormer(dilation=4)", "HC(n=2)+DenseFormer"])
@torch.no_grad()
def test_at_the_start_it_is_the_plain_model_exactly(spec):
    dense, plain = gpt(spec, layers=6), gpt(spec.rpartition("+")[0], layers=6)
    missing, unexpected = dense.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and missing and all(".alpha." in n for n in missing)
    x = tokens()
    assert torch.equal(dense(x), plain(x))
    randomise(dense.across.designs[0])
    assert not torch.allclose(dense(x), plain(x))


@pytest.mark.parametrize("layers, k, p, points, sources", [
    (6, 1, 1, [1, 2, 3, 4, 5, 6], {1: [0, 1], 3: [0, 1, 2, 3], 6: [0, 1, 2, 3, 4, 5, 6]}),
    (6, 2, 1, [1, 2, 3, 4, 5, 6], {1: [1], 2: [0, 2], 5: [1, 3, 5], 6: [0, 2, 4, 6]}),
    (6, 1, 3, [3, 6], {3: [0, 1, 2, 3], 6: [0, 1, 2, 3, 4, 5, 6]}),
    (8, 4, 2, [2, 4, 6, 8], {2: [2], 4: [0, 4], 6: [2, 6], 8: [0, 4, 8]}),
    (5, 2, 5, [5], {5: [1, 3, 5]}),
    (3, 1, 4, [], {}),
])
def test_dilation_and_period_decide_which_alphas_exist(layers, k, p, points, sources):
    d = Across(f"PreLN+DenseFormer(dilation={k},period={p})", Stack(layers, 8)).designs[0]
    assert d.points == points
    assert {i: d.sources(i) for i in sources} == sources
    # the code's sizes: nn.Linear((i + 1 + dilation) // dilation, 1) for 0-based i with (i + 1) % period == 0
    assert [len(a) for a in d.alpha] == [(i + k) // k for i in points]
    assert all(a.tolist() == [0.0] * (len(a) - 1) + [1.0] for a in d.alpha)
    m = d.reads()
    assert torch.equal(m, torch.eye(layers + 1))  # at the start: every layer reads the one before it
    randomise(d)
    m = d.reads()
    for i in range(1, layers + 1):
        where = set(d.sources(i)) if i in points else {i}
        assert {j for j in range(layers + 1) if m[i, j] != 0} == where, i


@pytest.mark.parametrize("spec", ["PreLN+DenseFormer", "PreRMS+DenseFormer(dilation=2,period=2)"])
@pytest.mark.parametrize("positions", ["rope", "learned"])
@torch.no_grad()
def test_incremental_decoding_gives_the_full_forward(spec, positions):
    m = copy.deepcopy(gpt(spec, layers=4, positions=positions)).double()
    randomise(m.across.designs[0])
    x = tokens()
    full, caches = m(x), m.new_caches()
    cached = torch.cat([m(x[:, :4], caches)] + [m(x[:, t : t + 1], caches) for t in range(4, x.shape[1])], 1)
    torch.testing.assert_close(cached, full)


def test_activation_checkpointing_gives_the_same_gradients():
    m = gpt("PreLN+DenseFormer(dilation=2)").double().train()
    randomise(m.across.designs[0])
    assert checkpointing_keeps_the_gradients(m)["across.designs.0.alpha.1"].abs().sum() > 0


def checkpointing_keeps_the_gradients(m: GPT) -> dict[str, torch.Tensor]:
    """A training step's gradients with activation checkpointing equal those without; returns them."""
    x = tokens()

    def grads(checkpointing):
        m.checkpointing = checkpointing
        m.zero_grad()
        F.cross_entropy(m(x).flatten(0, 1), x.flatten()).backward()
        return {n: p.grad.clone() for n, p in m.named_parameters()}

    plain, recomputed = grads(False), grads(True)
    for name in plain:
        torch.testing.assert_close(recomputed[name], plain[name], msg=name)
    return plain


@torch.no_grad()
def test_both_transformer_stacks_average_and_start_as_the_plain_model():
    plain, dense = transformer("PreLN"), transformer("PreLN+DenseFormer(dilation=2)")
    dense.load_state_dict(plain.state_dict(), strict=False)
    src, tgt = tokens(), tokens(t=6)
    assert torch.equal(dense(src, tgt), plain(src, tgt))
    assert len(dense.encoder.across.designs[0].alpha) == 3 and len(dense.decoder.across.designs[0].alpha) == 4
    randomise(dense.decoder.across.designs[0])
    assert not torch.allclose(dense(src, tgt), plain(src, tgt))
    decoding_steps_give_the_full_pass(dense, src, tgt)


def decoding_steps_give_the_full_pass(model: Transformer, src: torch.Tensor, tgt: torch.Tensor) -> None:
    """One decoder position a step (float64) gives the log-probabilities of one pass over ``tgt``."""
    model = copy.deepcopy(model).double()
    full = F.log_softmax(model(src, tgt), -1)
    state = model.start(model.encode(src))
    steps = torch.stack([model.step(tgt[:, t], state) for t in range(tgt.shape[1])], 1)
    torch.testing.assert_close(steps, full.float())


@pytest.mark.parametrize("spec, problem", [
    ("PreLN+DenseFormer(dilation=0)", "option dilation: must be an integer >= 1, got 0"),
    ("PreLN+DenseFormer(period=1.5)", "option period: must be an integer >= 1, got 1.5"),
    ("PreLN+DenseFormer(k=2)", "DenseFormer has no option 'k' (options: dilation, period)"),
    ("PreLN+DenseFormer+DenseFormer", "DenseFormer is given twice"),
    ("PreLN+DenseFormer+MUDD", "+MUDD replaces the residual sum; it cannot be combined with +DenseFormer"),
    # a design written before it whose change of the stream the averages would throw away
    ("PreLN+UNet+DenseFormer", "+DenseFormer's averages replace the stream that +UNet, written before it, changes; "
                               "write +DenseFormer before +UNet"),
    ("PreLN+Scalars+DenseFormer", "stream that +Scalars, written before it, changes"),
    ("PreLN+ValueRes+Backout+DenseFormer(period=2)", "stream that +Backout, written before it, changes"),
])
def test_bad_specs_are_refused_in_one_line(spec, problem):
    refused_in_one_line(spec, problem)


def refused_in_one_line(spec: str, problem: str) -> None:
    with pytest.raises(ValueError, match=re.escape(problem)) as err:
        parse_spec(spec)
    assert "\n" not in str(err.value)


def test_designs_written_after_it_change_the_averaged_stream():
    """``+DenseFormer+UNet+Backout``: after block i the DWA gives Y_i, the U-Net adds w_j · y_{h−1−j} to it (y the
    layers' raw outputs) and the head reads N(Y_L − λ x_k); a hand-written forward, outputs and every gradient,
    with every weight of the three designs moved from its start (each then changes the output)."""
    model = gpt("PreLN+DenseFormer(dilation=2)+UNet+Backout(layer=1)", layers=5).double()
    dense, unet, backout = model.across.designs
    randomise(dense)
    with torch.no_grad():
        unet.weight.copy_(torch.tensor([0.7, -1.3]))
        backout.lam.fill_(0.3)
    x = tokens()
    h = model.embed(x) + (model.pos_embed.weight[: x.shape[1]] if model.pos_embed is not None else 0)
    outs, alphas, kept, backed = [h], iter(dense.alpha), [], None
    for i, layer in enumerate(model.layers):
        if i in (2, 3):  # h = ⌊5/2⌋ = 2: layers 2 and 3 read layers 1's and 0's outputs; layer 4 none
            h = h + unet.weight[i - 2] * kept.pop()
        h = layer(h)
        outs.append(h)
        kept += [h] if i < 2 else []
        backed = h if i == 1 else backed  # layer 1's raw output: Backout(layer=1)
        a, js = next(alphas), [j for j in range(i + 2) if (i + 1 - j) % 2 == 0]
        h = sum(w * outs[j] for w, j in zip(a, js))
    want = F.linear(model.norm(h - backout.lam * backed), model.embed.weight)
    got = model(x)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    params = [p for p in model.parameters()]
    grads = torch.autograd.grad(got.sin().sum(), params)
    for g, w in zip(grads, torch.autograd.grad(want.sin().sum(), params)):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9)
    for p in (unet.weight, backout.lam):
        assert grads[next(i for i, q in enumerate(params) if q is p)].abs().min() > 0


def test_stats_hold_under_another_default_dtype():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        design = Across("PreLN+DenseFormer", Stack(2, 8)).designs[0]
        randomise(design)
        assert design.stats()["alpha_0"].tolist()[-1] == pytest.approx(design.alpha[-1][0].item(), rel=1e-6)
    finally:
        torch.set_default_dtype(before)


def test_the_canonical_spec_leaves_defaults_out():
    assert gpt("PreLN+DenseFormer(dilation=1,period=1)", layers=2).layers[0].conn_attn.spec == "PreLN+DenseFormer"
    assert gpt("PreLN+DenseFormer(period=2)", layers=2).layers[0].conn_attn.spec == "PreLN+DenseFormer(period=2)"


def test_stats_and_rows_give_each_learned_alpha_by_layer():
    d = Across("PreLN+DenseFormer(dilation=2,period=2)", Stack(4, 8)).designs[0]
    randomise(d)
    a2, a4 = (a.detach() for a in d.alpha)  # after blocks 2 (reads X_0, X_2) and 4 (X_0, X_2, X_4)
    stats = d.stats()
    assert set(stats) == {f"alpha_{j}" for j in range(5)} and all(len(t) == 4 for t in stats.values())
    assert stats["alpha_2"].tolist() == [0.0, a2[1].item(), 0.0, a4[1].item()]
    assert stats["alpha_1"].tolist() == [1.0, 0.0, 0.0, 0.0]  # layer 0's output goes on as it is (no DWA)
    assert d.rows() == [(1, "alpha_0", a2[0].item()), (1, "alpha_2", a2[1].item()),
                        (3, "alpha_0", a4[0].item()), (3, "alpha_2", a4[1].item()), (3, "alpha_4", a4[2].item())]
