"""Language modelling with any connection: a decoder-only model on random windows of a corpus.

AdamW (β 0.9 / 0.95, weight decay on matrices only: biases, norms, gains and the connections' vectors are
not decayed, as nanoGPT's ``configure_optimizers`` does by dimension), a linear warm-up to ``lr`` over
``warmup`` steps, then cosine decay to ``min_lr`` at ``max_steps`` (or constant), gradient clipping, bf16
autocast on CUDA. An update is ``grad_accum`` micro-batches of ``batch_size`` windows of ``context + 1``
tokens (skiplab.corpora.windows), drawn from one generator whose state the checkpoints keep; the loss is the
mean cross-entropy over the update's tokens. After every update the model's ``after_step()`` runs (nGPT renormalises
its matrices; the other designs do nothing); a design's own recipe (nGPT: no weight decay, no warm-up) replaces the
fields left at their defaults (:func:`design_recipe`). Every ``eval_every`` steps the validation split is scored
(loss per token and bits per byte) and the run saved. The loop below is the whole of training.

``parametrization`` chooses the optimizer's groups and what they ask of the model (:mod:`.parametrization`):
``standard`` (the above), ``mup`` (width μP) or ``completep`` (width μP and CompleteP's depth scaling); the base
width is the model's ``mup_base_width`` (``--mup-base-width``), the base depth the run's ``depth_base``; config.json
records the multipliers and every group's lr factor, weight decay and ε.

    lr(s) = lr · s / warmup                                                    s <= warmup
    lr(s) = min_lr + (lr − min_lr) · (1 + cos(π (s − warmup) / (max_steps − warmup))) / 2   after

Under torchrun the update's micro-batches are shared out, micro-batch k to rank k mod N (``grad_accum``
must be a multiple of N), every rank drawing the same windows; each rank's loss is scaled by N so that
DDP's mean over the ranks is the gradient of the update's mean loss. N processes thus compute what one
process with the same ``grad_accum`` computes.

The run's config and schedule are in :mod:`.lm_config`, what it reads (documents, shards, token streams, the unigram
reference) in :mod:`.lm_data`, and ``--branch`` of a wsd run in :mod:`.lm_branch`.
"""

from __future__ import annotations

import math
import time
import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm

from .. import distributed, run_dir
from ..corpora.windows import Stream, bits_per_byte, eval_windows, perplexity, window_starts, windows_at
from ..device import pick_device
from ..models import build_model, model_from_checkpoint
from ..tokenization.lm import (LM_TOKENIZERS, ByteTokenizer, LMTokenizer, SubwordTokenizer, load_lm_tokenizer,
                               train_lm_tokenizer)
from ..tokenization.pretrained import read_pretrained
from . import layer_telemetry, parametrization, sharded
from .layer_telemetry import LayerWatch
from .lm_branch import check_branch
from .lm_config import BUDGET, LMTrainConfig, design_recipe, learning_rate
from .lm_data import checkpoint_tokenizer, documents, prepared, stream
from .parametrization import parameter_groups, set_lr  # noqa: F401  (parameter_groups: its home)
from .run import Run
from .telemetry import grad_norm


@torch.no_grad()
def evaluate(model, data: Stream, context: int, device, amp: bool, stride: int = 0, batch: int = 16,
             group: distributed.Group = distributed.Group(), progress: bool = False) -> dict[str, Any]:
    """Σ NLL of ``data`` (``nll``, nats), every target once (see skiplab.corpora.windows), and the three units
    it makes: bits per byte, per-token perplexity (of the model's tokens) and word perplexity:

        loss = nll / tokens,   bpb = nll / (ln 2 · bytes),   token_ppl = exp(loss),   word_ppl = exp(nll / words)

    (bpb and word_ppl None where the stream does not know its bytes or words). Under torchrun rank r scores
    batches r, r + N, ...; the sums are added in batch order, as one process adds them."""
    was_training = model.training
    model.eval()
    scores = []
    windows = list(eval_windows(data, context, stride, batch))
    for k, w in enumerate(tqdm(windows, desc=f"eval {data.name}", unit="batch", disable=not progress)):
        if k % group.world_size != group.rank:
            continue
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(w.inputs.to(device))
        nll = F.cross_entropy(logits.float().transpose(1, 2), w.targets.to(device), reduction="none")
        scores.append((k, float(nll[w.scored.to(device)].double().sum()), int(w.scored.sum())))
    nats = tokens = 0.0
    for _, n, t in sorted(s for rank_scores in group.gather(scores) for s in rank_scores):
        nats, tokens = nats + n, tokens + t
    model.train(was_training)
    loss = nats / tokens
    return {"loss": loss, "bpb": bits_per_byte(nats, data.n_bytes), "token_ppl": perplexity(nats, int(tokens)),
            "word_ppl": perplexity(nats, data.n_words), "nll": nats, "tokens": int(tokens), "bytes": data.n_bytes or None,
            "words": data.n_words or None}


