"""The layer non-linearity probe (Section 4 of the depth-wise LSTM paper, Eqs. 11-12, Tables 6-7).

A layer of the trained model, y = F(x) (Eq. 11), connections included, is replaced by a linear map

    y = W_d x + b_d                                                     (Eq. 12)

one matrix shared by every position (an image block: a 1x1 convolution, strided where the block is; a
depth-wise LSTM layer: x and y are its (out, cell) pairs, concatenated; a replaced decoder layer sees no
encoder output, the layers around it still do). Everything else stays frozen. W_d, b_d start from the
least-squares fit of the layer's outputs on its inputs over a sample of training positions, then
train for ``steps`` updates on the task loss (``objective="task"``, the paper's choice) or on the
squared error to the layer's own output (``objective="regress"``). The whole model is then scored:
BLEU (beam search) for translation, error % for images, and

    Δ% = 100 · (m' − m) / m

against the untouched model's m (undefined, reported as null, where m = 0). For BLEU a negative Δ is a
loss; for an error rate a positive Δ is.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm import tqdm

from .report import markdown, pyplot
from .trained import Trained

OBJECTIVES = ("task", "regress")


class LinearLayer(nn.Module):
    """y = W_d x + b_d in place of a layer: takes the layer's call, reads its first ``n_state`` tensors."""

    def __init__(self, original: nn.Module, d_in: int, d_out: int, n_state: int, widths: list[int], stride: int = 0):
        super().__init__()
        self.n_state, self.widths = n_state, widths
        self.map = nn.Conv2d(d_in, d_out, 1, stride=stride) if stride else nn.Linear(d_in, d_out)
        if hasattr(original, "cross_attn"):  # the decoder stack still projects the source for every layer
            self.cross_attn = original.cross_attn

    def forward(self, *args: Any) -> Tensor | tuple[Tensor, ...]:
        x = torch.cat(args[: self.n_state], dim=-1) if self.n_state > 1 else args[0]
        y = self.map(x)
        return tuple(y.split(self.widths, dim=-1)) if self.n_state > 1 else y

    @torch.no_grad()
    def fit(self, x: Tensor, y: Tensor) -> float:
        """Least squares: W_d, b_d minimising ‖[x 1][W_d b_d]^T − y‖ over rows; the relative residual."""
        a = torch.cat([x, torch.ones(len(x), 1)], 1).double()
        sol = torch.linalg.lstsq(a, y.double(), driver="gelsd").solution  # (d_in + 1, d_out)
        w, b = sol[:-1].T.float(), sol[-1].float()
        self.map.weight.copy_(w.view_as(self.map.weight))
        self.map.bias.copy_(b)
        return ((a @ sol - y.double()).norm() / y.double().norm().clamp_min(1e-12)).item()


def _state(value: Any) -> list[Tensor]:
    return list(value) if isinstance(value, tuple) else [value]


def _rows(t: Tensor, mask: Tensor | None, stride: int = 1) -> Tensor:
    """Positions as rows: (N, features). Images: every (strided) pixel; MT: real tokens only."""
    if t.dim() == 4:
        return t[:, :, ::stride, ::stride].permute(0, 2, 3, 1).reshape(-1, t.shape[1])
    return t[mask]


