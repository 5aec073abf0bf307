"""The one mechanism of the designs across the layers of a stack, written after the connection:
``PreLN+ValueRes``, ``PreLN+UNet``, ``HC(n=4)+ValueRes(learn=yes)+UNet``.

A per-block connection sees one sub-layer; these designs carry state from one layer, or sub-layer, to later ones
(the first layer's attention values, the first half's outputs, every earlier sub-layer's output). A stack of layers
(the LM's decoder, the Transformer's encoder and its decoder) holds one :class:`Across` for its spec, the same
object whatever the spec names, and runs, in every forward pass::

    run = across.start(x)                  # x: the stack's input (the embeddings); this pass's state
    for i, layer in enumerate(layers):     # i = 0, ..., L − 1
        x = layer(run.enter(i, x), ..., values=run.values(i), run=run.inner)
        run.leave(i, x)
    x = run.finish(x)                      # the stack's output, before its final norm

and a layer runs its sub-layer k = i·S + s (S sub-layers a layer: attention and MLP; the Transformer's decoder
also cross-attention) as ``run.sublayer(k, x, conn, branch)``, which is ``conn(x, branch)`` unless a design
mixes there (``run.inner`` is None when no design does, and the layer calls its connections directly).
An attention sub-layer's ``branch(h, kv=(h_k, h_v))`` reads its keys and values from other inputs than its
queries where a design gives it separate inputs (MUDD).

Hooks a design may implement (each the identity by default): :meth:`AcrossDesign.begin` (the stack's input),
:meth:`~AcrossDesign.enter` / :meth:`~AcrossDesign.leave` (a layer's input and output),
:meth:`~AcrossDesign.sub_enter` (a sub-layer's input), :meth:`~AcrossDesign.sublayer` (the whole sub-layer: one
design a stack at most, ``owns_sublayers``), :meth:`~AcrossDesign.values` (the self-attention's values) and
:meth:`~AcrossDesign.finish` (the stack's output). A design refuses a stack it has no form in through ``families``
and :meth:`~AcrossDesign.check` (a layer its options name that the stack has not); a model's config calls both
through :func:`check_stack`, so that the spec fails in one line before anything is built.

Every quantity is per position, so a pass over new positions after cached ones (incremental decoding) is exact:
the cache of layer l holds the keys and values its earlier positions had. Where the stack holds
hyper-connections' n streams, the U-Net adds whole streams. The PreAct-ResNet has no stack of one width and no
attention, and refuses them.

A connection may itself read the inputs of the sub-layers before it (LAuReL-PA,
:meth:`~skiplab.connections.Connection.previous_inputs`): the run then keeps each sub-layer's input and hands the
last ones to the next sub-layers' connections as ``previous``, most recent first.

Designs that replace the residual sum by a mix of earlier outputs (``replaces_sum``) need a connection that is
an identity skip plus a term, y = x + B(x) (:attr:`~skiplab.connections.Connection.additive`: the pre-norm and
Peri-LN families), whose B they call on their own mix; any other combination is refused with one line.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from torch import Tensor, nn

from ..base import ACROSS, REGISTRY, Branch, Connection, check_registration, parse_spec
from ..fused import gated_sum
from ..spec import Option, Spec

FAMILIES = ("lm", "encoder", "decoder")


@dataclass(frozen=True)
class Stack:
    """A stack of ``layers`` layers of width ``dim``, each of ``len(roles)`` sub-layers named by ``roles``
    ("attn", "cross", "ffn"), in a ``family``: "lm" (the decoder-only model), "encoder" or "decoder" (the
    Transformer's)."""

    layers: int
    dim: int = 0
    roles: tuple[str, ...] = ("attn", "ffn")
    family: str = "lm"

    @property
    def sublayers(self) -> int:
        """Sub-layers of the stack: L·S."""
        return self.layers * len(self.roles)

    def role(self, k: int) -> str:
        """The role of sub-layer k (0-based over the stack)."""
        return self.roles[k % len(self.roles)]


def depth_sum(weights: list[Tensor], outputs: list[Tensor]) -> Tensor:
    """Σ_j a_j X_j, the weighted sum over depth the mixing designs share (DenseFormer's static α_ij, MUDD's and
    Attention Residuals' per-position weights): each a_j a scalar, or per position (..., 1) against X_j (..., d);
    the weights in the outputs' dtype. One output buffer, each weight's gradient one dot product per value
    (:func:`~skiplab.connections.fused.gated_sum`), where a sum of products made a temporary for every product and
    every partial sum and, backward, every ∂y ⊙ X_j before reducing it."""
    like = outputs[0]
    pairs = [(a.to(like.dtype).reshape((1,) * like.dim()) if a.dim() == 0 else a.to(like.dtype), x)
             for a, x in zip(weights, outputs, strict=True)]
    return gated_sum(*pairs)


def register_across(cls: type[AcrossDesign] | None = None, *, replace: bool = False):
    """Class decorator: make ``cls`` usable after a connection spec as ``+name`` (checked as
    :func:`~skiplab.connections.base.register` checks a connection)."""
    if cls is None:
        return lambda c: register_across(c, replace=replace)
    check_registration(cls, ACROSS, replace)
    ACROSS[cls.name] = cls
    return cls


class AcrossDesign(nn.Module):
    """One design across the layers of a :class:`Stack`; the hooks leave everything as it is."""

    name: ClassVar[str]
    options: ClassVar[dict[str, Option]] = {}
    patterns: ClassVar[dict[str, str]]
    mixes_values: ClassVar[bool] = False
    owns_sublayers: ClassVar[bool] = False  # runs every sub-layer itself (sublayer); one such design a stack
    replaces_sum: ClassVar[bool] = False  # its mix replaces the residual sum: needs an additive connection, alone
    recomputable: ClassVar[bool] = True  # a layer may run twice (activation checkpointing) without harm
    families: ClassVar[tuple[str, ...]] = FAMILIES  # the stacks it has a form for
    first = 0  # the 0-based layer that the first entry of each stats() tensor belongs to
    # a design that mixes earlier outputs: what its targets and sources are, for the "i reads j" matrix
    mix_axes: ClassVar[tuple[str, str] | None] = None

    def __init__(self, spec: Spec, stack: Stack):
        super().__init__()
        self.mix_log: list[tuple[str, int, Tensor]] | None = None  # a list only inside recording_mixes()

    def record_mix(self, target: int, weights: Tensor, stream: str = "") -> None:
        """Keep this pass's ``weights`` (..., sources) with which ``target`` reads its sources (``stream``: which
        input, for a design with several: MUDD's q, k, v, r); a no-op outside :func:`recording_mixes`."""
        if self.mix_log is not None:
            self.mix_log.append((stream, target, weights.detach()))

    @classmethod
    def conflict(cls, spec: Spec, named: str, registry: dict[str, type], across: dict[str, type]) -> str | None:
        """What makes ``spec`` (the connection, written ``named``, with its designs across the stack) mean nothing
        with this design in it, or None. Two designs may not both run the sub-layers; a design that replaces the residual sum needs an
        additive connection and no other design that mixes the stream (the value residual, which mixes attention
        values, may join it)."""
        own = next(s for s in spec.stack if s.name == cls.name)
        if cls.runs_sublayers(own):
            other = next((s for s in spec.stack if s.name != cls.name and across[s.name].runs_sublayers(s)), None)
            if other:
                return f"+{cls.name} and +{other.name} both run every sub-layer; give one"
        if not cls.replaces_sum:
            return None
        if not registry[spec.name].additive:
            return (f"+{cls.name} replaces the residual sum of a connection y = x + B(x) (PreLN, PreRMS, LNS, PeriLN, "
                    f"SandwichLN); {named} is not of that form")
        other = next((s.name for s in spec.stack if s.name != cls.name and not across[s.name].mixes_values), None)
        return f"+{cls.name} replaces the residual sum; it cannot be combined with +{other}" if other else None

    @classmethod
    def runs_sublayers(cls, spec: Spec) -> bool:
        """Whether the design, with ``spec`` (its own), runs every sub-layer itself (:meth:`sublayer`)."""
        return cls.owns_sublayers

    @classmethod
    def check(cls, spec: Spec, stack: Stack) -> str | None:
        """What makes ``spec`` (this design's) impossible in ``stack`` (a layer it names out of range), or None."""
        return None

    def begin(self, x: Tensor, state: dict[str, Any]) -> None:
        """The stack's input x₀ (the embeddings, after the stack's input module), seen."""

    def enter(self, i: int, x: Tensor, state: dict[str, Any]) -> Tensor:
        """Layer i's input."""
        return x

    def leave(self, i: int, x: Tensor, state: dict[str, Any]) -> None:
        """Layer i's output, seen."""

    def sub_enter(self, k: int, x: Tensor, state: dict[str, Any]) -> Tensor:
        """Sub-layer k's input (k = i·S + s over the stack)."""
        return x

    def sublayer(self, k: int, x: Tensor, conn: Connection, branch: Branch, state: dict[str, Any]) -> Tensor:
        """Sub-layer k run whole (``owns_sublayers``): by default the connection around the branch."""
        return conn(x, branch)

    def values(self, i: int, v: Tensor, state: dict[str, Any]) -> Tensor:
        """Layer i's self-attention values V (B, H, T, d_head), as the attention uses and caches them."""
        return v

    def finish(self, x: Tensor, state: dict[str, Any]) -> Tensor:
        """The stack's output, before its final norm."""
        return x

    def stats(self) -> dict[str, Tensor]:
        """What the design learned (or fixes): a 1-d tensor per quantity, one entry per layer from ``first`` on."""
        return {}

    def rows(self) -> list[tuple[int, str, float]]:
        """(layer index, quantity, value) for each entry of :meth:`stats`, for ``analyze gates``."""
        return [(self.first + j, key, float(v)) for key, t in self.stats().items() for j, v in enumerate(t)]


@contextmanager
def recording_mixes(model: nn.Module) -> Iterator[list[AcrossDesign]]:
    """Within the block, every design across a stack of ``model`` that mixes earlier outputs (``mix_axes``) keeps
    what it records (:meth:`AcrossDesign.record_mix`) in its ``mix_log``; yields those designs."""
    designs = [m for m in model.modules() if isinstance(m, AcrossDesign) and m.mix_axes is not None]
    for d in designs:
        d.mix_log = []
    try:
        yield designs
    finally:
        for d in designs:
            d.mix_log = None


def check_stack(spec: str, stack: Stack) -> None:
    """Raise one ``ValueError`` line where a design across the stack in ``spec`` has no form in ``stack``: not in
    its family (the Transformer's encoder or decoder), or naming a layer the stack has not. A model's config calls
    it, so that a bad spec fails before anything is built or written."""
    for s in parse_spec(spec).stack:
        design = ACROSS[s.name]
        if stack.family not in design.families:
            raise ValueError(f"+{s.name} has no form in a Transformer's {stack.family} (only in "
                             f"{', '.join(design.families)} stacks)")
        if problem := design.check(s, stack):
            raise ValueError(f"bad connection spec {spec!r}: {problem}")


def not_recomputable(spec: str) -> list[str]:
    """The designs in ``spec`` whose layers must not run twice (activation checkpointing), as written: designs
    across the stack (``+AttnRes``) and a connection that reads earlier sub-layers' inputs (``LAuReL(form=pa)``)."""
    parsed = parse_spec(spec)
    names = [f"+{s.name}" for s in parsed.stack if not ACROSS[s.name].recomputable]
    if REGISTRY[parsed.name].previous_inputs(parsed):
        names.append(f"{parsed.name}(form=pa)")
    return names


class Across(nn.Module):
    """The designs across a stack's layers that ``spec`` names after its connection (none: every hook is the
    identity); see the module docstring for how a stack runs them. ``stack``: a :class:`Stack`, or its number
    of layers (a decoder-only stack of attention and MLP sub-layers, width unknown)."""

    def __init__(self, spec: str, stack: Stack | int):
        super().__init__()
        stack = Stack(stack) if isinstance(stack, int) else stack
        check_stack(spec, stack)
        parsed = parse_spec(spec)
        self.stack = stack
        self.designs = nn.ModuleList(ACROSS[s.name](s, stack) for s in parsed.stack)
        self.mixes_values = any(d.mixes_values for d in self.designs)
        # the design that runs every sub-layer, if any: by its index, so that its parameters are registered once
        self.owner_index = next((i for i, d in enumerate(self.designs) if d.owns_sublayers), None)
        # how many earlier sub-layers' inputs the connection reads (LAuReL-PA); the run hands them over
        self.previous = REGISTRY[parsed.name].previous_inputs(parsed)
        self.per_sublayer = (self.owner_index is not None or self.previous > 0
                             or any(type(d).sub_enter is not AcrossDesign.sub_enter for d in self.designs))

    def start(self, x: Tensor | None = None) -> Run:
        """This forward pass's state, the stack's input ``x`` seen by every design."""
        run = Run(self)
        if x is not None:
            for d in self.designs:
                d.begin(x, run.state)
        return run

    def stats(self) -> dict[str, dict[str, Tensor]]:
        """Each design's :meth:`AcrossDesign.stats`, by name."""
        return {d.name: d.stats() for d in self.designs}

    def extra_repr(self) -> str:
        return ", ".join(d.name for d in self.designs)


class Run:
    """One forward pass of a stack through its :class:`Across`: the state the designs keep in it."""

    __slots__ = ("across", "state")

    def __init__(self, across: Across):
        self.across, self.state = across, {}

    @property
    def inner(self) -> Run | None:
        """This run where a design acts inside the layers (at their sub-layers), else None: the layers then call
        their connections directly, as a stack without such designs does."""
        return self if self.across.per_sublayer else None

    def enter(self, i: int, x: Tensor) -> Tensor:
        for d in self.across.designs:
            x = d.enter(i, x, self.state)
        return x

    def leave(self, i: int, x: Tensor) -> None:
        for d in self.across.designs:
            d.leave(i, x, self.state)

    def sublayer(self, k: int, x: Tensor, conn: Connection, branch: Branch) -> Tensor:
        """Sub-layer k of the stack (``conn`` around ``branch``), as the designs run it."""
        for d in self.across.designs:
            x = d.sub_enter(k, x, self.state)
        owner = self.across.owner_index
        if owner is None and self.across.previous:  # the connection reads the inputs of the sub-layers before
            seen = self.state.setdefault("inputs", [])
            y = conn(x, branch, previous=tuple(seen[: -self.across.previous - 1 : -1]))
            seen.append(x)
            return y
        if owner is None:
            return conn(x, branch)
        return self.across.designs[owner].sublayer(k, x, conn, branch, self.state)

    def finish(self, x: Tensor) -> Tensor:
        for d in self.across.designs:
            x = d.finish(x, self.state)
        return x

    def values(self, i: int) -> Callable[[Tensor], Tensor] | None:
        """What layer i's self-attention applies to its values, or None (the attention as it is)."""
        if not self.across.mixes_values:
            return None

        def mix(v: Tensor) -> Tensor:
            for d in self.across.designs:
                v = d.values(i, v, self.state)
            return v

        return mix