def check_same_data(out: Path, train_data: Any, valid_data: Any) -> None:
    """A resumed run reads the token counts its config.json recorded when it started (its splits' tokens): the
    updates it makes are an uninterrupted run's only on the same data, so a split that has changed since (a file
    edited, another one at the path) is refused in one line, naming it. Runs that recorded no counts (imported
    ones) are not checked."""
    data = (run_dir.read_json(out / "config.json") if (out / "config.json").is_file() else {}).get("data") or {}
    for split, tokens in (("train", train_data), ("valid", valid_data)):
        recorded = data.get(f"{split}_tokens")
        if isinstance(recorded, int) and recorded != len(tokens):
            raise run_dir.RunDirError(
                f"{tokens.name}: {len(tokens):,} tokens, but {out} started on {recorded:,}: its {split} split changed "
                "since, and a resumed run trains as the uninterrupted one only on the same data (start a new run)")


def train(cfg: LMTrainConfig, resume: bool = False, overwrite: bool = False, progress: bool = True) -> dict[str, Any]:
    """Train as ``cfg`` says, writing the run directory (rank 0 alone, under torchrun); return the summary."""
    group, device = distributed.setup(pick_device(cfg.device))
    sharded.check(cfg, group)  # --fsdp: under torchrun
    if cfg.grad_accum % group.world_size:
        raise ValueError(f"--grad-accum {cfg.grad_accum} must be a multiple of the {group.world_size} processes "
                         "(each takes whole micro-batches)")
    prep = prepared(cfg)  # a prepared folder: its tokenizer and shards, nothing tokenised
    if prep is not None:  # its shards, its tokenizer and its document index checked before anything is written
        prep.tokenizer_bytes(), prep.tokens("train"), prep.tokens("valid")
        if "test" in prep.meta["splits"]:  # the split the finished run is scored on: its shards there (headers read)
            prep.shards("test")
        if cfg.valid_tokens:
            prep.first_documents("valid", cfg.valid_tokens)
    # token files are read (each scanned once) and their sidecars checked before anything is written
    token_files = (stream(cfg, "train", None), stream(cfg, "valid", None)) if cfg.binary else None
    pretrained = b""  # a pretrained tokenizer's file is read before anything is written: a bad one fails here
    saved = resume and (Path(cfg.out) / "last.pt").is_file()  # the tokenizer is the checkpoint's
    if cfg.tokenizer not in LM_TOKENIZERS and not (saved or cfg.binary or prep):
        pretrained = group.on_main(lambda: read_pretrained(cfg.tokenizer).to_bytes())
    run = Run(cfg, "lm", group, device, resume=resume, overwrite=overwrite)
    ckpt = run.resume(extendable=BUDGET + (("max_steps",) if cfg.schedule in ("constant", "wsd") else ()))
    if ckpt and cfg.schedule == "wsd" and ckpt["config"]["max_steps"] != cfg.max_steps:
        check_branch(ckpt, cfg)
    if ckpt:
        if cfg.max_steps < ckpt["step"]:
            raise run_dir.RunDirError(f"{run.out} has already trained {ckpt['step']} updates; a resumed run can only "
                                      "be given a larger budget")
        tok = checkpoint_tokenizer(ckpt)
    elif cfg.binary:
        tok = None
    elif prep is not None:  # the folder's; its model file beside the run, as a text run leaves one
        tok = load_lm_tokenizer(prep.tokenizer_bytes())
        if isinstance(tok, SubwordTokenizer):
            group.on_main(lambda: (run.out / "spm.model").write_bytes(tok.to_bytes()))
        elif not isinstance(tok, ByteTokenizer):
            group.on_main(lambda: tok.write(run.out))
    elif cfg.tokenizer == "bytes":  # nothing to learn
        tok = ByteTokenizer()
    elif pretrained:  # a copy of its file beside the run, as a trained one's spm.model
        tok = load_lm_tokenizer(pretrained)
        group.on_main(lambda: tok.write(run.out))
    else:  # rank 0 reads (downloads what is missing) and trains the tokenizer; every rank gets it
        data = group.on_main(lambda: train_lm_tokenizer(cfg.tokenizer, documents(cfg, "train").texts, run.out / "spm",
                                                        cfg.vocab_size).to_bytes())
        tok = load_lm_tokenizer(data)
    train_data, valid_data = token_files or group.main_first(lambda: (stream(cfg, "train", tok),
                                                                      stream(cfg, "valid", tok, cfg.valid_tokens)))
    vocab = tok.vocab_size if tok else cfg.vocab_size
    if cfg.warmup > cfg.max_steps and not resume:  # said once the data are there: a data error is one line alone
        warnings.warn(f"--warmup {cfg.warmup} is more than --max-steps {cfg.max_steps}: the learning rate rises to "
                      f"{cfg.lr * cfg.max_steps / max(cfg.warmup, 1):.3g} at most, never to --lr {cfg.lr:g}", stacklevel=2)
    if cfg.log_layers > cfg.max_steps and not resume:
        warnings.warn(f"--log-layers {cfg.log_layers} is more than --max-steps {cfg.max_steps}: no update is watched "
                      "(no layers.jsonl)", stacklevel=2)

    if ckpt:
        check_same_data(run.out, train_data, valid_data)
    mcfg = cfg.model_config(vocab)
    stored = (ckpt or {}).get("model_config", {}).get("vocab_size")
    if stored and stored > mcfg.vocab_size:  # an imported model whose vocabulary is padded past its tokenizer's (as
        mcfg = cfg.model_config(stored)  # many hub models pad theirs) resumes at its own: the ids past it never occur
    if len(train_data) < mcfg.context + 1:  # every update draws windows of context + 1 tokens: said before config.json
        raise ValueError(f"{train_data.name}: {len(train_data):,} tokens, fewer than a window of context + 1 = "
                         f"{mcfg.context + 1}")
    torch.manual_seed(cfg.seed)
    model = build_model(mcfg).to(device)
    model.checkpointing = cfg.activation_checkpointing
    if group.rank:
        torch.manual_seed(cfg.seed + group.rank)  # dropout differs per rank; rank 0 goes on with the seed's stream
    net = run.compile(model)  # validates; ``model`` keeps plain names
    train_net = sharded.shard(net, model, group, run.amp) if cfg.fsdp else \
        distributed.data_parallel(net, group, torch.zeros(1, 2, dtype=torch.long, device=device))  # trains
    fused = device.type == "cuda"  # one kernel for the whole update where the device has it (CUDA); the CPU keeps
    # the default (foreach) kernels, whose numbers every recorded CPU run has
    param = parametrization.resolve(mcfg, cfg.parametrization)
    opt = torch.optim.AdamW(parameter_groups(model, cfg.weight_decay, param, cfg.adam_eps), lr=cfg.lr,
                            betas=tuple(cfg.adam_betas), eps=cfg.adam_eps, **({"fused": True} if fused else {}))
    run.attach(model, mcfg, opt, flops_per_token=model.flops_per_token())
    layers = LayerWatch(model, cfg.log_layers, run.watch.loggers)  # --log-layers (off at 0)
    gen = torch.Generator().manual_seed(cfg.seed)  # the windows, the same on every rank
    step, best = 0, math.inf
    if ckpt:
        run.restore(ckpt, key="step")
        layers.load_state(ckpt.get("layer_telemetry"))
        group.on_main(lambda: layer_telemetry.cut_lines(run.out, ckpt["step"]))  # what a killed run wrote past it
        step, best = ckpt["step"], ckpt["best_valid_loss"]
        gen.set_state(ckpt["rng"]["windows"])
    else:
        run.say(f"{train_data.name}: {len(train_data):,} training tokens, {valid_data.name}: {len(valid_data):,} "
                f"validation tokens; vocabulary {vocab}")
        first = torch.Generator().manual_seed(cfg.seed + 1)  # its own draws: the training stream is untouched
        run.profile(model, lambda: model(windows_at(train_data, window_starts(train_data, mcfg.context, cfg.batch_size,
                                                                              first), mcfg.context)[0].to(device)))
        run.write_config({"data": {"train": train_data.name, "train_tokens": len(train_data),
                                   # bytes unknown (.bin files without their sidecar) and no tokenizer: None
                                   "train_bytes": train_data.n_bytes or None, "valid": valid_data.name,
                                   "valid_tokens": len(valid_data), "valid_bytes": valid_data.n_bytes or None,
                                   "vocab_size": vocab, "tokenizer": cfg.tokenizer if tok else None,
                                   "eot": tok.eot if tok else None},
                          "tokens_per_update": cfg.batch_size * cfg.grad_accum * mcfg.context,
                          "adamw_fused": fused, **design_notes(cfg, model),
                          **({"parametrization": {**param.notes(), "groups": parametrization.group_notes(opt)}}
                             if param.kind != "standard" else {})})
        for key, value in design_notes(cfg, model).items():
            run.say(f"{key.replace('_', ' ')}: {value}")

    n, per_update = mcfg.context, cfg.grad_accum
    head = None if cfg.head_loss == "eager" else cfg.head_loss  # the loss fused with the output layer (linear_ce)
    mine = [k for k in range(per_update) if k % group.world_size == group.rank]  # this rank's micro-batches
    bar = tqdm(total=cfg.max_steps, initial=step, desc=Path(cfg.out).name, unit="step",
               disable=not (progress and group.main))
    window = {"loss": 0.0, "updates": 0, "time": time.time()}
    model.train()
    tokens_per_update = cfg.batch_size * per_update * n
    while step < cfg.max_steps:
        began = time.perf_counter()
        lr = learning_rate(cfg, step + 1)
        set_lr(opt, lr)  # times each group's lr_scale (mup, completep)
        opt.zero_grad(set_to_none=True)
        starts = [window_starts(train_data, n, cfg.batch_size, gen) for _ in range(per_update)]  # every rank draws all
        loss_sum = 0.0
        watched = layers.due(step + 1)
        with layers.watching() if watched else nullcontext():  # hooks on the watched updates alone
            for i, k in enumerate(mine):
                x, y = (t.to(device) for t in windows_at(train_data, starts[k], n))
                last = i == len(mine) - 1  # DDP averages the gradients over the ranks after the last only
                with nullcontext() if last or not group.active else train_net.no_sync():
                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=run.amp):
                        out = train_net(x) if head is None else train_net(x, targets=y, head_loss=head)
                    loss = F.cross_entropy(out.float().transpose(1, 2), y) if head is None else out
                    (loss * group.world_size / per_update).backward()
                loss_sum += loss.item()
        (update_loss,) = group.sum([loss_sum])
        update_loss /= per_update
        if not math.isfinite(update_loss):
            bar.close()
            run.watch.update(step + 1, update_loss, lr, math.nan, False, tokens_per_update,
                             time.perf_counter() - began, last=True)
            lines = layers.take()
            group.on_main(lambda: layer_telemetry.append_lines(run.out, lines))
            return run.diverged(update_loss, None, step + 1)
        if watched:  # each sub-layer's gradient norm before clipping, its weights before the step
            layers.gradients()
            layers.snapshot()
        norm, clipped = grad_norm(list(model.parameters()), cfg.clip_norm)  # clips where clip_norm > 0
        opt.step()
        model.after_step()  # nGPT: its matrices back on the unit sphere; nothing for the other designs
        step += 1
        spikes = run.watch.spikes
        run.watch.update(step, update_loss, lr, norm, clipped, tokens_per_update, time.perf_counter() - began,
                         last=step == cfg.max_steps)
        if cfg.log_layers and run.watch.spikes > spikes:
            layers.note_spike(step)
        if watched:
            layers.update(step)
        window["loss"], window["updates"] = window["loss"] + update_loss, window["updates"] + 1
        bar.update(1)
        if step % cfg.eval_every == 0 or step == cfg.max_steps:
            elapsed = time.time() - window["time"]
            valid = evaluate(net, valid_data, n, device, run.amp, group=sharded.eval_group(group, model))
            if not math.isfinite(valid["loss"]):  # the last updates left weights that are not finite
                bar.close()
                lines = layers.take()
                group.on_main(lambda: layer_telemetry.append_lines(run.out, lines))
                return run.diverged(valid["loss"], None, step, what="validation loss")
            tokens = window["updates"] * cfg.batch_size * per_update * n
            record = {"step": step, "lr": lr, "train_loss": window["loss"] / window["updates"],
                      "valid_loss": valid["loss"], "valid_bpb": valid["bpb"], "valid_ppl": valid["token_ppl"],
                      "tokens_per_s": tokens / max(elapsed, 1e-9), "time": elapsed}
            improved = record["valid_loss"] < best
            best = min(best, record["valid_loss"])
            # no tokenizer (token files) is None: an empty bytes is what torch.load(weights_only=True) refuses
            state = run.checkpoint(record, rng={"windows": gen.get_state()}, step=step, best_valid_loss=best,
                                   tokenizer=tok.to_bytes() if tok else None, layer_telemetry=layers.state())
            lines = layers.take()  # before the checkpoint: a resume cuts what lies past it
            group.on_main(lambda: layer_telemetry.append_lines(run.out, lines))
            run.save(state, improved, step=step, keep=cfg.keep_checkpoints)
            bar.set_postfix(loss=f"{record['train_loss']:.3f}", valid=f"{record['valid_loss']:.3f}",
                            **({"bpb": f"{record['valid_bpb']:.3f}"} if record["valid_bpb"] else {}))
            window = {"loss": 0.0, "updates": 0, "time": time.time()}
    bar.close()
    return run.finish(lambda last: {"steps": step, "final_valid_loss": last["valid_loss"],
                                    "final_valid_bpb": last["valid_bpb"], "best_valid_loss": best,
                                    **design_notes(cfg, model), **layer_summary(cfg, run.out, layers)})


