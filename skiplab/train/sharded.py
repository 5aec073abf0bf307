"""``--fsdp``: a language model's parameters, gradients and optimizer state sharded over torchrun's processes
with FSDP2 (``torch.distributed.fsdp.fully_shard``), its checkpoints through ``torch.distributed.checkpoint``.

Sharding changes how a run trains, not what: the micro-batches are shared out as under DDP (micro-batch k to
rank k mod N, the loss scaled by N), FSDP's reduce-scatter averages the gradients over the ranks after each
rank's last micro-batch only (:meth:`Sharded.no_sync`: ``set_requires_gradient_sync(False)`` before), and
every rank steps AdamW on its shard of every parameter, so N sharded processes make the updates of one
process with the same ``grad_accum`` (within float noise: the gradient norm that clipping uses is summed
from the shards, in another order).

The recipe (:func:`shard`) is FSDP2's usual one: ``fully_shard`` on every decoder layer, then on the root,
which takes the rest (embeddings, the final norm, the output projection, designs across the layers). A
layer that shares a parameter with another part of the model is left to the root. On CUDA with
``--amp`` (bf16 autocast) the layers' parameters are gathered in bf16 and the gradients reduced in float32
(``MixedPrecisionPolicy``); on the CPU everything stays float32.

Checkpoints (:func:`states`, :func:`save`, :func:`load_states`): every rank writes its shards of the model
and the optimizer into ``RUN/dcp/step_<n>/`` (DCP's ``.metadata`` and one ``.distcp`` file per rank), and
rank 0 writes last.pt as for any run, with everything else (step, RNG states of every rank, record, config,
telemetry) and the *full* model state dict (gathered to rank 0's CPU: ``eval lm``, ``generate``, ``average``,
``analyze`` and ``export`` read the run like any other); its ``optimizer`` is None and its ``dcp`` names the
folder, which ``--resume`` loads. Only the folder last.pt names is kept: it is written before last.pt and the
others are removed after, so a run killed at any moment leaves a last.pt whose shards exist.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.torch_version import TorchVersion

from .. import distributed, run_dir

DCP_DIR = "dcp"  # RUN/dcp/step_<n>/: the sharded model and optimizer of last.pt
# The oldest torch whose sharded runs make the updates of one process (tests/train/test_fsdp.py, run under each
# version: docs/results/card-torch/older-torch-on-amd-epyc-2026-11-30/): 2.6 lacks fully_shard's ignored_params;
# under 2.7-2.9 the runs train, but their gradient norm differs between the ranks and their updates from one process's.
FSDP_TORCH = "2.10"


def check(cfg: Any, group: distributed.Group) -> None:
    """Refuse ``--fsdp`` where it cannot shard as it should: a torch older than :data:`FSDP_TORCH`, or a run not
    started by torchrun (one line, before anything is written)."""
    if getattr(cfg, "fsdp", False) and TorchVersion(torch.__version__) < FSDP_TORCH:
        raise ValueError(f"--fsdp needs torch >= {FSDP_TORCH} (on older versions a sharded run does not make the "
                         f"updates of one process); this is torch {torch.__version__}")
    if getattr(cfg, "fsdp", False) and not group.active:
        raise ValueError("--fsdp shards over torchrun's processes; start the run with torchrun --nproc_per_node N "
                         "(or leave --fsdp out)")


def is_sharded(model: nn.Module | None) -> bool:
    """Whether ``model`` went through :func:`shard` (``fully_shard`` swaps its class in place); FSDP is not imported
    for the runs that do not shard."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return fsdp is not None and isinstance(model, fsdp.FSDPModule)


def units(model: nn.Module) -> list[nn.Module]:
    """The decoder layers that can be sharded apart: those sharing no parameter with the rest of ``model``
    (a design that ties parameters across layers leaves them to the root)."""
    def held(module: nn.Module) -> dict[int, int]:  # how often each parameter is held, counting every path to it
        counts: dict[int, int] = {}
        for _, m in module.named_modules(remove_duplicate=False):
            for p in m.parameters(recurse=False):
                counts[id(p)] = counts.get(id(p), 0) + 1
        return counts

    everywhere = held(model)
    kept = []
    for layer in getattr(model, "layers", []):
        inside = held(layer)
        if all(everywhere[i] == n for i, n in inside.items()):
            kept.append(layer)
    return kept


class Replicated:
    """The ranks' average of the gradients of the parameters left whole on every rank (:func:`shard`), as a hook
    of each: it holds no model, since a tensor's hooks are kept by its C++ side, out of the garbage collector's
    sight (a hook that held the model kept it, its FSDP states and their process group alive to the interpreter's
    exit, freed after the group had been destroyed)."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.sync = True  # whether this backward pass ends the update (its gradients are averaged over the ranks)

    def __call__(self, param: nn.Parameter) -> None:
        """``param``'s gradient averaged over the ranks once the update's last backward pass has accumulated it,
        as FSDP averages the shards' (sum, then / N)."""
        if self.sync and param.grad is not None:
            dist.all_reduce(param.grad)
            param.grad.div_(self.world_size)


