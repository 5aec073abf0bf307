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


def compile_model(model: nn.Module, dynamic: bool | None = None) -> nn.Module:
    """``torch.compile(model)``; ``dynamic=True`` for inputs whose shapes vary from batch to batch."""
    import torch._dynamo

    limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
    setattr(torch._dynamo.config, limit, RECOMPILE_LIMIT)
    return torch.compile(model, dynamic=dynamic)


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
