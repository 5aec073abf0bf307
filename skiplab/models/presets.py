"""Named presets of every model family, and the model spec that picks one: ``name(field=value, ...)``.

A model spec is a preset name with optional field overrides in the connection grammar's form:
``transformer-small``, ``transformer-small(connection=2rSkip+LN)``, ``dwlstm-small(share=all,
encoder_layers=12)``. Values are parsed by the field's type; a field the preset's family does not have is
an error that lists the ones it has. A spec resolves, once, to the family's frozen config dataclass.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import typing
from typing import Any

from torch import nn

from .. import run_dir
from ..config import parse_list, parser_for, show_value
from ..connections import REGISTRY, SpecError, parse_spec
from .dwlstm import DepthWiseLSTMConfig, DepthWiseLSTMTransformer
from .gpt import GPT, GPTConfig
from .preact_resnet import PreActResNet, PreActResNetConfig
from .seq2seq import Seq2SeqConfig
from .transformer import Transformer, TransformerConfig
from .captioner import Captioner, CaptionerConfig

# config class -> the model it builds
FAMILIES: dict[type, type[nn.Module]] = {
    PreActResNetConfig: PreActResNet,
    TransformerConfig: Transformer,
    DepthWiseLSTMConfig: DepthWiseLSTMTransformer,
    GPTConfig: GPT,
    CaptionerConfig: Captioner,
}

_BASE = dict(d_model=512, ffn_dim=2048, heads=8, encoder_layers=6, decoder_layers=6, dropout=0.1, attention_dropout=0.1)
_BIG = dict(d_model=1024, ffn_dim=4096, heads=16, encoder_layers=6, decoder_layers=6, dropout=0.3, attention_dropout=0.1)
_SMALL = dict(d_model=256, ffn_dim=1024, heads=4, encoder_layers=3, decoder_layers=3, dropout=0.1, attention_dropout=0.1)

# name -> (config class, the fields the preset sets)
PRESETS: dict[str, tuple[type, dict[str, Any]]] = {
    **{f"preact-resnet{d}": (PreActResNetConfig, {"depth": d}) for d in (20, 32, 44, 56, 110)},
    # Vaswani et al. 2017, Table 3: base and big
    "transformer-base": (TransformerConfig, _BASE),
    "transformer-big": (TransformerConfig, _BIG),
    # the usual IWSLT shape (fairseq's transformer_iwslt_de_en), for the EN-VI experiments
    "transformer-iwslt": (TransformerConfig, dict(_BASE, ffn_dim=1024, heads=4, dropout=0.3)),
    # small enough to train on a CPU
    "transformer-small": (TransformerConfig, _SMALL),
    # the depth-wise LSTM paper's Base and Big widths (Section 5.1), and transformer-small's shape
    "dwlstm-base": (DepthWiseLSTMConfig, _BASE),
    "dwlstm-big": (DepthWiseLSTMConfig, _BIG),
    "dwlstm-small": (DepthWiseLSTMConfig, _SMALL),
    # decoder-only language models, small enough for a CPU
    "gpt-mini": (GPTConfig, dict(d_model=128, heads=4, layers=4, ffn_dim=512, context=256)),
    "gpt-small": (GPTConfig, dict(d_model=256, heads=4, layers=6, ffn_dim=1024, context=256)),
    # GPT-2 124M (Radford et al. 2019; openai/gpt-2 src/model.py: n_embd 768, n_head 12, n_layer 12,
    # n_ctx 1024, vocabulary 50257, learned positions, biases, tied output; no dropout in OpenAI's code)
    "gpt2-small": (GPTConfig, dict(vocab_size=50257, d_model=768, heads=12, layers=12, ffn_dim=3072, mlp="gelu",
                                   positions="learned", context=1024, bias=True, tie=True, init="gpt2")),
    # LLaMA-71M and LLaMA-130M as the Mix-LN (Li et al., ICLR 2025) and curse-of-depth (Sun et al. 2025)
    # papers train them: their configs/llama_71m.json and llama_130m.json (from GaLore): hidden 512 / 768,
    # intermediate 1368 / 2048, 8 / 12 heads, 12 layers, RMSNorm, rotary positions, SwiGLU, no biases, an
    # untied output layer, vocabulary 32000 (the T5 tokenizer); trained on sequences of 256 tokens. norm=RMS: a
    # connection whose spec names no norm (MixLN, LNS, DeepNorm, ...) builds RMSNorm, as in the papers' code
    "llama-71m": (GPTConfig, dict(vocab_size=32000, d_model=512, heads=8, layers=12, ffn_dim=1368, mlp="swiglu",
                                  positions="rope", context=256, bias=False, tie=False, connection="PreRMS",
                                  norm="RMS")),
    "llama-130m": (GPTConfig, dict(vocab_size=32000, d_model=768, heads=12, layers=12, ffn_dim=2048, mlp="swiglu",
                                   positions="rope", context=256, bias=False, tie=False, connection="PreRMS",
                                   norm="RMS")),
    # the larger ones of the same papers, from the same code's configs/llama_250m.json, llama_350m.json and
    # llama_1b.json: hidden 768 / 1024 / 2048, intermediate 2560 / 2736 / 5461, 16 / 16 / 32 heads, 24 layers.
    # (Mix-LN's Table 7 prints hidden 1024 for 250M; its code's 768 is the shape with 250M parameters.)
    **{name: (GPTConfig, dict(vocab_size=32000, d_model=d, heads=h, layers=24, ffn_dim=ffn, mlp="swiglu",
                              positions="rope", context=256, bias=False, tie=False, connection="PreRMS", norm="RMS"))
       for name, d, ffn, h in (("llama-250m", 768, 2560, 16), ("llama-350m", 1024, 2736, 16),
                               ("llama-1b", 2048, 5461, 32))},
    # OLMo-1B (Groeneveld et al. 2024), the hyper-connections paper's dense baseline (Zhu et al., ICLR 2025,
    # Section 4): OLMo's configs/official/OLMo-1B.yaml, d_model 2048, 16 heads, 16 layers, mlp_ratio 8 (SwiGLU:
    # 16,384 outputs, two halves of 8,192), rope, no biases, weight tying, sequences of 2,048, embedding_size
    # 50,304 (the GPT-NeoX tokenizer's 50,280 ids padded); its LayerNorm has no gain or bias (skiplab's PreLN has);
    # norm=LN, so the hyper-connections paper's designs (HC, mHC) build LayerNorm on it
    # Transformer captioners (skiplab.models.captioner). The SAS paper (Section 4.3) gives no configuration for its
    # MSCOCO model: captioner-base is the usual COCO captioner, Base width with 3 layers a side over precomputed
    # region features (2048-d, bottom-up attention's), as the M² Transformer and many COCO captioners build it;
    # captioner-small reads the pixels of fashion-mnist-scenes (64 x 64 grey) through a PreAct trunk, CPU-sized
    "captioner-base": (CaptionerConfig, dict(_BASE, encoder_layers=3, decoder_layers=3, input="features",
                                             feature_dim=2048)),
    "captioner-small": (CaptionerConfig, dict(d_model=128, ffn_dim=512, heads=4, encoder_layers=2, decoder_layers=2,
                                              dropout=0.1, attention_dropout=0.1, input="pixels", channels=1,
                                              image_size=64, trunk_width=16, trunk_blocks=1)),
    "olmo-1b": (GPTConfig, dict(vocab_size=50304, d_model=2048, heads=16, layers=16, ffn_dim=8192, mlp="swiglu",
                                positions="rope", context=2048, bias=False, tie=True, connection="PreLN", norm="LN")),
}


def parse_model_spec(spec: str) -> tuple[str, dict[str, str]]:
    """``"dwlstm-small(share=all, merge=concat)"`` -> ``("dwlstm-small", {"share": "all", "merge": "concat"})``."""
    text = spec.strip()
    name, _, rest = text.partition("(")
    name = name.strip()
    options: dict[str, str] = {}
    if rest:
        if not rest.endswith(")"):
            raise ValueError(f"bad model spec {spec!r}: options go in one pair of parentheses, name(key=value, ...)")
        for item in parse_list(rest[:-1]):
            key, eq, value = item.partition("=")
            if not eq or not key.strip() or not value.strip():
                raise ValueError(f"bad model spec {spec!r}: {item!r} is not key=value")
            key = key.strip().replace("-", "_")
            if key in options:
                raise ValueError(f"bad model spec {spec!r}: {key} given twice")
            options[key] = value.strip()
    if name not in PRESETS:
        hint = difflib.get_close_matches(name, list(PRESETS), n=1)
        raise ValueError(f"unknown model {name!r}" + (f" (did you mean {hint[0]!r}?)" if hint else "")
                         + f"; known: {', '.join(PRESETS)}")
    return name, options


def format_model_spec(name: str, options: dict[str, Any]) -> str:
    """The inverse of :func:`parse_model_spec`."""
    if not options:
        return name
    return f"{name}(" + ",".join(f"{k}={show_value(v)}" for k, v in options.items()) + ")"



def family_of(spec: str) -> type:
    """The config class of the preset a spec names."""
    return PRESETS[parse_model_spec(spec)[0]][0]


def options_of(cls: type) -> dict[str, dataclasses.Field]:
    """The fields of a family's config, by name."""
    return {f.name: f for f in dataclasses.fields(cls)}


