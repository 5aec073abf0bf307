"""skiplab's QK-norm against transformers' ``Qwen3Attention`` (``qk_norm=head``) and ``Olmo2Attention``
(``qk_norm=all``), the same weights: the self-attention of one layer of skiplab's GPT (RMS, rotary positions, causal)
against the transformers module, outputs and the gradients of the input and of every weight.

Mapping (skiplab ← transformers): the stacked ``qkv_proj`` = [``q_proj``; ``k_proj``; ``v_proj``] (rows, weights and
biases), ``out_proj`` = ``o_proj``; Qwen 3's ``q_norm``/``k_norm`` (RMSNorm of head_dim features, the same gain for
every head) = skiplab's ``q_norm.norm``/``k_norm.norm`` at ``qk_norm=head``; OLMo 2's (RMSNorm of heads·head_dim
features) = skiplab's at ``qk_norm=all``. Both multiply by the weight (not 1 + weight). The rotary angles come from
the models' own rotary embedding (``Qwen3RotaryEmbedding``, ``Olmo2RotaryEmbedding``) at rope_theta = skiplab's
``rope_base``; no grouped-query attention (``num_key_value_heads`` = heads); eps = ``rms_norm_eps`` = skiplab's
``norm_eps`` (0.05: large enough against the heads' mean square that an eps not reaching the QK-norms fails the
comparison, a test below); the causal mask is given
to the eager attention as an additive mask. Width 64, 4 heads of 16, random weights and gains, float32 (the
transformers RMSNorm computes in float32 whatever its input).

Each comparison is shown to fail under mutations of skiplab's QK-norm (the last tests): the norm applied after the
rotary positions instead of before, its statistic taken across the heads instead of per head (Qwen 3) or per
head instead of across the heads (OLMo 2), the gain unchanged, and its eps left at skiplab's default.
"""

import importlib.metadata

import pytest
import torch

from skiplab.models import GPT, GPTConfig
from skiplab.models import attention

Olmo2Config = pytest.importorskip("transformers.models.olmo2.configuration_olmo2").Olmo2Config
_olmo2 = pytest.importorskip("transformers.models.olmo2.modeling_olmo2")
Qwen3Config = pytest.importorskip("transformers.models.qwen3.configuration_qwen3").Qwen3Config
_qwen3 = pytest.importorskip("transformers.models.qwen3.modeling_qwen3")
Olmo2Attention, Olmo2RotaryEmbedding = _olmo2.Olmo2Attention, _olmo2.Olmo2RotaryEmbedding
Qwen3Attention, Qwen3RotaryEmbedding = _qwen3.Qwen3Attention, _qwen3.Qwen3RotaryEmbedding

TRANSFORMERS_VERSION = "5.24.0"  # the version this mapping was checked against
D, HEADS, T, BASE, EPS = 64, 4, 9, 500.0, 0.05
REFERENCE = {"head": (Qwen3Config, Qwen3Attention, Qwen3RotaryEmbedding),
             "all": (Olmo2Config, Olmo2Attention, Olmo2RotaryEmbedding)}


def test_checked_against_the_installed_version():
    assert importlib.metadata.version("transformers") == TRANSFORMERS_VERSION, (
        "transformers changed: check the mapping in this module and update TRANSFORMERS_VERSION")


def skiplab_attention(qk_norm: str, bias: bool) -> attention.SelfAttention:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=50, d_model=D, heads=HEADS, layers=1, ffn_dim=96, context=T, connection="PreRMS",
                    norm="RMS", mlp="swiglu", positions="rope", rope_base=BASE, bias=bias, norm_eps=EPS,
                    qk_norm=qk_norm)
    attn = GPT(cfg).layers[0].attn
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # weights of unit-scale products, gains off 1 (a gain of ones would hide their order)
        for name, p in attn.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.5 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / D**0.5)
    return attn


def reference(qk_norm: str, ours: attention.SelfAttention):
    """The transformers attention of ``qk_norm``'s model with ``ours``'s weights, and its rotary embedding."""
    config_cls, attention_cls, rotary_cls = REFERENCE[qk_norm]
    config = config_cls(hidden_size=D, num_attention_heads=HEADS, num_key_value_heads=HEADS, head_dim=D // HEADS,
                        intermediate_size=96, num_hidden_layers=1, max_position_embeddings=T, rms_norm_eps=EPS,
                        rope_theta=BASE, attention_bias=ours.qkv_proj.bias is not None, attention_dropout=0.0)
    config._attn_implementation = "eager"
    theirs = attention_cls(config, layer_idx=0).eval()
    with torch.no_grad():
        for name, w in zip(("q_proj", "k_proj", "v_proj"), ours.qkv_proj.weight.chunk(3)):
            getattr(theirs, name).weight.copy_(w)
        if ours.qkv_proj.bias is not None:
            for name, b in zip(("q_proj", "k_proj", "v_proj"), ours.qkv_proj.bias.chunk(3)):
                getattr(theirs, name).bias.copy_(b)
            theirs.o_proj.bias.copy_(ours.out_proj.bias)
        theirs.o_proj.weight.copy_(ours.out_proj.weight)
        theirs.q_norm.weight.copy_(ours.q_norm.norm.weight)
        theirs.k_norm.weight.copy_(ours.k_norm.norm.weight)
    return theirs, rotary_cls(config)


