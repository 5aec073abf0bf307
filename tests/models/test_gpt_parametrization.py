"""The GPT's side of the parametrisations: torchtitan's depth_init (std 0.02/√(2(l+1)) per layer, measured at width
256), width μP's readout against the ``mup`` package's ``MuReadout``, its attention scale 1/d_head and its hidden
init, each proven by a mutation that makes the comparison fail."""

import math

import pytest
import torch
import torch.nn.functional as F

from skiplab.models import GPT, GPTConfig
from skiplab.models import gpt as gpt_module

WIDE = dict(vocab_size=64, d_model=256, heads=4, layers=4, ffn_dim=1024, context=16)


def depth_stds_match(model: GPT) -> bool:
    """Every layer's W_O and W2 (and SwiGLU's W3) at std 0.02/√(2(l+1)), the other matrices at 0.02, within 3%
    (about ten standard errors of a std measured on 65,536 draws)."""
    ok = True
    for l, layer in enumerate(model.layers):
        want = 0.02 / math.sqrt(2 * (l + 1))  # torchtitan models/common/param_init.py depth_scaled_std
        ffn = layer.mlp.projections()["ffn"]
        scaled = [layer.attn.out_proj.weight, *ffn[1:]]
        plain = [layer.attn.qkv_proj.weight, ffn[0]]
        ok &= all(abs(w.std().item() / want - 1) < 0.03 for w in scaled)
        ok &= all(abs(w.std().item() / 0.02 - 1) < 0.03 for w in plain)
    return bool(ok)


@pytest.mark.parametrize("mlp", ["gelu", "swiglu"])
def test_depth_init_draws_each_layers_output_projections_by_its_index(mlp):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**WIDE, mlp=mlp, init="depth"))
    assert depth_stds_match(model)
    # layer 0: 0.02/√2, layer 3: 0.02/√8 (the gpt2 init would give every layer 0.02/√8)
    assert model.layers[0].attn.out_proj.weight.std().item() > 1.8 * model.layers[3].attn.out_proj.weight.std().item()


def test_depth_init_check_fails_when_the_base_std_is_mutated(monkeypatch):
    monkeypatch.setattr(gpt_module, "STD", 0.03)
    torch.manual_seed(0)
    assert not depth_stds_match(GPT(GPTConfig(**WIDE, init="depth")))


def mu_readout_logits(model: GPT, h: torch.Tensor, base_width: int) -> torch.Tensor:
    """The same weights through ``mup.MuReadout`` with base shapes of width ``base_width``: W (h · 1/width_mult)."""
    mup = pytest.importorskip("mup")
    d, rows = model.cfg.d_model, model.output_weight().shape[0]
    readout = mup.MuReadout(d, rows, bias=False, readout_zero_init=False)
    mup.set_base_shapes(readout, mup.MuReadout(base_width, rows, bias=False))
    with torch.no_grad():
        readout.weight.copy_(model.output_weight())
    return readout(h)


@pytest.mark.parametrize("tie", [True, False])
def test_mup_readout_matches_mup_packages_mureadout(tie, monkeypatch):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, d_model=128, heads=4, layers=2, ffn_dim=256, context=8, tie=tie,
                          mup_base_width=32))
    assert model.width_multiplier == 4.0
    h = torch.randn(2, 5, 128)
    assert torch.allclose(model.logits(h), mu_readout_logits(model, h, 32), atol=1e-6)
    monkeypatch.setattr(model, "width_multiplier", 1.0)  # mutation: no 1/m_d on the readout
    assert not torch.allclose(model.logits(h), mu_readout_logits(model, h, 32), atol=1e-6)


def attention_by_hand(attn, x: torch.Tensor, scale: float) -> torch.Tensor:
    b, t, d = x.shape
    q, k, v = attn.qkv_proj(x).split(d, dim=-1)
    heads = lambda z: z.view(b, t, attn.heads, d // attn.heads).transpose(1, 2)  # noqa: E731
    scores = heads(q) @ heads(k).transpose(-1, -2) * scale
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    out = F.softmax(scores, dim=-1) @ heads(v)
    return attn.out_proj(out.transpose(1, 2).reshape(b, t, d))


def test_mup_attention_scores_are_divided_by_d_head(monkeypatch):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, d_model=64, heads=4, layers=1, ffn_dim=128, context=8, positions="learned",
                          mup_base_width=16))
    attn, x = model.layers[0].attn, torch.randn(2, 6, 64)
    assert torch.allclose(attn(x, causal=True), attention_by_hand(attn, x, 1 / 16), atol=1e-6)  # d_head 16
    standard = GPT(GPTConfig(vocab_size=50, d_model=64, heads=4, layers=1, ffn_dim=128, context=8,
                             positions="learned")).layers[0].attn
    standard.load_state_dict(attn.state_dict())
    assert torch.allclose(standard(x, causal=True), attention_by_hand(attn, x, 1 / 4), atol=1e-6)  # 1/√16
    monkeypatch.setattr(attn, "softmax_scale", None)  # mutation: back to 1/√d_head
    assert not torch.allclose(attn(x, causal=True), attention_by_hand(attn, x, 1 / 16), atol=1e-6)


def test_mup_draws_hidden_matrices_with_std_over_sqrt_m_d():
    torch.manual_seed(0)
    model = GPT(GPTConfig(**WIDE, mup_base_width=64))  # m_d = 4: hidden std 0.02/2
    layer = model.layers[1]
    for w in (layer.attn.qkv_proj.weight, layer.attn.out_proj.weight, layer.mlp.up.weight, layer.mlp.down.weight):
        assert abs(w.std().item() / 0.01 - 1) < 0.03
    assert abs(model.embed.weight.std().item() / 0.02 - 1) < 0.05  # the embedding keeps 0.02


@pytest.mark.parametrize("fields, problem", [
    (dict(init="deep"), "init must be one of default, gpt2, depth"),
    (dict(mup_base_width=-1), "mup_base_width must be >= 0"),
    (dict(connection="nGPT", mlp="swiglu", bias=False, mup_base_width=8), "width muP means nothing"),
])
def test_bad_model_fields_are_one_line(fields, problem):
    with pytest.raises(ValueError, match=problem) as err:
        GPTConfig(**fields)
    assert "\n" not in str(err.value)


def test_a_mup_model_has_no_hugging_face_counterpart():
    from skiplab.interop.hf import architecture
    assert architecture(GPTConfig(positions="learned")) == "gpt2"
    with pytest.raises(ValueError, match="mup_base_width=64: width muP's logits") as err:
        architecture(GPTConfig(positions="learned", mup_base_width=64))
    assert "\n" not in str(err.value)
