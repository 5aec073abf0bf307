"""The spec string: a connection named in the papers' own notation.

Grammar (case-sensitive)::

    spec    := [number] name ["+" norm] ["(" option ("," option)* ")"]
    number  := a real such as 2, 0.5, 1e-1       -- λ of xSkip, the order k of rSkip
    name    := xSkip | rSkip | wSkip | SAS | Highway | PreLN | PreRMS | NoSkip | ReZero | SkipInit | LayerScale
             | MixLN
    norm    := LN | BN | RMS | DyT
    option  := key "=" value                     -- e.g. f=2, init=1, gate=single, gamma=free

Aliases: ``Residual`` = ``1xSkip``, ``PostLN`` = ``1xSkip+LN``, ``LNS`` = ``PreLN(scale=depth)``.

Examples: ``1xSkip``, ``2xSkip``, ``0.5xSkip+LN(f=2)``, ``2rSkip+LN``, ``3rSkip+BN``, ``wSkip+LN(init=2)``,
``SAS``, ``SAS(gate=single)``, ``SAS(gamma=free)``, ``SAS+BN``, ``Highway``, ``PreLN``, ``PreRMS``,
``ReZero``, ``LayerScale(init=1e-5)``, ``PreLN(scale=depth)``, ``MixLN+RMS(alpha=0.25)``.

Which numbers, norms and options a name accepts is declared by its class (``numbered``, ``accepts_norms``,
``options``); :func:`parse` checks a spec against that declaration and the registry turns it into a
module. :func:`format_spec` writes the canonical form: options at their defaults are left out, so
``wSkip+LN(init=1)`` is written ``wSkip+LN``; aliases are resolved.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

ALIASES = {"Residual": "1xSkip", "PostLN": "1xSkip+LN", "LNS": "PreLN(scale=depth)"}

_SPEC_RE = re.compile(
    r"^(?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)?"
    r"(?P<name>[A-Za-z]+)"
    r"(?:\+(?P<norm>[A-Za-z]+))?"
    r"(?:\((?P<options>[^()]*)\))?$"
)


@dataclass(frozen=True)
class Option:
    """One ``key=value`` option a connection accepts."""

    default: Any
    parse: Callable[[str], Any]
    doc: str


@dataclass(frozen=True)
class Spec:
    """A parsed spec: ``number``, ``name``, ``norm`` and every option (defaults filled in)."""

    name: str
    number: float | None = None
    norm: str | None = None
    options: dict[str, Any] = field(default_factory=dict)


class SpecError(ValueError):
    """A spec that names no known design; the message says why and lists the known names."""


def format_number(x: float) -> str:
    """``2.0 -> '2'``, ``0.5 -> '0.5'``: the shortest text that parses back to ``x``."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(float(x))


def positive_float(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"must be a finite number > 0, got {text}")
    return value


def finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"must be finite, got {text}")
    return value


def choice(*values: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in values:
            raise ValueError(f"must be one of {', '.join(values)}, got {text!r}")
        return text

    return parse


def parse(text: str, registry: dict[str, type], known: str) -> Spec:
    """Parse ``text`` against the classes in ``registry``; raise :class:`SpecError` naming the problem."""

    def fail(problem: str) -> SpecError:
        return SpecError(f"bad connection spec {text!r}: {problem}. Known: {known}")

    if not isinstance(text, str):
        raise SpecError(f"a connection spec must be a string, got {type(text).__name__}. Known: {known}")
    spec = ALIASES.get(text.strip(), text.strip())
    m = _SPEC_RE.match(spec.replace(" ", ""))
    if m is None:
        raise fail("not of the form [number]name[+NORM][(key=value, ...)]")
    name, norm = m["name"], m["norm"]
    if name not in registry:
        close = difflib.get_close_matches(name, list(registry) + list(ALIASES), n=1, cutoff=0.6)
        lower = {k.lower(): k for k in list(registry) + list(ALIASES)}
        hint = lower.get(name.lower()) or (close[0] if close else None)
        raise fail(f"unknown name {name!r}" + (f" (did you mean {hint!r}? names are case-sensitive)" if hint else ""))
    cls = registry[name]

    number = None
    if m["number"] is not None:
        if not cls.numbered:
            raise fail(f"{name} takes no leading number")
        try:
            number = cls.check_number(float(m["number"]))
        except ValueError as err:
            raise fail(str(err)) from None
    elif cls.numbered:
        raise fail(f"{name} needs its leading number, e.g. 2{name}" + (f"+{cls.accepts_norms[0]}" if cls.norm_required else ""))

    if norm is not None and norm not in cls.accepts_norms:
        allowed = ", ".join(f"+{n}" for n in cls.accepts_norms) or "none"
        raise fail(f"{name} takes no normalisation +{norm} (allowed: {allowed})")
    if norm is None and cls.norm_required:
        raise fail(f"{name} needs a normalisation: " + " or ".join(f"+{n}" for n in cls.accepts_norms))
    if norm is None:
        norm = cls.default_norm

    options = {key: opt.default for key, opt in cls.options.items()}
    for item in filter(None, (m["options"] or "").split(",")):
        key, eq, value = item.partition("=")
        if not eq or not key or not value:
            raise fail(f"option {item!r} is not key=value")
        if key not in cls.options:
            allowed = ", ".join(cls.options) or "none"
            raise fail(f"{name} has no option {key!r} (options: {allowed})")
        try:
            options[key] = cls.options[key].parse(value)
        except ValueError as err:
            raise fail(f"option {key}: {err}") from None
    return Spec(name=name, number=number, norm=norm, options=options)


def format_spec(spec: Spec, cls: type) -> str:
    """The canonical text of ``spec``: ``parse(format_spec(s)) == s``; default options left out."""
    text = (format_number(spec.number) if spec.number is not None else "") + spec.name
    if spec.norm is not None and spec.norm != cls.default_norm:
        text += f"+{spec.norm}"
    opts = [
        f"{k}={format_number(v) if isinstance(v, float) else v}"
        for k, v in spec.options.items()
        if v != cls.options[k].default
    ]
    return text + (f"({','.join(opts)})" if opts else "")
