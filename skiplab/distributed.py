"""Multi-process training under ``torchrun``: who this process is, the collectives the loops use, and
BatchNorm synchronised across processes.

``torchrun --nproc_per_node N -m skiplab train ...`` starts N processes and tells each its place through
the environment (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``). :func:`setup` reads it and joins the process
group: gloo on the CPU, NCCL on CUDA with rank r on ``cuda:LOCAL_RANK``. Without those variables it
returns the single-process :class:`Group`, and every helper here is then the identity or a no-op, so a
plain run does exactly what it did before multi-process training existed.

Rank 0 owns the run directory: :meth:`Group.on_main` runs a step there (writing a file, training the
tokenizer) and hands its result, or its error, to every rank, so a bad input stops all ranks with the
same one-line message instead of leaving some waiting at a collective.
"""

from __future__ import annotations

import datetime
import gc
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor, nn

T = TypeVar("T")
LAUNCH_VARS = ("WORLD_SIZE", "RANK", "LOCAL_RANK")


def launched() -> bool:
    """Whether this process was started by torchrun (``python -m torch.distributed.run``)."""
    return all(v in os.environ for v in LAUNCH_VARS)


def rank() -> int:
    """This process's rank from the environment (0 when not launched by torchrun)."""
    return int(os.environ.get("RANK", 0)) if launched() else 0


@dataclass(frozen=True)
class Group:
    """The processes training one run; ``backend`` "" is a single process without a process group."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str = ""
    device: str = "cpu"  # where the collectives' tensors live (NCCL needs them on the rank's GPU)

    @property
    def active(self) -> bool:
        return bool(self.backend)

    @property
    def main(self) -> bool:
        return self.rank == 0

    def describe(self) -> dict[str, Any]:
        """What config.json and checkpoints record of how the run was produced."""
        return {"world_size": self.world_size, "backend": self.backend or None}

    def part(self, n: int) -> slice:
        """This rank's contiguous share of n items: sizes differ by at most one, lower ranks take the extra."""
        q, r = divmod(n, self.world_size)
        start = self.rank * q + min(self.rank, r)
        return slice(start, start + q + (self.rank < r))

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sums over the ranks (float64)."""
        if not self.active:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.tolist()

    def gather(self, obj: T) -> list[T]:
        """Every rank's ``obj``, in rank order, on every rank."""
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def main_first(self, fn: Callable[[], T]) -> T:
        """``fn()`` on every rank, rank 0 first (it downloads what is missing); its error reaches every rank."""
        if not self.active:
            return fn()
        result: list[Any] = []
        self.on_main(lambda: result.append(fn()))
        return result[0] if self.main else fn()

    def on_main(self, fn: Callable[[], T]) -> T:
        """``fn()`` run on rank 0 alone; its result (or the error it raised) reaches every rank."""
        if not self.active:
            return fn()
        payload: list[Any] = [None]
        if self.main:
            try:
                payload[0] = ("ok", fn())
            except Exception as err:  # noqa: BLE001 - handed to every rank, raised there
                payload[0] = ("error", err)
        dist.broadcast_object_list(payload, src=0)
        status, value = payload[0]
        if status == "error":
            if not self.main:
                try:
                    value.raised_on_main = True  # the CLI prints it once, on rank 0
                except AttributeError:
                    pass
            raise value
        return value


class RaisedOnMain(ValueError):
    """What another rank raises where rank 0's step failed: rank 0 prints the error, once."""

    raised_on_main = True


def on_main_first(key: str, fn: Callable[[], None], timeout_s: float = 1800.0) -> None:
    """``fn()`` on rank 0 alone before the process group exists (a step that must be done before every rank reads
    its config: ``train lm --branch`` making the run directory), the other ranks waiting for it through torchrun's
    own key-value store (``TORCHELASTIC_USE_AGENT_STORE``: its agent serves one at ``MASTER_ADDR:MASTER_PORT``);
    where it failed they stop too (:class:`RaisedOnMain`). ``key`` names the step; not launched: ``fn()``."""
    if not launched():
        fn()
        return
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        raise ValueError(f"{key} under several processes needs torchrun's own store (a process started otherwise "
                         "has none): run this step with one process, then the training under torchrun")
    store = dist.PrefixStore(f"skiplab/{key}/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}",
                             dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                                           is_master=False, timeout=datetime.timedelta(seconds=timeout_s)))
    if rank() == 0:
        try:
            fn()
        except BaseException as err:
            store.set("done", f"error:{err}")
            raise
        store.set("done", "ok")
        return
    store.wait(["done"])
    status = store.get("done").decode()
    if status != "ok":
        raise RaisedOnMain(status.removeprefix("error:"))


