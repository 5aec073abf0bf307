"""The ``gpu`` group of ``skiplab bench``: GPT-2 124M training steps on one card, against the card's peak, a
reference implementation and every design.

The shape is GPT-2 small's (``gpt2-small``: 12 layers, d 768, 12 heads, context 1,024, learned positions, tied
output) with the vocabulary padded to 50,304 rows (nanoGPT's 50,257 rounded up to a multiple of 64). A step is
bf16 autocast, SDPA (``is_causal``: the flash kernel on bf16 inputs), the output layer and the loss, backward, and
fused AdamW. ``torch.compile`` runs per layer: every decoder layer is compiled in place, so one compiled graph
serves all twelve (dynamo traces a module's ``forward`` once for every instance of that class and shape), and the
output layer with the loss is one more compiled function; compile time stays that of one layer, not of twelve.

Rows, in order, each written as soon as it is measured (a run cut short keeps what it had):

1. the card and the rate of a bf16 (n x n) @ (n x n) product (best of 5): what its tensor cores reach;
2. skiplab's compiled PreLN: step time, tokens/s, model FLOP/s and MFU, peak memory; the eager step beside it.
   Model FLOPs per token are 6N + 12·L·d·T (PaLM, Chowdhery et al. 2022, Appendix B; N the weights less the
   position table), MFU their rate over the card's dense bf16 peak (:data:`skiplab.device.PEAK_BF16_TFLOPS`,
   matched by the exact device name; an unknown card, or a CPU, gets no MFU and the row says why);
3. PreLN with its output layer and loss fused (:mod:`skiplab.models.linear_ce`: ``chunked``, then liger-kernel's
   ``liger`` where it imports and the card is CUDA): its step over the compiled eager head's, its peak memory and
   the rows that fit, and its loss and gradients against the eager head's on the model's states;
4. transformers' ``GPT2LMHeadModel`` of the same shape (SDPA attention, each block compiled the same way, the same
   compiled output layer and loss) on the same batch: skiplab's step over its step;
5. each design's compiled step over compiled PreLN's, the two timed in turn in one loop; its peak memory, the
   largest batch that fits the card (estimated: the step's memory above the weights and optimizer state grows
   linearly in the rows), its compile seconds, graph breaks and recompiles (dynamo's counters). A design whose
   recipe builds another model (nGPT: SwiGLU, rotary positions, no biases, untied output) is divided by PreLN built
   with those fields (its own cost, the goal's row) and, in a second row, by the preset's PreLN (the whole model).

The design rows start no new design once ``budget_s`` seconds of the group have passed; the designs not reached
are listed in the last row. On a CPU every row runs at smoke size (a tiny model; compile on the ``eager``
backend), which is what the test suite checks: every row is produced.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..compiled import CompileStats, compile_layers, raise_recompile_limit
from ..device import peak_note, peak_tflops
from ..models.linear_ce import linear_cross_entropy
from .steps import build, recipe_fields, show_fields
from .timing import Row, interleaved

# the pool's designs, the ones the GPU evidence track trains first, first (each newer design as it lands)
GPU_DESIGNS = ("PostLN", "PeriLN", "HC", "mHC", "PreLN+ValueRes", "2rSkip+LN", "SAS", "SandwichLN", "DeepNorm",
               "Admin", "MixLN", "LNS", "LayerScale", "ReZero", "PreDyT", "PreLN+UNet", "PreLN+DenseFormer",
               "PreLN+AttnRes(block=2)", "PreLN+Scalars", "PreLN+Backout", "LAuReL(form=lr)", "LAuReL(form=pa)", "Keel",
               "PreLN+MUDD", "PreLN+AttnRes", "nGPT", "HybridNorm")
HEAD_LOSSES = ("chunked", "liger")  # the output layer and loss without the logits, against the compiled eager head
# step over compiled PreLN's; every other design: 1.10 (the depth designs: docs/performance.md)
GOALS = {"HC": 1.15, "mHC": 1.15, "SAS": 1.35, "PreLN+DenseFormer": 1.05, "PreLN+AttnRes(block=2)": 1.05,
         "PreLN+Scalars": 1.05, "PreLN+Backout": 1.05, "LAuReL(form=lr)": 1.05, "LAuReL(form=pa)": 1.05, "Keel": 1.05,
         "PreLN+MUDD": 1.15, "PreLN+AttnRes": 1.15, "nGPT": 1.15}


@dataclass(frozen=True)
class GpuSizes:
    """The shapes the group measures: GPT-2 124M on a card, or ``SMOKE`` on a CPU."""

    model: str = "gpt2-small"
    overrides: tuple[tuple[str, int], ...] = (("pad_vocab", 64),)
    rows: int = 32  # 32 x 1,024 tokens a step
    matmul_n: int = 8192
    repeats: int = 10
    warmup: int = 2
    backend: str = "inductor"
    designs: tuple[str, ...] = GPU_DESIGNS
    budget_s: float = 270.0  # no design started after this: meant to end the group within 6 minutes of a card
    hf_reference: bool = True

    def config(self) -> dict[str, Any]:
        return {"vocab_size": 50257, **dict(self.overrides)}


SMOKE = GpuSizes(overrides=(("d_model", 32), ("ffn_dim", 64), ("heads", 2), ("layers", 2), ("context", 16),
                            ("vocab_size", 100), ("pad_vocab", 64)),
                 rows=2, matmul_n=64, repeats=2, warmup=1, backend="eager", budget_s=math.inf)


def head_loss(h: Tensor, weight: Tensor, targets: Tensor, vocab: int) -> Tensor:
    """Next-token cross-entropy of the states ``h`` (B, T, D) through the output weight (rows >= ``vocab``; the
    padding's logits cut off), computed in float32."""
    logits = F.linear(h, weight)[..., :vocab]
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


@dataclass
class Trainer:
    """One model's training step on a fixed batch: ``hidden`` maps tokens to final-normed states, ``weight`` gives
    the output projection's weight; the loss through :func:`head_loss`; fused AdamW on CUDA."""

    model: nn.Module
    hidden: Callable[[Tensor], Tensor]
    weight: Callable[[], Tensor]
    batch: tuple[Tensor, Tensor]
    vocab: int
    backend: str | None  # None: eager
    head: str = "eager"  # the output layer and loss: compiled with the layers, or chunked / liger (linear_ce)
    opt: torch.optim.Optimizer = field(init=False)
    loss: Callable[..., Tensor] = field(init=False)

    def __post_init__(self) -> None:
        cuda = self.batch[0].is_cuda
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, betas=(0.9, 0.95),
                                     **({"fused": True} if cuda else {}))
        if self.head != "eager":
            self.loss = lambda h, w, y, vocab: linear_cross_entropy(h, w[:vocab], y, self.head)
        else:
            self.loss = head_loss if self.backend is None else torch.compile(head_loss, backend=self.backend,
                                                                             dynamic=False)

    def __call__(self) -> None:
        x, y = self.batch
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=x.is_cuda):
            loss = self.loss(self.hidden(x), self.weight(), y, self.vocab)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if x.is_cuda:
            torch.cuda.synchronize(x.device)


