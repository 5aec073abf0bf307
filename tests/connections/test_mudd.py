"""``+MUDD``: the weight MLPs' shapes and initialisation as the authors' code has them, the plain model at the start,
incremental decoding, activation checkpointing, both Transformer stacks, the combinations refused in one line, and
what it reports (the static biases; the "layer i reads j" matrices of a batch). Its formula against a forward pass
written after the authors' code: tests/oracles/test_oracle_mudd.py."""

import copy
import re

import pytest
import torch

from skiplab.connections.across import MUDD, Across, Stack
from skiplab.connections.across.mudd import hidden_width
from tests.connections.test_denseformer import (checkpointing_keeps_the_gradients, decoding_steps_give_the_full_pass, gpt,
                                                refused_in_one_line, tokens, transformer)


def randomise(mudd: MUDD, seed=3):
    """Dynamic parts and biases away from their start, so that every term of the mix is seen."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in [*mudd.w2, *mudd.bias]:
            p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))


def test_the_weight_mlps_have_the_codes_widths_and_initialisation():
    # C·(i + 2), ×4 for the last layer (C = 1), then (h // 64 + 1)·64: a multiple of 64 moves up by 64
    assert [hidden_width(i, 16) for i in (0, 13, 14, 15)] == [64, 64, 128, 128]  # 8, 60, 64, 68
    assert [hidden_width(i, 4) for i in range(4)] == [64, 64, 64, 64]
    assert hidden_width(30, 32) == 192 and hidden_width(31, 32) == 192  # 4·32 = 128 -> 192; 4·33 = 132 -> 192
    torch.manual_seed(0)
    mudd = Across("PreLN+MUDD", Stack(3, 256)).designs[0]
    assert [tuple(w.shape) for w in mudd.w1] == [(64, 256)] * 3
    assert [tuple(w.shape) for w in mudd.w2] == [(8, 64), (12, 64), (4, 64)]
    assert all(w.abs().max() == 0 for w in mudd.w2)
    w1 = torch.cat([w.flatten() for w in mudd.w1])
    assert abs(w1.std().item() * 16 - 1) < 0.02 and abs(w1.mean().item()) < 0.005  # N(0, 1/d), d = 256
    assert [b.view(-1, i + 2).tolist() for i, b in enumerate(mudd.bias)] == [
        [[0.0, 1.0]] * 4, [[0.0, 0.0, 1.0]] * 4, [[0.0, 0.0, 0.0, 1.0]]]
    assert all(b.dim() == 1 for b in mudd.bias)  # out of the decay on matrices


@pytest.mark.parametrize("spec, kw", [("PreLN+MUDD", {}), ("PreRMS+MUDD", dict(mlp="swiglu", norm="RMS")),
                                      ("PeriLN+MUDD", {}), ("LNS+MUDD", {})])
@torch.no_grad()
def test_at_the_start_it_is_the_plain_model(spec, kw):
    mudd, plain = gpt(spec, **kw), gpt(spec.rpartition("+")[0], **kw)
    missing, unexpected = mudd.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and missing and all(n.startswith("across.") for n in missing)
    x = tokens()
    torch.testing.assert_close(mudd(x), plain(x), rtol=1e-6, atol=1e-6)
    randomise(mudd.across.designs[0])
    assert not torch.allclose(mudd(x), plain(x), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("spec, kw", [("PreLN+MUDD", dict(positions="learned")),
                                      ("PreRMS+MUDD", dict(mlp="swiglu", positions="rope")),
                                      ("PreLN+MUDD+ValueRes(learn=yes)", {})])
@torch.no_grad()
def test_incremental_decoding_gives_the_full_forward(spec, kw):
    m = copy.deepcopy(gpt(spec, **kw)).double()
    randomise(m.across.designs[0])
    x = tokens()
    full, caches = m(x), m.new_caches()
    cached = torch.cat([m(x[:, :4], caches)] + [m(x[:, t : t + 1], caches) for t in range(4, x.shape[1])], 1)
    torch.testing.assert_close(cached, full)
    assert caches[1]["k"].shape[2] == x.shape[1]


def test_activation_checkpointing_gives_the_same_gradients():
    """Each layer reads the streams kept for it, so a layer recomputed in the backward reads its own."""
    m = gpt("PreLN+MUDD").double().train()
    randomise(m.across.designs[0])
    plain = checkpointing_keeps_the_gradients(m)
    across = [n for n in plain if n.startswith("across.")]
    assert len(across) == 3 * 4 and all(plain[n].abs().sum() > 0 for n in across)  # W1, W2, B of each layer


@torch.no_grad()
def test_both_transformer_stacks_read_their_streams_and_start_as_the_plain_model():
    plain, mudd = transformer("PreLN", decoder_layers=2), transformer("PreLN+MUDD", decoder_layers=2)
    mudd.load_state_dict(plain.state_dict(), strict=False)
    src, tgt = tokens(), tokens(t=6)
    torch.testing.assert_close(mudd(src, tgt), plain(src, tgt), rtol=1e-6, atol=1e-6)
    for stack in (mudd.encoder, mudd.decoder):
        randomise(stack.across.designs[0])
        assert not torch.allclose(mudd(src, tgt), plain(src, tgt), rtol=1e-3, atol=1e-3)
    decoding_steps_give_the_full_pass(mudd, src, tgt)


@pytest.mark.parametrize("spec, problem", [
    ("PostLN+MUDD", "+MUDD replaces the residual sum of a connection y = x + B(x) (PreLN, PreRMS, LNS, PeriLN, "
                    "SandwichLN); PostLN is not of that form"),
    ("HC+MUDD", "HC is not of that form"),
    ("PreLN+MUDD+UNet", "+MUDD replaces the residual sum; it cannot be combined with +UNet"),
    ("PreLN+MUDD(n=2)", "MUDD has no option 'n' (options: none)"),
])
def test_combinations_that_mean_nothing_are_refused_in_one_line(spec, problem):
    refused_in_one_line(spec, problem)


def test_a_stack_of_unknown_width_is_refused():
    with pytest.raises(ValueError, match=re.escape("+MUDD needs the stack's width (Stack.dim)")):
        Across("PreLN+MUDD", 4)


@torch.no_grad()
def test_reads_gives_the_mean_and_std_over_positions_of_each_layers_weights():
    m = gpt("PreLN+MUDD", layers=3)
    mudd = m.across.designs[0]
    x = tokens()
    with mudd.keeping() as kept:
        m(x)
    mean, std = mudd.reads(kept)
    assert mudd.kept is None and mean.shape == std.shape == (4, 4, 4)
    start = torch.eye(4).expand(4, 4, 4).clone()
    start[:3, 3] = float("nan")  # after the last layer, one stream: the output's (R)
    torch.testing.assert_close(mean, start, equal_nan=True)
    assert std[:, :3].abs().max() == 0 and std[3, 3].abs().max() == 0

    randomise(mudd)
    caches = m.new_caches()
    with mudd.keeping() as kept:
        m(x[:, :5], caches)
        m(x[:, 5:], caches)  # two passes (a prompt, then the rest after it): their positions pooled
    mean, std = mudd.reads(kept)
    x1 = m.layers[0](m.embed(x))  # layer 0's output; its weights A_0 (B, T, 4, 2)
    a0 = mudd.weights(0, x1).flatten(0, 1)
    torch.testing.assert_close(mean[:, 1, :2], a0.mean(0))
    torch.testing.assert_close(std[:, 1, :2], a0.std(0, unbiased=False))
    assert mean[:, 1, 2:].abs().max() == 0 and mean[:, 2, 3:].abs().max() == 0
    assert (std[:, 1:3, :2] > 0).all()


def test_stats_and_rows_give_the_static_biases():
    mudd = Across("PreLN+MUDD", Stack(3, 64)).designs[0]
    randomise(mudd)
    b = [p.detach().view(-1, i + 2) for i, p in enumerate(mudd.bias)]
    stats = mudd.stats()
    assert len(stats) == 4 * 4 and all(len(t) == 3 for t in stats.values())
    assert stats["bias_K_1"].tolist() == [b[0][1, 1].item(), b[1][1, 1].item(), 0.0]  # the output has no K
    assert stats["bias_R_3"].tolist() == [0.0, 0.0, b[2][0, 3].item()]
    rows = mudd.rows()
    assert len(rows) == 4 * 2 + 4 * 3 + 1 * 4
    assert rows[0] == (0, "bias_Q_0", b[0][0, 0].item()) and rows[-1] == (2, "bias_R_3", b[2][0, 3].item())
    torch.testing.assert_close(mudd.static()[1, 2, :3], b[1][1])