def layer_summary(cfg: LMTrainConfig, out: Path, layers: LayerWatch) -> dict[str, Any]:
    """With --log-layers, the summary's ``spike_sources``: for every flagged spike, the sub-layers whose gradient
    norms rose first (:func:`~skiplab.train.layer_telemetry.spike_sources`); empty without it."""
    if not cfg.log_layers:
        return {}
    return {"spike_sources": layer_telemetry.spike_sources(layer_telemetry.read_lines(out), layers.spikes)}


def design_notes(cfg: LMTrainConfig, model: torch.nn.Module) -> dict[str, Any]:
    """What a run of ``cfg`` does for its design, for config.json and summary.json: ``design_recipe``, the training
    fields the design prescribes (and the config holds where they were left at their defaults), and ``after_step``,
    what the model does after every update (:meth:`~skiplab.models.gpt.GPT.after_step`); empty for most designs."""
    recipe, after = design_recipe(cfg.model), model.after_step_does
    return {**({"design_recipe": recipe} if recipe else {}), **({"after_step": after} if after else {})}


def load_run(path: str | Path, average: int = 0) -> tuple[dict[str, Any], torch.nn.Module, LMTokenizer | None]:
    """(checkpoint, model in evaluation mode on the CPU, tokenizer) of a run directory or checkpoint file;
    with ``average`` > 1, the average of the run's last ``average`` step checkpoints."""
    ckpt = run_dir.average_checkpoints(path, average, kind="lm")[0] if average > 1 \
        else run_dir.load_checkpoint(path, kind="lm")
    model = model_from_checkpoint(ckpt, path)
    return ckpt, model.eval(), checkpoint_tokenizer(ckpt)