def skiplab_trainer(sz: GpuSizes, design: str, batch: tuple[Tensor, Tensor], compiled: bool, head: str = "eager",
                    **fields: Any) -> Trainer:
    model = build(f"{sz.model}(connection={design})", **sz.config(), **fields).to(batch[0].device)
    if compiled:
        compile_layers(model, backend=sz.backend)
    return Trainer(model, model.hidden, model.output_weight, batch, model.cfg.vocab_size,
                   sz.backend if compiled else None, head)


def hf_trainer(sz: GpuSizes, batch: tuple[Tensor, Tensor], rows: int) -> Trainer:
    """transformers' GPT2LMHeadModel of the shape skiplab's model has (SDPA attention, no dropout), each block
    compiled in place, the same compiled output layer and loss."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = build(f"{sz.model}(connection=PreLN)", **sz.config()).cfg
    hf_cfg = GPT2Config(vocab_size=rows, n_positions=cfg.context, n_embd=cfg.d_model, n_layer=cfg.layers,
                        n_head=cfg.heads, n_inner=cfg.ffn_dim, activation_function="gelu_new", resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5, use_cache=False,
                        attn_implementation="sdpa", bos_token_id=None, eos_token_id=None)  # no tokenizer here
    torch.manual_seed(0)
    model = GPT2LMHeadModel(hf_cfg).to(batch[0].device).train()
    for block in model.transformer.h:
        block.compile(backend=sz.backend, dynamic=False)
    return Trainer(model, lambda x: model.transformer(input_ids=x).last_hidden_state, lambda: model.lm_head.weight,
                   batch, cfg.vocab_size, sz.backend)


def matmul_bf16_rate(n: int, device: torch.device) -> float:
    """FLOP/s of an (n x n) @ (n x n) product, bf16 on a card (float32 on a CPU), best of 5."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    best = math.inf
    for _ in range(6):
        sync(device)
        start = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def memory_now(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def memory_freed(device: torch.device) -> int:
    """:func:`memory_now` once what earlier rows left is collected and the card's cache emptied."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return memory_now(device)


def bench_batch(rows: int, context: int, vocab: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """The bench's one batch (seed 0): ``rows`` windows of ``context`` tokens and their next tokens."""
    tokens = torch.randint(0, vocab, (rows, context + 1), generator=torch.Generator().manual_seed(0)).to(device)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def first_steps(trainer: Trainer, device: torch.device, warmup: int) -> dict[str, Any]:
    """Compile (the first call) and warm ``trainer`` up; its compile seconds, dynamo's counts, and the peak memory
    of one more step above what was allocated before the model was built (``base``, set by the caller)."""
    stats = CompileStats()
    start = time.perf_counter()
    trainer()
    seconds = time.perf_counter() - start
    for _ in range(warmup):
        trainer()
    report = stats.report()
    peak = None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        trainer()
        peak = torch.cuda.max_memory_allocated(device)
    return {"compile_s": seconds, "graph_breaks": report["graph_breaks"], "recompiles": report["recompiles"],
            "peak": peak}


def state_bytes(model: nn.Module) -> int:
    """Weights, their gradients and AdamW's two moments, all float32: what a step holds whatever its rows."""
    return 16 * sum(p.numel() for p in model.parameters())


def largest_rows(peak: int | None, base: int, static: int, rows: int, device: torch.device) -> int | None:
    """The rows a step could take on the card: its memory above the weights and optimizer state grows linearly
    in the rows (an estimate, 95% of the card's memory)."""
    if peak is None or device.type != "cuda":
        return None
    per_row = max(peak - base - static, 1) / rows
    total = torch.cuda.get_device_properties(device).total_memory
    return int((0.95 * total - base - static) // per_row)


def head_agreement(impl: str, h: Tensor, weight: Tensor, targets: Tensor) -> tuple[float, float, float]:
    """How far ``impl``'s loss, ∂h and ∂W are from the eager head's on the same states (autocast as a step has
    it): the loss's absolute difference, the gradients' largest over their largest entry."""
    got = []
    for how in ("eager", impl):
        hh, ww = h.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
        with torch.autocast(h.device.type, dtype=torch.bfloat16, enabled=h.is_cuda):
            loss = linear_cross_entropy(hh, ww, targets, how)
        loss.backward()
        got.append((loss.detach().float(), hh.grad.float(), ww.grad.float()))
    (l0, h0, w0), (l1, h1, w1) = got
    return (float((l1 - l0).abs()), float((h1 - h0).abs().max() / h0.abs().max()),
            float((w1 - w0).abs().max() / w0.abs().max()))


def head_rows(g: GpuSizes, impl: str, pre: Trainer, batch: tuple[Tensor, Tensor], device: torch.device) -> list[Row]:
    """Compiled PreLN with its output layer and loss fused (``impl``, :mod:`skiplab.models.linear_ce`) against
    ``pre`` (the compiled eager head): step ratio, peak memory and the rows that fit, and its agreement with the
    eager head on the model's first states."""
    name = f"PreLN, {impl} head loss"
    base = memory_freed(device)
    try:
        trainer = skiplab_trainer(g, "PreLN", batch, compiled=True, head=impl)
        got = first_steps(trainer, device, g.warmup)
    except ValueError as e:  # liger: not installed, or no CUDA card
        return [Row("gpu", f"{name} step", float("nan"), "x", str(e))]
    except torch.OutOfMemoryError:
        return [Row("gpu", f"{name} step", float("nan"), "x", "out of memory at this batch")]
    x, y = batch
    rows = min(x.shape[0], max(1, 4096 // x.shape[1]))  # at most 4,096 positions: the eager head's logits fit
    with torch.no_grad():
        states = trainer.hidden(x[:rows]).float()
    dl, dh, dw = head_agreement(impl, states, trainer.weight()[: trainer.vocab], y[:rows])
    t = interleaved({"eager": pre, impl: trainer}, g.repeats, g.warmup)
    out = [Row("gpu", f"{name} step", t[impl] / t["eager"], "x",
               f"compiled PreLN with its compiled eager head, in turn; {got['graph_breaks']} graph breaks; against "
               f"the eager head on {rows}x{x.shape[1]} positions: loss {dl:.1e} apart, dh {dh:.1e}, dW {dw:.1e} "
               f"(largest difference over largest entry)")]
    if got["peak"] is not None:
        fit = largest_rows(got["peak"], base, state_bytes(trainer.model), g.rows, device)
        out.append(Row("gpu", f"{name} peak memory", (got["peak"] - base) / 2**30, "GiB",
                       f"~{fit} rows fit (estimated), against the eager head's in the PreLN peak memory row"))
    del trainer
    return out


def gpu(sz: Any, ctx: dict) -> list[Row]:
    """The group (module docstring). ``sz`` is the suite's sizes: ``QUICK`` or a CPU picks :data:`SMOKE`."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    g = ctx.get("gpu_sizes") or (GpuSizes() if device.type == "cuda" and not ctx.get("quick") else SMOKE)
    if ctx.get("gpu_budget_s"):
        g = replace(g, budget_s=ctx["gpu_budget_s"])
    emit = ctx.get("emit", lambda rows: None)
    rows: list[Row] = []

    def add(*new: Row) -> None:
        rows.extend(new)
        for r in new:
            print(f"[bench] gpu {time.perf_counter() - started:5.0f} s: {r.name} = {r.text()} ({r.note})", flush=True)
        emit(rows)

    started = time.perf_counter()
    # every design's layer is an entry of one forward's cache (the value residual's and LNS's, one per layer)
    raise_recompile_limit(32 * (len(g.designs) + 2))
    peak, note = peak_tflops(device), peak_note(device)
    rate = matmul_bf16_rate(g.matmul_n, device)
    kind = "bf16" if device.type == "cuda" else "float32"
    add(Row("gpu", f"{kind} matmul {g.matmul_n}^3", rate / 1e12, "TFLOP/s",
            f"{100 * rate / (peak * 1e12):.0f}% of the card's dense bf16 peak {peak:g}" if peak else note))

    base_model = build(f"{g.model}(connection=PreLN)", **g.config())
    cfg = base_model.cfg
    batch = bench_batch(g.rows, cfg.context, cfg.vocab_size, device)
    n_tokens = g.rows * cfg.context
    flops_token = base_model.flops_per_token()
    del base_model

    base = memory_now(device)
    pre = skiplab_trainer(g, "PreLN", batch, compiled=True)
    first = first_steps(pre, device, g.warmup)
    eager = skiplab_trainer(g, "PreLN", batch, compiled=False)
    eager()
    t = interleaved({"compiled": pre, "eager": eager}, g.repeats, g.warmup)
    del eager
    step = t["compiled"]
    flops = flops_token * n_tokens / step
    shape = f"{g.model} (d {cfg.d_model}, {cfg.layers} layers), {g.rows}x{cfg.context} tokens, {kind}"
    add(Row("gpu", f"{shape}: PreLN step, compiled per layer", step * 1e3, "ms",
            f"first step (compiling) {first['compile_s']:.0f} s; {first['graph_breaks']} graph breaks"),
        Row("gpu", "PreLN tokens/s", n_tokens / step, "tokens/s", "goal 400,000 on an H100 (stretch 468,000, llm.c)"),
        Row("gpu", "PreLN model FLOP/s", flops / 1e12, "TFLOP/s", f"6N + 12·L·d·T = {flops_token / 1e6:.3g} MFLOP a token"),
        Row("gpu", "PreLN MFU", 100 * flops / (peak * 1e12) if peak else float("nan"), "%",
            f"of {peak:g} TFLOP/s dense bf16" if peak else note),
        Row("gpu", "PreLN eager / compiled step", t["eager"] / step, "x", "the same step without torch.compile"))
    static = state_bytes(pre.model)
    if first["peak"] is not None:
        fit = largest_rows(first["peak"], base, static, g.rows, device)
        add(Row("gpu", "PreLN peak memory", (first["peak"] - base) / 2**30, "GiB",
                f"weights, gradients, AdamW state and one step's activations; ~{fit} rows fit (estimated)"))

    for impl in HEAD_LOSSES:
        add(*head_rows(g, impl, pre, batch, device))

    if g.hf_reference:
        try:
            hf = hf_trainer(g, batch, pre.model.embed.weight.shape[0])
        except ImportError:
            add(Row("gpu", "skiplab PreLN / transformers GPT2LMHeadModel step", float("nan"), "x",
                    "transformers is not installed"))
        else:
            hf_first = first_steps(hf, device, g.warmup)
            t = interleaved({"skiplab": pre, "hf": hf}, g.repeats, g.warmup)
            add(Row("gpu", "skiplab PreLN / transformers GPT2LMHeadModel step", t["skiplab"] / t["hf"], "x",
                    f"same shape and batch, both compiled per block; transformers {n_tokens / t['hf']:,.0f} tokens/s, "
                    f"{hf_first['graph_breaks']} graph breaks; goal 0.90x"))
            del hf

    skipped = []
    for design in g.designs:
        if time.perf_counter() - started > g.budget_s:
            skipped.append(design)
            continue
        base = memory_freed(device)
        try:
            trainer = skiplab_trainer(g, design, batch, compiled=True)
            got = first_steps(trainer, device, g.warmup)
        except torch.OutOfMemoryError:
            add(Row("gpu", f"{design} step", float("nan"), "x", "out of memory at this batch"))
            continue
        memory = ""
        if got["peak"] is not None:
            fit = largest_rows(got["peak"], base, state_bytes(trainer.model), g.rows, device)
            memory = f"; peak {(got['peak'] - base) / 2**30:.1f} GiB, ~{fit} rows fit"
        # a design whose recipe builds another model (nGPT: SwiGLU, rotary positions, untied output, no biases)
        # against PreLN built the same way too: the design's own cost beside the whole model's
        fields = recipe_fields(g.model, design, **g.config())
        timed = {"PreLN": pre, design: trainer}
        if fields:
            timed["own"] = skiplab_trainer(g, "PreLN", batch, compiled=True, **fields)
            first_steps(timed["own"], device, g.warmup)
        t = interleaved(timed, g.repeats, g.warmup)
        how = (f"compiled PreLN with {design}'s model ({show_fields(fields)}), in turn: the design's own cost"
               if fields else "compiled PreLN, in turn")
        add(Row("gpu", f"{design} step", t[design] / t["own" if fields else "PreLN"], "x",
                f"{how}; goal {GOALS.get(design, 1.10):.2f}x; compiled in {got['compile_s']:.0f} s, "
                f"{got['graph_breaks']} graph breaks, {got['recompiles']} recompiles{memory}"))
        if fields:
            add(Row("gpu", f"{design} whole model step", t[design] / t["PreLN"], "x",
                    f"the preset's compiled PreLN, in turn: {design} with its recipe's model priced whole"))
        del trainer, timed
    if skipped:
        add(Row("gpu", "designs not reached", len(skipped), "designs",
                f"time budget {g.budget_s:.0f} s spent: {', '.join(skipped)}"))
    return rows