class Sharded:
    """What the training loop calls in place of DDP's wrapper: ``net`` (the model, or its compiled form) forward,
    and :meth:`no_sync` for the micro-batches before a rank's last."""

    def __init__(self, net: nn.Module, model: nn.Module, group: distributed.Group) -> None:
        self.net, self.model, self.group = net, model, group
        self.replicated = Replicated(group.world_size)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.net(*args, **kwargs)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes that keep their (unsharded) gradients on this rank: no reduce-scatter until the last."""
        self.model.set_requires_gradient_sync(False)
        self.replicated.sync = False
        try:
            yield
        finally:
            self.model.set_requires_gradient_sync(True)
            self.replicated.sync = True


def shard(net: nn.Module, model: nn.Module, group: distributed.Group, amp: bool) -> Sharded:
    """``model`` sharded in place over ``group``'s processes (every decoder layer of :func:`units`, then the root);
    ``net`` is ``model`` or its compiled form. Make the optimizer after: it steps the shards.

    ``fully_shard`` refuses 0-dim parameters (ReZero's and SkipInit's α, PreDyT's α, HC's scalars): those stay
    whole on every rank (``ignored_params``), and a hook (:class:`Replicated`) averages their gradients over the
    ranks as FSDP does the others'; the gradient norm sums both kinds (``clip_grad_norm_`` takes the mixed list)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(torch.device(group.device).type, (group.world_size,))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if amp \
        else MixedPrecisionPolicy()
    scalars = {p for p in model.parameters() if p.dim() == 0}
    for layer in units(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy, ignored_params=scalars)
    fully_shard(model, mesh=mesh, mp_policy=policy, ignored_params=scalars)
    sharded = Sharded(net, model, group)
    for p in scalars:
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(sharded.replicated)
    return sharded


def eval_group(group: distributed.Group, model: nn.Module) -> distributed.Group:
    """The group evaluation shares its batches over: none for a sharded model, whose every forward pass needs every
    rank (FSDP gathers each layer's parameters from all of them), so each rank scores every batch."""
    return distributed.Group() if is_sharded(model) else group


# -- checkpoints ------------------------------------------------------------------------------------------------
def states(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The ``model`` and ``optimizer`` entries of a checkpoint; sharded: the full model (on rank 0, on the CPU;
    every rank must call this) and no optimizer (:func:`save` writes it with the model's shards)."""
    if not is_sharded(model):
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {"model": full, "optimizer": None}


def save(model: nn.Module, optimizer: torch.optim.Optimizer, out: Path, state: dict[str, Any],
         group: distributed.Group) -> dict[str, Any]:
    """``state`` as it goes to last.pt; sharded: every rank's shards of model and optimizer written first, to
    ``out/dcp/step_<n>/``, which ``state["dcp"]`` then names. Every rank calls it."""
    if not is_sharded(model):
        return state
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    name = f"{DCP_DIR}/step_{state['step']}"
    group.on_main(lambda: shutil.rmtree(out / name, ignore_errors=True))  # a killed run's leftover of this step
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=out / name)
    return {**state, "dcp": name}


def prune(out: Path, state: dict[str, Any], group: distributed.Group) -> None:
    """After last.pt is written: the shard folders other than the one it names removed (rank 0)."""
    name = state.get("dcp")
    if not name:
        return

    def remove() -> None:
        for old in (out / DCP_DIR).iterdir():
            if old.name != Path(name).name:
                shutil.rmtree(old, ignore_errors=True)

    group.on_main(remove)


def check_shards(path: Path) -> None:
    """A one-line error where a file the sharded checkpoint ``path`` names is not there (a shard deleted or never
    copied: dcp's traceback on every rank otherwise), checked before any rank starts reading."""
    missing = sorted(p.name for p in _shard_files(path) if not p.is_file())
    if missing:
        raise run_dir.RunDirError(f"{path}: missing {', '.join(missing)}; the shards of last.pt's model and optimizer "
                                  "are not all there")


def _shard_files(path: Path) -> list[Path]:
    """The files the sharded checkpoint ``path``'s .metadata names (its storage data: one file a rank and more)."""
    from torch.distributed.checkpoint import FileSystemReader

    try:
        meta = FileSystemReader(str(path)).read_metadata()
    except Exception as err:  # noqa: BLE001  an unreadable .metadata: said as one line
        raise run_dir.RunDirError(f"{path / '.metadata'}: unreadable ({' '.join(str(err).split())[:200]})") from None
    names = {getattr(info, "relative_path", None) for info in (meta.storage_data or {}).values()}
    return [path / n for n in sorted(n for n in names if n)]


def load_states(model: nn.Module, optimizer: torch.optim.Optimizer, ckpt: dict[str, Any], out: Path) -> None:
    """Model and optimizer from checkpoint ``ckpt`` of run ``out``; sharded: from the shards its ``dcp`` names
    (every rank calls it and loads its own)."""
    if not is_sharded(model):
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        return
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    name = ckpt.get("dcp")
    if not name:
        raise run_dir.RunDirError(f"{out / 'last.pt'} holds no sharded state (it was not written by an --fsdp run)")
    path = out / name
    if not (path / ".metadata").is_file():
        raise run_dir.RunDirError(f"{path}: missing; the shards of the model and optimizer of last.pt are not there")
    check_shards(path)
    model_state, optim_state = get_state_dict(model, optimizer)
    loaded = {"model": model_state, "optimizer": optim_state}
    try:
        dcp.load(loaded, checkpoint_id=path)
    except Exception as err:  # a shard cut short or corrupt: dcp's per-rank traceback, as one line naming the folder
        cause = " ".join(str(err).split())[:300] or type(err).__name__
        raise run_dir.RunDirError(f"{path}: the shards could not be read ({cause})") from None
    set_state_dict(model, optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optimizer"])
