"""The decoder-only language model: causality, cached generation, parameter counts, initialisation, positions."""

import copy
import math

import numpy as np
import pytest
import torch

from skiplab.models import GPT, GPTConfig, build_model, model_config
from skiplab.models.attention import Rotary
from skiplab.models.incremental import IncrementalDecoder
from tests.noise import assert_within_noise, noise

CONNECTIONS = ["PreLN", "PostLN", "PreRMS", "2rSkip+LN", "SAS", "Highway", "wSkip+LN", "1xSkip", "DeepNorm", "PeriLN",
               "MixLN(alpha=0.5)", "LNS", "LayerScale", "ReZero(init=0.5)", "HC", "HC(n=2,kind=static)", "mHC",
               "PreLN+ValueRes", "PreLN+UNet", "HC+ValueRes(learn=yes)+UNet", "PreLN+Scalars",
               "PreLN+UNet+Scalars(per=sublayer)+Backout(layer=1)"]


def tiny(connection="PreLN", **kw) -> GPT:
    torch.manual_seed(0)
    cfg = dict(vocab_size=50, d_model=32, heads=4, layers=3, ffn_dim=64, context=16, connection=connection)
    return GPT(GPTConfig(**{**cfg, **kw})).eval()


def tokens(b=3, t=12, seed=1):
    return torch.randint(0, 50, (b, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("connection", CONNECTIONS)
@pytest.mark.parametrize("positions", ["rope", "learned"])
@torch.no_grad()
def test_changing_later_tokens_leaves_earlier_logits_unchanged(connection, positions):
    model = tiny(connection, positions=positions)
    x = tokens()
    y = x.clone()
    y[:, 7:] = (y[:, 7:] + 1) % 50  # positions 7.. differ
    a, b = model(x), model(y)
    assert torch.equal(a[:, :7], b[:, :7])  # the same kernels on the same prefix rows: bit-equal
    assert not torch.allclose(a[:, 7:], b[:, 7:])


@pytest.mark.parametrize("connection", ["PreLN", "PostLN", "2rSkip+LN", "SAS", "PeriLN", "MixLN(alpha=0.5)", "DeepNorm",
                                        "HC", "mHC", "PreLN+ValueRes(learn=yes)", "PostLN+UNet",
                                        "mHC+ValueRes+UNet", "PreLN+Scalars", "HC+Scalars+Backout(layer=1)",
                                        "PostLN+UNet+Scalars(per=sublayer)+Backout"])
@pytest.mark.parametrize("mlp,positions", [("gelu", "learned"), ("swiglu", "rope")])
@torch.no_grad()
def test_cached_steps_give_the_logits_of_full_recomputation(connection, mlp, positions):
    model = tiny(connection, mlp=mlp, positions=positions)
    x = tokens()

    def both(m):
        full = m(x)
        caches = m.new_caches()
        prefix = m(x[:, :5], caches)  # a prompt at once, then one position a step
        steps = [m(x[:, t : t + 1], caches) for t in range(5, x.shape[1])]
        return full, torch.cat([prefix, *steps], 1), caches

    full, cached, caches = both(model)
    full64, cached64, _ = both(copy.deepcopy(model).double())
    assert_within_noise(cached, full, noise((full, full64), (cached, cached64)))
    assert caches[0]["k"].shape[2] == x.shape[1]


@torch.no_grad()
def test_start_step_select_are_the_shared_incremental_interface():
    model = tiny("PreLN")
    assert isinstance(model, IncrementalDecoder)
    x = tokens()
    full = model(x).float().log_softmax(-1)
    full64 = copy.deepcopy(model).double()(x).log_softmax(-1)
    state = model.start(x[:, :5])  # five positions cached; the first step feeds the sixth token
    steps = [model.step(x[:, t], state) for t in range(5, 8)]
    assert_within_noise(torch.stack(steps, 1), full[:, 5:8], noise((full[:, 5:8], full64[:, 5:8])))
    assert state.caches[0]["k"].shape[2] == 8
    # rows reordered and repeated: row i continues as row index[i] did
    index = torch.tensor([2, 0, 0])
    picked = model.select(state, index)
    after = model.step(x[index, 8], picked)
    assert_within_noise(after, full[index, 8], noise((full[index, 8], full64[index, 8])))
    assert model.start(x[:, :0]).caches[0] == {}  # an empty prefix: nothing cached, the first step is position 0
    empty = model.start(x[:, :0])
    assert_within_noise(model.step(x[:, 0], empty), full[:, 0], noise((full[:, 0], full64[:, 0])))


def test_gpt2_small_has_gpt2s_124m_parameters():
    """GPT-2 124M counted by hand (openai/gpt-2 src/model.py), the output tied to the token embedding:
    wte V·d + wpe 1024·d + per layer (2 LN of 2d, c_attn d·3d + 3d, c_proj d·d + d, c_fc d·4d + 4d,
    mlp c_proj 4d·d + d) + ln_f 2d."""
    v, d, n, ctx = 50257, 768, 12, 1024
    per_layer = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d)
    expected = v * d + ctx * d + n * per_layer + 2 * d
    assert expected == 124_439_808
    model = build_model(model_config("gpt2-small"))
    assert sum(p.numel() for p in model.parameters()) == expected


@pytest.mark.parametrize("name,d,ffn,expected", [("llama-71m", 512, 1368, 70_578_688), ("llama-130m", 768, 2048, 134_105_856)])
def test_llama_shapes_have_the_papers_parameter_counts(name, d, ffn, expected):
    """Untied embedding and output V·d each, per layer 4d² (attention) + 3·d·ffn (SwiGLU) + 2d (RMSNorm), final norm d."""
    v, n = 32000, 12
    assert 2 * v * d + n * (4 * d * d + 3 * d * ffn + 2 * d) + d == expected
    model = build_model(model_config(name))
    assert sum(p.numel() for p in model.parameters()) == expected
    assert model.head is not None and not any(m.bias is not None for m in model.modules() if isinstance(m, torch.nn.Linear))


def test_gpt2_init_scales_the_output_projections():
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=500, d_model=256, heads=4, layers=8, ffn_dim=1024, init="gpt2")
    model = GPT(cfg)
    outs = torch.cat([torch.cat([l.attn.out_proj.weight.flatten(), l.mlp.down.weight.flatten()]) for l in model.layers])
    ups = torch.cat([l.mlp.up.weight.flatten() for l in model.layers])
    assert outs.std().item() == pytest.approx(0.02 / math.sqrt(2 * 8), rel=0.02)
    assert ups.std().item() == pytest.approx(0.02, rel=0.02)
    assert model.embed.weight.std().item() == pytest.approx(0.02, rel=0.02)
    torch.manual_seed(0)
    default = GPT(GPTConfig(vocab_size=500, d_model=256, heads=4, layers=8, ffn_dim=1024))
    assert default.layers[0].attn.out_proj.weight.std().item() == pytest.approx(0.02, rel=0.05)


