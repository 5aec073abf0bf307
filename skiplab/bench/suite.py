"""``skiplab bench``: what the designs and the engine cost on this machine, as ratios measured side by side.

Groups (each a function of the sizes, returning table rows):

- machine:   float32 matmul rate (FLOP/s) and element-wise add bandwidth (bytes/s): the two ceilings
- image:     PreAct-ResNet training step of each design / the plain residual 1xSkip; what a design adds,
             counted in element-wise add passes over every block's output (its memory-traffic floor)
- mt:        Transformer training step of each design / PostLN, beside its FLOP ratio (SAS's gates are
             matmuls); the depth-wise LSTM model too
- engine:    skiplab's Transformer / ``torch.nn.Transformer`` of the same shape; cached beam search /
             recomputing the prefix; achieved training FLOP/s / the matmul rate; padding share of token
             batches; LayerNorm / RMSNorm forward + backward on the same input
- lm:        decoder-only training step of each design / PreLN; skiplab's PreLN decoder / one of ``torch.nn``
             layers of the same shape; achieved FLOP/s / the matmul rate; cached generation / recomputing
             the prefix; tokens per second of training and of generation
- compile:   ``torch.compile``d / eager training step, both families, with compile times
- processes: 2 processes (DDP, gloo, half the threads each) / 1 process, same global batch
- caption:   Transformer captioner's training step of each design / PostLN (pixels through its trunk); cached
             beam search / recomputing the prefix over images
- hyper:     hyper-connections' training step, ``HC(n=4)`` and ``mHC(n=4)`` / PreLN, at two widths (d = 256 and 768),
             eager and ``torch.compile``d (docs/performance.md, "hyper-connections at their cost")
- depth:     the designs that mix or scale across depth (DenseFormer, MUDD, Attention Residuals, the speedrun's
             scalars, LAuReL, Keel, nGPT): training step / PreLN at d = 768, eager and compiled, with their goals
- gpu:       GPT-2 124M on one card: tokens/s, MFU and memory of compiled PreLN, transformers' GPT-2 on the same
             batch, every design's step / PreLN's (:mod:`skiplab.bench.gpu`; smoke size on a CPU). Run by default
             only where CUDA is; ``--out auto`` writes ``docs/results/bench/<card>-<date>/``

``--quick`` runs every group on tiny shapes (seconds; CI checks every row is produced, not the values).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.multiprocessing as mp
from torch import nn

from .. import run_dir
from ..compiled import raise_recompile_limit
from ..config import count, parse_list
from ..connections.norms import make_norm
from ..models import model_config
from ..corpora import encode_parallel, load_corpus, make_batches
from ..tokenization import Tokenizer
from ..train.layer_telemetry import LayerWatch
from ..train.telemetry import Telemetry
from ..decoding import beam_search
from ..models.generate import generate
from .steps import (MTBatch, RecomputingDecoder, TorchDecoder, TorchTransformer, add_bandwidth, build, loop_step,
                    connection_output_elements, image_step, lm_step, matmul_rate, mt_step, step_flops)
from .gpu import gpu
from .timing import Row, interleaved, markdown

IMAGE_DESIGNS = ("1xSkip", "2xSkip+LN", "2rSkip+LN", "wSkip+LN", "SAS", "Highway")
MT_DESIGNS = ("PostLN", "PreLN", "2rSkip+LN", "SAS")
LM_DESIGNS = ("PreLN", "PostLN", "PreRMS", "2rSkip+LN", "SAS", "ReZero", "LayerScale", "LNS", "MixLN", "DeepNorm", "Admin",
              "PeriLN", "PreDyT", "HC", "HC(kind=static)", "mHC", "PreLN+ValueRes", "PreLN+UNet")
HYPER_DESIGNS = {"HC(n=4)": "1.10", "mHC(n=4)": "1.15"}  # HC in its default, dynamic form; goals / PreLN
# the designs that mix or scale across depth, each with its goal / PreLN (issue: Block forms and scalars 1.05x,
# dynamic or full mixes 1.15x)
DEPTH_DESIGNS: dict[str, str] = {"PreLN+DenseFormer": "1.05", "PreLN+AttnRes(block=2)": "1.05", "PreLN+Scalars": "1.05",
                                 "LAuReL(form=lr)": "1.05", "LAuReL(form=pa)": "1.05", "Keel": "1.05", "PreLN+MUDD": "1.15", "PreLN+AttnRes": "1.15",
                                 "nGPT": "1.15"}


@dataclass(frozen=True)
class Sizes:
    """The shapes a run measures: the papers' (full) or tiny ones (quick)."""

    image_depth: int = 56
    image_batch: int = 128
    image_hw: int = 32
    mt_model: str = "transformer-small"
    mt_overrides: tuple[tuple[str, int], ...] = ()
    mt_rows: int = 128
    mt_len: int = 30  # 128 x 30 ~ 4k tokens a side, the recipe's batch
    vocab: int = 8000
    beam_sentences: int = 16
    beam_len: int = 20
    compile_depth: int = 20
    compile_backend: str = "inductor"  # quick: aot_eager, the same tracing without generating kernels
    compile_dynamic: bool = True  # MT batches vary in shape; quick traces one static shape (seconds, not a minute)
    lm_model: str = "gpt-small"
    lm_overrides: tuple[tuple[str, int], ...] = ()
    lm_rows: int = 16  # 16 x 256 = 4k tokens a step
    lm_vocab: int = 257  # bytes
    lm_new_tokens: int = 256
    matmul_n: int = 1024
    add_elements: int = 1 << 24
    norm_rows: int = 4096
    norm_dim: int = 512
    process_steps: int = 6
    hyper_widths: tuple[int, ...] = (256, 768)  # gpt-small's width and GPT-2 small's (heads of 64, MLP 4d)
    hyper_layers: int = 4
    hyper_rows: int = 8  # 8 x 256 tokens a step
    caption_model: str = "captioner-small"
    caption_overrides: tuple[tuple[str, int], ...] = ()
    caption_rows: int = 50  # the cpu-scale recipe's batch of (image, caption) pairs
    caption_len: int = 12
    caption_vocab: int = 60  # about fashion-mnist-scenes' words
    repeats: int = 8
    warmup: int = 2


