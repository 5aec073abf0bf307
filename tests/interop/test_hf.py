"""skiplab.interop.hf against transformers' own GPT2LMHeadModel and LlamaForCausalLM: tiny random models built
here (nothing from the hub), logits equal both ways, weights equal after a round trip, cached decoding equal to
Hugging Face's full pass, a training step (train mode, dropout 0, float64, width 64) with HF's logits and every
weight's gradient, that comparison failing when skiplab's norms take another ε, and each input skiplab cannot
express a one-line ValueError naming it."""

import ast
import dataclasses
import sys
from pathlib import Path

import re

import pytest
import torch
from torch import nn

from skiplab.connections import norms
from skiplab.interop import hf
from skiplab.models.gpt import GPT, GPTConfig
from skiplab.models.presets import model_config

CHECKED_AGAINST = "transformers 5.24.0"  # the dev extra's pin; the mapping was read from and tested on this version
transformers = pytest.importorskip("transformers", minversion="5.0")

# float32, logits of magnitude up to ~9: the largest |skiplab - HF| measured over the four shapes and 20 seeds
# (logits both ways; log-probs of cached decoding) was 2.4e-6 / 6.7e-6 for GPT-2 and 1.25e-5 / 3.1e-5 for LLaMA.
# The rotary angles agree bit for bit; the rest is rounding of the same sums done in another order (RMSNorm alone
# differs by 7e-7), grown through the SwiGLU products. The tolerances sit 3-4x above that and far below what a
# wrong mapping gives (one c_proj left untransposed, or gate and up swapped in one layer: 5 to 10).
TOL = {"PreLN": 1e-5, "PreRMS": 1e-4}
VOCAB, T = 61, 16

SHAPES = {
    "gpt2": dict(mlp="gelu", positions="learned", bias=True, tie=True, connection="PreLN", ffn_dim=48),
    "gpt2-untied": dict(mlp="gelu", positions="learned", bias=True, tie=False, connection="PreLN", ffn_dim=48),
    "llama": dict(mlp="swiglu", positions="rope", bias=False, tie=False, connection="PreRMS", ffn_dim=40, norm="RMS"),
    "llama-tied-bias": dict(mlp="swiglu", positions="rope", bias=True, tie=True, connection="PreRMS", ffn_dim=40,
                            rope_base=500000.0, norm="RMS"),
}


def tol(shape: str) -> float:
    return TOL[SHAPES[shape]["connection"]]


def tiny(shape: str) -> GPTConfig:
    return GPTConfig(vocab_size=VOCAB, d_model=32, heads=4, layers=2, context=T, **SHAPES[shape])


def hf_config(shape: str):
    """The Hugging Face config of a shape, written out here rather than by the module under test."""
    s = SHAPES[shape]
    if s["connection"] == "PreLN":
        return transformers.GPT2Config(vocab_size=VOCAB, n_positions=T, n_embd=32, n_layer=2, n_head=4,
                                       n_inner=s["ffn_dim"], tie_word_embeddings=s["tie"], resid_pdrop=0.0,
                                       embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None)
    return transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=s["ffn_dim"],
                                    num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=T,
                                    rms_norm_eps=1e-5, tie_word_embeddings=s["tie"], attention_bias=s["bias"],
                                    mlp_bias=s["bias"], bos_token_id=None, eos_token_id=None,
                                    rope_parameters={"rope_type": "default",
                                                     "rope_theta": s.get("rope_base", 10000.0)})


