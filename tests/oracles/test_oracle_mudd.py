"""``+MUDD`` against a forward pass written after the authors' code (Caiyun-AI/MUDDFormer,
``pytorch/muddformer/modeling_muddformer.py``: ``MUDDFormer.forward``, ``TransformerBlock.forward`` with
``dense_type='qkvr'`` and one attention norm on ``x[:3]`` (``sepln=False``), ``Attention.forward`` with separate
``wq``, ``wk``, ``wv``, ``MultiwayDynamicDenseBlock.forward`` and ``layer_mix``; the tanh GELU of the training code,
``jax/MaxText/layers/llama2.py``), given skiplab's weights: a PreLN and a PreRMS GPT at width 64, random mixing
weights, float64, outputs and every parameter's gradient. The package is not installed (it needs transformers'
``PreTrainedModel`` and a GPU-sized config): the reference below is written here, structure for structure, with
the GPT's attention and MLP spelt out. Each comparison fails under a mutation of the design (the last test)."""

import math

import pytest
import torch
import torch.nn.functional as F

from skiplab.connections.across import MUDD
from skiplab.models import GPT, GPTConfig
from tests.oracles.test_oracle_denseformer import same_outputs_and_gradients


def gpt(spec, **kw):
    torch.manual_seed(0)
    cfg = dict(vocab_size=40, d_model=64, heads=4, layers=4, ffn_dim=128, context=16, positions="learned",
               connection=spec)
    m = GPT(GPTConfig(**{**cfg, **kw})).double().eval()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in [*m.across.designs[0].w2, *m.across.designs[0].bias]:
            p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return m


def attention(layer, xq, xk, xv):
    """``Attention.forward``: q, k, v from three inputs, causal softmax(q kᵀ/√d_h) v, heads joined, ``wo``."""
    a = layer.attn
    bias = a.qkv_proj.bias if a.qkv_proj.bias is not None else torch.zeros_like(a.qkv_proj.weight[:, 0])
    (wq, wk, wv), (bq, bk, bv) = a.qkv_proj.weight.chunk(3), bias.chunk(3)
    b, t, d = xq.shape
    h = a.heads
    q, k, v = ((x @ w.T + bias).view(b, t, h, d // h).transpose(1, 2)
               for x, w, bias in ((xq, wq, bq), (xk, wk, bk), (xv, wv, bv)))
    logits = q @ k.transpose(-2, -1) / math.sqrt(d // h)
    logits = logits.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    y = (logits.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
    return a.out_proj(y)


def mlp(layer, x):
    m = layer.mlp
    if m.swiglu:
        gate, value = m.up(x).chunk(2, dim=-1)
        return m.down(F.silu(gate) * value)
    return m.down(F.gelu(m.up(x), approximate="tanh"))


def dense_block(mudd, i, x):
    """``MultiwayDynamicDenseBlock.forward`` + ``dense_bs``: RMSnormNoscale, w1, GELU, w2, '(C L) -> C B T L'."""
    c = 1 if i == len(mudd.w1) - 1 else 4
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    dw = F.gelu(normed @ mudd.w1[i].T, approximate="tanh") @ mudd.w2[i].T  # B T (C L)
    dw = dw.view(*x.shape[:2], c, i + 2).permute(2, 0, 1, 3)  # C B T L
    return dw + mudd.bias[i].view(c, i + 2)[:, None, None, :]


def reference(m: GPT, idx: torch.Tensor) -> torch.Tensor:
    """``MUDDFormer.forward``: hiddens = [x]; after each block the C weighted sums of the hiddens; x[0] at the end."""
    mudd = m.across.designs[0]
    x = m.embed(idx) + m.pos_embed.weight[: idx.shape[1]]
    hiddens = [x]
    for i, layer in enumerate(m.layers):
        if i == 0:  # TransformerBlock.forward: layer 0 reads x in every stream
            res, normed = x, (layer.conn_attn.norm(x),) * 3
        else:  # dense_type 'qkvr': res = x[-1]; one attention norm on x[:3]
            res, normed = x[-1], tuple(layer.conn_attn.norm(s) for s in x[:3])
        h = res + attention(layer, *normed)
        out = h + mlp(layer, layer.conn_mlp.norm(h))
        hiddens.append(out)
        dw = dense_block(mudd, i, out)
        x = tuple(sum(dw[c, :, :, j, None] * hiddens[j] for j in range(i + 2)) for c in range(dw.shape[0]))
    x = x[0]
    return F.linear(m.norm(x), m.embed.weight)


@pytest.mark.parametrize("spec, kw", [("PreLN+MUDD", {}), ("PreRMS+MUDD", dict(mlp="swiglu", norm="RMS", bias=False)),
                                      ("PreLN+MUDD", dict(layers=2)), ("PreLN+MUDD", dict(layers=1))])
def test_mudd_gives_the_outputs_and_gradients_of_the_authors_forward(spec, kw):
    same_outputs_and_gradients(gpt(spec, **kw), reference)


def _without_the_embeddings(a, hidden):
    y = a[..., 1, None] * hidden[1]
    for j in range(2, len(hidden)):
        y = y + a[..., j, None] * hidden[j]
    return y


MUDD_SUBLAYER = MUDD.sublayer


def _keys_and_values_swapped(self, k, x, conn, branch, state):
    streams = dict(state["streams"])
    if len(streams.get(k // 2, ())) == 4:
        q, key, value, residual = streams[k // 2]
        streams[k // 2] = (q, value, key, residual)
    return MUDD_SUBLAYER(self, k, x, conn, branch, {**state, "streams": streams})


def _erf_gelu(self, i, x):
    c = self.streams(i)
    h = F.gelu(F.linear(F.rms_norm(x, x.shape[-1:], eps=1e-6), self.w1[i].to(x.dtype)))
    return (F.linear(h, self.w2[i].to(x.dtype)) + self.bias[i].to(x.dtype)).unflatten(-1, (c, i + 2))


@pytest.mark.parametrize("name, mutant", [("_mix", staticmethod(_without_the_embeddings)),
                                          ("sublayer", _keys_and_values_swapped), ("weights", _erf_gelu)])
def test_the_comparison_fails_under_a_mutation(monkeypatch, name, mutant):
    monkeypatch.setattr(MUDD, name, mutant)
    with pytest.raises(AssertionError):
        same_outputs_and_gradients(gpt("PreLN+MUDD"), reference)