def linearity(tr: Trained, layers: list[str], steps: int = 100, objective: str = "task", sample: int = 20000,
              lr: float = 1e-3, beam: int = 4, score_start: bool = False, seed: int = 0,
              progress: bool = True) -> dict[str, Any]:
    """Probe each of ``layers`` in turn (the others untouched); ``score_start`` also scores the model at the
    least-squares start, before the ``steps`` updates."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be task or regress, got {objective!r}")
    blocks = tr.blocks()
    unknown = [name for name in layers if name not in blocks]
    if unknown or not layers:
        raise ValueError(f"{tr.path}: no layer {', '.join(unknown) or '(none given)'}; its layers: {', '.join(blocks)}")
    frozen = [p for p in tr.model.parameters() if p.requires_grad]
    for p in frozen:  # everything but W_d, b_d; given back below, whatever happens
        p.requires_grad_(False)
    tr.model.eval()
    try:
        t0 = time.time()
        name = tr.metric
        metric, scored, extra = tr.score_test(beam, progress)
        rows = []
        for layer in layers:
            t_layer = time.time()
            original = blocks[layer]
            xs, ys, shapes = _capture(tr, layer, original, sample, seed)
            stride = shapes["stride"]
            lin = LinearLayer(original, xs.shape[1], ys.shape[1], shapes["n_state"], shapes["widths"], stride)
            residual = lin.fit(xs, ys)
            tr.replace_block(layer, lin)
            try:
                before = tr.score_test(beam, False)[0] if score_start else None
                _train(tr, layer, lin, original, steps, objective, lr, seed, progress)
                score, _, score_extra = tr.score_test(beam, progress)
            finally:
                tr.replace_block(layer, original)
            kind = f"{type(lin.map).__name__} {xs.shape[1]} -> {ys.shape[1]}" + (f", stride {stride}" if stride else "")
            rows.append({"layer": layer, name: score, "delta_pct": 100.0 * (score - metric) / metric if metric else None,
                         **score_extra,
                         f"{name}_least_squares": before, "lsq_relative_residual": residual, "fit_rows": len(xs),
                         "map": kind, "time_s": time.time() - t_layer})
    finally:
        for p in frozen:
            p.requires_grad_(True)
    return {"analysis": "linearity", "run": str(tr.path), "label": tr.label, "metric": name, "untouched": metric,
            **{f"untouched_{k}": v for k, v in extra.items()},
            "split": "test", "examples": scored, "unit": tr.scored_unit,
            "mode": "eval", "objective": objective, "steps": steps, "lr": lr, "sample": sample, "beam": beam,
            "seed": seed, "sign": f"{tr.metric_title}: {'negative' if tr.higher_is_better else 'positive'} Δ% is a loss",
            "layers": rows, "time_s": time.time() - t0, "config": tr.config}


@torch.no_grad()
def _capture(tr: Trained, layer: str, module: nn.Module, sample: int, seed: int):
    """Rows of (input, output) of ``layer`` over training examples, up to ``sample`` rows."""
    got: dict[str, Any] = {}
    handle = module.register_forward_hook(lambda m, args, out: got.update(args=args, out=out))
    xs, ys, shapes = [], [], {}
    n = 0
    try:
        for ex in tr.examples("train", 10**9, seed=seed + 1, batch=100, shuffle=True):
            tr.forward(ex)
            out = _state(got["out"])
            ins = list(got["args"][: len(out)])
            mask = tr.mask(ex, layer)
            stride = ins[0].shape[-1] // out[0].shape[-1] if ins[0].dim() == 4 else 0
            shapes = {"n_state": len(out), "widths": [t.shape[-1] for t in out], "stride": stride}
            xs.append(torch.cat([_rows(t, mask, stride or 1) for t in ins], 1))
            ys.append(torch.cat([_rows(t, mask) for t in out], 1))
            n += len(xs[-1])
            if n >= sample:
                break
    finally:
        handle.remove()
    return torch.cat(xs)[:sample], torch.cat(ys)[:sample], shapes


def _train(tr: Trained, layer: str, lin: LinearLayer, original: nn.Module, steps: int, objective: str, lr: float,
           seed: int, progress: bool) -> None:
    """``steps`` Adam updates of W_d, b_d alone, on the task loss or on the layer's own output."""
    if not steps:
        return
    opt = torch.optim.Adam(lin.parameters(), lr=lr)
    batches = tr.examples("train", 10**9, seed=seed + 2, batch=128, shuffle=True)
    bar = tqdm(total=steps, desc=f"linear {layer}", unit="step", disable=not progress)
    teacher: dict[str, Any] = {}
    for _ in range(steps):
        ex = next(batches, None)
        if ex is None:
            batches = tr.examples("train", 10**9, seed=seed + 3, batch=128, shuffle=True)
            ex = next(batches)
        opt.zero_grad(set_to_none=True)
        if objective == "task":
            out = tr.forward(ex)
            loss = tr.mean_loss(ex, out)
        else:  # the layer's own output, on the inputs the frozen model gives it
            tr.replace_block(layer, original)
            handle = original.register_forward_hook(lambda m, args, out: teacher.update(args=args, out=out))
            with torch.no_grad():
                tr.forward(ex)
            handle.remove()
            tr.replace_block(layer, lin)
            pred = _state(lin(*teacher["args"]))
            loss = sum(F.mse_loss(p, t) for p, t in zip(pred, _state(teacher["out"])))
        loss.backward()
        opt.step()
        bar.update(1)
    bar.close()


def table(result: dict[str, Any]) -> str:
    name = result["metric"]
    dash = lambda v: "-" if v is None else v  # noqa: E731
    body = [["none", result["untouched"], 0.0, "-", "-"]]
    body += [[r["layer"], r[name], dash(r["delta_pct"]), dash(r[f"{name}_least_squares"]), r["lsq_relative_residual"]]
             for r in result["layers"]]
    head = ["layer replaced", f"{name}", "Δ (%)", f"{name} at the least-squares start", "least-squares rel. residual"]
    if all(r[f"{name}_least_squares"] is None for r in result["layers"]):
        head.pop(3)
        body = [r[:3] + r[4:] for r in body]
    return (markdown(head, body) + f"\n\n{result['steps']} updates of W_d, b_d ({result['objective']} objective, "
            f"lr {result['lr']:g}) after a least-squares start on {result['sample']} positions; {result['sign']}.")


def figure(results: list[dict[str, Any]]):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, r in enumerate(results):
        ax.bar([x + 0.8 * i / len(results) for x in range(len(r["layers"]))], [x["delta_pct"] or 0.0 for x in r["layers"]],
               width=0.8 / len(results), label=r["label"], color=f"C{i}")
    ax.set_xticks(range(len(results[0]["layers"])), [x["layer"] for x in results[0]["layers"]], rotation=45)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_ylabel(f"Δ {results[0]['metric']} (%) with the layer linear")
    ax.set_title(f"layer non-linearity probe ({results[0]['steps']} updates, {results[0]['objective']} objective)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
