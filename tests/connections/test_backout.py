"""``+Backout``: the head reads N(x_L − λ·x_k), against a pre-norm GPT written out by hand (outputs and gradients,
width 64); the record's k and λ; λ = 0 is the plain model; incremental decoding; a layer the stack has not and the
Transformer refused in one line; with ``+UNet`` and ``+Scalars`` as modded-nanogpt has them, a training step; a
mutation the hand forward catches."""

import json

import pytest
import torch
import torch.nn.functional as F

from skiplab.cli import main
from skiplab.connections import parse_spec
from skiplab.connections.across import Backout, Stack
from skiplab.models import GPTConfig, TransformerConfig
from skiplab.tasks import load_trained
from tests.connections.test_scalars import assert_cached_is_full, gpt, hand_gpt, outputs_and_gradients, tokens
from tests.train.test_distributed import one_thread
from tests.train.test_lm import args, run, text  # noqa: F401  (text: the corpus fixture)


def backed_out(lam, k):
    """The record's ``x -= backout_lambda*x_backout``, x_backout the output of block k (0-based)."""
    return lambda h, outs: h - lam * outs[k]


@pytest.mark.parametrize("spec, k", [("PreLN+Backout", 2), ("PreLN+Backout(layer=0,init=0.2)", 0),
                                     ("PreLN+Backout(layer=3)", 3)])
def test_backout_gives_the_hand_forward_outputs_and_gradients(spec, k):
    m = gpt(spec).double()  # 4 layers: auto is ⌊8/3⌋ = 2
    b = m.across.designs[0]
    assert b.k == k
    with torch.no_grad():
        b.lam.fill_(0.37)
    x = tokens()
    y, grads = outputs_and_gradients(m, lambda: m(x))
    y_hand, grads_hand = outputs_and_gradients(m, lambda: hand_gpt(m, x, head_in=backed_out(b.lam, k)))
    torch.testing.assert_close(y, y_hand)
    assert grads.keys() == grads_hand.keys() and "across.designs.0.lam" in grads
    for name in grads:
        torch.testing.assert_close(grads[name], grads_hand[name], msg=name)
    assert b.lam.grad.abs().item() > 0


def test_the_records_layer_and_lambda():
    spec = parse_spec("PreLN+Backout").stack[0]
    assert Backout.layer(spec, Stack(12)) == 8  # records/100425_Backout: num_layers=12, `if i==8: x_backout=x`
    assert Backout.layer(spec, Stack(11)) == 7  # its later code: num_layers=11, `if i == 7`
    assert gpt("PreLN+Backout").across.designs[0].lam.tolist() == [0.5]  # 0.5*torch.ones(1), # backout_lambda


@torch.no_grad()
def test_lambda_0_is_the_plain_model_exactly():
    plain, backout = gpt("PreLN"), gpt("PreLN+Backout(init=0)")
    missing, unexpected = backout.load_state_dict(plain.state_dict(), strict=False)
    assert missing == ["across.designs.0.lam"] and not unexpected
    x = tokens()
    assert torch.equal(backout(x), plain(x))
    backout.across.designs[0].lam.fill_(0.5)
    assert not torch.allclose(backout(x), plain(x))


@pytest.mark.parametrize("spec", ["PreLN+Backout", "HC+Backout(layer=1)"])
@torch.no_grad()
def test_cached_decoding_gives_the_full_forward(spec):
    assert_cached_is_full(gpt(spec))


def test_a_layer_the_stack_has_not_is_refused_when_the_config_is_made():
    with pytest.raises(ValueError) as err:
        GPTConfig(layers=4, connection="PreLN+Backout(layer=4)")
    assert str(err.value) == ("bad connection spec 'PreLN+Backout(layer=4)': +Backout(layer=4) backs out layer 4's "
                              "output; the stack's layers are 0, ..., 3")
    GPTConfig(layers=5, connection="PreLN+Backout(layer=4)")
    with pytest.raises(ValueError, match="option layer: must be auto or a layer index"):
        parse_spec("PreLN+Backout(layer=-1)")


