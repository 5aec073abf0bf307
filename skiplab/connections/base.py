"""The one interface every skip connection implements, and the registry that builds them by spec."""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable, ClassVar

from torch import Tensor, nn

from . import spec as _spec
from .norms import LAYOUTS, InputScale, dyt_alpha0, make_norm, set_dyt_alpha
from .place import Place

Branch = Callable[[Tensor], Tensor]

REGISTRY: dict[str, type["Connection"]] = {}
ACROSS: dict[str, type[nn.Module]] = {}  # designs across a stack's layers, written after the connection (.across)
MODEL_NORMS = ("LN", "RMS")  # the norm kinds a model may have (its config's ``norm``)


def _check_input(conn: "Connection", args: tuple, kwargs: dict) -> None:
    """The block input x (the first argument) has ``in_dim`` features where the layout keeps them: a wrong width is
    one line here, not a shape error from inside a gate's matmul or, in a design without weights, no error at all.
    With a ``skip`` (a projection shortcut) and no ``in_dim`` given, x is the branch's and the skip's to read, at
    whatever width they take, unless the connection reads x itself (:attr:`Connection.reads_input`: a norm before
    the branch), which needs ``in_dim``."""
    x = args[0] if args else kwargs.get("x")
    skip = args[2] if len(args) > 2 else kwargs.get("skip")
    if skip is not None and not callable(skip):
        raise TypeError(f"{conn.spec}: skip must be a callable (a module or function) mapping x to the skip path; "
                        f"it got {type(skip).__name__}")
    if skip is None and conn.in_dim != conn.dim and conn.has_skip:
        raise ValueError(f"{conn.spec} was built with in_dim {conn.in_dim} and dim {conn.dim}: a block that changes "
                         "the width needs a projection skip (conn(x, branch, skip=proj)) to carry x to dim features")
    if not isinstance(x, Tensor) or (skip is not None and not conn.in_dim_given and not conn.reads_input):
        return
    seq = conn.layout == "seq"
    if x.dim() < (1 if seq else 2) or x.shape[-1 if seq else 1] != conn.in_dim:
        where = "the last axis" if seq else "axis 1 of (N, C, ...)"
        hint = ("; with a projection skip that changes the width, give in_dim (the norm before the branch reads x)"
                if skip is not None and not conn.in_dim_given else "")
        raise ValueError(f"{conn.spec} was built for {conn.in_dim} features on {where} ({conn.layout} layout); "
                         f"it got an input of shape {tuple(x.shape)}{hint}")