def compare(qk_norm: str, bias: bool = False, qk_eps: float | None = None) -> None:
    """``qk_eps``: skiplab's QK-norms given another eps than the model's (a mutation)."""
    ours = skiplab_attention(qk_norm, bias)
    if qk_eps is not None:
        ours.q_norm.norm.eps = ours.k_norm.norm.eps = qk_eps
    theirs, rotary = reference(qk_norm, ours)
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(2, T, D, generator=g) * 1.5 + 0.2).requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    y = ours(x, causal=True)
    cos_sin = rotary(x_ref, torch.arange(T)[None].expand(2, T))
    mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
    y_ref, _ = theirs(x_ref, position_embeddings=cos_sin, attention_mask=mask)
    torch.testing.assert_close(y, y_ref, rtol=2e-5, atol=2e-5)

    w = torch.randn(y.shape, generator=g)
    (y * w).sum().backward()
    (y_ref * w).sum().backward()
    pairs = [(x.grad, x_ref.grad), (ours.out_proj.weight.grad, theirs.o_proj.weight.grad),
             (ours.q_norm.norm.weight.grad, theirs.q_norm.weight.grad),
             (ours.k_norm.norm.weight.grad, theirs.k_norm.weight.grad)]
    pairs += list(zip(ours.qkv_proj.weight.grad.chunk(3), (theirs.q_proj.weight.grad, theirs.k_proj.weight.grad,
                                                            theirs.v_proj.weight.grad)))
    if bias:
        pairs += list(zip(ours.qkv_proj.bias.grad.chunk(3), (theirs.q_proj.bias.grad, theirs.k_proj.bias.grad,
                                                              theirs.v_proj.bias.grad)))
        pairs += [(ours.out_proj.bias.grad, theirs.o_proj.bias.grad)]
    for got, want in pairs:
        assert want.abs().max() > 1e-3  # a gradient to compare
        torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("bias", [False, True])
def test_per_head_qk_norm_gives_qwen3_attention_outputs_and_gradients(bias):
    compare("head", bias)


@pytest.mark.parametrize("bias", [False, True])
def test_qk_norm_across_heads_gives_olmo2_attention_outputs_and_gradients(bias):
    compare("all", bias)


def _after_rotary(m: pytest.MonkeyPatch) -> None:
    """A mutation: the QK-norm moved after the rotary positions (the same norm modules, called through the
    attention's ``qk`` hook, which sees the rotated heads)."""
    before = attention.HeadNorm.forward

    def after(norm: attention.HeadNorm, h: torch.Tensor) -> torch.Tensor:  # (B, H, T, d) -> the same
        b, heads, t, d = h.shape
        return before(norm, h.transpose(1, 2).reshape(b, t, heads * d)).view(b, t, heads, d).transpose(1, 2)

    build = attention.SelfAttention.__init__

    def init(self, *args, **kwargs):
        build(self, *args, **kwargs)
        self.qk = lambda q, k: (after(self.q_norm, q), after(self.k_norm, k))

    m.setattr(attention.HeadNorm, "forward", lambda self, x: x)  # nothing before the positions
    m.setattr(attention.SelfAttention, "__init__", init)


def _other_scope(self, x: torch.Tensor) -> torch.Tensor:
    """A mutation of :meth:`HeadNorm.forward`: the RMS statistic over the other scope (per head where the design
    takes it across the heads and the reverse), the gain as it was (tiled over the heads where it has d/H entries)."""
    b, t, d = x.shape
    groups = 1 if self.groups > 1 else HEADS
    h = x.view(b, t, groups, d // groups)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.norm.eps)
    return h.reshape(b, t, d) * self.norm.weight.repeat(d // self.norm.weight.numel())


@pytest.mark.parametrize("qk_norm", ["head", "all"])
def test_the_comparison_fails_when_the_norm_follows_the_rotary_positions(monkeypatch, qk_norm):
    with monkeypatch.context() as m:
        _after_rotary(m)
        with pytest.raises(AssertionError):
            compare(qk_norm)
    compare(qk_norm)  # and passes again without it


@pytest.mark.parametrize("qk_norm", ["head", "all"])
def test_the_comparison_fails_when_the_norm_takes_the_other_scope(monkeypatch, qk_norm):
    with monkeypatch.context() as m:
        m.setattr(attention.HeadNorm, "forward", _other_scope)
        with pytest.raises(AssertionError):
            compare(qk_norm)


@pytest.mark.parametrize("qk_norm", ["head", "all"])
def test_the_comparison_fails_when_the_qk_norms_miss_the_models_eps(qk_norm):
    with pytest.raises(AssertionError):
        compare(qk_norm, qk_eps=1e-6)
