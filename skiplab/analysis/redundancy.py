"""How much each layer of a trained model changes its hidden state, and what the model loses without it: the
depth redundancy of the Mix-LN paper (Li et al., ICLR 2025, Fig. 1, after Gromov et al. 2024, "The Unreasonable
Ineffectiveness of the Deeper Layers", Eq. 7) and of "The Curse of Depth in Large Language Models" (Sun et al.
2025, Fig. 2 and Section 3.1).

Per stack of L blocks, h_0 is the hidden state entering block 1 and h_l the one leaving block l (entering
block l + 1); a stack of n residual streams (HC, mHC) stands for its state by their sum, what the stack's end
reads. The angular distance of states l and m is, averaged over the N real positions (tokens),

    d(l, m) = (1/N) Σ_t arccos( <h_l,t, h_m,t> / (‖h_l,t‖ ‖h_m,t‖) ) / π   ∈ [0, 1]

(0: the same direction, 1: opposite), for every pair l < m; ``k`` picks the curve d(l − 1, l − 1 + k) drawn
against the block l. The skipped-block loss of block l is the model's loss with block l replaced by the
identity (its input passed on unchanged; for a block that returns several states, its first arguments),

    ΔL_l = L(without block l) − L,   L = Σ_n L_n / Σ_n u_n

with L_n the example's summed loss and u_n its units (target tokens), on the same examples. Blocks that
change the state's shape (an image model's stages) have no identity; image runs are refused.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from torch import Tensor, nn
from tqdm import tqdm

from .report import integer_ticks, legend_labels, markdown, per_position, pyplot
from .trained import Trained


def angular_distance(a: Tensor, b: Tensor) -> Tensor:
    """arccos(cos(a, b)) / π per row of ``a``, ``b`` (..., D), in float64: 0 for the same direction, 1 for the
    opposite one. A zero row has no direction: its distance is NaN."""
    a, b = a.double(), b.double()
    cos = (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))
    return torch.arccos(cos.clamp(-1.0, 1.0)) / math.pi


def stream_state(x: Tensor, mask: Tensor | None) -> Tensor:
    """The hidden state a block's first input stands for: (B, T, D) as it is, n streams (B, T, n, D) summed; an
    image run's feature map (B, C, H, W), whose positions have no ``mask``, as it is (it is not n streams)."""
    return x.sum(-2) if x.dim() == 4 and mask is not None else x


class Skipped(nn.Module):
    """``block`` replaced by the identity: returns its first ``outputs`` arguments (one: the hidden state;
    two for a depth-wise LSTM layer's (out, cell)). What the model reads of the block outside its forward (a
    decoder layer's cross-attention projects the encoder's output once for all layers) is the block's own."""

    def __init__(self, block: nn.Module, outputs: int):
        super().__init__()
        self.block, self.outputs = block, outputs

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["block"], name)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return args[0] if self.outputs == 1 else tuple(args[: self.outputs])


