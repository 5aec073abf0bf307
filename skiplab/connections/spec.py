"""The spec string: a connection named in the papers' own notation.

Grammar (case-sensitive)::

    spec    := design ("+" across ["(" option ("," option)* ")"])*
    design  := [number] name ["+" norm] ["(" option ("," option)* ")"]
    number  := a real such as 2, 0.5, 1e-1       -- λ of xSkip, the order k of rSkip
    name    := xSkip | rSkip | wSkip | SAS | Highway | PreLN | PreRMS | PreDyT | NoSkip | ReZero | SkipInit
             | LayerScale | MixLN | LNS | ...   -- the registry's names
    norm    := LN | BN | RMS | DyT
    option  := key "=" value                     -- e.g. f=2, init=1, gate=single, gamma=free
    across  := ValueRes | UNet | ...              -- designs across the layers of a stack (connections.across)

Aliases: ``Residual`` = ``1xSkip``, ``PostLN`` = ``1xSkip+LN``.

A norm written in the spec is the design's on every model (``MixLN+LN``); a design that takes a norm but whose
spec names none (``MixLN``, ``LNS``, ``SAS``, ``DeepNorm``, ...) takes the model's (the LLaMA presets' RMSNorm),
else its default, LN. :class:`Spec` remembers which (``norm_written``), and the canonical form keeps a written
norm, so ``MixLN+LN`` and ``MixLN`` stay two specs. ``LNS+RMS`` is ``PreRMS(scale=depth)`` (``LNS+LN``,
``LNS+DyT`` likewise).

A design whose norm is DyT (``PreDyT``, ``+DyT``) also takes ``alpha0``, DyT's initial α (:data:`DYT_OPTIONS`):
a number (0.5 unless given), or ``llm``, the DyT paper's LLM recipe by site and width
(:func:`~skiplab.connections.norms.dyt_llm_alpha0`): ``PreDyT(alpha0=llm)``, ``MixLN+DyT(alpha0=llm)``.

Examples: ``1xSkip``, ``2xSkip``, ``0.5xSkip+LN(f=2)``, ``2rSkip+LN``, ``3rSkip+BN``, ``wSkip+LN(init=2)``,
``SAS``, ``SAS(gate=single)``, ``SAS(gamma=free)``, ``SAS+BN``, ``Highway``, ``PreLN``, ``PreRMS``,
``ReZero``, ``LayerScale(init=1e-5)``, ``PreLN(scale=depth)``, ``PreLN(depth_alpha=1,depth_base=4)``, ``LNS``, ``MixLN+RMS(alpha=0.25)``,
``PreDyT(alpha0=llm)``, ``PreLN+ValueRes``, ``HC(n=4)+ValueRes(learn=yes)+UNet``.

Which numbers, norms and options a name accepts is declared by its class (``numbered``, ``accepts_norms``,
``default_norm``, ``options``); :func:`parse` checks a spec against that declaration and the registry turns it
into a module. :func:`format_spec` writes the canonical form: options at their defaults are left out, so
``wSkip+LN(init=1)`` is written ``wSkip+LN``; aliases are resolved; a written norm stays written.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

ALIASES = {"Residual": "1xSkip", "PostLN": "1xSkip+LN"}

_ACROSS_RE = re.compile(r"^(?P<rest>.+)\+(?P<name>[A-Za-z]+)(?P<options>\([^()]*\))?$")
_SPEC_RE = re.compile(
    r"^(?P<number>[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)?"
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
    """A parsed spec: ``number``, ``name``, ``norm`` (the one the design builds: written, else its default),
    ``norm_written`` (whether the spec names it; a model's norm replaces only an unwritten one), every option
    (defaults filled in) and the designs across the layers of the stack (``stack``: their specs, in the order
    written)."""

    name: str
    number: float | None = None
    norm: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    stack: tuple["Spec", ...] = ()
    norm_written: bool = False


class SpecError(ValueError):
    """A spec that names no known design; the message says why and lists the known names."""


def format_number(x: float) -> str:
    """``2.0 -> '2'``, ``0.5 -> '0.5'``: the shortest text that parses back to ``x``."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(float(x))


# A number as the grammar writes it: ASCII digits, a point, an exponent (float() alone would also read "1_0",
# full-width and other scripts' digits); inf and nan read as numbers, for the checks that refuse them to name them.
_NUMBER_RE = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[-+]?(?:inf|infinity|nan)",
                        re.IGNORECASE)


