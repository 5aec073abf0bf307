"""Counted FLOPs: what a call does in matrix products, by ``torch.utils.flop_counter``.

The counter adds up the floating-point operations of the matmul-like kernels a call runs (``mm``, ``bmm``,
``addmm``, ``baddbmm``, convolutions, ``scaled_dot_product_attention``), forward and backward, from their shapes:
2·m·n·k for an (m × k) by (k × n) product. Element-wise work (norms, activations, a residual stream's mixing
outside products, the optimizer's update) is not counted. A design's extra products are: SAS's Scaling Gates
(two d × 2d products a sub-layer), hyper-connections' stream reads and writes (per-position (n+1) × n by n × d
products) and their dynamic weights.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.utils.flop_counter import FlopCounterMode


def counted_flops(call: Callable[[], Any]) -> int:
    """Floating-point operations of ``call()`` (matmuls and convolutions, forward and any backward it runs)."""
    counter = FlopCounterMode(display=False)
    with counter:
        call()
    return int(counter.get_total_flops())
