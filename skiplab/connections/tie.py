"""Parameters a design shares between the sub-layers of a layer: one tying step, run by the models.

A connection is built for one sub-layer and owns its parameters. A design whose parameter belongs to the whole
layer (ReZero's α in the authors' code: one ``resweight`` per layer) names it in ``layer_shared``, a tuple of
attribute names (none for most designs); :func:`tie_within_layers` then makes each layer's later connections
hold the first one's parameter, the same :class:`~torch.nn.Parameter` object, so that ``model.parameters()``
(the optimiser, the parameter count) yields it once, its gradient sums what every sub-layer contributes, and
``state_dict`` lists it under each connection's name with one storage (``torch.save`` writes it once; loading
copies the same value into it twice). A state dict whose copies differ (a model that kept them apart, e.g.
``ReZero(share=sublayer)``) is refused on loading rather than silently keeping one of them. A model calls it
once, at the end of its constructor.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn

from .base import Connection, iter_connections


def tie_within_layers(model: nn.Module) -> int:
    """Tie the ``layer_shared`` parameters of ``model``'s connections within each layer: connections of the same
    design at the same (``place.stack``, ``place.layer``) share the first one's parameter (in module order).
    Returns the number of parameters replaced; 0 where no design shares one."""
    first: dict[tuple, Connection] = {}
    names: dict[tuple, list[str]] = {}
    tied = 0
    for qualified, conn in iter_connections(model):
        for name in getattr(conn, "layer_shared", ()):
            key = (type(conn), conn.place.stack, conn.place.layer, name)
            owner = first.setdefault(key, conn)
            names.setdefault(key, []).append(f"{qualified}.{name}" if qualified else name)
            if owner is not conn and getattr(conn, name) is not getattr(owner, name):
                setattr(conn, name, getattr(owner, name))
                tied += 1
    if tied:
        model.register_load_state_dict_pre_hook(partial(_refuse_differing_copies, [g for g in names.values() if len(g) > 1]))
    return tied


def _refuse_differing_copies(groups: list[list[str]], module: nn.Module, state: dict[str, Any], prefix: str,
                             *args: Any) -> None:
    """A load_state_dict pre-hook: each group of tied names must hold one value in ``state``."""
    error_msgs = args[-1]
    for group in groups:
        values = [(prefix + n, state[prefix + n]) for n in group if prefix + n in state]
        differ = [n for n, v in values[1:] if not torch.equal(torch.as_tensor(v), torch.as_tensor(values[0][1]))]
        if differ:
            error_msgs.append(f"{values[0][0]} and {', '.join(differ)} differ, but this model holds them as one "
                              "parameter per layer; the checkpoint's model kept them apart (e.g. ReZero(share=sublayer))")
