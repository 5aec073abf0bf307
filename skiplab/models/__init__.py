"""Models that take any connection, and their named presets (presets are data, overridable field by field)."""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn

from .preact_resnet import PreActBlock, PreActResNet, PreActResNetConfig
from .transformer import Transformer, TransformerConfig

# name -> (config class, the fields the preset sets)
PRESETS: dict[str, tuple[type, dict[str, Any]]] = {
    **{f"preact-resnet{d}": (PreActResNetConfig, {"depth": d}) for d in (20, 32, 44, 56, 110)},
    # Vaswani et al. 2017, Table 3: base and big
    "transformer-base": (TransformerConfig, dict(d_model=512, ffn_dim=2048, heads=8, encoder_layers=6,
                                                 decoder_layers=6, dropout=0.1, attention_dropout=0.1)),
    "transformer-big": (TransformerConfig, dict(d_model=1024, ffn_dim=4096, heads=16, encoder_layers=6,
                                                decoder_layers=6, dropout=0.3, attention_dropout=0.1)),
    # the usual IWSLT shape (fairseq's transformer_iwslt_de_en), for the EN-VI experiments
    "transformer-iwslt": (TransformerConfig, dict(d_model=512, ffn_dim=1024, heads=4, encoder_layers=6,
                                                  decoder_layers=6, dropout=0.3, attention_dropout=0.1)),
    # small enough to train on a CPU
    "transformer-small": (TransformerConfig, dict(d_model=256, ffn_dim=1024, heads=4, encoder_layers=3,
                                                  decoder_layers=3, dropout=0.1, attention_dropout=0.1)),
}
_MODELS: dict[type, type[nn.Module]] = {PreActResNetConfig: PreActResNet, TransformerConfig: Transformer}


def model_config(name: str, **overrides: Any):
    """The config of preset ``name`` with ``overrides`` applied (fields left as None are ignored)."""
    if name not in PRESETS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(PRESETS)}")
    cls, fields = PRESETS[name]
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(overrides) - known
    if unknown:
        raise ValueError(f"{name} has no field {', '.join(sorted(unknown))} (fields: {', '.join(sorted(known))})")
    return cls(**{**fields, **{k: v for k, v in overrides.items() if v is not None}})


def build_model(cfg) -> nn.Module:
    """The model a config describes."""
    return _MODELS[type(cfg)](cfg)


__all__ = ["PRESETS", "PreActBlock", "PreActResNet", "PreActResNetConfig", "Transformer", "TransformerConfig",
           "build_model", "model_config"]
