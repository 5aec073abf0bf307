import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import skiplab
from skiplab.models import build_model, model_config
from skiplab.models.seq2seq import sinusoid
from tests.noise import assert_within_noise, noise

V = 50


def tiny(spec="PostLN", **kw):
    torch.manual_seed(0)
    fields = dict(vocab_size=V, d_model=16, ffn_dim=32, heads=4, encoder_layers=2, decoder_layers=2, connection=spec)
    return build_model(model_config("transformer-small", **{**fields, **kw}))


def batch(b=3, s=7, t=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (b, s), generator=g)
    src[0, s - 2 :] = 0  # padding
    tgt = torch.randint(4, V, (b, t), generator=g)
    return src, tgt


@pytest.mark.parametrize("spec", ["PostLN", "1xSkip", "2xSkip+LN", "2rSkip+LN", "wSkip+LN", "SAS", "SAS+RMS",
                                  "Highway", "PreLN", "PreRMS", "2rSkip+RMS"])
def test_forward_backward_with_every_kind_of_connection(spec):
    model = tiny(spec)
    src, tgt = batch()
    logits = model(src, tgt)
    assert logits.shape == (3, 6, V)
    F.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1)).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    conns = list(skiplab.iter_connections(model))
    assert len(conns) == 2 * 2 + 3 * 2  # every sub-layer of the encoder and the decoder
    final = isinstance(model.encoder.norm, nn.Identity)
    assert final == (spec not in ("PreLN", "PreRMS"))  # pre-norm stacks end with their own norm


def test_postln_equals_pytorchs_own_post_norm_layers():
    model = tiny("PostLN").eval()
    with torch.no_grad():  # move norms and biases off 1 and 0, so that a mix-up shows
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    cfg = model.cfg
    kw = dict(d_model=cfg.d_model, nhead=cfg.heads, dim_feedforward=cfg.ffn_dim, dropout=0.0, activation="relu",
              batch_first=True, norm_first=False)

    def copy_attn(ref, ours):
        with torch.no_grad():
            stacked = [ours.qkv_proj] if hasattr(ours, "qkv_proj") else [ours.q_proj, ours.kv_proj]
            ref.in_proj_weight.copy_(torch.cat([lin.weight for lin in stacked]))
            ref.in_proj_bias.copy_(torch.cat([lin.bias for lin in stacked]))
            ref.out_proj.load_state_dict(ours.out_proj.state_dict())

    def reference(ours, layer_cls, attns):
        ref = layer_cls(**kw).eval().to(ours.ffn[0].weight.dtype)
        for name, attn in attns.items():
            copy_attn(getattr(ref, name), attn)
        ref.linear1.load_state_dict(ours.ffn[0].state_dict())
        ref.linear2.load_state_dict(ours.ffn[2].state_dict())
        for i, (_, conn) in enumerate(skiplab.iter_connections(ours), start=1):
            getattr(ref, f"norm{i}").load_state_dict(conn.norm.state_dict())  # LN(x + F): the connection's LN
        return ref

    def pytorch_layers(model, src, tgt):
        """The logits of PyTorch's own layers holding ``model``'s weights."""
        enc = [reference(o, nn.TransformerEncoderLayer, {"self_attn": o.self_attn}) for o in model.encoder.layers]
        dec = [reference(o, nn.TransformerDecoderLayer, {"self_attn": o.self_attn, "multihead_attn": o.cross_attn})
               for o in model.decoder.layers]
        d, dtype = cfg.d_model, model.embed.weight.dtype
        pe = sinusoid(64, d).to(dtype)
        x = model.embed(src) * d**0.5 + pe[: src.shape[1]]
        for layer in enc:
            x = layer(x, src_key_padding_mask=src == 0)
        y = model.embed(tgt) * d**0.5 + pe[: tgt.shape[1]]
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], dtype=dtype)
        for layer in dec:
            y = layer(y, x, tgt_mask=causal, memory_key_padding_mask=src == 0)
        return y @ model.embed.weight.T

    src, tgt = batch()
    ours, expect = model(src, tgt), pytorch_layers(model, src, tgt)
    model64 = copy.deepcopy(model).double()  # both computations in float64 measure their float32 noise
    level = noise((expect, pytorch_layers(model64, src, tgt)), (ours, model64(src, tgt)))
    assert_within_noise(ours, expect, level)


def test_sinusoidal_positions():
    pe = sinusoid(10, 8)
    assert pe[3, 0] == pytest.approx(torch.sin(torch.tensor(3.0)).item())
    assert pe[3, 1] == pytest.approx(torch.cos(torch.tensor(3.0)).item())
    assert pe[5, 4] == pytest.approx(torch.sin(torch.tensor(5 / 10000 ** (4 / 8))).item())


@torch.no_grad()
def full_and_incremental(model, src, tgt):
    """Log-probabilities of ``tgt`` from one pass over it, from one step per position, and the decoder state."""
    full = F.log_softmax(model(src, tgt), -1)
    state = model.start(model.encode(src))
    steps = torch.stack([model.step(tgt[:, t], state) for t in range(tgt.shape[1])], 1)
    return full, steps, state


@pytest.mark.parametrize("spec", ["PostLN", "PreLN", "2rSkip+LN", "SAS", "HC", "mHC", "PeriLN", "DeepNorm",
                                  "MixLN(alpha=0.5)", "PreLN+ValueRes(learn=yes)", "PostLN+UNet", "HC+ValueRes+UNet",
                                  "PreLN+Scalars", "PreLN+UNet+Scalars(per=sublayer)"])
def test_incremental_decoding_gives_the_scores_of_full_recomputation(spec):
    model = tiny(spec).eval()
    src, tgt = batch()
    full, steps, state = full_and_incremental(model, src, tgt)
    full64, steps64, _ = full_and_incremental(copy.deepcopy(model).double(), src, tgt)
    assert_within_noise(steps, full, noise((full, full64), (steps, steps64)))
    assert state.caches[0]["k"].shape[2] == tgt.shape[1]  # one cached position per step


def test_select_reorders_and_repeats_rows():
    model = tiny().eval()
    src, tgt = batch()
    with torch.no_grad():
        state = model.start(model.encode(src))
        model.step(tgt[:, 0], state)
        picked = model.select(state, torch.tensor([2, 2, 0]))
        a = model.step(tgt[[2, 2, 0], 1], picked)
        b = model.step(tgt[:, 1], state)
    torch.testing.assert_close(a, b[[2, 2, 0]])


def test_presets_and_bad_settings():
    base = build_model(model_config("transformer-base", vocab_size=37000))
    assert 60e6 < sum(p.numel() for p in base.parameters()) < 66e6  # "65M" in Vaswani et al. (Table 3)
    assert model_config("transformer-big").ffn_dim == 4096 and model_config("transformer-iwslt").heads == 4
    assert model_config("transformer-small", encoder_layers=2).encoder_layers == 2
    with pytest.raises(ValueError, match="divisible"):
        model_config("transformer-small", heads=3)
    with pytest.raises(ValueError, match="longer than max_positions"):
        tiny(max_positions=5)(torch.ones(1, 6, dtype=torch.long), torch.ones(1, 2, dtype=torch.long))