QUICK = Sizes(image_depth=8, image_batch=4, image_hw=8, mt_overrides=(("d_model", 32), ("ffn_dim", 64), ("heads", 2),
              ("encoder_layers", 1), ("decoder_layers", 1)), mt_rows=4, mt_len=6, vocab=64, beam_sentences=2,
              beam_len=4, lm_overrides=(("d_model", 32), ("ffn_dim", 64), ("heads", 2), ("layers", 2), ("context", 16)),
              lm_rows=2, lm_new_tokens=8, compile_depth=8, compile_backend="aot_eager", compile_dynamic=False, matmul_n=128, add_elements=1 << 16, norm_rows=64, norm_dim=32,
              process_steps=2, hyper_widths=(16, 32), hyper_layers=1, hyper_rows=2, repeats=2, warmup=1,
              caption_overrides=(("d_model", 32), ("ffn_dim", 64), ("heads", 2), ("encoder_layers", 1),
                                 ("decoder_layers", 1), ("trunk_width", 4)), caption_rows=4, caption_len=4)


def image_model(depth: int, connection: str) -> nn.Module:
    return build("preact-resnet20", depth=depth, connection=connection)


def image_batch(sz: Sizes) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(sz.image_batch, 3, sz.image_hw, sz.image_hw, generator=g), torch.randint(0, 10, (sz.image_batch,), generator=g)


def mt_model(sz: Sizes, spec: str) -> nn.Module:
    return build(spec, vocab_size=sz.vocab, pad_id=0, **dict(sz.mt_overrides))


def mt_batch(sz: Sizes) -> MTBatch:
    return MTBatch.random(sz.mt_rows, sz.mt_len, sz.mt_len, sz.vocab)


def machine(sz: Sizes, ctx: dict) -> list[Row]:
    ctx["matmul"] = matmul_rate(sz.matmul_n)
    ctx["add_bw"] = add_bandwidth(sz.add_elements)
    return [Row("machine", f"float32 matmul {sz.matmul_n}^3", ctx["matmul"] / 1e9, "GFLOP/s", "best of 5"),
            Row("machine", f"add bandwidth, {sz.add_elements:,} floats", ctx["add_bw"] / 1e9, "GB/s",
                "2 reads + 1 write per element")]


