"""The model's norm kind: a connection whose spec names no norm takes it, in its blocks and in the norms its
stacks begin and end with; a spec that names one keeps it. The LLaMA presets are RMS, the GPT and OLMo ones LN."""

import dataclasses
import math

import pytest
import torch
from torch import nn

import skiplab
from skiplab import connection, parse_spec
from skiplab.models import PRESETS, GPTConfig, build_model, model_config, model_from_checkpoint

NORM_LAYERS = (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm, nn.modules.batchnorm._BatchNorm)
SMALL = "d_model=32,heads=2,ffn_dim=48,layers=4,vocab_size=40,context=16"


def llama(spec: str, **kw) -> nn.Module:
    torch.manual_seed(0)
    return build_model(model_config(f"llama-71m({SMALL},connection={spec})", **kw))


def norm_kinds(model: nn.Module) -> set[str]:
    """LN or RMS for every norm layer in ``model``."""
    return {"RMS" if isinstance(m, nn.RMSNorm) else "LN" for m in model.modules() if isinstance(m, NORM_LAYERS)}


@pytest.mark.parametrize("text, on_rms, on_ln", [
    ("MixLN", "MixLN+RMS", "MixLN+LN"),
    ("MixLN(alpha=0.5)", "MixLN+RMS(alpha=0.5)", "MixLN+LN(alpha=0.5)"),
    ("LNS", "PreRMS(scale=depth)", "PreLN(scale=depth)"),
    ("DeepNorm", "DeepNorm+RMS", "DeepNorm+LN"),
    ("Admin", "Admin+RMS", "Admin+LN"),
    ("LayerScale", "LayerScale+RMS", "LayerScale+LN"),
    ("HC", "HC+RMS", "HC+LN"),
    ("mHC", "mHC+RMS", "mHC+LN"),
    ("PeriLN", "PeriLN+RMS", "PeriLN+LN"),
    ("SandwichLN", "SandwichLN+RMS", "SandwichLN+LN"),
    ("SAS", "SAS+RMS", "SAS+LN"),
    # a spec that names its norm keeps it
    ("PreLN", "PreLN", "PreLN"),
    ("PreRMS", "PreRMS", "PreRMS"),
    ("PostLN", "1xSkip+LN", "1xSkip+LN"),
    ("MixLN+LN", "MixLN+LN", "MixLN+LN"),
    ("LNS+LN", "PreLN(scale=depth)", "PreLN(scale=depth)"),
    ("MixLN+RMS", "MixLN+RMS", "MixLN+RMS"),
    ("2rSkip+BN", "2rSkip+BN", "2rSkip+BN"),
    ("SAS+DyT", "SAS+DyT", "SAS+DyT"),
    ("PreDyT", "PreDyT", "PreDyT"),
    # a design without a norm takes none
    ("1xSkip", "1xSkip", "1xSkip"),
    ("ReZero", "ReZero", "ReZero"),
])
def test_a_spec_naming_no_norm_takes_the_models_and_a_named_one_stays(text, on_rms, on_ln):
    assert connection(text, 8, norm="RMS").spec == on_rms
    assert connection(text, 8, norm="LN").spec == on_ln
    assert parse_spec(text, norm="RMS") == parse_spec(on_rms)  # the resolved spec reads back as built


def test_a_bad_model_norm_is_one_clear_error():
    with pytest.raises(ValueError, match="a model's norm must be one of LN, RMS, got 'BN'"):
        connection("MixLN", 8, norm="BN")
    with pytest.raises(ValueError, match="norm must be one of LN, RMS, got 'DyT'"):
        GPTConfig(norm="DyT")
    with pytest.raises(ValueError, match="norm must be one of LN, RMS, got 'rms'"):
        model_config("transformer-small(norm=rms)")


def test_the_presets_norms():
    for name in PRESETS:
        cfg = model_config(name)
        if name.startswith("llama-"):
            assert cfg.norm == "RMS", name  # the Mix-LN and curse-of-depth papers' LLaMA: RMSNorm
        elif hasattr(cfg, "norm"):
            assert cfg.norm == "LN", name  # GPT-2, OLMo (LayerNorm), the Transformer


def test_mixln_on_a_llama_preset_builds_rmsnorm_everywhere():
    model = llama("MixLN")
    assert norm_kinds(model) == {"RMS"}
    first, last = model.layers[0], model.layers[-1]
    assert first.conn_attn.post and not last.conn_attn.post  # ⌊0.25·4⌋ = 1 post-norm layer, then pre-norm
    for conn in (first.conn_attn, first.conn_mlp, last.conn_attn, last.conn_mlp):
        assert isinstance(conn.norm, nn.RMSNorm) and conn.spec == "MixLN+RMS"
    assert isinstance(model.norm, nn.RMSNorm)  # the final norm too
    # the same model as the paper's form written out
    torch.testing.assert_close(model.state_dict(), llama("MixLN+RMS").state_dict())