def _convert(cls: type, name: str, key: str, value: Any) -> Any:
    if not isinstance(value, str):
        return value
    tp = typing.get_type_hints(cls)[key]
    try:
        return parser_for(tp)(value)
    except (KeyError, ValueError):
        raise ValueError(f"{name}: {key}={value!r} is not a valid {tp.__name__}") from None


def model_config(spec: str, **overrides: Any):
    """The config a model spec describes, with ``overrides`` (field=value) applied on top of its options. A field
    that neither sets takes, where the connection's design has a recipe for it (``Connection.recipe``; nGPT:
    SwiGLU, rotary positions, no biases, ...), the recipe's value rather than the preset's."""
    name, options = parse_model_spec(spec)
    cls, fields = PRESETS[name]
    known = options_of(cls)
    unknown = sorted((set(options) | set(overrides)) - set(known))
    if unknown:
        raise ValueError(f"{name} has no option {', '.join(unknown)} (its options: {', '.join(known)})")
    values = {k: _convert(cls, name, k, v) for k, v in {**options, **overrides}.items()}
    resolved = {**fields, **values}
    if "connection" in known:
        recipe = REGISTRY[parse_spec(resolved.get("connection", known["connection"].default)).name].recipe
        resolved.update({k: v for k, v in recipe.items() if k in known and k not in values})
    return cls(**resolved)


