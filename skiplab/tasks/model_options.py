"""The model options of a task's families: every field of their configs but those the data decides, and which of
them a command line gave (each such option defaults to None). Apart from :mod:`.arguments`, which reads the task
registry, so that a task's own module can ask too."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any

from ..models import options_of

MODEL_OPTION_SKIP = ("vocab_size", "pad_id", "in_channels", "num_classes")


def family_options(families: list[type]) -> dict[str, tuple[dataclasses.Field, type, list[str]]]:
    """name -> (field, type, the families that have it), over the model families' configs ``families``."""
    options: dict[str, tuple[dataclasses.Field, type, list[str]]] = {}
    for cls in families:
        hints = typing.get_type_hints(cls)
        for name, f in options_of(cls).items():
            if name not in MODEL_OPTION_SKIP:
                options.setdefault(name, (f, hints[name], []))[2].append(cls.__name__.removesuffix("Config"))
    return options


def given_family_options(args: argparse.Namespace, families: list[type]) -> dict[str, Any]:
    """The model options of ``families`` given on the command line, by field name."""
    return {name: getattr(args, name) for name in family_options(families) if getattr(args, name, None) is not None}
