"""CPU kernels behind the connections' interface: the same formulas in fewer passes over memory.

A connection chooses a kernel where it is built (its ``kernel`` attribute, None for none; set it to None to
run the eager formula) and runs it where the kernel module's ``usable`` says it can, outside an analysis's
:func:`~skiplab.connections.base.recording` (which wants the intermediate tensors); everywhere else (a GPU,
autocast, ``torch.compile``, a machine without a C compiler, ``SKIPLAB_KERNELS=0``) it runs its eager formula,
which the tests compare the kernel with.

- :mod:`.add_group_norm`: h_1 = a·s + c·F, y_i = GN_i(h_i), h_{i+1} = s + y_i, for ``krSkip+LN`` in the conv
  layout (GroupNorm(1) over C·H·W);
- :mod:`.stream_mix`: hyper-connections' read h₀ = Σ a_i x_i and write x'_j = Σ M[j, i] x_i + b_j F (HC, mHC);
- :mod:`.norm_project`: dynamic hyper-connections' stream norm and projection t = N(x) Vᵀ (HC, mHC);
- :mod:`.sinkhorn`: mHC's Sinkhorn–Knopp projection of the residual mixing matrices.
"""

from . import add_group_norm, norm_project, sinkhorn, stream_mix
from .add_group_norm import fused_chain
from .build import cache_dir, enabled, load

__all__ = ["add_group_norm", "cache_dir", "enabled", "fused_chain", "load", "norm_project", "sinkhorn", "stream_mix"]
