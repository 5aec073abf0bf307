"""Models that take any connection, and their named presets (presets are data, overridable field by field)."""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn

from .preact_resnet import PreActBlock, PreActResNet, PreActResNetConfig

# name -> (config class, the fields the preset sets)
PRESETS: dict[str, tuple[type, dict[str, Any]]] = {
    f"preact-resnet{d}": (PreActResNetConfig, {"depth": d}) for d in (20, 32, 44, 56, 110)
}
_MODELS: dict[type, type[nn.Module]] = {PreActResNetConfig: PreActResNet}


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


__all__ = ["PRESETS", "PreActBlock", "PreActResNet", "PreActResNetConfig", "build_model", "model_config"]