def redundancy(tr: Trained, split: str = "test", examples: int = 200, seed: int = 0, k: int = 1,
               progress: bool = True) -> dict[str, Any]:
    """d(l, m) per stack and ΔL_l per block of ``tr`` on ``examples`` examples of ``split`` (in its order)."""
    if tr.kind == "image":
        raise ValueError("redundancy needs blocks that keep the hidden state's shape (LM and translation runs); "
                         "an image model's stages change it, so a block has no identity to stand in for it")
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    t0 = time.time()
    batches = list(tr.examples(split, examples, seed))
    blocks = tr.blocks()
    stacks = {tr.stage_of(b) for b in blocks}
    length = {s: sum(tr.stage_of(b) == s for b in blocks) for s in stacks}
    if k > min(length.values()):
        raise ValueError(f"k = {k} is more blocks than a stack has ({min(length.values())})")
    inputs: dict[str, Tensor] = {}
    leaving: dict[str, Tensor] = {}
    returned: dict[str, int] = {}

    def enter(name, args):
        inputs[name] = args[0]

    def leave(name, output):
        returned[name] = len(output) if isinstance(output, tuple) else 1
        leaving[name] = output[0] if isinstance(output, tuple) else output

    hooks = [h for name, b in blocks.items() for h in (
        b.register_forward_pre_hook(lambda m, a, name=name: enter(name, a)),
        b.register_forward_hook(lambda m, a, o, name=name: leave(name, o)))]
    sums = {s: torch.zeros(length[s] + 1, length[s] + 1, dtype=torch.float64) for s in stacks}
    counts = dict.fromkeys(stacks, 0)
    tr.model.eval()
    bar = tqdm(total=len(blocks) + 1, desc=f"redundancy {tr.path.name}", unit="pass", disable=not progress)
    try:
        with torch.no_grad():
            total = units = 0.0
            for ex in batches:
                inputs.clear()
                leaving.clear()
                out = tr.forward(ex)
                total += float(tr.losses(ex, out).double().sum())
                units += float(tr.units(ex))
                for s in stacks:
                    names = [f"{s}.{i}" for i in range(length[s])]
                    mask = tr.mask(ex, names[0])
                    states = [inputs[names[0]]] + [leaving[n] for n in names]
                    rows = torch.stack([per_position(stream_state(h, mask), mask, len(ex)) for h in states])  # (L+1, N, D)
                    unit = rows.double() / rows.double().norm(dim=-1, keepdim=True)
                    cos = torch.einsum("lnd,mnd->lmn", unit, unit).clamp(-1.0, 1.0)
                    sums[s] += (torch.arccos(cos) / math.pi).sum(-1)
                    counts[s] += rows.shape[1]
            bar.update()
            loss = total / units
            deltas = {}
            for name in blocks:
                original = tr.replace_block(name, Skipped(blocks[name], returned[name]))
                try:
                    skipped = sum(float(tr.losses(ex, tr.forward(ex)).double().sum()) for ex in batches)
                finally:
                    tr.replace_block(name, original)
                deltas[name] = skipped / units - loss
                bar.update()
    finally:
        bar.close()
        for h in hooks:
            h.remove()
    distance = {s: (sums[s] / counts[s]).tolist() for s in sorted(stacks)}
    rows = []
    for name in blocks:
        s, i = tr.stage_of(name), int(name.split(".")[1])
        d = distance[s]
        rows.append({"block": name, "stage": s, "distance_next": d[i][i + 1],
                     "distance_k": d[i][i + k] if i + k <= length[s] else None, "loss_skipped": loss + deltas[name],
                     "loss_increase": deltas[name]})
    return {"analysis": "redundancy", "run": str(tr.path), "label": tr.label, "split": split,
            "examples": sum(len(ex) for ex in batches), "positions": counts, "mode": "eval", "seed": seed, "k": k,
            "loss": loss, "loss_unit": "per target token (nats)", "distance": distance, "blocks": rows,
            "time_s": time.time() - t0, "config": tr.config}


def table(result: dict[str, Any]) -> str:
    k = result["k"]
    head = ["block", "d(h_in, h_out)", f"d(h_in, h_in+{k})" if k > 1 else "", "loss without it", "increase"]
    body = [[b["block"], b["distance_next"], "-" if b["distance_k"] is None else b["distance_k"],
             b["loss_skipped"], b["loss_increase"]] for b in result["blocks"]]
    if k == 1:
        head, body = head[:2] + head[3:], [r[:2] + r[3:] for r in body]
    return f"loss with every block: {result['loss']:.4f} {result['loss_unit']}\n\n" + markdown(head, body)


def figure(results: list[dict[str, Any]]):
    """Left: d(l − 1, l − 1 + k) against block l, per run. Middle: the first run's d(l, l + n) for every start l
    and span n (Gromov et al.'s figure; of one stack, named in the title). Right: the loss increase without block l, per run."""
    plt = pyplot()
    fig, (left, mid, right) = plt.subplots(1, 3, figsize=(16, 4.5))
    k = results[0]["k"]
    names = legend_labels(results)
    for i, r in enumerate(results):
        xs = range(1, len(r["blocks"]) + 1)
        key = "distance_next" if k == 1 else "distance_k"
        left.plot(xs, [math.nan if b[key] is None else b[key] for b in r["blocks"]], marker="o", ms=3,
                  color=f"C{i}", label=names[i])
        right.plot(xs, [b["loss_increase"] for b in r["blocks"]], marker="o", ms=3, color=f"C{i}", label=names[i])
    first = results[0]
    stack = sorted(first["distance"])[-1]
    d = first["distance"][stack]
    size = len(d)
    grid = [[d[l][l + n] if l + n < size else math.nan for n in range(1, size)] for l in range(size - 1)]
    image = mid.imshow(grid, origin="lower", aspect="auto", cmap="viridis", vmin=0,
                       extent=(0.5, size - 0.5, -0.5, size - 1.5))
    fig.colorbar(image, ax=mid, label="angular distance")
    left.set_xlabel("block l (input side first)")
    left.set_ylabel(f"d(h_l−1, h_l−1+{k})")
    left.set_ylim(bottom=0)
    mid.set_xlabel("blocks spanned n")
    mid.set_ylabel("first state l")
    mid.set_title(f"{names[0]} ({stack}): d(h_l, h_l+n)", fontsize=9)
    right.set_xlabel("block l skipped (replaced by the identity)")
    right.set_ylabel(f"loss increase ({first['loss_unit']})")
    right.set_yscale("symlog", linthresh=1e-3)
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    integer_ticks(left, right)
    integer_ticks(mid, y=True)
    fig.suptitle(f"redundancy, {first['examples']} {first['split']} examples")
    fig.tight_layout()
    return fig