def setup(device: torch.device) -> tuple[Group, torch.device]:
    """Join torchrun's process group where launched by it; the group and this rank's device.

    CUDA: NCCL, rank r on ``cuda:LOCAL_RANK``. CPU: gloo. Not launched: a single process on ``device``.
    """
    if not launched():
        return Group(), device
    rank_, world, local = (int(os.environ[v]) for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    if device.type == "cuda":
        if local >= torch.cuda.device_count():
            raise ValueError(f"local rank {local} has no GPU (this machine has {torch.cuda.device_count()}); "
                             "start at most that many processes per node")
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        backend = "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, device_id=device if backend == "nccl" else None)
    return Group(rank_, world, local, backend, str(device)), device


def shutdown() -> None:
    """Leave the process group, if this process joined one.

    A gloo worker thread frees a collective's tensors just after the collective has returned here, and takes the
    GIL to do so; one still at it when the interpreter exits aborts the process ("terminate called without an
    active exception": 4 of 72 two-process FSDP runs here). destroy_process_group joins those threads, but only
    where nothing else holds the group: so first the garbage collector frees what still holds it (FSDP2's states
    sit in reference cycles with their model, freed at the collector's next pass, which may come only at the
    interpreter's exit), then a pause, the GIL released, in which the threads finish (no abort in 100 such runs
    since)."""
    if dist.is_available() and dist.is_initialized():
        gc.collect()
        if dist.get_backend() == "gloo":
            time.sleep(0.1)
        dist.destroy_process_group()


def data_parallel(model: nn.Module, group: Group, *example: Tensor) -> nn.Module:
    """``model`` wrapped in DistributedDataParallel (it averages the gradients over the ranks).

    ``example``, inputs of the model, finds the parameters a forward pass leaves unused (NoSkip's
    projection shortcuts, say), which DDP must be told of; for other models it is not told, as looking
    for them costs a pass over the autograd graph every step."""
    if not group.active:
        return model
    ids = [torch.device(group.device)] if group.backend == "nccl" else None
    unused = unused_parameters(getattr(model, "_orig_mod", model), *example) if example else []
    return nn.parallel.DistributedDataParallel(model, device_ids=ids, find_unused_parameters=bool(unused))


def unused_parameters(model: nn.Module, *example: Tensor) -> list[str]:
    """The parameters that get no gradient from ``model(*example)``: a forward and backward pass in eval
    mode (no running statistics updated, no dropout drawn), after which every gradient is None again."""
    was_training = model.training
    model.eval()
    try:
        out = model(*example)
        torch.autograd.backward([t.float().sum() for t in (out if isinstance(out, (tuple, list)) else [out])])
        unused = [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None]
    finally:
        for p in model.parameters():
            p.grad = None
        model.train(was_training)
    return unused


def check_resume_world(saved: int, group: Group, where: str) -> None:
    """A run resumes with the number of processes it was trained with: batch shares and RNG states are per rank."""
    if saved != group.world_size:
        raise ValueError(f"{where} was trained by {saved} process{'es' if saved > 1 else ''}; resume it with the same "
                         f"number (torchrun --nproc_per_node {saved}), not {group.world_size}")


# -- synchronised BatchNorm -------------------------------------------------------------------------------
# torch.nn.SyncBatchNorm refuses CPU tensors (torch 2.13 allows only GPU-like devices), so skiplab has its
# own, for gloo and NCCL alike. The statistics of a training batch are those of the union of every
# rank's share: each rank's count n_r, mean m_r and biased variance v_r are gathered and combined,
#     n = Σ n_r,   μ = Σ n_r m_r / n,   σ² = Σ n_r (v_r + (m_r − μ)²) / n,
# and the backward pass all-reduces Σ g and Σ g·x̂ (x̂ = (x − μ)/σ), so that every rank's input gradient
#     ∂L/∂x = w/σ · (g − Σ g / n − x̂ · Σ g·x̂ / n)
# is the one a single process holding the union batch computes.


class _SyncNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, mean, invstd, weight, bias, count):  # x (N, C, *), statistics (C,)
        shape = (1, -1) + (1,) * (x.dim() - 2)
        xhat = (x.float() - mean.view(shape)) * invstd.view(shape)
        ctx.save_for_backward(x, mean, invstd, weight)
        ctx.count = count
        y = xhat if weight is None else xhat * weight.view(shape) + bias.view(shape)
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        if torch.is_grad_enabled():  # a backward asked for a graph (create_graph): the all-reduce below is none
            raise RuntimeError("synchronised BatchNorm has no second derivative across processes; a gradient penalty "
                               "or Hessian-vector product needs BatchNorm run in one process")
        x, mean, invstd, weight = ctx.saved_tensors
        shape = (1, -1) + (1,) * (x.dim() - 2)
        dims = [0] + list(range(2, x.dim()))
        g = g.float()
        xhat = (x.float() - mean.view(shape)) * invstd.view(shape)
        sums = torch.stack([g.sum(dims), (g * xhat).sum(dims)])  # this rank's Σ g, Σ g·x̂: (2, C)
        local = sums.clone()
        dist.all_reduce(sums)
        scale = invstd if weight is None else invstd * weight.float()
        dx = scale.view(shape) * (g - sums[0].view(shape) / ctx.count - xhat * sums[1].view(shape) / ctx.count)
        dw = db = None
        if weight is not None:
            dw, db = local[1].to(weight.dtype), local[0].to(weight.dtype)
        return dx.to(x.dtype), None, None, dw, db, None