def randomise(model: nn.Module, seed: int) -> nn.Module:
    """Every weight redrawn large enough that a wrong transpose, split or norm shows: norm gains 1 + 0.3 N(0, 1)
    (the only 1-D ``weight``s of both families), everything else 0.3 N(0, 1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = 0.3 * torch.randn(p.shape, generator=g)
            p.copy_(1 + noise if p.dim() == 1 and name.endswith("weight") else noise)
    return model.eval()


def tokens(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (3, T), generator=torch.Generator().manual_seed(seed))


def hf_logits(model, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=x).logits


def test_checked_against_the_pinned_version():
    """The mapping reads transformers' config fields and weight names; re-check both on another version, then
    update CHECKED_AGAINST (and the dev extra's pin)."""
    assert f"transformers {transformers.__version__}" == CHECKED_AGAINST


@pytest.mark.parametrize("shape", SHAPES)
def test_skiplab_to_hf_logits(shape):
    model = randomise(GPT(tiny(shape)), seed=1)
    theirs = hf.hf_model(model)
    assert type(theirs).__name__ == hf.CLASSES[theirs.config.model_type]
    x = tokens()
    with torch.no_grad():
        ours = model(x)
    assert (ours - hf_logits(theirs, x)).abs().max() < tol(shape)


@pytest.mark.parametrize("shape", SHAPES)
def test_hf_to_skiplab_logits(shape):
    theirs = randomise(getattr(transformers, hf.CLASSES[hf_config(shape).model_type])(hf_config(shape)), seed=2)
    model = hf.from_hf(theirs)
    assert model.cfg == dataclasses.replace(tiny(shape), init=model.cfg.init)
    x = tokens()
    with torch.no_grad():
        ours = model(x)
    assert (ours - hf_logits(theirs, x)).abs().max() < tol(shape)


@pytest.mark.parametrize("shape", SHAPES)
def test_round_trips_are_exact(shape):
    """HF -> skiplab -> HF and skiplab -> HF -> skiplab give the same tensors, bit for bit."""
    theirs = randomise(getattr(transformers, hf.CLASSES[hf_config(shape).model_type])(hf_config(shape)), seed=3)
    back = hf.hf_model(hf.from_hf(theirs)).state_dict()
    assert back.keys() == theirs.state_dict().keys()
    assert all(torch.equal(t, back[n]) for n, t in theirs.state_dict().items())

    model = randomise(GPT(tiny(shape)), seed=4)
    again = hf.from_hf(*hf.to_hf(model)).state_dict()
    assert again.keys() == model.state_dict().keys()
    assert all(torch.equal(t, again[n]) for n, t in model.state_dict().items())


@pytest.mark.parametrize("shape", SHAPES)
def test_cached_decoding_matches_hf_full_pass(shape):
    """skiplab's incremental start/step on the imported weights against HF's logits of the whole sequence."""
    theirs = randomise(getattr(transformers, hf.CLASSES[hf_config(shape).model_type])(hf_config(shape)), seed=5)
    model = hf.from_hf(theirs)
    x, p = tokens(1), 5
    want = torch.log_softmax(hf_logits(theirs, x), dim=-1)
    with torch.no_grad():
        state = model.start(x[:, :p])
        got = torch.stack([model.step(x[:, i], state) for i in range(p, T)], dim=1)
    assert (got - want[:, p:]).abs().max() < tol(shape)


# float64, seed 7, the four shapes: the largest |skiplab - HF| was 1.0e-14 on the logits and 1.4e-15 on the gradients
# for GPT-2; 7.2e-6 and 3.0e-6 for LLaMA, whose rotary tables both sides compute in float32 (their cos and sin differ
# by up to 1.8e-7 at these positions: float32 rounding). The norms' ε mutated below (1e-4 for 1e-5) moves the
# logits by >= 5e-3 and the gradients by >= 8.4e-4.
GRAD_TOL = {"PreLN": 1e-12, "PreRMS": 3e-5}


def next_token_loss(logits: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), x[:, 1:].reshape(-1))


def compare_training_step(shape: str) -> None:
    """skiplab's model at width 64 and HF's holding its weights, both in train mode with dropout 0 and in float64:
    the logits and the gradient of a next-token loss on every weight. HF's gradients are read in skiplab's names
    through the weight map (a linear map: blocks, transposes), the same map that gives equal logits."""
    cfg = dataclasses.replace(tiny(shape), d_model=64, heads=4)
    model = randomise(GPT(cfg), seed=7).double()
    theirs = hf.hf_model(model)
    assert cfg.dropout == 0 and all(getattr(theirs.config, k, 0.0) == 0.0 for k in (
        "resid_pdrop", "embd_pdrop", "attn_pdrop", "attention_dropout"))  # dropout 0: train mode is deterministic
    model.train(), theirs.train()
    x = tokens(2)
    ours, ref = model(x), theirs(input_ids=x).logits
    tol = GRAD_TOL[cfg.connection]
    torch.testing.assert_close(ours, ref, rtol=0, atol=tol)
    next_token_loss(ours, x).backward(), next_token_loss(ref, x).backward()
    got = {name: p.grad for name, p in model.named_parameters()}
    want = hf.state_dict_from_hf(theirs.config, {name: p.grad for name, p in theirs.named_parameters()})
    assert got.keys() == want.keys()
    for name, g in got.items():
        assert want[name].abs().max() > 1e-6, name  # a gradient to compare
        torch.testing.assert_close(g, want[name], rtol=0, atol=tol, msg=name)


@pytest.mark.parametrize("shape", SHAPES)
def test_a_training_step_gives_hfs_logits_and_gradients(shape):
    compare_training_step(shape)


@pytest.mark.parametrize("shape", ["gpt2", "llama"])
def test_the_comparison_fails_when_the_norms_eps_is_mutated(shape, monkeypatch):
    """skiplab's norms built with ε = 1e-4 where the model (and so HF's config) says 1e-5: the comparison fails."""
    monkeypatch.setattr(norms, "EPS", 1e-4)
    with pytest.raises(AssertionError):
        compare_training_step(shape)