def _check_branch(conn: "Connection", args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """The branch (the second argument) and the skip (the third, a projection shortcut) wrapped so that what each
    returns is checked against what it was given: a tensor of the input's leading axes (seq: every axis but the
    last; conv: the batch, and the spatial ones where no ``skip`` may change them; with a skip, the branch's and the
    skip's spatial axes alike) and ``dim`` features. A wrong shape is one line naming the design here, not a
    broadcast that goes on silently (a (2, 5, 1) output added to a (2, 5, 6) stream), a matmul's shapes, or a
    kernel reading past the end of the output (HC's stream write)."""
    given = len(args) > 1
    branch = args[1] if given else kwargs.get("branch")
    if branch is None and not given:
        return None
    if not callable(branch):
        raise TypeError(f"{conn.spec}: the branch must be a callable (a module or function) mapping x to F(x); "
                        f"it got {type(branch).__name__}")
    skip_given = len(args) > 2
    skip = args[2] if skip_given else kwargs.get("skip")
    first: dict[str, tuple[str, tuple[int, ...]]] = {}  # conv: the path that returned first, and its shape

    def check(what: str, out: Any, h: Any) -> None:
        if not isinstance(h, Tensor):
            return
        if not isinstance(out, Tensor):
            raise TypeError(f"{conn.spec}: the {what} returned {type(out).__name__}, not a tensor")
        seq = conn.layout == "seq"
        if seq:
            want = (*h.shape[:-1], conn.dim)
            ok = tuple(out.shape) == want
        else:
            want = (h.shape[0], conn.dim, *(h.shape[2:] if skip is None else ("...",)))
            ok = out.dim() == h.dim() and out.shape[:2] == want[:2] and (skip is not None
                                                                          or out.shape[2:] == h.shape[2:])
            if ok and skip is not None:  # a projection may change the spatial axes, alike on both paths
                other, shape = first.setdefault("path", (what, tuple(out.shape)))
                if other != what and shape != tuple(out.shape):
                    raise ValueError(f"{conn.spec}: the {what} returned shape {tuple(out.shape)} and the {other} "
                                     f"{shape} for an input of shape {tuple(h.shape)}; the two are added, so their "
                                     "shapes must agree (a projection skip with the branch's stride)")
        if not ok:
            shape = ", ".join(map(str, want))
            raise ValueError(f"{conn.spec}: the {what} returned shape {tuple(out.shape)} for an input of shape "
                             f"{tuple(h.shape)}; it must return ({shape}) ({conn.layout} layout, {conn.dim} "
                             "features)")

    def checked(h, *more, **named):
        out = branch(h, *more, **named)
        check("branch", out, h)
        return out

    def checked_skip(h, *more, **named):
        out = skip(h, *more, **named)
        check("skip", out, h)
        return out

    if skip is not None:
        if skip_given:
            args = (*args[:2], checked_skip, *args[3:])
        else:
            kwargs = {**kwargs, "skip": checked_skip}
    if given:
        return (args[0], checked, *args[2:]), kwargs
    return args, {**kwargs, "branch": checked}


class Connection(nn.Module):
    """A residual connection: ``y = conn(x, branch, skip=None)``.

    ``branch`` maps x to F(x) of the same shape; ``skip`` (optional, e.g. a ResNet projection
    shortcut) makes the skip path ``skip(x)`` instead of x. In every formula below, x on the skip
    side stands for that skip path; the branch always receives the block input x (pre-norm designs
    hand it the normalised x).

    Subclasses declare their spec grammar (``numbered``, ``accepts_norms``, ``default_norm``, ``options``), the
    ``patterns`` they answer, and implement ``forward`` and ``stats``. A model never branches on which one it
    holds. A design with a ``default_norm`` whose spec names no norm takes the model's norm instead, where it
    accepts that kind (:meth:`with_model_norm`); ``spec.norm`` is the norm it builds.
    """

    name: ClassVar[str]
    patterns: ClassVar[dict[str, str]]  # spec pattern -> formula, for available_connections()
    numbered: ClassVar[bool] = False
    accepts_norms: ClassVar[tuple[str, ...]] = ()
    norm_required: ClassVar[bool] = False
    default_norm: ClassVar[str | None] = None
    options: ClassVar[dict[str, _spec.Option]] = {}
    # A stack of blocks that leaves its output un-normalised (pre-norm) needs one final norm of this kind;
    # models ask for it (:func:`final_norm`) rather than branching on the design.
    final_norm: ClassVar[str | None] = None
    # Whether forward reads the block input x itself (a norm before the branch: pre-norm), at ``in_dim`` features
    # even where a projection ``skip`` changes the width; the designs that do say so.
    reads_input: bool = False

    def __init__(self, spec: _spec.Spec, dim: int, layout: str = "seq", in_dim: int | None = None,
                 place: Place | None = None):
        super().__init__()
        self.dim, self.layout = dim, layout
        self.in_dim = dim if in_dim is None else in_dim
        self.in_dim_given = in_dim is not None
        self.place = Place() if place is None else place
        self.spec = _spec.format_spec(spec, type(self), ACROSS)
        self.recording: list[dict[str, Tensor]] | None = None  # a list only inside recording(); see record()
        if not self.needs_stack:  # a stack's design checks its own streams
            self.register_forward_pre_hook(_check_input, with_kwargs=True)
        self.register_forward_pre_hook(_check_branch, with_kwargs=True)

    @classmethod
    def canonical(cls, spec: _spec.Spec) -> _spec.Spec:
        """The spec ``spec`` stands for (``LNS+RMS`` is ``PreRMS(scale=depth)``); most designs: itself."""
        return spec

    @classmethod
    def with_model_norm(cls, spec: _spec.Spec, norm: str) -> _spec.Spec:
        """``spec`` on a model whose norm is ``norm``: a spec that names no norm takes the model's where the
        design takes a norm of that kind (``MixLN`` on an RMS model is ``MixLN+RMS``); a written norm, a design
        without one (``1xSkip``) and one whose name names its norm (``PreLN``) keep theirs."""
        if spec.norm_written or cls.default_norm is None or norm not in cls.accepts_norms:
            return spec
        return cls.canonical(dataclasses.replace(spec, norm=norm, norm_written=True))

    @classmethod
    def final_norm_kind(cls, spec: _spec.Spec, layers: int) -> str | None:
        """The norm a stack of ``layers`` layers of this design ends with (None: its output is normalised)."""
        return cls.final_norm

    @classmethod
    def input_norm_kind(cls, spec: _spec.Spec) -> str | None:
        """The norm a stack of this design applies to its input, the embeddings (None for most designs)."""
        return None

    # A design whose state across layers is not one (..., dim) tensor (hyper-connections' n streams) needs the
    # stack to begin and end with its own modules; models that cannot hold such a stack refuse it.
    needs_stack: ClassVar[bool] = False
    # Whether the design has a skip path that reads the ``skip`` callable (NoSkip has none: y = F(x)).
    has_skip: ClassVar[bool] = True

    @classmethod
    def stack_input(cls, spec: _spec.Spec, dim: int, layout: str) -> nn.Module:
        """The module a stack of this design begins with: its input norm, else the identity."""
        kind = cls.input_norm_kind(spec)
        return make_norm(kind, dim, layout) if kind else nn.Identity()

    @classmethod
    def stack_output(cls, spec: _spec.Spec, dim: int, layout: str, layers: int) -> nn.Module:
        """The module a stack of ``layers`` layers of this design ends with: its final norm, else the identity."""
        kind = cls.final_norm_kind(spec, layers)
        return make_norm(kind, dim, layout) if kind else nn.Identity()

    # A design that changes the model around its connections (nGPT: q·k and logits scaled, unit-norm embeddings,
    # weights renormalised after each step): only a model that builds those pieces holds it; the others refuse it.
    model_side: ClassVar[bool] = False
    # Fields of the model's and the training's config that the design's paper prescribes (nGPT: SwiGLU, no weight
    # decay, ...): a model spec that leaves such a field to its preset takes the recipe's value
    # (:func:`skiplab.models.model_config`), and so does a training config at the field's default.
    recipe: ClassVar[dict[str, Any]] = {}
    # Fields of the model's config the design cannot do without (HybridNorm: the attention's QKV-norm): a model
    # whose config sets another value refuses the design in one line (:func:`check_model_requires`)
    model_requires: ClassVar[dict[str, Any]] = {}

    @staticmethod
    def check_number(number: float) -> float:
        """Validate the leading number of the spec; raise ValueError naming the problem."""
        return number

    def forward(self, x: Tensor, branch: Branch, skip: Branch | None = None) -> Tensor:
        raise NotImplementedError

    @classmethod
    def previous_inputs(cls, spec: _spec.Spec) -> int:
        """How many inputs of the sub-layers before this one the design reads (LAuReL-PA), handed to its forward as
        ``previous``, most recent first, by the stack (:class:`~skiplab.connections.across.Across`); most: 0."""
        return 0

    # An additive design is an identity skip plus a term, y = x + B(x) with B(x) = branch_output(F(branch_input(x)))
    # (the pre-norm and Peri-LN families): a design across the stack that replaces the residual sum by a mix of
    # earlier outputs (Attention Residuals, MUDD) calls B on its own inputs.
    additive: ClassVar[bool] = False

    def branch_input(self, x: Tensor) -> Tensor:
        """What the branch reads of the block input x (an additive design's pre-norm G(x))."""
        raise NotImplementedError(f"{type(self).__name__} is not additive")

    def branch_output(self, f: Tensor) -> Tensor:
        """What of the branch's output F joins the skip (Peri-LN: G_out(F)); most additive designs: F itself."""
        return f

    def stats(self) -> dict[str, Any]:
        """The learned (or fixed) quantities behind the design; ``None`` where no forward pass ran yet."""
        return {}

    def init_branch(self, weights: dict[str, list[Tensor]]) -> None:
        """Re-draw the branch's weights where the design prescribes their initialisation (DeepNorm's β).
        ``weights`` maps a role ("query", "key", "value", "output", "ffn") to the weight matrices of that role
        (views into stacked projections); models call this once, after their own initialisation. Most designs
        leave the model's initialisation as it is."""

    def record(self, **values: Tensor) -> None:
        """Keep this forward pass's per-position ``values`` (detached) for an analysis; a no-op outside
        :func:`recording`, so training never pays for it. Designs record, where they have them: ``alpha``,
        ``beta``, ``gamma`` (SAS), ``T`` (Highway), ``sigma_prods`` (krSkip: Π_{j<=i} σ_j, i < k), ``pre``
        and ``post`` (the sum a normalising design normalises, and G of it)."""
        if self.recording is not None:
            self.recording.append({k: [t.detach() for t in v] if isinstance(v, list) else v.detach()
                                   for k, v in values.items()})

    def extra_repr(self) -> str:
        where = "" if self.place == Place() else f", layer={self.place.layer}/{self.place.layers}"
        return f"{self.spec!r}, dim={self.dim}, layout={self.layout!r}{where}"


def check_model_requires(cfg: Any, *specs: str) -> None:
    """A one-line ``ValueError`` where a connection among ``specs`` (empty ones skipped) needs a value of a model
    config field (``Connection.model_requires``) that ``cfg`` does not have."""
    for text in specs:
        if not text:
            continue
        cls = REGISTRY[parse_spec(text).name]
        for key, want in cls.model_requires.items():
            if getattr(cfg, key, want) != want:
                raise ValueError(f"{cls.name} needs the model option {key}={want} (part of the design), got "
                                 f"{key}={getattr(cfg, key)}")


def check_token_norms(*specs: str) -> None:
    """A one-line ``ValueError`` where a connection among ``specs`` (empty ones skipped) normalises with BatchNorm in
    a model of token sequences (the GPT, the Transformer): BN's training statistics are taken over the batch and every
    position, later tokens and padding among them, so a causal stack's outputs in training would read the tokens
    it is to predict (its BN forms are the image models' in the papers: rSkip+LN Table 4, SAS Table 7)."""
    for text in specs:
        if text and parse_spec(text).norm == "BN":
            raise ValueError(f"{text}: BatchNorm has no form in a model of token sequences (its statistics in training "
                             "mix every position of the batch, later tokens and padding included, so a causal "
                             "model would read the tokens it predicts); BN forms are for the image models, "
                             "LN or RMS here")


def register(cls: type[Connection] | None = None, *, replace: bool = False):
    """Class decorator: make ``cls`` buildable by its ``name`` in spec strings (``@register``); a name taken by
    another design, an alias or a norm is refused (``@register(replace=True)``: replace that design on purpose)."""
    if cls is None:
        return lambda c: register(c, replace=replace)
    check_registration(cls, REGISTRY, replace)
    REGISTRY[cls.name] = cls
    return cls


def check_registration(cls: type, into: dict[str, type], replace: bool = False) -> None:
    """One ``ValueError`` line where ``cls`` cannot be registered into ``into`` (:data:`REGISTRY` or
    :data:`ACROSS`): a name the spec grammar cannot read (letters alone), no ``patterns`` (what ``skiplab
    connections`` lists), or a name that is already a design's, an alias's or a norm's, unless ``replace`` and it is
    a design of the same kind. Registering the same class again is no change."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name.isascii() or not name.isalpha():
        raise ValueError(f"{cls.__name__}: a design's name is letters alone (what a spec can write), got {name!r}")
    if not isinstance(getattr(cls, "patterns", None), dict) or not cls.patterns:
        raise ValueError(f"{cls.__name__}: give patterns (spec pattern -> formula and source), which `skiplab "
                         "connections` lists")
    if into.get(name) is cls:
        return
    taken = ("a design" if name in REGISTRY or name in ACROSS else "an alias" if name in _spec.ALIASES
             else "a norm" if name in _spec.NORM_NAMES else None)
    if taken and not (replace and name in into):
        raise ValueError(f"{cls.__name__}: the name {name!r} is {taken}'s already"
                         + (" (@register(replace=True) replaces it on purpose)" if name in into else ""))


def available_connections() -> dict[str, str]:
    """Every known design: spec pattern (in the papers' notation) -> its formula and source."""
    out: dict[str, str] = {}
    for cls in [*REGISTRY.values(), *ACROSS.values()]:
        out.update(cls.patterns)
    for alias, target in _spec.ALIASES.items():
        out[alias] = f"alias of {target}"
    return out


def _known() -> str:
    return ", ".join(available_connections())


def parse_spec(text: str, norm: str | None = None) -> _spec.Spec:
    """Parse a spec string (see :mod:`skiplab.connections.spec` for the grammar); with ``norm`` (a model's norm
    kind, one of :data:`MODEL_NORMS`), the spec as a model of that norm builds it
    (:meth:`Connection.with_model_norm`)."""
    parsed = _spec.parse(text, REGISTRY, _known(), ACROSS)
    if norm is None:
        return parsed
    if norm not in MODEL_NORMS:
        raise ValueError(f"a model's norm must be one of {', '.join(MODEL_NORMS)}, got {norm!r}")
    return REGISTRY[parsed.name].with_model_norm(parsed, norm)


def _positive_int(name: str, value: Any) -> int:
    try:
        size = -1 if isinstance(value, bool) else operator.index(value)
    except TypeError:
        size = -1
    if size < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return size


def connection(spec: str, dim: int, layout: str = "seq", in_dim: int | None = None,
               place: Place | None = None, norm: str | None = None) -> Connection:
    """Build the connection named by ``spec`` for ``dim`` features.

    ``layout="seq"``: features in the last dimension ``(..., dim)``; ``layout="conv"``: feature maps
    ``(N, dim, H, W)``. ``in_dim``: features of the block input x where they differ from the output's
    (a block with a projection shortcut); only designs that normalise x itself (pre-norm) use it.
    ``place``: where the block sits in its model (:class:`~skiplab.connections.place.Place`; default one
    block of a one-layer stack), for the designs whose form or initialisation depends on depth.
    ``norm``: the model's norm kind (:data:`MODEL_NORMS`), taken by a design whose spec names none; ``conn.spec``
    is then the spec as built (``MixLN`` with ``norm="RMS"``: ``MixLN+RMS``).
    With ``alpha0`` (a DyT norm) every DyT layer starts at that α₀; ``alpha0=llm`` takes the site from
    ``place.role`` ("attn", a self-attention sub-layer, is the DyT paper's "attention"; the others, "cross" and
    "ffn" included, its "other") and the width from ``dim`` (:func:`~skiplab.connections.norms.dyt_llm_alpha0`).
    Raises ValueError for an unknown or malformed spec, listing the known names.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; use one of {', '.join(LAYOUTS)}")
    dim = _positive_int("dim", dim)
    in_dim = None if in_dim is None else _positive_int("in_dim", in_dim)
    if place is not None and not isinstance(place, Place):
        raise TypeError(f"place must be a skiplab.connections.Place (where the block sits in its model), got "
                        f"{type(place).__name__}")
    parsed = parse_spec(spec, norm)
    conn = REGISTRY[parsed.name](parsed, dim, layout, in_dim, place)
    if "alpha0" in parsed.options:
        set_dyt_alpha(conn, dyt_alpha0(parsed.options["alpha0"], dim, attention=conn.place.role == "attn"))
    return conn


def input_norm(spec: str, dim: int, layout: str = "seq", norm: str | None = None,
               embed_scale: float = 1.0) -> nn.Module:
    """The module a stack of ``spec`` blocks begins with: Peri-LN's embedding norm, hyper-connections' expansion
    to n streams, else the identity. Models call this rather than branching on the design. ``norm``: the model's
    norm kind, as for :func:`connection`. With ``alpha0=llm`` (the DyT paper's LLM recipe) the input is first
    multiplied by one learned scalar starting at √dim / ``embed_scale``
    (:class:`~skiplab.connections.norms.InputScale`): ``embed_scale`` is the factor the model's embeddings
    already carry, 1 for a model whose embeddings carry none (the GPT); the Transformer's carry a fixed √d
    (Vaswani et al. 2017, Section 3.4), the factor the DyT paper's scalar makes learnable, which then starts at 1.
    Its embedding DyT (``PeriLN+DyT``) starts at the recipe's "other" α₀."""
    if not (math.isfinite(embed_scale) and embed_scale > 0):
        raise ValueError(f"embed_scale must be a finite number > 0, got {embed_scale!r}")
    parsed = parse_spec(spec, norm)
    module = REGISTRY[parsed.name].stack_input(parsed, dim, layout)
    alpha0 = parsed.options.get("alpha0")
    if alpha0 is not None:
        set_dyt_alpha(module, dyt_alpha0(alpha0, dim, attention=False))
    return InputScale(math.sqrt(dim) / embed_scale, module) if alpha0 == "llm" else module


def final_norm(spec: str, dim: int, layout: str = "seq", layers: int = 1, norm: str | None = None) -> nn.Module:
    """The module a stack of ``layers`` layers of ``spec`` ends with: the pre-norm designs' own norm (after
    hyper-connections' sum of the streams), the identity for the designs whose output is normalised already.
    Models call this rather than branching on the design. ``norm``: the model's norm kind, as for
    :func:`connection`; a final DyT with ``alpha0=llm`` starts at the recipe's "other" α₀."""
    parsed = parse_spec(spec, norm)
    module = REGISTRY[parsed.name].stack_output(parsed, dim, layout, _positive_int("layers", layers))
    if "alpha0" in parsed.options:
        set_dyt_alpha(module, dyt_alpha0(parsed.options["alpha0"], dim, attention=False))
    return module


@contextmanager
def recording(model: nn.Module) -> Iterator[dict[str, list[dict[str, Tensor]]]]:
    """Within the block, every connection of ``model`` appends what it records per forward pass to a list;
    yields ``{qualified name: that list}`` (the caller empties the lists as it consumes them)."""
    conns = dict(iter_connections(model))
    for conn in conns.values():
        conn.recording = []
    try:
        yield {name: conn.recording for name, conn in conns.items()}
    finally:
        for conn in conns.values():
            conn.recording = None


def iter_connections(model: nn.Module):
    """``(qualified name, connection)`` for every connection inside ``model``, in module order."""
    for name, module in model.named_modules():
        if isinstance(module, Connection):
            yield name, module