def _sync_batch_norm(bn: nn.modules.batchnorm._BatchNorm, x: Tensor) -> Tensor:
    c = x.shape[1]
    dims = [0] + list(range(2, x.dim()))
    with torch.no_grad():
        n_r = x.numel() // c if c else 0
        if n_r:
            var_r, mean_r = torch.var_mean(x.float(), dims, correction=0)
        else:
            var_r = mean_r = torch.zeros(c, device=x.device)
        mine = torch.cat([mean_r, var_r, torch.tensor([float(n_r)], device=x.device)])
        every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(every, mine)
        table = torch.stack(every).double()  # (W, 2C + 1): means, variances, count
        counts, means, variances = table[:, -1:], table[:, :c], table[:, c : 2 * c]
        n = counts.sum()
        mean = (counts * means).sum(0) / n
        var = (counts * (variances + (means - mean) ** 2)).sum(0) / n
        if bn.track_running_stats and bn.running_mean is not None:
            bn.num_batches_tracked.add_(1)
            factor = 1.0 / float(bn.num_batches_tracked) if bn.momentum is None else bn.momentum
            bn.running_mean.mul_(1 - factor).add_(mean.to(bn.running_mean.dtype), alpha=factor)
            unbiased = var * n / (n - 1) if n > 1 else var
            bn.running_var.mul_(1 - factor).add_(unbiased.to(bn.running_var.dtype), alpha=factor)
        mean, invstd = mean.float(), torch.rsqrt(var + bn.eps).float()
    return _SyncNorm.apply(x, mean, invstd, bn.weight, bn.bias, float(n))


class SyncBatchNormMixin(nn.modules.batchnorm._BatchNorm):
    """Makes a BatchNorm layer normalise a training batch with the statistics of every rank's share.

    It is mixed in *after* the layer's own class (see :func:`sync_batch_norm`), so a subclass's own
    forward (skiplab's ``FeatureBatchNorm`` flattens positions first) still runs and reaches this one
    through ``super().forward``. Evaluation, and training outside a process group, are plain BatchNorm.
    """

    def forward(self, x: Tensor) -> Tensor:
        if not (self.training and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return super().forward(x)
        self._check_input_dim(x)
        return _EAGER["sync_batch_norm"](self, x)


_SYNC_CLASSES: dict[type, type] = {}
# _sync_batch_norm under torch.compiler.disable (collectives: a compiled model calls it eagerly), made by
# sync_batch_norm() and not at import: torch.compiler.disable imports dynamo, seconds that most commands never need
_EAGER: dict[str, Callable[..., Tensor]] = {}


def sync_batch_norm(model: nn.Module) -> nn.Module:
    """Every BatchNorm layer of ``model`` synchronised across the ranks, in place (state dict unchanged)."""
    if "sync_batch_norm" not in _EAGER:
        _EAGER["sync_batch_norm"] = torch.compiler.disable(_sync_batch_norm)
    for m in model.modules():
        cls = type(m)
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and not isinstance(m, SyncBatchNormMixin):
            if cls not in _SYNC_CLASSES:
                _SYNC_CLASSES[cls] = type(f"Sync{cls.__name__}", (cls, SyncBatchNormMixin), {})
            m.__class__ = _SYNC_CLASSES[cls]
    return model