def with_options(spec: str, **options: Any) -> str:
    """``spec`` with more options; one it already sets to another value is an error naming both."""
    name, present = parse_model_spec(spec)
    for key, value in options.items():
        key = key.replace("-", "_")
        if key in present and present[key] != show_value(value):
            raise ValueError(f"{key} is set twice: {key}={present[key]} in {spec!r} and {key}={show_value(value)}")
        present[key] = show_value(value)
    model_config(format_model_spec(name, present))  # an option the family lacks fails here, naming it
    return format_model_spec(name, present)


def build_model(cfg) -> nn.Module:
    """The model a config describes."""
    return FAMILIES[type(cfg)](cfg)


def model_from_checkpoint(ckpt: dict[str, Any], path: Any) -> nn.Module:
    """The model a checkpoint holds (its spec and resolved config), weights loaded; a checkpoint whose
    weights do not fit the model it names is a one-line :class:`~skiplab.run_dir.RunDirError`."""
    try:
        stored = dict(ckpt["model_config"])
        for f in dataclasses.fields(family_of(ckpt["config"]["model"])):  # a field added after it was written:
            if "older_runs" in f.metadata:  # the value every model had before (GPT's norm: LN)
                stored.setdefault(f.name, f.metadata["older_runs"])
        model = build_model(model_config(ckpt["config"]["model"], **stored))
        model.load_state_dict(ckpt["model"])
    except (TypeError, KeyError, RuntimeError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if isinstance(err, SpecError) and "unknown name" in first:  # a design this process has not registered
            said = re.split(r" \(did you mean|\. Known:", first)[0]
            raise run_dir.RunDirError(f"{path}: the run's design is not known here ({said}); a design "
                                      "of your own is known once its module is imported (SKIPLAB_IMPORT=MODULE for "
                                      "the command line)") from None
        raise run_dir.RunDirError(f"{path}: checkpoint does not match the model it names ({first})") from None
    return model


def lm_families() -> list[type]:
    """The config classes of the language-model families."""
    return [GPTConfig]


def seq2seq_families() -> list[type]:
    """The config classes of the translation families (their fields are the MT command line's model options)."""
    return [cls for cls in FAMILIES if issubclass(cls, Seq2SeqConfig) and not issubclass(cls, CaptionerConfig)]


def caption_families() -> list[type]:
    """The config classes of the captioning families (their fields are the caption command line's model options)."""
    return [CaptionerConfig]
