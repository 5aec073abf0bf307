"""Per-step telemetry of a training run: what happened at every update, not only at the evaluations.

Every update reports its loss, learning rate, the global gradient norm before clipping and whether it was
clipped, its tokens (or examples) and seconds. Every update enters the run's watch:

    spike(t)   ⇔  t > W  and  loss_t > K · median(loss_{t−W}, …, loss_{t−1})          W = 100, K = 1.25
    loss_spikes = #{t : spike(t)},  max_grad_norm = max_t ‖g_t‖₂,  clipped = #{t : ‖g_t‖₂ > clip}

(the median of the W updates before t, so a spike does not hide in its own window; nothing is counted in the
first W updates, where the loss falls fastest). Every ``every``-th update (and the last) is a line of
``steps.jsonl`` in the run directory::

    {"step": 120, "loss": 2.71, "lr": 0.00098, "grad_norm": 0.83, "clipped": false, "spike": false,
     "tokens_per_s": 20480.0, "model_flops_per_s": 3.1e10, "mfu": null, "peak_cuda_memory": null}

``model_flops_per_s`` is the model's FLOPs per token (``flops_per_token``; for the LM family 6N + 12·L·d·T,
N its weights less the position table, L layers, d the width, T the context: PaLM, Chowdhery et al. 2022,
Appendix B, 6N + 12·L·H·Q·T with H·Q = d, as nanoGPT's ``estimate_mfu`` counts it; the causal mask's saving is
not taken off) times tokens per second; ``mfu`` that over the
device's peak where it is known (:data:`skiplab.device.PEAK_BF16_TFLOPS`, bf16 dense, by the exact device name), else null; ``peak_cuda_memory`` the bytes
``torch.cuda.max_memory_allocated`` reports since the last line (null on the CPU).

Lines are held until the run saves and written with its checkpoint, and the watch's state (the window of
losses, the counts) is in the checkpoint: a resumed run cuts steps.jsonl back to its checkpoint's step and
goes on with the same counts, so its lines and summary equal the uninterrupted run's. The loggers
(:mod:`skiplab.interop.loggers`: TensorBoard, W&B, trackio) get every line as it is made; steps.jsonl stays
the record.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections import deque
from pathlib import Path
from typing import Any

import torch

from ..device import peak_tflops
from ..run_dir import STEPS_FILE, parse_records, read_steps

WINDOW, FACTOR = 100, 1.25  # a spike: a loss above FACTOR x the median of the WINDOW updates before it


def grad_norm(parameters: list[torch.nn.Parameter], clip: float) -> tuple[float, bool]:
    """The global 2-norm of the gradients before clipping, and whether clipping to ``clip`` (> 0) changed them."""
    if clip > 0:
        norm = float(torch.nn.utils.clip_grad_norm_(parameters, clip))
        return norm, norm > clip
    grads = [p.grad for p in parameters if p.grad is not None]
    return (float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0), False


class Telemetry:
    """The watch of one run (module docstring): ``update`` after every optimizer step, ``lines_until`` at a
    save, ``state``/``load_state`` through the checkpoint, ``summary`` at the end."""

    def __init__(self, every: int, flops_per_token: float = 0.0, device: torch.device | None = None,
                 loggers: Any = None) -> None:
        self.every, self.flops_per_token = every, flops_per_token
        self.device = device or torch.device("cpu")
        self.peak = peak_tflops(self.device)
        self.loggers = loggers
        self.losses: deque[float] = deque(maxlen=WINDOW)
        self.spikes, self.clipped, self.max_grad_norm = 0, 0, 0.0
        self.pending: list[dict[str, Any]] = []

    def update(self, step: int, loss: float, lr: float, norm: float, clipped: bool, tokens: int,
               seconds: float, last: bool = False) -> None:
        """Update ``step`` (from 1) is done: watch it, and make its line where it is one."""
        spike = len(self.losses) == WINDOW and loss > FACTOR * statistics.median(self.losses)
        self.losses.append(loss)
        self.spikes += spike
        self.clipped += clipped
        self.max_grad_norm = max(self.max_grad_norm, norm)
        if not (self.every and (step % self.every == 0 or last)):
            return
        rate = tokens / max(seconds, 1e-9)
        flops = rate * self.flops_per_token if self.flops_per_token else None
        cuda = self.device.type == "cuda"
        line = {"step": step, "loss": loss, "lr": lr, "grad_norm": norm, "clipped": clipped, "spike": spike,
                "tokens_per_s": rate, "model_flops_per_s": flops,
                "mfu": flops / (self.peak * 1e12) if flops and self.peak else None,
                "peak_cuda_memory": torch.cuda.max_memory_allocated(self.device) if cuda else None}
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        self.pending.append(line)
        if self.loggers is not None:
            self.loggers.log(line)

    def take(self) -> list[dict[str, Any]]:
        """The lines made since the last save (for it to write), and none pending after."""
        lines, self.pending = self.pending, []
        return lines

    def state(self) -> dict[str, Any]:
        return {"losses": list(self.losses), "spikes": self.spikes, "clipped": self.clipped,
                "max_grad_norm": self.max_grad_norm}

    def load_state(self, state: dict[str, Any] | None) -> None:
        if state:
            self.losses.extend(state["losses"])
            self.spikes, self.clipped, self.max_grad_norm = state["spikes"], state["clipped"], state["max_grad_norm"]

    def summary(self) -> dict[str, Any]:
        return {"loss_spikes": self.spikes, "max_grad_norm": self.max_grad_norm, "clipped_updates": self.clipped,
                "spike_rule": f"loss > {FACTOR:g} x the median of the {WINDOW} updates before it"}

    def close(self) -> None:
        if self.loggers is not None:
            self.loggers.close()


def append_lines(out: Path, lines: list[dict[str, Any]], name: str = STEPS_FILE) -> None:
    """Append ``lines`` to ``out``/steps.jsonl (or the file ``name``: layers.jsonl)."""
    if lines:
        with open(out / name, "a") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)


def cut_lines(out: Path, step: int, name: str = STEPS_FILE) -> None:
    """steps.jsonl (or the file ``name``) keeps the lines up to ``step`` (a resumed run's checkpoint), the rest
    cut, and a torn last line (a process killed while writing it) with them; a bad line before the last is an error
    naming the file and line (no killed process leaves one), and nothing is rewritten. The file is replaced whole, so
    a process killed while cutting leaves it as it was."""
    path = out / name
    if not path.is_file():
        return
    records, _ = parse_records(path, torn_last_ok=True, what="a line of per-step telemetry")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records if r.get("step", math.inf) <= step))
    os.replace(tmp, path)


def read_lines(out: Path) -> list[dict[str, Any]]:
    """The lines of ``out``/steps.jsonl ([] where the run has none)."""
    return read_steps(out)
