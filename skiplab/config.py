"""Typed, frozen dataclass configs and the command-line options derived from them.

Each field becomes ``--field-name``; its type (int, float, str, bool, or a tuple of those, written
comma-separated) and its ``help`` metadata give the option's parser and text; a float is a finite number. A
count's (or a float's) ``min`` metadata is its lower bound, checked once where options are parsed (:func:`count`,
:func:`at_least`) and again where the config is made (:func:`check_bounds`), so a zero or negative count is a
one-line error before anything is written.
Configs hold only strings and numbers, so they serialise to JSON beside every result.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import typing
from typing import Any, TypeVar

T = TypeVar("T")


BOOLEANS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


class BadValue(argparse.ArgumentTypeError, ValueError):
    """A value an option's type refuses: argparse prints its message as the option's one-line error; elsewhere
    (a model spec's options) it is a ValueError."""


def show_value(value: Any) -> str:
    """A field's value as a spec writes it: ``true``/``false``, ``1e-05``, ``swiglu`` (the inverse of its parser)."""
    return str(value).lower() if isinstance(value, bool) else f"{value:g}" if isinstance(value, float) else str(value)


def boolean(text: str) -> bool:
    """``true``, ``yes``, ``1`` or ``false``, ``no``, ``0`` (any case); anything else is a :class:`BadValue`."""
    try:
        return BOOLEANS[text.strip().lower()]
    except KeyError:
        raise BadValue(f"expected a boolean ({', '.join(BOOLEANS)}), got {text!r}") from None


def finite(text: str) -> float:
    """A float option: a finite number (``nan`` and ``inf`` are no learning rate, momentum or decay)."""
    try:
        value = float(text)
    except ValueError:
        raise BadValue(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise BadValue(f"expected a finite number, got {text!r}")
    return value


def _scalar_parser(tp: type):
    return boolean if tp is bool else finite if tp is float else tp


def parse_list(text: str) -> tuple[str, ...]:
    """``"a, b,c"`` -> ``("a", "b", "c")``. Commas inside parentheses stay: ``SAS(gate=single,gamma=free)``."""
    items, depth, cur = [], 0, ""
    for ch in text:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    return tuple(v.strip() for v in items + [cur] if v.strip())


def count(minimum: int = 1):
    """An argparse type: an integer >= ``minimum`` (a count: examples, steps, seeds, beam, ...)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value
    return parse


SEED_MAX = 2**63 - 1  # torch.manual_seed's largest


def seed_value(text: str) -> int:
    """An argparse type: a seed, an integer in [0, 2**63 - 1] (what ``torch.manual_seed`` takes, as a count)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 0 <= value <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"a seed is an integer in [0, 2**63 - 1], got {value}")
    return value


def at_least(minimum: float):
    """An argparse type: a finite number >= ``minimum`` (a length penalty's exponent, a temperature, ...)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not (math.isfinite(value) and value >= minimum):
            raise argparse.ArgumentTypeError(f"must be a finite number >= {minimum:g}, got {text}")
        return value
    return parse


def parse_float_list(text: str) -> tuple[float, ...]:
    """An argparse type: ``"1.25, 1.5"`` -> ``(1.25, 1.5)``; anything but finite numbers is refused."""
    try:
        values = tuple(float(t) for t in parse_list(text))
    except ValueError:
        values = ()
    if not values or not all(math.isfinite(v) for v in values):
        raise argparse.ArgumentTypeError(f"must be comma-separated numbers, got {text!r}")
    return values


def seed_list(text: str) -> tuple[int, ...]:
    """An argparse type: seeds, as ``N`` (1..N), ``A-B`` (A..B) or ``A,B,...`` (each >= 1, none twice)."""
    text = str(text).strip()
    if text.lstrip("+-").isdigit():  # N: seeds 1..N, a count like any other
        return tuple(range(1, count(1)(text) + 1))
    try:
        if "-" in text:
            low, _, high = text.partition("-")
            seeds = tuple(range(int(low), int(high) + 1))
        elif "," in text:
            seeds = tuple(int(t) for t in text.split(","))
        else:
            seeds = tuple(range(1, int(text) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N, A-B or A,B,... (seeds), got {text!r}") from None
    if not seeds or min(seeds) < 1 or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"seeds must be >= 1, none twice, at least one; got {text!r}")
    return seeds


def check_bounds(cfg: Any) -> None:
    """A ``ValueError`` naming the first field of ``cfg`` that is a float but not finite, or below its ``min``
    metadata."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"--{f.name.replace('_', '-')} must be a finite number, got {value}")
        low = f.metadata.get("min")
        if low is not None and getattr(cfg, f.name) < low:
            raise ValueError(f"--{f.name.replace('_', '-')} must be >= {low}, got {getattr(cfg, f.name)}")


def parser_for(tp: Any):
    if typing.get_origin(tp) is tuple:
        item = _scalar_parser(typing.get_args(tp)[0])
        return lambda s: tuple(item(v) for v in parse_list(s))
    return _scalar_parser(tp)


GIVEN = "given_options"  # the attribute of parsed arguments naming the fields given on the command line


class _Store(argparse.Action):
    """argparse's store action that also notes the field as given (:data:`GIVEN`), a value equal to its default
    included: ``--resume --max-steps 2000`` asks for 2000 updates whatever the default is."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        setattr(namespace, GIVEN, frozenset({*(getattr(namespace, GIVEN, None) or ()), self.dest}))


def given(args: argparse.Namespace, cls: type) -> set[str]:
    """The fields of ``cls`` given on the command line (:func:`add_arguments`' options note them); for arguments
    made another way (no note), the fields whose value differs from the field's default."""
    names = {f.name for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    noted = getattr(args, GIVEN, None)
    if noted is not None:
        return names & set(noted)
    return {f.name for f in dataclasses.fields(cls) if f.name in names and getattr(args, f.name) != f.default}


def add_arguments(parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = (),
                  defaults: dict[str, Any] | None = None) -> None:
    """Add one ``--option`` per field of the dataclass ``cls`` (but ``skip``), defaulting to the field's default or,
    where ``defaults`` names the field (a demo's sizes), to that value, which its help then shows; each notes itself
    as given when it is (:func:`given`)."""
    parser.set_defaults(**{GIVEN: frozenset()})
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        if defaults and f.name in defaults:
            default = defaults[f.name]
        else:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f.name,
            action=_Store,
            type=(seed_value if f.name.endswith("seed") and hints[f.name] is int
                  else parser_for(hints[f.name]) if "min" not in f.metadata
                  else at_least(f.metadata["min"]) if hints[f.name] is float else count(f.metadata["min"])),
            default=default,
            metavar=f.name.upper(),
            help=f"{f.metadata.get('help', '')} (default: {shown})",
        )


# folders and files a config names, made absolute: its run is read later from anywhere (eval, analyze, resume
# from another folder)
ABSOLUTE = ("data_dir", "train_file", "valid_file", "test_file", "train_prefix", "valid_prefix", "test_prefix")


def from_arguments(cls: type[T], args: argparse.Namespace) -> T:
    """The ``cls`` instance holding the parsed values of its fields; a relative :data:`ABSOLUTE` folder or file
    made absolute, so that a run's config names its data wherever the run is evaluated or analysed from."""
    return cls(**absolute({f.name: getattr(args, f.name) for f in dataclasses.fields(cls)}))


def absolute(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` (a config's fields, or some of them) with each relative :data:`ABSOLUTE` path made absolute."""
    values = dict(values)
    for name in ABSOLUTE:
        if isinstance(values.get(name), str) and values[name]:
            values[name] = os.path.abspath(os.path.expanduser(values[name]))
    return values


def to_json(cfg: Any) -> str:
    """The config as indented JSON (tuples become lists)."""
    return json.dumps(dataclasses.asdict(cfg), indent=2)