def number(text: str) -> float:
    """``text`` as a float, or a one-line error saying it is not a number (not Python's own wording)."""
    if not _NUMBER_RE.fullmatch(text):
        raise ValueError(f"must be a number, got {text}")
    return float(text)


def positive_float(text: str) -> float:
    value = number(text)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"must be a finite number > 0, got {text}")
    return value


def finite_float(text: str) -> float:
    value = number(text)
    if not math.isfinite(value):
        raise ValueError(f"must be finite, got {text}")
    return value


def unit_interval(text: str) -> float:
    """A number in [0, 1] (a share, a mixing weight)."""
    value = number(text)
    if not 0 <= value <= 1:
        raise ValueError(f"must be in [0, 1], got {text}")
    return value


def nonnegative_float(text: str) -> float:
    """A finite number >= 0 (an exponent such as the depth scaling's α)."""
    value = number(text)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"must be a finite number >= 0, got {text}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (a dilation, a period)."""
    if not re.fullmatch(r"\+?[0-9]+", text):
        raise ValueError(f"must be an integer >= 1, got {text}")
    value = int(text)
    if value < 1:
        raise ValueError(f"must be an integer >= 1, got {text}")
    return value


def choice(*values: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in values:
            raise ValueError(f"must be one of {', '.join(values)}, got {text!r}")
        return text

    return parse


def alpha0(text: str) -> float | str:
    """DyT's initial α: ``llm`` (the LLM recipe) or a finite number > 0."""
    return text if text == "llm" else positive_float(text)


# The options a DyT norm brings to every design that may build one (see the module docstring).
DYT_OPTIONS = {"alpha0": Option(0.5, alpha0, "DyT's initial α: a number > 0, or llm (the DyT paper's LLM recipe, "
                                             "by site and width)")}


def options_of(cls: type, dyt: bool) -> dict[str, Option]:
    """The options a spec of ``cls`` takes: the class's own, and DyT's where its norm is DyT (``dyt``)."""
    return {**cls.options, **DYT_OPTIONS} if dyt else cls.options


def _options(cls: type, name: str, text: str | None, fail: Callable[[str], SpecError],
             dyt: bool = False) -> dict[str, Any]:
    """``cls``'s options, defaults filled in, with those of ``text`` (``key=value,...``) parsed; DyT's options
    (:data:`DYT_OPTIONS`) where the design's norm is DyT (``dyt``)."""
    declared = options_of(cls, dyt)
    options = {key: opt.default for key, opt in declared.items()}
    given: set[str] = set()
    for item in text.split(",") if text else ():
        if not item:
            raise fail("an empty option between commas (options are key=value, separated by single commas)")
        key, eq, value = item.partition("=")
        if not eq or not key or not value:
            raise fail(f"option {item!r} is not key=value")
        if key in given:
            raise fail(f"option {key} is given twice")
        given.add(key)
        if key in DYT_OPTIONS and key not in declared:
            raise fail(f"{key} sets DyT's initial α and {name} builds no DyT here: write +DyT")
        if key not in declared:
            allowed = ", ".join(declared) or "none"
            raise fail(f"{name} has no option {key!r} (options: {allowed})")
        try:
            options[key] = declared[key].parse(value)
        except ValueError as err:
            raise fail(f"option {key}: {err}") from None
    return options


NORM_NAMES = ("LN", "BN", "RMS", "DyT")  # the grammar's norm


def _unknown_plus(word: str, across: dict[str, type]) -> str:
    """What a ``+word`` after a connection is not: a norm, or (where there are any) a design across the stack."""
    known = [*NORM_NAMES, *across]
    close = difflib.get_close_matches(word, known, n=1, cutoff=0.6)
    hint = {k.lower(): k for k in known}.get(word.lower()) or (close[0] if close else None)
    what = f"a normalisation ({', '.join(NORM_NAMES)})"
    what = f"neither {what} nor a design across the stack ({', '.join(across)})" if across else f"not {what}"
    return f"+{word} is {what}" + (f" (did you mean +{hint}? names are case-sensitive)" if hint else "")


def parse(text: str, registry: dict[str, type], known: str, across: dict[str, type] | None = None) -> Spec:
    """Parse ``text`` against the classes in ``registry`` (and ``across``, the designs that may follow the
    connection after a ``+``); raise :class:`SpecError` naming the problem."""

    def fail(problem: str, names: bool = False) -> SpecError:
        """The one-line error; the known names listed only where the name itself is the problem."""
        return SpecError(f"bad connection spec {text!r}: {problem}" + (f". Known: {known}" if names else ""))

    if not isinstance(text, str):
        raise SpecError(f"a connection spec must be a string, got {type(text).__name__}. Known: {known}")
    spec, stack = "".join(text.split()), []  # spaces, tabs and line breaks anywhere
    while (a := _ACROSS_RE.match(spec)) and a["name"] in (across or {}):  # peel "+ValueRes(...)" off the end
        if any(s.name == a["name"] for s in stack):
            raise fail(f"{a['name']} is given twice")
        options = _options(across[a["name"]], a["name"], (a["options"] or "()")[1:-1], fail)
        stack.insert(0, Spec(name=a["name"], options=options))
        spec = a["rest"]
    named = spec  # the connection as written, without the designs across the stack
    spec = ALIASES.get(spec, spec)
    if (a := _ACROSS_RE.match(spec)) and a["name"] not in NORM_NAMES and (c := _SPEC_RE.match(a["rest"])) \
            and (c["name"] in registry or c["name"] in ALIASES):  # "PreLN+Unet", "PreLN+ValueRes+Foo", "2xSkip+LM"
        raise fail(_unknown_plus(a["name"], across or {}))
    m = _SPEC_RE.match(spec)
    if m is None:
        raise fail("not of the form [number]name[+NORM][(key=value, ...)]", names=True)
    name, norm = m["name"], m["norm"]
    if name in ALIASES:  # an alias with something after it: "PostLN(f=2)", "Residual+LN"
        full = ALIASES[name]
        raise fail(f"{name} is short for {full} and takes no options or norm of its own: write the design in full "
                   f"(e.g. {full.split('+')[0]}+RMS, {full}(f=2))")
    if name not in registry:
        close = difflib.get_close_matches(name, list(registry) + list(ALIASES), n=1, cutoff=0.6)
        lower = {k.lower(): k for k in list(registry) + list(ALIASES)}
        hint = lower.get(name.lower()) or (close[0] if close else None)
        raise fail(f"unknown name {name!r}" + (f" (did you mean {hint!r}? names are case-sensitive)" if hint else ""),
                   names=True)
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
    written = norm is not None
    if norm is None:
        norm = cls.default_norm

    options = _options(cls, name, m["options"], fail, dyt=norm == "DyT")
    try:
        parsed = cls.canonical(Spec(name=name, number=number, norm=norm, options=options, stack=tuple(stack),
                                    norm_written=written))
    except SpecError as err:  # a design's own rule on its options, said as every spec error is: quoting the spec
        raise fail(str(err).removeprefix("bad connection spec: ")) from None
    for s in parsed.stack:  # designs across the stack that mean nothing together or with this connection
        if problem := across[s.name].conflict(parsed, named, registry, across):
            raise SpecError(f"bad connection spec {text!r}: {problem}")
    return parsed


def format_spec(spec: Spec, cls: type, across: dict[str, type] | None = None) -> str:
    """The canonical text of ``spec``: ``parse(format_spec(s)) == s``; default options left out; the designs
    across the stack (classes in ``across``) after it."""
    text = (format_number(spec.number) if spec.number is not None else "") + spec.name
    if spec.norm is not None and spec.norm_written:
        text += f"+{spec.norm}"
    text += _format_options(spec, cls)
    return text + "".join(f"+{s.name}{_format_options(s, (across or {})[s.name])}" for s in spec.stack)


def _format_options(spec: Spec, cls: type) -> str:
    opts = [
        f"{k}={format_number(v) if isinstance(v, float) else v}"
        for k, v in spec.options.items()
        if v != options_of(cls, dyt=spec.norm == "DyT")[k].default
    ]
    return f"({','.join(opts)})" if opts else ""