@pytest.mark.parametrize("shape", SHAPES)
def test_state_dict_keys_of_bare_checkpoints_load(shape):
    """A checkpoint of the bare base model (GPT-2's hub file: no ``transformer.`` prefix, its ``attn.bias``
    buffers) loads as the causal LM's."""
    theirs = randomise(getattr(transformers, hf.CLASSES[hf_config(shape).model_type])(hf_config(shape)), seed=6)
    base = theirs.base_model_prefix + "."
    bare = {n.removeprefix(base): t for n, t in theirs.state_dict().items() if not (tiny(shape).tie and "lm_head" in n)}
    if shape.startswith("gpt2"):
        bare.update({f"h.{i}.attn.bias": torch.ones(1, 1, T, T, dtype=torch.bool) for i in range(2)})
    model = hf.from_hf(theirs.config, bare)
    x = tokens()
    with torch.no_grad():
        assert (model(x) - hf_logits(theirs, x)).abs().max() < tol(shape)
    if not tiny(shape).tie:  # a bare base model has no head: with an untied config that is said, not "missing ..."
        headless = {n: t for n, t in bare.items() if n != "lm_head.weight"}
        with pytest.raises(ValueError, match=re.escape(
                f"the {hf.CLASSES[hf_config(shape).model_type]} state dict has no output layer (lm_head.weight), and "
                "its config unties it from the embedding (tie_word_embeddings false): a base model without its "
                "language-model head; give the causal LM's weights")):
            hf.from_hf(theirs.config, headless)


@pytest.mark.parametrize("shape", SHAPES)
def test_model_spec_gives_the_config_back(shape):
    cfg = tiny(shape)
    assert model_config(hf.model_spec(cfg)) == cfg


@pytest.mark.parametrize("shape", ["gpt2", "llama"])
def test_hub_folders_round_trip(shape, tmp_path):
    """What ``skiplab export hf`` / ``import hf`` will do: save_pretrained and from_pretrained, and a config with
    a safetensors file of :func:`to_hf`'s state dict, give the weights back bit for bit."""
    safetensors = pytest.importorskip("safetensors.torch")
    model = randomise(GPT(tiny(shape)), seed=8)
    hf.hf_model(model).save_pretrained(tmp_path / "pretrained")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "pretrained")
    config, state = hf.to_hf(model)
    config.save_pretrained(tmp_path / "files")
    safetensors.save_file(state, tmp_path / "files" / "model.safetensors")
    from_files = hf.from_hf(transformers.AutoConfig.from_pretrained(tmp_path / "files"),
                            safetensors.load_file(tmp_path / "files" / "model.safetensors"))
    for back in (hf.from_hf(loaded), from_files):
        assert all(torch.equal(t, back.state_dict()[n]) for n, t in model.state_dict().items())


BAD_CONNECTIONS = ["PostLN", "SAS", "2rSkip+LN", "PreLN(scale=depth)", "PreLN+ValueRes", "PreDyT"]


@pytest.mark.parametrize("spec", BAD_CONNECTIONS)
def test_other_connections_are_refused(spec):
    model = GPT(dataclasses.replace(tiny("gpt2"), connection=spec))
    with pytest.raises(ValueError, match="has no Hugging Face counterpart") as err:
        hf.to_hf(model)
    assert spec in str(err.value) and "\n" not in str(err.value)


def gpt2(**fields):
    return transformers.GPT2Config(**{**hf_config("gpt2").to_dict(), **fields})


def llama(**fields):
    base = {k: v for k, v in hf_config("llama").to_dict().items() if k != "rope_scaling"}
    return transformers.LlamaConfig(**{**base, **fields})