def test_connections_keep_their_own_initialisation():
    conn = tiny("SAS").layers[0].conn_attn
    assert conn.alpha.net[2].bias.item() == 3.0 and conn.beta.net[2].bias.item() == -3.0  # SAS's gate biases
    assert conn.alpha.net[0].weight.std().item() > 0.05  # the gate's own draw, not N(0, 0.02²)


def test_final_norm_only_for_pre_norm_connections():
    assert isinstance(tiny("PreLN").norm, torch.nn.LayerNorm)
    assert isinstance(tiny("PostLN").norm, torch.nn.Identity)


def test_rotary_rotates_pairs_by_position_angles():
    rope = Rotary(4, 8, base=100.0)
    x = torch.tensor([1.0, 2.0, 3.0, 4.0]).view(1, 1, 1, 4).expand(1, 1, 3, 4)
    y = rope(x, offset=2)  # positions 2, 3, 4
    theta = torch.tensor([1.0, 100.0 ** -0.5])
    for i, p in enumerate((2, 3, 4)):
        c, s = torch.cos(p * theta), torch.sin(p * theta)
        expected = torch.tensor([1 * c[0] - 3 * s[0], 2 * c[1] - 4 * s[1], 3 * c[0] + 1 * s[0], 4 * c[1] + 2 * s[1]])
        torch.testing.assert_close(y[0, 0, i], expected)
    q, k = torch.randn(1, 1, 8, 4), torch.randn(1, 1, 8, 4)  # q_p·k_s depends on p - s alone
    shifted = (rope(q[:, :, :1], 5) * rope(k[:, :, :1], 3)).sum()
    base = (rope(q[:, :, :1], 2) * rope(k[:, :, :1], 0)).sum()
    torch.testing.assert_close(shifted, base)


def test_bad_configs_and_too_long_input_are_one_line_errors():
    with pytest.raises(ValueError, match="mlp must be one of gelu, swiglu"):
        GPTConfig(mlp="relu")
    with pytest.raises(ValueError, match="positions must be one of rope, learned"):
        GPTConfig(positions="alibi")
    with pytest.raises(ValueError, match="divisible by heads"):
        GPTConfig(d_model=30, heads=4)
    # from Python, a size that is no integer (context=2.5 built, and said "the model's context (2.5)")
    for name, value in (("context", 2.5), ("heads", True), ("layers", "4"), ("pad_vocab", 1.0)):
        with pytest.raises(ValueError, match=f"^{name} must be an integer, got {value!r}$"):
            GPTConfig(**{name: value})
    assert GPTConfig(layers=np.int64(3)).layers == 3  # numpy's integers are integers
    with pytest.raises(ValueError, match="longer than the model's context \\(16\\)"):
        tiny()(tokens(t=17))
