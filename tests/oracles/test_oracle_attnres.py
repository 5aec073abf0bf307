"""``+AttnRes`` against its sources. ``query=static``: the paper's equations (Kimi Team 2026, arXiv 2603.15031,
Section 3; the README's ``block_attn_res`` pseudocode) written out by hand in a whole PreRMS GPT, Full and Block
(S = 2, S = 3) at 4 layers and width 64, in float64, random pseudo-queries and norm gains: logits and every
parameter's gradient (the same hand GPT with x-transformers' query written out, for ``query=lora`` in the stack). ``query=lora``: one mix against x-transformers 2.31.10's ``AttentionResidual`` with the same
weights (random LoRA factors, so that the query path is exercised), width 96, rank 16, float64: the output and the
gradients of the sources and of every weight. Each comparison is shown to fail under a mutation of the design: the
keys' RMSNorm dropped (the mean square replaced by 1), or the LoRA query's 1/√d scale dropped."""

import importlib.metadata
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from skiplab.connections import parse_spec
from skiplab.connections.across import AttnRes, Stack, attn_res
from skiplab.models import GPT, GPTConfig
from tests.conftest import randomise_affine

AttentionResidual = pytest.importorskip("x_transformers.x_transformers").AttentionResidual

X_TRANSFORMERS_VERSION = "2.31.10"
EPS = 1e-5  # skiplab's norm eps (the models' default norm_eps)
D, LAYERS = 64, 4


def rms(x, w):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def paper_mix(sources, query, gain, lora=None):
    """h = Σ_i softmax_i(φ) v_i, φ_i = qᵀ RMSNorm(v_i) (the README's ``block_attn_res``: V stacked, K = norm(V),
    logits = einsum('d, n b t d -> n b t', w, K), softmax over n); ``lora`` = (g_in, D, U, g_out): the query
    RMSNorm_out(s + U D RMSNorm_in(s)) of the latest source s, logits / √d (x-transformers' form)."""
    V = torch.stack(sources)  # (n, B, T, d)
    K = rms(V, gain)
    if lora is None:
        logits = torch.einsum("d,nbtd->nbt", query, K)
    else:
        g_in, down, up, g_out = lora
        s = sources[-1]
        q = rms(s + rms(s, g_in) @ down.T @ up.T, g_out)
        logits = torch.einsum("btd,nbtd->nbt", q, K) / math.sqrt(s.shape[-1])
    return torch.einsum("nbt,nbtd->btd", logits.softmax(0), V)


def hand_gpt(m: GPT, x: torch.Tensor, block: int) -> torch.Tensor:
    """A PreRMS GPT (learned positions) with Attention Residuals, every step written out: v_0 the embeddings,
    v_j = F_j(RMSNorm(h_j)) sub-layer j's output; Full: h_l mixes v_0, ..., v_{l−1}; Block S: h_l mixes b_0 = v_0,
    the sums b_n of the completed blocks of S sub-layers and the partial sum of its own block's earlier v_j; the
    output mixes every v_j (Full) or every block sum (Block), then the final RMSNorm and the tied head."""
    design = m.across.designs[0]
    b, t = x.shape
    vs = [m.embed(x) + m.pos_embed.weight[:t]]
    lora = design.lora

    def mix(i, sources):
        if not lora:
            return paper_mix(sources, design.query[i], design.key_norms[i].weight)
        return paper_mix(sources, None, design.key_norms[i].weight,
                         (design.query_in[i].weight, design.down[i], design.up[i], design.query_out[i].weight))

    def sources(l):  # the sources of mix l (l = 2L: the output's)
        if block == 0:
            return vs[: l + 1]
        n = l // block if l < 2 * LAYERS else -(-l // block)  # blocks completed before sub-layer l / at the end
        sums = [sum(vs[1 + j * block : 1 + (j + 1) * block]) for j in range(n)]
        partial = [sum(vs[1 + n * block : 1 + l])] if n * block < l else []
        return [vs[0], *sums, *partial]

    for l in range(2 * LAYERS):
        layer = m.layers[l // 2]
        h = mix(l, sources(l))
        if l % 2 == 0:
            a = layer.attn
            z = rms(h, layer.conn_attn.norm.weight)
            q, k, v = (u.view(b, t, a.heads, -1).transpose(1, 2) for u in a.qkv_proj(z).chunk(3, -1))
            scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
            scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
            vs.append(a.out_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, -1)))
        else:
            vs.append(layer.mlp(rms(h, layer.conn_mlp.norm.weight)))
    out = mix(2 * LAYERS, sources(2 * LAYERS))
    return F.linear(rms(out, m.norm.weight), m.embed.weight)


