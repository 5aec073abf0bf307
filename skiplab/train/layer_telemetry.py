"""Per-layer telemetry of a language-model run (``train lm --log-layers N``): how every sub-layer's share of the
residual stream, its gradients and its updates move while it trains (the questions of depth: which layers grow
before a spike; OLMo-core's ``ResidualStream`` hooks and GAP monitor, Marin #1368).

Every N-th update (step s with s mod N = 0) is watched; for every sub-layer j (attention or MLP of layer i, named
``i.attn`` / ``i.mlp``, i from 0) of the update's first micro-batch on this process:

    stream_rms       = sqrt(mean x²)          x the residual stream entering the sub-layer (n hyper-connection
                                              streams: their sum, as ``analyze norms`` takes them)
    branch_rms       = sqrt(mean F²)          F the branch's output (the attention's or MLP's, before the
                                              sub-layer's dropout and any scale the connection puts on F)
    branch_ratio     = branch_rms / stream_rms  (what x + F writes; a scaled F writes that times its scale)
    max_over_median  = max |y| / median |y|   y the sub-layer's output (the stream it hands on; streams summed):
                                              massive activations (Sun et al. 2024, "Massive Activations in
                                              Large Language Models", Section 2)
    grad_norm        = ‖g_j‖₂                 the gradient of the sub-layer's parameters (its branch's and its
                                              connection's), of the whole update, before clipping
    update_ratio     = ‖W_j,s − W_j,s−1‖₂ / ‖W_j,s−1‖₂
                                              the update the step made (``after_step`` included)

(each norm over the sub-layer's parameters together), and ``final_norm``'s ``input_rms``, the RMS of what the
stack's final norm reads (streams summed). Where the sub-layer's connection (or the final norm) has DyT layers
(``PreDyT``, the ``+DyT`` designs), also

    dyt_saturated    = share of the entries x of its DyT layers' inputs with |α·x| > 2 (tanh's flat range,
                       tanh' < 0.071: :meth:`~skiplab.connections.norms.DyT.saturated`; ``skiplab analyze
                       saturation`` reads the same from a run's checkpoints)

One line of ``layers.jsonl`` per watched update::

    {"step": 20, "layers": {"0.attn": {"stream_rms": 1.0, "branch_rms": 0.4, ...}, ..., "final_norm": {...}}}

and the loggers get every figure as a scalar ``layers/<sub-layer>/<quantity>``.

How the figures are taken: forward hooks on the connections (their input x and output y) and on the branch modules
(F), registered for the watched update's forward passes and removed after, so that the other updates run the model
as it is, and none of them changes a number of the training (tested to the bit). A design across the stack that
runs the sub-layers itself (``+AttnRes``, ``+MUDD``) does not call the connection's forward but its
``branch_input`` on the input it gives the sub-layer: that call is watched in its place, and the sub-layer's output
is then the input of the next sub-layer (of the last, the final norm's). A value is taken the first time it is seen
in the update (activation checkpointing runs a layer again in the backward pass).

Under ``--fsdp`` the parameters are shards: every process adds up the squares of its shards (and of the 0-dim
parameters it holds whole), the sums are added over the processes in one all-reduce, and the gradient norms and
update ratios are those of the full parameters; the activations are rank 0's first micro-batch, as on one process.
Under ``--compile`` the option is refused (the hooks would enter the compiled graph).

Lines are held until the run saves and written before its checkpoint; a resumed run cuts layers.jsonl back to its
checkpoint's step, and its line-making state (the spikes seen) is in the checkpoint, so a stopped and resumed run
writes the layers.jsonl of an uninterrupted one.

Where a loss spike is flagged (:mod:`skiplab.train.telemetry`'s rule), the summary names the sub-layers whose
gradient norms rose first (:func:`spike_sources`).
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import Tensor, nn

from ..connections import iter_connections
from ..connections.norms import DyT
from ..run_dir import LAYERS_FILE, read_steps
from . import telemetry

QUANTITIES = ("stream_rms", "branch_rms", "branch_ratio", "max_over_median", "grad_norm", "update_ratio")
FINAL = "final_norm"
BRANCHES = {"conn_attn": "attn", "conn_mlp": "mlp"}  # a GPT layer's connection -> the module its branch runs
RECENT, RISE = 4, telemetry.FACTOR  # spike_sources: the watched updates looked at, and what counts as a rise


def sublayers(model: nn.Module) -> list[tuple[str, nn.Module, nn.Module, list[nn.Parameter]]]:
    """(name ``i.attn`` / ``i.mlp``, connection, branch module, parameters) of every sub-layer of a GPT, in order;
    the parameters are the branch's and the connection's."""
    out = []
    for i, layer in enumerate(model.layers):
        for name, conn in iter_connections(layer):
            if name not in BRANCHES:
                continue
            branch = getattr(layer, BRANCHES[name])
            params = list({id(p): p for m in (branch, conn) for p in m.parameters() if p.requires_grad}.values())
            out.append((f"{i}.{BRANCHES[name]}", conn, branch, params))
    return out


def _streams(x: Tensor) -> Tensor:
    """One state: (B, T, D) as it is, hyper-connections' (B, T, n, D) summed over the n streams."""
    return x.sum(-2) if x.dim() == 4 else x


