"""``+DenseFormer(dilation=k, period=p)`` against a forward pass written after the authors' module (epfml/DenseFormer,
``denseformer/denseformer.py``, ``DWAModules``: ``init_accumulators`` puts X_0 in slot 0 of dilation group 0;
``forward(x, block_idx)`` puts block ``block_idx``'s output in slot (block_idx + 1) // k of group (block_idx + 1) % k
and, where (block_idx + 1) % p == 0, returns ``tensordot`` of that DWA's weights, ``nn.Linear((i+1+k)//k, 1)``,
with the group's filled slots), given skiplab's α: PreLN and PreRMS GPTs at width 64, random α, float64, outputs and
every parameter's gradient. The package needs no more than torch, but its in-place accumulator is an autograd
Function; the reference below keeps the groups as lists, the same sums. Each comparison fails under a mutation of
the design (the last test)."""

import pytest
import torch
import torch.nn.functional as F

from skiplab.connections.across import DenseFormer
from skiplab.models import GPT, GPTConfig


def gpt(spec, **kw):
    torch.manual_seed(0)
    cfg = dict(vocab_size=40, d_model=64, heads=4, layers=6, ffn_dim=128, context=16, connection=spec)
    m = GPT(GPTConfig(**{**cfg, **kw})).double().eval()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for a in m.across.designs[0].alpha:
            a.copy_(torch.randn(a.shape, generator=g, dtype=a.dtype))
    return m


def reference(m: GPT, idx: torch.Tensor, k: int, p: int) -> torch.Tensor:
    """The README's loop: ``init_accumulators(x)``; for each block, ``x = block(x)``, ``x = dwa_modules(x, i)``, with
    the dilation k and period p the spec names (given here, not read from skiplab's module)."""
    dwa = m.across.designs[0]
    n = len(m.layers)
    after = [i for i in range(n) if (i + 1) % p == 0]  # 0-based blocks a DWA follows
    assert len(dwa.alpha) == len(after)
    weights = dict(zip(after, dwa.alpha))  # 0-based block -> its DWA's weights
    for i, w in weights.items():
        assert w.shape == ((i + 1 + k) // k,)
    x = m.embed(idx)
    groups = [[] for _ in range(k)]
    groups[0].append(x)
    for i, block in enumerate(m.layers):
        x = block(x)
        group = groups[(i + 1) % k]
        assert len(group) == (i + 1) // k  # the slot it fills
        group.append(x)
        if (i + 1) % p == 0:
            x = torch.tensordot(weights[i], torch.stack(group), dims=1)
    return F.linear(m.norm(x), m.embed.weight)


def same_outputs_and_gradients(m: GPT, reference, *settings) -> None:
    """``m`` and ``reference(m, tokens, *settings)`` give the same logits and the same gradient of every parameter of
    ``m``."""
    idx = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(1))
    out, ref = m(idx), reference(m, idx, *settings)
    torch.testing.assert_close(out, ref)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=out.dtype)
    params = list(m.parameters())
    got = torch.autograd.grad((out * w).sum(), params)
    want = torch.autograd.grad((ref * w).sum(), params)
    for (name, _), a, b in zip(m.named_parameters(), got, want):
        torch.testing.assert_close(a, b, msg=name)


@pytest.mark.parametrize("spec,k,p", [("PreLN+DenseFormer", 1, 1), ("PreLN+DenseFormer(dilation=2)", 2, 1),
                                      ("PreRMS+DenseFormer(dilation=2,period=2)", 2, 2),
                                      ("PreLN+DenseFormer(dilation=4,period=3)", 4, 3), ("PreLN+DenseFormer(period=5)", 1, 5)])
def test_denseformer_gives_the_outputs_and_gradients_of_the_authors_module(spec, k, p):
    m = gpt(spec, **(dict(mlp="swiglu", norm="RMS") if "RMS" in spec else {}))
    same_outputs_and_gradients(m, reference, k, p)


def _from_zero(self, i):
    return list(range(0, i + 1, self.dilation))[-len(range(i % self.dilation, i + 1, self.dilation)):]


def _averages_kept(self, i, x, state):
    y = DenseFormer._average(self, i, x, state) if i else x
    state["dense"][i] = y  # later averages read Y_i where the code reads the block's output X_i
    return y


@pytest.mark.parametrize("name, mutant", [("sources", _from_zero), ("enter", _averages_kept)])
def test_the_comparison_fails_under_a_mutation(monkeypatch, name, mutant):
    monkeypatch.setattr(DenseFormer, name, mutant)
    with pytest.raises(AssertionError):
        same_outputs_and_gradients(gpt("PreLN+DenseFormer(dilation=2)"), reference, 2, 1)