def image(sz: Sizes, ctx: dict) -> list[Row]:
    batch = image_batch(sz)
    models = {d: image_model(sz.image_depth, d) for d in IMAGE_DESIGNS}
    t = interleaved({d: image_step(m, batch) for d, m in models.items()}, sz.repeats, sz.warmup)
    base = t["1xSkip"]
    one_pass = connection_output_elements(models["1xSkip"], batch[0]) * 12 / ctx["add_bw"]  # seconds
    name = f"PreAct-ResNet-{sz.image_depth}, batch {sz.image_batch}"
    rows = [Row("image", f"{name}: 1xSkip step", base * 1e3, "ms", "training step, eager")]
    for d in IMAGE_DESIGNS[1:]:
        extra = (t[d] - base) / one_pass
        rows.append(Row("image", f"{d} step", t[d] / base, "x",
                        f"1xSkip; adds {t[d] - base:+.3f} s = {extra:.1f} add passes over the blocks' outputs"))
    return rows


def mt(sz: Sizes, ctx: dict) -> list[Row]:
    batch = mt_batch(sz)
    specs = {d: f"{sz.mt_model}(connection={d})" for d in MT_DESIGNS}
    specs["dwlstm"] = sz.mt_model.replace("transformer", "dwlstm")
    models = {d: mt_model(sz, s) for d, s in specs.items()}
    steps = {d: mt_step(m, batch) for d, m in models.items()}
    flops = {d: step_flops(s) for d, s in steps.items()}
    t = interleaved(steps, sz.repeats, sz.warmup)
    base = t["PostLN"]
    ctx["mt_flops"], ctx["mt_step"] = flops["PostLN"], base
    rows = [Row("mt", f"{sz.mt_model}, {sz.mt_rows}x{sz.mt_len} tokens: PostLN step", base * 1e3, "ms",
                f"{flops['PostLN'] / 1e9:.1f} GFLOP per step")]
    for d in list(specs)[1:]:
        rows.append(Row("mt", f"{d} step", t[d] / base, "x", f"PostLN; FLOP ratio {flops[d] / flops['PostLN']:.3f}"))
    return rows


