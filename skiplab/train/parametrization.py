"""Training parametrisations of the language model: the optimizer's parameter groups, per-group learning rates,
weight decay and AdamW ε, and what each asks of the model.

``standard``: one learning rate; matrices (2-D or more) decayed, vectors and scalars not (nanoGPT's
``configure_optimizers``, by dimension).

``mup``, width μP (Yang et al. 2022, Tensor Programs V, arXiv 2203.03466, Table 3, Adam column; the ``mup``
package's ``MuAdamW``; EleutherAI/nanoGPT-mup branch ``mup``, ``model.py``), m_d = d / d_base:

    hidden matrices (attention's and the MLP's weights):  lr · 1/m_d,  weight decay · m_d  (MuAdamW: lr /= width_mult,
                                                          weight_decay *= width_mult, so that lr · wd stays put)
    embeddings, positions, untied output layer:           lr,  weight decay            (vector-like: one width dim)
    biases, norms, the connections' own parameters:       lr,  no weight decay

and the model's side (``GPTConfig.mup_base_width``): logits of h/m_d, attention q·k/d_head, hidden init std/√m_d.

``completep`` (Dey et al. 2025, "Don't be lazy: CompleteP enables compute-efficient deep transformers", arXiv
2505.01618; EleutherAI/nanoGPT-mup branch ``completep``, ``model.py``, ``GPT.configure_optimizers`` with
``depth_alpha_enabled``), width μP and depth, m_L = L / L_base, α the branches' ``depth_alpha`` (1 unless the spec
writes another):

    hidden matrices:                      lr · m_d^(−1) · m_L^(α−1),  weight decay · m_d   (``hidden_weight_params``)
    hidden biases and norms:              lr · m_L^(α−1),  no weight decay    (``hidden_bias_params``, ``hidden_ln_params``)
    embeddings, untied output layer:      lr,  weight decay                  (``emb_params``)
    final norm, the designs across:       lr,  no weight decay               (``final_ln_params``)
    ε of every group:                     ε · m_d^(−1) · m_L^(−α)             (``adam_eps *=``, one ε for the optimizer)

with every pre-norm branch scaled by m_L^(−α) (:func:`skiplab.connections.prenorm.depth_multiplier`; the spec's
``depth_alpha``/``depth_base``, which :func:`apply` writes). nanoGPT-mup's ``mup`` groups keep the hidden weight
decay unscaled; here both follow ``MuAdamW`` and the ``completep`` branch (weight decay · m_d).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from ..connections import ACROSS, REGISTRY, parse_spec
from ..connections.spec import format_spec
from ..models import GPTConfig
from ..models import ngpt

PARAMETRIZATIONS = ("standard", "mup", "completep")


@dataclass(frozen=True)
class Parametrization:
    """A run's parametrisation, resolved for its model: ``kind``, m_d (``width_multiplier``), m_L
    (``depth_multiplier``) and the branches' α (``depth_alpha``)."""

    kind: str = "standard"
    width_multiplier: float = 1.0
    depth_multiplier: float = 1.0
    depth_alpha: float = 0.0

    def notes(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def apply(mcfg: GPTConfig, kind: str, depth_base: int = 0) -> GPTConfig:
    """The model config a run of parametrisation ``kind`` trains: width μP's base is the model's ``mup_base_width``
    (``mup`` and ``completep``; 0, the model's own d, becomes d); ``completep`` also gives the pre-norm branches
    ``depth_alpha`` (the spec's where it writes one, else 1) and ``depth_base`` (``depth_base``, 0 the model's own
    L). A ValueError names what means nothing: a μP model under ``standard``, a base depth outside ``completep``, a design without the pre-norm depth
    option under ``completep``, nGPT under either, a depth base written twice."""
    if kind not in PARAMETRIZATIONS:
        raise ValueError(f"unknown --parametrization {kind!r}; known: {', '.join(PARAMETRIZATIONS)}")
    if depth_base < 0:
        raise ValueError(f"--depth-base must be >= 0 (0: the model's own depth), got {depth_base}")
    if depth_base and kind != "completep":
        raise ValueError(f"--depth-base is CompleteP's base depth; --parametrization {kind} has none")
    if kind == "standard":
        if mcfg.mup_base_width:
            raise ValueError(f"mup_base_width={mcfg.mup_base_width} is width muP's base width: give --parametrization "
                             "mup or completep")
        return mcfg
    if ngpt.is_ngpt(mcfg.connection):
        raise ValueError(f"--parametrization {kind}: nGPT scales its logits and attention itself; use standard")
    mcfg = dataclasses.replace(mcfg, mup_base_width=mcfg.mup_base_width or mcfg.d_model)
    if kind == "mup":
        return mcfg
    spec = parse_spec(mcfg.connection)
    cls = REGISTRY[spec.name]
    if "depth_alpha" not in cls.options:
        raise ValueError(f"--parametrization completep scales pre-norm branches (PreLN, PreRMS, PreDyT, LNS); "
                         f"{mcfg.connection} has no depth_alpha")
    if not spec.options["depth_alpha"] and "depth_alpha=" in "".join(mcfg.connection.split()):  # written as 0
        raise ValueError(f"--parametrization completep scales the branches by m_L^(-alpha) with alpha > 0 (its paper: "
                         f"1/2 or 1; 1 unless written); {mcfg.connection} writes depth_alpha=0, no depth scaling: "
                         "give --parametrization mup for that")
    base = float(depth_base or mcfg.layers)
    if spec.options["depth_base"] not in (1.0, base):
        raise ValueError(f"--parametrization completep: the connection sets depth_base="
                         f"{spec.options['depth_base']:g}, the run's --depth-base is {base:g}: give it once")
    options = dict(spec.options, depth_alpha=spec.options["depth_alpha"] or 1.0, depth_base=base)
    connection = format_spec(dataclasses.replace(spec, options=options), cls, ACROSS)
    return dataclasses.replace(mcfg, connection=connection)


def resolve(mcfg: GPTConfig, kind: str) -> Parametrization:
    """The multipliers of a run of ``kind`` on the model config :func:`apply` made: m_d = d / mup_base_width,
    m_L = L / depth_base and α of its branches (completep)."""
    if kind == "standard":
        return Parametrization()
    m_d = mcfg.d_model / mcfg.mup_base_width
    if kind == "mup":
        return Parametrization(kind, m_d)
    options = parse_spec(mcfg.connection).options
    return Parametrization(kind, m_d, mcfg.layers / options["depth_base"], options["depth_alpha"])


def parameter_groups(model: torch.nn.Module, weight_decay: float, param: Parametrization = Parametrization(),
                     eps: float = 1e-8) -> list[dict[str, Any]]:
    """The optimizer's groups under ``param`` (see the module docstring), each with its ``weight_decay``, and under
    mup and completep its ``name``, ``lr_scale`` (the factor :func:`set_lr` multiplies the schedule's lr by) and
    ``eps``. Standard: matrices (2-D or more: linear layers, embeddings) decayed; vectors and scalars (biases,
    norms' gains, gates' biases, learned skip weights) not."""
    params = [p for p in model.parameters() if p.requires_grad]
    if param.kind == "standard":
        return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    m_d, depth_lr = param.width_multiplier, 1.0
    if param.kind == "completep":
        depth_lr = param.depth_multiplier ** (param.depth_alpha - 1)
        eps = eps / m_d * param.depth_multiplier ** -param.depth_alpha
    branch = {id(p) for layer in model.layers for m in (layer.attn, layer.mlp) for p in m.parameters()}
    inside = {id(p) for p in model.layers.parameters()}
    groups = {  # name -> (lr_scale, weight_decay)
        "hidden_matrices": (depth_lr / m_d, weight_decay * m_d),
        "hidden_vectors": (depth_lr, 0.0),
        "embeddings": (1.0, weight_decay),
        "outer_vectors": (1.0, 0.0),
    }
    members: dict[str, list[torch.nn.Parameter]] = {name: [] for name in groups}
    for p in params:
        if id(p) in branch and p.dim() >= 2:
            members["hidden_matrices"].append(p)
        elif id(p) in inside:  # biases, the connections' norms and scalars
            members["hidden_vectors"].append(p)
        else:
            members["embeddings" if p.dim() >= 2 else "outer_vectors"].append(p)
    return [{"name": name, "params": members[name], "lr_scale": scale, "weight_decay": wd, "eps": eps}
            for name, (scale, wd) in groups.items() if members[name]]


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    """Every group's lr: the schedule's ``lr`` times the group's ``lr_scale`` (1 where it has none)."""
    for g in opt.param_groups:
        g["lr"] = lr * g.get("lr_scale", 1.0)


def group_notes(opt: torch.optim.Optimizer) -> dict[str, Any]:
    """The named groups' lr factor, weight decay, ε and tensor count, for config.json."""
    return {g["name"]: {"lr_scale": g["lr_scale"], "weight_decay": g["weight_decay"], "eps": g["eps"],
                        "tensors": len(g["params"])} for g in opt.param_groups if "name" in g}
