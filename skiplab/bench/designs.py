"""The bench groups that time each design against its family's baseline, side by side: ``image`` (PreAct-ResNet),
``mt`` (the Transformer and the depth-wise LSTM), ``lm`` (the decoder-only family, with its engine rows: torch.nn
layers, achieved FLOP/s, telemetry, cached generation), ``caption``, ``hyper`` (HC, mHC) and ``depth`` (the designs
that mix or scale across depth), eager and compiled (:mod:`skiplab.bench.suite` lists them all)."""

from __future__ import annotations

import time

import torch

from ..compiled import raise_recompile_limit
from ..decoding import beam_search
from ..models import model_config
from ..models.generate import generate
from ..train.layer_telemetry import LayerWatch
from ..train.telemetry import Telemetry
from .shapes import (CAPTION_DESIGNS, DEPTH_DESIGNS, HYPER_DESIGNS, IMAGE_DESIGNS, LM_DESIGNS, MT_DESIGNS, Sizes,
                     image_batch, image_model, mt_batch, mt_model)
from .steps import (MTBatch, RecomputingDecoder, TorchDecoder, build, connection_output_elements, image_step, lm_step,
                    loop_step, mt_step, recipe_fields, show_fields, step_flops)
from .timing import Row, interleaved


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


def _design_steps(sz: Sizes, group: str, designs: dict[str, str], widths: tuple[int, ...]) -> list[Row]:
    """Each design's training step / PreLN's, all interleaved, at each width, eager and ``torch.compile``d;
    ``designs``: spec -> its goal (a ratio, as text)."""
    context = dict(sz.lm_overrides).get("context", model_config(sz.lm_model).context)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, sz.lm_vocab, (sz.hyper_rows, context + 1), generator=g)
    batch = tokens[:, :-1], tokens[:, 1:]
    rows = []
    for width in widths:
        shape = dict(vocab_size=sz.lm_vocab, d_model=width, heads=max(1, width // 64), ffn_dim=4 * width,
                     layers=sz.hyper_layers, context=context)
        name = f"{sz.lm_model}(d_model={width}, layers={sz.hyper_layers}), {sz.hyper_rows}x{context} tokens"
        # a design whose recipe builds another model (nGPT: SwiGLU, rotary positions, no biases, untied output) is
        # also timed against PreLN built with those fields: the design's own cost, beside the whole model's
        fields = {d: f for d in designs if (f := recipe_fields(sz.lm_model, d, **shape))}
        own = {d: show_fields(f) for d, f in fields.items()}
        specs = {"PreLN": {}, **{d: {} for d in designs}, **{f"PreLN({own[d]})": f for d, f in fields.items()}}
        for mode in ("eager", "compiled"):
            steps, secs = {}, {}
            if mode == "compiled":
                torch._dynamo.reset()  # each model is an entry of GPT.forward's cache: keep them under its limit,
                raise_recompile_limit(2 * len(specs) + 2)  # raised for as many models (past it dynamo runs eagerly)
            for d, changes in specs.items():
                model = build(f"{sz.lm_model}(connection={'PreLN' if changes else d})", **shape, **changes)
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
                if d not in own:
                    rows.append(Row(group, f"d={width} {d} step, {mode}", t[d] / t["PreLN"], "x",
                                    f"PreLN {mode}, interleaved; goal {goal}x"))
                    continue
                rows.append(Row(group, f"d={width} {d} step, {mode}", t[d] / t[f"PreLN({own[d]})"], "x",
                                f"PreLN {mode} with {d}'s model ({own[d]}), interleaved: the design's own cost; "
                                f"goal {goal}x"))
                rows.append(Row(group, f"d={width} {d} whole model step, {mode}", t[d] / t["PreLN"], "x",
                                f"the preset's PreLN {mode}, interleaved: {d} with its recipe's model "
                                f"({own[d]}) priced whole"))
    return rows


def hyper(sz: Sizes, ctx: dict) -> list[Row]:
    """HC(n=4) and mHC(n=4) training steps / PreLN's, the three interleaved, at each width, eager and compiled."""
    return _design_steps(sz, "hyper", HYPER_DESIGNS, sz.hyper_widths)


def depth(sz: Sizes, ctx: dict) -> list[Row]:
    """The designs that mix or scale across depth (docs/designs.md), training step / PreLN's at GPT-2's width
    (d = 768), eager and compiled, with each one's goal."""
    return _design_steps(sz, "depth", DEPTH_DESIGNS, sz.hyper_widths[-1:])


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
