"""skiplab's GPT family <-> Hugging Face's ``GPT2LMHeadModel`` and ``LlamaForCausalLM``: configs and weights.

Hugging Face's two classes are pre-norm stacks with one norm each, so the connection picks the class:

    skiplab GPTConfig      GPT2LMHeadModel (GPT2Config)             LlamaForCausalLM (LlamaConfig)
    connection             PreLN: ln_1, ln_2, ln_f (LayerNorm)      PreRMS: input_/post_attention_layernorm, norm
    positions, mlp         learned (wpe), gelu (gelu_new)           rope (rope_type default), swiglu (silu)
    vocab_size, d_model    vocab_size, n_embd                       vocab_size, hidden_size
    heads, layers          n_head, n_layer                          num_attention_heads (= num_key_value_heads),
                                                                     num_hidden_layers
    ffn_dim, context       n_inner (None: 4 n_embd), n_positions    intermediate_size, max_position_embeddings
    bias                   true (GPT-2 always has biases)           attention_bias = mlp_bias
    tie                    tie_word_embeddings                      tie_word_embeddings
    rope_base              (none)                                   rope_parameters["rope_theta"]
    dropout                resid_pdrop = embd_pdrop = attn_pdrop    none: attention_dropout 0 (LLaMA drops attention
                                                                     probabilities only, skiplab embeddings and
                                                                     sub-layer outputs too: an import refuses
                                                                     attention_dropout > 0, an export of a run trained
                                                                     with dropout writes 0 and says so)
    norm_eps               layer_norm_epsilon                       rms_norm_eps

GELU: skiplab's ``F.gelu(approximate="tanh")`` and GPT-2's ``gelu_new``, 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))
(transformers ``activations.py``, ``NewGELUActivation``), are one function; ``gelu_pytorch_tanh`` loads too, and
so does GPT-2's ``reorder_and_upcast_attn`` (the same attention, its scores computed in float32).
Anything else (another connection or its options, designs across the layers, QK-norm (``qk_norm``), grouped-query
attention, rope scaling, a head width other than d/heads, scaled or cross attention, other activations) is a one-line
:class:`ValueError` naming it; ``init`` is not a property of weights (GPT-2 loads as ``init=gpt2``).

Weights (:func:`weight_map`; ``modeling_gpt2.py`` and ``modeling_llama.py`` of transformers 5.24.0):

- GPT-2's ``Conv1D`` computes y = x W + b with W of shape (in, out), the transpose of ``nn.Linear``'s (out, in):
  every ``c_attn``, ``c_proj``, ``c_fc`` weight is transposed; biases are not. ``c_attn`` splits its 3d outputs
  into q, k, v in that order, the row order of skiplab's stacked ``qkv_proj``.
- LLaMA keeps q, k, v in separate layers: ``qkv_proj`` = [q_proj; k_proj; v_proj] (rows stacked); SwiGLU is
  down(SiLU(gate_proj x) ⊙ up_proj x), and skiplab's ``mlp.up`` = [gate_proj; up_proj] (its first half goes
  through SiLU, :class:`~skiplab.models.gpt.MLP`).
- Rotary: both rotate the pairs (i, i + d/2) of a head (``rotate_half``, :class:`~skiplab.models.attention.Rotary`)
  by p·base^(−2i/d), so q and k rows map as they are. (``convert_llama_weights_to_hf.py`` permutes the rows of
  Meta's checkpoints, whose rotary pairs are interleaved (2i, 2i + 1), into this half-split layout; skiplab's
  layout is already the half-split one.)
- A tied output projection is the embedding: no ``lm_head.weight`` is written (as ``save_pretrained`` leaves
  it out) and one given is ignored. Buffers of older checkpoints (``attn.bias``, ``attn.masked_bias``,
  ``rotary_emb.inv_freq``) are skipped, and keys of the bare ``GPT2Model``/``LlamaModel`` (no ``transformer.`` /
  ``model.`` prefix, as GPT-2's hub checkpoint holds them) are read as the causal LM's.

Use::

    hf = hf_model(model)                  # a transformers model with model's weights (hf.save_pretrained(dir))
    config, state = to_hf(model)          # or the HF config and the state dict it loads
    model = from_hf(hf)                   # an HF model (or: from_hf(config, state_dict)) -> skiplab GPT
    spec = model_spec(model.cfg)          # the model spec a run directory records, e.g. llama-71m(layers=2,...)

``transformers`` is imported inside the functions that build its objects; the state-dict maps need only torch.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from ..connections import parse_spec
from ..models.gpt import GPT, STD, GPTConfig
from ..models.presets import format_model_spec, model_config

CLASSES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}  # model_type -> its causal-LM class
CONNECTIONS = {"PreLN": "gpt2", "PreRMS": "llama"}  # the connection each class is
SHAPES = {"gpt2": dict(positions="learned", mlp="gelu", bias=True),  # the fields each class fixes
          "llama": dict(positions="rope", mlp="swiglu")}
PRESET = {"gpt2": "gpt2-small", "llama": "llama-71m"}  # the preset a model spec starts from
GELU_TANH = ("gelu_new", "gelu_pytorch_tanh")  # HF's names of GELU's tanh approximation
# buffers some checkpoints hold that are not weights (GPT-2's causal mask, LLaMA's rotary frequencies)
NOT_WEIGHTS = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise ImportError("Hugging Face models need the transformers package: pip install skiplab[hf]") from None
    return transformers


def architecture(cfg: GPTConfig) -> str:
    """The Hugging Face ``model_type`` (gpt2, llama) a skiplab config is, or a one-line ValueError why none."""
    spec = parse_spec(cfg.connection)
    kind = CONNECTIONS.get(spec.name)
    if kind is None or spec != parse_spec(spec.name):
        raise ValueError(f"connection {cfg.connection!r} has no Hugging Face counterpart: GPT2LMHeadModel is "
                         "plain PreLN and LlamaForCausalLM plain PreRMS (no options, no designs across layers)")
    if cfg.mup_base_width:
        raise ValueError(f"mup_base_width={cfg.mup_base_width}: width muP's logits h/m_d and attention q.k/d_head have "
                         f"no {CLASSES[kind]} counterpart")
    wrong = [f"{k}={_text(getattr(cfg, k))}" for k, v in SHAPES[kind].items() if getattr(cfg, k) != v]
    if wrong:
        need = ", ".join(f"{k}={_text(v)}" for k, v in SHAPES[kind].items())
        raise ValueError(f"{spec.name} maps to {CLASSES[kind]}, which needs {need}; this model has {', '.join(wrong)} "
                         f"(a model to export is trained with them: --model '{PRESET[kind]}', or the options "
                         f"{', '.join(f'--{k} {_text(v)}' for k, v in SHAPES[kind].items())})")
    if cfg.qk_norm != "none":
        raise ValueError(f"qk_norm={cfg.qk_norm} has no Hugging Face counterpart here: {CLASSES[kind]} normalises no "
                         "queries or keys")
    return kind


# -- configs ------------------------------------------------------------------------------------------
def config_to_hf(cfg: GPTConfig, **extra: Any) -> Any:
    """The ``GPT2Config`` or ``LlamaConfig`` of a skiplab config (table in the module docstring). ``extra``: more
    config fields that leave the model as it is (token ids: ``bos_token_id``, ``eos_token_id``, ``pad_token_id``,
    None unless given, since they are the tokenizer's); one that changes the model is a ValueError."""
    kind = architecture(cfg)
    t = _transformers()
    ids = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if kind == "gpt2":
        config = t.GPT2Config(**{**dict(
            vocab_size=cfg.vocab_size, n_positions=cfg.context, n_embd=cfg.d_model, n_layer=cfg.layers,
            n_head=cfg.heads, n_inner=cfg.ffn_dim, activation_function="gelu_new", resid_pdrop=cfg.dropout,
            embd_pdrop=cfg.dropout, attn_pdrop=cfg.dropout, layer_norm_epsilon=cfg.norm_eps,
            initializer_range=STD,
            tie_word_embeddings=cfg.tie, **ids), **extra}, architectures=[CLASSES[kind]])
    else:
        config = t.LlamaConfig(**{**dict(
            vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.ffn_dim,
            num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, num_key_value_heads=cfg.heads,
            head_dim=cfg.d_model // cfg.heads, hidden_act="silu", max_position_embeddings=cfg.context,
            rms_norm_eps=cfg.norm_eps, initializer_range=STD, tie_word_embeddings=cfg.tie,
            rope_theta=cfg.rope_base, attention_bias=cfg.bias, mlp_bias=cfg.bias, attention_dropout=0.0,
            **ids), **extra}, architectures=[CLASSES[kind]])
    back = config_from_hf(config)
    kept = ("init", "norm", "pad_vocab") + (("dropout",) if kind == "llama" else ())  # not the config's to hold
    changed = [f.name for f in dataclasses.fields(cfg)
               if f.name not in kept and getattr(back, f.name) != getattr(cfg, f.name)]
    if kind == "llama" and cfg.dropout:
        warnings.warn(f"dropout {cfg.dropout} (a training setting) is not carried: LlamaConfig's attention_dropout "
                      "drops attention probabilities only, skiplab's dropout embeddings and sub-layer outputs too; "
                      "written as 0", stacklevel=2)
    if changed:
        raise ValueError(f"config_to_hf: {', '.join(sorted(extra))} would change the model's {', '.join(changed)}")
    return config


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def config_from_hf(config: Any) -> GPTConfig:
    """The skiplab config of a ``GPT2Config`` or ``LlamaConfig`` (table in the module docstring); what skiplab
    cannot express is a one-line ValueError naming it."""
    kind = getattr(config, "model_type", None)
    _require(kind in CLASSES, f"unsupported architecture {kind!r}: skiplab maps "
             + ", ".join(f"{k} ({c})" for k, c in CLASSES.items()))
    return _gpt2_config(config) if kind == "gpt2" else _llama_config(config)


def _gpt2_config(c: Any) -> GPTConfig:
    _require(c.activation_function in GELU_TANH,
             f"activation_function={c.activation_function!r}: skiplab's gelu is the tanh approximation "
             f"({' or '.join(GELU_TANH)})")
    _require(c.scale_attn_weights and not c.scale_attn_by_inverse_layer_idx,
             "GPT-2 attention must be scaled by 1/sqrt(head width) alone (scale_attn_weights=True, "
             "scale_attn_by_inverse_layer_idx=False)")
    _require(not c.add_cross_attention, "add_cross_attention: skiplab's GPT has no cross-attention")
    drops = (c.resid_pdrop, c.embd_pdrop, c.attn_pdrop)
    _require(len(set(drops)) == 1, f"resid_pdrop, embd_pdrop, attn_pdrop = {drops}: skiplab's GPT has one dropout")
    return GPTConfig(vocab_size=c.vocab_size, d_model=c.n_embd, heads=c.n_head, layers=c.n_layer,
                     ffn_dim=c.n_inner or 4 * c.n_embd, mlp="gelu", positions="learned", context=c.n_positions,
                     dropout=float(drops[0]), bias=True, tie=bool(c.tie_word_embeddings), init="gpt2",
                     connection="PreLN", norm_eps=float(c.layer_norm_epsilon))


def _rope(c: Any) -> dict[str, Any]:
    """The rotary settings: transformers 5 keeps base and scaling in ``rope_parameters``, 4.x in ``rope_theta``
    and ``rope_scaling``."""
    rope = getattr(c, "rope_parameters", None)
    if rope:
        return dict(rope)
    return {"rope_type": "default", "rope_theta": getattr(c, "rope_theta", 10000.0),
            **(getattr(c, "rope_scaling", None) or {})}


def _llama_config(c: Any) -> GPTConfig:
    _require(c.hidden_act == "silu", f"hidden_act={c.hidden_act!r}: skiplab's swiglu gates with silu")
    _require(c.num_key_value_heads == c.num_attention_heads,
             f"grouped-query attention (num_key_value_heads={c.num_key_value_heads}, num_attention_heads="
             f"{c.num_attention_heads}): skiplab's attention has a key and value head per query head")
    _require(getattr(c, "head_dim", None) in (None, c.hidden_size // c.num_attention_heads),
             f"head_dim={c.head_dim}: skiplab's heads are hidden_size/num_attention_heads wide")
    rope = _rope(c)
    plain = rope.get("rope_type", "default") == "default" and rope.get("partial_rotary_factor", 1.0) == 1.0
    _require(plain and set(rope) <= {"rope_type", "rope_theta", "partial_rotary_factor"},
             f"rope_parameters={rope}: skiplab's rotary has a base alone (rope_type default, no scaling)")
    _require(c.attention_bias == c.mlp_bias, f"attention_bias={c.attention_bias}, mlp_bias={c.mlp_bias}: "
             "skiplab's bias is one switch for every linear layer")
    _require(not c.attention_dropout, f"attention_dropout={c.attention_dropout}: skiplab's dropout would drop the "
             "embeddings and every sub-layer's output too (LLaMA drops attention probabilities only); set it to 0 in "
             "config.json to import (evaluation and generation use no dropout)")
    return GPTConfig(vocab_size=c.vocab_size, d_model=c.hidden_size, heads=c.num_attention_heads,
                     layers=c.num_hidden_layers, ffn_dim=c.intermediate_size, mlp="swiglu", positions="rope",
                     context=c.max_position_embeddings, dropout=0.0,
                     bias=bool(c.attention_bias), tie=bool(c.tie_word_embeddings), init="default",
                     rope_base=float(rope["rope_theta"]), connection="PreRMS", norm="RMS",
                     norm_eps=float(c.rms_norm_eps))


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else repr(value) if isinstance(value, float) else str(value)


def model_spec(cfg: GPTConfig) -> str:
    """The model spec of a config Hugging Face can hold: ``gpt2-small`` or ``llama-71m`` with the fields that
    differ as options, so that ``model_config(model_spec(cfg)) == cfg``."""
    preset = PRESET[architecture(cfg)]
    base = model_config(preset)
    options = {f.name: _text(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)
               if getattr(cfg, f.name) != getattr(base, f.name)}
    spec = format_model_spec(preset, options)
    _require(model_config(spec) == cfg, f"model_spec: {spec!r} does not give the config back")
    return spec


# -- weights ------------------------------------------------------------------------------------------
class Entry(NamedTuple):
    """One skiplab tensor and the Hugging Face tensors it is: several are its row blocks, in order; a
    ``transpose``d one is GPT-2's Conv1D weight, (in, out)."""

    ours: str
    theirs: tuple[str, ...]
    transpose: bool = False


def weight_map(cfg: GPTConfig) -> list[Entry]:
    """Every weight of a skiplab model of ``cfg`` and its Hugging Face name(s) (module docstring)."""
    kind = architecture(cfg)
    out: list[Entry] = []
    if kind == "gpt2":
        out += [Entry("embed.weight", ("transformer.wte.weight",)),
                Entry("pos_embed.weight", ("transformer.wpe.weight",))]
        for i in range(cfg.layers):
            a, h = f"layers.{i}.", f"transformer.h.{i}."
            for ours, theirs in (("conn_attn.norm", "ln_1"), ("conn_mlp.norm", "ln_2")):
                out += [Entry(f"{a}{ours}.{p}", (f"{h}{theirs}.{p}",)) for p in ("weight", "bias")]
            for ours, theirs in (("attn.qkv_proj", "attn.c_attn"), ("attn.out_proj", "attn.c_proj"),
                                 ("mlp.up", "mlp.c_fc"), ("mlp.down", "mlp.c_proj")):
                out += [Entry(f"{a}{ours}.weight", (f"{h}{theirs}.weight",), transpose=True),
                        Entry(f"{a}{ours}.bias", (f"{h}{theirs}.bias",))]
        out += [Entry(f"norm.{p}", (f"transformer.ln_f.{p}",)) for p in ("weight", "bias")]
    else:
        out.append(Entry("embed.weight", ("model.embed_tokens.weight",)))
        for i in range(cfg.layers):
            a, h = f"layers.{i}.", f"model.layers.{i}."
            out += [Entry(f"{a}conn_attn.norm.weight", (f"{h}input_layernorm.weight",)),
                    Entry(f"{a}conn_mlp.norm.weight", (f"{h}post_attention_layernorm.weight",))]
            for ours, theirs in (("attn.qkv_proj", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
                                 ("attn.out_proj", ("self_attn.o_proj",)),
                                 ("mlp.up", ("mlp.gate_proj", "mlp.up_proj")), ("mlp.down", ("mlp.down_proj",))):
                for p in ("weight", "bias") if cfg.bias else ("weight",):
                    out.append(Entry(f"{a}{ours}.{p}", tuple(f"{h}{t}.{p}" for t in theirs)))
        out.append(Entry("norm.weight", ("model.norm.weight",)))
    if not cfg.tie:
        out.append(Entry("head.weight", ("lm_head.weight",)))
    return out


def _check_keys(given: set[str], expected: set[str], what: str) -> None:
    missing, extra = sorted(expected - given), sorted(given - expected)
    _require(not missing and not extra, f"{what} does not fit the model: "
             + "; ".join(f"{n} {', '.join(keys[:4])}{' ...' if len(keys) > 4 else ''}"
                         for n, keys in (("missing", missing), ("unexpected", extra)) if keys))


def state_dict_to_hf(cfg: GPTConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """A skiplab ``GPT`` state dict as the Hugging Face model of ``cfg`` names it. No two tensors share memory
    (split blocks and transposes are copies), so the dict can be written with ``safetensors.torch.save_file``;
    a tied output projection is left out, as ``save_pretrained`` does."""
    entries = weight_map(cfg)
    _check_keys(set(state), {e.ours for e in entries}, "the skiplab state dict")
    out: dict[str, Tensor] = {}
    for e in entries:
        t = state[e.ours].detach()
        if e.ours in ("embed.weight", "head.weight"):  # a padded vocabulary's rows cut off (``pad_vocab``)
            t = t[: cfg.vocab_size].clone() if cfg.pad_vocab else t
        if e.transpose:  # (out, in) -> Conv1D's (in, out), a copy
            out[e.theirs[0]] = t.t().contiguous()
        elif len(e.theirs) > 1:  # row blocks, each a copy of its own
            out.update({name: p.clone() for name, p in zip(e.theirs, t.chunk(len(e.theirs), dim=0))})
        else:
            out[e.theirs[0]] = t
    return out


def _as_causal_lm(kind: str, state: dict[str, Tensor], tie: bool) -> dict[str, Tensor]:
    """Drop non-weight buffers and a tied head; keys of the bare base model get the causal LM's prefix."""
    prefix, probe = ("transformer.", "wte.weight") if kind == "gpt2" else ("model.", "embed_tokens.weight")
    bare = probe in state and prefix + probe not in state
    out = {}
    for name, t in state.items():
        if name.endswith(NOT_WEIGHTS) or (tie and name == "lm_head.weight"):
            continue
        out[prefix + name if bare and not name.startswith("lm_head.") else name] = t
    return out


def state_dict_from_hf(config: Any, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """A Hugging Face state dict (``GPT2LMHeadModel``/``LlamaForCausalLM``, or their bare base models) as the
    skiplab ``GPT`` of :func:`config_from_hf` names it."""
    cfg = config_from_hf(config)
    kind = architecture(cfg)
    state = _as_causal_lm(kind, state, cfg.tie)
    entries = weight_map(cfg)
    _require(cfg.tie or "lm_head.weight" in state or not any(n.startswith(("model.", "transformer.")) for n in state),
             f"the {CLASSES[kind]} state dict has no output layer (lm_head.weight), and its config unties it from the "
             "embedding (tie_word_embeddings false): a base model without its language-model head; give the causal "
             "LM's weights")
    _check_keys(set(state), {n for e in entries for n in e.theirs}, f"the {CLASSES[kind]} state dict")
    out: dict[str, Tensor] = {}
    for e in entries:
        parts = [state[n].detach() for n in e.theirs]
        t = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
        out[e.ours] = t.t().contiguous() if e.transpose else t
    return out


# -- models -------------------------------------------------------------------------------------------
def to_hf(model: nn.Module, **extra: Any) -> tuple[Any, dict[str, Tensor]]:
    """A skiplab ``GPT``'s Hugging Face config and state dict (:func:`config_to_hf`, :func:`state_dict_to_hf`)."""
    _require(isinstance(model, GPT), f"Hugging Face export takes skiplab's GPT family, not {type(model).__name__}")
    return config_to_hf(model.cfg, **extra), state_dict_to_hf(model.cfg, model.state_dict())


def hf_model(model: nn.Module, **extra: Any) -> Any:
    """The ``GPT2LMHeadModel`` or ``LlamaForCausalLM`` holding a skiplab ``GPT``'s weights, on its device and
    in its dtype, in eval mode; ``hf_model(model).save_pretrained(folder)`` writes a hub folder."""
    config, state = to_hf(model, **extra)
    hf = getattr(_transformers(), CLASSES[config.model_type])(config)
    missing, unexpected = hf.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if model.cfg.tie else set()  # the embedding, loaded under its own name
    _require(set(missing) <= tied and not unexpected,
             f"{CLASSES[config.model_type]} did not take the weights (missing {missing}, unexpected {unexpected})")
    ref = model.embed.weight
    return hf.to(device=ref.device, dtype=ref.dtype).eval()


def from_hf(source: Any, state_dict: dict[str, Tensor] | None = None) -> GPT:
    """The skiplab ``GPT`` of a Hugging Face causal LM: ``from_hf(hf_model)`` or ``from_hf(config, state_dict)``
    (e.g. a folder's ``AutoConfig`` and its safetensors), on the weights' device and dtype, in eval mode."""
    if state_dict is None:
        config = getattr(source, "config", None)
        kind = getattr(config, "model_type", None)
        _require(kind in CLASSES and type(source).__name__ == CLASSES[kind],
                 f"from_hf takes {' or '.join(CLASSES.values())} (or a config and a state dict), not "
                 f"{type(source).__name__}" + (f" of model_type {kind!r}" if kind else ""))
        state_dict = source.state_dict()
    else:
        config = source
    weights = state_dict_from_hf(config, state_dict)
    model = GPT(config_from_hf(config))
    try:
        model.load_state_dict(weights)
    except RuntimeError as err:  # a shape that does not fit the config
        raise ValueError(f"the weights do not fit the config: {str(err).strip().splitlines()[-1].strip()}") from None
    ref = weights["embed.weight"]
    return model.to(device=ref.device, dtype=ref.dtype).eval()
