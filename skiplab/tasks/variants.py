"""The variants a comparison trains: what each changes from the base config, and its label.

A variant is a connection (every task), a model spec (another family or its options,
``dwlstm-small(share=all)``, ``preact-resnet32``), or both. Runs are labelled by what varied.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

from ..analysis import comparison, effective
from ..connections import connection
from ..models import model_config, parse_model_spec, with_options


@dataclass(frozen=True)
class Variant:
    """One row of a comparison: its ``label``, the config ``changes`` it makes, its describing ``columns``."""

    label: str
    changes: dict[str, Any]
    columns: dict[str, Any] = field(default_factory=dict)


def run_name(spec: str) -> str:
    """A directory name for a label: ``2rSkip+LN`` and ``PreLN@1.25x`` stay; characters a shell would mind become ``_``."""
    return re.sub(r"[^A-Za-z0-9+.=_@-]", "_", spec)


def _connections(connections: tuple[str, ...]) -> list[str]:
    """The connection specs as the user names them (PostLN stays PostLN), each checked, none twice."""
    specs = [c.strip() for c in connections]
    canonical = [connection(c, 4).spec for c in specs]  # a bad spec fails before any run
    if len(set(canonical)) != len(canonical):
        raise ValueError(f"a connection is listed twice: {', '.join(connections)}")
    return specs


def connection_variants(base_model: str, connections: tuple[str, ...]) -> list[Variant]:
    """One variant per connection spec on ``base_model``, labelled by the spec."""
    return [Variant(c, {"model": with_options(base_model, connection=c)}, comparison.connection_columns(c))
            for c in _connections(connections)]


def model_variants(base_model: str, models: tuple[str, ...], connections: tuple[str, ...],
                   options: dict[str, Any] | None = None) -> list[Variant]:
    """Every model spec x connection (either list may be empty: the base's model, the model's own connection);
    ``options`` (model fields: ``d_model=32``, the command line's model options) are added to each of ``models``
    (the base model has them already), not to the labels.

    Labels say what varies: the connection alone (``PostLN``), the model alone (``dwlstm-small``), or both; where
    nothing does, the connection if one is named, else the model.
    """
    given = tuple(m.strip() for m in models)
    models = given or (base_model,)
    for m in models:
        parse_model_spec(m)
    if len(set(models)) != len(models):
        raise ValueError(f"a model is listed twice: {', '.join(models)}")
    conns = _connections(connections) if connections else [None]
    out = []
    for m in models:
        for c in conns:
            spec = with_options(m, **options) if given and options else m  # a field set twice: an error naming both
            spec = with_options(spec, connection=c) if c else spec  # a family without connections fails here
            # nothing varies (one model, one connection): the connection where one is named, as the image task
            # labels it (a script's runs under OUT/<design> are the comparison's), else the model
            label = " ".join(x for x, varies in ((m, len(models) > 1), (c, len(conns) > 1)) if varies) or c or m
            if len(models) > 1:
                columns = {"model": m, **(comparison.connection_columns(c) if c else {})}
            else:
                columns = comparison.connection_columns(c) if c else {"model": m}
            out.append(Variant(label, {"model": spec}, columns))
    _check_distinct(out)
    return out


def _check_distinct(variants: list[Variant]) -> None:
    """No two variants build the same model (``preact-resnet20`` and ``preact-resnet20(depth=20)``; a connection
    under an alias or spelt with spaces): rows that could only differ by chance. Compared by the configs their
    specs build, each connection as its canonical spec."""
    seen: dict[str, str] = {}
    for v in variants:
        cfg = model_config(v.changes["model"])
        if isinstance(getattr(cfg, "connection", None), str):
            cfg = dataclasses.replace(cfg, connection=connection(cfg.connection, 4).spec)
        key = repr(cfg)
        if key in seen:
            raise ValueError(f"{seen[key]} and {v.label} build the same model ({v.changes['model']}): list it once")
        seen[key] = v.label


def baseline_lengths(variants: list[Variant], base: Any, factors: tuple[float, ...]) -> list[Variant]:
    """``variants`` with the first (the baseline) also trained for each factor f > 1 times the updates (its schedule
    spanning f·S), labelled ``PreLN@1.25x``, after it: the lengths an effective-compute reading
    (:mod:`skiplab.analysis.effective`) interpolates between."""
    if not factors:
        return variants
    if not hasattr(base, "max_steps") or getattr(base, "epochs", 0):
        raise ValueError("--baseline-updates needs runs counted in updates (--max-steps)")
    bad = [f for f in factors if not (math.isfinite(f) and f > 1)]
    if bad or len(set(factors)) != len(factors):
        raise ValueError(f"--baseline-updates takes distinct factors > 1, got {', '.join(f'{f:g}' for f in factors)}")
    first = variants[0]
    scaled = []
    for f in sorted(factors):
        label = effective.scaled_label(first.label, f)
        # the table's describing column names the length too: three rows reading "PreLN" would be told apart by
        # their order alone
        columns = {**first.columns, "connection": label} if "connection" in first.columns else first.columns
        scaled.append(Variant(label, {**first.changes, "max_steps": round(base.max_steps * f)}, columns))
    return [first, *scaled, *variants[1:]]