BAD_CONFIGS = {
    "gqa": (lambda: llama(num_key_value_heads=2), "grouped-query attention"),
    "rope scaling": (lambda: llama(rope_parameters={"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}),
                     "rope_parameters"),
    "activation": (lambda: gpt2(activation_function="relu"), "activation_function='relu'"),
    "hidden_act": (lambda: llama(hidden_act="gelu"), "hidden_act='gelu'"),
    "half a bias": (lambda: llama(attention_bias=True), "attention_bias=True, mlp_bias=False"),
    "head_dim": (lambda: llama(head_dim=16), "head_dim=16"),
    "layer-scaled attention": (lambda: gpt2(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx"),
    "dropouts": (lambda: gpt2(attn_pdrop=0.1), "one dropout"),
    "architecture": (lambda: transformers.BertConfig(), "unsupported architecture 'bert'"),
}


@pytest.mark.parametrize("case", BAD_CONFIGS)
def test_inexpressible_configs_are_refused(case):
    make, message = BAD_CONFIGS[case]
    with pytest.raises(ValueError, match=message.replace("(", r"\(")) as err:
        hf.config_from_hf(make())
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("cfg, message", [
    (dict(positions="rope"), "needs positions=learned, mlp=gelu, bias=true; this model has positions=rope"),
    (dict(bias=False), "bias=false"),
    (dict(connection="PreRMS"), "needs positions=rope, mlp=swiglu; this model has positions=learned, mlp=gelu"),
])
def test_shapes_the_classes_lack_are_refused(cfg, message):
    with pytest.raises(ValueError, match=message):
        hf.config_to_hf(dataclasses.replace(tiny("gpt2"), **cfg))


def test_other_models_and_bad_weights_are_refused():
    with pytest.raises(ValueError, match="not GPT2Model"):
        hf.from_hf(transformers.GPT2Model(hf_config("gpt2")))
    with pytest.raises(ValueError, match="not Linear"):
        hf.to_hf(nn.Linear(2, 2))
    state = randomise(transformers.GPT2LMHeadModel(hf_config("gpt2")), seed=7).state_dict()
    with pytest.raises(ValueError, match="missing transformer.h.0.attn.c_attn.weight"):
        hf.from_hf(hf_config("gpt2"), {n: t for n, t in state.items() if n != "transformer.h.0.attn.c_attn.weight"})
    with pytest.raises(ValueError, match="the weights do not fit the config"):
        hf.from_hf(gpt2(n_positions=T + 1), state)
    with pytest.raises(ValueError, match="would change the model's d_model"):
        hf.config_to_hf(tiny("gpt2"), n_embd=64)


@pytest.mark.parametrize("shape, field", [("gpt2", "layer_norm_epsilon"), ("llama", "rms_norm_eps")])
def test_the_checkpoints_norm_eps_is_read_and_written(shape, field):
    """eps comes from the config (LlamaConfig's default is 1e-6, skiplab's 1e-5): a large one (0.25, so that a
    model that ignored it would differ far beyond float noise) gives HF's logits, and goes back out as it came."""
    make = gpt2 if shape == "gpt2" else llama
    theirs = randomise(getattr(transformers, hf.CLASSES[shape])(make(**{field: 0.25})), seed=3)
    model = hf.from_hf(theirs)
    assert model.cfg.norm_eps == 0.25
    assert {m.eps for m in model.modules() if hasattr(m, "eps")} == {0.25}
    x = tokens()
    with torch.no_grad():
        ours, ref = model(x), hf_logits(theirs, x)
        default = GPT(dataclasses.replace(model.cfg, norm_eps=1e-5))
        default.load_state_dict(model.state_dict())
        ignored = default.eval()(x)
    assert (ours - ref).abs().max() < tol(shape)
    assert (ignored - ref).abs().max() > 100 * tol(shape)  # the test sees eps
    assert getattr(hf.config_to_hf(model.cfg), field) == 0.25
    assert "norm_eps=0.25" in hf.model_spec(model.cfg)


def test_norm_eps_is_checked():
    with pytest.raises(ValueError, match="norm_eps must be in"):
        dataclasses.replace(tiny("gpt2"), norm_eps=0.0)


def test_token_ids_pass_through():
    config = hf.config_to_hf(tiny("llama"), bos_token_id=1, eos_token_id=2)
    assert (config.bos_token_id, config.eos_token_id, config.rms_norm_eps) == (1, 2, 1e-5)


def test_transformers_is_imported_lazily(monkeypatch):
    """No top-level import of transformers; without it, one line naming the extra."""
    source = ast.parse(Path(hf.__file__).read_text())
    top = [n for n in source.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not any("transformers" in ast.unparse(n) for n in top)
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match=r"pip install skiplab\[hf\]"):
        hf.config_to_hf(tiny("gpt2"))


@pytest.mark.parametrize("shape", ["gpt2", "llama"])
def test_a_padded_vocabulary_is_cut_off_in_the_logits_and_on_export(shape):
    """pad_vocab 64: the embedding (and an untied head) get 64 rows for the vocabulary's 50; the model's logits are
    the 50 real ones, and the Hugging Face model has 50 rows with the same logits."""
    cfg = dataclasses.replace(tiny(shape), vocab_size=50, pad_vocab=64)
    model = randomise(GPT(cfg), seed=4)
    assert model.embed.weight.shape[0] == 64 and (model.head is None or model.head.weight.shape[0] == 64)
    x = torch.randint(0, 50, (2, T), generator=torch.Generator().manual_seed(0))
    theirs = hf.hf_model(model)
    assert theirs.config.vocab_size == 50 and theirs.get_input_embeddings().weight.shape[0] == 50
    with torch.no_grad():
        ours = model(x)
        assert ours.shape[-1] == 50
        assert (ours - hf_logits(theirs, x)).abs().max() < tol(shape)
    back = hf.from_hf(theirs)
    assert back.cfg.pad_vocab == 0 and back.cfg.vocab_size == 50
