"""The linear layers of the translation families and their two initialisations (``init=`` of a family's config).

``xavier`` (the residual Transformer's default): every weight matrix of a family's own linear layers
(attention projections, feed-forward layers, the depth-wise LSTM's gate and hidden layers) is drawn from
Glorot and Bengio's normalised (Xavier) uniform distribution (2010, Eq. 16), its bias set to zero:

    W ~ U(-b, b),   b = sqrt(6 / (fan_in + fan_out))   (so std(W) = b / sqrt(3)),   bias = 0

This is the initialiser of tensor2tensor's Transformer, on which the rSkip+LN and SAS papers build
(``uniform_unit_scaling``: variance scaling over the mean fan, uniform, gain 1). A layer that computes
several of the papers' matrices with one matmul (:func:`stacked_linear`) draws each as the separate layer
it stands for: a d x d slice of the stacked Q, K, V projection has the bound sqrt(6 / 2d), not the bound
sqrt(6 / 4d) of the 3d x d matrix.

``lipschitz`` (the depth-wise LSTM family's default): the initialisation of Neutron, the toolkit of the
depth-wise LSTM paper's authors, in its default configuration (``lipschitz_scale = 1.0``; Xu et al. 2020,
"Lipschitz constrained parameter initialization for deep Transformers"): Kaiming-uniform with gain
sqrt(1/3) on every weight matrix, biases zero,

    W ~ U(-b, b),   b = sqrt(3) · sqrt(1/3) / sqrt(fan_in) = 1 / sqrt(fan_in),   bias = 0

(Neutron ``utils/init/base.py``, ``init_model_params_kaiming`` and ``init_model_params_lipschitz``). The bound
depends on fan_in alone, so a stacked layer's slices share it. :func:`lipschitz_init_` applies it to a
built model, as Neutron's ``init_model_params`` does after building. The embedding (in the shell) and the
connections' own parameters (gates, norms, skip weights) keep their own initialisation.
"""

from __future__ import annotations

import torch
from torch import nn


def xavier_linear(d_in: int, d_out: int, bias: bool = True) -> nn.Linear:
    """``nn.Linear(d_in, d_out)`` with W ~ U(-b, b), b = sqrt(6 / (d_in + d_out)), and a zero bias (or none).

    The weight takes one draw of d_out x d_in uniform numbers (PyTorch's default initialisation is skipped)."""
    lin = nn.utils.skip_init(nn.Linear, d_in, d_out, bias=bias)
    with torch.no_grad():
        nn.init.xavier_uniform_(lin.weight)
        if bias:
            lin.bias.zero_()
    return lin


def lipschitz_(lin: nn.Linear) -> None:
    """Redraw ``lin`` in place: W ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), bias 0 (Neutron's default)."""
    with torch.no_grad():
        bound = lin.in_features ** -0.5
        lin.weight.uniform_(-bound, bound)
        if lin.bias is not None:
            lin.bias.zero_()


def lipschitz_init_(model: nn.Module, keep: tuple[nn.Module, ...] = ()) -> None:
    """:func:`lipschitz_` on every linear layer of ``model`` (each once, in module order) but those inside ``keep``."""
    kept = {id(m) for k in keep for m in k.modules()}
    seen: set[int] = set()
    for module in model.modules():
        if isinstance(module, nn.Linear) and id(module) not in kept and id(module) not in seen:
            lipschitz_(module)
            seen.add(id(module))


def stacked_linear(d_in: int, d_out: int, parts: int, bias: bool = True) -> nn.Linear:
    """``nn.Linear(d_in, parts * d_out)`` whose ``parts`` row blocks are drawn, one after the other, as separate
    :func:`xavier_linear` ``(d_in, d_out)`` layers: the bound sqrt(6 / (d_in + d_out)) per block and the same
    random draws, so a seed gives the weights it gives separate layers."""
    layers = [xavier_linear(d_in, d_out, bias) for _ in range(parts)]
    stacked = nn.utils.skip_init(nn.Linear, d_in, parts * d_out, bias=bias)
    with torch.no_grad():
        stacked.weight.copy_(torch.cat([lin.weight for lin in layers]))
        if bias:
            stacked.bias.copy_(torch.cat([lin.bias for lin in layers]))
    return stacked