def test_lns_on_a_llama_preset_is_the_rmsnorm_pre_norm_scaled_by_depth():
    model = llama("LNS")
    assert norm_kinds(model) == {"RMS"}
    assert [layer.conn_attn.factor for layer in model.layers] == [1 / math.sqrt(l) for l in range(1, 5)]
    assert {layer.conn_mlp.spec for layer in model.layers} == {"PreRMS(scale=depth)"}
    assert isinstance(model.norm, nn.RMSNorm)
    torch.testing.assert_close(model.state_dict(), llama("PreRMS(scale=depth)").state_dict())


@pytest.mark.parametrize("spec", ["PreLN", "MixLN+LN", "LNS+LN", "PostLN", "DeepNorm+LN"])
def test_a_spec_naming_ln_keeps_layernorm_on_a_llama_preset(spec):
    assert norm_kinds(llama(spec)) == {"LN"}


@pytest.mark.parametrize("spec", ["MixLN", "LNS", "HC", "PeriLN"])
def test_the_gpt_presets_are_layernorm_as_before(spec):
    torch.manual_seed(0)
    model = build_model(model_config(f"gpt-mini(connection={spec})"))
    assert model.cfg.norm == "LN" and norm_kinds(model) == {"LN"}
    assert norm_kinds(llama(spec, norm="LN")) == {"LN"}  # a LLaMA shape asked for LN gets it


def test_the_transformer_takes_its_norm_in_both_stacks():
    model = build_model(model_config("transformer-small(d_model=32,ffn_dim=48,heads=2,encoder_layers=2,"
                                     "decoder_layers=2,vocab_size=40,connection=MixLN,norm=RMS)"))
    assert norm_kinds(model) == {"RMS"}
    assert model.decoder.layers[0].conn_cross.spec == "MixLN+RMS" and isinstance(model.encoder.norm, nn.RMSNorm)
    default = build_model(model_config("transformer-small(d_model=32,ffn_dim=48,heads=2,vocab_size=40,"
                                       "connection=MixLN)"))
    assert norm_kinds(default) == {"LN"}


def test_a_checkpoint_written_before_the_models_norm_rebuilds_as_it_was_trained():
    spec = f"llama-71m({SMALL},connection=MixLN)"
    trained = llama("MixLN", norm="LN")  # what a LLaMA-shaped MixLN run was before the model had a norm: LN
    stored = {k: v for k, v in dataclasses.asdict(trained.cfg).items() if k != "norm"}
    model = model_from_checkpoint({"config": {"model": spec}, "model_config": stored, "model": trained.state_dict()},
                                  "old.pt")
    assert model.cfg.norm == "LN" and norm_kinds(model) == {"LN"}
    assert model_config(spec).norm == "RMS"  # the same spec today builds RMSNorm


def test_a_llama_preset_goes_to_hugging_face_and_comes_back_as_itself():
    pytest.importorskip("transformers")
    from skiplab.interop.hf import from_hf, hf_model, model_spec

    model = llama("PreRMS")
    back = from_hf(hf_model(model))
    assert back.cfg == model.cfg and "norm" not in model_spec(back.cfg)  # LlamaForCausalLM is RMS


@pytest.mark.parametrize("spec", ["1xSkip+BN", "2rSkip+BN", "wSkip+BN", "SAS+BN"])
def test_batchnorm_is_refused_in_models_of_token_sequences(spec):
    """BN's training statistics mix every position of the batch: in a causal LM the logits before a token moved
    with it (0.065 at most at d = 32 with 1xSkip+BN, train mode). Refused in the GPT and in either stack of the
    Transformer; the image model keeps its BN forms (the papers' tables)."""
    connection(spec, 8, layout="seq")  # the connection alone: a (..., C) layer for one's own model
    for make in (lambda: GPTConfig(vocab_size=37, d_model=32, heads=4, layers=2, ffn_dim=64, context=16,
                                   connection=spec),
                 lambda: model_config("transformer-small", connection=spec),
                 lambda: model_config("transformer-small", encoder_connection=spec),
                 lambda: model_config("transformer-small", decoder_connection=spec)):
        with pytest.raises(ValueError, match=r"^[^\n]*BatchNorm has no form in a model of token sequences[^\n]*$"):
            make()
    image = build_model(model_config("preact-resnet20", connection=spec))
    assert any(isinstance(m, nn.BatchNorm2d) for _, c in skiplab.iter_connections(image) for m in c.modules())