def gpt(spec: str) -> GPT:
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=50, d_model=D, heads=4, layers=LAYERS, ffn_dim=2 * D, context=12,
                      positions="learned", norm="RMS", connection=spec)).double().eval()
    randomise_affine(m)  # the blocks' and the final RMSNorm gains away from 1
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # the pseudo-queries, the LoRA factors and every gain of the mixes away from their start
        for name, p in m.across.named_parameters():
            scale = 0.5 if name.endswith(("query", "weight")) else 0.2
            p.copy_((1.0 if name.endswith("weight") else 0.0) + scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return m


def compare(m: GPT, block: int) -> None:
    x = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(1))
    probe = torch.randn(2, 9, 50, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    ours = m(x)
    grads = torch.autograd.grad((ours * probe).sum(), list(m.parameters()))
    hand = hand_gpt(m, x, block)
    hand_grads = torch.autograd.grad((hand * probe).sum(), list(m.parameters()))
    torch.testing.assert_close(ours, hand)
    for (name, _), g, h in zip(m.named_parameters(), grads, hand_grads):
        torch.testing.assert_close(g, h, msg=lambda s, n=name: f"{n}: {s}")


SPECS = [("PreRMS+AttnRes", 0), ("PreRMS+AttnRes(block=2)", 2), ("PreRMS+AttnRes(block=3)", 3),
         ("PreRMS+AttnRes(query=lora,rank=16)", 0), ("PreRMS+AttnRes(block=3,query=lora,rank=16)", 3)]


@pytest.mark.parametrize("spec, block", SPECS)
def test_the_gpt_is_the_papers_equations_by_hand(spec, block):
    m = gpt(spec)
    assert all(t.min() > 0 for t in m.across.designs[0].stats().values())  # no query at its zero start
    compare(m, block)


@pytest.mark.parametrize("spec, block", [SPECS[0], SPECS[2]])
def test_dropping_the_keys_norm_fails_the_hand_comparison(spec, block, monkeypatch):
    m = gpt(spec)
    monkeypatch.setattr(attn_res, "_mean_square", lambda x: torch.ones_like(x[..., 0]))
    with pytest.raises(AssertionError):
        compare(m, block)


def test_checked_against_the_installed_version():
    assert importlib.metadata.version("x-transformers") == X_TRANSFORMERS_VERSION, (
        "x-transformers changed: check AttentionResidual against attn_res.py and update X_TRANSFORMERS_VERSION")


def lora_pair(width=96, rank=16, sources=4):
    """skiplab's mix 2 of a 2-layer stack and x-transformers' AttentionResidual holding the same weights (every
    RMSNorm's eps set to skiplab's), float64, random LoRA factors and gains; random sources (B, T, d)."""
    torch.manual_seed(0)
    design = AttnRes(parse_spec(f"PreRMS+AttnRes(query=lora,rank={rank})").stack[0], Stack(2, width)).double()
    theirs = AttentionResidual(width, lora_rank=rank).double()
    g = torch.Generator().manual_seed(4)
    m = 2
    with torch.no_grad():
        for p in (design.up, design.down):
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3)
        for norm in (design.key_norms[m], design.query_in[m], design.query_out[m]):
            norm.weight.copy_(1 + 0.5 * torch.randn(width, generator=g, dtype=torch.float64))
        theirs.to_keys.weight.copy_(design.key_norms[m].weight)
        theirs.to_query[0].weight.copy_(design.query_in[m].weight)
        theirs.to_query[1].down.weight.copy_(design.down[m])
        theirs.to_query[1].up.weight.copy_(design.up[m])
        theirs.norm.weight.copy_(design.query_out[m].weight)
    for norm in (theirs.to_keys, theirs.to_query[0], theirs.norm):
        norm.eps = EPS
    xs = [(torch.randn(2, 5, width, generator=g, dtype=torch.float64) * (1 + i)).requires_grad_()
          for i in range(sources)]
    return design, theirs, m, xs


def compare_lora(design, theirs, m, xs):
    probe = torch.randn(2, 5, xs[0].shape[-1], generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    ours = design.mix(m, xs)
    mine = [design.key_norms[m].weight, design.query_in[m].weight, design.down, design.up, design.query_out[m].weight]
    g_ours = torch.autograd.grad((ours * probe).sum(), [*xs, *mine])
    out = theirs(xs)
    t = theirs
    g_theirs = torch.autograd.grad((out * probe).sum(), [*xs, t.to_keys.weight, t.to_query[0].weight,
                                                         t.to_query[1].down.weight, t.to_query[1].up.weight,
                                                         t.norm.weight])
    torch.testing.assert_close(ours, out)
    for i, (a, b) in enumerate(zip(g_ours, g_theirs)):
        if i == len(xs) + 2 or i == len(xs) + 3:  # skiplab's D and U are stacked over the mixes: row m
            a = a[m]
        torch.testing.assert_close(a, b, msg=lambda s, i=i: f"gradient {i}: {s}")


def test_the_lora_query_is_x_transformers_attention_residual():
    design, theirs, m, xs = lora_pair()
    assert design.up.abs().min() > 0  # the LoRA's up factor is not at its zero start: the query path counts
    compare_lora(design, theirs, m, xs)


def test_dropping_the_lora_querys_scale_or_the_keys_norm_fails_the_comparison(monkeypatch):
    design, theirs, m, xs = lora_pair()
    with monkeypatch.context() as patch:
        patch.setattr(attn_res, "math", SimpleNamespace(sqrt=lambda x: 1.0))  # logits no longer scaled by d^-1/2
        with pytest.raises(AssertionError):
            compare_lora(design, theirs, m, xs)
    monkeypatch.setattr(attn_res, "_mean_square", lambda x: torch.ones_like(x[..., 0]))
    with pytest.raises(AssertionError):
        compare_lora(design, theirs, m, xs)