def test_the_cli_refuses_it_in_one_line_before_anything_is_written(capsys, tmp_path):
    out = tmp_path / "run"
    assert main(["train", "lm", "--connection", "PreLN+Backout(layer=9)", "--layers", "4", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "+Backout(layer=9) backs out layer 9's output" in err
    assert not out.exists()


@pytest.mark.parametrize("field", ["connection", "encoder_connection", "decoder_connection"])
def test_the_transformer_refuses_backout_in_one_line(field):
    stack = "decoder" if field == "decoder_connection" else "encoder"
    with pytest.raises(ValueError) as err:
        TransformerConfig(vocab_size=40, d_model=64, heads=4, ffn_dim=128, **{field: "PreLN+Backout"})
    assert str(err.value) == f"+Backout has no form in a Transformer's {stack} (only in lm stacks)"


@pytest.mark.parametrize("spec", ["PreLN+UNet+Scalars+Backout", "PreLN+UNet+Scalars(per=sublayer)+Backout"])
def test_with_unet_and_scalars_it_builds_and_trains_a_step(spec):
    m = gpt(spec, layers=6).train()
    unet, scalars, backout = m.across.designs
    assert backout.k == 4 and unet.half == 3
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    x = tokens(b=4, t=12)
    losses = []
    for _ in range(2):
        opt.zero_grad()
        loss = F.cross_entropy(m(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        loss.backward()
        for p in m.across.parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().min() > 0
        opt.step()
        losses.append(loss.item())
    assert losses[1] < losses[0]
    assert backout.lam.item() != 0.5 and not torch.equal(unet.weight.detach(), torch.ones(3))
    assert set(m.across.stats()) == {"UNet", "Scalars", "Backout"}


def test_stats_and_rows_give_lambda_and_k():
    b = gpt("PreLN+Backout(layer=1,init=0.25)").across.designs[0]
    assert b.stats()["backout_lambda"].tolist() == [0.25]
    assert b.rows() == [(1, "backout_lambda", 0.25), (1, "backout_layer", 1.0)]


def test_the_hand_forward_catches_the_wrong_layer(monkeypatch):
    """The oracle must see x_k taken one layer late (the output of the layer after k), as an off-by-one would."""
    m = gpt("PreLN+Backout")
    x = tokens()
    hand = hand_gpt(m, x, head_in=backed_out(m.across.designs[0].lam, 2))
    torch.testing.assert_close(m(x), hand)
    monkeypatch.setattr(Backout, "leave",
                        lambda self, i, h, state: state.update(backout=h) if i == self.k + 1 else None)
    assert not torch.allclose(m(x), hand, rtol=1e-3, atol=1e-4)


def test_a_trained_run_reports_the_scalars_and_backout_in_its_gates(text, tmp_path):
    """One tiny ``train lm`` run with the speedrun's three designs together, then ``analyze gates``: a row per
    layer and quantity, each the trained model's value."""
    out = tmp_path / "speedrun"
    spec = "PreLN+UNet+Scalars(per=sublayer)+Backout(layer=0)"
    with one_thread():
        assert run(args(text, out, "--connection", spec)) == 0
        assert run(["analyze", "gates", out, "--examples", "8", "--split", "valid"]) == 0
    rows = json.loads((out / "analysis" / "gates.json").read_text())["connections"]
    _, scalars, backout = load_trained(out).model.across.designs
    a = scalars.a.detach()
    assert [(r["block"], r["resid_lambda_ffn"]) for r in rows if "resid_lambda_ffn" in r] == [
        ("layer.0", a[0, 1].item()), ("layer.1", a[1, 1].item())]
    lam = [(r["block"], r["backout_lambda"]) for r in rows if "backout_lambda" in r]
    assert lam == [("layer.0", backout.lam.item())]
    assert backout.lam.item() != 0.5 and a[0, 0].item() != 1.1 ** 0.5  # trained away from their start
    table = (out / "analysis" / "gates.md").read_text()
    assert "x0_lambda" in table and "backout_layer" in table