def _rms(x: Tensor) -> Tensor:
    return x.detach().float().pow(2).mean().sqrt()


def _max_over_median(y: Tensor) -> Tensor:
    a = y.detach().float().abs().flatten()
    return a.max() / a.median()


def _saturated(dyt: DyT, x: Tensor) -> Tensor:
    """(entries of ``x`` in the flat range of ``dyt``'s tanh, entries of ``x``), float32."""
    return torch.stack([dyt.saturated(x).sum().float(), torch.tensor(float(x.numel()), device=x.device)])


def _local(t: Tensor) -> Tensor:
    """This process's part of ``t``: its shard of an FSDP parameter (a DTensor), else ``t`` itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def _squares(tensors: list[Tensor], device: torch.device) -> Tensor:
    """(Σ t² over the sharded tensors of ``tensors``, this process's shards of them; Σ t² over the others, whole on
    every process), a float32 tensor of 2."""
    sums = [torch.zeros((), device=device), torch.zeros((), device=device)]
    for t in tensors:
        k = 0 if hasattr(t, "to_local") else 1
        sums[k] = sums[k] + _local(t).detach().float().pow(2).sum()
    return torch.stack(sums)


class LayerWatch:
    """The per-layer watch of one run (module docstring): ``due(s)`` before update s; on a due update
    ``watching()`` around its micro-batches, ``gradients()`` after its backward passes (before clipping),
    ``snapshot()`` before the optimizer step and ``update(s)`` after it; ``note_spike(s)`` for every flagged
    spike; ``take`` at a save; ``state``/``load_state`` through the checkpoint."""

    def __init__(self, model: nn.Module, every: int, loggers: Any = None) -> None:
        self.model, self.every, self.loggers = model, every, loggers
        self.subs = sublayers(model)
        # the DyT layers of each sub-layer's connection and of the final norm (dyt_saturated)
        self.dyts = {name: [m for m in conn.modules() if isinstance(m, DyT)] for name, conn, _, _ in self.subs}
        self.dyts[FINAL] = [m for m in model.norm.modules() if isinstance(m, DyT)]
        # --fsdp: the parameters are shards (DTensors), whose sums of squares are added over the processes
        self.sharded = any(hasattr(p, "to_local") for _, _, _, ps in self.subs for p in ps)
        self.pending: list[dict[str, Any]] = []
        self.spikes: list[int] = []
        self._seen: dict[tuple[str, str], Tensor] = {}
        self._grads: dict[str, Tensor] = {}
        self._before: dict[str, list[Tensor]] = {}
        # the sub-layer before each (the final norm's: the last): whose output another's input stands in for
        names = [name for name, _, _, _ in self.subs]
        self._previous = dict(zip([*names[1:], FINAL], names))

    def due(self, step: int) -> bool:
        """Whether update ``step`` (from 1) is watched."""
        return bool(self.every) and step % self.every == 0

    def _keep(self, name: str, what: str, value: Callable[[], Tensor]) -> None:
        if (name, what) not in self._seen:
            self._seen[(name, what)] = value()

    def _enter(self, name: str, x: Tensor) -> None:
        """What sub-layer ``name`` reads: its stream's RMS, and the size of its largest entry, which stands in for
        the previous sub-layer's output where a design across the stack runs it (no output of the previous
        connection seen): taken only then, a median being a pass over the stream that a watched update would
        otherwise make twice."""
        self._keep(name, "x", lambda: _rms(_streams(x)))
        previous = self._previous.get(name)
        if previous is not None and (previous, "y") not in self._seen:
            self._keep(name, "in", lambda: _max_over_median(_streams(x)))

    @contextmanager
    def watching(self) -> Iterator[None]:
        """The hooks on, for the forward passes inside the block (the update's first one is kept)."""
        self._seen = {}
        hooks, patched = [], []
        for name, conn, branch, _ in self.subs:
            hooks.append(conn.register_forward_pre_hook(lambda m, a, name=name: self._enter(name, a[0])))
            hooks.append(conn.register_forward_hook(
                lambda m, a, y, name=name: self._keep(name, "y", lambda: _max_over_median(_streams(y)))))
            hooks.append(branch.register_forward_hook(
                lambda m, a, f, name=name: self._keep(name, "f", lambda: _rms(f))))
            if getattr(conn, "additive", False):  # a design across the stack calls it in the forward's place
                def watched(x: Tensor, name=name, real=conn.branch_input) -> Tensor:
                    self._enter(name, x)
                    return real(x)
                conn.branch_input = watched
                patched.append(conn)
        hooks.append(self.model.norm.register_forward_pre_hook(lambda m, a: self._enter(FINAL, a[0])))
        for name, dyts in self.dyts.items():
            for k, dyt in enumerate(dyts):
                hooks.append(dyt.register_forward_pre_hook(
                    lambda m, a, name=name, k=k: self._keep(name, f"dyt{k}", lambda: _saturated(m, a[0]))))
        try:
            yield
        finally:
            for h in hooks:
                h.remove()
            for conn in patched:
                del conn.branch_input  # the class's method again

    @torch.no_grad()
    def gradients(self) -> None:
        """Every sub-layer's Σ g² (its gradient norm's square), before clipping."""
        self._grads = {name: _squares([p.grad for p in params if p.grad is not None], _local(params[0]).device)
                       for name, _, _, params in self.subs}

    @torch.no_grad()
    def snapshot(self) -> None:
        """The weights before the optimizer step (a copy, on watched updates alone)."""
        self._before = {name: [p.detach().clone() for p in params] for name, _, _, params in self.subs}

    @torch.no_grad()
    def update(self, step: int) -> dict[str, Any]:
        """Update ``step`` is done: its line (held for the next save, and to the loggers). Under --fsdp every
        process calls it: the sums of squares of the parameters are added over the processes (one all-reduce),
        the activations are this process's."""
        seen, names = self._seen, [s[0] for s in self.subs]
        rows = []
        for name, _, _, params in self.subs:  # (sub-layers, 3, 2): Σ g², Σ ΔW², Σ W²
            g, before = self._grads[name], self._before[name]
            rows.append(torch.stack([g, _squares([p - b for p, b in zip(params, before)], g.device),
                                     _squares(before, g.device)]))
        sums = torch.stack(rows)
        shards, whole = sums.unbind(-1)
        if self.sharded:  # the shards' sums added over the processes; the whole tensors' are every process's
            shards = shards.contiguous()
            torch.distributed.all_reduce(shards)
        grad, delta, weight = (shards + whole).sqrt().unbind(-1)
        values: dict[str, dict[str, Tensor]] = {}
        for k, name in enumerate(names):
            x, f = seen[(name, "x")], seen[(name, "f")]
            # no forward of the connection (a design across the stack ran it): what the next sub-layer reads
            after = names[k + 1] if k + 1 < len(names) else FINAL
            massive = seen[(name, "y")] if (name, "y") in seen else seen[(after, "in")]
            values[name] = {"stream_rms": x, "branch_rms": f, "branch_ratio": f / x, "max_over_median": massive,
                            "grad_norm": grad[k], "update_ratio": delta[k] / weight[k]}
        values[FINAL] = {"input_rms": seen[(FINAL, "x")]}
        for name, dyts in self.dyts.items():
            counts = [seen[(name, f"dyt{k}")] for k in range(len(dyts)) if (name, f"dyt{k}") in seen]
            if counts:  # (saturated entries, entries) over the connection's DyT layers
                total = torch.stack(counts).sum(0)
                values[name]["dyt_saturated"] = total[0] / total[1]
        flat = [(n, q) for n, qs in values.items() for q in qs]
        numbers = torch.stack([values[n][q].float().reshape(()) for n, q in flat]).tolist()  # one sync
        layers: dict[str, dict[str, float]] = {}
        for (n, q), v in zip(flat, numbers):
            layers.setdefault(n, {})[q] = v
        line = {"step": step, "layers": layers}
        self.pending.append(line)
        self._seen, self._grads, self._before = {}, {}, {}
        if self.loggers is not None:
            self.loggers.scalars({f"layers/{n}/{q}": v for n, qs in layers.items() for q, v in qs.items()}, step)
        return line

    def note_spike(self, step: int) -> None:
        """Update ``step`` was flagged a loss spike."""
        self.spikes.append(step)

    def take(self) -> list[dict[str, Any]]:
        lines, self.pending = self.pending, []
        return lines

    def state(self) -> dict[str, Any]:
        return {"spikes": list(self.spikes)}

    def load_state(self, state: dict[str, Any] | None) -> None:
        if state:
            self.spikes = list(state["spikes"])


def spike_sources(lines: list[dict[str, Any]], spikes: list[int]) -> list[dict[str, Any]]:
    """For every flagged spike at update t, the sub-layers whose gradient norms rose first before it.

    From the last ``RECENT`` watched updates u_0 < … < u_m before t (m ≥ 1), sub-layer j's rise at u_i is
    r_j(u_i) = g_j(u_i) / g_j(u_0) (g its gradient norm); j rose at the first u_i (i ≥ 1) with r_j(u_i) > 1.25 (the
    spike rule's factor, :data:`skiplab.train.telemetry.FACTOR`). Named: the sub-layers that rose at the earliest
    such u_i, the largest rise first (``first_rose``; empty where none rose or fewer than two watched updates
    precede the spike), and ``at``, that update."""
    report = []
    for t in spikes:
        before = [x for x in lines if x["step"] < t][-RECENT:]
        entry: dict[str, Any] = {"step": t, "first_rose": [], "at": None, "watched": [x["step"] for x in before]}
        if len(before) >= 2:
            base = before[0]["layers"]
            for x in before[1:]:
                rises = {n: q["grad_norm"] / base[n]["grad_norm"] for n, q in x["layers"].items()
                         if "grad_norm" in q and base[n]["grad_norm"] > 0}
                rose = sorted((n for n, r in rises.items() if r > RISE), key=lambda n: -rises[n])
                if rose:
                    entry.update(first_rose=rose, at=x["step"])
                    break
        report.append(entry)
    return report


def append_lines(out: Path, lines: list[dict[str, Any]]) -> None:
    """Append ``lines`` to ``out``/layers.jsonl."""
    telemetry.append_lines(out, lines, LAYERS_FILE)


def cut_lines(out: Path, step: int) -> None:
    """layers.jsonl keeps the lines up to ``step`` (a resumed run's checkpoint)."""
    telemetry.cut_lines(out, step, LAYERS_FILE)


def read_lines(out: str | Path) -> list[dict[str, Any]]:
    """The lines of ``out``/layers.jsonl ([] where the run has none)."""
    return read_steps(out, LAYERS_FILE)