def evaluate_checkpoint(path: str | Path, split: str = "test", average: int = 0, stride: int = 0, data_dir: str = "",
                        device: str = "auto", progress: bool = True) -> dict[str, Any]:
    """A trained run on a split of its corpus, in the field's units (:func:`evaluate`): bits per byte, per-token
    perplexity of the run's tokenizer, word perplexity (lm-evaluation-harness's ``word_perplexity``), each with
    its count, and ``covers``, what text the counts are of."""
    if data_dir and not Path(data_dir).is_dir():
        raise FileNotFoundError(f"--data-dir {data_dir}: no such folder")
    ckpt, model, tok = load_run(path, average)
    where = {**ckpt["config"], **({"data_dir": data_dir} if data_dir else {})}
    dev = pick_device(device)
    data = stream(where, split, tok)
    result = evaluate(model.to(dev), data, model.cfg.context, dev, where["amp"] and dev.type == "cuda", stride,
                      progress=progress)
    return {"checkpoint": str(path), "step": ckpt.get("step"), "averaged": max(1, average), "model": where["model"],
            "seed": where.get("seed"), "tokenizer": where["tokenizer"], "split": data.name, "stride": stride or model.cfg.context, **result,
            "covers": coverage(data, model.cfg.context, stride)}


def coverage(data: Stream, context: int, stride: int = 0) -> str:
    """What the counts of :func:`evaluate` are of, in words."""
    windows = (f"sliding windows of {context} tokens, each scoring its last {stride}" if stride and stride < context
               else f"windows of {context} tokens that do not overlap")
    text = ("bytes and words: the documents' text, separators aside" if data.n_words else
            "bytes: as the token files' sidecars record them; words unknown (no word perplexity)")
    what = ("its documents, each followed by the end-of-text token, in one stream" if data.n_words else
            "its token ids as the file holds them, one stream")
    return (f"{data.name}: {what} of {len(data)} tokens; "
            f"NLL over every token but the stream's first ({len(data) - 1} targets, end-of-text tokens included), "
            f"each once, in {windows}; {text}")
