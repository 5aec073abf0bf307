"""The encoder-decoder shell and the model spec: what the refactor into families must keep and add."""

import copy
from pathlib import Path

import pytest
import torch

from skiplab.models import (EncoderDecoder, Transformer, build_model, format_model_spec, model_config,
                            parse_model_spec, with_options)
from skiplab.translate.translator import Translator
from tests.noise import assert_within_noise, noise

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_a_checkpoint_written_before_the_shell_gives_the_same_logits_and_translations():
    """transformer_pre_shell.pt was written by skiplab e670ab1 (flat encoder.N / encoder_norm keys)."""
    expected = torch.load(FIXTURES / "transformer_pre_shell_expected.pt", weights_only=True)
    tr = Translator.load(FIXTURES / "transformer_pre_shell.pt", device="cpu")
    assert isinstance(tr.model, Transformer) and tr.model.cfg.connection == "PreLN"
    with torch.no_grad():
        logits = tr.model(expected["src"], expected["tgt_in"])
        logits64 = copy.deepcopy(tr.model).double()(expected["src"], expected["tgt_in"])
    # The stored logits came from another machine's kernels: both float32 results against float64 measure the noise
    level = noise((expected["logits"], logits64), (logits, logits64))
    assert_within_noise(logits, expected["logits"], level)
    assert tr.translate(expected["lines"], beam=2) == expected["beam2"]
    assert tr.describe()["connection"] == "PreLN"


def test_the_shell_holds_the_stacks_and_both_families_share_it():
    model = build_model(model_config("transformer-small", vocab_size=40, d_model=16, ffn_dim=32, heads=2,
                                     encoder_layers=2, decoder_layers=3))
    assert isinstance(model, EncoderDecoder)
    assert len(model.encoder.layers) == 2 and len(model.decoder.layers) == 3
    keys = set(model.state_dict())
    assert "encoder.layers.1.ffn.0.weight" in keys and "embed.weight" in keys and "positions" not in keys


def test_model_spec_round_trip_and_types():
    name, options = parse_model_spec("transformer-small(connection=SAS(gate=single,gamma=free), encoder-layers=2)")
    assert name == "transformer-small"
    assert options == {"connection": "SAS(gate=single,gamma=free)", "encoder_layers": "2"}
    assert format_model_spec(name, options) == "transformer-small(connection=SAS(gate=single,gamma=free),encoder_layers=2)"
    cfg = model_config("transformer-small(encoder_layers=2,dropout=0.3)", heads=8)
    assert (cfg.encoder_layers, cfg.dropout, cfg.heads, cfg.d_model) == (2, 0.3, 8, 256)
    assert with_options("transformer-small", connection="PreLN", dropout=0.2) == "transformer-small(connection=PreLN,dropout=0.2)"
    assert with_options("transformer-small(dropout=0.2)", dropout=0.2) == "transformer-small(dropout=0.2)"


@pytest.mark.parametrize("spec,message", [
    ("transformer-tiny", "unknown model 'transformer-tiny' (did you mean 'transformer-big'?); known: "),
    ("transformer-smal", "unknown model 'transformer-smal' (did you mean 'transformer-small'?); known: "),
    ("resnet", "unknown model 'resnet'; known: "),
    ("transformer-small(heads)", "'heads' is not key=value"),
    ("transformer-small(heads=2", "one pair of parentheses"),
    ("transformer-small(width=2)", "transformer-small has no option width (its options: vocab_size, d_model"),
    ("transformer-small(heads=two)", "heads='two' is not a valid int"),
    ("transformer-small(heads=3)", "d_model (256) must be divisible by heads (3)"),
    ("transformer-small(heads=2,heads=4)", "heads given twice"),
    ("transformer-small(connection=foo)", "bad connection spec 'foo': unknown name"),
])
def test_bad_model_specs_name_the_problem(spec, message):
    with pytest.raises(ValueError) as err:
        model_config(spec)
    assert message in str(err.value)


def test_an_option_set_twice_is_refused():
    with pytest.raises(ValueError, match=r"dropout is set twice: dropout=0.2 in 'transformer-small\(dropout=0.2\)'"):
        with_options("transformer-small(dropout=0.2)", dropout=0.3)
