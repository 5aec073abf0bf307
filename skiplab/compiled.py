"""``--compile``: a model run through ``torch.compile``, and a count of what compiling it cost.

Compilation happens on the first call and again whenever a guard fails (a new input shape, train vs eval
mode). Recompilations are bounded: past ``RECOMPILE_LIMIT`` per function, dynamo runs that function
eagerly (with a warning) instead of compiling once more. :class:`CompileStats` reports, for the run,
how many graphs were compiled, how many of those compilations were recompilations, and how many graph
breaks split the model, from dynamo's own counters.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

RECOMPILE_LIMIT = 8


def _dynamo_config():
    """dynamo's config, imported when first needed: importing dynamo takes seconds, and most commands never compile."""
    import torch._dynamo

    return torch._dynamo.config


def _limit_name() -> str:
    return "recompile_limit" if hasattr(_dynamo_config(), "recompile_limit") else "cache_size_limit"


def set_recompile_limit(limit: int) -> None:
    """dynamo's bound on the compilations of one function (its name differs between torch versions)."""
    setattr(_dynamo_config(), _limit_name(), limit)


def raise_recompile_limit(limit: int) -> None:
    """The bound at least ``limit``: one process that compiles many models of one class (a benchmark of every
    design) keeps a compiled entry of the layer's ``forward`` for each, and past the bound dynamo runs it eagerly."""
    set_recompile_limit(max(limit, getattr(_dynamo_config(), _limit_name())))


def compile_model(model: nn.Module, dynamic: bool | None = None) -> nn.Module:
    """``torch.compile(model)``; ``dynamic=True`` for inputs whose shapes vary from batch to batch."""
    set_recompile_limit(RECOMPILE_LIMIT)
    return torch.compile(model, dynamic=dynamic)


def compile_layers(model: nn.Module, backend: str = "inductor", dynamic: bool = False) -> nn.Module:
    """Compile each of ``model.layers`` in place (``nn.Module.compile``): dynamo traces a module's ``forward``
    once for every instance of its class whose guards hold, taking the weights as inputs, so one compiled graph
    serves every layer and the compile costs one layer's time. A design whose layers differ in a constant (LNS's
    1/√ℓ, Mix-LN's post-norm layers, the value residual's first layer) compiles once per distinct layer; the bound
    is raised to the layer count so none falls back to eager. The embedding, the stack's cross-layer designs and the output stay eager."""
    raise_recompile_limit(len(model.layers) + 2)
    for layer in model.layers:
        layer.compile(backend=backend, dynamic=dynamic)
    return model


def _metrics() -> list[Any]:
    """dynamo's records of its latest compilations (the last 64), oldest first."""
    from torch._dynamo import utils

    return utils.get_compilation_metrics() if hasattr(utils, "get_compilation_metrics") else []


def _counts() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return {"graphs": counters["stats"]["unique_graphs"], "frames": counters["frames"]["ok"],
            "graph_breaks": sum(counters["graph_break"].values())}


class CompileStats:
    """Counts dynamo's compilations from construction on (dynamo's counters are per process)."""

    def __init__(self) -> None:
        self.start = _counts()
        past = _metrics()
        self.last_seen = past[-1] if past else None

    def report(self) -> dict[str, Any]:
        now, metrics = _counts(), _metrics()
        new = next((metrics[i + 1 :] for i, m in enumerate(metrics) if m is self.last_seen), metrics)
        return {"graphs_compiled": now["graphs"] - self.start["graphs"],
                "frames_compiled": now["frames"] - self.start["frames"],
                "recompiles": sum(getattr(m, "recompile_reason", None) is not None for m in new),
                "graph_breaks": now["graph_breaks"] - self.start["graph_breaks"],
                "recompile_limit": RECOMPILE_LIMIT}