def engine(sz: Sizes, ctx: dict) -> list[Row]:
    rows = []
    batch = mt_batch(sz)
    ours = mt_model(sz, f"{sz.mt_model}(connection=PostLN)")
    torch.manual_seed(0)
    ref = TorchTransformer(ours.cfg).train()
    t = interleaved({"skiplab": mt_step(ours, batch), "torch": mt_step(ref, batch)}, sz.repeats, sz.warmup)
    rows.append(Row("engine", "skiplab Transformer / torch.nn.Transformer", t["skiplab"] / t["torch"], "x",
                    "training step, same shape, embeddings and loss"))

    ours.eval()
    src = batch.src[: sz.beam_sentences]
    cached = lambda: beam_search(ours, src, beam=4, max_len_a=0, max_len_b=sz.beam_len)  # noqa: E731
    recompute = lambda: beam_search(RecomputingDecoder(ours), src, beam=4, max_len_a=0, max_len_b=sz.beam_len)  # noqa: E731
    with torch.no_grad():
        t = interleaved({"cached": cached, "recompute": recompute}, max(2, sz.repeats // 4), 1)
    rows.append(Row("engine", f"beam 4, {sz.beam_len} steps: recomputing the prefix / cached", t["recompute"] / t["cached"],
                    "x", "speed-up of the key/value cache"))

    achieved = ctx["mt_flops"] / ctx["mt_step"]
    rows.append(Row("engine", "achieved training FLOP/s / matmul rate", 100 * achieved / ctx["matmul"], "%",
                    f"{sz.mt_model} PostLN step: {achieved / 1e9:.1f} GFLOP/s"))

    src_ids, tgt_ids, source = padding_sample(sz, ctx.get("data_dir"))
    batches = make_batches(src_ids, tgt_ids, 4096)
    real = sum(len(s) + 1 for s in src_ids) + sum(len(t) + 1 for t in tgt_ids)
    slots = sum(b.src.numel() + b.tgt_out.numel() for b in batches)
    rows.append(Row("engine", "padding share of 4096-token batches", 100 * (1 - real / slots), "%", source))

    x = torch.randn(sz.norm_rows, sz.norm_dim, requires_grad=True)
    dy = torch.randn_like(x)
    ln, rms, ours = nn.LayerNorm(sz.norm_dim), nn.RMSNorm(sz.norm_dim), make_norm("RMS", sz.norm_dim)
    t = interleaved({"LN": lambda: ln(x).backward(dy), "RMS": lambda: rms(x).backward(dy),
                     "ours": lambda: ours(x).backward(dy)}, sz.repeats * 3, sz.warmup)
    what = f"forward + backward ({sz.norm_rows}x{sz.norm_dim})"
    rows.append(Row("engine", f"nn.RMSNorm / nn.LayerNorm, {what}", t["RMS"] / t["LN"], "x", "same input"))
    rows.append(Row("engine", f"skiplab's fused RMSNorm / nn.LayerNorm, {what}", t["ours"] / t["LN"], "x",
                    "same input; what +RMS and PreRMS use"))
    return rows


def lm(sz: Sizes, ctx: dict) -> list[Row]:
    overrides = dict(sz.lm_overrides)
    context = overrides.get("context", model_config(sz.lm_model).context)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, sz.lm_vocab, (sz.lm_rows, context + 1), generator=g)
    batch = tokens[:, :-1], tokens[:, 1:]
    models = {d: build(f"{sz.lm_model}(connection={d})", vocab_size=sz.lm_vocab, **overrides) for d in LM_DESIGNS}
    steps = {d: lm_step(m, batch) for d, m in models.items()}
    flops = {d: step_flops(s) for d, s in steps.items()}
    t = interleaved(steps, sz.repeats, sz.warmup)
    base, n_tokens = t["PreLN"], sz.lm_rows * context
    name = f"{sz.lm_model}, {sz.lm_rows}x{context} tokens"
    rows = [Row("lm", f"{name}: PreLN step", base * 1e3, "ms",
                f"{flops['PreLN'] / 1e9:.1f} GFLOP per step; {n_tokens / base:,.0f} tokens/s")]
    for d in LM_DESIGNS[1:]:
        rows.append(Row("lm", f"{d} step", t[d] / base, "x", f"PreLN; FLOP ratio {flops[d] / flops['PreLN']:.3f}"))

    learned = {**overrides, "positions": "learned"}
    ours = build(f"{sz.lm_model}(connection=PreLN)", vocab_size=sz.lm_vocab, **learned)
    torch.manual_seed(0)
    ref = TorchDecoder(ours.cfg).train()
    t = interleaved({"skiplab": lm_step(ours, batch), "torch": lm_step(ref, batch)}, sz.repeats, sz.warmup)
    rows.append(Row("lm", "skiplab PreLN decoder / torch.nn layers", t["skiplab"] / t["torch"], "x",
                    "training step, same shape (learned positions), embeddings and loss"))
    achieved = flops["PreLN"] / base
    rows.append(Row("lm", "achieved training FLOP/s / matmul rate", 100 * achieved / ctx["matmul"], "%",
                    f"{sz.lm_model} PreLN step, {sz.lm_vocab}-token vocabulary: {achieved / 1e9:.1f} GFLOP/s"))
    # the same step with a subword vocabulary the size of the MT rows' (the output layer's matmul grows with it)
    subword = torch.randint(0, sz.vocab, (sz.lm_rows, context + 1), generator=g)
    wide = build(f"{sz.lm_model}(connection=PreLN)", vocab_size=sz.vocab, **overrides)
    wide_step = lm_step(wide, (subword[:, :-1], subword[:, 1:]))
    t_wide = interleaved({"wide": wide_step}, sz.repeats, sz.warmup)["wide"]
    achieved = step_flops(wide_step) / t_wide
    rows.append(Row("lm", f"achieved training FLOP/s / matmul rate, {sz.vocab}-token vocabulary",
                    100 * achieved / ctx["matmul"], "%", f"{sz.lm_model} PreLN step: {achieved / 1e9:.1f} GFLOP/s"))

    # per-step telemetry (skiplab.train.telemetry): train lm's step (clipped at 1.0, its loss read) without and
    # with the watch (the gradient norm kept, the spike window, a line every update)
    watched = build(f"{sz.lm_model}(connection=PreLN)", vocab_size=sz.lm_vocab, **overrides)
    t = interleaved({"plain": loop_step(watched, batch, None),
                     "watched": loop_step(watched, batch, Telemetry(1, watched.flops_per_token()))},
                    sz.repeats * 2, sz.warmup)
    rows.append(Row("lm", "per-step telemetry: the step with it / without", t["watched"] / t["plain"], "x",
                    f"{sz.lm_model} PreLN, a steps.jsonl line every update (the goal: at most 1.01x)"))
    # per-layer telemetry (train lm --log-layers 10, skiplab.train.layer_telemetry): ten updates, the tenth watched
    # (hooks, per-sub-layer gradient norms, a copy of the weights, the update ratios), against the same ten unwatched
    every = 10
    t = interleaved({"plain": loop_step(watched, batch, updates=every),
                     "layers": loop_step(watched, batch, layers=LayerWatch(watched, every), updates=every)},
                    max(2, sz.repeats // 4), sz.warmup)
    rows.append(Row("lm", f"per-layer telemetry at N = {every} / without", t["layers"] / t["plain"], "x",
                    f"{sz.lm_model} PreLN, {every} updates a call, one watched (the goal: at most 1.03x)"))

    new = sz.lm_new_tokens
    long = build(f"{sz.lm_model}(connection=PreLN)", vocab_size=sz.lm_vocab, **{**overrides, "context": new + 1}).eval()
    cached = lambda: generate(long, [0], new, temperature=0)  # noqa: E731
    recompute = lambda: generate(long, [0], new, temperature=0, cache=False)  # noqa: E731
    t = interleaved({"cached": cached, "recompute": recompute}, max(2, sz.repeats // 4), 1)
    rows.append(Row("lm", f"{new} new tokens: recomputing the prefix / cached", t["recompute"] / t["cached"], "x",
                    f"speed-up of the key/value cache; cached: {new / t['cached']:,.0f} tokens/s, batch 1"))
    return rows


def padding_sample(sz: Sizes, data_dir: str | None) -> tuple[list[list[int]], list[list[int]], str]:
    """Token-id sequences to cut batches from: Multi30k's training pairs in an 8k joint BPE where its files
    are (full sizes), else lengths drawn around Multi30k's mean (about 16 subwords)."""
    if sz is not QUICK and data_dir:
        try:
            data = load_corpus("multi30k", data_dir, "en", "de", "train", download=False)
        except (OSError, ValueError):
            data = None
        if data is not None:
            with tempfile.TemporaryDirectory() as tmp:
                tok = Tokenizer.train(data.src + data.tgt, f"{tmp}/spm", 8000)
            src, tgt = encode_parallel(tok, data)
            return src, tgt, f"Multi30k en-de train, {len(src)} pairs, 8k BPE"
    g = torch.Generator().manual_seed(0)
    n = 200 if sz is QUICK else 2000
    lens = (torch.randn(n, 2, generator=g) * 5 + 16).clamp(min=2).round().int().tolist()
    return [[4] * a for a, _ in lens], [[4] * b for _, b in lens], f"synthetic lengths 16 ± 5, {n} pairs"


def compiled(sz: Sizes, ctx: dict) -> list[Row]:
    rows = []
    batch = image_batch(sz)
    for design in ("1xSkip", "2rSkip+LN"):
        eager, comp = image_model(sz.compile_depth, design), image_model(sz.compile_depth, design)
        fwd = torch.compile(comp, backend=sz.compile_backend)
        start = time.perf_counter()
        image_step(comp, batch, fwd)()  # the first call compiles forward and backward
        secs = time.perf_counter() - start
        t = interleaved({"eager": image_step(eager, batch), "compiled": image_step(comp, batch, fwd)}, sz.repeats, sz.warmup)
        ctx[f"compiled_{design}"] = t["compiled"]
        rows.append(Row("compile", f"PreAct-ResNet-{sz.compile_depth} {design}: compiled / eager", t["compiled"] / t["eager"],
                        "x", f"{sz.compile_backend}; first step (compiling) {secs:.0f} s"))
    rows.append(Row("compile", f"PreAct-ResNet-{sz.compile_depth} compiled: 2rSkip+LN / 1xSkip",
                    ctx["compiled_2rSkip+LN"] / ctx["compiled_1xSkip"], "x", "both compiled"))
    mb = mt_batch(sz)
    eager, comp = (mt_model(sz, f"{sz.mt_model}(connection=PostLN)") for _ in range(2))
    fwd = torch.compile(comp, dynamic=sz.compile_dynamic, backend=sz.compile_backend)
    start = time.perf_counter()
    mt_step(comp, mb, fwd)()
    secs = time.perf_counter() - start
    t = interleaved({"eager": mt_step(eager, mb), "compiled": mt_step(comp, mb, fwd)}, sz.repeats, sz.warmup)
    rows.append(Row("compile", f"{sz.mt_model} PostLN: compiled ({'dynamic' if sz.compile_dynamic else 'static'} shapes) / eager", t["compiled"] / t["eager"], "x",
                    f"{sz.compile_backend}; first step (compiling) {secs:.0f} s"))
    return rows


def _design_steps(sz: Sizes, group: str, designs: dict[str, str], widths: tuple[int, ...]) -> list[Row]:
    """Each design's training step / PreLN's, all interleaved, at each width, eager and ``torch.compile``d;
    ``designs``: spec -> its goal (a ratio, as text)."""
    context = dict(sz.lm_overrides).get("context", model_config(sz.lm_model).context)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, sz.lm_vocab, (sz.hyper_rows, context + 1), generator=g)
    batch = tokens[:, :-1], tokens[:, 1:]
    specs = ("PreLN", *designs)
    rows = []
    for width in widths:
        shape = dict(vocab_size=sz.lm_vocab, d_model=width, heads=max(1, width // 64), ffn_dim=4 * width,
                     layers=sz.hyper_layers, context=context)
        name = f"{sz.lm_model}(d_model={width}, layers={sz.hyper_layers}), {sz.hyper_rows}x{context} tokens"
        for mode in ("eager", "compiled"):
            steps, secs = {}, {}
            if mode == "compiled":
                torch._dynamo.reset()  # each model is an entry of GPT.forward's cache: keep them under its limit,
                raise_recompile_limit(2 * len(specs) + 2)  # raised for as many models (past it dynamo runs eagerly)
            for d in specs:
                model = build(f"{sz.lm_model}(connection={d})", **shape)
                if mode == "compiled":
                    start = time.perf_counter()
                    steps[d] = lm_step(model, batch, torch.compile(model, backend=sz.compile_backend, dynamic=False))
                    steps[d]()  # the first call compiles forward and backward
                    secs[d] = time.perf_counter() - start
                else:
                    steps[d] = lm_step(model, batch)
            t = interleaved(steps, sz.repeats, sz.warmup)
            how = f"{sz.compile_backend}, each compiled in {max(secs.values()):.0f} s or less" if secs else "eager"
            rows.append(Row(group, f"{name}, {mode}: PreLN step", t["PreLN"] * 1e3, "ms", how))
            for d, goal in designs.items():
                rows.append(Row(group, f"d={width} {d} step, {mode}", t[d] / t["PreLN"], "x",
                                f"PreLN {mode}, interleaved; goal {goal}x"))
    return rows


def hyper(sz: Sizes, ctx: dict) -> list[Row]:
    """HC(n=4) and mHC(n=4) training steps / PreLN's, the three interleaved, at each width, eager and compiled."""
    return _design_steps(sz, "hyper", HYPER_DESIGNS, sz.hyper_widths)


def depth(sz: Sizes, ctx: dict) -> list[Row]:
    """The designs that mix or scale across depth (docs/designs.md), training step / PreLN's at GPT-2's width
    (d = 768), eager and compiled, with each one's goal."""
    return _design_steps(sz, "depth", DEPTH_DESIGNS, sz.hyper_widths[-1:])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_worker(rank: int, world: int, port: int, sz: Sizes, threads: int, out: str) -> None:
    """One rank of the processes benchmark: DDP training steps on its share of one global batch."""
    import torch.distributed as dist

    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        model = image_model(sz.compile_depth, "1xSkip")
        ddp = nn.parallel.DistributedDataParallel(model) if world > 1 else model
        x, y = image_batch(sz)
        share = slice(rank * len(y) // world, (rank + 1) * len(y) // world)
        step = image_step(model, (x[share], y[share]), ddp)
        for _ in range(sz.warmup):
            step()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(sz.process_steps):
            step()
        dist.barrier()
        if rank == 0:
            Path(out).write_text(str((time.perf_counter() - start) / sz.process_steps))
    finally:
        dist.destroy_process_group()


def processes(sz: Sizes, ctx: dict) -> list[Row]:
    threads = max(2, torch.get_num_threads())
    secs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for world in (1, 2):
            out = f"{tmp}/{world}"
            mp.start_processes(_ddp_worker, args=(world, _free_port(), sz, threads // world, out), nprocs=world,
                               start_method="spawn")
            secs[world] = float(Path(out).read_text())
    return [Row("processes", f"PreAct-ResNet-{sz.compile_depth}, global batch {sz.image_batch}: 2 processes / 1",
                secs[1] / secs[2], "x", f"speed-up; {threads // 2} thread(s) each vs 1 process x {threads} threads, gloo")]


CAPTION_DESIGNS = ("PostLN", "SAS", "2rSkip+LN")


def caption(sz: Sizes, ctx: dict) -> list[Row]:
    """The captioner's training step per design / PostLN, and its cached beam search / recomputation."""
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (sz.caption_rows, 1, 64, 64), dtype=torch.uint8, generator=g)
    words = torch.randint(4, sz.caption_vocab, (sz.caption_rows, sz.caption_len + 1), generator=g)
    batch = MTBatch(images, words[:, :-1], words[:, 1:])
    models = {d: build(sz.caption_model, vocab_size=sz.caption_vocab, connection=d, **dict(sz.caption_overrides))
              for d in CAPTION_DESIGNS}
    t = interleaved({d: mt_step(m, batch) for d, m in models.items()}, sz.repeats, sz.warmup)
    base = t["PostLN"]
    rows = [Row("caption", f"{sz.caption_model}, {sz.caption_rows} images x {sz.caption_len} words: PostLN step",
                base * 1e3, "ms", "64 x 64 grey pixels through the trunk")]
    rows += [Row("caption", f"{d} step", t[d] / base, "x", "PostLN") for d in CAPTION_DESIGNS[1:]]
    model = models["PostLN"].eval()
    src = images[: sz.beam_sentences]
    cached = lambda: beam_search(model, src, beam=3, max_len_a=0, max_len_b=sz.beam_len)  # noqa: E731
    recompute = lambda: beam_search(RecomputingDecoder(model), src, beam=3, max_len_a=0, max_len_b=sz.beam_len)  # noqa: E731
    with torch.no_grad():
        t = interleaved({"cached": cached, "recompute": recompute}, max(2, sz.repeats // 4), 1)
    rows.append(Row("caption", f"beam 3, {sz.beam_len} steps, {len(src)} images: recomputing the prefix / cached",
                    t["recompute"] / t["cached"], "x", "speed-up of the key/value cache"))
    return rows


GROUPS: dict[str, Callable[[Sizes, dict], list[Row]]] = {
    "machine": machine, "image": image, "mt": mt, "lm": lm, "engine": engine, "compile": compiled,
    "processes": processes, "hyper": hyper, "depth": depth, "caption": caption, "gpu": gpu}


def default_groups() -> tuple[str, ...]:
    """Every group, but ``gpu`` only where there is a card to measure."""
    return tuple(g for g in GROUPS if g != "gpu" or torch.cuda.is_available())


def auto_out(root: str = "docs/results/bench") -> str:
    """``root/<card or cpu>-<date>``: the card's (or CPU's) name in lower case, runs of other characters as '-'."""
    import re

    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else run_dir.processor()
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower().replace("nvidia", "")).strip("-")
    return f"{root}/{slug}-{time.strftime('%Y-%m-%d')}"


def machine_name() -> str:
    """The CPU model and its kernels' instruction set (and GPU, where there is one) the numbers were measured on."""
    gpu = f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""
    return (f"{run_dir.processor()} ({torch.backends.cpu.get_cpu_capability()}), {os.cpu_count()} cores, "
            f"{torch.get_num_threads()} threads{gpu}; torch {torch.__version__}")


def run(quick: bool = False, groups: tuple[str, ...] | None = None, out: str | None = None,
        data_dir: str | None = None, threads: int = 0, progress: bool = True, gpu_budget_s: float = 0.0) -> list[Row]:
    """Run ``groups`` (machine first: the others read its rates; default :func:`default_groups`) with ``threads``
    torch threads (0: torch's choice), print the table; with ``out`` (``auto``: :func:`auto_out`), write
    ``bench.md`` and ``bench.json`` there, again after every group and every row of the gpu group."""
    groups = default_groups() if groups is None else groups
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        raise ValueError(f"unknown benchmark group(s) {', '.join(unknown)}; known: {', '.join(GROUPS)}")
    if threads:
        torch.set_num_threads(threads)
    out = auto_out() if out == "auto" else out
    sz = QUICK if quick else Sizes()
    header = f"Measured on {machine_name()}; sizes: {'quick' if quick else 'full'}."
    rows: list[Row] = []
    ctx: dict = {"data_dir": data_dir, "quick": quick, "gpu_budget_s": gpu_budget_s,
                 "emit": lambda partial: write(out, header, quick, sz, rows + partial) if out else None}
    needed = {"machine", *groups} | ({"mt"} if "engine" in groups else set())
    for name in [g for g in GROUPS if g in needed]:
        if progress:
            print(f"[bench] {name} ...", flush=True)
        start = time.perf_counter()
        got = GROUPS[name](sz, ctx)
        if progress:
            print(f"[bench] {name}: {time.perf_counter() - start:.0f} s", flush=True)
        if name in groups:
            rows += got
            if out:
                write(out, header, quick, sz, rows)
    print(markdown(rows, header + "\n"))
    return rows


def write(out: str, header: str, quick: bool, sz: Sizes, rows: list[Row]) -> None:
    """``out``/bench.md and bench.json: the rows so far, the machine, the sizes, the environment."""
    Path(out).mkdir(parents=True, exist_ok=True)
    Path(out, "bench.md").write_text(markdown(rows, header + "\n"))
    Path(out, "bench.json").write_text(json.dumps({"machine": machine_name(), "quick": quick, "sizes": asdict(sz),
                                                   "environment": environment(), "rows": [asdict(r) for r in rows]},
                                                  indent=2) + "\n")


def environment() -> dict:
    """skiplab's run environment (versions, CPU, card, commit) and, where there is a card, its driver and CUDA."""
    env = run_dir.environment()
    if torch.cuda.is_available():
        env["cuda_version"] = torch.version.cuda
        try:
            env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                           capture_output=True, text=True, timeout=10).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            env["driver"] = None
    return env


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``skiplab bench``; the parser runs :func:`command`."""
    p.add_argument("--quick", action="store_true", help="tiny shapes: every row in seconds (what CI runs)")
    p.add_argument("--groups", type=parse_list, default=None,
                   help=f"comma-separated groups to run (default: all; gpu only where CUDA is): {', '.join(GROUPS)}")
    p.add_argument("--out", default="", help="also write bench.md and bench.json into this directory "
                                             "('auto': docs/results/bench/<card or cpu>-<date>)")
    p.add_argument("--data-dir", default="../shared/data/multi30k",
                   help="Multi30k files for the padding-share row (synthetic lengths where absent)")
    p.add_argument("--threads", type=count(0), default=0, help="torch threads (default: torch's choice)")
    p.add_argument("--gpu-budget", type=float, default=0.0, metavar="SECONDS",
                   help="the gpu group starts no new design after this many seconds (default: 270)")
    p.set_defaults(func=command)


def command(args: argparse.Namespace) -> None:
    """``skiplab bench``."""
    run(quick=args.quick, groups=tuple(args.groups) if args.groups else None, out=args.out or None, data_dir=args.data_dir,
        threads=args.threads, gpu_budget_s=args.gpu_budget)
